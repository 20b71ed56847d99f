#!/usr/bin/env python3
"""Emulates cuda/matvec_c32.cu's loop (c32_stage, c32_rows) with its two layouts, ap8's planes (ap8.cu Ap8C32) and
int2k (Int2kC32), lane by lane in integers, on a machine without a GPU. Each product is checked against the direct
product of the codes with x as the kernel rounds it: the index, layout and bit work must be exact (NMSE ~1e-15;
x's 16-bit rounding itself costs ~1e-9 against f32 x). Random codes, group tables and x; shapes with ragged row
tiles, partial steps, ap8's two parent ranges of 16 a chunk. The groups' (scale, min) arithmetic from the stored
tables (ap8_table, ap8_params, int2k_sm) is not emulated here: the tables are random values.

    python3 tools/c32_emulate.py        (needs numpy; exit status 1 if any product is off)
"""
import sys
from fractions import Fraction

import numpy as np

rng = np.random.default_rng(1)
M32 = 0xFFFFFFFF


def byte_perm(x, y, s):
    b = [(x >> (8 * i)) & 0xFF for i in range(4)] + [(y >> (8 * i)) & 0xFF for i in range(4)]
    return sum(b[(s >> (4 * i)) & 7] << (8 * i) for i in range(4))


def shr(v, s):
    return (v >> s) & M32 if s >= 0 else (v << -s) & M32


def f32_fma(a, b, c):
    """fmaf: a b + c rounded once to the nearest f32 (ties to even), from the exact rational."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    x = np.float32(float(exact))
    best = None
    for y in (np.nextafter(x, np.float32(-np.inf)), x, np.nextafter(x, np.float32(np.inf))):
        d = abs(Fraction(float(y)) - exact)
        even = (int(y.view(np.uint32)) & 1) == 0
        if best is None or d < best[0] or (d == best[0] and even):
            best = (d, y)
    return best[1]


def third_exact():
    """ap8.cu's ap8_third: v / 3 by a product and one residual step equals f32 division for v in -8..7."""
    f, r3 = np.float32, np.float32(1) / np.float32(3)
    for v in range(-8, 8):
        q = f(v) * r3
        if f32_fma(f32_fma(-q, 3, v), r3, q) != f(v) / f(3):
            return False
    return True


def dp4a(a, b, signed_b):
    t = 0
    for i in range(4):
        ca, xb = (a >> (8 * i)) & 0xFF, (b >> (8 * i)) & 0xFF
        t += ca * (xb - 256 if signed_b and xb >= 128 else xb)
    return t


def word32(arr, byte_off):
    return sum(int(arr[byte_off + i]) << (8 * i) for i in range(4))


def col(order, j, b):  # c32_col
    if order == 0:
        return 2 * (j >> 1) + (b >> 1) + 8 * (b & 1) + 16 * (j & 1)
    return 16 * (j >> 2) + (j & 3) + 4 * b


def half(order, j):  # the 16-column half staged word j lies in
    return j & 1 if order == 0 else j >> 2


def stage(x, order):
    """c32_stage: per chunk the two byte planes' words, (2^e, half sums, sum), and x as rounded."""
    nch = len(x) // 32
    xw, xsx, xr = {}, {}, np.zeros(len(x))
    for c in range(nch):
        v = x[32 * c:32 * c + 32]
        E = (int(np.float32(np.abs(v).max()).view(np.uint32)) >> 23) & 0xFF
        ep = max(E, 14)
        mz, xs = np.float32(2.0 ** (141 - ep)), 2.0 ** (ep - 141)
        xsx[c] = (xs, float(v[:16].sum()), float(v[16:].sum()), float(v.sum()))
        for j in range(8):
            q = [int(np.clip(np.rint(np.float32(v[col(order, j, b)]) * mz), -32767, 32767)) for b in range(4)]
            xw[(c, 0, j)] = sum(((qq >> 8) & 0xFF) << (8 * b) for b, qq in enumerate(q))
            xw[(c, 1, j)] = sum((qq & 0xFF) << (8 * b) for b, qq in enumerate(q))
            for b in range(4):
                xr[32 * c + col(order, j, b)] = q[b] * xs
    return xw, xsx, xr


