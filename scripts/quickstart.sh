#!/usr/bin/env bash
# From a fresh checkout to a real transfer: builds tern, makes a sample dataset (a scaled-down
# copy of the Petascale DTN reference shape: nested directories, empty files, sizes over six
# decades), starts a local `tern serve` daemon, copies the dataset through it with the live
# progress display, copies it back, and checks both copies byte for byte with SHA-256.
#   scripts/quickstart.sh [SIZE_MB]     (default 512)
#   TERN_BIN=target/dist/tern scripts/quickstart.sh   # a binary already built (CI: the shipped one)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
size_mb=${1:-512}

if [[ -n ${TERN_BIN:-} ]]; then
  tern=$(realpath "$TERN_BIN")
  echo "==> using $tern"
else
  echo "==> building tern (release)"
  cargo build --release --locked -p tern
  tern=$(realpath -m "${CARGO_TARGET_DIR:-target}")/release/tern
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tern-quickstart.XXXXXX")
daemon=
cleanup() { [[ -n $daemon ]] && kill "$daemon" 2>/dev/null; [[ -n ${KEEP:-} ]] || rm -rf "$work"; }
trap cleanup EXIT

echo "==> making a ${size_mb} MB sample dataset in $work/dataset"
python3 - "$work/dataset" "$size_mb" <<'PY'
import os, sys, random
root, total = sys.argv[1], int(sys.argv[2]) << 20
rng = random.Random(2016)
# Per-decade file counts of the Petascale DTN set (0-10 B ... 1-10 GB), scaled down.
decades = [(7, 0), (1, 10), (59, 100), (317, 1_000), (156, 10_000), (281, 100_000), (39, 1_000_000), (4, 10_000_000)]
sizes = [rng.randrange(lo, max(lo * 10, 10)) for n, lo in decades for _ in range(n)]
scale = min(1.0, total / max(1, sum(sizes)))
sizes = [int(s * scale) if s > 100_000 else s for s in sizes]
dirs = [os.path.join(root, f"run{i % 4}", f"step{i % 7:02d}", f"rank{i}") for i in range(21)]
for d in dirs:
    os.makedirs(d, exist_ok=True)
os.makedirs(os.path.join(root, "empty-dir"), exist_ok=True)
for i, s in enumerate(sizes):
    with open(os.path.join(dirs[i % len(dirs)], f"part{i:05d}.dat"), "wb") as f:
        f.write(os.urandom(s))
print(f"    {len(sizes)} files, {sum(sizes) / 1e6:.0f} MB")
PY

echo "==> starting a local daemon (tern serve) on 127.0.0.1:7700"
mkdir -p "$work/served"
"$tern" serve --listen 127.0.0.1:7700 --root "$work/served" --token-file "$work/token" 2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 50); do [[ -s $work/token ]] && break; sleep 0.1; done

echo "==> tern cp -r dataset tern://127.0.0.1:7700/copy"
"$tern" cp -r "$work/dataset" tern://127.0.0.1:7700/copy --token-file "$work/token"
echo "==> tern cp -r tern://127.0.0.1:7700/copy back (and a local copy)"
"$tern" cp -r tern://127.0.0.1:7700/copy "$work/back" --token-file "$work/token"
"$tern" cp -r "$work/dataset" "$work/local-copy"

echo "==> verifying with SHA-256 (independent of tern's BLAKE3)"
sums() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }
for copy in served/copy back local-copy; do
  if diff <(sums "$work/dataset") <(sums "$work/$copy") >/dev/null; then
    echo "    $copy: identical"
  else
    echo "    $copy: DIFFERS" >&2; exit 1
  fi
done
echo "==> done. Next: tern cp -r DIR user@host:/path (ssh), tern sync SRC DST, tern --help"
