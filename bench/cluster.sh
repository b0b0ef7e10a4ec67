#!/usr/bin/env bash
# The bed for tern clusters (issue 14, docs/cluster.md): two sites of N data transfer nodes each,
# every node in its own network namespace, each site's nodes behind a router namespace, the two
# routers joined through the userspace delay line (bench/delayline; this kernel has no netem).
#
#   site A (198.18.10.0/24)                                          site B (198.18.20.0/24)
#   tc-a1 .1 ─veth(tbf)─┐                                       ┌─veth(tbf)─ .1 tc-b1
#   tc-a2 .2 ─veth(tbf)─┤ tc-ra .254 ─TUN─ tern-delayline ─TUN─ tc-rb .254 ├─veth(tbf)─ .2 tc-b2
#   tc-a3 .3 ─veth(tbf)─┘  198.18.30.1    (RTT, loss)     198.18.30.2      └─veth(tbf)─ .3 tc-b3
#             PostgreSQL of site A                   PostgreSQL of site B
#             (in tc-ra, 198.18.10.254:5432)         (in tc-rb, 198.18.20.254:5432)
#
# Each node's link is capped with tbf in both directions (the node's egress and the router's
# egress toward the node) at --rate: a node's NIC. The delay line adds the wide-area round trip
# (no rate cap of its own unless --wan-rate). The namespaces share the mount namespace, so all
# nodes of a site see the same directory, /srv/tern-cluster/site-a or site-b: the site's
# parallel file system (on the disk; --tmpfs SIZE puts it in memory).
#
# usage (root):
#   bench/cluster.sh up [--nodes 3] [--rate 200m] [--rtt-ms 68] [--cc bbr] [--tuned] [--mtu 9000]
#                       [--loss P] [--wan-rate R] [--tmpfs SIZE] [--pg-nosync]
#   bench/cluster.sh nodes K [--tern BIN] [--unix-db] [-- EXTRA tern serve ARGS]
#                       (re)start K `tern serve --cluster` daemons per site (nodes 0: stop them);
#                       --unix-db: --db 'host=SOCKETDIR ...' (PostgreSQL's unix socket) instead of TCP
#   bench/cluster.sh kill NODE       kill -9 one node's daemon (a1..b3), for failure tests
#   bench/cluster.sh status          nodes, `tern cluster status` of both sites, link caps, ping
#   bench/cluster.sh stats           delay-line counters (JSON)
#   bench/cluster.sh selftest [--secs 20] [--streams 4]
#                       iperf3 a1→b1 alone, then a1→b1, a2→b2, a3→b3 at once (brings the bed up
#                       with the defaults, and down after, when it is not up); exits 1 unless the
#                       pairs together carry ≥ 0.95 × pairs × rate
#   bench/cluster.sh baseline [--tern BIN] [--reps 1] [--datasets four-1g,hacc-4g,one-3g] [--out F]
#                       today's single-node tern: 1 node per side, a client in tc-a1 pushes each
#                       dataset of site A to the daemon on b1, timed, verified, removed (--out:
#                       the table's rows also into F)
#   bench/cluster.sh scale [--tern BIN] [--nodes 1,2,3] [--datasets hacc-4g,four-1g] [--reps 1] [--out F]
#                       one copy spread over K nodes per site for each K (a client in tc-a1 asks
#                       tern://a1/DATA → tern://b1/DATA-kK; the pairs move the data), timed, verified
#   bench/cluster.sh faults [--tern BIN] [--dataset hacc-4g] [--at 25] [--cases LIST] [--out F]
#                       the same copy with, at --at seconds: b2 killed, a2 killed (3 nodes), a3+b3
#                       joining (2 nodes), both sites' PostgreSQL restarted (3 nodes), none (3
#                       nodes: the fault-free copy whose WAN bytes the others' are compared with)
#   bench/cluster.sh datasets [NAME...]   only make the baseline's datasets (default: all three)
#   bench/cluster.sh down [--purge]  remove everything `up` made (safe when nothing is up);
#                       --purge also deletes /srv/tern-cluster (the datasets)
#   bench/cluster.sh env             the bed's addresses, URLs and files as shell variables
#
# Addresses are only 198.18.10.0/24, 198.18.20.0/24 and 198.18.30.0/24 (RFC 2544 benchmarking
# range); bench/netns.sh's 198.18.0.x and its namespaces tern-a/tern-b are not touched, and this
# bed takes its own lock (/run/tern-cluster.lock), so both beds can be up at once (they share the
# CPU). Every process the bed starts is recorded by PID under /run/tern-cluster and ended by PID;
# `down` then also stops whatever is still inside its tc-* namespaces (a client left running).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
DL_DIR=$HERE/delayline
DL_BIN=$DL_DIR/target/release/tern-delayline
GEN_BIN=$DL_DIR/target/release/tern-bench-gen
STATE=/run/tern-cluster
LOGS=$STATE/logs
PIDS=$STATE/pids
DATA=/srv/tern-cluster            # site-a, site-b: the sites' shared directories; pg: databases
PG_ROOT=$DATA/pg
PG_PORT=5432
PORT=7700                         # tern serve on every node
SITES=(a b)
MAX_NODES=9
WAN_DEV=wan0                      # the TUN device in each router namespace
NODE_DEV=site0                    # a node's veth end (the router's end is named after the node)

# --tuned: the same host tuning as bench/netns.sh (ESnet fasterdata-style, 64 MiB buffers).
TUNED_CORE_MAX=67108864
TUNED_TCP_RMEM="4096 131072 67108864"
TUNED_TCP_WMEM="4096 16384 67108864"

log() { echo "cluster.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[[ $EUID -eq 0 ]] || die "needs root"

# --- naming -------------------------------------------------------------------------------------
subnet() { case $1 in a) echo 198.18.10 ;; b) echo 198.18.20 ;; *) return 1 ;; esac; }
router_ns() { echo "tc-r$1"; }                     # tc-ra, tc-rb
node_ns() { echo "tc-$1"; }                        # node a1 -> tc-a1
node_addr() { echo "$(subnet "${1:0:1}").${1:1}"; } # a1 -> 198.18.10.1
router_addr() { echo "$(subnet "$1").254"; }
wan_addr() { case $1 in a) echo 198.18.30.1 ;; b) echo 198.18.30.2 ;; esac; }
site_dir() { echo "$DATA/site-$1"; }
token_file() { echo "$STATE/token-site-$1"; }
db_url() { echo "postgres://tern@$(router_addr "$1"):$PG_PORT/tern"; }
db_sock_dir() { echo "$PG_ROOT/site-$1/sock"; }
db_url_unix() { echo "host=$(db_sock_dir "$1") port=$PG_PORT user=tern dbname=tern"; }

