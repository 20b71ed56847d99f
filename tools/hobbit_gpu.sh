#!/usr/bin/env bash
# Issue 5's device grid: the HOBBIT engine's ablation (a)-(e) on a Mixtral-8x7B-shaped synthetic
# model, under rtx4090-24g (f16 high, int4 low) and jetson-orin-32g (int8 high, int2 low, SSD tier,
# mapped host slots). Run on the device machine after tools/stage_gpu.sh:
#   bash tools/hobbit_gpu.sh prepare     convert the synthetic model (and build llama.cpp if staged)
#   bash tools/hobbit_gpu.sh rtx4090     rows (a)-(e) under rtx4090-24g   -> $OUT/hobbit-rtx4090.md
#   bash tools/hobbit_gpu.sh jetson      rows (a)-(e) under jetson-orin-32g -> $OUT/hobbit-jetson.md
#   bash tools/hobbit_gpu.sh trace       train shakespeare-moe (staged in .gpu/shakes by stage_gpu.sh, ~100 s),
#                                        convert it, fit T1/T2 to HOBBIT's 67/30/3 split on Hamlet and
#                                        record its Hamlet trace -> /tmp/shakes-trace.jsonl and
#                                        $OUT/trace.env (TRACE, T1, T2: `. $OUT/trace.env` before the
#                                        replay modes), logs in $OUT/hobbit.log
#   TRACE=t.jsonl T1=.. T2=.. bash tools/hobbit_gpu.sh replay
#                                        rows (a)-(e) under rtx4090-24g with every layer's routing
#                                        replayed from a trained router's trace (--replay-trace; the
#                                        prefetch rows use the trace's recorded stacked-gate
#                                        predictions) at T1/T2 (calibrated for the traced model) and at 0.6/0.9
#                                        -> $OUT/hobbit-replay.md (cooperative rows with and
#                                        without --no-load-behind)
#   TRACE=t.jsonl T1=.. T2=.. [ROUNDS=8] bash tools/hobbit_gpu.sh versus
#                                        row (e) under rtx4090-24g (f16 + int4, CPU experts, replayed
#                                        routing, tg64 -r 5) and llama.cpp f16 --n-cpu-moe 6, alternated
#                                        ROUNDS times on one machine (host speed drifts: only alternated
#                                        rows compare) -> $OUT/versus.md with the ratio per round
#                                        (needs llama.cpp built or restored, and the f16 GGUF)
#   TRACE=t.jsonl T1=.. T2=.. VARIANTS=int8,int2 bash tools/hobbit_gpu.sh replay-jetson
#                                        rows (a)-(d) under jetson-orin-32g, replayed routing
#                                        -> $OUT/hobbit-replay-jetson.md
# LAYERS (default 8) of the 32 layers: the device's disk holds ~8 with all four variants.
# The expert cache is scaled to the file: the share of Mixtral's experts the profile's budget holds
# beside 3.21 GB of non-expert weights and ~1 GB of KV cache and buffers, times the file's experts.
# Rows: (a) high only, LRU, on demand; (b) + dynamic precision (--low, T1/T2 0.6/0.9);
# (c) + stacked-gate prefetch (3 layers, into the idle link only); (d) + the HOBBIT cache policy;
# (e) + cooperative CPU experts; then (d) and (e) without prefetch, and (e) with f16 experts only.
# ROWS="a d" runs only those rows (spaces in a label as underscores). VARIANTS (default
# f16,int8,int4,int2) picks the stored variants: f16,int4 is enough for the rtx4090 rows and
# leaves room on the disk for llama.cpp's GGUF beside it.
# Rows marked "staging" copy missed experts through pinned staging (--no-pin) instead of DMA from
# the page-locked file: the A/B of the loader's two paths.
set -uo pipefail
LAYERS="${LAYERS:-8}"
VARIANTS="${VARIANTS:-f16,int8,int4,int2}"
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
model=/tmp/mixtral-synthetic-${LAYERS}l-${VARIANTS//,/-}.hob
log="$out/hobbit.log"
# Cache share of a budget holding full Mixtral at `per` bytes per expert, scaled to the file (GiB).
share() { python3 -c "
gib=2**30; avail=$1*gib-3.21e9-1e9; per=$2; total=256*per
frac=min(1.0, avail/total); print(f'{frac*$LAYERS*8*per/gib:.3f}')"; }
row() { # label, profile, args...
  local label="$1"; shift
  [ -n "${ROWS:-}" ] && [[ " $ROWS " != *" ${label// /_} "* ]] && return 0
  echo "== $label: $*" >> "$log"
  "$hob" bench -m "$model" --stats "$@" 2>>"$log" | grep -v '^| ---\|^| model' | sed "s#^|#| $label |#" >> "$out/$table"
}
header() {
  echo "| row | model | size | params | backend | threads | profile | test | t/s | hit rate | exp/tok | MB/tok | link GB/s | limit t/s | % limit | projected t/s (the profile's memory) |" > "$out/$table"
  echo "|---|---|---:|---:|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|" >> "$out/$table"
}
case "${1:-}" in
prepare)
  {
    echo "# $(nvidia-smi --query-gpu=name --format=csv,noheader), $(date -u +%F), $(nproc) CPU threads"
    [ -f "$model" ] || /usr/bin/time -v "$hob" convert --synthetic mixtral-8x7b --layers "$LAYERS" \
        --experts "$VARIANTS" -o "$model" --no-progress 2>&1 | grep -E "Elapsed|wrote|GB" || true
    ls -l "$model"; df -h /tmp | tail -1
  } >> "$log" 2>&1
  if [ -f .gpu/llama-src.tar.xz ] && [ ! -x /tmp/llama/build/bin/llama-bench ]; then
    bash tools/llamacpp_gpu.sh build >> "$log" 2>&1 || echo "llama.cpp build failed" >> "$log"
  fi
  tail -5 "$log" ;;
rtx4090)
  table=hobbit-rtx4090.md; header
  c=$(share 24 352.3e6)
  echo "rtx4090-24g expert cache scaled to $LAYERS layers: $c GiB" >> "$log"
  p=(--platform rtx4090-24g --expert-variant f16 --expert-cache "$c" -r 3)
  row a "${p[@]}" --low none --cache-policy lru --prefetch 0 -p 512 -n 32
  row b "${p[@]}" --low int4 --cache-policy lru --prefetch 0 -p 0 -n 32
  row c "${p[@]}" --low int4 --cache-policy lru --prefetch 3 -p 0 -n 32
  row d "${p[@]}" --low int4 --cache-policy hobbit --prefetch 3 -p 512 -n 32
  row e "${p[@]}" --low int4 --cache-policy hobbit --prefetch 3 --cpu-experts -t "$(nproc)" -p 512 -n 32
  row "d, no prefetch" "${p[@]}" --low int4 --cache-policy hobbit --prefetch 0 -p 0 -n 32
  row "e, no prefetch" "${p[@]}" --low int4 --cache-policy hobbit --prefetch 0 --cpu-experts -t "$(nproc)" -p 0 -n 32
  row "e, f16 only" "${p[@]}" --low none --cache-policy hobbit --prefetch 3 --cpu-experts -t "$(nproc)" -p 0 -n 32
  row "a, staging" "${p[@]}" --no-pin --low none --cache-policy lru --prefetch 0 -p 0 -n 32
  row "e, staging" "${p[@]}" --no-pin --low int4 --cache-policy hobbit --prefetch 3 --cpu-experts -t "$(nproc)" -p 0 -n 32
  cat "$out/$table" ;;
