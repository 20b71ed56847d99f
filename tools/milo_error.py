#!/usr/bin/env python3
"""Issue 54 item 2's first question: how much of int3's error do MiLo-style low-rank compensators take
back, and at what bytes, beside int2 and int4? Relative RMS error over a checkpoint's expert matrices.

  tools/milo_error.py HF_DIR [--layers 2] [--group 64] [--ranks 8,16,32]
  tools/milo_error.py HF_DIR --write OUT --bits 3 --rank 16
      # a copy of HF_DIR whose expert matrices are int3 + rank 16's values (f16; --rank 0: int3 alone), for
      # `hob convert --experts f16` and `hob perplexity --kl-divergence`: the form's quality through hob's forward

Each matrix W (rows x cols) is quantized per group of G values along a row by hob's search
(tools/ap8_subscale_error.py `search`, weighted least squares). int3 + rank r: W ~ Q3(W - U V) + U V, with U V
the rank-r truncated SVD of the residual, alternated `--iters` times (MiLo's fit without calibration
data), U and V rounded to int8 per row (an f16 scale each). Bits a weight count codes, the f16 scale
and min per group, and the compensator's int8 values and scales. Needs numpy and safetensors."""
import argparse
import glob
import math
import os
import shutil

import numpy as np
from safetensors.numpy import load_file, save_file

from ap8_subscale_error import f16, search


def q(w, bits, g):
    return search(w.reshape(-1, g), bits).reshape(w.shape)


def int8_rows(x):
    s = np.abs(x).max(1, keepdims=True) / 127
    s = f16(np.where(s > 0, s, 1))
    return np.clip(np.round(x / s), -127, 127) * s


def compensated(w, bits, g, rank, iters):
    if rank == 0:
        return q(w, bits, g)
    uv = np.zeros_like(w)
    for _ in range(iters):
        qw = q(w - uv, bits, g)
        u, s, vh = np.linalg.svd(w - qw, full_matrices=False)
        uv = int8_rows(u[:, :rank] * s[:rank]) @ int8_rows(vh[:rank])
    return q(w - uv, bits, g) + uv


def expert_tensors(path):
    t = load_file(path)
    return t, [n for n in t if ".experts." in n and n.endswith(".weight")]


def write(a):
    """The checkpoint of --write: every expert matrix replaced by int`bits` + rank r's values."""
    os.makedirs(a.write, exist_ok=True)
    for f in os.listdir(a.hf_dir):
        if not f.endswith(".safetensors"):
            shutil.copy(os.path.join(a.hf_dir, f), a.write)
    for path in sorted(glob.glob(os.path.join(a.hf_dir, "*.safetensors"))):
        t, names = expert_tensors(path)
        for name in names:
            w = t[name].astype(np.float32)
            t[name] = compensated(w, a.bits, a.group, a.rank, a.iters).astype(np.float16)
        save_file(t, os.path.join(a.write, os.path.basename(path)), metadata={"format": "pt"})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--ranks", default="8,16,32")
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--write")
    ap.add_argument("--bits", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    a = ap.parse_args()
    if a.write:
        return write(a)
    mats = []
    for path in sorted(glob.glob(os.path.join(a.hf_dir, "*.safetensors"))):
        t, names = expert_tensors(path)
        for name in names:
            if int(name.split(".layers.")[1].split(".")[0]) < a.layers:
                mats.append(t[name].astype(np.float32))
    g = a.group
    ranks = [int(r) for r in a.ranks.split(",")]
    rows = {}
    for m in mats:
        n = m.size
        for bits in (2, 3, 4):
            e = rows.setdefault((f"int{bits}", bits + 32 / g), [0.0, 0.0])
            e[0] += ((q(m, bits, g) - m) ** 2).sum()
            e[1] += (m ** 2).sum()
        for r in ranks:
            bpw = 3 + 32 / g + 8 * r * (m.shape[0] + m.shape[1]) / n + 16 * 2 * r / n
            e = rows.setdefault((f"int3 + rank {r}", bpw), [0.0, 0.0])
            e[0] += ((compensated(m, 3, g, r, a.iters) - m) ** 2).sum()
            e[1] += (m ** 2).sum()
    print(f"{len(mats)} expert matrices of layers < {a.layers}, groups of {g}, {a.iters} alternations")
    print("| variant | bits a weight (this shape) | relative RMS error |")
    print("|---|---:|---:|")
    for (name, bpw), (se, ss) in rows.items():
        print(f"| {name} | {bpw:.3f} | {math.sqrt(se / ss):.4f} |")


if __name__ == "__main__":
    main()