def rows_loop(rows, cols, R, load, step, split=1):
    """c32_rows: tiles of R rows, steps of 32 chunks; a team of `split` warps a tile, member m taking steps m,
    m + split, ...; acc per (member, row, lane), each member's summed at the tile's end, then added in member order."""
    nch = cols >> 5
    ns = (nch + 31) >> 5
    got = np.zeros(rows)
    for t in range((rows + R - 1) // R):
        parts = []
        for m in range(split):
            acc = np.zeros((R, 32))
            for s in range(m, max(ns, m + 1), split):
                bufs = [load(t, s, lane) for lane in range(32)]
                for lane in range(32):
                    step(bufs, t, s, lane, acc)
            parts.append(acc.sum(1))
        for ri in range(R):
            if t * R + ri < rows:
                got[t * R + ri] = sum(p[ri] for p in parts)
    return got


def ap8(rows, cols, K, split=1):
    """Ap8C32: parent ranges of 16, a chunk's two; each lane loads its own chunk's two tables a row, pairs words
    j and j + 1 (columns j + 8b and j + 1 + 8b) into one word a half by two byte permutes, and meets each with x
    once, each half's sum under its own (scale, min)."""
    n, R = rows * cols, 4 if K <= 4 else 2
    q8 = rng.integers(0, 256, n)
    top = np.zeros(n // 4, dtype=np.int64)
    planes = np.zeros((6, n // 8), dtype=np.int64)
    for e in range(n):
        top[e // 4] |= (int(q8[e]) >> 6) << (2 * (e % 4))
        for p in range(6):
            planes[p, e // 8] |= ((int(q8[e]) >> (5 - p)) & 1) << (e % 8)
    s_g = rng.standard_normal(n // 16) * 0.01
    m_g = rng.standard_normal(n // 16) * 0.01
    x = rng.standard_normal(cols).astype(np.float32)
    xw, xsx, xr = stage(x, 0)
    nch, gpr = cols >> 5, cols // 16

    def load(t, s, lane):
        c = s * 32 + lane
        tops, pls, tabs = [], [], []
        for ri in range(R):
            r = min(t * R + ri, rows - 1)
            u = r * nch + c
            ok = c < nch
            tops.append((word32(top, 8 * u), word32(top, 8 * u + 4)) if ok else (0, 0))
            pls.append([word32(planes[p], 4 * u) if ok else 0 for p in range(6)])
            tabs.append([(s_g[r * gpr + 2 * c + h], m_g[r * gpr + 2 * c + h]) if ok else (0.0, 0.0)
                         for h in range(2)])
        return tops, pls, tabs

    def step(bufs, t, s, lane, acc):
        c = s * 32 + lane
        if c >= nch:
            return
        for ri in range(R):
            (s0, m0), (s1, m1) = bufs[lane][2][ri]
            tx, ty = bufs[lane][0][ri]
            A, B = byte_perm(tx, ty, 0x6420), byte_perm(tx, ty, 0x7531)
            hi, lo = [0, 0], [0, 0]
            words = []
            for j in range(8):
                w = shr(A if j < 4 else B, 2 * (j & 3) - (K - 2)) & ((0x03030303 << (K - 2)) & M32)
                for p in range(K - 2):
                    tb = K - 3 - p
                    w |= shr(bufs[lane][1][ri][p], j - tb) & ((0x01010101 << tb) & M32)
                words.append(w)
            for j in range(0, 8, 2):
                for h, sel in enumerate((0x5410, 0x7632)):
                    u = byte_perm(words[j], words[j + 1], sel)
                    assert half(0, j + h) == h
                    hi[h] += dp4a(u, xw[(c, 0, j + h)], True)
                    lo[h] += dp4a(u, xw[(c, 1, j + h)], False)
            acc[ri, lane] += s0 * (hi[0] * 256 + lo[0]) * xsx[c][0] + m0 * xsx[c][1]
            acc[ri, lane] += s1 * (hi[1] * 256 + lo[1]) * xsx[c][0] + m1 * xsx[c][2]

    got = rows_loop(rows, cols, R, load, step, split)
    code = (q8 >> (8 - K)).reshape(rows, cols)
    gi = (np.arange(n) // 16).reshape(rows, cols)
    want = ((s_g[gi] * code + m_g[gi]) * xr).sum(1) + (m_g[gi] * (x - xr)).sum(1)
    return f"ap8@{K} [{rows}, {cols}] split {split}", got, want


def int2k(rows, cols, split=1):
    n, R, rb = rows * cols, 4, cols // 4
    q = rng.integers(0, 4, n)
    codes = np.zeros(n // 4, dtype=np.int64)
    for e in range(n):
        codes[e // 4] |= int(q[e]) << (2 * (e % 4))
    s_g = rng.standard_normal(n // 16) * 0.01
    m_g = rng.standard_normal(n // 16) * 0.01
    x = rng.standard_normal(cols).astype(np.float32)
    xw, xsx, xr = stage(x, 1)
    nch = cols >> 5

    def load(t, s, lane):
        c = s * 32 + lane
        out = []
        for ri in range(R):
            r = min(t * R + ri, rows - 1)
            ok = c < nch
            out.append(((word32(codes, r * rb + 8 * c), word32(codes, r * rb + 8 * c + 4)) if ok else (0, 0),
                        r * (cols // 16) + 2 * c))
        return out

    def step(bufs, t, s, lane, acc):
        c = s * 32 + lane
        if c >= nch:
            return
        for ri in range(R):
            (tx, ty), g = bufs[lane][ri]
            hi, lo = [0, 0], [0, 0]
            for j in range(8):
                w = ((tx if j < 4 else ty) >> (2 * (j & 3))) & 0x03030303
                hi[j >> 2] += dp4a(w, xw[(c, 0, j)], True)
                lo[j >> 2] += dp4a(w, xw[(c, 1, j)], False)
            for h in range(2):
                acc[ri, lane] += s_g[g + h] * (hi[h] * 256 + lo[h]) * xsx[c][0] + m_g[g + h] * xsx[c][1 + h]

    got = rows_loop(rows, cols, R, load, step, split)
    gi = (np.arange(n) // 16).reshape(rows, cols)
    want = ((s_g[gi] * q.reshape(rows, cols) + m_g[gi]) * xr).sum(1) + (m_g[gi] * (x - xr)).sum(1)
    return f"int2k [{rows}, {cols}] split {split}", got, want


worst = 0.0
cases = [ap8(3, 64, 2), ap8(5, 192, 3), ap8(4, 1088, 5), ap8(3, 2048, 8), ap8(7, 1152, 4),
         ap8(2, 768, 6), ap8(3, 320, 7), ap8(6, 4096, 3),
         int2k(3, 64), int2k(5, 96), int2k(6, 1088), int2k(9, 4096),
         # Teams: steps split between members, and members past the row's steps (3 steps, 8 members).
         ap8(6, 4096, 3, 2), ap8(3, 3072, 6, 4), int2k(9, 4096, 4), int2k(5, 3072, 8)]
for name, got, want in cases:
    e = ((got - want) ** 2).sum() / (want ** 2).sum()
    worst = max(worst, e)
    print(f"{name}: NMSE {e:.2e}")
print(f"worst {worst:.2e}")
third = third_exact()
print(f"ap8_third equals f32 division for -8..7: {third}")
sys.exit(0 if worst < 1e-12 and third else 1)