jetson)
  # --no-ssd: missed experts come from the page cache paced to the profile's 3 GB/s SSD (this
  # machine's own disk reads 1.4-1.8 GB/s); the "SSD" rows read the real disk with O_DIRECT.
  # No cooperative row: a Jetson's CPU would read the same SSD (refused with unified profiles).
  table=hobbit-jetson.md; header
  c=$(share 24 185.6e6)
  echo "jetson-orin-32g expert cache scaled to $LAYERS layers: $c GiB (int8 sizing)" >> "$log"
  p=(--platform jetson-orin-32g --expert-variant int8 --expert-cache "$c" -r 2 -p 0)
  row a "${p[@]}" --no-ssd -n 24 --low none --cache-policy lru --prefetch 0
  row b "${p[@]}" --no-ssd -n 24 --low int2 --cache-policy lru --prefetch 0
  row c "${p[@]}" --no-ssd -n 24 --low int2 --cache-policy lru --prefetch 3
  row d "${p[@]}" --no-ssd -n 24 --low int2 --cache-policy hobbit --prefetch 3
  row "d, no prefetch" "${p[@]}" --no-ssd -n 24 --low int2 --cache-policy hobbit --prefetch 0
  row "a, SSD" "${p[@]}" --ssd -n 8 --low none --cache-policy lru --prefetch 0
  row "d, SSD" "${p[@]}" --ssd -n 8 --low int2 --cache-policy hobbit --prefetch 3
  cat "$out/$table" ;;
