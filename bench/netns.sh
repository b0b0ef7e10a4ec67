#!/usr/bin/env bash
# Two network namespaces joined through the userspace delay line (bench/delayline).
#
#   tern-a (198.18.0.1, dev tern0) <-TUN-> tern-delayline <-TUN-> (dev tern0, 198.18.0.2) tern-b
#
# usage:
#   bench/netns.sh up PRESET [--tuned] [--rate R] [--mtu N] [--cc bbr|reno] [--loss P]
#                            [--rtt-ms X] [--queue-bytes N]
#   bench/netns.sh down                 remove everything `up` made (also safe when nothing is up)
#   bench/netns.sh status               configuration, sysctls, a short ping
#   bench/netns.sh stats                delay-line counters (JSON) — drops, lateness, CPU
#   bench/netns.sh selftest [SECS]      the delay line's own ceiling and CPU (iperf3, RTT 0, no cap)
#   bench/netns.sh presets              list presets
#
# PRESET: lan (0.2 ms RTT), alcf-ncsa (6 ms), olcf-alcf (25 ms), olcf-nersc (68 ms), raw (0 ms,
#         no rate cap; for measuring the delay line itself); append -lossy for random loss 1e-4
#         in each direction (e.g. olcf-nersc-lossy).
# --rate  bottleneck rate each direction, bit/s with k/m/g suffix; default 1g; 0 = no cap.
# --tuned raises socket-buffer limits (see TUNED_* below; root values restored by `down`).
# `up` is idempotent: it tears down any previous bed first. Needs root.
set -euo pipefail

NS_A=tern-a NS_B=tern-b
ADDR_A=198.18.0.1 ADDR_B=198.18.0.2
DEV=tern0
STATE=/run/tern-bench
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DL_DIR=$HERE/delayline
DL_BIN=$DL_DIR/target/release/tern-delayline

# --tuned: ESnet fasterdata-style host tuning for a 10G, ~100 ms path (64 MiB buffers).
#   root namespace (restored on down): net.core.rmem_max, net.core.wmem_max
#   (a namespace cannot raise these above the root's value, and tools that set SO_SNDBUF /
#   SO_RCVBUF explicitly — globus-url-copy -tcp-bs, iperf3 -w — are capped by them)
#   both test namespaces: net.core.rmem_max, net.core.wmem_max, net.ipv4.tcp_rmem, net.ipv4.tcp_wmem
TUNED_CORE_MAX=67108864
TUNED_TCP_RMEM="4096 131072 67108864"
TUNED_TCP_WMEM="4096 16384 67108864"

log() { echo "netns.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[[ $EUID -eq 0 ]] || die "needs root"

preset_rtt() { # -> RTT in ms for a base preset name
  case $1 in
    lan) echo 0.2 ;; alcf-ncsa) echo 6 ;; olcf-alcf) echo 25 ;; olcf-nersc) echo 68 ;; raw) echo 0 ;;
    *) return 1 ;;
  esac
}

in_ns() { ip netns exec "$1" "${@:2}"; }

build_delayline() { # cargo is a no-op when the binary is up to date
  if command -v cargo >/dev/null; then
    (cd "$DL_DIR" && timeout 900 cargo build --release -j1 -q) || die "delay line build failed"
  fi
  [[ -x $DL_BIN ]] || die "no $DL_BIN and no cargo to build it"
}

delayline_pid() { # pid of our delay line, only if it really is tern-delayline
  local pid
  [[ -f $STATE/delayline.pid ]] || return 1
  pid=$(<"$STATE/delayline.pid")
  [[ -n $pid && -r /proc/$pid/comm && $(</proc/$pid/comm) == tern-delayline ]] || return 1
  echo "$pid"
}

kill_ns_procs() { # processes left inside our namespaces were started by the bench: stop them
  local ns=$1 pids
  ip netns list 2>/dev/null | grep -qw "^$ns" || return 0
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [[ -z $pids ]] && return 0
  log "stopping processes in $ns: $(echo $pids)"
  kill -TERM $pids 2>/dev/null || true
  for _ in $(seq 30); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true); [[ -z $pids ]] && return 0; sleep 0.1
  done
  kill -KILL $pids 2>/dev/null || true
}

cmd_down() {
  local pid
  if pid=$(delayline_pid); then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { log "delay line $pid did not stop, killing"; kill -KILL "$pid" || true; }
  fi
  kill_ns_procs $NS_A; kill_ns_procs $NS_B
  for ns in $NS_A $NS_B; do
    ip netns list 2>/dev/null | grep -qw "^$ns" && ip netns del "$ns"
    rm -rf "/etc/netns/$ns"
  done
  rmdir /etc/netns 2>/dev/null || true   # only if empty (i.e. nobody else uses it)
  if [[ -f $STATE/sysctl.saved ]]; then   # restore root values changed by --tuned
    while read -r key val; do sysctl -q -w "$key=$val" >/dev/null || log "could not restore $key"; done <"$STATE/sysctl.saved"
  fi
  rm -rf "$STATE"
}

