# Sourced by the device scripts (bench_gpu.sh, hobbit_gpu.sh): the CUDA libraries under the names cudarc's
# CUDA 12.2 bindings look for (libnvrtc.so, libcublas.so; a CUDA 13 install may only have .so.13), the NVRTC
# cache, $out and the staged binary.
out="${OUT:-/tmp/hob-out}"; mkdir -p "$out"
hob=.gpu/hob
mkdir -p .gpu/lib
for lib in nvrtc cublas cublasLt; do
  ldconfig -p | grep -q "lib$lib.so " || { f=$(ls /usr/local/cuda/lib64/lib$lib.so.1[0-9]* 2>/dev/null | head -1); [ -n "$f" ] && ln -sf "$f" .gpu/lib/lib$lib.so; }
done
export LD_LIBRARY_PATH="$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}" HOB_CACHE_DIR=/tmp/hob-cache
