#!/usr/bin/env bash
# Coverage-guided fuzzing of hob's readers (issue 55): each target of tests/fuzz for SECONDS, seeded
# from tests/fuzz/seeds/TARGET (committed; tools/fuzz_seeds.py makes them), growing a corpus in
# tests/fuzz/corpus/TARGET (git-ignored, kept between runs on one machine).
#
#   tools/fuzz.sh [SECONDS=600] [TARGET...]      # .ci/run's smoke: tools/fuzz.sh 15
#
# Prints one line per target (executions, seconds, edges covered, corpus size) and a total; exits 1
# on the first crash, leak, timeout or out-of-memory input, which libFuzzer leaves in
# tests/fuzz/artifacts/TARGET/ (replay it: cargo fuzz run -s none --fuzz-dir tests/fuzz TARGET FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-600}
shift || true
ALL=(hob_reader gguf_reader safetensors_header tokenizer_template serve_request trace_reader)
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL[@]}")

CARGO_FUZZ_VERSION=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
  echo "fuzz: installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install --quiet --locked cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi
# cargo fuzz passes -Z flags to rustc, and the machine's one toolchain is stable: RUSTC_BOOTSTRAP lets
# them through. `-s none`: libFuzzer's coverage without a sanitizer (AddressSanitizer needs nightly's
# std); Rust's own bounds and overflow checks (`-a`: debug assertions) find what hob must not do.
fuzz() { RUSTC_BOOTSTRAP=1 cargo fuzz "$1" -s none -a --fuzz-dir tests/fuzz "${@:2}"; }
fuzz build

total=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
printf '%-20s %12s %8s %8s %10s\n' target executions seconds edges corpus
for t in "${TARGETS[@]}"; do
  mkdir -p "tests/fuzz/corpus/$t"
  rc=0
  fuzz run "$t" "tests/fuzz/corpus/$t" "tests/fuzz/seeds/$t" -- \
    -max_total_time="$SECS" -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 >"$log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    echo "fuzz: $t failed (exit $rc); the input is in tests/fuzz/artifacts/$t/:"
    grep -E -A12 "panicked|ERROR|SUMMARY|deadly signal|Test unit written" "$log" | head -40
    exit 1
  fi
  runs=$(awk '/^stat::number_of_executed_units:/ { print $2 }' "$log")
  time=$(awk '/^Done [0-9]+ runs in/ { print $5 }' "$log")
  edges=$(grep -E '^#[0-9]+' "$log" | tail -1 | sed -E 's/.* cov: ([0-9]+).*/\1/')
  corpus=$(find "tests/fuzz/corpus/$t" -type f | wc -l)
  printf '%-20s %12s %8s %8s %10s\n' "$t" "$runs" "$time" "$edges" "$corpus"
  total=$((total + runs))
done
printf '%-20s %12s\n' total "$total"
