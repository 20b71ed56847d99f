#!/usr/bin/env bash
# Issue 51's quality grid: hob beside llama-perplexity on llama.cpp's own GGUFs of one checkpoint.
#
#   tools/gguf_quality.sh HF_DIR TEXT WORKDIR [THREADS]
#
# llama.cpp's convert_hf_to_gguf.py makes the F16 GGUF of HF_DIR and llama-quantize its Q8_0, Q6_K and Q4_K_M;
# hob converts each with its defaults for that type (int8 experts + int8 dense for Q8_0 / Q6_K, int4 experts + int8
# dense for Q4_K_M, and int8 + int8 for it too; 32-value groups) and once keeping the values exactly (f16 experts and
# dense). Both programs score TEXT with -c 512 --chunks 20 and report KL against their own run of the F16 file.
# Prints a markdown table. WORKDIR may already hold f16.gguf, q8_0.gguf, q6_k.gguf, q4_k_m.gguf (HF_DIR is then unused).
# Needs tools/llamacpp.sh build (LLAMA_DIR, default /work/llama) and a release hob (cargo build --release).
#
# shakespeare-moe (shared/models/shakespeare-moe, trained on the device) is a Mixtral checkpoint without tokenizer
# files: copy tests/fixtures/mistral/tokenizer.json next to it, and the SentencePiece original as tokenizer.model
# (PyPI mistral-common 1.13.1, mistral_common/data/tokenizer.model.v1), so that the GGUF gets the SentencePiece
# vocabulary a real Mixtral GGUF has.
set -euo pipefail
(($# >= 3)) || { echo "usage: $0 HF_DIR TEXT WORKDIR [THREADS]" >&2; exit 2; }
hf=$1 text=$2 w=$3 threads=${4:-$(nproc)}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LLAMA_DIR=${LLAMA_DIR:-/work/llama}
bin=$LLAMA_DIR/build/bin hob=$root/target/release/hob
[[ -x $bin/llama-perplexity && -x $hob ]] || { echo "$0: build llama.cpp (tools/llamacpp.sh build) and hob first" >&2; exit 1; }
mkdir -p "$w"
[[ -f $w/f16.gguf ]] || bash "$root/tools/llamacpp.sh" convert "$hf" "$w/f16.gguf" f16 > "$w/convert.log" 2>&1
for q in q8_0 q6_k q4_k_m; do
  [[ -f $w/$q.gguf ]] || bash "$root/tools/llamacpp.sh" quantize "$w/f16.gguf" "$w/$q.gguf" $q > "$w/quantize-$q.log" 2>&1
done
a=(-f "$text" -c 512 --chunks 20 -t "$threads")
lppl() { "$bin/llama-perplexity" -m "$1" "${a[@]}" "${@:2}" 2>&1; }
hppl() { "$hob" perplexity -m "$1" "${a[@]}" --device cpu "${@:2}" 2>&1; }
lppl "$w/f16.gguf" --kl-divergence-base "$w/llama-f16.kld" > /dev/null
echo "| GGUF | program, stores | file bytes | PPL | KL vs its F16 run (mean / 99th pct) |"
echo "|---|---|---:|---:|---:|"
for q in f16 q8_0 q6_k q4_k_m; do
  p=$(lppl "$w/$q.gguf" | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
  k=-
  [[ $q == f16 ]] || k=$(lppl "$w/$q.gguf" --kl-divergence-base "$w/llama-f16.kld" --kl-divergence \
    | awk '/Mean +KLD/ {m=$3} /99.0% +KLD/ {p=$3} END {print m " / " p}')
  echo "| $q | llama.cpp | $(stat -Lc %s "$w/$q.gguf") | $p | $k |"
  case $q in
  f16) specs=("f16 f16") ;;
  q4_k_m) specs=("int4 int8" "int8 int8" "f16 f16") ;;
  *) specs=("int8 int8" "f16 f16") ;;
  esac
  for s in "${specs[@]}"; do
    read -r e d <<< "$s"
    h=$w/$q-$e-$d.hob
    [[ -f $h ]] || "$hob" convert --from "$w/$q.gguf" --experts "$e" --dense "$d" -o "$h" --no-progress > /dev/null
    if [[ $q == f16 ]]; then
      o=$(hppl "$h" --kl-divergence-base "$w/hob-f16.kld"); k=-
    else
      o=$(hppl "$h" --kl-divergence-base "$w/hob-f16.kld" --kl-divergence)
      k="$(sed -n 's/^Mean KL.*: \([0-9.e-]*\) .*/\1/p' <<< "$o") / $(sed -n 's/^99th percentile KL: \([0-9.e-]*\).*/\1/p' <<< "$o")"
    fi
    echo "| $q | hob, $e experts + $d dense | $(stat -Lc %s "$h") | $(sed -n 's/^Final estimate: PPL = \([0-9.]*\).*/\1/p' <<< "$o") | $k |"
  done
done
rm -f "$w/llama-f16.kld" "$w/hob-f16.kld"
