#!/usr/bin/env bash
# CPU decode and prefill of hob beside llama.cpp on the same weights and threads, rounds alternated, written as a
# dated table to benches/results/ (issue 56: re-measure this row on every machine hob meets).
#
#   bash tools/bench_cpu.sh [HF_DIR] [THREADS] [ROUNDS]
#
# HF_DIR: a Hugging Face MoE checkpoint (default models/smollm2-moe-hf, from tools/demo.sh). THREADS: a comma list
# (default: 2 and every core). ROUNDS: alternations of the whole set (default 2). Each pair below is converted once
# into $WORK (default /work/bench-cpu): hob by `hob convert`, llama.cpp by tools/llamacpp.sh (build it first:
# `bash tools/llamacpp.sh build`). Each round runs, per thread count and pair, `hob bench` then `llama-bench`, both
# -p 128 -n 64 -r 3; the table lists every round's mean, so drift on a shared machine shows.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
hf=${1:-$root/models/smollm2-moe-hf}
threads=${2:-$(printf "%s\n" 2 "$(nproc)" | sort -nu | paste -sd,)}
rounds=${3:-2}
work=${WORK:-/work/bench-cpu}
hob="$root/target/release/hob"
llama_bin="${LLAMA_DIR:-/work/llama}/build/bin"
[ -x "$hob" ] || { echo "bench_cpu: build first: cargo build --release" >&2; exit 1; }
[ -x "$llama_bin/llama-bench" ] || { echo "bench_cpu: run 'bash tools/llamacpp.sh build' first" >&2; exit 1; }
[ -f "$hf/config.json" ] || { echo "bench_cpu: $hf has no config.json (run tools/demo.sh)" >&2; exit 1; }
mkdir -p "$work"

# name | hob experts | hob --dense | llama.cpp type. The 4-bit pair is the one that matches Q4_K_M's perplexity at
# no more bytes (int4/g32 experts, int8 dense: benches/results/2026-12-02-cpu-issue56-cpu-path.md).
pairs=(
    "f16|f16|f16|f16"
    "int8|int8|int8|q8_0"
    "int4g32-d8|int4/g32|int8|q4_k_m"
)
for p in "${pairs[@]}"; do
    IFS='|' read -r name experts dense qtype <<<"$p"
    [ -f "$work/$name.hob" ] || "$hob" convert --from "$hf" -o "$work/$name.hob" --experts "$experts" \
        --dense "$dense" --no-progress >/dev/null
    [ -f "$work/$qtype.gguf" ] || bash "$root/tools/llamacpp.sh" convert "$hf" "$work/$qtype.gguf" "$qtype" >/dev/null
done

rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
# One run of each engine: "engine|pair|threads|test|t/s" lines.
run_hob() {
    "$hob" bench -m "$work/$1.hob" --device cpu -t "$2" -p 128 -n 64 -r 3 -o json 2>/dev/null | python3 -c '
import json, sys
for r in json.load(sys.stdin):
    print("hob|%s|%s|%s|%.2f" % (sys.argv[1], sys.argv[2], r["test"], r["avg_ts"]))' "$1" "$2"
}
run_llama() {
    "$llama_bin/llama-bench" -m "$work/$2.gguf" -t "$3" -p 128 -n 64 -r 3 -o csv 2>/dev/null | python3 -c '
import csv, sys
for r in csv.DictReader(sys.stdin):
    test = "pp%s" % r["n_prompt"] if int(r["n_prompt"]) > 0 else "tg%s" % r["n_gen"]
    print("llama.cpp|%s|%s|%s|%.2f" % (sys.argv[1], sys.argv[2], test, float(r["avg_ts"])))' "$1" "$3"
}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq "$rounds"); do
    for t in ${threads//,/ }; do
        for p in "${pairs[@]}"; do
            IFS='|' read -r name _ _ qtype <<<"$p"
            echo "bench_cpu: round $round, $t threads, $name" >&2
            run_hob "$name" "$t" >>"$rows"
            run_llama "$name" "$qtype" "$t" >>"$rows"
        done
    done
done

out="$root/benches/results/$(date +%F)-cpu-$(hostname -s)-vs-llamacpp.md"
[ -e "$out" ] && out="${out%.md}-$(date +%H%M).md"
python3 - "$rows" "$work" "$load_before" "$(cut -d' ' -f1-3 /proc/loadavg)" >"$out" <<'EOF'
import collections, os, platform, subprocess, sys
rows, work, before, after = sys.argv[1:5]
runs = collections.defaultdict(list)
for line in open(rows):
    engine, pair, t, test, ts = line.strip().split("|")
    runs[(pair, int(t), test, engine)].append(float(ts))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"# CPU: hob beside llama.cpp, {platform.node()}\n")
print(f"{cpu}, {os.cpu_count()} cores; load average {before} before, {after} after. `tools/bench_cpu.sh`: "
      "`hob bench --device cpu -p 128 -n 64 -r 3` and `llama-bench -p 128 -n 64 -r 3`, alternated; "
      "each cell lists every round's mean (tokens/s).\n")
print("| weights (hob / llama.cpp) | file bytes (hob / gguf) | threads | test | hob | llama.cpp | hob / llama.cpp |")
print("|---|---|---:|---|---|---|---:|")
names = {"f16": "f16", "int8": "q8_0", "int4g32-d8": "q4_k_m"}
for (pair, t, test) in sorted({k[:3] for k in runs}, key=lambda k: (k[1], list(names).index(k[0]), k[2])):
    h, l = runs[(pair, t, test, "hob")], runs[(pair, t, test, "llama.cpp")]
    sizes = f"{os.path.getsize(f'{work}/{pair}.hob') / 1e6:.0f} MB / {os.path.getsize(f'{work}/{names[pair]}.gguf') / 1e6:.0f} MB"
    ratio = (sum(h) / len(h)) / (sum(l) / len(l)) if h and l else float("nan")
    fmt = lambda v: ", ".join(f"{x:.1f}" for x in v)
    print(f"| {pair} / {names[pair]} | {sizes} | {t} | {test} | {fmt(h)} | {fmt(l)} | {ratio:.2f}x |")
EOF
echo "bench_cpu: wrote $out" >&2
cat "$out"
