// Decode products on 32-column chunks in the dp4a form, for layouts whose codes are not whole
// 16-byte chunks of one group: ap8's bit planes (ap8.cu) and int2k's 16-value groups (below).
//
// A lane takes a 32-column chunk of R rows, the warp 32 chunks of them a step, the next step's
// loads issued before the current one is computed; blocks of 256, about three an SM, walk tiles of
// R rows (c32_rows). A chunk's codes are eight words of four byte codes each, in an order
// the layout's bits give cheaply (C32_PLANES: (plane >> j) & 0x01010101 takes a 32-bit plane word
// apart into columns j + 8b, and two byte permutes pair words j and j + 1 into staged words j (columns
// j + 8b' and j + 1 + 8b' of the first 16) and j + 1 (the same plus 16), so a word lies in one 16;
// C32_INT2: columns 16 (j / 4) + j % 4 + 4b, int2's (w >> 2j) & 0x03030303). x's chunk c is staged
// in the same order as
// xq = round(x * 2^-e) (16 bits: e puts the chunk's largest |x| in [2^14, 2^15), matvec_q_stage.cu's
// qdstage rule), in two byte planes (high signed, low unsigned), beside (2^e, the sums of x over
// each 16-column half, over the chunk); a word meets each plane in one dp4a (exact integer sums),
// a group's sum becomes one float times 2^e, then its scale and min. The only approximation is x's
// rounding to 16 bits of its chunk's largest |x|, as the integer kinds' (NMSE 1e-8).
// tools/c32_emulate.py runs this lane by lane on the CPU.
// A tile is a team's of `split` warps (1, 2, 4 or 8: plan.rs c32_split), member m taking steps m,
// m + split, ... of its rows, the team's sums added in member order: short, wide matrices
// (4096 x 14336) walked a warp a tile filled a third of the block slots
// (benches/results/2026-12-05-h100-issue54-c32-teams.md).

#define C32_PLANES 0
#define C32_INT2 1

// Staged x: chunk c's 64 bytes of planes as four 16-byte words (q: high words 0-3, 4-7, low words
// 0-3, 4-7) at uint4 c32_xat(c, q), a warp's 32 chunks consecutive (no bank conflicts); then a
// float4 a chunk (c32_sums: 2^e, the two 16-column halves' sums, the chunk's sum).
// Shared memory: 80 bytes a chunk, the planes in whole runs of 32 chunks (Gpu::c32_launch).
__device__ __forceinline__ int c32_xat(int c, int q) { return ((c >> 5) * 4 + q) * 32 + (c & 31); }
__device__ __forceinline__ const float4* c32_sums(const uint4* xq, int cols) {
    return reinterpret_cast<const float4*>(xq + (((cols >> 5) + 31) >> 5) * 128);
}

// The column of byte b of word j in a chunk.
template <int ORDER>
__device__ __forceinline__ int c32_col(int j, int b) {
    return ORDER == C32_PLANES ? 2 * (j >> 1) + (b >> 1) + 8 * (b & 1) + 16 * (j & 1)
                               : 16 * (j >> 2) + (j & 3) + 4 * b;
}

