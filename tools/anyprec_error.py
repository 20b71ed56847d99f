#!/usr/bin/env python3
"""Issue 54 item 1's first question: how close do the top k bit planes of one 8-bit parent come to a
separately quantized k-bit variant? Relative RMS error over a checkpoint's expert matrices, groups of
G values along a row, for each width k, four any-precision forms against hob's separate search.

  tools/anyprec_error.py HF_DIR [--layers 2] [--group 64]

Forms (the parent's code q8 = round((w - m) / s) in [0, 255]; its top k planes q_k = q8 >> (8 - k)):
  minmax-mid    parent over [min, max]; q_k read as its bucket's midpoint (no tables per width)
  minmax-refit  the same codes, a weighted least-squares (scale, min) per group for each width
  clip4-refit   parent over the clip range hob's int4 search picks; refit tables per width
  separate      hob's search per width (shrink grid + weighted least-squares refit), the reference
Needs torch and safetensors (the venv of tools/llamacpp.sh has both)."""
import argparse
import glob
import json
import math
import os

import torch
from safetensors import safe_open


def f16(x):
    return x.to(torch.float16).to(torch.float32)


def weights(w, bits):
    av = w.pow(2).mean(1, keepdim=True).sqrt()
    a = av + w.abs()
    return a * a if bits >= 4 else a


def codes(w, s, m, nmax):
    inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
    return ((w - m) * inv).clamp(0, nmax).round()


def refit(w, q, k):
    sk, skq, skqq = k.sum(1, keepdim=True), (k * q).sum(1, keepdim=True), (k * q * q).sum(1, keepdim=True)
    skw, skqw = (k * w).sum(1, keepdim=True), (k * q * w).sum(1, keepdim=True)
    det = sk * skqq - skq * skq
    ok = det > 0
    s = torch.where(ok, (sk * skqw - skq * skw) / torch.where(ok, det, torch.ones_like(det)), torch.zeros_like(det))
    ok = ok & (s > 0)
    m = (skw - s * skq) / sk
    return ok, f16(s), f16(m)


def wsse(w, q, s, m, k):
    return (k * (s * q + m - w) ** 2).sum(1, keepdim=True)


def search(w, bits, steps=16):
    """hob's asymmetric search (src/quant/quantize.rs search_asym): shrink grid + refit, weighted."""
    nmax = (1 << bits) - 1
    step = 0.02 if bits >= 4 else 0.035
    k = weights(w, bits)
    lo, hi = w.min(1, keepdim=True).values, w.max(1, keepdim=True).values
    rng = hi - lo
    best_e = torch.full_like(lo, float("inf"))
    best_s, best_m = torch.zeros_like(lo), f16(lo)
    for i in range(steps):
        width = (1 - i * step) * rng
        s, m = f16(width / nmax), f16(lo + 0.5 * (rng - width))
        q = codes(w, s, m, nmax)
        e = wsse(w, q, s, m, k)
        better = e < best_e
        best_e, best_s, best_m = torch.where(better, e, best_e), torch.where(better, s, best_s), torch.where(better, m, best_m)
        ok, rs, rm = refit(w, q, k)
        q2 = codes(w, rs, rm, nmax)
        e2 = torch.where(ok, wsse(w, q2, rs, rm, k), torch.full_like(e, float("inf")))
        better = e2 < best_e
        best_e, best_s, best_m = torch.where(better, e2, best_e), torch.where(better, rs, best_s), torch.where(better, rm, best_m)
    q = codes(w, best_s, best_m, nmax)
    return best_s * q + best_m, (best_s, best_m)


def planes(w, s8, m8, bits, how):
    q8 = codes(w, s8, m8, 255)
    qk = torch.div(q8, 2 ** (8 - bits), rounding_mode="floor")
    if how == "mid":
        return m8 + s8 * (qk * 2 ** (8 - bits) + (2 ** (8 - bits) - 1) / 2)
    k = weights(w, bits)
    ok, s, m = refit(w, qk, k)
    fixed = m8 + s8 * (qk * 2 ** (8 - bits) + (2 ** (8 - bits) - 1) / 2)
    return torch.where(ok, s * qk + m, fixed)


def rel(w, r):
    return math.sqrt(((r - w) ** 2).sum().item() / (w ** 2).sum().item())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--group", type=int, default=64)
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.hf_dir, "config.json")))
    mats = []
    for path in sorted(glob.glob(os.path.join(a.hf_dir, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            for name in f.keys():
                if ".experts." in name and name.endswith(".weight"):
                    layer = int(name.split(".layers.")[1].split(".")[0])
                    if layer < a.layers:
                        mats.append(f.get_tensor(name).float())
    w = torch.cat([m.reshape(-1, a.group) for m in mats])
    print(f"{cfg.get('architectures', ['?'])[0]}: {len(mats)} expert matrices of layers < {a.layers}, "
          f"{w.numel()} values, groups of {a.group}")
    lo, hi = w.min(1, keepdim=True).values, w.max(1, keepdim=True).values
    s_mm, m_mm = f16((hi - lo) / 255), f16(lo)
    _, (s4, m4) = search(w, 4)
    s_c4, m_c4 = f16(s4 * 15 / 255), m4
    print("| width | separate (hob's search) | minmax-mid | minmax-refit | clip4-refit |")
    print("|---:|---:|---:|---:|---:|")
    for bits in (2, 3, 4, 6, 8):
        sep, _ = search(w, bits)
        row = [rel(w, sep), rel(w, planes(w, s_mm, m_mm, bits, "mid")), rel(w, planes(w, s_mm, m_mm, bits, "refit")),
               rel(w, planes(w, s_c4, m_c4, bits, "refit"))]
        print(f"| {bits} | " + " | ".join(f"{x:.4f}" for x in row) + " |")


if __name__ == "__main__":
    main()
