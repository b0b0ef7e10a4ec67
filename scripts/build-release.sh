#!/usr/bin/env bash
# Builds the binary that ships, with the far-side build it installs over ssh inside: stripped,
# dynamically linked against glibc 2.17 at most (so it starts on RHEL/CentOS 7 and 8 data
# transfer nodes as well as on current distributions).
# Zig (from PyPI) is the linker that targets the old glibc; nothing else is downloaded.
#   scripts/build-release.sh            # -> target/dist/tern
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
GLIBC=${TERN_GLIBC:-2.17}
venv=target/zig-venv
if [[ ! -x $venv/bin/cargo-zigbuild ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'ziglang==0.14.1' 'cargo-zigbuild==0.24.*'
fi
export PATH="$PWD/$venv/bin:$PATH"
out=target/x86_64-unknown-linux-gnu/release
mkdir -p target/dist
# First the far-side build (what tern installs on a host that lacks it: `tern _remote` only),
# gzipped as the far side unpacks it; then tern, carrying it (crates/tern/build.rs).
cargo zigbuild --locked --release -p tern --bin tern-remote --target "x86_64-unknown-linux-gnu.$GLIBC"
gzip -9n -c "$out/tern-remote" > target/dist/tern-remote.gz
TERN_FAR_SIDE_PAYLOAD=$PWD/target/dist/tern-remote.gz \
  cargo zigbuild --locked --release -p tern --bin tern --target "x86_64-unknown-linux-gnu.$GLIBC"
cp "$out/tern" target/dist/tern
newest=$(objdump -T target/dist/tern "$out/tern-remote" | grep -o 'GLIBC_[0-9.]*' | sort -V | tail -1)
# The promise is the old glibc: a symbol from a newer one would stop it starting on old DTNs.
if [[ $(printf '%s\n' "$newest" "GLIBC_$GLIBC" | sort -V | tail -1) != "GLIBC_$GLIBC" ]]; then
  echo "build-release: target/dist/tern needs $newest, newer than glibc $GLIBC" >&2
  exit 1
fi
target/dist/tern --version >/dev/null
"$out/tern-remote" --version >/dev/null
echo "target/dist/tern: $(stat -c %s target/dist/tern) bytes, needs $newest at most;" \
  "the far-side build it installs on hosts that lack tern: $(stat -c %s "$out/tern-remote") bytes, shipped as $(stat -c %s target/dist/tern-remote.gz) bytes of gzip"
