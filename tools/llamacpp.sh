#!/usr/bin/env bash
# llama.cpp as the CPU peer for hob's benchmarks: same machine, same thread count, same weights.
#
#   tools/llamacpp.sh build                          CPU build of llama.cpp + a venv with its gguf-py
#   tools/llamacpp.sh convert HF_DIR OUT.gguf [TYPE] Hugging Face checkpoint -> GGUF (TYPE: f16 default,
#                                                    f32, bf16, q8_0, or a llama-quantize type like q4_0)
#   tools/llamacpp.sh quantize IN.gguf OUT.gguf TYPE llama-quantize (q8_0, q4_0, q4_k_m, ...)
#   tools/llamacpp.sh bench MODEL.gguf THREADS       llama-bench decode (tg64) and prefill (pp128), markdown
#   tools/llamacpp.sh ppl MODEL.gguf TEXT [THREADS]  llama-perplexity -c 512
#
# Everything built lives under $LLAMA_DIR (default /work/llama), outside the repository. llama.cpp comes from the
# PyPI sdist of llama-cpp-python (its vendor/llama.cpp, MIT), pinned so every run measures the same code.
set -euo pipefail

LLAMA_DIR=${LLAMA_DIR:-/work/llama}
PKG_VERSION=0.3.36
SDIST_DIR=$LLAMA_DIR/sdist
SDIST=$SDIST_DIR/llama_cpp_python-$PKG_VERSION.tar.gz
SRC=$LLAMA_DIR/src/llama_cpp_python-$PKG_VERSION/vendor/llama.cpp
BUILD=$LLAMA_DIR/build
BIN=$BUILD/bin
VENV=$LLAMA_DIR/venv
JOBS=${JOBS:-$(nproc)}

die() {
    echo "llamacpp.sh: $*" >&2
    exit 1
}

need_file() {
    [[ -f $1 ]] || die "$2: no such file: $1"
}

need_tool() {
    [[ -x $BIN/$1 ]] || die "$BIN/$1 is missing: run '$0 build' first (LLAMA_DIR=$LLAMA_DIR)"
}

install_system_tools() {
    local missing=0
    for t in cmake ninja g++ make; do
        command -v "$t" >/dev/null || missing=1
    done
    if ((missing)); then
        # ninja-build also spares pip from compiling ninja from source while it prepares the sdist.
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q cmake ninja-build build-essential
    fi
}

fetch_source() {
    if [[ ! -f $SDIST ]]; then
        mkdir -p "$SDIST_DIR"
        pip download --no-deps --no-binary :all: "llama-cpp-python==$PKG_VERSION" -d "$SDIST_DIR"
    fi
    need_file "$SDIST" "pip download"
    if [[ ! -f $SRC/CMakeLists.txt ]]; then
        mkdir -p "$LLAMA_DIR/src"
        tar -xzf "$SDIST" -C "$LLAMA_DIR/src"
    fi
    [[ -f $SRC/CMakeLists.txt ]] || die "unpacked sdist has no vendor/llama.cpp/CMakeLists.txt under $SRC"
}

# The text-generation tool was renamed across llama.cpp versions (and llama-cli now needs the server build):
# build whichever of the two this configured tree offers.
cli_targets() {
    local targets
    targets=$(ninja -C "$BUILD" -t targets all)
    for t in llama-completion llama-cli; do
        if grep -q "^$t: " <<<"$targets"; then
            echo "$t"
            return
        fi
    done
}

