#!/usr/bin/env bash
# Issue 50's device grid: hob beside llama.cpp on the Qwen3-30B-A3B shape (LAYERS of its 48 layers,
# synthetic weights in both programs' own qwen3moe layouts), resident and under the 16 GB x8 and
# 12 GB card profiles. Run on the device machine after tools/stage_gpu.sh and, for llama.cpp,
# tools/llamacpp_gpu.sh pack (or its saved binaries in .gpu/llb.part*):
#   bash tools/families_gpu.sh prepare   llama.cpp built or restored; the f16 GGUF, its Q8_0 and Q4_K_M
#                                        (llama-quantize); the .hob with f16, int8 and int4 experts
#   bash tools/families_gpu.sh qwen3     the rows, hob and llama.cpp alternated row by row
#                                        -> $OUT/qwen3.md (hob's and llama-bench's markdown rows)
#   bash tools/families_gpu.sh trace     train tools/train_router.py's model (128 experts, top-8; data
#                                        staged in .gpu/shakes), convert it, fit T1/T2 to HOBBIT's 67/30/3
#                                        split on Hamlet, record its Hamlet trace -> /tmp/q3r-trace.jsonl,
#                                        $OUT/trace.env (TRACE, T1, T2) and its training log
#   TRACE=.. T1=.. T2=.. bash tools/families_gpu.sh replay
#                                        the offloaded rows with every layer's routing replayed from the
#                                        trained router's trace (hob's cache sees learned routing; llama.cpp's
#                                        --n-cpu-moe split does not depend on it), the Orin NX row
#                                        -> $OUT/qwen3.md
#   TRACE=.. T1=.. T2=.. bash tools/families_gpu.sh whole
#                                        the whole Qwen3-30B-A3B shape (48 layers): hob int4 (+ int2 low) beside
#                                        llama.cpp's Q4_K_M written directly (make_synthetic_gguf.py --q4-k-m: the
#                                        f16 file would not fit the disk), all on the GPU and under the 16 GB and
#                                        12 GB profiles (hob's routing replayed, CPU experts; llama.cpp's fitting
#                                        --n-cpu-moe and one more) -> $out/whole.md
#   bash tools/families_gpu.sh gated-files  gated's inputs alone (llama.cpp, the trace, the two 48-layer files)
#   [TRACE=..] bash tools/families_gpu.sh gated
#                                        gated decode (int4, no prefetch; without and with CPU experts; on by
#                                        default: Tuning::gated_decode) beside the host-routed
#                                        path (CPU experts, prefetch 3) and llama.cpp Q4_K_M at its fitting
#                                        --n-cpu-moe, 48 layers under rtx4060ti-16g and rtx3060-12g, the trained
#                                        router's routing replayed, two alternated rounds -> $out/gated.md.
#                                        Without TRACE it runs `trace` itself, beside the llama.cpp build and
#                                        the two 48-layer files; call it again after a cut-off call: it resumes
#   bash tools/families_gpu.sh q8        the Q8_0 class: hob int8 (gated + CPU experts; host-routed, alone and with an
#                                        int4 low tier) beside llama.cpp Q8_0 (written directly), Q8_LAYERS of 48
#                                        (default 32, for the disk), 16 GB and 12 GB, routing replayed -> $out/q8.md;
#                                        without the trace it runs `trace` itself, beside the build and the files
#                                        (PREPARE_ONLY=1: only those, e.g. beside the GPU tests)
#   bash tools/families_gpu.sh roundtrip the host's round trip of a host-routed decode layer: 8 layers, int4, resident
#                                        (h100's profile: one graph) beside offloaded at ~all hits (the 16 GB
#                                        profile's link, CPU experts), each plain (--stats) and under
#                                        tools/kernel_trace.c with the driver calls -> $out/roundtrip.md
#   [PRESET=..] [DENSE=..] bash tools/families_gpu.sh timeline
#                                        one resident decode token's kernels in order (tools/kernel_trace.c), the
#                                        preset's LAYERS layers, int4 experts -> $out/timeline-PRESET.md
#   bash tools/families_gpu.sh dense     issue 56: the 16 GB and 12 GB int8+int4 rows with f16 dense weights and with
#                                        --dense int8 (the expert cache gets the memory freed), uniform routing
#                                        -> $OUT/dense.md
#   TRACE=.. T1=.. T2=.. bash tools/families_gpu.sh int3
#                                        issue 54: the trained router's model (trace's /tmp/q3r) with int3 beside
#                                        int8/int4/int2, alone and as HOBBIT's low tier (T1/T2 fitted), KL against
#                                        its f16 run; then the synthetic shape with the routing replayed under
#                                        jetson-orin-nx-16g (int4 high) and rtx4060ti-16g (int8 high), each low
#                                        tier at the same cache -> $OUT/int3.md
#   bash tools/families_gpu.sh lowbits   issue 54: train the router model (as `trace`, BUDGET seconds), fit T1/T2 to
#                                        67/30/3, and KL against its f16 run (CPU, every route in its scored
#                                        precision) for int8/int4/int4k/int3/int2/int2k, ap8's widths and HOBBIT
#                                        pairs of each -> $OUT/lowbits.md
#   bash tools/families_gpu.sh phi-trace train tools/train_router.py --layout phimoe (16 experts, top-2 by its
#                                        sparsemixer), fit T1/T2 to 67/30/3, record its Hamlet trace
#                                        -> /tmp/phir-trace.jsonl and $OUT/phi-trace.env (PTRACE, PT1, PT2)
#   PTRACE=.. PT1=.. PT2=.. bash tools/families_gpu.sh phi
#                                        Phi-3.5-MoE shape (PHI_LAYERS of 32, default 8) under rtx4090-24g:
#                                        hob f16 high + int4 low with CPU experts, routing replayed, beside
#                                        llama.cpp f16 at each --n-cpu-moe that fits and one more (pp512 and
#                                        tg64), then ROUNDS alternated tg64 rounds at the best split -> $OUT/phi.md
#   bash tools/families_gpu.sh gptoss    issue 53: gpt-oss-20b's shape, hob int4 beside llama.cpp Q4_K_M, all on
#                                        the GPU -> $OUT/gptoss-int4.md; GPTOSS_EXPERTS=mxfp4: hob mxfp4 beside
#                                        llama.cpp MXFP4_MOE under rtx4060ti-16g -> $OUT/gptoss-mxfp4.md
#   bash tools/families_gpu.sh glm       issue 53: GLM-4.5-Air's shape (GLM_LAYERS of its 46, default 6: the dense
#                                        first layer and 5 MoE layers) under the 16 GB profile: hob int4 (+ int2 low,
#                                        cooperative CPU experts; int4 gated) with int8 dense beside llama.cpp Q4_K_M at the
#                                        --n-cpu-moe splits that fit, then ROUNDS alternated tg64 rounds -> $OUT/glm.md
#   bash tools/families_gpu.sh flash     the same for GLM-4.7-Flash's shape (FLASH_LAYERS of its 47, default 8; 64 experts
#                                        of 2048 x 1536, MLA, sigmoid routing) -> $OUT/flash.md
#   bash tools/families_gpu.sh oss120    issue 53: gpt-oss-120b's shape (OSS_LAYERS of its 36, default 6) under rtx4090-24g and
#                                        rtx4060ti-16g: hob mxfp4 (+ int2 low; mxfp4 gated) with cooperative CPU experts beside llama.cpp's
#                                        MXFP4_MOE at its --n-cpu-moe splits, then ROUNDS alternated tg64 rounds -> $OUT/oss120.md
#   bash tools/families_gpu.sh deepseek  issue 53: DeepSeek-V2-Lite's shape, all 27 layers: hob int4 + int8 dense (and with
#                                        FROM_GGUF=1 hob from llama.cpp's Q4_K_M GGUF: ~4 min more to convert) beside
#                                        llama.cpp on that GGUF, all whole on the GPU under the 16 GB profile -> $OUT/deepseek.md
#                                        (PREPARE_ONLY=1: only the files and llama.cpp, ~9 min on a fresh machine)
#   bash tools/families_gpu.sh gguf      issue 51: the Q4_K_M GGUF of `prepare` through `hob convert --from` with
#                                        the file's own defaults, then resident and the 16 GB and 12 GB profiles
#                                        beside llama.cpp on that GGUF (best --n-cpu-moe of three) -> $OUT/gguf.md
#   TRACE=.. T1=.. T2=.. bash tools/families_gpu.sh hobbit
#                                        the trained router's model: fidelity of the fitted thresholds (KL and
#                                        perplexity against all-high), `hob sim` on its trace, and HOBBIT's
#                                        ablation rows (a)-(e) on the synthetic shape under rtx4060ti-16g (int8
#                                        high, int4 low) with its routing replayed -> $OUT/hobbit-qwen3.md
# LAYERS (default 8). Memory is scaled as tools/hobbit_gpu.sh scales it: a card's budget less the
# full model's non-expert weights (hob: f16; llama.cpp: its quantization's) and ~1 GB of KV cache and
# buffers, as a share of the full model's experts, times this file's experts (hob's --expert-cache;
# llama.cpp's --n-cpu-moe: the layers whose experts do not fit, then one and two more).
set -uo pipefail
LAYERS="${LAYERS:-8}"
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
L=/tmp/llama
model=/tmp/qwen3-synthetic-${LAYERS}l.hob
g=/tmp/qwen3-synthetic-${LAYERS}l
log="$out/families.log"
# Full Qwen3-30B-A3B: 48 layers x 128 experts of 2048 x 768 x 3; non-expert weights 1.23e9 values.
frac() { # budget GiB, bytes per expert, non-expert bytes -> share of the experts that fit
  python3 -c "print(max(0.0, min(1.0, ($1*2**30 - $3 - 1e9) / (6144*$2))))"; }
