#!/usr/bin/env bash
# Stage what the device machine (GPU, no Rust) needs into .gpu/ (git-ignored via .git/info/exclude):
# the release `hob` binary, every release test executable, and the tokenizer/fixtures they read.
#
#   bash tools/stage_gpu.sh          then, with the device tool: carry [".gpu"], command "bash .gpu/run.sh tests"
#   bash tools/stage_gpu.sh gpu_backend gpu_engine experts_loader cli_bench
#                                    only those test executables (the whole set can pass the device tool's
#                                    64 MiB carry: 69 MB on 2026-11-27)
#
# .gpu/run.sh tests: every staged test executable (GPU tests print their NMSE table), one log $OUT/tests.log.
# .gpu/run.sh bench: the GPU kernel bandwidth bench, $OUT/gpu_matvec.md.
# Your own scripts at .gpu/*.sh survive restaging. (The device returns at most 8 files.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
mkdir -p .git/info && grep -qx '.gpu/' .git/info/exclude 2>/dev/null || echo '.gpu/' >> .git/info/exclude
# Everything staged before goes; scripts of your own at .gpu/*.sh (other than run.sh) stay, and so does
# llama.cpp's packed source and saved build (tools/llamacpp_gpu.sh pack/save), which take minutes to remake.
find .gpu -mindepth 1 -maxdepth 1 ! -name '*.sh' ! -name 'llama-src.tar.xz' ! -name 'gguf-py.tar.xz' \
  ! -name 'llb.part*' -exec rm -rf {} + 2>/dev/null || true
rm -f .gpu/run.sh && mkdir -p .gpu/tests .gpu/benches
cargo build --release
cp target/release/hob .gpu/hob
cargo test --release --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' \
  | while read -r exe; do
      name=$(basename "$exe"); keep=$#
      for t in "$@"; do [ "${name%-*}" = "$t" ] && keep=0; done
      if [ "$keep" = 0 ]; then cp "$exe" ".gpu/tests/$name"; fi
    done
cargo build --release --benches --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        print(m["executable"])' \
  | while read -r exe; do n=$(basename "$exe"); cp "$exe" ".gpu/benches/${n%-*}"; done
# Debug info would put the folder far over the device tool's 64 MiB carry limit.
strip .gpu/hob $(find .gpu/tests .gpu/benches -type f)
# A trained router's data and the perplexity text, for tools/hobbit_gpu.sh trace.
shakes="${HOB_SHARED:-$root/../shared}/models/shakespeare-moe"
if [ -f "$shakes/train.py" ]; then
  mkdir -p .gpu/shakes && cp "$shakes"/{train.py,train.bin,val.bin} .gpu/shakes/ && chmod u+w .gpu/shakes/*
fi
[ -f models/hamlet-60k.txt ] || bash tools/fetch_hamlet.sh > /dev/null || true
[ -f models/hamlet-60k.txt ] && cp models/hamlet-60k.txt .gpu/
cat > .gpu/run.sh <<'RUN'
#!/usr/bin/env bash
# Runs on the device machine from the repository root: the tests read tests/fixtures/ from the tree
# and run .gpu/hob where the build machine's binary is absent (tests/common/paths.rs).
set -u
mode="${1:-tests}"
out="${OUT:-/tmp/hob-out}"; mkdir -p "$out"
# hob is built with cudarc's CUDA 12.2 bindings, which look for libnvrtc.so / libcublas.so or their
# .so.12 names; a CUDA 13 install has .so.13 (and the unversioned names only with the dev packages).
mkdir -p .gpu/lib
for lib in nvrtc cublas cublasLt; do
  if ! ldconfig -p | grep -q "lib$lib.so "; then
    f=$(ldconfig -p | grep -o "/.*lib$lib.so.1[0-9]*$" | head -1)
    [ -z "$f" ] && f=$(ls /usr/local/cuda/lib64/lib$lib.so.1[0-9]* 2>/dev/null | head -1)
    [ -z "$f" ] && f=$(python3 -c "import glob,site;print(next(iter(sorted(glob.glob(site.getsitepackages()[0]+'/nvidia/**/lib$lib.so.1*',recursive=True))),''))" 2>/dev/null)
    [ -n "$f" ] && ln -sf "$f" ".gpu/lib/lib$lib.so" && echo "linked lib$lib.so -> $f"
  fi
done
export LD_LIBRARY_PATH="$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}"
export HOB_CACHE_DIR=/tmp/hob-cache
status=0
case "$mode" in
tests)
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
  for t in .gpu/tests/*; do
    name=$(basename "$t")
    # The GPU tests are #[ignore]d where there is no GPU; here they run. The demo model is not
    # carried (too large), so its test stays out.
    extra=(--include-ignored); case "$name" in gpu_backend-*|gpu_engine-*)
      extra+=(--nocapture --test-threads=1 --skip demo_model_on_the_gpu);; gpu_families-*|gpu_routing-*)
      extra+=(--nocapture --test-threads=1);; esac
    { echo "=== $name"; "$t" "${extra[@]}" 2>&1; } >> "$out/tests.log" || { status=1; echo "FAILED: $name"; }
  done
  grep -h "test result" "$out/tests.log"
  grep -hE "NMSE|quarter cache" "$out/tests.log" || true
  ;;
bench)
  .gpu/benches/gpu_matvec | tee "$out/gpu_matvec.md" || status=1
  ;;
*) echo "usage: run.sh tests|bench"; status=2;;
esac
exit $status
RUN
chmod +x .gpu/run.sh
du -sh .gpu
size=$(du -sm .gpu | cut -f1)
[ "$size" -le 64 ] || echo "stage_gpu: .gpu is $size MiB, over the device tool's 64 MiB carry: name the tests to stage" >&2
