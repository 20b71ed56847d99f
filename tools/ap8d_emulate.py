#!/usr/bin/env python3
"""Emulates cuda/ap8.cu's dp4a form (ap8d_stage, ap8d_load, ap8d_step, ap8d_rows) lane by lane in integers on a
machine without a GPU, against the direct product of the width-K codes with x as the kernel rounds it: the index,
layout and bit work must be exact (NMSE ~1e-15; x's 16-bit rounding itself costs ~1e-9 against f32 x). Random
parents, tables and x; shapes with ragged row tiles, partial steps and groups of 64, 128 and 192.

    python3 tools/ap8d_emulate.py        (needs numpy; exit status 1 if any shape is off)
"""
import numpy as np, sys
rng = np.random.default_rng(1)
M32 = 0xffffffff
def u32(v): return v & M32
def byte_perm(x, y, s):
    b = [(x >> (8*i)) & 0xff for i in range(4)] + [(y >> (8*i)) & 0xff for i in range(4)]
    return sum(b[(s >> (4*i)) & 7] << (8*i) for i in range(4))
def shr(v, s): return u32(v >> s) if s >= 0 else u32(v << -s)
def dp4a(a, b, signed_b):
    t = 0
    for i in range(4):
        ca = (a >> (8*i)) & 0xff; xb = (b >> (8*i)) & 0xff
        if signed_b and xb >= 128: xb -= 256
        t += ca * xb
    return t

def run(rows, cols, K, group, R):
    n = rows * cols
    q8 = rng.integers(0, 256, n)
    top = np.zeros(n // 4, dtype=np.int64)
    for e in range(n): top[e // 4] |= (int(q8[e]) >> 6) << (2 * (e % 4))
    planes = np.zeros((6, n // 8), dtype=np.int64)
    for p in range(6):
        for e in range(n): planes[p, e // 8] |= ((int(q8[e]) >> (5 - p)) & 1) << (e % 8)
    G = n // group
    s_g = rng.standard_normal(G).astype(np.float32) * 0.01
    m_g = rng.standard_normal(G).astype(np.float32) * 0.01
    x = rng.standard_normal(cols).astype(np.float32)
    code = (q8 >> (8 - K)).reshape(rows, cols)
    gi = (np.arange(n) // group).reshape(rows, cols)
    want = ((s_g[gi] * code + m_g[gi]) * x).sum(1, dtype=np.float64)
    # ap8d_stage
    nch = cols >> 5
    xw = {}  # (c, plane, j) -> u32
    xsx = {}
    xr = np.zeros(cols)
    for c in range(nch):
        v = x[32*c:32*c+32]
        am = np.abs(v).max()
        E = (int(np.float32(am).view(np.uint32)) >> 23) & 0xff
        ep = max(E, 14)
        mz = np.float32(2.0 ** (141 - ep))
        xs = 2.0 ** (ep - 141)
        xsx[c] = (xs, float(v.sum()))
        for j in range(8):
            q = [int(np.clip(np.rint(np.float32(v[j + 8*b]) * mz), -32767, 32767)) for b in range(4)]
            hi = sum((((qq >> 8) & 0xff) << (8*b)) for b, qq in enumerate(q))
            lo = sum(((qq & 0xff) << (8*b)) for b, qq in enumerate(q))
            xw[(c, 0, j)] = hi; xw[(c, 1, j)] = lo
            for b in range(4): xr[32*c + j + 8*b] = q[b] * xs
    gsh = group.bit_length() - 1 if group & (group - 1) == 0 else -1
    grp = lambda col: col >> gsh if gsh >= 0 else col // group
    gpr = cols // group
    ns = (nch + 31) >> 5
    ntiles = (rows + R - 1) // R
    got = np.zeros(rows)
    for t in range(ntiles):
        acc = np.zeros((R, 32))
        for s in range(ns):
            # ap8d_load, every lane
            buf = []
            for lane in range(32):
                c = s*32 + lane; inn = c < nch
                tops, pls = [], []
                for ri in range(R):
                    u = min(t*R + ri, rows - 1) * nch + c
                    if inn:
                        tx = sum(int(top[4*(2*u) + i]) << (8*i) for i in range(4))
                        ty = sum(int(top[4*(2*u+1) + i]) << (8*i) for i in range(4))
                        pl = [sum(int(planes[p, 4*u + i]) << (8*i) for i in range(4)) for p in range(6)]
                    else:
                        tx = ty = 0; pl = [0]*6
                    tops.append((tx, ty)); pls.append(pl)
                g = grp(s*1024) + (lane & 15)
                gin = g <= grp(min(s*1024 + 1023, cols - 1))
                tabs = []
                for i in range(R // 2):
                    r = min(t*R + 2*i + (lane >> 4), rows - 1)
                    tabs.append((s_g[r*gpr + g], m_g[r*gpr + g]) if gin else (0.0, 0.0))
                buf.append((tops, pls, tabs))
            # ap8d_step
            for lane in range(32):
                c = s*32 + lane; inn = c < nch
                gl = grp(c*32) - grp(s*1024) if inn else 0
                for ri in range(R):
                    src = buf[(ri & 1)*16 + gl]
                    sc, mn = src[2][ri >> 1]
                    if not inn: continue
                    tx, ty = buf[lane][0][ri]
                    A = byte_perm(tx, ty, 0x6420); B = byte_perm(tx, ty, 0x7531)
                    hi = lo = 0
                    for j in range(8):
                        tp = A if j < 4 else B
                        sh = 2*(j & 3) - (K - 2)
                        w = shr(tp, sh) & u32(0x03030303 << (K - 2))
                        for p in range(K - 2):
                            tb = K - 3 - p; ps = j - tb
                            w |= shr(buf[lane][1][ri][p], ps) & u32(0x01010101 << tb)
                        hi += dp4a(w, xw[(c, 0, j)], True)
                        lo += dp4a(w, xw[(c, 1, j)], False)
                    v = float(hi*256 + lo) * xsx[c][0]
                    acc[ri, lane] += sc * v + mn * xsx[c][1]
        for ri in range(R):
            if t*R + ri < rows: got[t*R + ri] = acc[ri].sum()
    want = ((s_g[gi] * code + m_g[gi]).astype(np.float64) * xr).sum(1) + (m_g[gi] * (x - xr)).sum(1)
    e = ((got - want)**2).sum() / (want**2).sum()
    print(f"rows {rows} cols {cols} K {K} g {group} R {R}: NMSE {e:.2e}")
    return e

worst = 0
for (rows, cols, K, group) in [(3, 64, 2, 64), (5, 192, 3, 64), (4, 1088, 5, 64), (3, 2048, 8, 128),
                               (7, 1152, 4, 192), (2, 768, 6, 64), (3, 320, 7, 64), (6, 4096, 3, 64)]:
    R = 4 if K <= 4 else 2
    worst = max(worst, run(rows, cols, K, group, R))
print("worst", worst); sys.exit(0 if worst < 1e-12 else 1)
