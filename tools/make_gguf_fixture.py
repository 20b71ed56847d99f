#!/usr/bin/env python3
"""GGUF fixtures for tests/import_gguf.rs, written by gguf-py's own GGUFWriter (the reference writer, not hob's).

    PYTHONPATH=<llama.cpp>/gguf-py python3 tools/make_gguf_fixture.py tests/fixtures/gguf-small

<llama.cpp> is the tree vendored in the pinned llama-cpp-python sdist (`bash tools/llamacpp_gpu.sh pack` unpacks
it into .gpu/; gguf-py alone is .gpu/gguf-py.tar.xz). Needs numpy.

Writes:
- small.gguf: one file, `general.alignment` 64, metadata of every scalar value type plus arrays (i32, f32, string),
  and tensors of types F32, F16, Q8_0 (gguf-py's `quants.quantize`), Q4_K (random blocks with finite f16 scales:
  gguf-py cannot quantize to Q4_K) and I32 (a type hob lists but does not dequantize).
- tiny-00001-of-00002.gguf, tiny-00002-of-00002.gguf: a split set made by GGUFWriter's `split_max_tensors` (the
  layout llama.cpp's gguf-split writes: `split.no`, `split.count`, `split.tensors.count` in every shard, the rest of
  the metadata in shard 1). Default alignment: gguf-py writes `general.alignment` into shard 1 only but pads every
  shard to it, so a non-default alignment would misplace the data section of shard 2 for any reader.
- NAME.f32 for each float tensor NAME of small.gguf: the little-endian f32 values gguf-py's
  `quants.dequantize` gives for its bytes, in file order (ne[0] fastest).
Deterministic: the same gguf-py gives the same files.
"""
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFWriter, quants

ARCH = "hobtest"


def q4_k_blocks(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    """Random Q4_K blocks (d, dmin, scales[12], qs[128]) whose f16 d and dmin are finite, in [-0.1, 0.1]."""
    blocks = rng.integers(0, 256, size=(n_blocks, 144), dtype=np.uint8)
    for b in range(n_blocks):
        for off in (0, 2):
            value = np.float16(rng.uniform(-0.1, 0.1))
            blocks[b, off:off + 2] = np.frombuffer(value.tobytes(), dtype=np.uint8)
    return blocks


def write(writer: GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def small(out: Path, rng: np.random.Generator) -> dict[str, tuple[np.ndarray, T]]:
    w = GGUFWriter(out / "small.gguf", ARCH)
    w.add_custom_alignment(64)
    w.add_name("hob gguf fixture")
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.25)
    w.add_uint64("test.u64", 1 << 40)
    w.add_int64("test.i64", -(1 << 40))
    w.add_float64("test.f64", -1.5)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo, GGUF")
    w.add_array("test.array_i32", [1, -2, 3])
    w.add_array("test.array_f32", [0.5, -0.25])
    w.add_array("test.array_str", ["<s>", "</s>", "▁the"])

    # numpy shapes are [rows, cols]; GGUF's ne reverses them (ne[0] = cols).
    tensors: dict[str, tuple[np.ndarray, T]] = {}
    f32 = rng.normal(0.0, 1.0, size=(4, 8)).astype(np.float32)
    tensors["token_embd.weight"] = (f32, T.F32)
    w.add_tensor("token_embd.weight", f32)

    f16 = rng.normal(0.0, 1.0, size=(3, 8)).astype(np.float16)
    tensors["blk.0.attn_q.weight"] = (f16.view(np.uint8), T.F16)
    w.add_tensor("blk.0.attn_q.weight", f16)

    up = quants.quantize(rng.normal(0.0, 1.0, size=(2, 3, 64)).astype(np.float32), T.Q8_0)
    tensors["blk.0.ffn_up_exps.weight"] = (up, T.Q8_0)
    w.add_tensor("blk.0.ffn_up_exps.weight", up, raw_dtype=T.Q8_0)

    down = q4_k_blocks(rng, 2).reshape(2, 144)
    tensors["blk.0.ffn_down_exps.weight"] = (down, T.Q4_K)
    w.add_tensor("blk.0.ffn_down_exps.weight", down, raw_dtype=T.Q4_K)

    ids = np.arange(5, dtype=np.int32) - 2
    w.add_tensor("test.ids", ids)
    write(w)
    return tensors


def split(out: Path, rng: np.random.Generator) -> None:
    w = GGUFWriter(out / "tiny.gguf", ARCH, split_max_tensors=2)
    w.add_name("hob gguf split fixture")
    w.add_uint32(f"{ARCH}.block_count", 1)
    w.add_tensor("token_embd.weight", rng.normal(0.0, 1.0, size=(2, 4)).astype(np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(4, dtype=np.float32))
    w.add_tensor("output.weight", rng.normal(0.0, 1.0, size=(2, 4)).astype(np.float16))
    write(w)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: make_gguf_fixture.py OUT_DIR")
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(51)
    for name, (raw, qtype) in small(out, rng).items():
        values = quants.dequantize(raw, qtype).reshape(-1)
        assert values.dtype == np.float32, (name, values.dtype)
        (out / f"{name}.f32").write_bytes(values.astype("<f4").tobytes())
    split(out, rng)
    for path in sorted(out.iterdir()):
        print(f"{path.name}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
