#!/usr/bin/env bash
# Does `tern test` name the right limit, with numbers near an independent measurement?
# On the bench bed (bench/netns.sh: tern-a -> delay line -> tern-b), per case: iperf3 with 1
# and 8 streams, then `tern test` from tern-a to a daemon in tern-b; writes
# bench/results/diag-<case>.md with the verdict and both sets of numbers.
#   bench/diag.sh [CASE...]     cases: buffers (68 ms, 1 Gb/s, 1 MiB socket-buffer limits),
#                               cap300 (0.2 ms, link capped at 300 Mb/s); default both
# Needs root, bench/install-peers.sh (iperf3) and a release build (TERN_BIN to override).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TERN_BIN=$(realpath "${TERN_BIN:-target/release/tern}")
cases=("$@")
((${#cases[@]})) || cases=(buffers cap300)
work=$(mktemp -d /dev/shm/tern-diag.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  bench/netns.sh down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
a() { ip netns exec tern-a "$@"; }
b() { ip netns exec tern-b "$@"; }
gbps() { python3 -c 'import json,sys; print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9, 3))'; }

for c in "${cases[@]}"; do
  case $c in
    buffers) bench/netns.sh up olcf-nersc >/dev/null
      # 1 MiB socket-buffer limits in both namespaces: one stream's window is ~1 MiB per 68 ms.
      for ns in tern-a tern-b; do
        ip netns exec $ns sysctl -q -w net.ipv4.tcp_rmem="4096 131072 1048576" net.ipv4.tcp_wmem="4096 16384 1048576"
      done
      what="68 ms, 1 Gb/s, 1 MiB socket-buffer limits (net.ipv4.tcp_rmem/wmem max) on both hosts" ;;
    cap300) bench/netns.sh up lan --rate 300m >/dev/null
      what="0.2 ms, link capped at 300 Mb/s" ;;
    *) echo "diag.sh: unknown case $c" >&2; exit 2 ;;
  esac
  b iperf3 -s -p 5299 >/dev/null 2>&1 & pids+=($!)
  mkdir -p "$work/root"
  b "$TERN_BIN" serve --listen 198.18.0.2:7788 --root "$work/root" --token-file "$work/token" 2>"$work/serve.log" & pids+=($!)
  sleep 2
  one=$(a iperf3 -c 198.18.0.2 -p 5299 -P 1 -t 10 -J | gbps)
  eight=$(a iperf3 -c 198.18.0.2 -p 5299 -P 8 -t 10 -J | gbps)
  a env TERN_HISTORY=off "$TERN_BIN" test --seconds 40 --json --token-file "$work/token" tern://198.18.0.2:7788/ >"$work/test.json"
  text=$(a env TERN_HISTORY=off "$TERN_BIN" test --seconds 40 --token-file "$work/token" tern://198.18.0.2:7788/ 2>&1 || true)
  read -r limit t1 tn < <(python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); print(v["verdict"]["limit"], round(v["network"]["one_gbps"],3), round(v["network"]["many_gbps"],3))' "$work/test.json")
  {
    echo "# tern test on the bed: $c"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M') UTC · 2-core VM · $what · \`bench/diag.sh $c\`"
    echo
    echo "| | 1 stream | many streams | verdict |"
    echo "|---|---|---|---|"
    echo "| iperf3 (-P 1, -P 8, 10 s) | $one Gb/s | $eight Gb/s | |"
    echo "| tern test (--json run) | $t1 Gb/s | $tn Gb/s | $limit |"
    echo
    echo "tern test many-stream rate ÷ iperf3 -P 8: $(python3 -c "print(round($tn/$eight,3))")"
    echo
    echo '```'
    echo "$text"
    echo '```'
  } >bench/results/diag-"$c".md
  cat bench/results/diag-"$c".md
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  pids=()
  sleep 1
done
