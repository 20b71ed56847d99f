#!/usr/bin/env bash
# The GPU bench grid of issue 4, run on the device machine after tools/stage_gpu.sh:
#   carry [".gpu"], command "bash tools/bench_gpu.sh"      (tables in $OUT/bench.md)
#
# A Mixtral-8x7B-shaped synthetic model (random weights, real shapes) with LAYERS of the 32 layers
# (the device's 64 GiB disk holds ~8 with f16 + int4 experts), then `hob bench` all resident
# (the RESIDENT profile, default h200: the device machine's) and as an RTX 4090 (rtx4090-24g:
# loads paced to 25 GB/s). The 4090's expert cache is scaled to the file: the share of Mixtral's experts a 24 GiB card holds beside the
# 3.21 GB of non-expert weights and ~1 GB of KV cache and buffers, times the experts in the file.
set -uo pipefail
LAYERS="${LAYERS:-8}"
RESIDENT="${RESIDENT:-h200}"
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
model=/tmp/mixtral-synthetic-${LAYERS}l.hob
log="$out/bench.log"
{
  echo "# hob bench on $(nvidia-smi --query-gpu=name --format=csv,noheader), $(date -u +%F)"
  if [ ! -f "$model" ]; then
    /usr/bin/time -v "$hob" convert --synthetic mixtral-8x7b --layers "$LAYERS" --experts f16,int4 -o "$model" --no-progress 2>&1 \
      | grep -E "Elapsed|Maximum resident|wrote|GB" || true
  fi
  ls -l "$model"
} >> "$log" 2>&1
# Expert-cache share of a 24 GiB card holding full Mixtral: (24 GiB - 3.21 GB - 1 GB) / (256 experts).
share() { python3 -c "
gib=2**30; avail=24*gib-3.21e9-1e9; per=$1; total=256*per
frac=min(1.0, avail/total); print(f'{frac*$LAYERS*8*per/gib:.3f}')"; }
f16_cache=$(share 352.3e6); int4_cache=$(share 99.1e6)
echo "rtx4090-24g expert cache scaled to $LAYERS layers: f16 $f16_cache GiB, int4 $int4_cache GiB" >> "$log"
run() { echo "== $*" >> "$log"; "$hob" bench -m "$model" -r 3 "$@" 2>>"$log" | tee -a "$out/bench.md"; }
run --platform "$RESIDENT" --expert-variant f16 -p 512 -n 64
run --platform "$RESIDENT" --expert-variant int4/g64 -p 512 -n 64
run --platform rtx4090-24g --expert-variant f16 --expert-cache "$f16_cache" -p 512 -n 32
run --platform rtx4090-24g --expert-variant int4/g64 --expert-cache "$int4_cache" -p 512 -n 64
cat "$log"
