#!/usr/bin/env bash
# The SC16 pipeline shape, one command: a "simulation" writes N snapshot directories over time
# and logs `XFER <dir>` when each is complete; `tern watch` ships each snapshot to a tern daemon
# as soon as it is logged, the daemon runs the registered analysis hook on every snapshot in
# order, and the source is freed once the destination verified it.
#
#   bench/sc16.sh                       loopback: daemon on 127.0.0.1, link capped by --bwlimit
#   bench/sc16.sh --bed olcf-nersc      on the bench bed: watcher in tern-a, daemon in tern-b,
#                                       68 ms RTT, 1 Gb/s (takes the bed over: needs root, and
#                                       nobody else may be using it)
#   options: --snapshots N (8)  --size MiB per snapshot (256)  --files per snapshot (4)
#            --every SECS between snapshots (2)  --bwlimit RATE (loopback only; 800Mbit)
#            --tern BIN (target/release/tern)
# Prints max backlog and lag, the ETA warning if production outran the link, and checks that
# every snapshot arrived intact (SHA-256 at the source before deletion = at the destination, in
# the analysis hook) and was analysed exactly once, in order. Exits non-zero otherwise.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
BED="" N=8 SIZE=256 FILES=4 EVERY=2 BWLIMIT=800Mbit TERN=$REPO/target/release/tern
while (($#)); do
  case $1 in
    --bed) BED=$2; shift 2 ;;
    --snapshots) N=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --files) FILES=$2; shift 2 ;;
    --every) EVERY=$2; shift 2 ;;
    --bwlimit) BWLIMIT=$2; shift 2 ;;
    --tern) TERN=$2; shift 2 ;;
    *) echo "sc16.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $TERN ]] || { echo "sc16.sh: no $TERN (cargo build --release -p tern, or --tern BIN)" >&2; exit 1; }
TERN=$(readlink -f "$TERN")
W=/dev/shm/tern-sc16
SRC=$W/sim/out LOG=$W/sim/run.log DST=$W/dst
DAEMON_PID=""
cleanup() {
  [[ -n $DAEMON_PID ]] && kill "$DAEMON_PID" 2>/dev/null || true
  [[ -n $BED ]] && "$HERE/netns.sh" down >/dev/null 2>&1 || true
  rm -rf "$W/sim" "$W/dst"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$W" && mkdir -p "$SRC" "$DST" && : > "$LOG"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$W/token"

# The analysis job: checksums the snapshot where it landed and records when it ran.
cat > "$W/analyze.sh" <<'EOF'
#!/bin/sh
sum=$(cd "$TERN_UNIT_PATH" && find . -type f | sort | xargs cat | sha256sum | cut -d' ' -f1)
echo "$TERN_UNIT_NAME $sum $(date +%s.%N)" >> "$(dirname "$0")/analysis.log"
EOF
chmod +x "$W/analyze.sh"

if [[ -n $BED ]]; then
  [[ $EUID -eq 0 ]] || { echo "sc16.sh: --bed needs root" >&2; exit 1; }
  "$HERE/netns.sh" up "$BED" >/dev/null
  ADDR=198.18.0.2 RUN_A=(ip netns exec tern-a) RUN_B=(ip netns exec tern-b) LIMIT=()
else
  ADDR=127.0.0.1 RUN_A=() RUN_B=() LIMIT=(--bwlimit "$BWLIMIT")
fi
PORT=7711
"${RUN_B[@]}" "$TERN" serve --listen "$ADDR:$PORT" --root "$DST" --token-file "$W/token" --hook "analyze=$W/analyze.sh" 2> "$W/daemon.log" &
DAEMON_PID=$!
for _ in $(seq 100); do "${RUN_A[@]}" bash -c "exec 3<>/dev/tcp/$ADDR/$PORT" 2>/dev/null && break; sleep 0.1; done

# The simulation: writes each snapshot's files, then logs XFER; the source checksum is taken
# before tern can delete the snapshot.
simulate() {
  local per=$((SIZE / FILES))
  for ((i = 0; i < N; i++)); do
    local d; d=$(printf '%s/snap_%03d' "$SRC" "$i")
    mkdir -p "$d"
    for ((f = 0; f < FILES; f++)); do head -c "${per}M" /dev/urandom > "$d/particles.$f.bin"; done
    echo "$(basename "$d") $(cd "$d" && find . -type f | sort | xargs cat | sha256sum | cut -d' ' -f1)" >> "$W/source.sums"
    printf 'step %d: %d particles written\nXFER %s\n' "$i" "$((i * 1000))" "$d" >> "$LOG"
    sleep "$EVERY"
  done
  touch "$SRC/END"
}
simulate &
SIM_PID=$!
start=$(date +%s.%N)
set +e
"${RUN_A[@]}" "$TERN" watch "$SRC" "tern://$ADDR:$PORT/" --token-file "$W/token" \
  --ready "log:$LOG:^XFER (\S+)" --on-arrival analyze --in-order --delete-after-verified \
  --until END --state-dir "$W/state" --rate-window 10 "${LIMIT[@]}" --json --progress-json > "$W/watch.jsonl"
rc=$?
set -e
wait "$SIM_PID"
end=$(date +%s.%N)
echo "sc16.sh: tern watch exited $rc after $(awk "BEGIN{printf \"%.1f\", $end - $start}") s (${BED:-loopback, --bwlimit $BWLIMIT}); $N snapshots x $SIZE MiB every $EVERY s"
python3 - "$W" "$N" <<'EOF'
import json, sys
w, n = sys.argv[1], int(sys.argv[2])
prog, summary = [], None
for line in open(f"{w}/watch.jsonl"):
    v = json.loads(line)
    if "progress" in v: prog.append(v["progress"])
    elif "ok" in v: summary = v
wf = [p["watch"] for p in prog]
warn = next((x["eta_warning"] for x in wf if x.get("eta_warning")), None)
print(f"units done {summary['units']}/{n}, bytes {summary['bytes']}, resent {summary['bytes_resent']}, ok={summary['ok']}")
print(f"max backlog {max(x['backlog_units'] for x in wf)} units / {max(x['backlog_bytes'] for x in wf)/2**20:.0f} MiB; "
      f"max lag {max(x['lag_seconds'] for x in wf):.1f} s; final lag {summary['lag_seconds']:.1f} s; "
      f"peak rate {max(x['rate_bps'] for x in wf)*8/1e9:.3f} Gb/s")
print(f"ETA warning: {warn or 'none (the link kept up)'}")
src = dict(l.split() for l in open(f"{w}/source.sums"))
ana = [l.split() for l in open(f"{w}/analysis.log")]
names = [a[0] for a in ana]
assert names == sorted(src), f"analysis order/count wrong: {names}"
bad = [a[0] for a in ana if src[a[0]] != a[1]]
assert not bad, f"checksum mismatch at the destination: {bad}"
assert summary["ok"] and summary["units"] == n
print(f"PASS: {n} snapshots verified, analysed once each in order, source freed")
EOF
[[ $rc -eq 0 ]]
