#!/usr/bin/env bash
# A brief libFuzzer run of every fuzz target (fuzz/README.md), seeded with its committed corpus.
# Needs `cargo +nightly`; installs cargo-fuzz if it is missing. Without nightly it skips with one
# line (the stable corpus replay in `cargo test` still runs every target's body).
#   scripts/fuzz.sh                  # every target, FUZZ_SECONDS (default 20) each
#   scripts/fuzz.sh journal wire_paths
# Fails if a target crashes, leaks, times out or runs out of memory; the input is left in
# fuzz/artifacts/NAME/ (add it to fuzz/corpus/NAME/ once fixed, as a regression).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../fuzz"

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz.sh: no nightly toolchain (rustup toolchain install nightly); skipping the fuzz run"
  exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: installing cargo-fuzz"
  timeout 900 cargo install cargo-fuzz --locked -q || {
    echo "fuzz.sh: cannot install cargo-fuzz; skipping the fuzz run"
    exit 0
  }
fi

seconds=${FUZZ_SECONDS:-20}
targets=("$@")
((${#targets[@]})) || mapfile -t targets < <(cargo +nightly fuzz list)
start=$(date +%s)
# Release with debug assertions and AddressSanitizer (cargo fuzz's defaults), against the
# committed fuzz/Cargo.lock.
timeout 900 cargo +nightly fuzz build
echo "fuzz.sh: built in $(( $(date +%s) - start )) s"
for t in "${targets[@]}"; do
  # New inputs go to a scratch corpus, so the committed seeds stay as they are.
  scratch=target/fuzz-scratch/$t
  mkdir -p "$scratch"
  echo "fuzz.sh: $t for ${seconds} s"
  log=target/fuzz-$t.log
  status=0
  timeout $((seconds + 120)) cargo +nightly fuzz run "$t" "$scratch" "corpus/$t" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 \
    >"$log" 2>&1 || status=$?
  grep -E '^(stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb)|^#[0-9]+[[:space:]]+DONE|ERROR|SUMMARY|panicked|Test unit written' "$log" || true
  if ((status != 0)); then
    tail -n 40 "$log" >&2
    echo "fuzz.sh: $t failed (exit $status); the input is in fuzz/artifacts/$t/" >&2
    exit 1
  fi
done
echo "fuzz.sh: ${#targets[@]} targets fuzzed without a crash in $(( $(date +%s) - start )) s"
