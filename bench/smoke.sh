#!/usr/bin/env bash
# CI smoke test of the bench bed and of tern (< 3 minutes):
#   path alcf-ncsa (6 ms RTT, 1 Gb/s), profiles `edge` (empty files/dirs, symlinks, odd names,
#   chunk-boundary sizes) and `hacc:16M` (the reference shape, scaled), tools tern (ssh and
#   daemon) and rsync, one run each, every copy verified with SHA-256 by bench/verify.py.
# Exits non-zero if anything failed or tern is not built. The namespaces are removed on any exit.
#   SMOKE_INSTALL=1 bench/smoke.sh   also installs the minimal Debian packages first
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
[[ $EUID -eq 0 ]] || { echo "smoke.sh: needs root (network namespaces)" >&2; exit 1; }

cleanup() { "$HERE/netns.sh" down >/dev/null 2>&1 || true; rm -rf /dev/shm/tern-bench; }
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ ${SMOKE_INSTALL:-0} == 1 ]]; then
  # Only what is missing: an apt-get update alone costs CI half a minute.
  need=()
  for pair in ip:iproute2 ping:iputils-ping /usr/sbin/sshd:openssh-server ssh:openssh-client rsync:rsync \
    /usr/bin/python3:python3 setpriv:util-linux; do
    command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
  done
  if ((${#need[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    timeout 300 apt-get update -q && timeout 600 apt-get install -y -q --no-install-recommends "${need[@]}"
  fi
fi
for c in ssh sshd rsync ip ping cargo /usr/bin/python3; do
  command -v "$c" >/dev/null || { echo "smoke.sh: missing $c (run bench/install-peers.sh or SMOKE_INSTALL=1)" >&2; exit 1; }
done

# Every core: in CI this is a cold release build, and nothing else runs beside it.
(cd "$HERE/delayline" && timeout 600 cargo build --release -q)
# TERN_BIN: a binary already built (CI passes the shipped one, target/dist/tern); run.py uses it.
if [[ -z ${TERN_BIN:-} ]]; then
  (cd "$REPO" && timeout 1200 cargo build --release --locked -p tern -q) || { echo "smoke.sh: tern does not build" >&2; exit 1; }
fi

timeout 170 /usr/bin/python3 "$HERE/run.py" --name smoke --paths alcf-ncsa --profiles edge,hacc:16M \
  --tools rsync,tern-ssh,tern-daemon --reps 1 --timeout 45 --no-ceiling --require-tern
echo "smoke.sh: PASS (report: bench/results/smoke.md)"
