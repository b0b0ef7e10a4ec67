#!/usr/bin/env bash
# Install the peer tools the bench compares tern against (Debian 12 packages; bbcp, which
# Debian lacks, from a source copy in BBCP_SRC via bench/install-bbcp.sh, if given).
# Idempotent: apt-get only installs what is missing; services the packages would
# start at boot are stopped/disabled because bench/run.py starts its own instances
# inside the test namespaces.
set -euo pipefail

PKGS=(
  iproute2 iputils-ping procps psmisc       # ip netns, ping, ps/pkill helpers
  iperf3                                    # memory-to-memory ceiling
  openssh-server openssh-client rsync       # scp / rsync over ssh
  globus-gridftp-server-progs globus-gass-copy-progs   # globus-gridftp-server, globus-url-copy
  xrootd-server xrootd-client               # xrootd, xrdcp
  rclone                                    # rclone over sftp
  python3 python3-matplotlib                # bench/run.py plots (uses /usr/bin/python3)
)

if [[ $EUID -ne 0 ]]; then echo "install-peers.sh: run as root" >&2; exit 1; fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -q
  # policy-rc.d 101 = "do not start services from maintainer scripts"
  rc_created=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; rc_created=1
  fi
  trap '[[ $rc_created == 1 ]] && rm -f /usr/sbin/policy-rc.d' EXIT
  timeout 1200 apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "all peer packages already installed"
fi

# The system-wide daemons are not used by the bench (it runs private instances in the
# namespaces on private ports); keep them from listening on the host if systemd is present.
if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
  for s in ssh xrootd@clustered globus-gridftp-server; do
    systemctl disable --now "$s" >/dev/null 2>&1 || true
  done
fi

# bbcp is in no Debian repository: bench/install-bbcp.sh builds it from a source copy given in
# BBCP_SRC (directory, tarball or git dir). Optional: without a source this is one line, not an error.
if [[ -n ${BBCP_SRC:-} ]]; then
  "$(dirname "$0")/install-bbcp.sh" "$BBCP_SRC" || echo "bbcp: NOT installed (install-bbcp.sh failed, see above); the bench's bbcp rows will say so"
elif command -v bbcp >/dev/null; then
  echo "bbcp: already installed ($(command -v bbcp))"
else
  echo "bbcp: skipped (not in Debian; set BBCP_SRC=/path/to/bbcp-source, see bench/install-bbcp.sh)"
fi

echo "versions:"
for c in "iperf3 --version" "ssh -V" "rsync --version" "globus-url-copy -version" \
         "globus-gridftp-server -version" "xrdcp --version" "rclone version" "bbcp -#" \
         "/usr/bin/python3 -c 'import matplotlib; print(\"matplotlib\", matplotlib.__version__)'"; do
  out=$(bash -c "$c" 2>&1 | head -1) || true
  printf '  %-32s %s\n' "${c%% *}" "$out"
done
