// Integer dequantize-matvec on the tensor cores (sm_80 and later, for groups of 1, 2 or a multiple
// of 4 whole chunks; the launcher takes it only for the kinds where it is faster:
// Gpu::qm_kinds, benches/results/2026-11-23-h100-int-matvec-mma.md).
//
// The scalar kernels (matvec_q.cu) spend about three instructions per weight (an AND and an FMA
// each, plus addressing). Here the products go to mma.sync m16n8k16 (f16 inputs, f32 accumulation),
// one instruction per 256 weights of a warp, and dequantization is one AND per two codes.
// - A (16 rows x 16 columns per mma): the codes, masked in place in each 16-bit half of a code
//   word, are read as f16 subnormals q * 2^(p - 24), exact (p: the code's bit position in its half
//   after at most one shift of the word, p <= 8). A warp's lanes (g = lane / 4, t = lane % 4) load
//   one 16-byte chunk each of rows g and g + 8: lane t of every row group reads chunk 4 q + t of a
//   "quad" q of four chunks, and the order of a row's columns inside an mma is whatever the code
//   words give (the staged x follows it).
// - B (16 x 8): x * 2^K in two f16 parts (hi = f16(x'), lo = f16(x' - hi): 22 bits of x) times
//   2^-p, so every product is q * x' * 2^-24; K, one per quad, puts the quad's max |x'| in
//   [2^14, 2^15) (found by the 16 lanes that stage the quad: no pass over x first). Column n of B is
//   part n % 2 of local group n / 2 of the quad (the groups a quad's chunks fall into: 4 of one
//   chunk, 2 of two, or 1), zero for the other groups' columns: the accumulator's columns 2 t and
//   2 t + 1 are then local group t's two parts, in lane t of each row group.
// - Per quad: each row's group sum times 2^(24 - K) and its scale, plus min (or -128 for int8's
//   q + 128 codes) times the group's sum of x, added in f32 (the same terms as matvec_q_*); lanes
//   t then warps sharing a row group (split) add in a fixed order.
// Accuracy: the f16 split of x (relative error <= 2^-22 per element) and the tensor cores' f32
// accumulation; kernels-vs-CPU NMSE is bounded like the scalar kernels (benches/gpu_matvec.rs).

template <int KIND> struct QMTraits;
// BITS per code; SH: the shift bringing codes beyond bit 10 of a half (f16's mantissa) down.
template <> struct QMTraits<KIND_INT8> { enum { BITS = 8, SH = 8 }; };
template <> struct QMTraits<KIND_INT4> { enum { BITS = 4, SH = 8 }; };
template <> struct QMTraits<KIND_INT2> { enum { BITS = 2, SH = 10 }; };

// Half-word register r (0 .. 16 / BITS - 1) of a code word w (h = w >> SH): codes r and
// r + 16 / BITS (low and high half), masked in place; qm_pos is their bit position in the half.
template <int KIND>
__device__ __forceinline__ constexpr int qm_pos(int r) {
    return QMTraits<KIND>::BITS * (r + 1) <= 10 ? QMTraits<KIND>::BITS * r
                                                 : QMTraits<KIND>::BITS * r - QMTraits<KIND>::SH;
}
template <int KIND>
__device__ __forceinline__ u32 qm_reg(u32 w, u32 h, int r) {
    constexpr int B = QMTraits<KIND>::BITS;
    constexpr u32 M = ((1u << B) - 1) * 0x00010001u;
    return B * (r + 1) <= 10 ? (w & (M << (B * r))) : (h & (M << (B * r - QMTraits<KIND>::SH)));
}

