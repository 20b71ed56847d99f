#!/usr/bin/env python3
"""Issue 54 item 5's design question: would hob's search in a K-quant-style super-block format reach llama.cpp's
K-quants at their bits? Relative RMS error over a checkpoint's expert matrices of hob's plain groups, the same search
on sub-blocks whose (scale, min) are then stored as 6-bit (4-bit) integers under one f16 pair per 256 values, and
llama.cpp's own blocks read back from its GGUF (gguf-py's dequantization).

  tools/superblock_error.py HF_DIR [--gguf Q4_K.gguf --gguf Q2_K.gguf ...] [--layers 6]

Forms (bits a weight):
  int4/g64 (4.5), int4/g32 (5.0), int2/g64 (2.5)   hob's search (tools/anyprec_error.py search), f16 scale and min
  sb4 (4.5)   sub-blocks of 32: hob's search, then scale = d * a, min = -dmin * b with a, b in 0..63 and d, dmin f16
              per 256 (Q4_K's layout; a sub-block's min above 0 is taken as 0, its codes then refit); codes again
  sb2 (2.625) the same with sub-blocks of 16 and a, b in 0..15 (Q2_K's layout)
Needs torch, safetensors and (for --gguf) gguf-py: the venv of tools/llamacpp.sh has all three."""
import argparse
import glob
import os
import sys

import torch
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anyprec_error import codes, f16, rel, search  # noqa: E402


def superblock(w, bits, sub, levels):
    """Rows of 256 values; sub-blocks of `sub` fitted by hob's search, their (scale, -min) on a `levels`-step grid."""
    nmax = (1 << bits) - 1
    g = w.reshape(-1, sub)
    _, (s, m) = search(g, bits)
    s, m = s.reshape(-1, 256 // sub), m.reshape(-1, 256 // sub)
    neg = (-m).clamp(min=0)  # Q4_K/Q2_K store min <= 0
    d = f16(s.max(1, keepdim=True).values / levels)
    dmin = f16(neg.max(1, keepdim=True).values / levels)
    a = torch.where(d > 0, (s / d).round().clamp(0, levels), torch.zeros_like(s))
    b = torch.where(dmin > 0, (neg / dmin).round().clamp(0, levels), torch.zeros_like(neg))
    sq, mq = (d * a).reshape(-1, 1), (-dmin * b).reshape(-1, 1)
    q = codes(g, sq, mq, nmax)
    return (sq * q + mq).reshape(w.shape)


def gguf_experts(path, layers):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    out = []
    for t in GGUFReader(path).tensors:
        if "_exps" in t.name and int(t.name.split(".")[1]) < layers:
            out.append((t.name, torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).float().reshape(-1)))
    return sorted(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir")
    ap.add_argument("--gguf", action="append", default=[], help="a GGUF of the same checkpoint (its F16 GGUF first)")
    ap.add_argument("--layers", type=int, default=6)
    a = ap.parse_args()
    mats = []
    for path in sorted(glob.glob(os.path.join(a.hf_dir, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            for name in f.keys():
                if ".experts." in name and name.endswith(".weight") and int(name.split(".layers.")[1].split(".")[0]) < a.layers:
                    mats.append(f.get_tensor(name).float().reshape(-1))
    w = torch.cat(mats).reshape(-1, 256)
    print(f"{len(mats)} expert matrices of layers < {a.layers}, {w.numel()} values")
    print("| form | bits a weight | relative RMS error |")
    print("|---|---:|---:|")
    for name, bits, g in (("int4/g64", 4, 64), ("int4/g32", 4, 32), ("int2/g64", 2, 64)):
        r, _ = search(w.reshape(-1, g), bits)
        print(f"| hob {name} | {bits + 32 / g:.3f} | {rel(w, r.reshape(w.shape)):.4f} |")
    print(f"| sb4: hob's search in Q4_K's layout | 4.500 | {rel(w, superblock(w, 4, 32, 63)):.4f} |")
    print(f"| sb2: hob's search in Q2_K's layout | 2.625 | {rel(w, superblock(w, 2, 16, 15)):.4f} |")
    if a.gguf:
        base = torch.cat([t for _, t in gguf_experts(a.gguf[0], a.layers)])
        for path in a.gguf[1:]:
            q = torch.cat([t for _, t in gguf_experts(path, a.layers)])
            print(f"| llama.cpp {os.path.basename(path)} | | {rel(base, q):.4f} |")


if __name__ == "__main__":
    main()