replay)
  table=hobbit-replay.md; header
  c=$(share 24 352.3e6)
  echo "rtx4090-24g expert cache scaled to $LAYERS layers: $c GiB; routing replayed from $TRACE" >> "$log"
  p=(--platform rtx4090-24g --expert-variant f16 --expert-cache "$c" -r 3 -p 0 -n 32)
  r=(--replay-trace "$TRACE" --prefetch 0); cal=(--low int4 --t1 "$T1" --t2 "$T2"); paper=(--low int4 --t1 0.6 --t2 0.9)
  rp=(--replay-trace "$TRACE" --prefetch 3)
  cpu=(--cpu-experts -t "$(nproc)")
  row "a, random routing" "${p[@]}" --prefetch 0 --low none --cache-policy lru
  row "d, random routing" "${p[@]}" --prefetch 0 "${paper[@]}" --cache-policy hobbit
  row "e, random routing" "${p[@]}" --prefetch 0 "${paper[@]}" --cache-policy hobbit "${cpu[@]}"
  row "e, random routing, no load-behind" "${p[@]}" --prefetch 0 "${paper[@]}" --cache-policy hobbit "${cpu[@]}" --no-load-behind
  row a "${p[@]}" "${r[@]}" --low none --cache-policy lru
  row b "${p[@]}" "${r[@]}" "${cal[@]}" --cache-policy lru
  row c "${p[@]}" "${rp[@]}" "${cal[@]}" --cache-policy lru
  row "d, prefetch 3" "${p[@]}" "${rp[@]}" "${cal[@]}" --cache-policy hobbit
  row d "${p[@]}" "${r[@]}" "${cal[@]}" --cache-policy hobbit
  row e "${p[@]}" "${r[@]}" "${cal[@]}" --cache-policy hobbit "${cpu[@]}"
  row "e, no load-behind" "${p[@]}" "${r[@]}" "${cal[@]}" --cache-policy hobbit "${cpu[@]}" --no-load-behind
  row "e, f16 only" "${p[@]}" "${r[@]}" --low none --cache-policy hobbit "${cpu[@]}"
  row "e, f16 only, no load-behind" "${p[@]}" "${r[@]}" --low none --cache-policy hobbit "${cpu[@]}" --no-load-behind
  row "b, 0.6/0.9" "${p[@]}" "${r[@]}" "${paper[@]}" --cache-policy lru
  row "d, 0.6/0.9" "${p[@]}" "${r[@]}" "${paper[@]}" --cache-policy hobbit
  row "e, 0.6/0.9" "${p[@]}" "${r[@]}" "${paper[@]}" --cache-policy hobbit "${cpu[@]}"
  cat "$out/$table" ;;
versus)
  g=/tmp/mixtral-synthetic-${LAYERS}l-f16.gguf
  [ -f "$g" ] || PYTHONPATH=/tmp/llama/llama.cpp/gguf-py python3 tools/make_synthetic_gguf.py "$g" --layers "$LAYERS" > /dev/null
  c=$(share 24 352.3e6); cpu=$((LAYERS * 3 / 4))
  p=(--platform rtx4090-24g --expert-variant f16 --expert-cache "$c" -r 5 -p 0 -n 64 --prefetch 0
     --replay-trace "$TRACE" --low int4 --t1 "$T1" --t2 "$T2" --cache-policy hobbit --cpu-experts -t "$(nproc)")
  echo "| round | hob (e) t/s | llama.cpp f16 --n-cpu-moe $cpu t/s | ratio |" > "$out/versus.md"
  echo "|---|---:|---:|---:|" >> "$out/versus.md"
  for i in $(seq 1 "${ROUNDS:-8}"); do
    echo "== versus round $i: $*" >> "$log"
    # Both print llama-bench's JSON rows: the decode row's (no prompt) avg_ts.
    tg='import json, sys; print(next(r["avg_ts"] for r in json.load(sys.stdin) if r["n_gen"] > 0 and r["n_prompt"] == 0))'
    h=$(timeout 120 "$hob" bench -m "$model" --stats "${p[@]}" -o json 2>>"$log" | python3 -c "$tg" 2>>"$log")
    l=$(timeout 120 /tmp/llama/build/bin/llama-bench -m "$g" -ngl 99 --n-cpu-moe "$cpu" -t "$(nproc)" -p 0 -n 64 -r 5 \
      -o json 2>>"$log" | python3 -c "$tg" 2>>"$log")
    r=$(awk -v h="${h:-0}" -v l="${l:-0}" 'BEGIN { if (h > 0 && l > 0) printf "%.2f", h / l; else print "-" }')
    [ -n "$h" ] && h=$(printf "%.2f" "$h"); [ -n "$l" ] && l=$(printf "%.2f" "$l")
    echo "| $i | ${h:-failed} | ${l:-failed} | $r |" >> "$out/versus.md"
  done
  cat "$out/versus.md" ;;
