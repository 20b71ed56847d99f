#!/usr/bin/env python3
"""Issue 54: would ap8's narrow widths come closer to the separate variants if its 8-bit parent had a range per
16 values (int2k's sub-groups) instead of per 64? Relative RMS error of each width k over expert matrices.

  tools/ap8_subscale_error.py HF_DIR [--layers 1]     # a checkpoint's expert matrices (safetensors)
  tools/ap8_subscale_error.py --synthetic [--seed 1]  # Student-t (5 degrees) rows of 2048, row scales vary
  tools/ap8_subscale_error.py HF_DIR --write OUT --form s16q4 --width 2
      # a copy of HF_DIR whose expert matrices are one form's width-k values (f16), for `hob convert --experts
      # f16` and `hob perplexity --kl-divergence`: the form's quality through hob's forward ("sep64", "ap8",
      # "s16q4" as below)

Forms (the parent's code q8 = round((w - m) / s) in [0, 255]; width k reads q_k = q8 >> (8 - k)):
  sep g64        hob's own search for width k (shrink grid + weighted least squares), groups of 64
  sep g16        the same on groups of 16 (f16 tables: what int2k's quantized sub-scales approach)
  ap8 g64        today's ap8: parent over each 64's [min, max]; widths 2-4 refit per 64 (an upper bound of the
                 one-byte correction), 5-8 the buckets' midpoints
  s16 mid        parent over each 16's [min, max] (f16 pairs), the buckets' midpoints
  s16 corr       the same, with one (scale, shift) per width and 64 values, in units of each 16's step, fitted
                 by least squares (what one correction byte per 64 could hold)
  s16q4 corr     s16 corr with each 16's step and min as 4-bit multiples of its row's pair (int2k's sub-scales;
                 the parent's range rounded outward so that width 8 never clips)
  s16q6 corr     the same with 6-bit multiples
Bits a weight: sep g64 k + 0.5; ap8 g64 8.875 stored (k + 0.625 read for k <= 4); s16 (f16 pairs) 10.375;
s16q4 8.875 + 32/cols (k + 0.625 read), s16q6 9.125 + 32/cols. Needs numpy (and safetensors for HF_DIR)."""
import argparse
import glob
import json
import math
import os

import numpy as np


# f16 .. search: numpy versions of tools/anyprec_error.py's torch helpers (this study runs from the demo's venv,
# which has numpy and no torch); the two must weigh and search alike.
def f16(x):
    return x.astype(np.float16).astype(np.float32)


def weights(w, bits):
    av = np.sqrt((w * w).mean(1, keepdims=True))
    a = av + np.abs(w)
    return a * a if bits >= 4 else a


def codes(w, s, m, nmax):
    inv = np.where(s > 0, 1.0 / np.where(s > 0, s, 1), 0)
    return np.round(np.clip((w - m) * inv, 0, nmax))


def refit(w, q, k):
    sk, skq, skqq = k.sum(1, keepdims=True), (k * q).sum(1, keepdims=True), (k * q * q).sum(1, keepdims=True)
    skw, skqw = (k * w).sum(1, keepdims=True), (k * q * w).sum(1, keepdims=True)
    det = sk * skqq - skq * skq
    ok = det > 0
    s = np.where(ok, (sk * skqw - skq * skw) / np.where(ok, det, 1), 0)
    ok = ok & (s > 0)
    m = (skw - s * skq) / sk
    return ok, f16(s), f16(m)


def wsse(w, q, s, m, k):
    return (k * (s * q + m - w) ** 2).sum(1, keepdims=True)


def search(w, bits, steps=16):
    """hob's asymmetric search (src/quant/quantize.rs search_asym): shrink grid + refit, weighted."""
    nmax = (1 << bits) - 1
    step = 0.02 if bits >= 4 else 0.035
    k = weights(w, bits)
    lo, hi = w.min(1, keepdims=True), w.max(1, keepdims=True)
    rng = hi - lo
    best_e = np.full_like(lo, np.inf)
    best_s, best_m = np.zeros_like(lo), f16(lo)
    for i in range(steps):
        width = (1 - i * step) * rng
        s, m = f16(width / nmax), f16(lo + 0.5 * (rng - width))
        q = codes(w, s, m, nmax)
        e = wsse(w, q, s, m, k)
        better = e < best_e
        best_e, best_s, best_m = np.where(better, e, best_e), np.where(better, s, best_s), np.where(better, m, best_m)
        ok, rs, rm = refit(w, q, k)
        e2 = np.where(ok, wsse(w, codes(w, rs, rm, nmax), rs, rm, k), np.inf)
        better = e2 < best_e
        best_e, best_s, best_m = np.where(better, e2, best_e), np.where(better, rs, best_s), np.where(better, rm, best_m)
    q = codes(w, best_s, best_m, nmax)
    return best_s * q + best_m