cache() { # share, bytes per expert -> GiB for this file's experts
  python3 -c "print(f'{$1*$LAYERS*128*$2/2**30:.3f}')"; }
ncpu() { # share -> llama.cpp layers whose experts stay on the CPU
  python3 -c "import math; print(min($LAYERS, math.ceil($LAYERS*(1-$1) - 1e-9)))"; }
# Bytes per expert: hob int8 g64 / int4 g64 (f16 scales, int4 also f16 mins); llama.cpp Q8_0, Q4_K_M
# (Q4_K/Q6_K mix, ~4.9 bits).
E_INT8=4866048; E_INT4=2654208; E_Q8=5013504; E_Q4KM=2890000
D_F16=2.46e9; D_Q8=1.31e9; D_Q4KM=0.75e9; D_INT8=1.27e9
# hob from a Q4_K_M GGUF with its defaults: the Q4_K matrices int4/g32, the Q6_K ones (output, some attn_v) int8.
D_GGUF=1.15e9
llama_ready() { # llama.cpp's binaries: restored from .gpu/llb.part* if saved there, else built (and saved)
  [ -x $L/build/bin/llama-bench ] && return 0
  if ls .gpu/llb.part* > /dev/null 2>&1; then bash tools/llamacpp_gpu.sh restore
  else bash tools/llamacpp_gpu.sh build && bash tools/llamacpp_gpu.sh save; fi
}
hobrow() { # label, args...
  local label="$1"; shift
  echo "== hob $label: $*" >> "$log"
  timeout 200 "$hob" bench -m "$model" --stats "$@" 2>>"$log" | grep -v '^| ---\|^| model' \
    | sed "s#^|#| hob $label |#" >> "$out/qwen3.md"
}
llrow() { # label, gguf, args...
  local label="$1" m="$2"; shift 2
  echo "== llama.cpp $label: $*" >> "$log"
  timeout 200 $L/build/bin/llama-bench -m "$m" -ngl 99 -t "$(nproc)" "$@" -o md 2>>"$log" \
    | grep -v '^| ---\|^| model' | sed "s#^|#| llama.cpp $label |#" >> "$out/qwen3.md"
}
make_room() { # GiB a mode's files need, the files it keeps: other modes' .hob and .gguf in /tmp go when the
  # disk (64 GiB on the device) has less free than that; the rows of one call then still get their llama.cpp file
  local need=$1 free f; shift
  free=$(df --output=avail -BG /tmp | tail -1 | tr -dc 0-9)
  [ "${free:-0}" -ge "$need" ] && return 0
  for f in /tmp/*.hob /tmp/*.gguf; do
    [ -e "$f" ] || continue
    case " $* " in *" $f "*) continue ;; esac
    echo "make_room: $need GiB wanted, ${free} GiB free: removing $f" >> "$log"; rm -f "$f"
  done
}
resume_rows() { # rows kept in $R/rows.md across calls: a row done in an earlier call is skipped (`once`)
  [ -f "$R/rows.md" ] || {
    echo "| who, row | model | size | params | backend | ... | test | t/s | (hob: hit rate, exp/tok, MB/tok, link GB/s, limit t/s, % limit, projected t/s; llama.cpp: ngl, n_cpu_moe) |"
    echo "|---|---|---|---|---|---|---|---|---|"; } > "$R/rows.md"
  : > "$out/qwen3.md"
}
once() { # id, row function and its arguments: run unless done in an earlier call
  local id=$1; shift; [ -f "$R/$id.done" ] && return 0
  "$@"; cat "$out/qwen3.md" >> "$R/rows.md"; : > "$out/qwen3.md"; touch "$R/$id.done"
}
gated_files() { # gated's inputs: llama.cpp built, the trace (unless TRACE), the 48-layer GGUF and .hob
  wg=/tmp/qwen3-synthetic-48l-Q4_K_M.gguf; model=/tmp/qwen3-synthetic-48l-int4.hob
  if [ -z "${TRACE:-}" ] || [ ! -f "$wg" ] || [ ! -f "$model" ]; then
    [ -f "$wg" ] && [ -f "$model" ] || make_room 40 "$wg" "$model" /tmp/q3r.hob
    # The llama.cpp build (CPU), the router's training (GPU) and the two files (disk) side by side.
    llama_ready >> "$log" 2>&1 &
    [ -n "${TRACE:-}" ] || [ -f /tmp/q3r-trace.jsonl ] || BUDGET=${BUDGET:-110} bash "$0" trace > $R/trace.log 2>&1 &
    if [ ! -f "$wg" ]; then
      mkdir -p $R/gg && tar xJf .gpu/gguf-py.tar.xz -C $R/gg
      PYTHONPATH=$R/gg/llama.cpp/gguf-py python3 tools/make_synthetic_gguf.py "$wg.part" --model qwen3-30b-a3b \
        --layers 48 --q4-k-m > /dev/null 2>> "$log" && mv "$wg.part" "$wg" &
    fi
    [ -f "$model" ] || "$hob" convert --synthetic qwen3-30b-a3b --layers 48 --experts int4 -o "$model" --no-progress \
      >> "$log" 2>&1 &
    wait
  fi
}
case "${1:-}" in
prepare)
  {
    echo "# $(nvidia-smi --query-gpu=name --format=csv,noheader), $(date -u +%F), $(nproc) CPU threads"
    llama_ready
    t0=$(date +%s)
    [ -f "$g-f16.gguf" ] || PYTHONPATH=$L/llama.cpp/gguf-py python3 tools/make_synthetic_gguf.py "$g-f16.gguf" \
      --model qwen3-30b-a3b --layers "$LAYERS" 2>/dev/null
    for q in Q8_0 Q4_K_M; do
      [ -f "$g-$q.gguf" ] || $L/build/bin/llama-quantize "$g-f16.gguf" "$g-$q.gguf" $q "$(nproc)" > /tmp/quantize-$q.log 2>&1 \
        || tail -3 /tmp/quantize-$q.log
    done
    [ -f "$model" ] || "$hob" convert --synthetic qwen3-30b-a3b --layers "$LAYERS" --experts f16,int8,int4,int2 \
      -o "$model" --no-progress | tail -3
    echo "prepared in $(( $(date +%s) - t0 )) s"; ls -l /tmp/*.gguf "$model"; df -h /tmp | tail -1
  } >> "$log" 2>&1
  tail -8 "$log" ;;
qwen3)
  echo "| who, row | model | size | params | backend | ... | test | t/s | (hob: hit rate, exp/tok, MB/tok, link GB/s, limit t/s, % limit; llama.cpp: ngl, n_cpu_moe) |" > "$out/qwen3.md"
  echo "|---|---|---|---|---|---|---|---|---|" >> "$out/qwen3.md"
  r=(-r 3 -p 512 -n 64)
  # All resident: int4 beside Q4_K_M, f16 beside f16.
  hobrow "resident int4" --platform h200 --expert-variant int4 --low none "${r[@]}"
  llrow "resident Q4_K_M" "$g-Q4_K_M.gguf" "${r[@]}"
  hobrow "resident f16" --platform h200 --expert-variant f16 --low none "${r[@]}"
  llrow "resident f16" "$g-f16.gguf" "${r[@]}"
  for prof in rtx4060ti-16g:16 rtx3060-12g:12; do
    name=${prof%%:*}; gib=${prof##*:}
    f8=$(frac "$gib" $E_INT8 $D_F16); f4=$(frac "$gib" $E_INT4 $D_F16)
    fq8=$(frac "$gib" $E_Q8 $D_Q8); fq4=$(frac "$gib" $E_Q4KM $D_Q4KM)
    echo "$name: hob int8 share $f8 ($(cache "$f8" $E_INT8) GiB), int4 share $f4 ($(cache "$f4" $E_INT4) GiB); llama.cpp Q8_0 share $fq8, Q4_K_M share $fq4" >> "$out/qwen3.md"
    p=(--platform "$name" --cache-policy hobbit --prefetch 3 "${r[@]}")
    hobrow "$name int8+int4" "${p[@]}" --expert-variant int8 --low int4 --expert-cache "$(cache "$f8" $E_INT8)"
    n8=$(ncpu "$fq8")
    for n in $n8 $((n8 + 1)) $((n8 + 2)); do
      [ "$n" -le "$LAYERS" ] && llrow "$name Q8_0 n-cpu-moe $n" "$g-Q8_0.gguf" --n-cpu-moe "$n" "${r[@]}"
    done
    hobrow "$name int4, CPU experts" "${p[@]}" --expert-variant int4 --low none --cpu-experts -t "$(nproc)" \
      --expert-cache "$(cache "$f4" $E_INT4)"
    n4=$(ncpu "$fq4")
    for n in $n4 $((n4 + 1)) $((n4 + 2)); do
      [ "$n" -le "$LAYERS" ] && llrow "$name Q4_K_M n-cpu-moe $n" "$g-Q4_K_M.gguf" --n-cpu-moe "$n" "${r[@]}"
    done
  done
  cat "$out/qwen3.md" ;;
dense)
  for d in f16 int8; do
    [ -f "/tmp/q3-dense-$d.hob" ] || "$hob" convert --synthetic qwen3-30b-a3b --layers "$LAYERS" --experts int8,int4 \
      --dense "$d" -o "/tmp/q3-dense-$d.hob" --no-progress | tail -2
  done
  for prof in rtx4060ti-16g:16 rtx3060-12g:12; do
    name=${prof%%:*}; gib=${prof##*:}
    for d in f16 int8; do
      dd=$([ "$d" = f16 ] && echo $D_F16 || echo $D_INT8)
      f=$(frac "$gib" $E_INT8 "$dd")
      echo "$name, dense $d: int8 share $f ($(cache "$f" $E_INT8) GiB)" >> "$out/dense.md"
      model="/tmp/q3-dense-$d.hob" hobrow "$name dense $d int8+int4" --platform "$name" --cache-policy hobbit \
        --prefetch 3 -r 3 -p 0 -n 64 --expert-variant int8 --low int4 --expert-cache "$(cache "$f" $E_INT8)"
    done
  done
  cat "$out/qwen3.md" "$out/dense.md" ;;
trace)
  [ -f .gpu/shakes/train.bin ] && [ -f .gpu/hamlet-60k.txt ] \
    || { echo "trace: stage .gpu/shakes and .gpu/hamlet-60k.txt first (tools/stage_gpu.sh)"; exit 2; }
  t=/tmp/q3r.log; w=/tmp/q3r
  trap 'cat "$t" >> "$log"' EXIT
  python3 tools/train_router.py "$w" --data .gpu/shakes --budget "${BUDGET:-150}" > "$t" 2>&1 || { tail "$t"; exit 1; }
  cp "$w/train_log.json" "$out/q3r-train-log.json"
  cp tests/fixtures/mistral/tokenizer.json "$w/"
  "$hob" convert --from "$w" --experts f16,int8,int4,int2 -o /tmp/q3r.hob --no-progress >> "$t" 2>&1 || exit 1
  "$hob" calibrate -m /tmp/q3r.hob -f .gpu/hamlet-60k.txt --split 67/30/3 >> "$t" 2>&1 || exit 1
  t1=$(grep "^fitted" "$t" | sed 's/.*T1 = \([0-9.]*\),.*/\1/'); t2=$(grep "^fitted" "$t" | sed 's/.*T2 = \([0-9.]*\) .*/\1/')
  # With the stacked gates on (--prefetch 3): the trace records their predictions, --stats their accuracy.
  "$hob" perplexity -m /tmp/q3r.hob -f .gpu/hamlet-60k.txt -c 512 --prefetch 3 --stats \
    --record-trace /tmp/q3r-trace.jsonl >> "$t" 2>&1 || exit 1
  printf 'TRACE=/tmp/q3r-trace.jsonl\nT1=%s\nT2=%s\n' "$t1" "$t2" | tee "$out/trace.env"
  grep -E "best|^fitted|scored|Final|perplexity" "$t" | tail -8 ;;
replay)
  echo "| who, row | model | size | params | backend | ... | test | t/s | (hob: hit rate, exp/tok, MB/tok, link GB/s, limit t/s, % limit, projected t/s; llama.cpp: ngl, n_cpu_moe) |" > "$out/qwen3.md"
  echo "|---|---|---|---|---|---|---|---|---|" >> "$out/qwen3.md"
  r=(-r 3 -p 512 -n 64)
  rt=(--replay-trace "$TRACE" --cache-policy hobbit --prefetch 3)
  for prof in rtx4060ti-16g:16 rtx3060-12g:12; do
    name=${prof%%:*}; gib=${prof##*:}
    f8=$(frac "$gib" $E_INT8 $D_F16); f4=$(frac "$gib" $E_INT4 $D_F16)
    fq8=$(frac "$gib" $E_Q8 $D_Q8); fq4=$(frac "$gib" $E_Q4KM $D_Q4KM)
    echo "$name: hob int8 share $f8 ($(cache "$f8" $E_INT8) GiB), int4 share $f4; llama.cpp Q8_0 share $fq8, Q4_K_M share $fq4" >> "$out/qwen3.md"
    p=(--platform "$name" "${rt[@]}" "${r[@]}")
    c8=$(cache "$f8" $E_INT8); c4=$(cache "$f4" $E_INT4)
    hobrow "$name int8+int4 T1 $T1 T2 1 (none skipped)" "${p[@]}" --expert-variant int8 --low int4 --t1 "$T1" --t2 1 --expert-cache "$c8"
    hobrow "$name int8+int4 T1 $T1 T2 $T2" "${p[@]}" --expert-variant int8 --low int4 --t1 "$T1" --t2 "$T2" --expert-cache "$c8"
    n8=$(ncpu "$fq8")
    for n in $n8 $((n8 + 1)); do
      [ "$n" -le "$LAYERS" ] && llrow "$name Q8_0 n-cpu-moe $n" "$g-Q8_0.gguf" --n-cpu-moe "$n" "${r[@]}"
    done
    hobrow "$name int4, CPU experts" "${p[@]}" --expert-variant int4 --low none --cpu-experts -t "$(nproc)" --expert-cache "$c4"
    hobrow "$name int4" "${p[@]}" --expert-variant int4 --low none --expert-cache "$c4"
    n4=$(ncpu "$fq4")
    for n in $n4 $((n4 + 1)); do
      [ "$n" -le "$LAYERS" ] && llrow "$name Q4_K_M n-cpu-moe $n" "$g-Q4_K_M.gguf" --n-cpu-moe "$n" "${r[@]}"
    done
  done
  # Orin NX 16 GB: int4 high, int2 low from the NVMe tier (paced page cache: --no-ssd), no CPU experts
  # (the CPU would read the same memory). 12 GiB of its 16 for hob.
  f4=$(frac 12 $E_INT4 $D_F16)
  echo "jetson-orin-nx-16g: int4 share $f4" >> "$out/qwen3.md"
  hobrow "jetson-orin-nx-16g int4+int2 T1 $T1 T2 $T2" --platform jetson-orin-nx-16g "${rt[@]}" -r 2 -p 0 -n 32 --no-ssd \
    --expert-variant int4 --low int2 --t1 "$T1" --t2 "$T2" --expert-cache "$(cache "$f4" $E_INT4)"
  cat "$out/qwen3.md" ;;
int3)
  h="$out/int3.md"; q=/tmp/q3r3.hob; m3=/tmp/qwen3-synthetic-${LAYERS}l-int3.hob
  [ -f "$q" ] || "$hob" convert --from /tmp/q3r --experts f16,int8,int4,int3,int2 -o "$q" --no-progress >> "$log" 2>&1
  # On the CPU: there every route runs in the precision it is scored (the GPU engine, with every expert
  # cached, runs low-scored routes from their high copies).
  pp=(-f .gpu/hamlet-60k.txt -c 512 --chunks 20 --device cpu -t "$(nproc)")
  "$hob" perplexity -m "$q" "${pp[@]}" --expert-variant f16 --kl-divergence-base /tmp/q3r3-f16.kld >> "$log" 2>&1
  { echo "## KL against f16 on the trained router's model (CPU; Hamlet, 20 chunks of 512; pairs at T1 $T1, T2 $T2)"
    echo '```'; } > "$h"
  for row in int8 int4 int3 int2 f16:int4 int8:int4 int8:int3 int8:int2 int4:int3 int4:int2; do
    hi=${row%%:*}; lo=none; th=()
    [ "$row" != "$hi" ] && { lo=${row##*:}; th=(--t1 "$T1" --t2 "$T2"); }
    echo "== $row" >> "$h"
    "$hob" perplexity -m "$q" "${pp[@]}" --expert-variant "$hi" --low "$lo" "${th[@]}" \
      --kl-divergence-base /tmp/q3r3-f16.kld --kl-divergence 2>&1 | grep -E "Final|Mean KL|Same top|Routes" >> "$h"
  done
  echo '```' >> "$h"
  [ "${INT3_SPEED:-1}" = 0 ] && { cat "$h"; exit 0; }
  [ -f "$m3" ] || "$hob" convert --synthetic qwen3-30b-a3b --layers "$LAYERS" --experts int8,int4,int3,int2 \
    -o "$m3" --no-progress >> "$log" 2>&1
  model="$m3"
  echo "| row | model | size | params | backend | ... | test | t/s | hit rate | exp/tok | MB/tok | link GB/s | limit t/s | % limit | projected t/s |" > "$out/qwen3.md"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" >> "$out/qwen3.md"
  rt=(--replay-trace "$TRACE" --cache-policy hobbit --prefetch 3 --t1 "$T1" --t2 "$T2" -r 2 -p 0 -n 32)
  c4=$(cache "$(frac 12 $E_INT4 $D_F16)" $E_INT4); c8=$(cache "$(frac 16 $E_INT8 $D_F16)" $E_INT8)
  for lo in int2 int3; do
    hobrow "jetson-orin-nx-16g int4+$lo" --platform jetson-orin-nx-16g "${rt[@]}" --no-ssd --expert-variant int4 \
      --low "$lo" --expert-cache "$c4"
  done
  for lo in int4 int3 int2; do
    hobrow "rtx4060ti-16g int8+$lo" --platform rtx4060ti-16g "${rt[@]}" --expert-variant int8 --low "$lo" --expert-cache "$c8"
  done
  { echo; echo "## Replayed routing, expert caches $c4 GiB (Orin NX) and $c8 GiB (16 GB)"; echo; cat "$out/qwen3.md"; } >> "$h"
  cat "$h" ;;
lowbits)
  h="$out/lowbits.md"; w=/tmp/q3r; q=/tmp/q3r-low.hob; t=/tmp/q3r-low.log
  [ -f "$w/config.json" ] || python3 tools/train_router.py "$w" --data .gpu/shakes --budget "${BUDGET:-150}" > "$t" 2>&1 \
    || { tail "$t"; exit 1; }
  cp tests/fixtures/mistral/tokenizer.json "$w/"
  "$hob" convert --from "$w" --experts f16,int8,int4,int4k,int3,int2,int2k,ap8 -o "$q" --no-progress >> "$t" 2>&1 || exit 1
  "$hob" calibrate -m "$q" -f .gpu/hamlet-60k.txt --split 67/30/3 --expert-variant f16 --low int4 >> "$t" 2>&1 || exit 1
  t1=$(grep "^fitted" "$t" | sed 's/.*T1 = \([0-9.]*\),.*/\1/'); t2=$(grep "^fitted" "$t" | sed 's/.*T2 = \([0-9.]*\) .*/\1/')
  pp=(-f .gpu/hamlet-60k.txt -c 512 --chunks 20 --device cpu -t "$(nproc)")
  "$hob" perplexity -m "$q" "${pp[@]}" --expert-variant f16 --low none --kl-divergence-base /tmp/q3r-low.kld >> "$t" 2>&1
  { echo "## KL against f16, the trained router's model (CPU; Hamlet, 20 chunks of 512; pairs at T1 $t1, T2 $t2)"
    echo '```'; } > "$h"
  for row in int8 ap8 int4 int4k ap8@4 int3 ap8@3 int2 int2k ap8@2 f16:int4 f16:int4k int8:int2 int8:int2k \
      ap8:ap8@2 ap8:ap8@3 int4:int2 int4k:int2k; do
    hi=${row%%:*}; lo=none; th=()
    [ "$row" != "$hi" ] && { lo=${row##*:}; th=(--t1 "$t1" --t2 "$t2"); }
    echo "== $row" >> "$h"
    "$hob" perplexity -m "$q" "${pp[@]}" --expert-variant "$hi" --low "$lo" "${th[@]}" \
      --kl-divergence-base /tmp/q3r-low.kld --kl-divergence 2>&1 | grep -E "Final|Mean KL|Same top|Routes" >> "$h"
  done
  echo '```' >> "$h"; grep -E "best|^fitted|loss" "$t" | tail -4 >> "$h"
  cat "$h" ;;
phi-trace)
  [ -f .gpu/shakes/train.bin ] && [ -f .gpu/hamlet-60k.txt ] \
    || { echo "phi-trace: stage .gpu/shakes and .gpu/hamlet-60k.txt first (tools/stage_gpu.sh)"; exit 2; }
  t=/tmp/phir.log; w=/tmp/phir
  trap 'cat "$t" >> "$log"' EXIT
  python3 tools/train_router.py "$w" --layout phimoe --data .gpu/shakes --budget "${BUDGET:-150}" > "$t" 2>&1 \
    || { tail "$t"; exit 1; }
  cp tests/fixtures/mistral/tokenizer.json "$w/"
  "$hob" convert --from "$w" --experts f16,int4 -o /tmp/phir.hob --no-progress >> "$t" 2>&1 || exit 1
  "$hob" calibrate -m /tmp/phir.hob -f .gpu/hamlet-60k.txt --split 67/30/3 >> "$t" 2>&1 || exit 1
  t1=$(grep "^fitted" "$t" | sed 's/.*T1 = \([0-9.]*\),.*/\1/'); t2=$(grep "^fitted" "$t" | sed 's/.*T2 = \([0-9.]*\) .*/\1/')
  "$hob" perplexity -m /tmp/phir.hob -f .gpu/hamlet-60k.txt -c 512 --record-trace /tmp/phir-trace.jsonl >> "$t" 2>&1 || exit 1
  printf 'PTRACE=/tmp/phir-trace.jsonl\nPT1=%s\nPT2=%s\n' "$t1" "$t2" | tee "$out/phi-trace.env"
  grep -E "best|^fitted|scored|Final" "$t" | tail -6 ;;
phi)
  # Full Phi-3.5-MoE: 32 layers x 16 experts of 4096 x 6400 x 3 (157.3 MB in f16); non-expert weights
  # 3.21e9 bytes in f16 (the same attention and vocabulary sizes as Mixtral's).
  pl="${PHI_LAYERS:-8}"; pm=/tmp/phi-synthetic-${pl}l.hob; pg=/tmp/phi-synthetic-${pl}l-f16.gguf; E_PHI=157286400
  [ -f "$pg" ] || PYTHONPATH=$L/llama.cpp/gguf-py python3 tools/make_synthetic_gguf.py "$pg" --model phi-3.5-moe \
    --layers "$pl" > /dev/null
  [ -f "$pm" ] || "$hob" convert --synthetic phi-3.5-moe --layers "$pl" --experts f16,int4 -o "$pm" --no-progress | tail -2
  f=$(python3 -c "print(max(0.0, min(1.0, (24*2**30 - 3.21e9 - 1e9) / (512*$E_PHI))))")
  c=$(python3 -c "print(f'{$f*$pl*16*$E_PHI/2**30:.3f}')")
  n=$(python3 -c "import math; print(min($pl, math.ceil($pl*(1-$f) - 1e-9)))")
  echo "rtx4090-24g, $pl of 32 layers: expert share $f (hob --expert-cache $c GiB, f16 sizing; llama.cpp --n-cpu-moe $n fits)" > "$out/phi.md"
  echo "| who, row | model | size | params | backend | ... | test | t/s | (hob: hit rate, exp/tok, MB/tok, link GB/s, limit t/s, % limit, projected t/s; llama.cpp: ngl, n_cpu_moe) |" >> "$out/phi.md"
  echo "|---|---|---|---|---|---|---|---|---|" >> "$out/phi.md"
  ph=(--platform rtx4090-24g --expert-variant f16 --low int4 --t1 "$PT1" --t2 "$PT2" --expert-cache "$c" \
      --replay-trace "$PTRACE" --cache-policy hobbit --prefetch 0 --cpu-experts -t "$(nproc)")
  echo "== hob phi: ${ph[*]}" >> "$log"
  "$hob" bench -m "$pm" --stats "${ph[@]}" -r 3 -p 512 -n 64 2>>"$log" | grep -v '^| ---\|^| model' \
    | sed "s#^|#| hob f16+int4 low, CPU experts |#" >> "$out/phi.md"
  best=$n; bts=0
  for k in $n $((n + 1)); do
    [ "$k" -le "$pl" ] || continue
    row=$(timeout 300 $L/build/bin/llama-bench -m "$pg" -ngl 99 --n-cpu-moe "$k" -t "$(nproc)" -r 3 -p 512 -n 64 -o md \
      2>>"$log" | grep -v '^| ---\|^| model' | sed "s#^|#| llama.cpp f16 n-cpu-moe $k |#")
    echo "$row" >> "$out/phi.md"
    ts=$(echo "$row" | grep tg64 | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
    python3 -c "import sys; sys.exit(0 if float('${ts:-0}') > float('$bts') else 1)" && { best=$k; bts=$ts; }
  done
  echo "" >> "$out/phi.md"; echo "| round | hob t/s | llama.cpp f16 --n-cpu-moe $best t/s | ratio |" >> "$out/phi.md"
  echo "|---|---:|---:|---:|" >> "$out/phi.md"
  tg='import json, sys; print(next(r["avg_ts"] for r in json.load(sys.stdin) if r["n_gen"] > 0 and r["n_prompt"] == 0))'
  for i in $(seq 1 "${ROUNDS:-3}"); do
    h=$(timeout 120 "$hob" bench -m "$pm" "${ph[@]}" -r 3 -p 0 -n 64 -o json 2>>"$log" | python3 -c "$tg" 2>>"$log")
    l=$(timeout 120 $L/build/bin/llama-bench -m "$pg" -ngl 99 --n-cpu-moe "$best" -t "$(nproc)" -p 0 -n 64 -r 3 \
      -o json 2>>"$log" | python3 -c "$tg" 2>>"$log")
    r=$(awk -v h="${h:-0}" -v l="${l:-0}" 'BEGIN { if (h > 0 && l > 0) printf "%.2f", h / l; else print "-" }')
    echo "| $i | ${h:-failed} | ${l:-failed} | $r |" >> "$out/phi.md"
  done
  cat "$out/phi.md" ;;
gguf)
  gm=/tmp/q3-gguf-${LAYERS}l.hob
  if [ ! -f "$gm" ]; then
    /usr/bin/time -v "$hob" convert --from "$g-Q4_K_M.gguf" -o "$gm" --no-progress > /tmp/gguf-convert.log 2>&1
    grep -E "from the GGUF|wrote|Elapsed|Maximum resident" /tmp/gguf-convert.log > "$out/gguf-convert.txt"
    "$hob" inspect "$gm" 2>&1 | head -40 >> "$out/gguf-convert.txt"
  fi
  echo "| who, row | model | size | params | backend | ... | test | t/s | (hob: hit rate, exp/tok, MB/tok, link GB/s, limit t/s, % limit, projected t/s; llama.cpp: ngl, n_cpu_moe) |" > "$out/qwen3.md"
  echo "|---|---|---|---|---|---|---|---|---|" >> "$out/qwen3.md"
  r=(-r 3 -p 512 -n 64)
  model="$gm" hobrow "resident int4, int8 dense (from the Q4_K_M GGUF)" --platform h200 --expert-variant int4 --low none "${r[@]}"
  llrow "resident Q4_K_M" "$g-Q4_K_M.gguf" "${r[@]}"
  for prof in rtx4060ti-16g:16 rtx3060-12g:12; do
    name=${prof%%:*}; gib=${prof##*:}
    f4=$(frac "$gib" $E_INT4 $D_GGUF); fq4=$(frac "$gib" $E_Q4KM $D_Q4KM); c4=$(cache "$f4" $E_INT4)
    echo "$name: hob int4 share $f4 ($c4 GiB); llama.cpp Q4_K_M share $fq4" >> "$out/qwen3.md"
    p=(--platform "$name" --cache-policy hobbit --prefetch 3 --expert-cache "$c4" "${r[@]}")
    model="$gm" hobrow "$name int4+int2 (the file's pair)" "${p[@]}"
    model="$gm" hobrow "$name int4, CPU experts" "${p[@]}" --expert-variant int4 --low none --cpu-experts -t "$(nproc)"
    n4=$(ncpu "$fq4")
    for n in $n4 $((n4 + 1)) $((n4 + 2)); do
      [ "$n" -le "$LAYERS" ] && llrow "$name Q4_K_M n-cpu-moe $n" "$g-Q4_K_M.gguf" --n-cpu-moe "$n" "${r[@]}"
    done
  done
  mv "$out/qwen3.md" "$out/gguf.md"; cat "$out/gguf.md" ;;
hobbit)
  h="$out/hobbit-qwen3.md"
  { echo "## Fidelity of T1 $T1 / T2 $T2 on the trained model (Hamlet, 20 chunks of 512)"; echo '```'; } > "$h"
  for pair in int8:int4 f16:int4 int4:int2; do
    "$hob" perplexity -m /tmp/q3r.hob -f .gpu/hamlet-60k.txt -c 512 --chunks 20 --expert-variant "${pair%%:*}" \
      --low "${pair##*:}" --t1 "$T1" --t2 "$T2" --kl-baseline 2>&1 | grep -iE "kl|perplexity|agree|split|Final" >> "$h"
  done
  { echo '```'; echo "## hob sim on its trace"; } >> "$h"
  "$hob" sim --trace "$TRACE" --cache-frac 0.1,0.25,0.5 >> "$h" 2>&1
  [ -f "$model" ] || "$hob" convert --synthetic qwen3-30b-a3b --layers "$LAYERS" --experts int8,int4 -o "$model" --no-progress > /dev/null
  f8=$(frac 16 $E_INT8 $D_F16); c8=$(cache "$f8" $E_INT8)
  { echo "## Ablation under rtx4060ti-16g, int8 high + int4 low, expert cache $c8 GiB, routing replayed"; echo; } >> "$h"
  echo "| row | model | size | params | backend | ... | test | t/s | hit rate | exp/tok | MB/tok | link GB/s | limit t/s | % limit | projected t/s |" > "$out/qwen3.md"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" >> "$out/qwen3.md"
  p=(--platform rtx4060ti-16g --replay-trace "$TRACE" --expert-variant int8 --expert-cache "$c8" -r 2 -p 0 -n 32)
  cal=(--low int4 --t1 "$T1" --t2 "$T2")
  hobrow "(a) high only, LRU" "${p[@]}" --low none --cache-policy lru --prefetch 0
  hobrow "(b) + dynamic precision" "${p[@]}" "${cal[@]}" --cache-policy lru --prefetch 0
  hobrow "(c) + stacked-gate prefetch 3" "${p[@]}" "${cal[@]}" --cache-policy lru --prefetch 3
  hobrow "(d) + HOBBIT cache policy" "${p[@]}" "${cal[@]}" --cache-policy hobbit --prefetch 3
  hobrow "(e) + cooperative CPU experts" "${p[@]}" "${cal[@]}" --cache-policy hobbit --prefetch 3 --cpu-experts -t "$(nproc)"
  cat "$out/qwen3.md" >> "$h"; cat "$h" ;;
gptoss)
  # Issue 53: gpt-oss-20b's shape ($LAYERS of its 24 layers), hob int4 experts + int8 dense beside llama.cpp's
  # Q4_K_M of the same shapes (tools/make_synthetic_gguf.py --model gpt-oss-20b), both all on the GPU,
  # alternated twice. The whole 24-layer model in int4 is 12.5 GB: it is resident on a 16 GB card too.
  llama_ready >> "$log" 2>&1
  # GPTOSS_EXPERTS=mxfp4: the experts as gpt-oss ships them, beside llama.cpp's MXFP4_MOE (MXFP4 experts,
  # Q8_0 dense), under the rtx4060ti-16g profile (the whole model fits).
  ex="${GPTOSS_EXPERTS:-int4}"
  model=/tmp/gpt-oss-20b-${LAYERS}l-$ex.hob; gg=/tmp/gpt-oss-20b-${LAYERS}l
  [ -f "$model" ] || "$hob" convert --synthetic gpt-oss-20b --layers "$LAYERS" --experts "$ex" --dense int8 \
    -o "$model" --no-progress >> "$log" 2>&1
  if [ "$ex" = mxfp4 ]; then q=MXFP4_MOE; src=(--mxfp4-experts); pf=(--platform rtx4060ti-16g); else q=Q4_K_M; src=(); pf=(); fi
  if [ ! -f "$gg-$q.gguf" ]; then
    PYTHONPATH=$L/llama.cpp/gguf-py python3 tools/make_synthetic_gguf.py "$gg-src.gguf" --model gpt-oss-20b \
      --layers "$LAYERS" "${src[@]}" 2>/dev/null >> "$log"
    $L/build/bin/llama-quantize --allow-requantize "$gg-src.gguf" "$gg-$q.gguf" $q "$(nproc)" > /tmp/quantize-oss.log 2>&1 \
      || tail -3 /tmp/quantize-oss.log; rm -f "$gg-src.gguf"
  fi
  echo "| who, row | model | size | params | backend | ... | test | t/s | (hob: hit rate, exp/tok, MB/tok, link GB/s, limit t/s, % limit; llama.cpp: ngl) |" > "$out/qwen3.md"
  echo "|---|---|---|---|---|---|---|---|---|" >> "$out/qwen3.md"
  for round in 1 2; do
    hobrow "$round: $ex + int8 dense, on the GPU" "${pf[@]}" -r 3 -p 512 -n 64
    llrow "$round: $q, on the GPU" "$gg-$q.gguf" -r 3 -p 512 -n 64
  done
  hobrow "kernel times" "${pf[@]}" -r 1 -p 0 -n 32 --kernel-times
  mv "$out/qwen3.md" "$out/gptoss-$ex.md"; cat "$out/gptoss-$ex.md" ;;
