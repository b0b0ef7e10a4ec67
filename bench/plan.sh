#!/usr/bin/env bash
# How good are `tern plan`'s predictions? On each emulated path, tern copies a few shapes that
# fit the model, then shapes it has not seen (real trees among them); each of those was
# predicted before it ran, from the records before it (the history's `predicted`), and
# `tern plan --history` reports the errors. Writes bench/results/plan-<path>.md.
#   bench/plan.sh [PATH...]        (default: lan olcf-nersc; needs root and install-peers.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TERN_BIN=${TERN_BIN:-target/release/tern}
FIT=${FIT:-six:256M,hacc:256M,small:0.02,six:1G}
HELD_OUT=${HELD_OUT:-hacc:1G,six:512M,small:0.05,real:python,hacc:512M}
paths=("$@")
((${#paths[@]})) || paths=(lan olcf-nersc)
for path in "${paths[@]}"; do
  history=$(mktemp /tmp/tern-plan-history.XXXXXX)
  rm -f "$history"
  for set in "$FIT" "$HELD_OUT"; do
    TERN_HISTORY=$history TERN_BIN=$TERN_BIN /usr/bin/python3 bench/run.py --paths "$path" --profiles "$set" \
      --tools tern-ssh --reps 1 --no-ceiling --name "plan-$path-scratch" >/dev/null
  done
  rm -f bench/results/plan-"$path"-scratch*
  {
    echo "# tern plan on the $path path: predicted before each copy, from the copies before it"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M') UTC · 2-core VM · \`bench/plan.sh $path\` · fitted on $FIT, then $HELD_OUT (each predicted before it ran)"
    echo
    echo '```'
    TERN_HISTORY=$history "$TERN_BIN" plan --history
    echo '```'
  } > bench/results/plan-"$path".md
  cat bench/results/plan-"$path".md
  cp "$history" bench/results/plan-"$path".jsonl
  rm -f "$history"
done
