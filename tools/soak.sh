#!/usr/bin/env bash
# The server soak of issue 55: `hob serve` on the tiny Qwen3-MoE fixture under a random request mix
# (tools/serve_load.py: streamed and whole chats, completions, dropped streams, malformed bodies,
# over-long prompts) for SECONDS, with RSS and open files sampled through the run.
#
#   tools/soak.sh [SECONDS=3600] [CLIENTS=4] [OUT.md]
#
# Builds hob in release, converts the fixture into a temporary directory, and exits with
# serve_load.py's status (1 on any unexpected outcome, a dead server or an unclean exit). The KV-cache
# drift soak is a test: `cargo test --release --test soak`.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TOTAL=${1:-3600}
CLIENTS=${2:-4}
OUT=${3:-}
cargo build --release --quiet
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
target/release/hob convert --from tests/fixtures/tiny-qwen3-moe -o "$work/qwen3.hob" --experts f16 --no-progress >/dev/null
python3 tools/serve_load.py target/release/hob "$work/qwen3.hob" "$CLIENTS" "$SECONDS_TOTAL" $OUT