glm|flash)
  # Full GLM-4.5-Air: 45 MoE layers x 128 experts of 4096 x 1408 x 3 (17.3e6 values); non-expert weights 7.2e9
  # values (96 heads of 128, the 10944-wide dense layer, shared experts, 151552-token embedding and head):
  # hob int8 7.4e9 bytes, llama.cpp Q4_K_M ~4.4e9. Bytes per expert: hob int4 g64 9732096, Q4_K_M ~10.6e6.
  # Full GLM-4.7-Flash: 46 MoE layers x 64 experts of 2048 x 1536 x 3 (9.4e6 values); non-expert weights 2.15e9
  # values (MLA with a q bottleneck, the 10240-wide dense layer, a shared expert, 154880-token vocabulary): hob int8
  # 2.2e9 bytes, Q4_K_M ~1.3e9. Bytes per expert: hob int4 g64 5308416, Q4_K_M ~5.8e6.
  if [ "$1" = flash ]; then
    preset=glm-4.7-flash; gl="${FLASH_LAYERS:-8}"; ne=64; eh=5308416; dh=2.2e9; el=5.8e6; dl=1.3e9; total=47; disk=24
  else
    preset=glm-4.5-air; gl="${GLM_LAYERS:-6}"; ne=128; eh=9732096; dh=7.4e9; el=10.6e6; dl=4.4e9; total=46; disk=56
  fi
  model=/tmp/$preset-${gl}l.hob; gg=/tmp/$preset-${gl}l; nm=$((gl - 1))
  # GiB for the f16 GGUF, its Q4_K_M and the .hob (GLM-4.5-Air's 6 layers: ~36, ~10, ~8).
  [ -f "$model" ] && [ -f "$gg-Q4_K_M.gguf" ] || make_room "$disk" "$model" "$gg-Q4_K_M.gguf"
  llama_ready >> "$log" 2>&1 &
  [ -f "$model" ] || "$hob" convert --synthetic "$preset" --layers "$gl" --experts int4,int2 --dense int8 \
    -o "$model" --no-progress >> "$log" 2>&1 &
  if [ ! -f "$gg-Q4_K_M.gguf" ]; then
    mkdir -p /tmp/gg && tar xJf .gpu/gguf-py.tar.xz -C /tmp/gg
    PYTHONPATH=/tmp/gg/llama.cpp/gguf-py python3 tools/make_synthetic_gguf.py "$gg-f16.gguf" --model "$preset" \
      --layers "$gl" 2>/dev/null >> "$log"
    wait
    $L/build/bin/llama-quantize "$gg-f16.gguf" "$gg-Q4_K_M.gguf" Q4_K_M "$(nproc)" > /tmp/quantize-glm.log 2>&1 \
      || tail -3 /tmp/quantize-glm.log; rm -f "$gg-f16.gguf"
  fi
  wait
  [ "${PREPARE_ONLY:-0}" = 1 ] && { ls -l "$model" "$gg-Q4_K_M.gguf"; exit 0; }
  # The full model's share of its experts that fit 16 GiB beside its dense weights and 1e9 of the rest.
  share() { python3 -c "print(max(0.0, min(1.0, (16*2**30 - $2 - 1e9) / ($(( (total - 1) * ne ))*$1))))"; }
  fh=$(share "$eh" "$dh"); fl=$(share "$el" "$dl")
  c=$(python3 -c "print(f'{$fh*$nm*$ne*$eh/2**30:.3f}')")
  # --n-cpu-moe counts layer 0 (no experts): the MoE layers whose experts do not fit, plus one.
  n=$(python3 -c "import math; print(min($gl, 1 + math.ceil($nm*(1-$fl) - 1e-9)))")
  {
    echo "rtx4060ti-16g, $preset, $gl of $total layers: hob int4 share $fh (--expert-cache $c GiB); llama.cpp Q4_K_M share $fl (--n-cpu-moe $n fits)"
    echo "| who, row | model | size | params | backend | ... | test | t/s | (hob: hit rate, exp/tok, MB/tok, link GB/s, limit t/s, % limit, projected t/s; llama.cpp: ngl, n_cpu_moe) |"
    echo "|---|---|---|---|---|---|---|---|---|"
  } > "$out/qwen3.md"
  r=(-r 3 -p 512 -n 64)
  p=(--platform rtx4060ti-16g --cache-policy hobbit --expert-cache "$c" "${r[@]}")
  hobrow "int4+int2, CPU experts" "${p[@]}" --prefetch 3 --expert-variant int4 --low int2 --cpu-experts -t "$(nproc)"
  hobrow "int4, CPU experts" "${p[@]}" --prefetch 3 --expert-variant int4 --low none --cpu-experts -t "$(nproc)"
  # Gated decode (routed on the device, held at a layer's gate only on a miss) takes no prefetch.
  hobrow "int4 gated, CPU experts" "${p[@]}" --prefetch 0 --expert-variant int4 --low none --cpu-experts -t "$(nproc)"
  best=$n; bts=0
  for k in $n $((n + 1)); do
    [ "$k" -le "$gl" ] || continue
    row=$(timeout 300 $L/build/bin/llama-bench -m "$gg-Q4_K_M.gguf" -ngl 99 --n-cpu-moe "$k" -t "$(nproc)" "${r[@]}" \
      -o md 2>>"$log" | grep -v '^| ---\|^| model' | sed "s#^|#| llama.cpp Q4_K_M n-cpu-moe $k |#")
    echo "$row" >> "$out/qwen3.md"
    ts=$(echo "$row" | grep tg64 | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
    python3 -c "import sys; sys.exit(0 if float('${ts:-0}') > float('$bts') else 1)" && { best=$k; bts=$ts; }
  done
  { echo ""; echo "| round | hob int4+int2 t/s | hob int4 t/s | hob int4 gated t/s | llama.cpp Q4_K_M --n-cpu-moe $best t/s |"
    echo "|---|---:|---:|---:|---:|"; } >> "$out/qwen3.md"
  tg='import json, sys; print(next(r["avg_ts"] for r in json.load(sys.stdin) if r["n_gen"] > 0 and r["n_prompt"] == 0))'
  q=(--platform rtx4060ti-16g --cache-policy hobbit --expert-cache "$c" --expert-variant int4 --cpu-experts \
     -t "$(nproc)" -r 3 -p 0 -n 64 -o json)
  for i in $(seq 1 "${ROUNDS:-2}"); do
    h2=$(timeout 120 "$hob" bench -m "$model" "${q[@]}" --low int2 --prefetch 3 2>>"$log" | python3 -c "$tg" 2>>"$log")
    h4=$(timeout 120 "$hob" bench -m "$model" "${q[@]}" --low none --prefetch 3 2>>"$log" | python3 -c "$tg" 2>>"$log")
    hg=$(timeout 120 "$hob" bench -m "$model" "${q[@]}" --low none --prefetch 0 2>>"$log" | python3 -c "$tg" 2>>"$log")
    l=$(timeout 120 $L/build/bin/llama-bench -m "$gg-Q4_K_M.gguf" -ngl 99 --n-cpu-moe "$best" -t "$(nproc)" -p 0 -n 64 \
      -r 3 -o json 2>>"$log" | python3 -c "$tg" 2>>"$log")
    echo "| $i | ${h2:-failed} | ${h4:-failed} | ${hg:-failed} | ${l:-failed} |" >> "$out/qwen3.md"
  done
  mv "$out/qwen3.md" "$out/$1.md"; cat "$out/$1.md" ;;
oss120)
  # Issue 53: gpt-oss-120b's shape (OSS_LAYERS of its 36, default 6; 128 experts of 2880 x 2880, top-4) under
  # rtx4090-24g and rtx4060ti-16g. hob: the experts in mxfp4 (+ int2 low) with int8 dense, cooperative CPU
  # experts; llama.cpp: MXFP4 experts and Q8_0 dense (llama-quantize MXFP4_MOE of an MXFP4 GGUF,
  # tools/make_synthetic_gguf.py --mxfp4-experts) at the --n-cpu-moe splits that fit and one more, then
  # ROUNDS alternated tg64 rounds at the best split. Full model: 4608 experts of 13221888 bytes (hob mxfp4,
  # padded) / 13219200 (ggml MXFP4); non-expert weights 2.13e9 values: hob int8 2.2e9 bytes, Q8_0 2.26e9.
  ol="${OSS_LAYERS:-6}"; eh=13221888; dh=2.2e9; el=13219200; dl=2.26e9
  model=/tmp/gpt-oss-120b-${ol}l.hob; gg=/tmp/gpt-oss-120b-${ol}l
  [ -f "$model" ] && [ -f "$gg-mxfp4.gguf" ] || make_room 40 "$model" "$gg-mxfp4.gguf"
  llama_ready >> "$log" 2>&1
  t0=$(date +%s)
  [ -f "$model" ] || "$hob" convert --synthetic gpt-oss-120b --layers "$ol" --experts mxfp4,int2 --dense int8 \
    -o "$model" --no-progress >> "$log" 2>&1
  if [ ! -f "$gg-mxfp4.gguf" ]; then
    PYTHONPATH=$L/llama.cpp/gguf-py python3 tools/make_synthetic_gguf.py "$gg-src.gguf" --model gpt-oss-120b \
      --layers "$ol" --mxfp4-experts 2>/dev/null >> "$log"
    $L/build/bin/llama-quantize --allow-requantize "$gg-src.gguf" "$gg-mxfp4.gguf" MXFP4_MOE "$(nproc)" \
      > /tmp/quantize-oss.log 2>&1 || tail -3 /tmp/quantize-oss.log; rm -f "$gg-src.gguf"
  fi
  echo "oss120 prepared in $(( $(date +%s) - t0 )) s" >> "$log"; ls -l "$model" "$gg-mxfp4.gguf" >> "$log"
  [ "${PREPARE_ONLY:-0}" = 1 ] && { tail -3 "$log"; exit 0; }
  share() { python3 -c "print(max(0.0, min(1.0, ($3*2**30 - $2 - 1e9) / (4608*$1))))"; }
  echo "| who, row | model | size | params | backend | ... | test | t/s | (hob: hit rate, exp/tok, MB/tok, link GB/s, limit t/s, % limit, projected t/s; llama.cpp: ngl, n_cpu_moe) |" > "$out/qwen3.md"
  echo "|---|---|---|---|---|---|---|---|---|" >> "$out/qwen3.md"
  tg='import json, sys; print(next(r["avg_ts"] for r in json.load(sys.stdin) if r["n_gen"] > 0 and r["n_prompt"] == 0))'
  for prof in ${OSS_PROFILES:-rtx4090-24g:24 rtx4060ti-16g:16}; do
    name=${prof%%:*}; gib=${prof##*:}
    fh=$(share "$eh" "$dh" "$gib"); fl=$(share "$el" "$dl" "$gib")
    c=$(python3 -c "print(f'{$fh*$ol*128*$eh/2**30:.3f}')")
    n=$(python3 -c "import math; print(min($ol, math.ceil($ol*(1-$fl) - 1e-9)))")
    echo "$name, $ol of 36 layers: hob mxfp4 share $fh (--expert-cache $c GiB); llama.cpp MXFP4 share $fl (--n-cpu-moe $n fits)" >> "$out/qwen3.md"
    r=(-r 2 -p 512 -n 64)
    p=(--platform "$name" --cache-policy hobbit --expert-cache "$c" --cpu-experts -t "$(nproc)")
    hobrow "$name mxfp4+int2, CPU experts" "${p[@]}" "${r[@]}" --prefetch 3 --expert-variant mxfp4 --low int2
    hobrow "$name mxfp4, CPU experts" "${p[@]}" "${r[@]}" --prefetch 3 --expert-variant mxfp4 --low none
    # Gated decode (routed on the device, held at a layer's gate only on a miss): one precision, no prefetch.
    hobrow "$name mxfp4 gated, CPU experts" "${p[@]}" "${r[@]}" --prefetch 0 --expert-variant mxfp4 --low none
    best=$n; bts=0
    for k in $n $((n + 1)); do
      [ "$k" -le "$ol" ] || continue
      row=$(timeout 300 $L/build/bin/llama-bench -m "$gg-mxfp4.gguf" -ngl 99 --n-cpu-moe "$k" -t "$(nproc)" "${r[@]}" \
        -o md 2>>"$log" | grep -v '^| ---\|^| model' | sed "s#^|#| llama.cpp $name MXFP4 n-cpu-moe $k |#")
      echo "$row" >> "$out/qwen3.md"
      ts=$(echo "$row" | grep tg64 | awk -F'|' '{print $(NF-1)}' | awk '{print $1}')
      python3 -c "import sys; sys.exit(0 if float('${ts:-0}') > float('$bts') else 1)" && { best=$k; bts=$ts; }
    done
    { echo ""; echo "| $name round | hob mxfp4+int2 t/s | hob mxfp4 t/s | hob mxfp4 gated t/s | llama.cpp MXFP4 --n-cpu-moe $best t/s |"
      echo "|---|---:|---:|---:|---:|"; } >> "$out/qwen3.md"
    q=("${p[@]}" --expert-variant mxfp4 -r 3 -p 0 -n 64 -o json)
    for i in $(seq 1 "${ROUNDS:-1}"); do
      h2=$(timeout 120 "$hob" bench -m "$model" "${q[@]}" --prefetch 3 --low int2 2>>"$log" | python3 -c "$tg" 2>>"$log")
      h4=$(timeout 120 "$hob" bench -m "$model" "${q[@]}" --prefetch 3 --low none 2>>"$log" | python3 -c "$tg" 2>>"$log")
      hg=$(timeout 120 "$hob" bench -m "$model" "${q[@]}" --prefetch 0 --low none 2>>"$log" | python3 -c "$tg" 2>>"$log")
      l=$(timeout 120 $L/build/bin/llama-bench -m "$gg-mxfp4.gguf" -ngl 99 --n-cpu-moe "$best" -t "$(nproc)" -p 0 -n 64 \
        -r 3 -o json 2>>"$log" | python3 -c "$tg" 2>>"$log")
      echo "| $i | ${h2:-failed} | ${h4:-failed} | ${hg:-failed} | ${l:-failed} |" >> "$out/qwen3.md"
    done
    echo "" >> "$out/qwen3.md"
  done
  mv "$out/qwen3.md" "$out/oss120.md"; cat "$out/oss120.md" ;;
deepseek)
  # DeepSeek-V2-Lite, all 27 layers (llama.cpp reads a 27-layer deepseek2 as the Lite shape, without q_lora):
  # hob int4 experts (26 x 64 x 4866048 bytes, 8.1e9) + int8 dense (1.3e9) fits a 16 GB card whole, as does
  # llama.cpp's Q4_K_M (~10.4e9): both all on the GPU under rtx4060ti-16g, alternated ROUNDS times.
  model=/tmp/dsv2-lite.hob; gg=/tmp/dsv2-lite
  # The f16 GGUF ~31 GB, its Q4_K_M ~10, the .hob ~9.
  [ -f "$model" ] && [ -f "$gg-Q4_K_M.gguf" ] || make_room 52 "$model" "$gg-Q4_K_M.gguf"
  llama_ready >> "$log" 2>&1 &
  [ -f "$model" ] || "$hob" convert --synthetic deepseek-v2-lite --experts int4 --dense int8 -o "$model" \
    --no-progress >> "$log" 2>&1 &
  if [ ! -f "$gg-Q4_K_M.gguf" ]; then
    mkdir -p /tmp/gg && tar xJf .gpu/gguf-py.tar.xz -C /tmp/gg
    PYTHONPATH=/tmp/gg/llama.cpp/gguf-py python3 tools/make_synthetic_gguf.py "$gg-f16.gguf" --model deepseek-v2-lite \
      --layers 27 2>/dev/null >> "$log"
    wait
    $L/build/bin/llama-quantize "$gg-f16.gguf" "$gg-Q4_K_M.gguf" Q4_K_M "$(nproc)" > /tmp/quantize-ds.log 2>&1 \
      || tail -3 /tmp/quantize-ds.log; rm -f "$gg-f16.gguf"
  fi
  wait
  # hob from llama.cpp's own file too (its defaults: int4/g32 experts and Q4_K dense on their grids, Q6_K int8).
  gm=/tmp/dsv2-lite-gguf.hob
  if [ "${FROM_GGUF:-0}" = 1 ] && [ ! -f "$gm" ]; then
    /usr/bin/time -f "convert from the GGUF: %e s, %P CPU, peak RSS %M KB" "$hob" convert --from "$gg-Q4_K_M.gguf" \
      -o "$gm" --no-progress >> "$log" 2>&1
  fi
  ls -l "$model" "$gg-Q4_K_M.gguf" "$gm" >> "$log" 2>&1
  [ "${PREPARE_ONLY:-0}" = 1 ] && exit 0
  echo "| who, row | model | size | params | backend | ... | test | t/s | (hob: hit rate, exp/tok, MB/tok, link GB/s, limit t/s, % limit; llama.cpp: ngl) |" > "$out/qwen3.md"
  echo "|---|---|---|---|---|---|---|---|---|" >> "$out/qwen3.md"
  for round in $(seq 1 "${ROUNDS:-2}"); do
    hobrow "$round: int4 + int8 dense, rtx4060ti-16g" --platform rtx4060ti-16g -r 3 -p 512 -n 64
    [ -f "$gm" ] && model="$gm" hobrow "$round: from the Q4_K_M GGUF, rtx4060ti-16g" --platform rtx4060ti-16g \
      --expert-variant int4 --low none -r 3 -p 512 -n 64
    llrow "$round: Q4_K_M, all layers on the GPU" "$gg-Q4_K_M.gguf" -r 3 -p 512 -n 64
  done
  mv "$out/qwen3.md" "$out/deepseek.md"; cat "$out/deepseek.md" ;;
