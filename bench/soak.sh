#!/usr/bin/env bash
# Soak: the same copy through a loopback daemon, again and again, for SECONDS (default 420);
# every run must end ok with 0 reconnects and 0 bytes resent (an unexplained data-stream close
# would show up as a reconnect). Data on tmpfs.
#
#   bench/soak.sh [SECONDS] [SIZE_MIB]        # defaults: 420 s, 512 MiB
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECS=${1:-420}
MIB=${2:-512}
TERN=$(realpath "${TERN_BIN:-target/release/tern}")
[[ -x $TERN ]] || { echo "build first: cargo build --release -p tern" >&2; exit 1; }
work=$(mktemp -d /dev/shm/soak.XXXX)
mkdir -p "$work/root"
head -c "${MIB}M" /dev/urandom >"$work/big.bin"
"$TERN" serve --listen 127.0.0.1:0 --root "$work/root" --token-file "$work/tok" 2>"$work/serve.log" &
serve=$!
trap 'kill $serve 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 50); do grep -q "listening on" "$work/serve.log" && break; sleep 0.1; done
port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$work/serve.log" | head -1)
runs=0; clean=0
end=$((SECONDS + SECS))
while ((SECONDS < end)); do
  runs=$((runs + 1))
  rm -f "$work/root/big.bin"
  out=$("$TERN" cp "$work/big.bin" "tern://127.0.0.1:$port/big.bin" --token-file "$work/tok" --json 2>"$work/err" || true)
  verdict=$(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(j["ok"] and j["reconnects"] == 0 and j["bytes_resent"] == 0)' "$out" 2>/dev/null || echo False)
  if [[ $verdict == True ]]; then clean=$((clean + 1)); else echo "run $runs: ${out:0:300} $(tail -c 300 "$work/err")"; fi
done
echo "soak: $runs runs of $MIB MiB through a loopback daemon in $SECS s: $clean clean, $((runs - clean)) with errors, reconnects or resent bytes"
((clean == runs))
