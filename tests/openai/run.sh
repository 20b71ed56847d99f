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
# The same weights with Qwen3's real chat template (tools) and room for its longer prompts.
cp -r "$root/tests/fixtures/tiny-qwen3-moe" "$tmp/tools-src"
python3 - "$tmp/tools-src" "$root/tests/fixtures/serve/qwen3-tools.json" <<'PY'
import json, sys
d, fixture = sys.argv[1], json.load(open(sys.argv[2]))
cfg = json.load(open(f"{d}/tokenizer_config.json")); cfg["chat_template"] = fixture["template"]
json.dump(cfg, open(f"{d}/tokenizer_config.json", "w"))
c = json.load(open(f"{d}/config.json")); c["max_position_embeddings"] = 2048
json.dump(c, open(f"{d}/config.json", "w"))
PY
"$hob" convert --from "$tmp/tools-src" -o "$tmp/tools.hob" --experts f16 --no-progress > /dev/null
"$venv/bin/python" "$root/tests/openai/test_openai.py" "$hob" "$tmp/tiny.hob" "$tmp/tools.hob" \
  "$root/tests/fixtures/serve/qwen3-tools.json"