roundtrip)
  bash tools/kernel_trace.sh build >> "$log" 2>&1 || exit 1
  model=/tmp/qwen3-synthetic-${LAYERS}l-int4.hob
  [ -f "$model" ] || "$hob" convert --synthetic qwen3-30b-a3b --layers "$LAYERS" --experts int4 -o "$model" --no-progress \
    >> "$log" 2>&1
  # The 16 GB card's link and memory cap, its memory figure the device's (no projection run in the trace).
  sed -e 's/^name = .*/name = "rtx4060ti-16g-unprojected"/' -e 's/^memory_bandwidth_gbs = .*/memory_bandwidth_gbs = 3350/' \
    platforms/rtx4060ti-16g.toml > /tmp/p16.toml
  c4=$(cache "$(frac 16 $E_INT4 $D_F16)" $E_INT4)
  b=(bench -m "$model" --expert-variant int4 --low none -p 0 -n 32 -r 1)
  : > "$out/roundtrip.md"
  for mode in resident offloaded; do
    a=(--platform h100)
    [ $mode = offloaded ] && a=(--platform /tmp/p16.toml --cache-policy hobbit --prefetch 3 --cpu-experts -t "$(nproc)"
      --expert-cache "$c4" --stats)
    "$hob" "${b[@]}" "${a[@]}" > /tmp/rt-$mode.txt 2>&1
    HOB_KTRACE=/tmp/rt-$mode.csv HOB_KTRACE_API=1 LD_PRELOAD=$PWD/.gpu/libkernel_trace.so "$hob" "${b[@]}" "${a[@]}" \
      >> "$log" 2>&1
    { echo "## $mode"; grep -E "tg32:|hit rate|host per token|host in the engine" /tmp/rt-$mode.txt; echo '```'
      python3 tools/kernel_trace.py /tmp/rt-$mode.csv --skip 0.3 --gap-us 8 | head -80
      python3 tools/kernel_trace.py /tmp/rt-$mode.csv --skip 0.3 --timeline 12 | head -150; echo '```'; } >> "$out/roundtrip.md"
  done
  cat "$out/roundtrip.md" ;;