// Stage x (cols columns, a multiple of 32): a thread a word of a chunk (8 adjacent lanes a
// chunk). Block-wide; ends with a barrier.
template <int ORDER>
__device__ void c32_stage(const float* __restrict__ x, int cols, uint4* xq) {
    const int nch = cols >> 5, nw = nch * 8;
    u32* xw = reinterpret_cast<u32*>(xq);
    float4* xsx = const_cast<float4*>(c32_sums(xq, cols));
    for (int m0 = 0; m0 < nw; m0 += blockDim.x) {
        const int m = m0 + threadIdx.x;
        const bool in = m < nw;
        const int c = m >> 3, j = m & 7;
        float v[4];
#pragma unroll
        for (int b = 0; b < 4; b++) v[b] = in ? __ldg(x + 32 * c + c32_col<ORDER>(j, b)) : 0.f;
        float am = fmax_nan(fmax_nan(fabsf(v[0]), fabsf(v[1])), fmax_nan(fabsf(v[2]), fabsf(v[3])));
        // Each 16-column half's sum (a word lies in half j / 4, C32_INT2, or j % 2, C32_PLANES),
        // and the chunk's.
        const float p = (v[0] + v[1]) + (v[2] + v[3]);
        const bool first = ORDER == C32_INT2 ? j < 4 : (j & 1) == 0;
        float sum = p, h0 = first ? p : 0.f, h1 = first ? 0.f : p;
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) {
            am = fmax_nan(am, __shfl_xor_sync(0xffffffffu, am, o));
            // a + b == b + a: the same sums in all 8 lanes.
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
            h0 += __shfl_xor_sync(0xffffffffu, h0, o);
            h1 += __shfl_xor_sync(0xffffffffu, h1, o);
        }
        if (!in) continue;
        const int E = (int)(__float_as_uint(am) >> 23);
        const bool bad = E == 255;
        // |x| < 2^(E - 126): x * 2^(141 - E) < 2^15 (qdstage's rule at 16 bits).
        const int ep = max(E, 14);
        const float mz = bad ? 0.f : __uint_as_float((u32)(268 - ep) << 23);
        const float xs = bad ? __uint_as_float(0x7fc00000u) : ldexp2(1.0f, ep - 141);
        const u32 t01 = __vmaxs2(pack_s16_rn(v[0] * mz, v[1] * mz), 0x80018001u);
        const u32 t23 = __vmaxs2(pack_s16_rn(v[2] * mz, v[3] * mz), 0x80018001u);
        xw[c32_xat(c, j >> 2) * 4 + (j & 3)] = __byte_perm(t01, t23, 0x7531);  // high bytes
        xw[c32_xat(c, 2 + (j >> 2)) * 4 + (j & 3)] = __byte_perm(t01, t23, 0x6420);
        if (j == 0) xsx[c] = make_float4(xs, h0, h1, sum);
    }
    __syncthreads();
}

extern __shared__ float4 c32_smem[];