in_ns() { ip netns exec "$1" "${@:2}"; }
ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$1"; }
cfg() { # value of KEY in the bed's config, or $2 when the bed is down / has no such key
  local v=""
  [[ -f $STATE/config.env ]] && v=$(sed -n "s/^$1=//p" "$STATE/config.env" | tail -1)
  echo "${v:-${2:-}}"
}

rate_bps() { # 200m -> 200000000 (bit/s, k/m/g suffixes as bench/netns.sh and the delay line)
  awk -v r="$1" 'BEGIN{ r=tolower(r); m=1; s=substr(r,length(r),1);
    if (s=="k") m=1e3; else if (s=="m") m=1e6; else if (s=="g") m=1e9;
    if (m>1) r=substr(r,1,length(r)-1);
    if (r !~ /^[0-9]+(\.[0-9]+)?$/) exit 1; printf "%.0f", r*m }' || die "bad rate '$1'"
}

# --- processes, by PID only ---------------------------------------------------------------------
pid_alive() { # PIDFILE COMM -> pid if that process lives and really is COMM
  local f=$1 comm=$2 pid
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ && -r /proc/$pid/comm && $(</proc/$pid/comm) == "$comm" ]] || return 1
  echo "$pid"
}

stop_pid() { # PIDFILE COMM SIGNAL SECS: signal, wait up to SECS, then SIGKILL; removes PIDFILE
  local f=$1 comm=$2 sig=$3 secs=$4 pid
  if pid=$(pid_alive "$f" "$comm"); then
    kill -"$sig" "$pid" 2>/dev/null || true
    for _ in $(seq $((secs * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then log "$comm $pid did not stop on SIG$sig, killing"; kill -KILL "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$f"
}

all_namespaces() { # every namespace this bed may have made (also when config.env is gone)
  local s i
  for s in "${SITES[@]}"; do
    echo "$(router_ns "$s")"
    for i in $(seq $MAX_NODES); do echo "$(node_ns "$s$i")"; done
  done
}

kill_ns_procs() { # anything still inside our namespaces was started through the bed
  local ns=$1 pids
  ns_exists "$ns" || return 0
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [[ -z $pids ]] && return 0
  log "stopping processes left in $ns: $(echo $pids)"
  kill -TERM $pids 2>/dev/null || true
  for _ in $(seq 30); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true); [[ -z $pids ]] && return 0; sleep 0.1
  done
  kill -KILL $pids 2>/dev/null || true
}

# --- tern binary --------------------------------------------------------------------------------
find_tern() { # --tern BIN, $TERN_BIN, the recorded one, target dirs, PATH
  local b
  for b in "${1:-}" "${TERN_BIN:-}" "$(cfg TERN)" "${CARGO_TARGET_DIR:+$CARGO_TARGET_DIR/release/tern}" \
           "$REPO/target/release/tern" "$(command -v tern || true)"; do
    [[ -n $b && -x $b ]] && { readlink -f "$b"; return 0; }
  done
  die "no tern binary: build one (cargo build --release -p tern) or pass --tern BIN"
}

# --- down ---------------------------------------------------------------------------------------
stop_nodes() { # SIGTERM to all (a node marks itself left, then exits), ≤ 15 s, then SIGKILL
  local f pid pids=()
  shopt -s nullglob
  for f in "$PIDS"/node-*.pid; do
    if pid=$(pid_alive "$f" tern); then kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); fi
  done
  shopt -u nullglob
  for _ in $(seq 150); do
    local live=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && live=1; done
    ((live)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null && [[ $(</proc/$pid/comm) == tern ]]; then log "node pid $pid did not stop on SIGTERM, killing"; kill -KILL "$pid" || true; fi
  done
  rm -f "$PIDS"/node-*.pid
}

stop_pg() {
  local s
  for s in "${SITES[@]}"; do stop_pid "$PIDS/pg-$s.pid" postgres INT 20; done   # SIGINT = fast shutdown
}

cmd_down() {
  local purge=0 ns s m
  while (($#)); do case $1 in --purge) purge=1; shift ;; *) die "unknown option $1" ;; esac; done
  stop_nodes
  stop_pg
  stop_pid "$PIDS/delayline.pid" tern-delayline TERM 5
  for ns in $(all_namespaces); do kill_ns_procs "$ns"; done
  for ns in $(all_namespaces); do
    ns_exists "$ns" && ip netns del "$ns"
    rm -rf "/etc/netns/$ns"
  done
  rmdir /etc/netns 2>/dev/null || true   # only if empty (bench/netns.sh may use it too)
  for s in "${SITES[@]}"; do
    m=$(site_dir "$s")
    if mountpoint -q "$m" 2>/dev/null && [[ -f $STATE/tmpfs-$s ]]; then umount "$m" || log "could not unmount $m"; fi
  done
  rm -rf "$PG_ROOT"
  if [[ -f $STATE/sysctl.saved ]]; then   # root values raised by --tuned: restore them unless
    while read -r key val ours; do        # someone else (bench/netns.sh --tuned) changed them since
      if [[ $(sysctl -n "$key") == "$ours" && ! -f /run/tern-bench/sysctl.saved ]]; then
        sysctl -q -w "$key=$val" >/dev/null || log "could not restore $key"
      else
        log "leaving $key=$(sysctl -n "$key") (changed since, or bench/netns.sh --tuned is up)"
      fi
    done <"$STATE/sysctl.saved"
  fi
  rm -rf "$STATE"
  if ((purge)); then rm -rf "$DATA"; fi
}

# --- up -----------------------------------------------------------------------------------------
build_delayline() { # cargo is a no-op when the binaries are up to date
  if command -v cargo >/dev/null; then
    (cd "$DL_DIR" && timeout 900 nice cargo build --release -j1 -q) || die "delay line build failed"
  fi
  [[ -x $DL_BIN && -x $GEN_BIN ]] || die "no $DL_BIN and no cargo to build it"
}

pg_bin_dir() { # the newest installed server's bin directory, as crates/tern-service/tests/support/pg.rs
  local d best="" bestv=0 v
  for d in /usr/lib/postgresql/*/bin; do
    [[ -x $d/initdb ]] || continue
    v=$(basename "$(dirname "$d")"); v=${v%%.*}
    [[ $v =~ ^[0-9]+$ ]] && ((v > bestv)) && { best=$d; bestv=$v; }
  done
  [[ -n $best ]] || return 1
  echo "$best"
}

ensure_pg() {
  pg_bin_dir >/dev/null && return 0
  log "PostgreSQL is not installed: apt-get install postgresql"
  timeout 300 apt-get update -q >/dev/null || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q postgresql >/dev/null || die "apt-get install postgresql failed"
  pg_bin_dir >/dev/null || die "PostgreSQL installed but no /usr/lib/postgresql/*/bin/initdb"
}

AS_PG=(setpriv --reuid=65534 --regid=65534 --clear-groups --)   # PostgreSQL refuses to run as root

launch_pg() { # SITE NOSYNC: start the site's (already initialised) server and wait until it answers
  local s=$1 nosync=$2 bin dir ns addr
  bin=$(pg_bin_dir); dir=$PG_ROOT/site-$s; ns=$(router_ns "$s"); addr=$(router_addr "$s")
  local opts=(-D "$dir/data" -h "$addr" -p "$PG_PORT" -k "$dir/sock" -c max_connections=200 -c shared_buffers=64MB)
  ((nosync)) && opts+=(-F)
  setsid ip netns exec "$ns" "${AS_PG[@]}" "$bin/postgres" "${opts[@]}" \
    >>"$LOGS/pg-$s.log" 2>&1 </dev/null 9>&- &
  echo $! >"$PIDS/pg-$s.pid"
  local ok=0
  for _ in $(seq 600); do   # ≤ 60 s
    if timeout 5 ip netns exec "$ns" "$bin/pg_isready" -q -h "$addr" -p "$PG_PORT"; then ok=1; break; fi
    kill -0 "$(<"$PIDS/pg-$s.pid")" 2>/dev/null || break
    sleep 0.1
  done
  ((ok)) || { tail -20 "$LOGS/pg-$s.log" >&2; die "PostgreSQL of site $s did not start"; }
}

restart_pg() { # SITE: a fast shutdown and a start of the same data directory (the failure case)
  local s=$1 pid
  pid=$(pid_alive "$PIDS/pg-$s.pid" postgres) || die "PostgreSQL of site $s is not running"
  kill -INT "$pid"
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && die "PostgreSQL of site $s did not stop"
  launch_pg "$s" "$(cfg PG_NOSYNC 0)"
  log "PostgreSQL of site $s restarted (pid $(<"$PIDS/pg-$s.pid"))"
}

start_pg() { # SITE NOSYNC: a throwaway server in the site's router namespace, on its site address
  local s=$1 nosync=$2 bin dir ns addr
  bin=$(pg_bin_dir); dir=$PG_ROOT/site-$s; ns=$(router_ns "$s"); addr=$(router_addr "$s")
  mkdir -p "$dir/sock"; chown -R 65534:65534 "$dir"; chmod 700 "$dir" "$dir/sock"
  # trust: the server is reachable only from the site's namespaces (and root, through the socket)
  timeout 120 "${AS_PG[@]}" "$bin/initdb" -D "$dir/data" -U tern --auth=trust -E UTF8 --no-instructions \
    $( ((nosync)) && echo --no-sync ) >"$LOGS/pg-$s.initdb.log" 2>&1 || { cat "$LOGS/pg-$s.initdb.log" >&2; die "initdb for site $s failed"; }
  echo "host all all $(subnet "$s").0/24 trust   # the site's nodes (cluster.sh)" >>"$dir/data/pg_hba.conf"
  launch_pg "$s" "$nosync"
  timeout 30 ip netns exec "$ns" "$bin/createdb" -h "$addr" -p "$PG_PORT" -U tern tern || die "createdb for site $s failed"
}

make_node() { # SITE NODE MTU CC TUNED RATE_BPS BURST LIMIT
  local s=$1 n=$2 mtu=$3 cc=$4 tuned=$5 bps=$6 burst=$7 limit=$8 ns rns addr raddr
  ns=$(node_ns "$n"); rns=$(router_ns "$s"); addr=$(node_addr "$n"); raddr=$(router_addr "$s")
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  in_ns "$ns" sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
  in_ns "$ns" sysctl -q -w net.ipv4.tcp_congestion_control="$cc"
  if ((tuned)); then
    in_ns "$ns" sysctl -q -w net.core.rmem_max=$TUNED_CORE_MAX net.core.wmem_max=$TUNED_CORE_MAX
    in_ns "$ns" sysctl -q -w net.ipv4.tcp_rmem="$TUNED_TCP_RMEM" net.ipv4.tcp_wmem="$TUNED_TCP_WMEM"
  fi
  ip -n "$rns" link add "$n" mtu "$mtu" type veth peer name $NODE_DEV netns "$ns" mtu "$mtu"
  ip -n "$rns" addr add "$raddr/32" peer "$addr/32" dev "$n"
  ip -n "$ns" addr add "$addr/32" peer "$raddr/32" dev $NODE_DEV
  ip -n "$rns" link set "$n" up
  ip -n "$ns" link set $NODE_DEV up
  ip -n "$ns" route add default via "$raddr" dev $NODE_DEV
  if ((bps > 0)); then   # the node's NIC: its egress, and the router's egress toward it
    tc -n "$ns" qdisc replace dev $NODE_DEV root tbf rate "${bps}bit" burst "$burst" limit "$limit"
    tc -n "$rns" qdisc replace dev "$n" root tbf rate "${bps}bit" burst "$burst" limit "$limit"
  fi
}

write_hosts() { # every namespace resolves the bed's names: a1..bN, ra/rb (also pg-a/pg-b)
  local nodes=$1 ns s i
  for ns in $(all_namespaces); do
    ns_exists "$ns" || continue
    mkdir -p "/etc/netns/$ns"
    {
      echo "127.0.0.1 localhost"
      for s in "${SITES[@]}"; do
        echo "$(router_addr "$s") r$s pg-$s"
        for i in $(seq "$nodes"); do echo "$(node_addr "$s$i") $s$i"; done
      done
    } >"/etc/netns/$ns/hosts"
  done
}

cmd_up() {
  local nodes=3 rate=200m rtt=68 cc=bbr tuned=0 mtu=9000 loss=0 wan_rate=0 tmpfs="" nosync=0
  while (($#)); do
    case $1 in
      --nodes) nodes=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --rtt-ms) rtt=$2; shift 2 ;;
      --cc) cc=$2; shift 2 ;;
      --tuned) tuned=1; shift ;;
      --mtu) mtu=$2; shift 2 ;;
      --loss) loss=$2; shift 2 ;;
      --wan-rate) wan_rate=$2; shift 2 ;;
      --tmpfs) tmpfs=$2; shift 2 ;;
      --pg-nosync) nosync=1; shift ;;
      *) die "unknown option $1 (see the header of $0)" ;;
    esac
  done
  [[ $nodes =~ ^[1-9]$ ]] || die "--nodes must be 1..$MAX_NODES"
  local bps; bps=$(rate_bps "$rate")
  rate_bps "$wan_rate" >/dev/null
  build_delayline
  ensure_pg
  cmd_down
  mkdir -p "$STATE" "$LOGS" "$PIDS"
  trap 'rc=$?; ((rc == 0)) || { log "up failed; cleaning up"; cmd_down; }' EXIT   # die exits, ERR misses it

  if ((tuned)); then   # "KEY ORIGINAL OURS": down restores ORIGINAL only while the value is OURS
    : >"$STATE/sysctl.saved"
    for k in net.core.rmem_max net.core.wmem_max; do
      local v; v=$(sysctl -n $k)
      if ((v < TUNED_CORE_MAX)); then sysctl -q -w "$k=$TUNED_CORE_MAX"; echo "$k $v $TUNED_CORE_MAX" >>"$STATE/sysctl.saved"; fi
    done
  fi

  # tbf: burst of 4 ms at the rate (≥ 128 KiB, so 64 KiB GSO packets pass whole); a queue of
  # one bandwidth-delay product (≥ 256 KiB), as the delay line sizes its own.
  local burst limit
  burst=$(awk -v b="$bps" 'BEGIN{x=b/8*0.004; if (x<131072) x=131072; printf "%.0f", x}')
  limit=$(awk -v b="$bps" -v r="$rtt" 'BEGIN{x=b/8*r/1000; if (x<262144) x=262144; printf "%.0f", x}')

  local s i
  for s in "${SITES[@]}"; do
    local rns; rns=$(router_ns "$s")
    ip netns add "$rns"
    ip -n "$rns" link set lo up
    in_ns "$rns" sysctl -q -w net.ipv4.ip_forward=1 net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    in_ns "$rns" sysctl -q -w net.ipv4.tcp_congestion_control="$cc"
    ip -n "$rns" tuntap add dev $WAN_DEV mode tun          # IFF_TUN|IFF_NO_PI, the delay line's end
    ip -n "$rns" link set $WAN_DEV mtu "$mtu" txqueuelen 10000 up
    for i in $(seq "$nodes"); do make_node "$s" "$s$i" "$mtu" "$cc" "$tuned" "$bps" "$burst" "$limit"; done
  done
  ip -n "$(router_ns a)" addr add "$(wan_addr a)" peer "$(wan_addr b)" dev $WAN_DEV
  ip -n "$(router_ns b)" addr add "$(wan_addr b)" peer "$(wan_addr a)" dev $WAN_DEV
  ip -n "$(router_ns a)" route add "$(subnet b).0/24" dev $WAN_DEV
  ip -n "$(router_ns b)" route add "$(subnet a).0/24" dev $WAN_DEV
  write_hosts "$nodes"

  # The wide-area path: one-way delay = (RTT - the bed's own base RTT)/2 each way, as netns.sh.
  local base_us=${TERN_BED_BASE_US:-100} delay_us
  delay_us=$(awk -v r="$rtt" -v b="$base_us" 'BEGIN{d=(r*1000-b)/2; if (d<0) d=0; printf "%.0f", d}')
  setsid "$DL_BIN" --a "$(router_ns a):$WAN_DEV" --b "$(router_ns b):$WAN_DEV" --delay-us "$delay_us" \
    --loss "$loss" --rate "$wan_rate" --stats-file "$STATE/delayline.stats.json" \
    >"$LOGS/delayline.out" 2>"$LOGS/delayline.log" </dev/null 9>&- &
  echo $! >"$PIDS/delayline.pid"
  local ok=0
  for _ in $(seq 100); do   # ≤ 10 s
    grep -q ' ready ' "$LOGS/delayline.log" 2>/dev/null && { ok=1; break; }
    kill -0 "$(<"$PIDS/delayline.pid")" 2>/dev/null || break
    sleep 0.1
  done
  ((ok)) || { cat "$LOGS/delayline.log" >&2; die "delay line did not start"; }

  # The sites' shared directories ("parallel file system") and one daemon secret per site.
  for s in "${SITES[@]}"; do
    local d; d=$(site_dir "$s")
    mkdir -p "$d"
    if [[ -n $tmpfs ]]; then mount -t tmpfs -o "size=$tmpfs,mode=755" "tern-cluster-$s" "$d"; : >"$STATE/tmpfs-$s"; fi
    (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$(token_file "$s")")
  done
  for s in "${SITES[@]}"; do start_pg "$s" "$nosync"; done

  cat >"$STATE/config.env" <<EOF
NODES=$nodes
RATE=$rate
RATE_BPS=$bps
TBF_BURST=$burst
TBF_LIMIT=$limit
RTT_MS=$rtt
DELAY_US=$delay_us
BED_BASE_US=$base_us
LOSS=$loss
WAN_RATE=$wan_rate
MTU=$mtu
CC=$cc
TUNED=$tuned
TMPFS=$tmpfs
PG_NOSYNC=$nosync
DB_A=$(db_url a)
DB_B=$(db_url b)
EOF
  for i in $(seq "$nodes"); do
    timeout 20 ip netns exec "$(node_ns "a$i")" ping -q -c 3 -i 0.2 -W 5 "$(node_addr "b$i")" >/dev/null \
      || die "no connectivity a$i -> b$i through the delay line"
  done
  local pgbin; pgbin=$(pg_bin_dir)
  for s in "${SITES[@]}"; do   # each site's database from its first node, and not from the other site's
    timeout 15 ip netns exec "$(node_ns "${s}1")" "$pgbin/pg_isready" -q -h "$(router_addr "$s")" -p $PG_PORT \
      || die "site $s's PostgreSQL is not reachable from ${s}1"
  done
  if timeout 15 ip netns exec "$(node_ns b1)" "$pgbin/psql" -X -q -w -h "$(router_addr a)" -p $PG_PORT -U tern -d tern -c 'select 1' >/dev/null 2>&1; then
    die "site A's PostgreSQL accepts site B's nodes (pg_hba.conf)"
  fi
  trap - EXIT
  log "up: 2 sites × $nodes nodes, rate=$rate per node (tbf burst $burst B, queue $limit B), rtt=${rtt}ms loss=$loss mtu=$mtu cc=$cc tuned=$tuned wan-rate=$wan_rate ($(grep -o 'sched_fifo=[a-z]*' "$LOGS/delayline.log"))"
  log "site A: $(site_dir a), --db $(db_url a); site B: $(site_dir b), --db $(db_url b)"
}

