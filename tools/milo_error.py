#!/usr/bin/env python3
"""Issue 54 item 2's first question: how much of int3's error do MiLo-style low-rank compensators take
back, and at what bytes, beside int2 and int4? Relative RMS error over a checkpoint's expert matrices.

  tools/milo_error.py HF_DIR [--layers 2] [--group 64] [--ranks 8,16,32]

Each matrix W (rows x cols) is quantized per group of G values along a row by hob's search
(tools/anyprec_error.py `search`, weighted least squares). int3 + rank r: W ~ Q3(W - U V) + U V, with U V
the rank-r truncated SVD of the residual, alternated `--iters` times (MiLo's fit without calibration
data), U and V rounded to int8 per row (an f16 scale each). Bits a weight count codes, the f16 scale
and min per group, and the compensator's int8 values and scales."""
import argparse
import glob
import math
import os

import torch
from safetensors import safe_open

from anyprec_error import search


def q(w, bits, g):
    r, _ = search(w.reshape(-1, g), bits)
    return r.reshape(w.shape)


def int8_rows(x):
    s = x.abs().amax(1, keepdim=True) / 127
    s = torch.where(s > 0, s, torch.ones_like(s)).to(torch.float16).to(torch.float32)
    return (x / s).round().clamp(-127, 127) * s


def compensated(w, bits, g, rank, iters):
    uv = torch.zeros_like(w)
    for _ in range(iters):
        qw = q(w - uv, bits, g)
        u, s, vh = torch.linalg.svd(w - qw, full_matrices=False)
        uv = int8_rows(u[:, :rank] * s[:rank]) @ int8_rows(vh[:rank])
    return q(w - uv, bits, g) + uv


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--ranks", default="8,16,32")
    ap.add_argument("--iters", type=int, default=2)
    a = ap.parse_args()
    mats = []
    for path in sorted(glob.glob(os.path.join(a.hf_dir, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            for name in f.keys():
                if ".experts." in name and name.endswith(".weight"):
                    if int(name.split(".layers.")[1].split(".")[0]) < a.layers:
                        mats.append(f.get_tensor(name).float())
    g = a.group
    ranks = [int(r) for r in a.ranks.split(",")]
    rows = {}
    for m in mats:
        n = m.numel()
        for bits in (2, 3, 4):
            e = rows.setdefault((f"int{bits}", bits + 32 / g), [0.0, 0.0])
            e[0] += ((q(m, bits, g) - m) ** 2).sum().item()
            e[1] += (m ** 2).sum().item()
        for r in ranks:
            bpw = 3 + 32 / g + 8 * r * (m.shape[0] + m.shape[1]) / n + 16 * 2 * r / n
            e = rows.setdefault((f"int3 + rank {r}", bpw), [0.0, 0.0])
            e[0] += ((compensated(m, 3, g, r, a.iters) - m) ** 2).sum().item()
            e[1] += (m ** 2).sum().item()
    print(f"{len(mats)} expert matrices of layers < {a.layers}, groups of {g}, {a.iters} alternations")
    print("| variant | bits a weight (this shape) | relative RMS error |")
    print("|---|---:|---:|")
    for (name, bpw), (se, ss) in rows.items():
        print(f"| {name} | {bpw:.3f} | {math.sqrt(se / ss):.4f} |")


if __name__ == "__main__":
    main()
