#!/usr/bin/env bash
# Build tools/kernel_trace.c on the device machine (nvcc and CUPTI from the CUDA toolkit) into
# .gpu/libkernel_trace.so. Usage: bash tools/kernel_trace.sh build
set -euo pipefail
cuda=${CUDA_HOME:-/usr/local/cuda}
inc=$(dirname "$(find "$cuda"/ -name cupti.h 2>/dev/null | head -1)")
lib=$(dirname "$(find "$cuda"/ -name 'libcupti.so*' 2>/dev/null | head -1)")
[ -n "$inc" ] && [ -n "$lib" ] || { echo "kernel_trace: no CUPTI under $cuda" >&2; exit 1; }
# The newest kernel record the headers have (CUpti_ActivityKernelN).
krec=$(grep -ho 'CUpti_ActivityKernel[0-9]*' "$inc"/cupti_activity*.h | sort -V | tail -1)
mrec=$(grep -ho 'CUpti_ActivityMemcpy[0-9]*\b' "$inc"/cupti_activity*.h | sort -V | tail -1)
mkdir -p .gpu
gcc -O2 -shared -fPIC -DKREC="$krec" -DMREC="$mrec" -I"$inc" -I"$cuda/include" tools/kernel_trace.c \
  -L"$lib" -Wl,-rpath,"$lib" -lcupti -o .gpu/libkernel_trace.so
echo "kernel_trace: built .gpu/libkernel_trace.so ($krec, $mrec, CUPTI at $lib)"