need_up() { [[ -f $STATE/config.env ]] || die "the bed is down (bench/cluster.sh up)"; }

# --- nodes --------------------------------------------------------------------------------------
cmd_nodes() {
  local k=${1:-}; shift || true
  local bin="" extra=() unix=0
  while (($#)); do
    case $1 in
      --tern) bin=$2; shift 2 ;;
      --unix-db) unix=1; shift ;;
      --) shift; extra=("$@"); break ;;
      *) die "unknown option $1" ;;
    esac
  done
  need_up
  local max; max=$(cfg NODES)
  [[ $k =~ ^[0-9]+$ ]] && ((k <= max)) || die "nodes K: K must be 0..$max (the bed was brought up with --nodes $max)"
  stop_nodes
  ((k == 0)) && { log "nodes stopped"; return 0; }
  bin=$(find_tern "$bin")
  sed -i '/^TERN=/d' "$STATE/config.env"; echo "TERN=$bin" >>"$STATE/config.env"
  local s i n
  # All nodes of both sites start at once: a joining node waits (≤ 2 heartbeats + 2 s) for a
  # live node to read its file-system probe; joins are serialised by the database's lock.
  for s in "${SITES[@]}"; do
    for i in $(seq "$k"); do
      start_node "$s$i" "$bin" "$unix" "${extra[@]}"
    done
  done
  local failed=0
  for s in "${SITES[@]}"; do
    for i in $(seq "$k"); do
      n=$s$i
      local ok=0
      for _ in $(seq 600); do   # ≤ 60 s
        grep -q 'listening on' "$LOGS/$n.log" 2>/dev/null && { ok=1; break; }
        kill -0 "$(<"$PIDS/node-$n.pid")" 2>/dev/null || break
        sleep 0.1
      done
      if ((ok)); then log "$n: pid $(<"$PIDS/node-$n.pid"), $(node_addr "$n"):$PORT, log $LOGS/$n.log"
      else log "$n did not start:"; tail -5 "$LOGS/$n.log" >&2; failed=1; fi
    done
  done
  ((failed == 0)) || die "some nodes did not start (bench/cluster.sh nodes 0 stops the others)"
}

