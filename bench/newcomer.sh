#!/usr/bin/env bash
# A newcomer's first hour, as a script CI runs: a fresh clone, the README's first command, then
# first transfers over ssh to a host that has never seen tern (it installs itself there) and
# through a daemon, each checked with SHA-256. Needs root (it starts a throwaway sshd on a
# loopback port, like the tests do).
#   bench/newcomer.sh            # CARGO_TARGET_DIR is shared with this checkout to save a build
#   NEWCOMER_IN_PLACE=1 TERN_BIN=target/dist/tern bench/newcomer.sh
#                                # CI: its checkout is a fresh clone already, and the shipped
#                                # binary is built: no second clone, no second release build
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/tern-newcomer.XXXXXX")
sshd_pid=
cleanup() { [[ -n $sshd_pid ]] && kill "$sshd_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$here/target}

if [[ -n ${NEWCOMER_IN_PLACE:-} ]]; then
  cd "$here"
else
  echo "newcomer: git clone"
  git clone -q "$here" "$work/tern"
  cd "$work/tern"
fi
[[ -z ${TERN_BIN:-} ]] || export TERN_BIN=$(realpath "$TERN_BIN")

echo "newcomer: README command 1: scripts/quickstart.sh 64"
timeout 1800 scripts/quickstart.sh 64 | sed 's/^/    /'
tern=${TERN_BIN:-$CARGO_TARGET_DIR/release/tern}

echo "newcomer: a host that never saw tern, over ssh"
command -v sshd >/dev/null || [[ -x /usr/sbin/sshd ]] || { echo "newcomer: no sshd (apt-get install openssh-server)" >&2; exit 1; }
s=$work/sshd
mkdir -p "$s" /run/sshd
ssh-keygen -q -t ed25519 -N '' -f "$s/hostkey"
ssh-keygen -q -t ed25519 -N '' -f "$s/userkey"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The remote login's PATH has no tern and its cache is empty: exactly a first use.
cat > "$s/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey $s/hostkey
AuthorizedKeysFile $s/userkey.pub
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile $s/sshd.pid
SetEnv PATH=/usr/bin:/bin XDG_CACHE_HOME=$s/remote-cache
EOF
/usr/sbin/sshd -D -e -f "$s/sshd_config" 2>"$s/sshd.log" &
sshd_pid=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
export TERN_SSH="ssh -p $port -i $s/userkey -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
data=$work/data
python3 - "$data" <<'PY'
import os, sys, random
rng = random.Random(7)
for i in range(200):
    d = os.path.join(sys.argv[1], f"d{i % 9}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i}.bin"), "wb") as f:
        f.write(os.urandom(rng.choice([0, 10, 4096, 100_000, 3_000_000])))
PY
sums() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }
check() { diff <(sums "$1") <(sums "$2") >/dev/null || { echo "newcomer: $2 differs from $1" >&2; exit 1; }; echo "    $2: identical"; }

t0=$(date +%s.%N)
"$tern" cp -r "$data" "127.0.0.1:$work/first" 2>"$work/first.err"
t1=$(date +%s.%N)
grep -q "installed tern" "$work/first.err" || { echo "newcomer: the first copy did not say it installed tern:" >&2; cat "$work/first.err" >&2; exit 1; }
sed 's/^/    /' "$work/first.err"
check "$data" "$work/first"
"$tern" cp -r "$data" "127.0.0.1:$work/second" 2>"$work/second.err"
t2=$(date +%s.%N)
if grep -q "installed tern" "$work/second.err"; then echo "newcomer: the second copy installed again" >&2; exit 1; fi
check "$data" "$work/second"
"$tern" cp -r "127.0.0.1:$work/second" "$work/pulled"
check "$data" "$work/pulled"
python3 -c "import sys; a, b, c = map(float, sys.argv[1:]); print(f'    first copy (install included) {b - a:.2f} s, second {c - b:.2f} s')" "$t0" "$t1" "$t2"
echo "newcomer: all first transfers verified"
