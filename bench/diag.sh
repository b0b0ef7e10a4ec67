#!/usr/bin/env bash
# Does `tern test` name the right limit, with numbers near an independent measurement?
# On the bench bed (bench/netns.sh: tern-a -> delay line -> tern-b), per case: iperf3 with 1
# and 8 streams, then `tern test` from tern-a to a daemon in tern-b, and the case's own
# independent measurement; writes bench/results/diag-<case>.md with the verdict and the numbers.
#   bench/diag.sh [CASE...]   cases (default all):
#     buffers  68 ms, 1 Gb/s, 1 MiB socket-buffer limits            independent: iperf3 -P 8
#     cap300   0.2 ms, link capped at 300 Mb/s                       independent: iperf3 -P 8
#     dstdisk  0.2 ms, 1 Gb/s; the daemon's directory is a file system whose writes are capped at
#              40 MB/s (bench/slowdisk.py)                 independent: dd conv=fdatasync into it
#     srcdisk  0.2 ms, 1 Gb/s; --source a file on a file system whose reads are capped at
#              40 MB/s                                     independent: dd of it to /dev/null
#     cpu      0.2 ms, no link cap; the daemon (the receiver) in a cgroup v1 CPU quota of
#              CPU_QUOTA cores (default 0.1, in 20 ms periods)   independent: a real `tern cp`
#              of 1 GiB from memory to the same daemon right after, timed; and the cipher alone
#              (openssl speed -elapsed -evp aes-256-gcm) in the same cgroup
#     loss     68 ms, 1 Gb/s, random loss 1e-3 each way, reno       independent: the delay line's
#              own count of the packets it dropped (tern test's share of segments re-sent)
# The daemon runs in tern-b's network namespace only (nsenter --net), not `ip netns exec`,
# whose fresh /sys hides the cgroup mounts its quota is read from.
# Needs root, bench/install-peers.sh (iperf3), python3-fusepy + libfuse2 (apt; for the disk
# cases), a cgroup v1 cpu controller at /sys/fs/cgroup/cpu (the cpu case) and a release build
# (TERN_BIN to override).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TERN_BIN=$(realpath "${TERN_BIN:-target/release/tern}")
CPU_QUOTA=${CPU_QUOTA:-0.1}
SECONDS_PER_TEST=${SECONDS_PER_TEST:-40}
cases=("$@")
((${#cases[@]})) || cases=(buffers cap300 dstdisk srcdisk cpu loss)
work=$(mktemp -d /dev/shm/tern-diag.XXXXXX)
cg=/sys/fs/cgroup/cpu/tern-diag-$$
pids=()
fuse_pids=()
mnts=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
  for m in "${mnts[@]}"; do fusermount -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  mnts=()
  # unmounted first; fusepy's loop does not always end by itself after that
  for p in "${fuse_pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  fuse_pids=()
  [[ -d $cg ]] && rmdir "$cg" 2>/dev/null || true
}
cleanup() {
  stop_all
  bench/netns.sh down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
a() { ip netns exec tern-a "$@"; }
b() { ip netns exec tern-b "$@"; }
gbps() { python3 -c 'import json,sys; print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9, 3))'; }
# dd's last line -> its rate in Gb/s ("... copied, 5.0 s, 40.0 MB/s")
dd_gbps() { python3 -c 'import re,sys; t=sys.stdin.read().strip().splitlines()[-1]; m=re.search(r"^(\d+) bytes.*copied, ([\d.]+) s", t); print(round(int(m[1])*8/float(m[2])/1e9, 4))'; }
slowdisk() { # backing mountpoint read_mbps write_mbps
  mkdir -p "$1" "$2"
  /usr/bin/python3 bench/slowdisk.py "$1" "$2" --read-mbps "$3" --write-mbps "$4" >"$work/slowdisk.log" 2>&1 &
  fuse_pids+=($!)
  mnts+=("$2")
  for _ in $(seq 50); do mountpoint -q "$2" && return 0; sleep 0.1; done
  echo "diag.sh: slowdisk did not mount: $(cat "$work/slowdisk.log")" >&2
  exit 1
}

for c in "${cases[@]}"; do
  dest=tern://198.18.0.2:7788/
  extra=()
  serve_prefix=()
  indep_what="" indep=""
  rm -rf "$work/root"
  mkdir -p "$work/root"
  case $c in
    buffers) bench/netns.sh up olcf-nersc >/dev/null
      # 1 MiB socket-buffer limits in both namespaces: one stream's window is ~1 MiB per 68 ms.
      for ns in tern-a tern-b; do
        ip netns exec $ns sysctl -q -w net.ipv4.tcp_rmem="4096 131072 1048576" net.ipv4.tcp_wmem="4096 16384 1048576"
      done
      what="68 ms, 1 Gb/s, 1 MiB socket-buffer limits (net.ipv4.tcp_rmem/wmem max) on both hosts" ;;
    cap300) bench/netns.sh up lan --rate 300m >/dev/null
      what="0.2 ms, link capped at 300 Mb/s" ;;
    dstdisk) bench/netns.sh up lan >/dev/null
      slowdisk "$work/dstback" "$work/root/capped" 0 40
      dest=tern://198.18.0.2:7788/capped
      what="0.2 ms, 1 Gb/s; the daemon's directory on bench/slowdisk.py with writes capped at 40 MB/s" ;;
    srcdisk) bench/netns.sh up lan >/dev/null
      mkdir -p "$work/srcback"
      head -c $((768 << 20)) /dev/urandom >"$work/srcback/big"
      slowdisk "$work/srcback" "$work/srcmnt" 40 0
      extra=(--source "$work/srcmnt/big")
      what="0.2 ms, 1 Gb/s; --source a 768 MiB file on bench/slowdisk.py with reads capped at 40 MB/s" ;;
    cpu) bench/netns.sh up lan --rate 0 >/dev/null
      mkdir "$cg"
      echo 20000 >"$cg/cpu.cfs_period_us"   # short periods: a smoother quota for TCP
      quota_us=$(awk -v q="$CPU_QUOTA" 'BEGIN { printf "%d", q * 20000 }')
      echo "$quota_us" >"$cg/cpu.cfs_quota_us"
      echo 8192 >"$cg/cpu.shares"   # its quota, even while builds share the machine
      serve_prefix=(sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg")
      what="0.2 ms, no link cap; the daemon (receiving) in a cgroup v1 CPU quota of $CPU_QUOTA cores (cpu.cfs_quota_us $(<"$cg/cpu.cfs_quota_us") / cpu.cfs_period_us 20000)" ;;
    loss) bench/netns.sh up olcf-nersc --loss 0.001 --cc reno >/dev/null
      what="68 ms, 1 Gb/s, random loss 1e-3 in each direction (the delay line), reno on both hosts" ;;
    *) echo "diag.sh: unknown case $c" >&2; exit 2 ;;
  esac
  b iperf3 -s -p 5299 >/dev/null 2>&1 & pids+=($!)
  "${serve_prefix[@]}" nsenter --net=/run/netns/tern-b "$TERN_BIN" serve --listen 198.18.0.2:7788 --root "$work/root" --token-file "$work/token" 2>"$work/serve.log" & pids+=($!)
  sleep 2
  one=$(a iperf3 -c 198.18.0.2 -p 5299 -P 1 -t 10 -J | gbps)
  eight=$(a iperf3 -c 198.18.0.2 -p 5299 -P 8 -t 10 -J | gbps)
  # The delay line's own counters around the test: what the link really dropped (loss case).
  bench/netns.sh stats >"$work/stats0.json" 2>/dev/null || true
  t0=$(date +%s.%N)
  a env TERN_HISTORY=off "$TERN_BIN" test --seconds "$SECONDS_PER_TEST" --json "${extra[@]}" --token-file "$work/token" "$dest" >"$work/test.json"
  bench/netns.sh stats >"$work/stats1.json" 2>/dev/null || true
  took=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
  # The independent measurement, right after (the same load on the machine).
  case $c in
    dstdisk)
      indep=$(dd if=/dev/zero of="$work/root/capped/dd.x" bs=4M count=50 conv=fdatasync 2>&1 | dd_gbps)
      rm -f "$work/root/capped/dd.x"
      indep_what="dd if=/dev/zero of=capped/dd.x bs=4M count=50 conv=fdatasync"
      ours=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["destination"]["many_gbps"], 4))' "$work/test.json") ;;
    srcdisk)
      indep=$(dd if="$work/srcmnt/big" of=/dev/null bs=4M count=50 2>&1 | dd_gbps)
      indep_what="dd if=capped/big of=/dev/null bs=4M count=50"
      ours=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["source"]["many_gbps"], 4))' "$work/test.json") ;;
    cpu)
      head -c $((1 << 30)) /dev/zero >"$work/src.bin"
      s0=$(date +%s.%N)
      a env TERN_HISTORY=off "$TERN_BIN" cp --token-file "$work/token" "$work/src.bin" tern://198.18.0.2:7788/copied.bin >/dev/null 2>"$work/cp.err"
      s1=$(date +%s.%N)
      indep=$(python3 -c "print(round((1 << 30) * 8 / ($s1 - $s0) / 1e9, 4))")
      rm -f "$work/src.bin" "$work/root/copied.bin"
      indep_what="tern cp of 1 GiB (zeros, from /dev/shm) to the same quota'd daemon, wall time"
      # The cipher alone under the same quota, wall time: what one core seals × the usable cores.
      ossl=$(sh -c 'echo $$ >"$0/cgroup.procs" && exec openssl speed -elapsed -seconds 3 -bytes 1048576 -evp aes-256-gcm' "$cg" 2>/dev/null \
        | awk '/^(AES-256-GCM|aes-256-gcm)/ { v = $NF; sub(/k$/, "", v); printf "%.3f", v * 1000 * 8 / 1e9 }')
      seal_x_cores=$(python3 -c 'import json,sys; v=json.load(open(sys.argv[1]))["cpu"]["remote"]; print(round(v["seal_gbps"] * v["cores"], 3))' "$work/test.json")
      ours=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["network"]["many_gbps"], 4))' "$work/test.json") ;;
    loss)
      # Packets the link dropped (random loss, queue, ring) among those sent from tern-a to tern-b
      # during the whole test, against the share of segments tern's sending TCP re-sent.
      indep=$(python3 - "$work/stats0.json" "$work/stats1.json" <<'PY'
import json, sys
d0, d1 = (json.load(open(f))["directions"] for f in sys.argv[1:3])
k = next(k for k in d1 if k.startswith("a"))
delta = lambda f: d1[k][f] - d0[k][f]
dropped = sum(delta(f) for f in ("drop_loss", "drop_queue", "drop_ring", "drop_write"))
print(round(dropped * 100 / max(delta("rx_pkts"), 1), 4))
PY
)
      indep_what="the delay line's drops among the packets tern-a sent during the test (bench/netns.sh stats)"
      ours=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["network"]["retransmitted_pct"], 4))' "$work/test.json") ;;
    *) indep=$eight
      indep_what="iperf3 -P 8, 10 s"
      ours=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["network"]["many_gbps"], 4))' "$work/test.json") ;;
  esac
  text=$(a env TERN_HISTORY=off "$TERN_BIN" test --seconds "$SECONDS_PER_TEST" "${extra[@]}" --token-file "$work/token" "$dest" 2>&1 || true)
  read -r limit t1 tn < <(python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); print(v["verdict"]["limit"], round(v["network"]["one_gbps"],3), round(v["network"]["many_gbps"],3))' "$work/test.json")
  {
    echo "# tern test on the bed: $c"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M') UTC · 2-core VM (shared) · $what · \`bench/diag.sh $c\` (tern test --seconds $SECONDS_PER_TEST, took $took s)"
    echo
    echo "| | 1 stream | many streams | verdict |"
    echo "|---|---|---|---|"
    echo "| iperf3 (-P 1, -P 8, 10 s) | $one Gb/s | $eight Gb/s | |"
    echo "| tern test (--json run) | $t1 Gb/s | $tn Gb/s | $limit |"
    echo
    if [[ $c == loss ]]; then
      echo "Loss: tern test re-sent $ours % of its segments; the link dropped $indep % of the packets sent ($indep_what): ratio $(python3 -c "print(round($ours/$indep,3))")"
    else
    echo "Limiting component: tern test $ours Gb/s ($(python3 -c "print(round($ours*1e3/8,1))") MB/s) vs independent $indep Gb/s ($(python3 -c "print(round($indep*1e3/8,1))") MB/s; $indep_what): ratio $(python3 -c "print(round($ours/$indep,3))")"
    fi
    echo
    if [[ $c == cpu ]]; then
      echo "Sealing under the quota: tern test's seal per core × usable cores $seal_x_cores Gb/s vs \`openssl speed -elapsed -evp aes-256-gcm -bytes 1048576\` in the same cgroup $ossl Gb/s: ratio $(python3 -c "print(round($seal_x_cores/$ossl,3))")"
      echo
    fi
    echo '```'
    echo "$text"
    echo '```'
  } >bench/results/diag-"$c".md
  cat bench/results/diag-"$c".md
  stop_all
  sleep 1
done