start_node() { # NODE BIN UNIX EXTRA...: one `tern serve --cluster` in the node's namespace
  local n=$1 bin=$2 unix=$3 s=${1:0:1}; shift 3
  setsid ip netns exec "$(node_ns "$n")" "$bin" serve --listen "$(node_addr "$n"):$PORT" --root "$(site_dir "$s")" \
    --token-file "$(token_file "$s")" --cluster "site-$s" --db "$( ((unix)) && db_url_unix "$s" || db_url "$s")" --node-name "$n" "$@" \
    >"$LOGS/$n.log" 2>&1 </dev/null 9>&- &
  echo $! >"$PIDS/node-$n.pid"
}

wait_listening() { # NODE: ≤ 60 s for its "listening on" line
  local n=$1
  for _ in $(seq 600); do
    grep -q 'listening on' "$LOGS/$n.log" 2>/dev/null && return 0
    kill -0 "$(<"$PIDS/node-$n.pid")" 2>/dev/null || break
    sleep 0.1
  done
  tail -5 "$LOGS/$n.log" >&2; die "$n did not start"
}

cmd_kill() {
  local n=${1:-} pid
  [[ $n =~ ^[ab][1-9]$ ]] || die "kill NODE: NODE is a1..a9 or b1..b9"
  pid=$(pid_alive "$PIDS/node-$n.pid" tern) || die "no daemon of node $n is running"
  kill -KILL "$pid"
  rm -f "$PIDS/node-$n.pid"
  log "killed $n (pid $pid) with SIGKILL"
}

