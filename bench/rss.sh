#!/bin/bash
# Peak memory against tree size: DIRS × 1000 empty files on tmpfs, copied locally and pushed to a
# local daemon (ARCHITECTURE.md invariant 9: memory grows with files in flight, not the tree).
#   DIRS=100 bench/rss.sh [TERN]     # 10^5 files
#   bench/rss.sh [TERN]              # 10^6 files (about 1 GB of tmpfs inodes; ~2 minutes)
set -u
T=${1:-target/release/tern}
S=/dev/shm/tern-rss
rm -rf $S; mkdir -p $S/src
DIRS=${DIRS:-1000} python3 - <<'PY'
import os
root = "/dev/shm/tern-rss/src"
for d in range(int(os.environ["DIRS"])):
    p = os.path.join(root, f"d{d:03d}")
    os.mkdir(p)
    for f in range(1000):
        os.close(os.open(os.path.join(p, f"f{f:03d}"), os.O_CREAT | os.O_WRONLY, 0o644))
PY
echo "generated: $(find $S/src -type f | wc -l) files"
export TERN_HISTORY=off
/usr/bin/time -f "local copy: %e s, max RSS %M KB" "$T" cp -r -q $S/src $S/local 2>&1 | tail -1
echo "local copy files: $(find $S/local -type f | wc -l)"
rm -rf $S/local
mkdir -p $S/root
"$T" serve --listen 127.0.0.1:7790 --root $S/root --token-file $S/token 2>$S/daemon.log &
dpid=$!
for _ in $(seq 50); do [ -s $S/token ] && break; sleep 0.1; done
/usr/bin/time -f "push client: %e s, max RSS %M KB" "$T" cp -r -q $S/src tern://127.0.0.1:7790/copy --token-file $S/token 2>&1 | tail -1
echo "daemon peak: $(grep VmHWM /proc/$dpid/status)"
echo "daemon files: $(find $S/root/copy -type f | wc -l)"
kill $dpid
rm -rf $S
