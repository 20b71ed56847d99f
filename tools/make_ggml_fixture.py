#!/usr/bin/env python3
"""GGML block-format fixtures for tests/import_ggml.rs: random blocks and what gguf-py dequantizes them to.

    PYTHONPATH=<llama.cpp>/gguf-py python3 tools/make_ggml_fixture.py tests/fixtures/ggml-blocks

<llama.cpp> is the tree vendored in the pinned llama-cpp-python sdist (`bash tools/llamacpp_gpu.sh pack` unpacks
it into .gpu/; gguf-py alone is .gpu/gguf-py.tar.xz). Needs numpy.

For each type, NAME.bin holds the raw bytes of one row and NAME.f32 the little-endian f32 values that
`gguf.quants.dequantize` gives for it. Quantized rows are 4 blocks of random bytes whose f16 scale fields are
overwritten with finite values in [-0.1, 0.1] (block 0's with f16 subnormals, to exercise their widening); every
other byte (packed quants, packed 6-bit scales, int8 scales, high-bit masks) is used as drawn. F16 and BF16 rows
are random values plus the special ones (signed zeros, subnormals, the largest finite, infinities, quiet NaNs).
Deterministic: the same gguf-py gives the same files.
"""
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, quants

N_BLOCKS = 4

# Byte offsets of each block's f16 scale fields (ggml-common.h's block_* structs).
F16_FIELDS = {
    T.Q4_0: [0],  # d, qs[16]
    T.Q4_1: [0, 2],  # d, m, qs[16]
    T.Q5_0: [0],  # d, qh[4], qs[16]
    T.Q5_1: [0, 2],  # d, m, qh[4], qs[16]
    T.Q8_0: [0],  # d, qs[32]
    T.Q2_K: [80, 82],  # scales[16], qs[64], d, dmin
    T.Q3_K: [108],  # hmask[32], qs[64], scales[12], d
    T.Q4_K: [0, 2],  # d, dmin, scales[12], qs[128]
    T.Q5_K: [0, 2],  # d, dmin, scales[12], qh[32], qs[128]
    T.Q6_K: [208],  # ql[128], qh[64], scales[16], d
}


def quantized_row(rng: np.random.Generator, qtype: T) -> np.ndarray:
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(N_BLOCKS, type_size), dtype=np.uint8)
    for b in range(N_BLOCKS):
        for off in F16_FIELDS[qtype]:
            # f16's smallest normal is 2^-14 ~ 6.1e-5: block 0's scales are subnormal.
            bound = 5e-5 if b == 0 else 0.1
            value = np.float16(rng.uniform(-bound, bound))
            blocks[b, off:off + 2] = np.frombuffer(value.tobytes(), dtype=np.uint8)
    return blocks.reshape(-1)


def f16_row(rng: np.random.Generator) -> np.ndarray:
    special = [0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE01]
    values = rng.normal(0.0, 2.0, size=53).astype(np.float16).view(np.uint16)
    return np.concatenate([np.array(special, dtype=np.uint16), values]).astype("<u2").view(np.uint8)


def bf16_row(rng: np.random.Generator) -> np.ndarray:
    special = [0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1]
    values = (rng.normal(0.0, 2.0, size=53).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.concatenate([np.array(special, dtype=np.uint16), values]).astype("<u2").view(np.uint8)


def mxfp4_row(rng: np.random.Generator) -> np.ndarray:
    """MXFP4: an E8M0 exponent byte and 16 bytes of e2m1 nibbles a block; exponents 0 and 1 (ggml's denormal
    patterns), then ordinary ones around 2^0, each nibble as drawn."""
    blocks = rng.integers(0, 256, size=(N_BLOCKS, 17), dtype=np.uint8)
    blocks[:, 0] = [0, 1, 120, 131]
    return blocks.reshape(-1)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: make_ggml_fixture.py OUT_DIR")
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(51)
    rows = {qtype: quantized_row(rng, qtype) for qtype in F16_FIELDS}
    rows[T.F16] = f16_row(rng)
    rows[T.BF16] = bf16_row(rng)
    rows[T.MXFP4] = mxfp4_row(rng)
    total = 0
    for qtype, raw in rows.items():
        values = quants.dequantize(raw.reshape(1, -1), qtype).reshape(-1)
        assert values.dtype == np.float32, (qtype.name, values.dtype)
        name = qtype.name.lower()
        (out / f"{name}.bin").write_bytes(raw.tobytes())
        (out / f"{name}.f32").write_bytes(values.astype("<f4").tobytes())
        total += raw.nbytes + values.nbytes
        print(f"{name}: {raw.nbytes} bytes -> {values.size} values")
    print(f"{len(rows)} types, {total} bytes in {out}")


if __name__ == "__main__":
    main()
