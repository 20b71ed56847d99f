#!/usr/bin/env bash
# CPU decode and prefill speed of hob next to llama.cpp, same machine, same thread count, same weights.
#
#   bash tools/bench_cpu.sh HOB_FILE GGUF_DIR [THREADS] [REPS]
#
# HOB_FILE: the demo model converted by tools/demo.sh (models/smollm2-moe.hob, all four variants).
# GGUF_DIR: the same checkpoint converted by tools/llamacpp.sh (smollm2-moe-{f16,q8_0,q4_0}.gguf).
# hob is timed by its own summary (`hob run --ignore-eos`): tg64 = 64 generated tokens after a short prompt,
# pp128 = a 128-token prompt; llama.cpp by llama-bench (-n 64 / -p 128). Mean ± sd over REPS runs.
set -euo pipefail
hob_file=${1:?usage: bench_cpu.sh HOB_FILE GGUF_DIR [THREADS] [REPS]}
gguf_dir=${2:?usage: bench_cpu.sh HOB_FILE GGUF_DIR [THREADS] [REPS]}
threads=${3:-$(nproc)}
reps=${4:-3}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
hob="$root/target/release/hob"
[ -x "$hob" ] || { echo "bench_cpu: build first: cargo build --release" >&2; exit 1; }

# A prompt of exactly 128 tokens is not needed: hob reports its prompt length and rate.
pp_prompt=$(python3 -c 'print(" ".join(["The history of France is long and full of kings."] * 13))')

stats() { python3 -c 'import sys,statistics as s; v=[float(x) for x in sys.argv[1:]]; print(f"{s.mean(v):.2f} ± {s.stdev(v) if len(v)>1 else 0:.2f}")' "$@"; }

hob_rate() { # variant, mode (tg|pp) -> tokens/s of one run
    local out
    if [ "$2" = tg ]; then
        out=$("$hob" run -m "$hob_file" --expert-variant "$1" -t "$threads" --no-chat -p "Once upon a time" \
              -n 64 --temp 0 --ignore-eos 2>&1 >/dev/null)
        echo "$out" | sed -n 's/^generation: .*(\([0-9.]*\) tokens\/s)$/\1/p'
    else
        out=$("$hob" run -m "$hob_file" --expert-variant "$1" -t "$threads" --no-chat -p "$pp_prompt" \
              -n 1 --temp 0 --ignore-eos 2>&1 >/dev/null)
        echo "$out" | sed -n 's/^prompt: \([0-9]*\) tokens.*(\([0-9.]*\) tokens\/s)$/\2/p'
    fi
}

echo "| engine | weights (experts) | threads | test | tokens/s |"
echo "|---|---|---|---|---|"
for v in f16 int8 int4 int2; do
    for mode in tg pp; do
        rates=()
        for _ in $(seq "$reps"); do rates+=("$(hob_rate "$v" "$mode")"); done
        name=$([ "$mode" = tg ] && echo tg64 || echo pp128)
        echo "| hob | $v (dense f16) | $threads | $name | $(stats "${rates[@]}") |"
    done
done
bench="${LLAMA_DIR:-/work/llama}/build/bin/llama-bench"
for q in f16 q8_0 q4_0; do
    m="$gguf_dir/smollm2-moe-$q.gguf"
    [ -f "$m" ] || { echo "| llama.cpp | $q | - | - | missing $m |"; continue; }
    "$bench" -m "$m" -t "$threads" -r "$reps" -p 128 -n 64 -o csv 2>/dev/null \
        | python3 -c '
import csv, sys
rows = list(csv.DictReader(sys.stdin))
for r in rows:
    test = "pp%s" % r["n_prompt"] if int(r["n_prompt"]) > 0 else "tg%s" % r["n_gen"]
    print("| llama.cpp | %s (all tensors) | %s | %s | %.2f ± %.2f |" % (sys.argv[1], r["n_threads"], test, float(r["avg_ts"]), float(r["stddev_ts"])))
' "$q"
done
