#!/usr/bin/env bash
# Small files into a file system whose metadata operations each take a round trip (as on Lustre
# or GPFS), emulated by bench/slowmeta.py (FUSE passthrough, 1 ms per create/rename/chmod/utime).
# Copies 2,000 × 4 KiB locally into it with tern, rsync -a and cp -r, side by side, and checks
# every copy byte for byte. TERN_OLD=/path/to/tern adds an older build for comparison.
#
#   bench/smallfiles-slowfs.sh [LATENCY_MS] [FILES]      # defaults: 1 ms, 2000 files
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LAT=${1:-1}
N=${2:-2000}
TERN=${TERN_BIN:-target/release/tern}
[[ -x $TERN ]] || { echo "build first: cargo build --release -p tern" >&2; exit 1; }
python3 -c 'import fuse' 2>/dev/null || {
  apt-get install -y -q libfuse2 fuse3 >/dev/null
  pip install --quiet fusepy 2>/dev/null || pip install --quiet --break-system-packages fusepy
}
work=$(mktemp -d /dev/shm/slowfs.XXXX)
mnt=$(mktemp -d /tmp/slowfs-mnt.XXXX)
mkdir -p "$work/back" "$work/src"
python3 bench/slowmeta.py "$work/back" "$mnt" --latency-ms "$LAT" >"$work/fuse.log" 2>&1 &
fuse_pid=$!
cleanup() { fusermount -u "$mnt" 2>/dev/null || true; kill "$fuse_pid" 2>/dev/null || true; rm -rf "$work"; rmdir "$mnt" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 50); do mountpoint -q "$mnt" && break; sleep 0.1; done
mountpoint -q "$mnt" || { echo "slowmeta did not mount: $(cat "$work/fuse.log")" >&2; exit 1; }
python3 - "$work/src" "$N" <<'EOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, f"g{i % 20:02d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i}"), "wb") as f:
        f.write(os.urandom(4096))
EOF
run() {  # name, command...
  local name=$1; shift
  rm -rf "$mnt/c"
  local s e
  s=$(date +%s.%N); timeout 600 "$@" >/dev/null 2>"$work/err" || true; e=$(date +%s.%N)
  if diff -r "$work/src" "$mnt/c" >/dev/null 2>&1; then
    printf '| %s | %.2f |\n' "$name" "$(echo "$e - $s" | bc)"
  else
    printf '| %s | FAILED (%s) |\n' "$name" "$(tail -c 200 "$work/err" | tr '\n' ' ')"
  fi
}
echo "$N × 4 KiB into a file system with ${LAT} ms per metadata operation ($(nproc) cores), seconds:"
echo
echo "| tool | seconds |"
echo "|---|---|"
for rep in 1 2; do
  run "tern cp -r (run $rep)" "$TERN" cp -r "$work/src" "$mnt/c"
  [[ -n ${TERN_OLD:-} ]] && run "older tern (run $rep)" "$TERN_OLD" cp -r "$work/src" "$mnt/c"
  run "rsync -a (run $rep)" rsync -a "$work/src/" "$mnt/c/"
  run "cp -r (run $rep)" cp -r "$work/src" "$mnt/c"
done