__device__ __forceinline__ void mma16816(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                         u32 b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// hi and lo f16 parts of v, packed with those of u (v in the low half).
__device__ __forceinline__ void qm_split2(float v, float u, u32& hi, u32& lo) {
    const half_bits vh = f2h(v), uh = f2h(u);
    const half_bits vl = f2h(v - h2f(vh)), ul = f2h(u - h2f(uh));
    hi = (u32)vh | ((u32)uh << 16);
    lo = (u32)vl | ((u32)ul << 16);
}

// Stage columns [0, tn * CC) of xt for matvec_qm_body: xb holds, per quad q, B-fragment entry
// v (0 .. NR - 1: two mmas) of chunk t and part p at uint4 ((q * NR + v) * 4 + t) * 2 + p (a
// warp's 8 distinct entries of one load are 128 contiguous bytes); chunks tn .. 4 q + 3 of a
// partial quad are zeros. Each quad has its own K (x * 2^K below 2^15 there): qf[q] = 2^(24 - K).
// sxc: each chunk's sum of x. One code word's columns per thread: a quad's 16 words are 16
// adjacent lanes. Block-wide (blockDim.x a multiple of 32); ends with a barrier.
template <int KIND>
__device__ void qmstage(const float* __restrict__ xt, const float* __restrict__ ut, int tn, uint4* xb,
                        float* sxc, float* qf) {
    constexpr int EPW = 32 / QMTraits<KIND>::BITS, NR = EPW / 2, CC = 4 * EPW;
    const float4* x4 = reinterpret_cast<const float4*>(xt);
    const float4* u4 = reinterpret_cast<const float4*>(ut);
    __syncthreads();  // earlier readers of the shared arrays are done
    const int nwords = ((tn + 3) & ~3) * 4;
    for (int m0 = 0; m0 < nwords; m0 += blockDim.x) {
        const int it = m0 + threadIdx.x, c = it >> 2, wd = it & 3;
        const bool in = it < nwords && c < tn;
        float xv[EPW];
        float mx = 0.f, sum = 0.f;
#pragma unroll
        for (int i = 0; i < EPW / 4; i++) {
            const float4 v = in ? xin(x4, u4, (c * CC + wd * EPW) / 4 + i)
                                : make_float4(0.f, 0.f, 0.f, 0.f);
            xv[4 * i] = v.x;
            xv[4 * i + 1] = v.y;
            xv[4 * i + 2] = v.z;
            xv[4 * i + 3] = v.w;
            mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        }
#pragma unroll
        for (int i = 0; i < EPW; i++) sum += xv[i];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
#pragma unroll
        for (int o = 1; o < 16; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        if (it >= nwords) continue;
        // |x| < 2^(e - 126) for the quad's largest biased exponent e (subnormals as e = 1), so
        // x * 2^K with K = 140 - e stays below 2^15; K >= -103 keeps 2^(24 - K) a float (an |x|
        // of 2^117 or more becomes infinite).
        const int e = max((int)((__float_as_uint(mx) >> 23) & 0xff), 1);
        const int k = max(140 - e, -103);
        const int q = c >> 2, t = c & 3;
        if (wd == 0) sxc[c] = sum;
        if ((it & 15) == 0) qf[q] = __uint_as_float((u32)(127 + 24 - k) << 23);
        // The word's mmas j = wd * NR / 2 + m: registers 2 m and 2 m + 1, each codes r and r + NR.
        u32 h[NR], l[NR];
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const int ex = k - qm_pos<KIND>(r);
            qm_split2(ldexp2(xv[r], ex), ldexp2(xv[r + NR], ex), h[r], l[r]);
        }
        if (NR == 2) {
            // int8: one mma per word, half an entry.
            uint2* d = reinterpret_cast<uint2*>(xb + ((q * NR + (wd >> 1)) * 4 + t) * 2) + (wd & 1);
            d[0] = make_uint2(h[0], h[1]);
            d[2] = make_uint2(l[0], l[1]);
        } else {
#pragma unroll
            for (int v = 0; v < NR / 4; v++) {
                uint4* d = xb + ((q * NR + wd * (NR / 4) + v) * 4 + t) * 2;
                d[0] = make_uint4(h[4 * v], h[4 * v + 1], h[4 * v + 2], h[4 * v + 3]);
                d[1] = make_uint4(l[4 * v], l[4 * v + 1], l[4 * v + 2], l[4 * v + 3]);
            }
        }
    }
    __syncthreads();
}

// One step's loads of a lane: U quads' chunks of its two rows, with the scale and min bits of
// its local group in each (lanes t < groups per quad).
template <int U>
struct QMBuf {
    uint4 v[U][2];
    u32 sm[U][2];
};

// y = W x for int8/int4/int2 on the tensor cores (see above). blockDim.x = 32 * warps, warps %
// split == 0; a tile is (warps / split) * 16 rows, tiles go to blocks round-robin; a step is U
// quads, the split warps of a row group taking steps in turn; the columns go in tiles of tchunks
// chunks (a multiple of 32 when there is more than one), each staged in turn. Dynamic shared
// memory: q_smem in mod.rs.
// SKIP (timing only, benches/gpu_matvec.rs; wrong results): bit 0 no x staging, bit 1 no scale
// loads, bit 2 no mma (the codes folded into the sums instead). One step of codes loads before x
// is staged, not two (benches/results/2026-11-23-h100-int-matvec-mma.md).
template <int KIND, int U, int SKIP = 0>
__device__ __forceinline__ void matvec_qm_body(const Mat w, const float* __restrict__ x,
                                               const float* __restrict__ u,
                                               float* __restrict__ y, int split, int tchunks) {
#if __CUDA_ARCH__ >= 800
    pdl_trigger();
    constexpr int EPW = 32 / QMTraits<KIND>::BITS, NR = EPW / 2, CC = 4 * EPW;
    extern __shared__ float4 qsm[];
    const int n = w.row_bytes >> 4;
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = warp / split, s = warp - g * split;
    const int tile_rows = (warps / split) * 16;
    const int ntiles = (w.rows + tile_rows - 1) / tile_rows;
    if ((int)blockIdx.x >= ntiles) return;
    const int tpad = (tchunks + 31) & ~31;
    uint4* xb = reinterpret_cast<uint4*>(qsm);
    float* sxc = reinterpret_cast<float*>(xb + tpad * NR * 2);
    float* qf = sxc + tpad;          // [tpad / 4]
    float* red = qf + tpad / 4;      // [2][warps][16]
    const int gpr = w.cols / w.group;
    const int cpg = w.group / CC;             // chunks per group: 1, 2 or a multiple of 4
    const int cpq = min(cpg, 4);              // chunks per local group of a quad
    const int cpg_shift = (cpg & (cpg - 1)) == 0 ? __ffs(cpg) - 1 : -1;
    const int qg = lane >> 2, qt = lane & 3;  // the mma's row group and thread in group
    const bool con = qt * cpq < 4;            // lane holds local group qt's sums
    const bool bon = (qg >> 1) == qt / cpq;  // B column qg is its chunk's local group's
    const int bsel = qt * 2 + (qg & 1);
    int parity = 0;

    for (int ct0 = 0; ct0 < n; ct0 += tchunks) {
        const int tn = min(tchunks, n - ct0);
        const int nq = (tn + 3) >> 2;
        const int nst = (nq + U - 1) / U;
        const int ksteps = (nst + split - 1) / split;
        const uint4* lrow[2];
        int lsrow[2];
        int ltile = -1;
        auto load = [&](QMBuf<U>& b, int t, int k) {
            if (t != ltile) {
                ltile = t;
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    const int r = min(t * tile_rows + g * 16 + qg + 8 * i, w.rows - 1);
                    lrow[i] = reinterpret_cast<const uint4*>(w.codes + (size_t)r * w.row_bytes) + ct0;
                    lsrow[i] = r * gpr;
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int q = (s + k * split) * U + u;
                const int c = 4 * q + qt, cq = 4 * q + qt * cpq;
                const bool in = c < tn, gin = con && cq < tn;
                const int gi = cpg_shift >= 0 ? (ct0 + cq) >> cpg_shift : (ct0 + cq) / cpg;
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    b.v[u][i] = in ? qld(lrow[i] + c) : make_uint4(0, 0, 0, 0);
                    u32 sm = 0;
                    if (gin && !(SKIP & 2)) {
                        sm = __ldg(w.scales + lsrow[i] + gi);
                        if (KIND != KIND_INT8) sm |= (u32)__ldg(w.mins + lsrow[i] + gi) << 16;
                    }
                    b.sm[u][i] = sm;
                }
            }
        };
        QMBuf<U> cur, nxt;
        int t = blockIdx.x, k = 0;
        load(cur, t, k);
        pdl_wait();
        if (!(SKIP & 1))
            qmstage<KIND>(x + (size_t)ct0 * CC, u ? u + (size_t)ct0 * CC : nullptr, tn, xb, sxc, qf);
        float acc[2] = {0.f, 0.f};
        for (;;) {
            int nk, nt;
            next_step(t, k, ksteps, nt, nk);
            const bool more = nt < ntiles;
            if (more) load(nxt, nt, nk);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int q = (s + k * split) * U + u;
                if (q < nq) {
                    float c4[4] = {0.f, 0.f, 0.f, 0.f};
                    const uint4* bq = xb + q * NR * 8 + bsel;
                    uint4 bv = make_uint4(0, 0, 0, 0);
#pragma unroll
                    for (int wd = 0; wd < 4; wd++) {
                        u32 w0 = qword(cur.v[u][0], wd), w1 = qword(cur.v[u][1], wd);
                        if (KIND == KIND_INT8) {
                            w0 ^= 0x80808080u;
                            w1 ^= 0x80808080u;
                        }
                        const u32 h0 = w0 >> QMTraits<KIND>::SH, h1 = w1 >> QMTraits<KIND>::SH;
#pragma unroll
                        for (int m = 0; m < NR / 2; m++) {
                            const int j = wd * (NR / 2) + m;
                            if ((j & 1) == 0 && bon) bv = bq[(j >> 1) * 8];
                            const u32 b0 = (j & 1) ? bv.z : bv.x, b1 = (j & 1) ? bv.w : bv.y;
                            if (SKIP & 4) {
                                c4[m & 3] += __uint_as_float((qm_reg<KIND>(w0, h0, 2 * m) ^
                                                              qm_reg<KIND>(w1, h1, 2 * m + 1) ^ b0 ^ b1) &
                                                             0x007fffffu);
                            } else {
                                mma16816(c4, qm_reg<KIND>(w0, h0, 2 * m), qm_reg<KIND>(w1, h1, 2 * m),
                                         qm_reg<KIND>(w0, h0, 2 * m + 1),
                                         qm_reg<KIND>(w1, h1, 2 * m + 1), b0, b1);
                            }
                        }
                    }
                    if (con) {
                        const int cq = 4 * q + qt * cpq;
                        float sx = sxc[cq];
                        for (int i = 1; i < cpq; i++) sx += sxc[cq + i];
                        const float f = qf[q];
#pragma unroll
                        for (int i = 0; i < 2; i++) {
                            const float sc = h2f((half_bits)(cur.sm[u][i] & 0xffff));
                            const float a = (c4[2 * i] + c4[2 * i + 1]) * f;
                            if (KIND == KIND_INT8) {
                                acc[i] = fmaf(sc, fmaf(-128.f, sx, a), acc[i]);
                            } else {
                                const float mn = h2f((half_bits)(cur.sm[u][i] >> 16));
                                acc[i] = fmaf(sc, a, fmaf(mn, sx, acc[i]));
                            }
                        }
                    }
                }
            }
            if (nk == 0) {
                // Tile t done: its rows' sums, in a fixed order (lanes t, then the split warps).
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 1);
                    acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 2);
                }
                if (split == 1) {
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        const int r = t * tile_rows + g * 16 + qg + 8 * i;
                        if (qt == 0 && r < w.rows) {
                            y[r] = ct0 > 0 ? y[r] + acc[i] : acc[i];
                        }
                    }
                } else {
                    float* rb = red + parity * warps * 16;
                    if (qt == 0) {
                        rb[warp * 16 + qg] = acc[0];
                        rb[warp * 16 + qg + 8] = acc[1];
                    }
                    __syncthreads();
                    const int r = t * tile_rows + g * 16 + lane;
                    if (s == 0 && lane < 16 && r < w.rows) {
                        float sum = 0.f;
                        for (int ss = 0; ss < split; ss++) sum += rb[(g * split + ss) * 16 + lane];
                        y[r] = ct0 > 0 ? y[r] + sum : sum;
                    }
                    parity ^= 1;
                }
                acc[0] = acc[1] = 0.f;
            }
            if (!more) break;
            cur = nxt;
            t = nt;
            k = nk;
        }
    }
#endif
}

// U = 2 quads per step (a lane loads 64 bytes of codes per step, as matvec_q_* do). At most 512
// threads (the plans' 16 warps), so at most 128 registers: the selecting kernels then run with
// the plain kernels' plans.
INT_MATVEC_KERNELS(matvec_qm, matvec_qm_body, matvec_qm_body, 2, __launch_bounds__(512),
                   __launch_bounds__(512))