# --- status -------------------------------------------------------------------------------------
cmd_status() {
  [[ -f $STATE/config.env ]] || { echo "down"; return 1; }
  cat "$STATE/config.env"
  echo "DELAYLINE_PID=$(pid_alive "$PIDS/delayline.pid" tern-delayline || echo dead)"
  local s i n nodes; nodes=$(cfg NODES)
  for s in "${SITES[@]}"; do
    echo "site $s: dir $(site_dir "$s") ($(df -h --output=fstype,avail "$(site_dir "$s")" | tail -1 | xargs)), token $(token_file "$s")"
    echo "  --db $(db_url "$s")   (unix socket: '$(db_url_unix "$s")'), postgres pid $(pid_alive "$PIDS/pg-$s.pid" postgres || echo dead)"
    for i in $(seq "$nodes"); do
      n=$s$i
      echo "  $n $(node_addr "$n") [$(node_ns "$n")]: daemon $(pid_alive "$PIDS/node-$n.pid" tern || echo -)," \
           "cap out: $(tc -n "$(node_ns "$n")" qdisc show dev $NODE_DEV | awk '/tbf/{print $8}')" \
           "in: $(tc -n "$(router_ns "$s")" qdisc show dev "$n" | awk '/tbf/{print $8}')," \
           "$(in_ns "$(node_ns "$n")" sysctl -n net.ipv4.tcp_congestion_control)," \
           "tcp_wmem '$(in_ns "$(node_ns "$n")" sysctl -n net.ipv4.tcp_wmem)'"
    done
  done
  echo "root: core.rmem_max=$(sysctl -n net.core.rmem_max) core.wmem_max=$(sysctl -n net.core.wmem_max)"
  local bin; bin=$(cfg TERN)
  [[ -n $bin ]] || bin=$(find_tern "" 2>/dev/null) || bin=""
  if [[ -z $bin ]]; then
    echo "--- tern cluster status: no tern binary found (TERN_BIN=..., or start nodes with --tern BIN)"
  else
    for s in "${SITES[@]}"; do
      echo "--- tern cluster status --db $(db_url "$s") --cluster site-$s"
      timeout 30 ip netns exec "$(node_ns "${s}1")" "$bin" cluster status --db "$(db_url "$s")" --cluster "site-$s" || echo "(failed: $?)"
    done
  fi
  echo "--- ping a1 -> b1"
  timeout 30 ip netns exec "$(node_ns a1)" ping -c 10 -i 0.2 -W 5 "$(node_addr b1)" | tail -2
}

wan_bytes() { # bytes the delay line carried from site A to site B so far
  cmd_stats | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['directions']['ab']['tx_bytes'])"
}

cmd_stats() {
  local pid; pid=$(pid_alive "$PIDS/delayline.pid" tern-delayline) || die "delay line not running"
  rm -f "$STATE/delayline.stats.json"
  kill -USR1 "$pid"
  for _ in $(seq 50); do [[ -s $STATE/delayline.stats.json ]] && break; sleep 0.1; done
  cat "$STATE/delayline.stats.json"; echo
}