write_hosts() { # ns own_addr ; wan-notes: gridftp/xrootd need their own name+address resolvable
  local ns=$1 own=$2 host
  host=$(hostname)
  mkdir -p "/etc/netns/$ns"
  {
    echo "127.0.0.1 localhost"
    if [[ $own == "$ADDR_A" ]]; then
      echo "$ADDR_A $NS_A $host"; echo "$ADDR_B $NS_B"
    else
      echo "$ADDR_A $NS_A"; echo "$ADDR_B $NS_B $host"
    fi
  } >"/etc/netns/$ns/hosts"
}

cmd_up() {
  local preset=${1:-}; shift || true
  [[ -n $preset ]] || die "usage: netns.sh up PRESET [--tuned] [--rate R] ..."
  local base=${preset%-lossy} loss=0 rtt rate=1g mtu=9000 cc=bbr tuned=0 qbytes=""
  [[ $preset == *-lossy ]] && loss=0.0001
  rtt=$(preset_rtt "$base") || die "unknown preset '$preset' (netns.sh presets)"
  [[ $base == raw ]] && rate=0
  while (($#)); do
    case $1 in
      --tuned) tuned=1; shift ;;
      --rate) rate=$2; shift 2 ;;
      --mtu) mtu=$2; shift 2 ;;
      --cc) cc=$2; shift 2 ;;
      --loss) loss=$2; shift 2 ;;
      --rtt-ms) rtt=$2; shift 2 ;;
      --queue-bytes) qbytes=$2; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  build_delayline
  cmd_down
  mkdir -p "$STATE"
  trap 'log "up failed; cleaning up"; cmd_down' ERR

  if ((tuned)); then
    : >"$STATE/sysctl.saved"
    for k in net.core.rmem_max net.core.wmem_max; do
      echo "$k $(sysctl -n $k)" >>"$STATE/sysctl.saved"
      (($(sysctl -n $k) < TUNED_CORE_MAX)) && sysctl -q -w "$k=$TUNED_CORE_MAX"
    done
  fi

  for ns in $NS_A $NS_B; do
    ip netns add $ns
    ip -n $ns link set lo up
    ip -n $ns tuntap add dev $DEV mode tun          # IFF_TUN|IFF_NO_PI, persistent until ns is deleted
    ip -n $ns link set $DEV mtu "$mtu" txqueuelen 10000 up
    in_ns $ns sysctl -q -w net.ipv4.tcp_congestion_control="$cc"
    if ((tuned)); then
      in_ns $ns sysctl -q -w net.core.rmem_max=$TUNED_CORE_MAX net.core.wmem_max=$TUNED_CORE_MAX
      in_ns $ns sysctl -q -w net.ipv4.tcp_rmem="$TUNED_TCP_RMEM" net.ipv4.tcp_wmem="$TUNED_TCP_WMEM"
    fi
  done
  ip -n $NS_A addr add $ADDR_A peer $ADDR_B dev $DEV
  ip -n $NS_B addr add $ADDR_B peer $ADDR_A dev $DEV
  write_hosts $NS_A $ADDR_A
  write_hosts $NS_B $ADDR_B

  # one-way delay = (RTT - bed base RTT)/2 in each direction. The bed itself (two TUN hops, the
  # forwarder's wake-ups, two kernel stacks) adds ~0.1-0.14 ms of RTT at zero configured delay
  # (measured: ping 0.124/0.136/0.152 ms with preset raw); TERN_BED_BASE_US=0 disables this.
  local base_us=${TERN_BED_BASE_US:-100}
  local delay_us; delay_us=$(awk -v r="$rtt" -v b="$base_us" 'BEGIN{d=(r*1000-b)/2; if (d<0) d=0; printf "%.0f", d}')
  local args=(--a $NS_A:$DEV --b $NS_B:$DEV --delay-us "$delay_us" --loss "$loss" --rate "$rate"
              --stats-file "$STATE/delayline.stats.json")
  [[ -n $qbytes ]] && args+=(--queue-bytes "$qbytes")
  setsid "$DL_BIN" "${args[@]}" >"$STATE/delayline.out" 2>"$STATE/delayline.log" </dev/null 9>&- &
  echo $! >"$STATE/delayline.pid"
  local ok=0
  for _ in $(seq 100); do   # ≤ 10 s
    grep -q ' ready ' "$STATE/delayline.log" 2>/dev/null && { ok=1; break; }
    kill -0 "$(<"$STATE/delayline.pid")" 2>/dev/null || break
    sleep 0.1
  done
  ((ok)) || { cat "$STATE/delayline.log" >&2; die "delay line did not start"; }

  cat >"$STATE/config.env" <<EOF
