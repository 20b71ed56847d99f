#!/usr/bin/env bash
# llama.cpp with CUDA on the device machine, beside hob, on the same synthetic Mixtral shape.
#   here:   bash tools/llamacpp_gpu.sh pack        -> .gpu/llama-src.tar.xz (llama.cpp from the pinned
#                                                    llama-cpp-python sdist, docs/models/tests stripped: ~5 MB)
#                                                    and .gpu/gguf-py.tar.xz (its GGUF writer alone, ~0.1 MB)
#   device: bash tools/llamacpp_gpu.sh build       -> /tmp/llama/build/bin/{llama-bench,llama-quantize} (sm_90)
#           bash tools/llamacpp_gpu.sh save        -> $OUT/llb.part00, 01 (the built binaries, xz, ~30 MB): copy
#                                                    them into .gpu/ here and later calls skip the ~200 s build
#           bash tools/llamacpp_gpu.sh restore     -> /tmp/llama/build/bin from .gpu/llb.part*, gguf-py from
#                                                    .gpu/gguf-py.tar.xz (or the source tarball)
#           bash tools/llamacpp_gpu.sh bench [LAYERS] -> GGUF f16 + Q4_K_M, llama-bench tables in $OUT/llamacpp.md
set -euo pipefail
PKG_VERSION=0.3.36
L=/tmp/llama
out="${OUT:-/tmp/hob-out}"
case "${1:-}" in
pack)
  d=$(mktemp -d)
  # The sdist straight from the index: `pip download --no-binary` would build cmake from source
  # just to read the package's metadata.
  url=$(curl -fsS https://pypi.org/simple/llama-cpp-python/ \
    | grep -o "https://[^\"#]*llama_cpp_python-$PKG_VERSION.tar.gz" | head -1)
  [ -n "$url" ] || { echo "llamacpp_gpu.sh: no sdist of llama-cpp-python $PKG_VERSION on PyPI" >&2; exit 1; }
  curl -fsSL -o "$d/llama_cpp_python-$PKG_VERSION.tar.gz" "$url"
  tar xzf "$d"/llama_cpp_python-$PKG_VERSION.tar.gz -C "$d"
  mkdir -p .gpu
  (cd "$d/llama_cpp_python-$PKG_VERSION/vendor" && tar cJf - --exclude=llama.cpp/docs --exclude=llama.cpp/models \
      --exclude=llama.cpp/media --exclude=llama.cpp/tools/ui --exclude=llama.cpp/examples --exclude=llama.cpp/tests \
      --exclude=llama.cpp/benches --exclude=llama.cpp/ggml/src/ggml-sycl --exclude=llama.cpp/ggml/src/ggml-vulkan \
      --exclude=llama.cpp/ggml/src/ggml-opencl --exclude=llama.cpp/ggml/src/ggml-cann --exclude=llama.cpp/ggml/src/ggml-musa \
      --exclude=llama.cpp/ggml/src/ggml-metal llama.cpp) > .gpu/llama-src.tar.xz
  rm -rf "$d"
  e=$(mktemp -d) && tar xJf .gpu/llama-src.tar.xz -C "$e" llama.cpp/gguf-py \
    && tar cJf .gpu/gguf-py.tar.xz -C "$e" llama.cpp/gguf-py; rm -rf "$e"
  ls -l .gpu/llama-src.tar.xz .gpu/gguf-py.tar.xz ;;
save)
  mkdir -p "$out"
  (cd $L/build && tar cf - bin/llama-bench bin/llama-quantize bin/*.so*) | xz -T0 -6 | split -b 15M -d - "$out/llb.part"
  ls -l "$out"/llb.part* ;;
restore)
  mkdir -p $L/build
  cat .gpu/llb.part* | xz -dc | tar xf - -C $L/build
  if [ -f .gpu/gguf-py.tar.xz ]; then tar xJf .gpu/gguf-py.tar.xz -C $L; else tar xJf .gpu/llama-src.tar.xz -C $L; fi
  $L/build/bin/llama-bench --help > /dev/null && echo "llama.cpp restored: $L/build/bin" ;;
build)
  mkdir -p $L && tar xJf .gpu/llama-src.tar.xz -C $L
  cmake -S $L/llama.cpp -B $L/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON > $L/cmake.log 2>&1 || { tail -30 $L/cmake.log; exit 1; }
  cmake --build $L/build --target llama-bench llama-quantize -j "$(nproc)" > $L/build.log 2>&1 || { tail -30 $L/build.log; exit 1; }
  ls -l $L/build/bin ;;
bench)
  layers="${2:-8}"; mkdir -p "$out"; m=/tmp/mixtral-synthetic-${layers}l
  [ -f $m-f16.gguf ] || PYTHONPATH=$L/llama.cpp/gguf-py python3 tools/make_synthetic_gguf.py $m-f16.gguf --layers "$layers"
  b=$L/build/bin/llama-bench; cpu=$((layers * 3 / 4)); gpu4=$((layers / 4))
  # f16: 2 of 8 layers' experts on the GPU (a 24 GiB card's share), then all on the GPU.
  { echo "## llama.cpp f16, --n-cpu-moe $cpu (experts of $((layers - cpu)) of $layers layers on the GPU)";
    $b -m $m-f16.gguf -ngl 99 --n-cpu-moe $cpu -t 16 -p 512 -n 64 -r 3 -o md;
    echo "## llama.cpp f16, all on the GPU"; $b -m $m-f16.gguf -ngl 99 -t 16 -p 512 -n 64 -r 3 -o md; } | tee -a "$out/llamacpp.md"
  $L/build/bin/llama-quantize $m-f16.gguf $m-q4_k_m.gguf Q4_K_M 16 > $L/quantize.log 2>&1 && rm -f $m-f16.gguf
  { echo "## llama.cpp Q4_K_M, --n-cpu-moe $gpu4 (experts of $((layers - gpu4)) of $layers layers on the GPU)";
    $b -m $m-q4_k_m.gguf -ngl 99 --n-cpu-moe $gpu4 -t 16 -p 512 -n 64 -r 3 -o md;
    echo "## llama.cpp Q4_K_M, all on the GPU"; $b -m $m-q4_k_m.gguf -ngl 99 -t 16 -p 512 -n 64 -r 3 -o md; } | tee -a "$out/llamacpp.md" ;;
*) echo "usage: llamacpp_gpu.sh pack|build|save|restore|bench [LAYERS]"; exit 2;;
esac