cmd_build() {
    local start=$SECONDS
    install_system_tools
    fetch_source
    # GGML_NATIVE tunes for this CPU (AVX2/AVX-512 where present), as a user benchmarking llama.cpp would build it.
    # No CURL, server or tests: the peer only needs the offline tools.
    cmake -S "$SRC" -B "$BUILD" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON \
        -DGGML_CUDA=OFF \
        -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_SERVER=OFF
    local targets=(llama-bench llama-perplexity llama-quantize)
    mapfile -t -O ${#targets[@]} targets < <(cli_targets)
    echo "building: ${targets[*]}"
    cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"

    if [[ ! -x $VENV/bin/python ]]; then
        python3 -m venv "$VENV"
    fi
    # convert_hf_to_gguf.py needs the gguf-py of the same source tree (newer tensor names and enums than PyPI's).
    # It cannot run without torch: it imports torch and transformers (AutoConfig) at the top, reads safetensors
    # through torch.from_numpy and stacks Mixtral's experts with torch ops. PyPI's torch is the CUDA build (~5 GB
    # with its nvidia-* wheels); only its CPU side is used. sentencepiece serves tokenizer.model checkpoints.
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "$SRC/gguf-py" numpy safetensors sentencepiece \
        torch transformers
    echo "built in $((SECONDS - start)) s: $(ls "$BIN" | tr '\n' ' ')"
}

cmd_convert() {
    (($# >= 2)) || die "usage: convert HF_DIR OUT.gguf [f16|f32|bf16|q8_0|<llama-quantize type>]"
    local hf=$1 out=$2 type=${3:-f16}
    need_file "$hf/config.json" "convert HF_DIR"
    [[ -x $VENV/bin/python ]] || die "$VENV is missing: run '$0 build' first"
    mkdir -p "$(dirname "$out")"
    case $type in
    f16 | f32 | bf16 | q8_0)
        "$VENV/bin/python" "$SRC/convert_hf_to_gguf.py" "$hf" --outfile "$out" --outtype "$type"
        ;;
    *)
        # Other types come from llama-quantize on an f16 conversion, kept next to OUT.
        local f16=${out%.gguf}.f16.gguf
        "$VENV/bin/python" "$SRC/convert_hf_to_gguf.py" "$hf" --outfile "$f16" --outtype f16
        cmd_quantize "$f16" "$out" "$type"
        ;;
    esac
}

cmd_quantize() {
    (($# == 3)) || die "usage: quantize IN.gguf OUT.gguf TYPE"
    need_tool llama-quantize
    need_file "$1" "quantize IN.gguf"
    "$BIN/llama-quantize" "$1" "$2" "${3^^}"
}

cmd_bench() {
    (($# == 2)) || die "usage: bench MODEL.gguf THREADS"
    local model=$1 threads=$2
    need_tool llama-bench
    need_file "$model" "bench MODEL.gguf"
    [[ $threads =~ ^[1-9][0-9]*$ ]] || die "bench THREADS: expected a positive integer, found '$threads'"
    # llama.cpp's threads meet at a spinning barrier several hundred times per token: if anything else wants the
    # same cores, a descheduled thread stalls the others for a whole time slice and decode drops 10-100x (seen on
    # the 2-core dev box: f16 tg64 0.4-4 t/s beside a busy process, ~20 alone). Say what else was running.
    echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
    ps -eo pcpu=,comm= --sort=-pcpu | awk '$1 > 20 { printf "busy beside the bench: %s (%s%% CPU)\n", $2, $1 }'
    # Decode and prefill in separate runs: llama-bench's pp rows exclude generation and tg rows exclude the
    # prompt, so each figure is one phase alone, comparable with hob's own split.
    "$BIN/llama-bench" -m "$model" -p 0 -n 64 -t "$threads" -r 3 -o md
    "$BIN/llama-bench" -m "$model" -p 128 -n 0 -t "$threads" -r 3 -o md
    echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
}

cmd_ppl() {
    (($# >= 2 && $# <= 3)) || die "usage: ppl MODEL.gguf TEXT [THREADS]"
    local model=$1 text=$2 threads=${3:-$(nproc)}
    need_tool llama-perplexity
    need_file "$model" "ppl MODEL.gguf"
    need_file "$text" "ppl TEXT"
    "$BIN/llama-perplexity" -m "$model" -f "$text" -c 512 -t "$threads"
}

(($# >= 1)) || die "usage: $0 build | convert HF_DIR OUT.gguf [TYPE] | quantize IN OUT TYPE | bench MODEL THREADS | ppl MODEL TEXT [THREADS]"
sub=$1
shift
case $sub in
build) cmd_build "$@" ;;
convert) cmd_convert "$@" ;;
quantize) cmd_quantize "$@" ;;
bench) cmd_bench "$@" ;;
ppl) cmd_ppl "$@" ;;
*) die "unknown command '$sub' (expected build, convert, quantize, bench or ppl)" ;;
esac