PRESET=$preset
RTT_MS=$rtt
LOSS=$loss
RATE=$rate
MTU=$mtu
CC=$cc
TUNED=$tuned
DELAY_US=$delay_us
BED_BASE_US=$base_us
EOF
  timeout 20 ip netns exec $NS_A ping -q -c 3 -i 0.2 -W 5 $ADDR_B >/dev/null || die "no connectivity through the delay line"
  trap - ERR
  log "up: $preset rtt=${rtt}ms loss=$loss rate=$rate mtu=$mtu cc=$cc tuned=$tuned ($(grep -o 'sched_fifo=[a-z]*' "$STATE/delayline.log"))"
}

cmd_status() {
  [[ -f $STATE/config.env ]] || { echo "down"; return 1; }
  cat "$STATE/config.env"
  echo "DELAYLINE_PID=$(delayline_pid || echo dead)"
  for ns in $NS_A $NS_B; do
    echo "$ns: $(in_ns $ns sysctl -n net.ipv4.tcp_congestion_control) core.rmem_max=$(in_ns $ns sysctl -n net.core.rmem_max)" \
         "core.wmem_max=$(in_ns $ns sysctl -n net.core.wmem_max) tcp_rmem='$(in_ns $ns sysctl -n net.ipv4.tcp_rmem)'" \
         "tcp_wmem='$(in_ns $ns sysctl -n net.ipv4.tcp_wmem)'"
  done
  echo "root: core.rmem_max=$(sysctl -n net.core.rmem_max) core.wmem_max=$(sysctl -n net.core.wmem_max)"
  timeout 30 ip netns exec $NS_A ping -c 10 -i 0.2 -W 5 $ADDR_B | tail -2
}

cmd_stats() {
  local pid; pid=$(delayline_pid) || die "delay line not running"
  rm -f "$STATE/delayline.stats.json"
  kill -USR1 "$pid"
  for _ in $(seq 50); do [[ -f $STATE/delayline.stats.json ]] && break; sleep 0.1; done
  cat "$STATE/delayline.stats.json"
}

cmd_selftest() { # the delay line's own ceiling: preset raw (no delay, no cap), iperf3 through it
  local secs=${1:-10} pid c0 c1 out
  cmd_up raw
  trap 'cmd_down' EXIT
  for P in 8 1; do
    ip netns exec $NS_B iperf3 -s -B $ADDR_B -p 5299 -1 >/dev/null 2>&1 9>&- &
    local spid=$!
    sleep 0.5
    pid=$(delayline_pid); c0=$(awk '{print $14+$15}' /proc/$pid/stat)
    out=$(timeout $((secs + 30)) ip netns exec $NS_A iperf3 -c $ADDR_B -p 5299 -P $P -t "$secs" -J) || die "iperf3 failed"
    c1=$(awk '{print $14+$15}' /proc/$pid/stat)
    echo "$out" | /usr/bin/python3 -c "import json,sys; e=json.load(sys.stdin)['end']; \
print(f'delay line ceiling (MTU 9000, RTT 0, no cap): iperf3 -P $P {e[\"sum_received\"][\"bits_per_second\"]/1e9:.2f} Gb/s;', \
f'delay line CPU {($c1-$c0)/$(getconf CLK_TCK)/$secs:.2f} core-s/s')"
    timeout 10 tail --pid=$spid -f /dev/null || kill $spid 2>/dev/null || true   # the one-shot server exits by itself
  done
  echo "ping at zero configured delay: $(timeout 30 ip netns exec $NS_A ping -q -c 10 -i 0.2 $ADDR_B | tail -1)"
}

# One bed per machine: `up`/`down` take /run/tern-bench.lock unless the caller (run.py) holds it.
lock() {
  [[ ${TERN_BENCH_LOCKED:-0} == 1 ]] && return 0
  exec 9>/run/tern-bench.lock
  flock -n 9 || die "another bench run holds /run/tern-bench.lock (bench/run.py or smoke.sh is running)"
}

case ${1:-} in
  up) shift; lock; cmd_up "$@" ;;
  down) lock; cmd_down ;;
  status) cmd_status ;;
  stats) cmd_stats ;;
  selftest) shift; lock; cmd_selftest "$@" ;;
  presets) for p in lan alcf-ncsa olcf-alcf olcf-nersc raw; do echo "$p  rtt=$(preset_rtt $p)ms  (+ $p-lossy: loss 1e-4)"; done ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
