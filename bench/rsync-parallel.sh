#!/usr/bin/env bash
# N rsyncs at once, as people run them to beat rsync's one stream: the files are split into N
# lists of about equal bytes (largest first, each to the lightest list) and each list goes with
# its own `rsync -a --files-from`. Directories (empty ones too) come along with list 0.
#   bench/rsync-parallel.sh N SSH_CMD SRC_DIR [user@]host:DST_DIR
set -euo pipefail
n=$1 ssh=$2 src=$3 dst=$4
lists=$(mktemp -d)
trap 'rm -rf "$lists"' EXIT
cd "$src"
find . -type f -printf '%s %P\n' | sort -rn | awk -v n="$n" -v d="$lists" '
  { s = $1; sub(/^[0-9]+ /, ""); best = 0
    for (i = 1; i < n; i++) if (load[i] < load[best]) best = i
    load[best] += s; print > (d "/" best) }'
find . -mindepth 1 \( -type d -o -type l \) -printf '%P\n' >> "$lists/0"
pids=()
for ((i = 0; i < n; i++)); do
  [[ -s $lists/$i ]] || continue
  rsync -a --files-from="$lists/$i" -e "$ssh" ./ "$dst/" & pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