timeline)
  # One resident decode token's kernels in order (where a layer's time goes beyond its bytes' time): PRESET
  # (default qwen3-30b-a3b) of LAYERS layers, int4 experts, DENSE (default f16) dense weights, all on the GPU.
  bash tools/kernel_trace.sh build >> "$log" 2>&1 || exit 1
  pre=${PRESET:-qwen3-30b-a3b}; dn=${DENSE:-f16}; model=/tmp/tl-$pre-${LAYERS}l-$dn.hob
  [ -f "$model" ] || "$hob" convert --synthetic "$pre" --layers "$LAYERS" --experts int4 --dense "$dn" -o "$model" \
    --no-progress >> "$log" 2>&1
  b=(bench -m "$model" -p 0 -n 32 -r 1 --platform h100)
  "$hob" "${b[@]}" > /tmp/tl.txt 2>&1
  HOB_KTRACE=/tmp/tl.csv LD_PRELOAD=$PWD/.gpu/libkernel_trace.so "$hob" "${b[@]}" >> "$log" 2>&1
  { echo "## $pre, $LAYERS layers, int4 experts, $dn dense, resident"; grep -E "tg32" /tmp/tl.txt; echo '```'
    python3 tools/kernel_trace.py /tmp/tl.csv --skip 0.3 | head -60
    python3 tools/kernel_trace.py /tmp/tl.csv --skip 0.3 --timeline 12 | head -120; echo '```'; } > "$out/timeline-$pre.md"
  cat "$out/timeline-$pre.md" ;;