// A lane's staged x for chunk c: the high and low planes' eight words, and its float4.
struct C32X {
    uint4 h0, h1, l0, l1;
    float4 e;
};
__device__ __forceinline__ C32X c32_x(const uint4* xq, int cols, int c, bool in) {
    C32X x;
    if (in) {
        x.h0 = xq[c32_xat(c, 0)];
        x.h1 = xq[c32_xat(c, 1)];
        x.l0 = xq[c32_xat(c, 2)];
        x.l1 = xq[c32_xat(c, 3)];
        x.e = c32_sums(xq, cols)[c];
    }
    return x;
}
__device__ __forceinline__ u32 c32_word(const uint4& a, const uint4& b, int j) {
    const uint4& v = j < 4 ? a : b;
    const int i = j & 3;
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
// Word j's codes q times both x planes, added into hi and lo.
__device__ __forceinline__ void c32_dot(u32 q, const C32X& x, int j, int& hi, int& lo) {
    hi = qd_dot<KIND_INT4, true>(q, c32_word(x.h0, x.h1, j), hi);
    lo = qd_dot<KIND_INT4, false>(q, c32_word(x.l0, x.l1, j), lo);
}

// A streamed 4-byte load of codes read once (skip L1; 8 bytes: matvec_q.cu's qld2).
__device__ __forceinline__ u32 c32_ld1(const u32* p) {
    u32 v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// A team's tiles of R rows of the layout L (L::Buf<R>; L::load of step s of tile t, L::step adding
// each row's products into acc), a warp's loads one of its steps ahead; `stage` (block-wide: every
// warp calls it once) runs once the first step's loads are out. Teams of `split` adjacent warps
// (1, 2, 4 or 8: a divisor of the block's 8 warps, or a team's barrier never fills; a member past
// the row's steps adds zeros, as tools/c32_emulate.py checks); a tile's sums meet in shared memory (two buffers by tile parity: one named barrier a tile), member 0
// adding them in member order. Teams walk tiles blockIdx.x * teams + team, then by all the teams.
// Barriers 1-4 by literal ids (a register id makes ptxas reserve all 16 a block).
__device__ __forceinline__ void c32_team_sync(int team, int split) {
    const int n = 32 * split;
    switch (team) {
        case 0: asm volatile("bar.sync 1, %0;" ::"r"(n) : "memory"); break;
        case 1: asm volatile("bar.sync 2, %0;" ::"r"(n) : "memory"); break;
        case 2: asm volatile("bar.sync 3, %0;" ::"r"(n) : "memory"); break;
        default: asm volatile("bar.sync 4, %0;" ::"r"(n) : "memory"); break;
    }
}
template <int R, typename L, typename F>
__device__ __forceinline__ void c32_rows(const L& l, const Mat& w, float* __restrict__ y,
                                         int split, const uint4* xq, F&& stage) {
    __shared__ float part[2][8][R];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, ns = ((w.cols >> 5) + 31) >> 5;
    const int teams = (blockDim.x >> 5) / split, team = warp / split, m = warp % split;
    const int tstride = gridDim.x * teams, ntiles = (w.rows + R - 1) / R;
    int t = blockIdx.x * teams + team, s = m, parity = 0;
    typename L::template Buf<R> cur;
    if (t < ntiles) l.template load<R>(w, t, s, lane, cur);
    stage();
    float acc[R];
#pragma unroll
    for (int ri = 0; ri < R; ri++) acc[ri] = 0.f;
    while (t < ntiles) {
        int nt = t, nsn = s + split;
        if (nsn >= ns) {
            nsn = m;
            nt += tstride;
        }
        typename L::template Buf<R> nxt;
        if (nt < ntiles) l.template load<R>(w, nt, nsn, lane, nxt);
        l.template step<R>(w, cur, s, lane, xq, acc);
        if (nt != t) {
            const float v = qreduce<R>(acc, lane);
            const int ri = lane / (32 / R), r = t * R + ri;
            const bool out = lane % (32 / R) == 0;
            if (split == 1) {
                if (out && r < w.rows) y[r] = v;
            } else {
                if (out) part[parity][warp][ri] = v;
                c32_team_sync(team, split);
                if (m == 0 && out && r < w.rows) {
                    float sum = v;
                    for (int i = 1; i < split; i++) sum += part[parity][warp + i][ri];
                    y[r] = sum;
                }
                parity ^= 1;
            }
#pragma unroll
            for (int i = 0; i < R; i++) acc[i] = 0.f;
        }
        cur = nxt;
        t = nt;
        s = nsn;
    }
}

// Blocks an SM the kernels' registers allow (80 registers on sm_90; ptxas spills there on sm_8x).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define C32_BLOCKS 2
#else
#define C32_BLOCKS 3
#endif

// The kernels' entries: `run(w, y, xq, split, stage)` walks the rows (c32_rows), `stage` staging x in
// ORDER once the rows' first loads are out. Plain: x is the kernel before's output (waited for
// in stage). Routed (matvec_mxfp4_sel's contract: moe.cu sel_mat and "Ordering"; glu refused by
// the launcher): entry which0 of the routes' table, its own x and y.
template <int ORDER, typename Run>
__device__ __forceinline__ void c32_plain(const Mat& w, const float* x, float* y, int split,
                                          Run&& run) {
    pdl_trigger();
    uint4* xq = reinterpret_cast<uint4*>(c32_smem);
    auto stage = [&] {
        pdl_wait();
        c32_stage<ORDER>(x, w.cols, xq);
    };
    run(w, y, xq, max(split, 1), stage);
}
template <int ORDER, typename Run>
__device__ __forceinline__ void c32_routed(SEL_ARGS, int split, Run&& run) {
    if (which0 == 0) {
        pdl_wait();
        pdl_trigger();
    }
    const Mat w = sel_mat(tab, routes, k, which0);
    const float* xin = SEL_X;
    uint4* xq = reinterpret_cast<uint4*>(c32_smem);
    auto stage = [&] {
        if (which0 > 0) pdl_wait();
        c32_stage<ORDER>(xin, w.cols, xq);
    };
    run(w, SEL_Y, xq, max(split, 1), stage);
}

// ---------------------------------------------------------------------------------------------
// int2k (kind 9): int2's codes (a row's 8 bytes a chunk, element e at bits 2 (e % 16) of word
// e / 16) in groups of 16, each group's (scale, min) from its sub-scale byte and the row's pair
// (int2k_sm). A chunk is two groups: words 0-3 the first (C32_INT2's order), 4-7 the second.
struct Int2kC32 {
    template <int R>
    struct Buf {
        uint2 code[R];
        u32 ab[R];  // the chunk's two sub-scale bytes
        u32 dm[R];  // the row's pair
    };

    template <int R>
    __device__ __forceinline__ void load(const Mat& w, int t, int s, int lane, Buf<R>& b) const {
        const int c = s * 32 + lane;
        const bool in = c < (w.cols >> 5);
#pragma unroll
        for (int ri = 0; ri < R; ri++) {
            const int r = min(t * R + ri, w.rows - 1);
            const u8* row = w.codes + (size_t)r * w.row_bytes;
            b.code[ri] = in ? qld2(reinterpret_cast<const uint2*>(row) + c) : make_uint2(0u, 0u);
            const size_t g = (size_t)r * (w.cols >> 4) + 2 * c;
            b.ab[ri] = in ? (u32)__ldg(reinterpret_cast<const unsigned short*>(
                                reinterpret_cast<const u8*>(w.scales) + g))
                          : 0u;
            b.dm[ri] = __ldg(reinterpret_cast<const u32*>(w.mins) + r);
        }
    }

    template <int R>
    __device__ __forceinline__ void step(const Mat& w, const Buf<R>& b, int s, int lane,
                                         const uint4* xq, float (&acc)[R]) const {
        const int c = s * 32 + lane;
        const bool in = c < (w.cols >> 5);
        if (!in) return;
        const C32X x = c32_x(xq, w.cols, c, true);
#pragma unroll
        for (int ri = 0; ri < R; ri++) {
            int hi[2] = {0, 0}, lo[2] = {0, 0};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const u32 src = j < 4 ? b.code[ri].x : b.code[ri].y;
                c32_dot((src >> (2 * (j & 3))) & 0x03030303u, x, j, hi[j >> 2], lo[j >> 2]);
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                // int2k_sm's arithmetic on the group's byte (a low nibble, b signed high).
                const u32 v = (b.ab[ri] >> (8 * h)) & 0xffu;
                const u32 sm = int4k_ab((v & 15u) | ((u32)(u8)((signed char)v >> 4) << 8), b.dm[ri]);
                const float sc = h2f((half_bits)(sm & 0xffffu)), mn = h2f((half_bits)(sm >> 16));
                const float q = __int2float_rn(hi[h] * 256 + lo[h]) * x.e.x;
                acc[ri] = __fmaf_rn(sc, q, __fmaf_rn(mn, h == 0 ? x.e.y : x.e.z, acc[ri]));
            }
        }
    }
};

// y = W x for int2k (cols % 32 == 0, rows 8-byte aligned: Gpu::c32_int2k); x 16-byte aligned.
// Int2kC32 on c32_rows, 4 rows a warp.
struct Int2kRows {
    template <typename F>
    __device__ __forceinline__ void operator()(const Mat& w, float* y, const uint4* xq, int split,
                                               F& stage) const {
        c32_rows<4>(Int2kC32(), w, y, split, xq, stage);
    }
};
extern "C" __global__ void __launch_bounds__(256, C32_BLOCKS)
    matvec_int2k_c32(const Mat w, const float* x, float* y, int split) {
    c32_plain<C32_INT2>(w, x, y, split, Int2kRows());
}

// The routed experts of one token (c32_routed; tchunks unused).
extern "C" __global__ void __launch_bounds__(256, C32_BLOCKS)
    matvec_int2k_c32_sel(SEL_ARGS, int split, int tchunks) {
    c32_routed<C32_INT2>(tab, routes, k, which0, x, xs, glu, y, ys, split, Int2kRows());
}