cmd_env() {
  need_up
  local s
  for s in "${SITES[@]}"; do
    local S=${s^^}
    echo "DB_$S='$(db_url "$s")'"
    echo "DB_${S}_UNIX='$(db_url_unix "$s")'"
    echo "DIR_$S='$(site_dir "$s")'"
    echo "TOKEN_$S='$(token_file "$s")'"
  done
  echo "NODES=$(cfg NODES) RATE=$(cfg RATE) RTT_MS=$(cfg RTT_MS)"
}

# --- selftest: the caps add up through the delay line -------------------------------------------
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

iperf_pairs() { # SECS STREAMS PAIR... -> per-pair Gb/s lines "aK bK GBPS RETRANS", sum
  local secs=$1 P=$2; shift 2
  local tmp; tmp=$(mktemp -d)
  local i spids=() cpids=()
  for i in "$@"; do
    in_ns "$(node_ns "b$i")" timeout $((secs + 40)) iperf3 -s -1 -B "$(node_addr "b$i")" -p 5201 >/dev/null 2>&1 9>&- &
    spids+=($!)
  done
  sleep 1
  local dl c0 c1; dl=$(pid_alive "$PIDS/delayline.pid" tern-delayline); c0=$(cpu_ticks "$dl")
  local t0; t0=$(date +%s.%N)
  for i in "$@"; do
    in_ns "$(node_ns "a$i")" timeout $((secs + 30)) iperf3 -c "$(node_addr "b$i")" -p 5201 -P "$P" -t "$secs" -J >"$tmp/a$i.json" 2>"$tmp/a$i.err" 9>&- &
    cpids+=($!)
  done
  local rc=0
  for p in "${cpids[@]}"; do wait "$p" || rc=1; done
  c1=$(cpu_ticks "$dl")
  for p in "${spids[@]}"; do wait "$p" 2>/dev/null || true; done
  ((rc == 0)) || { cat "$tmp"/*.err >&2; rm -rf "$tmp"; die "iperf3 failed"; }
  local hz; hz=$(getconf CLK_TCK)
  /usr/bin/python3 - "$tmp" "$secs" "$((c1 - c0))" "$hz" "$@" <<'EOF'
import json, sys
tmp, secs, ticks, hz, pairs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
tot = 0.0
for i in pairs:
    e = json.load(open(f"{tmp}/a{i}.json"))["end"]
    g = e["sum_received"]["bits_per_second"] / 1e9
    rt = e["sum_sent"].get("retransmits", 0)
    tot += g
    print(f"pair a{i}->b{i} {g:.4f} {rt}")
print(f"sum {tot:.4f} delayline_cpu {ticks / hz / secs:.3f}")
EOF
  rm -rf "$tmp"
}

cmd_selftest() {
  local secs=20 P=4 brought=0
  while (($#)); do
    case $1 in
      --secs) secs=$2; shift 2 ;;
      --streams) P=$2; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  command -v iperf3 >/dev/null || die "no iperf3 (bench/install-peers.sh)"
  if [[ ! -f $STATE/config.env ]]; then cmd_up; brought=1; trap 'cmd_down' EXIT; fi
  local nodes bps; nodes=$(cfg NODES); bps=$(cfg RATE_BPS)
  local pairs; pairs=$(seq -s ' ' "$nodes")
  echo "# cluster bed selftest: $(cfg RATE) per node, RTT $(cfg RTT_MS) ms, $(cfg CC), mtu $(cfg MTU), tuned=$(cfg TUNED), iperf3 -P $P, $secs s"
  echo "ping a1->b1: $(timeout 30 ip netns exec "$(node_ns a1)" ping -q -c 10 -i 0.2 "$(node_addr b1)" | tail -1)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "## one pair alone"
  iperf_pairs "$secs" "$P" 1
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "## $nodes pairs at once"
  local out; out=$(iperf_pairs "$secs" "$P" $pairs)
  echo "$out"
  local sum; sum=$(echo "$out" | awk '/^sum/{print $2}')
  [[ -n $sum ]] || die "the $nodes-pair iperf3 run failed"
  local pass=0
  awk -v s="$sum" -v b="$bps" -v n="$nodes" 'BEGIN{r=s*1e9/(n*b); printf "total %.4f Gb/s = %.3f x %d x rate: %s\n", s, r, n, (r>=0.95?"PASS (>= 0.95)":"FAIL (< 0.95)")}'
  awk -v s="$sum" -v b="$bps" -v n="$nodes" 'BEGIN{exit !(s*1e9/(n*b) >= 0.95)}' && pass=1
  echo "delay line since up: $(cmd_stats | /usr/bin/python3 -c '
import json, sys
d = json.load(sys.stdin)
dirs = ["%s: %.2f GB, drops %d, late avg %.0f us max %.1f ms" % (k, v["tx_bytes"] / 1e9,
        v["drop_loss"] + v["drop_queue"] + v["drop_ring"] + v["drop_write"], v["late_avg_us"], v["late_max_us"] / 1000)
        for k, v in d["directions"].items()]
print("cpu %.1f s in %.0f s; %s" % (d["process_cpu_s"], d["wall_s"], "; ".join(dirs)))' 2>&1 || echo n/a)"
  local i
  for i in $pairs; do   # the caps' own counters: drops at a node's tbf mean its queue overflowed
    echo "tbf a$i out: $(tc -s -n "$(node_ns "a$i")" qdisc show dev $NODE_DEV | grep -o 'dropped [0-9]*, overlimits [0-9]*' | head -1);" \
         "tbf b$i in: $(tc -s -n "$(router_ns b)" qdisc show dev "b$i" | grep -o 'dropped [0-9]*, overlimits [0-9]*' | head -1)"
  done
  if ((brought)); then trap - EXIT; cmd_down; fi
  ((pass))   # the exit status: 0 when the caps added up (≥ 0.95 of pairs × rate)
}

# --- baseline: today's single-node tern on the bed ----------------------------------------------
make_datasets() { # in site A's directory, each once: four-1g, hacc-4g, one-3g (tern-bench-gen)
  local d; d=$(site_dir a)
  local name
  for name in "$@"; do
    [[ -f $d/$name.json && -d $d/$name ]] && continue
    rm -rf "${d:?}/$name" "$d/$name.json" "$d/.gen-$name"
    log "generating $name in $d"
    case $name in
      four-1g)   # 4 × 1 GiB random files (the 'one' profile, one seed each)
        mkdir -p "$d/.gen-$name/data"
        for i in 0 1 2 3; do
          timeout 1200 "$GEN_BIN" one "$d/.gen-$name/f$i" --size 1G --seed $((i + 1)) >/dev/null
          mv "$d/.gen-$name/f$i/file.dat" "$d/.gen-$name/data/file$i.dat"
        done
        echo '{"profile":"4 x one:1G","files":4,"bytes":4294967296}' >"$d/.gen-$name/meta.json" ;;
      hacc-4g) timeout 1800 "$GEN_BIN" hacc "$d/.gen-$name/data" --size 4G >"$d/.gen-$name.json"
               mkdir -p "$d/.gen-$name"; mv "$d/.gen-$name.json" "$d/.gen-$name/meta.json" ;;
      one-3g)  timeout 1200 "$GEN_BIN" one "$d/.gen-$name/data" --size 3G >"$d/.gen-$name.json"
               mkdir -p "$d/.gen-$name"; mv "$d/.gen-$name.json" "$d/.gen-$name/meta.json" ;;
      *) die "unknown dataset $name (four-1g, hacc-4g, one-3g)" ;;
    esac
    mv "$d/.gen-$name/data" "$d/$name"
    mv "$d/.gen-$name/meta.json" "$d/$name.json"
    rm -rf "$d/.gen-$name"
    sync -f "$d/$name.json"
  done
}

cmd_baseline() {
  local bin="" reps=1 sets=four-1g,hacc-4g,one-3g out=""
  while (($#)); do
    case $1 in
      --tern) bin=$2; shift 2 ;;
      --reps) reps=$2; shift 2 ;;
      --datasets) sets=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  need_up
  bin=$(find_tern "$bin")
  local names; IFS=, read -r -a names <<<"$sets"
  make_datasets "${names[@]}"
  cmd_nodes 1 --tern "$bin"
  local src dst token; src=$(site_dir a); dst=$(site_dir b); token=$(token_file b)
  local rows=() name r
  echo "# single-node baseline: $(cfg RATE) per node, RTT $(cfg RTT_MS) ms, $(cfg CC), tuned=$(cfg TUNED); $("$bin" --version 2>/dev/null | head -1) ($bin)"
  for name in "${names[@]}"; do
    for r in $(seq "$reps"); do
      rm -rf "${dst:?}/$name-k1"
      local load dpid c0 c1 t0 t1 rc=0
      load=$(cut -d' ' -f1-3 /proc/loadavg)
      dpid=$(pid_alive "$PIDS/node-b1.pid" tern); c0=$(cpu_ticks "$dpid")
      t0=$(date +%s.%N)
      TERN_HISTORY=off timeout 3600 ip netns exec "$(node_ns a1)" "$bin" cp -r --json --token-file "$token" "$src/$name" \
        "tern://$(node_addr b1):$PORT/$name-k1" >"$LOGS/baseline-$name-$r.json" 2>"$LOGS/baseline-$name-$r.err" || rc=$?
      t1=$(date +%s.%N)
      c1=$(cpu_ticks "$dpid")
      local verdict="verified"
      if ((rc != 0)); then verdict="FAILED rc=$rc: $(tail -1 "$LOGS/baseline-$name-$r.err")"
      elif ! timeout 1800 /usr/bin/python3 "$HERE/verify.py" "$src/$name" "$dst/$name-k1" >"$LOGS/verify-$name-$r.log" 2>&1; then
        verdict="MISMATCH: $(tail -1 "$LOGS/verify-$name-$r.log")"
      fi
      local line
      line=$(/usr/bin/python3 - "$name" "$r" "$t0" "$t1" "$((c1 - c0))" "$(getconf CLK_TCK)" "$src/$name.json" "$load" "$verdict" "$(cfg RATE_BPS)" "$LOGS/baseline-$name-$r.json" <<'EOF'
import json, sys
name, r, t0, t1, ticks, hz, meta, load, verdict, bps, summary = sys.argv[1:]
m = json.load(open(meta))
try:
    j = json.loads(open(summary).read().strip().splitlines()[-1])
except Exception:
    j = {}
wall = float(t1) - float(t0)
gbps = m["bytes"] * 8 / wall / 1e9
print(f"| {name} | {r} | {m['files']} | {m['bytes']/2**30:.2f} GiB | {wall:.1f} | {gbps:.3f} | {gbps*1e9/float(bps):.2f} | "
      f"{j.get('bytes_resent', '?')} | {int(ticks)/int(hz):.1f} | {load} | {verdict} |")
EOF
)
      echo "$line"; rows+=("$line")
      rm -rf "${dst:?}/$name-k1"
    done
  done
  if [[ -n $out ]]; then printf '%s\n' "${rows[@]}" >"$out"; fi
  cmd_nodes 0
}


# --- spreading one transfer over the nodes (docs/cluster.md "Spreading a transfer") ------------
# A client in tc-a1 asks for tern://a1/DATA → tern://b1/DATA-kK: both daemons name their
# clusters' nodes and the copy is spread over node pairs, each pair's data going straight from
# aI to bJ (third-party; site A's nodes may dial site B's addresses).
spread_copy() { # BIN NAME TAG LOG: one timed, verified spread copy; prints "wall rc summary-json"
  local bin=$1 name=$2 tag=$3 log=$4 t0 t1 rc=0
  rm -rf "${DATA:?}/site-b/${name:?}-$tag"
  t0=$(date +%s.%N)
  TERN_HISTORY=off timeout 3600 ip netns exec "$(node_ns a1)" "$bin" cp -r --json --token-file "$(token_file a)" \
    --dst-token-file "$(token_file b)" "tern://$(node_addr a1):$PORT/$name" "tern://$(node_addr b1):$PORT/$name-$tag" \
    >"$log.json" 2>"$log.err" || rc=$?
  t1=$(date +%s.%N)
  echo "$t0 $t1 $rc"
}

verify_copy() { # NAME TAG LOG -> "verified" or why not
  local name=$1 tag=$2 log=$3
  if timeout 1800 /usr/bin/python3 "$HERE/verify.py" "$(site_dir a)/$name" "$(site_dir b)/$name-$tag" >"$log.verify" 2>&1; then echo verified
  else echo "MISMATCH: $(tail -1 "$log.verify")"; fi
}

row() { # NAME K T0 T1 RC VERDICT LOG BASE_GBPS NOTE -> a markdown row
  /usr/bin/python3 - "$@" "$(site_dir a)" "$(cfg RATE_BPS)" <<'PY'
import json, sys
name, k, t0, t1, rc, verdict, log, base, note, sdir, bps = sys.argv[1:]
m = json.load(open(f"{sdir}/{name}.json"))
try:
    j = json.loads(open(log + ".json").read().strip().splitlines()[-1])
except Exception:
    j = {}
wall = float(t1) - float(t0)
gbps = m["bytes"] * 8 / wall / 1e9
pairs = ", ".join(f"{p['source'].split(':')[0].rsplit('.',1)[-1]}→{p['destination'].split(':')[0].rsplit('.',1)[-1]} {p['units']}u {p['gbps']:.3f}" for p in j.get("nodes", []))
ratio = f"{gbps/float(base):.2f}" if float(base) > 0 else "1.00"
sent = j.get("bytes", 0)
again = max(0, sent - m["bytes"])
status = verdict if rc == "0" else f"FAILED rc={rc}"
print(f"| {name} | {k} | {wall:.1f} | {gbps:.3f} | {ratio} | {gbps*1e9/(int(k)*float(bps)):.2f} | {again/2**20:.1f} MiB | {pairs or '-'} | {status} | {note} |")
PY
}

cmd_scale() {
  local bin="" reps=1 sets=hacc-4g,four-1g ks=1,2,3 out=""
  while (($#)); do
    case $1 in
      --tern) bin=$2; shift 2 ;;
      --reps) reps=$2; shift 2 ;;
      --datasets) sets=$2; shift 2 ;;
      --nodes) ks=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  need_up
  bin=$(find_tern "$bin")
  local names kk; IFS=, read -r -a names <<<"$sets"; IFS=, read -r -a kk <<<"$ks"
  make_datasets "${names[@]}"
  declare -A base
  local rows=() k name r
  echo "| dataset | nodes per site | s | Gb/s | × 1 node | of k × cap | sent again | pairs (units, Gb/s) | check | note |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  for k in "${kk[@]}"; do
    cmd_nodes "$k" --tern "$bin" -- --dial-allow "$(subnet b).0/24" >/dev/null
    sleep 6   # every node's view of the others is a heartbeat (5 s) old
    for name in "${names[@]}"; do
      for r in $(seq "$reps"); do
        local log="$LOGS/scale-$name-k$k-$r" t0 t1 rc verdict line
        read -r t0 t1 rc < <(spread_copy "$bin" "$name" "k$k" "$log")
        verdict=$(verify_copy "$name" "k$k" "$log")
        line=$(row "$name" "$k" "$t0" "$t1" "$rc" "$verdict" "$log" "${base[$name]:-0}" "load $(cut -d' ' -f1 /proc/loadavg)")
        if [[ -z ${base[$name]:-} && $k == 1 ]]; then
          base[$name]=$(/usr/bin/python3 -c "import json,sys; m=json.load(open('$(site_dir a)/$name.json')); print(m['bytes']*8/($t1-$t0)/1e9)")
        fi
        echo "$line"; rows+=("$line")
        rm -rf "${DATA:?}/site-b/${name:?}-k$k"
      done
    done
  done
  if [[ -n $out ]]; then printf '%s\n' "${rows[@]}" >"$out"; fi
  cmd_nodes 0 >/dev/null
}

cmd_faults() { # a node of each site killed, a node pair joining, PostgreSQL restarted: mid-copy
  local bin="" name=hacc-4g at=25 out="" cases=kill-b2,kill-a2,join-3,pg-restart
  while (($#)); do
    case $1 in
      --cases) cases=$2; shift 2 ;;
      --tern) bin=$2; shift 2 ;;
      --dataset) name=$2; shift 2 ;;
      --at) at=$2; shift 2 ;;
      --out) out=$2; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  need_up
  bin=$(find_tern "$bin")
  make_datasets "$name"
  local rows=() case_ k log t0 t1 rc verdict line
  echo "| dataset | nodes per site | s | Gb/s | × 1 node | of k × cap | sent again | pairs (units, Gb/s) | check | event at ${at} s |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  local cl; IFS=, read -r -a cl <<<"$cases"
  for case_ in "${cl[@]}"; do
    k=3; [[ $case_ == join-3 ]] && k=2
    cmd_nodes "$k" --tern "$bin" -- --dial-allow "$(subnet b).0/24" >/dev/null
    sleep 6
    log="$LOGS/faults-$case_"
    ( sleep "$at"
      case $case_ in
        kill-b2) cmd_kill b2 ;;
        kill-a2) cmd_kill a2 ;;
        join-3) start_node a3 "$bin" 0 --dial-allow "$(subnet b).0/24"; start_node b3 "$bin" 0 ;;
        pg-restart) restart_pg a; restart_pg b ;;
        none) ;;
      esac ) >"$log.event" 2>&1 &
    local ev=$! wan0 wan1
    wan0=$(wan_bytes)
    read -r t0 t1 rc < <(spread_copy "$bin" "$name" "$case_" "$log")
    wait "$ev" || true
    wan1=$(wan_bytes)
    verdict=$(verify_copy "$name" "$case_" "$log")
    # What crossed the wide-area link, all sessions' data and headers: a fault-free copy's
    # figure against a faulty one's is what was sent again (the coordinator cannot see a
    # third-party session's resends; only the bytes it asked for).
    line=$(row "$name" "$k" "$t0" "$t1" "$rc" "$verdict" "$log" 0 "$case_; WAN $(( (wan1 - wan0) / 1048576 )) MiB")
    echo "$line"; rows+=("$line")
    rm -rf "${DATA:?}/site-b/${name:?}-$case_"
    cmd_nodes 0 >/dev/null
  done
  if [[ -n $out ]]; then printf '%s\n' "${rows[@]}" >"$out"; fi
}

# --- main ---------------------------------------------------------------------------------------
lock() { # one cluster bed per machine (bench/netns.sh's bed has its own lock and may be up too)
  exec 9>/run/tern-cluster.lock
  flock -n 9 || die "another bench/cluster.sh holds /run/tern-cluster.lock"
}

case ${1:-} in
  up) shift; lock; cmd_up "$@" ;;
  down) shift; lock; cmd_down "$@" ;;
  nodes) shift; lock; cmd_nodes "$@" ;;
  kill) shift; cmd_kill "$@" ;;
  status) cmd_status ;;
  stats) cmd_stats ;;
  env) cmd_env ;;
  selftest) shift; lock; cmd_selftest "$@" ;;
  datasets) shift; mkdir -p "$(site_dir a)"; if (($#)); then make_datasets "$@"; else make_datasets four-1g hacc-4g one-3g; fi ;;
  baseline) shift; lock; cmd_baseline "$@" ;;
  scale) shift; lock; cmd_scale "$@" ;;
  faults) shift; lock; cmd_faults "$@" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2 ;;
esac