whole)
  [ -n "${TRACE:-}" ] && [ -n "${T1:-}" ] && [ -n "${T2:-}" ] \
    || { echo "whole: set TRACE, T1 and T2 from \`families_gpu.sh trace\` (its trace.env) first"; exit 2; }
  llama_ready >> "$log" 2>&1
  wg=/tmp/qwen3-synthetic-48l-Q4_K_M.gguf; model=/tmp/qwen3-synthetic-48l.hob
  [ -f "$wg" ] || PYTHONPATH=$L/llama.cpp/gguf-py python3 tools/make_synthetic_gguf.py "$wg" --model qwen3-30b-a3b \
    --layers 48 --q4-k-m > /dev/null 2>> "$log"
  [ -f "$model" ] || "$hob" convert --synthetic qwen3-30b-a3b --layers 48 --experts int4,int2 -o "$model" --no-progress \
    >> "$log" 2>&1
  LAYERS=48; r=(-r 3 -p 512 -n 64)
  echo "| who, row | model | size | params | backend | ... | test | t/s | (hob: hit rate, exp/tok, MB/tok, link GB/s, limit t/s, % limit, projected t/s; llama.cpp: ngl, n_cpu_moe) |" > "$out/qwen3.md"
  echo "|---|---|---|---|---|---|---|---|---|" >> "$out/qwen3.md"
  hobrow "int4, all on the GPU (rtx4090-24g's cap)" --platform rtx4090-24g --expert-variant int4 --low none "${r[@]}"
  llrow "Q4_K_M, all on the GPU" "$wg" "${r[@]}"
  for prof in rtx4060ti-16g:16 rtx3060-12g:12; do
    name=${prof%%:*}; gib=${prof##*:}
    c4=$(cache "$(frac "$gib" $E_INT4 $D_F16)" $E_INT4); n4=$(ncpu "$(frac "$gib" $E_Q4KM $D_Q4KM)")
    echo "$name: hob --expert-cache $c4 GiB; llama.cpp --n-cpu-moe $n4 fits" >> "$out/qwen3.md"
    p=(--platform "$name" --replay-trace "$TRACE" --cache-policy hobbit --prefetch 3 --cpu-experts -t "$(nproc)"
       --expert-cache "$c4" "${r[@]}")
    hobrow "$name int4, CPU experts" "${p[@]}" --expert-variant int4 --low none
    hobrow "$name int4+int2 T1 $T1 T2 $T2, CPU experts" "${p[@]}" --expert-variant int4 --low int2 --t1 "$T1" --t2 "$T2"
    for n in $n4 $((n4 + 1)); do llrow "$name Q4_K_M n-cpu-moe $n" "$wg" --n-cpu-moe "$n" "${r[@]}"; done
  done
  mv "$out/qwen3.md" "$out/whole.md"; cat "$out/whole.md" ;;
gated-files)
  # What `gated` needs, alone (a call that runs tests on the GPU meanwhile).
  R=/tmp/gated; mkdir -p $R; gated_files ;;
