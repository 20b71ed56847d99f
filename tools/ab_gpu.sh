#!/usr/bin/env bash
# Two builds of hob side by side on the device machine, alternated (A B B A ...) on one machine in
# one call: resident f16 and int4 decode with pp512, and the rtx4090-24g rows (d) and (e) of
# tools/hobbit_gpu.sh, on an 8-layer Mixtral-8x7B-shaped synthetic model (f16 + int4 experts).
# After tools/stage_gpu.sh, with the other build's stripped binary copied to .gpu/base-hob:
#   carry [".gpu"], command "bash tools/ab_gpu.sh .gpu/base-hob .gpu/hob [ROUNDS] [ROWS]"
# ROWS (default "f16 int4 d e") picks rows. Writes $OUT/ab.md (a row per build, row and round:
# hob bench's columns) and $OUT/ab.log (stderr of every run). Host and device speed drift within
# a call: compare a build's rows with the other build's of the same round.
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
a=${1:?usage: ab_gpu.sh BUILD_A BUILD_B [ROUNDS] [ROWS]}
b=${2:?usage: ab_gpu.sh BUILD_A BUILD_B [ROUNDS] [ROWS]}
rounds=${3:-2}
rows=${4:-f16 int4 d e}
model=/tmp/ab-mixtral-8l.hob
log="$out/ab.log"
table="$out/ab.md"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" >> "$log"; }
if [ ! -f "$model" ]; then
  "$b" convert --synthetic mixtral-8x7b --layers 8 --experts f16,int4 -o "$model" --no-progress >> "$log" 2>&1
  stamp "converted $(du -h "$model" | cut -f1)"
fi
# The rtx4090-24g expert cache scaled to 8 of Mixtral's 32 layers (as tools/hobbit_gpu.sh does).
cache=$(python3 -c "
gib=2**30; avail=24*gib-3.21e9-1e9; per=352.3e6
print(f'{min(1.0, avail/(256*per))*8*8*per/gib:.3f}')")
args_of() {
  case "$1" in
    f16) echo "--platform h200 --expert-variant f16 -p 512 -n 64 -r 3" ;;
    int4) echo "--platform h200 --expert-variant int4 -p 512 -n 64 -r 3" ;;
    d) echo "--platform rtx4090-24g --expert-variant f16 --expert-cache $cache --low int4 --cache-policy hobbit --prefetch 3 -p 512 -n 32 -r 3" ;;
    e) echo "--platform rtx4090-24g --expert-variant f16 --expert-cache $cache --low int4 --cache-policy hobbit --prefetch 3 --cpu-experts -t $(nproc) -p 512 -n 32 -r 3" ;;
  esac
}
echo "| build | round | row | model | size | params | backend | threads (builds after 2026-12-01) | profile | test | t/s | hit rate | exp/tok | MB/tok | link GB/s | limit t/s | % limit | projected t/s |" > "$table"
echo "|---|---:|---|---|---:|---:|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|" >> "$table"
for r in $(seq 1 "$rounds"); do
  # A B in odd rounds, B A in even ones.
  if [ $((r % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for row in $rows; do
    for which in $order; do
      bin=$a; [ "$which" = B ] && bin=$b
      echo "== round $r, row $row, build $which ($bin): $(args_of "$row")" >> "$log"
      # shellcheck disable=SC2046
      timeout 240 "$bin" bench -m "$model" $(args_of "$row") 2>> "$log" \
        | grep -v '^| ---\|^| model\|^|--' | sed "s#^|#| $which | $r | $row |#" >> "$table"
      stamp "round $r row $row build $which"
    done
  done
done
cat "$table"