replay-jetson)
  # Rows (a)-(d) under jetson-orin-32g (int8 high, int2 low) with routing replayed from $TRACE
  # at T1/T2, emulated SSD (--no-ssd: page cache paced to 3 GB/s) and the device's real disk.
  table=hobbit-replay-jetson.md; header
  c=$(share 24 185.6e6)
  echo "jetson-orin-32g expert cache scaled to $LAYERS layers: $c GiB (int8 sizing); routing replayed from $TRACE" >> "$log"
  p=(--platform jetson-orin-32g --expert-variant int8 --expert-cache "$c" -r 2 -p 0 --replay-trace "$TRACE")
  cal=(--low int2 --t1 "$T1" --t2 "$T2")
  # Prefetch from the trace's recorded stacked-gate predictions (`trace` mode records them).
  row a "${p[@]}" --no-ssd -n 24 --low none --cache-policy lru --prefetch 0
  row b "${p[@]}" --no-ssd -n 24 "${cal[@]}" --cache-policy lru --prefetch 0
  row c "${p[@]}" --no-ssd -n 24 "${cal[@]}" --cache-policy lru --prefetch 3
  row d "${p[@]}" --no-ssd -n 24 "${cal[@]}" --cache-policy hobbit --prefetch 3
  row "d, no prefetch" "${p[@]}" --no-ssd -n 24 "${cal[@]}" --cache-policy hobbit --prefetch 0
  row "a, SSD" "${p[@]}" --ssd -n 8 --low none --cache-policy lru --prefetch 0
  row "d, SSD" "${p[@]}" --ssd -n 8 "${cal[@]}" --cache-policy hobbit --prefetch 3
  cat "$out/$table" ;;
trace)
  # A trained router's routing for the replay modes (shared/models/shakespeare-moe/README.md).
  [ -f .gpu/shakes/train.py ] && [ -f .gpu/hamlet-60k.txt ] \
    || { echo "trace: stage .gpu/shakes and .gpu/hamlet-60k.txt first (tools/stage_gpu.sh)"; exit 2; }
  t=/tmp/shakes-trace.log; w=/tmp/shakes
  # Into hobbit.log however the mode ends: every mode in one call stays within the device's 8 files.
  trap 'cat "$t" >> "$log"' EXIT
  (cd .gpu/shakes && STEPS="${STEPS:-800}" python3 train.py "$w" 200) > "$t" 2>&1 || { tail "$t"; exit 1; }
  cp tests/fixtures/mistral/tokenizer.json "$w/"
  "$hob" convert --from "$w" --experts f16,int8,int4,int2 -o /tmp/shakes.hob --no-progress >> "$t" 2>&1 || exit 1
  "$hob" calibrate -m /tmp/shakes.hob -f .gpu/hamlet-60k.txt --split 67/30/3 >> "$t" 2>&1 || exit 1
  t1=$(grep "^fitted" "$t" | sed 's/.*T1 = \([0-9.]*\),.*/\1/'); t2=$(grep "^fitted" "$t" | sed 's/.*T2 = \([0-9.]*\) .*/\1/')
  "$hob" perplexity -m /tmp/shakes.hob -f .gpu/hamlet-60k.txt -c 512 --record-trace /tmp/shakes-trace.jsonl >> "$t" 2>&1 || exit 1
  printf 'TRACE=/tmp/shakes-trace.jsonl\nT1=%s\nT2=%s\n' "$t1" "$t2" | tee "$out/trace.env"
  grep -E "best|^fitted|scored" "$t" ;;
llamacpp)
  bash tools/llamacpp_gpu.sh bench "$LAYERS" >> "$log" 2>&1; cat "$out/llamacpp.md" ;;
*) echo "usage: hobbit_gpu.sh prepare|rtx4090|jetson|trace|replay|replay-jetson|versus|llamacpp"; exit 2 ;;
esac