def mid(m8, s8, qk, bits):
    return m8 + s8 * (qk * 2 ** (8 - bits) + (2 ** (8 - bits) - 1) / 2)


def parent(w):
    """(s8, m8) per row of w (a group) over its [min, max], f16."""
    lo, hi = w.min(1, keepdims=True), w.max(1, keepdims=True)
    s8, m8 = f16((hi - lo) / 255), f16(lo)
    return np.where(f16(m8 + 255 * s8) < hi, f16(s8 * (1 + 2 ** -10)), s8), m8


def parent_q(w_rows, g, sub_bits):
    """Per row: a pair (d, dm), each 16's step s8 = d a (a < 2^sub_bits), min m8 = -dm b (b >= 0 from the row's
    most negative min), both rounded outward so that [m8, m8 + 255 s8] holds the group."""
    rows, cols = w_rows.shape
    w = w_rows.reshape(rows, cols // g, g)
    lo, hi = w.min(2), w.max(2)
    top = (1 << sub_bits) - 1
    mins = np.minimum(lo, 0)
    dm = f16(-mins.min(1, keepdims=True) / top)
    dm = np.where(dm > 0, dm, 1e-8)
    b = np.clip(np.ceil(-mins / dm), 0, top)
    m8 = -dm * b
    need = (hi - m8) / 255
    d = f16(need.max(1, keepdims=True) / top)
    d = np.where(d > 0, d, 1e-8)
    a = np.clip(np.ceil(need / d), 1, top)
    s8 = d * a
    return s8.reshape(-1, 1), m8.reshape(-1, 1)


def corr(w64, q, base, step, bits):
    """One (scale, shift) per 64 values for width k: v = base + step * (alpha * (q + 1/2) + beta), least squares."""
    t = q + 0.5
    y = (w64 - base) / np.where(step > 0, step, 1)
    k = (step * step) * np.ones_like(w64)
    n, st, stt = k.sum(1, keepdims=True), (k * t).sum(1, keepdims=True), (k * t * t).sum(1, keepdims=True)
    sy, sty = (k * y).sum(1, keepdims=True), (k * t * y).sum(1, keepdims=True)
    det = n * stt - st * st
    ok = det > 0
    alpha = np.where(ok, (n * sty - st * sy) / np.where(ok, det, 1), 1)
    beta = np.where(ok, (sy - alpha * st) / n, 0)
    return base + step * (alpha * t + beta)


def s16_view(w, bits, sub_bits, sg=16):
    """Width `bits` of a parent with a range per `sg` values (f16 pairs, or quantized sub-scales); 'mid' and
    'corr'."""
    rows = w.shape[0]
    w16 = w.reshape(-1, sg)
    if sub_bits is None:
        s8, m8 = parent(w16)
    else:
        s8, m8 = parent_q(w, sg, sub_bits)
    q8 = codes(w16, s8, m8, 255)
    qk = np.floor(q8 / 2 ** (8 - bits))
    v_mid = mid(m8, s8, qk, bits)
    step = s8 * 2 ** (8 - bits)
    base = m8 + 0 * qk
    # Regroup by 64 for the shared correction.
    g = lambda a: np.broadcast_to(a, w16.shape).reshape(-1, 64)
    v_corr = corr(g(w16), g(qk), g(base), g(step), bits).reshape(rows, -1)
    return v_mid.reshape(rows, -1), v_corr


def ap8_g64(w, bits):
    w64 = w.reshape(-1, 64)
    s8, m8 = parent(w64)
    q8 = codes(w64, s8, m8, 255)
    qk = np.floor(q8 / 2 ** (8 - bits))
    v = mid(m8, s8, qk, bits)
    if bits <= 4:
        ok, s, m = refit(w64, qk, weights(w64, bits))
        v = np.where(ok, s * qk + m, v)
    return v.reshape(w.shape)


def rel(w, r):
    return math.sqrt(((r - w) ** 2).sum() / (w ** 2).sum())


def matrices(a):
    if a.synthetic:
        rng = np.random.default_rng(a.seed)
        out = []
        for _ in range(4):
            scale = np.exp(rng.normal(0, 0.5, (768, 1)))
            out.append((rng.standard_t(5, (768, 2048)) * scale * 0.02).astype(np.float32))
        return "synthetic Student-t (5), 4 x [768, 2048]", out
    from safetensors.numpy import load_file

    cfg = json.load(open(os.path.join(a.hf_dir, "config.json")))
    mats = []
    for path in sorted(glob.glob(os.path.join(a.hf_dir, "*.safetensors"))):
        t = load_file(path)
        for name, v in t.items():
            if ".experts." in name and name.endswith(".weight"):
                layer = int(name.split(".layers.")[1].split(".")[0])
                if layer < a.layers:
                    mats.append(v.astype(np.float32))
    return f"{cfg.get('architectures', ['?'])[0]}, {len(mats)} expert matrices of layers < {a.layers}", mats


def write(a):
    """The checkpoint of --write: every expert matrix replaced by the form's width-k values."""
    import shutil

    from safetensors.numpy import load_file, save_file

    form = {
        "sep64": lambda w: search(w.reshape(-1, 64), a.width).reshape(w.shape),
        "ap8": lambda w: ap8_g64(w, a.width),
        "s16q4": lambda w: s16_view(w, a.width, 4)[1],
        "s32q8": lambda w: s16_view(w, a.width, 8, 32)[1],
    }[a.form]
    os.makedirs(a.write, exist_ok=True)
    for f in os.listdir(a.hf_dir):
        if not f.endswith(".safetensors"):
            shutil.copy(os.path.join(a.hf_dir, f), a.write)
    for path in sorted(glob.glob(os.path.join(a.hf_dir, "*.safetensors"))):
        t = load_file(path)
        for name in t:
            if ".experts." in name and name.endswith(".weight"):
                t[name] = form(t[name].astype(np.float32)).astype(np.float16)
        save_file(t, os.path.join(a.write, os.path.basename(path)), metadata={"format": "pt"})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir", nargs="?")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--write")
    ap.add_argument("--form", choices=["sep64", "ap8", "s16q4", "s32q8"], default="s16q4")
    ap.add_argument("--width", type=int, default=2)
    a = ap.parse_args()
    if a.write:
        return write(a)
    what, mats = matrices(a)
    mats = [m for m in mats if m.shape[1] % 64 == 0]
    print(f"{what}: {sum(m.size for m in mats)} values")
    cols = ["sep g64", "sep g16", "ap8 g64", "s16 mid", "s16 corr", "s16q4 corr", "s16q6 corr", "s32q4 corr",
            "s32q8 corr"]
    print("| width | " + " | ".join(cols) + " |")
    print("|---:|" + "---:|" * len(cols))
    for bits in (2, 3, 4, 5, 8):
        acc = {c: [0.0, 0.0] for c in cols}
        for w in mats:
            views = {
                "sep g64": search(w.reshape(-1, 64), bits).reshape(w.shape),
                "sep g16": search(w.reshape(-1, 16), bits).reshape(w.shape),
                "ap8 g64": ap8_g64(w, bits),
            }
            views["s16 mid"], views["s16 corr"] = s16_view(w, bits, None)
            views["s16q4 corr"] = s16_view(w, bits, 4)[1]
            views["s16q6 corr"] = s16_view(w, bits, 6)[1]
            views["s32q4 corr"] = s16_view(w, bits, 4, 32)[1]
            views["s32q8 corr"] = s16_view(w, bits, 8, 32)[1]
            for c in cols:
                acc[c][0] += ((views[c] - w) ** 2).sum()
                acc[c][1] += (w ** 2).sum()
        print(f"| {bits} | " + " | ".join(f"{math.sqrt(acc[c][0] / acc[c][1]):.4f}" for c in cols) + " |")


if __name__ == "__main__":
    main()
