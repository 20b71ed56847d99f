#!/usr/bin/env bash
# `hob serve` against the real openai Python client: a venv under target/ with the pinned client,
# the tiny Qwen3-MoE fixture converted with the given hob binary, then test_openai.py.
#   tests/openai/run.sh [HOB_BINARY]     (default: target/debug/hob, which `cargo test` builds)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
hob="$(realpath "${1:-$root/target/debug/hob}")"
venv="$root/target/openai-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import openai' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r "$root/tests/openai/requirements.txt"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$hob" convert --from "$root/tests/fixtures/tiny-qwen3-moe" -o "$tmp/tiny.hob" --experts f16 --no-progress
"$venv/bin/python" "$root/tests/openai/test_openai.py" "$hob" "$tmp/tiny.hob"
