#!/usr/bin/env bash
# Several builds of hob alternated on one device machine in one call: all-resident decode (tg64, mean of 3)
# on 8-layer synthetic models, each round in the reverse order of the one before; then, if staged, the GPU
# tests against the first build.
#   after tools/stage_gpu.sh, each build's stripped binary xz-compressed as .gpu/hob-NAME.xz (six fit the
#   64 MiB carry beside three test executables), carry [".gpu"], command
#   "bash tools/ab_resident_gpu.sh [ROUNDS] [MODELS] -- NAME..."
# MODELS: comma-separated `hob convert --synthetic` presets, default qwen3-30b-a3b,mixtral-8x7b,olmoe-1b-7b,
# converted with int4 experts by the first build. Writes $OUT/resident.md (build, round, model, t/s, % limit),
# $OUT/resident.log (every run's stderr and timings) and, with tests staged, $OUT/tests-summary.txt and
# $OUT/tests.tgz. Each build compiles its kernels on first use (~45 s each on an H100 host).
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
rounds=2
models=qwen3-30b-a3b,mixtral-8x7b,olmoe-1b-7b
[ "${1:-}" != -- ] && { rounds=$1; shift; }
[ "${1:-}" != -- ] && { models=$1; shift; }
[ "${1:-}" = -- ] || { echo "usage: ab_resident_gpu.sh [ROUNDS] [MODELS] -- NAME..." >&2; exit 2; }
shift
builds=("$@")
[ ${#builds[@]} -ge 1 ] || { echo "ab_resident_gpu.sh: name at least one build (.gpu/hob-NAME.xz)" >&2; exit 2; }
log="$out/resident.log"
table="$out/resident.md"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" >> "$log"; }
mkdir -p /tmp/ab-builds
for n in "${builds[@]}"; do
  xz -dc ".gpu/hob-$n.xz" > "/tmp/ab-builds/$n" || { echo "missing .gpu/hob-$n.xz" >&2; exit 2; }
  chmod +x "/tmp/ab-builds/$n"
done
first=/tmp/ab-builds/${builds[0]}
nvidia-smi --query-gpu=name --format=csv,noheader >> "$log" 2>&1
for m in ${models//,/ }; do
  [ -f "/tmp/ab-$m.hob" ] || "$first" convert --synthetic "$m" --layers 8 --experts int4 -o "/tmp/ab-$m.hob" \
    --no-progress >> "$log" 2>&1
  stamp "converted $m"
done
echo "| build | round | model | t/s | % limit |" > "$table"
echo "|---|---:|---|---:|---:|" >> "$table"
for r in $(seq 1 "$rounds"); do
  order=("${builds[@]}")
  if [ $((r % 2)) = 0 ]; then
    order=(); for ((i = ${#builds[@]} - 1; i >= 0; i--)); do order+=("${builds[i]}"); done
  fi
  for m in ${models//,/ }; do
    for n in "${order[@]}"; do
      line=$(timeout 240 "/tmp/ab-builds/$n" bench -m "/tmp/ab-$m.hob" -r 3 -p 0 -n 64 2>> "$log" | grep tg64 | head -1)
      # hob bench's columns: t/s is the 9th field, % limit the 15th (split on '|').
      tps=$(echo "$line" | awk -F'|' '{print $9}' | awk '{print $1}')
      pct=$(echo "$line" | awk -F'|' '{print $15}' | tr -d ' ')
      echo "| $n | $r | $m | ${tps:-failed} | ${pct:-} |" >> "$table"
    done
    stamp "round $r $m"
  done
done
if [ -d .gpu/tests ] && [ -n "$(ls .gpu/tests 2>/dev/null)" ]; then
  # The CLI tests run .gpu/hob: the first build.
  cp "$first" .gpu/hob
  timeout 300 bash .gpu/run.sh tests > "$out/tests-summary.txt" 2>&1
  stamp tests
  tar czf "$out/tests.tgz" -C "$out" tests.log nvidia-smi.txt 2>/dev/null && rm -f "$out/tests.log"
fi
cat "$table"