gated)
  # Gated decode (src/experts/engine/gated.rs) beside the host-routed path and llama.cpp, all 48 layers, the
  # trained router's routing replayed on the device; two rounds, alternated. Resumable: what a call cut off by
  # the device tool's limit finished (files, the trace, rows: /tmp/gated) the next call on the machine skips.
  R=/tmp/gated; mkdir -p $R; gated_files
  TRACE=${TRACE:-/tmp/q3r-trace.jsonl}
  [ -f "$TRACE" ] && [ -f "$wg" ] && [ -f "$model" ] || { echo "gated: no trace, GGUF or .hob (see $log)"; exit 1; }
  LAYERS=48; r=(-r 2 -p 512 -n 64)
  resume_rows
  for round in 1 2; do
    for prof in rtx4060ti-16g:16 rtx3060-12g:12; do
      name=${prof%%:*}; gib=${prof##*:}
      c4=$(cache "$(frac "$gib" $E_INT4 $D_F16)" $E_INT4); n4=$(ncpu "$(frac "$gib" $E_Q4KM $D_Q4KM)")
      p=(--platform "$name" --replay-trace "$TRACE" --cache-policy hobbit --expert-cache "$c4" --expert-variant int4
         --low none "${r[@]}")
      once "$round-$name-g" hobrow "$name int4 gated (no CPU experts, no prefetch), round $round" "${p[@]}" --prefetch 0
      once "$round-$name-l" llrow "$name Q4_K_M n-cpu-moe $n4, round $round" "$wg" --n-cpu-moe "$n4" "${r[@]}"
      once "$round-$name-h" hobrow "$name int4 host-routed (CPU experts, prefetch 3), round $round" "${p[@]}" \
        --prefetch 3 --cpu-experts -t "$(nproc)"
      once "$round-$name-gc" hobrow "$name int4 gated + CPU experts (no prefetch), round $round" "${p[@]}" \
        --prefetch 0 --cpu-experts -t "$(nproc)"
    done
  done
  cp $R/rows.md "$out/gated.md"; cat "$out/gated.md" ;;
q8)
  # The Q8_0 quality class (the issue's int8 + int4 rows): hob int8 experts, gated with CPU experts and
  # host-routed (alone, and with an int4 low tier at T1/T2), beside llama.cpp's Q8_0 written directly
  # (make_synthetic_gguf.py --q8-0) at its fitting --n-cpu-moe; Q8_LAYERS of the 48 layers (default 32: the two
  # files, 52 GB, fit the device's disk once other modes' files are gone: make_room), the trained
  # router's routing replayed, two rounds alternated, resumable as `gated`.
  R=/tmp/q8; mkdir -p $R
  LAYERS=${Q8_LAYERS:-32}; TRACE=${TRACE:-/tmp/q3r-trace.jsonl}
  wg=/tmp/qwen3-synthetic-${LAYERS}l-Q8_0.gguf; model=/tmp/qwen3-synthetic-${LAYERS}l-int8-int4.hob
  if [ ! -f "$wg" ] || [ ! -f "$model" ] || [ ! -f "$TRACE" ]; then
    make_room 55 "$wg" "$model"
    llama_ready >> "$log" 2>&1 &
    # A fresh machine trains the router (GPU) beside the build (CPU) and the two files (disk).
    [ -f "$TRACE" ] || BUDGET=${BUDGET:-110} bash "$0" trace > $R/trace.log 2>&1 &
    if [ ! -f "$wg" ]; then
      mkdir -p $R/gg && tar xJf .gpu/gguf-py.tar.xz -C $R/gg
      PYTHONPATH=$R/gg/llama.cpp/gguf-py python3 tools/make_synthetic_gguf.py "$wg.part" --model qwen3-30b-a3b \
        --layers "$LAYERS" --q8-0 > /dev/null 2>> "$log" && mv "$wg.part" "$wg" &
    fi
    [ -f "$model" ] || "$hob" convert --synthetic qwen3-30b-a3b --layers "$LAYERS" --experts int8,int4 -o "$model" \
      --no-progress >> "$log" 2>&1 &
    wait
  fi
  [ -f "$wg" ] && [ -f "$model" ] && [ -f "$TRACE" ] || { echo "q8: no GGUF, .hob or trace (see $log)"; exit 1; }
  [ "${PREPARE_ONLY:-0}" = 1 ] && { ls -l "$wg" "$model" "$TRACE"; exit 0; }
  # T1/T2 as `trace` fitted them on this machine, else the values of 2026-12-06's router.
  [ -z "${T1:-}" ] && [ -f "$out/trace.env" ] && . "$out/trace.env"
  T1=${T1:-0.793}; T2=${T2:-0.952}
  r=(-r 2 -p 512 -n 64)
  resume_rows
  for round in 1 2; do
    for prof in rtx4060ti-16g:16 rtx3060-12g:12; do
      name=${prof%%:*}; gib=${prof##*:}
      c8=$(cache "$(frac "$gib" $E_INT8 $D_F16)" $E_INT8); n8=$(ncpu "$(frac "$gib" $E_Q8 $D_Q8)")
      p=(--platform "$name" --replay-trace "$TRACE" --cache-policy hobbit --expert-cache "$c8" --expert-variant int8
         "${r[@]}" --cpu-experts -t "$(nproc)")
      once "$round-$name-g" hobrow "$name int8 gated + CPU experts, $LAYERS layers, round $round" "${p[@]}" --low none \
        --prefetch 0
      once "$round-$name-l" llrow "$name Q8_0 n-cpu-moe $n8, $LAYERS layers, round $round" "$wg" --n-cpu-moe "$n8" "${r[@]}"
      once "$round-$name-h" hobrow "$name int8 host-routed, CPU experts, prefetch 3, round $round" "${p[@]}" --low none \
        --prefetch 3
      once "$round-$name-hl" hobrow "$name int8 + int4 low T1 $T1 T2 $T2, CPU experts, prefetch 3, round $round" \
        "${p[@]}" --low int4 --t1 "$T1" --t2 "$T2" --prefetch 3
    done
  done
  cp $R/rows.md "$out/q8.md"; cat "$out/q8.md" ;;
*) echo "usage: families_gpu.sh prepare|qwen3|whole|gated-files|gated|q8|roundtrip|timeline|dense|gguf|trace|replay|int3|lowbits|phi-trace|phi|hobbit|gptoss|glm|flash|deepseek|oss120"; exit 2 ;;
esac
