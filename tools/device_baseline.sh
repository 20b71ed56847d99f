#!/usr/bin/env bash
# A new device machine's figures in one device call (~90 s on the H200, 2026-11-28), after
# `bash tools/stage_gpu.sh gpu_backend gpu_engine experts_loader cli_bench cli_replay cli_sim`:
#   carry [".gpu"], command "bash tools/device_baseline.sh"
# -> $OUT/machine.txt (GPU, CPU flags, memory, disk), the staged GPU tests ($OUT/tests-summary.txt),
#    gpu_matvec (device copy figure and every kernel's share, $OUT/gpu_matvec.md), cpu_stream with
#    every core ($OUT/cpu_stream.md), the disk's O_DIRECT read, and resident decode of an 8-layer
#    Mixtral-shaped model with the limit from this device's measured copy and link (no --platform),
#    plus the loader's link rate with a small f16 cache ($OUT/bench.md, $OUT/bench.log, which also
#    holds the progress stamps). With run.sh's tests.log and nvidia-smi.txt that is 8 files, the
#    device tool's limit: add none without folding another in.
# Write a platforms/NAME.toml from these (benches/results/2026-11-28-h200-baseline.md did).
set -u
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$out/bench.log"; }
{
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|Socket|NUMA node|L3"
  grep -o -w -E "avx512_vnni|avx512bw|avx512f|avx512_fp16|amx_tile|avx_vnni" /proc/cpuinfo | sort | uniq -c
  free -g; df -h /tmp
  echo "== disk: 4 GiB written, then read with O_DIRECT in 8 MiB blocks"
  dd if=/dev/zero of=/tmp/disk.bin bs=8M count=512 oflag=direct 2>&1 | tail -1
  dd if=/tmp/disk.bin of=/dev/null bs=8M iflag=direct 2>&1 | tail -1
  rm -f /tmp/disk.bin
} > "$out/machine.txt" 2>&1
stamp machine
[ -x .gpu/run.sh ] && { timeout 300 bash .gpu/run.sh tests > "$out/tests-summary.txt" 2>&1; stamp "tests rc=$?"; }
timeout 150 .gpu/benches/gpu_matvec > "$out/gpu_matvec.md" 2>&1; stamp "gpu_matvec rc=$?"
timeout 60 .gpu/benches/cpu_stream "$(nproc)" > "$out/cpu_stream.md" 2>&1; stamp "cpu_stream rc=$?"
m=/tmp/baseline-8l.hob
"$hob" convert --synthetic mixtral-8x7b --layers 8 --experts f16,int4,int2 -o $m --no-progress >> "$out/bench.log" 2>&1
stamp convert
for v in int4/g64 int2/g64 f16; do
  echo "== resident $v" >> "$out/bench.log"
  timeout 90 "$hob" bench -m $m --expert-variant $v -p 0 -n 64 -r 3 >> "$out/bench.md" 2>> "$out/bench.log"
  stamp "resident $v"
done
echo "== the loader's link: f16, 2 GiB cache" >> "$out/bench.log"
timeout 90 "$hob" bench -m $m --expert-variant f16 --expert-cache 2 -p 0 -n 16 -r 2 >> "$out/bench.md" 2>> "$out/bench.log"
stamp link
