#!/usr/bin/env bash
# Build bbcp (SLAC's parallel-stream copy tool) from source and install it as
# /usr/local/bin/bbcp, for bench/run.py's `bbcp` tool. bbcp is in no Debian repository, and its
# source is not in this repository (LGPL-3 source files, GPL-3 in the mirror's LICENSE; ~1 MB), so it is
# built from a copy you provide:
#
#   bench/install-bbcp.sh SRC          # SRC: a source tree (the directory holding src/Makefile),
#                                      # a tarball (.tar, .tgz, .tar.gz, .tar.xz), or a git dir
#   BBCP_SRC=SRC bench/install-bbcp.sh # same
#
# Where to get SRC (any of these; the bench was measured with the first):
#   git clone https://github.com/eeertekin/bbcp          # mirror of SLAC bbcp 14.04.14.00.1
#   https://www.slac.stanford.edu/~abh/bbcp/bbcp.tgz      # upstream tarball
#   git clone https://www.slac.stanford.edu/~abh/bbcp/bbcp.git
#
# Idempotent: does nothing when /usr/local/bin/bbcp already runs (unless --force). Installs the
# build dependencies (g++, make, zlib1g-dev, libssl-dev) with apt-get only if they are missing.
# The namespaces tern-a / tern-b share the file system, so one install serves both ends.
set -euo pipefail

DEST=/usr/local/bin/bbcp
force=0
src="${BBCP_SRC:-}"
for a in "$@"; do
  case "$a" in
    --force) force=1 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) src="$a" ;;
  esac
done

if [[ $EUID -ne 0 ]]; then echo "install-bbcp.sh: run as root" >&2; exit 1; fi

if [[ $force == 0 && -x $DEST ]] && v=$("$DEST" -# 2>&1 | head -1) && [[ -n $v ]]; then
  echo "bbcp already installed: $DEST ($v)"
  exit 0
fi

if [[ -z $src || ! -e $src ]]; then
  cat >&2 <<EOF
install-bbcp.sh: no bbcp source${src:+ at '$src'}.
  bbcp is not packaged in Debian and its source is not in this repository. Get a copy on a
  machine with internet access and pass its path (directory, tarball or git dir):
    git clone https://github.com/eeertekin/bbcp /path/to/bbcp
    bench/install-bbcp.sh /path/to/bbcp        # or: BBCP_SRC=/path/to/bbcp bench/install-peers.sh
  (upstream: https://www.slac.stanford.edu/~abh/bbcp/). Without it bench/run.py's bbcp rows
  say NOT INSTALLED (not a failure); every other tool works.
EOF
  exit 2
fi

# Build dependencies (only what is missing).
deps=(g++ make zlib1g-dev libssl-dev)
missing=()
for p in "${deps[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing build deps: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -q
  timeout 1200 apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Build in a scratch copy: the source (maybe read-only, maybe a tarball) is never written to.
work=$(mktemp -d /tmp/bbcp-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
src=$(readlink -f "$src")
if [[ -d $src && -e $src/HEAD && -d $src/objects ]]; then            # bare git dir
  git --git-dir="$src" archive HEAD | tar -x -C "$work"
elif [[ -d $src/.git ]]; then                                         # git clone: tracked files only
  git -C "$src" archive HEAD | tar -x -C "$work"
elif [[ -d $src ]]; then
  cp -a "$src/." "$work/"
else
  tar -xf "$src" -C "$work"
fi
mk=$(find "$work" -maxdepth 3 -path '*/src/Makefile' | head -1)
if [[ -z $mk ]]; then echo "install-bbcp.sh: no src/Makefile in $src (is it bbcp's source?)" >&2; exit 1; fi
top=$(dirname "$(dirname "$mk")")
chmod +x "$top/MakeSname" 2>/dev/null || true

echo "building bbcp in $top (log: $work/make.log)"
if ! (cd "$top/src" && nice make -j"$(nproc)" >"$work/make.log" 2>&1); then
  tail -30 "$work/make.log" >&2
  echo "install-bbcp.sh: make failed" >&2
  exit 1
fi
bin=$(find "$top/bin" -type f -name bbcp -perm -u+x | head -1)
if [[ -z $bin ]]; then echo "install-bbcp.sh: make succeeded but no bin/*/bbcp" >&2; exit 1; fi
install -m 0755 "$bin" "$DEST"
echo "installed $DEST: $("$DEST" -# 2>&1 | head -1)"
