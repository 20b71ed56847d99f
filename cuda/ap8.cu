// ap8 (kind 10, formats/hob.md; src/format/ap8.rs): an expert's three matrices as the bit planes
// of one 8-bit parent, read at width k (2..8) from a prefix of the blob: the parent's top two bits
// (int2's packing), then one plane a width, most significant first. A Mat of kind 10 is one
// matrix of such a blob: codes the blob's start, group 16 (a parent range a 16, from its row's
// pair and its byte; a correction byte a 64), row_bytes k | part << 8 (DevMat::new; part 0 gate,
// 1 up, 2 down).
//
// Decode runs the dp4a form (matvec_ap8d, _sel, below, on matvec_c32.cu's loop): codes built as
// bytes from the planes' natural bit order, times x staged as 16-bit integers. The f32 form before it (matvec_ap8, _sel:
// a lane builds 16 codes and multiplies them as floats, exact products; 13-26% of the copy
// bandwidth on the H200, benches/results/2026-12-04-h200-issue54-ap8-gpu.md) stays as the
// gpu_matvec bench's comparison until the dp4a form is measured on a device.

// Where one matrix's pieces lie (ApLayout in src/format/ap8.rs: every piece 64-byte aligned).
struct Ap8Part {
    const u32* pairs;  // each row's (d | dm << 16), f16 bits
    const u8* subs;    // a byte a 16: a (low nibble), b (high)
    const u8* corr;  // width k's correction bytes (k <= 4, one a 64), else null
    const u8* top;   // the codes' top two bits: element e at bits 2 (e % 4) of byte e / 4
    const u8* planes[6];  // parent bits 5..0 (read from width 3..8 on): element e at bit e % 8 of byte e / 8
    int k, gpr;  // the width; 16s a row
};

__device__ __forceinline__ size_t ap8_al(size_t n) { return (n + 63) & ~(size_t)63; }

__device__ __forceinline__ Ap8Part ap8_part(const Mat& w) {
    const size_t n = (size_t)w.rows * w.cols, G = n / 64;
    const int k = w.row_bytes & 0xff, p = (w.row_bytes >> 8) & 3;
    // The gate and up parts have ffn rows, down hidden: down is [hidden, ffn].
    const size_t ffn = p == 2 ? w.cols : w.rows, hidden = p == 2 ? w.rows : w.cols;
    // Segment 2 (width 2): per matrix its row pairs, a byte a 16, width 2's corrections, the
    // top bits; segments 3 and 4: per matrix a correction array and a plane; segments 5..8: a
    // plane per matrix.
    const size_t s2f = ap8_al(4 * ffn) + ap8_al(n / 16) + ap8_al(G) + ap8_al(n / 4);
    const size_t s2h = ap8_al(4 * hidden) + ap8_al(n / 16) + ap8_al(G) + ap8_al(n / 4);
    const size_t s34 = ap8_al(G) + ap8_al(n / 8), s5 = ap8_al(n / 8);
    const size_t base = 64 + p * s2f, end2 = 64 + 2 * s2f + s2h;
    const size_t pr = ap8_al(4 * (size_t)w.rows);
    Ap8Part a;
    a.pairs = reinterpret_cast<const u32*>(w.codes + base);
    a.subs = w.codes + base + pr;
    a.top = w.codes + base + pr + ap8_al(n / 16) + ap8_al(G);
    a.corr = k == 2   ? w.codes + base + pr + ap8_al(n / 16)
             : k <= 4 ? w.codes + end2 + (size_t)(k - 3) * 3 * s34 + p * s34
                      : nullptr;
    a.gpr = w.cols >> 4;
#pragma unroll
    for (int j = 0; j < 6; j++)
        a.planes[j] = w.codes + (j < 2 ? end2 + (size_t)j * 3 * s34 + p * s34 + ap8_al(G)
                                       : end2 + 6 * s34 + (size_t)(j - 2) * 3 * s5 + p * s5);
    a.k = k;
    return a;
}

// A 16's table: its parent pair (s8 | m8 << 16: format::ap8::sub_pair, f16 of the f32 products)
// from its row's pair pr and its byte sb, and, for the corrected widths, its 64's correction byte.
__device__ __forceinline__ uint2 ap8_table_of(u32 pr, u32 sb, u32 corr) {
    const float d = h2f((half_bits)(pr & 0xffffu)), dm = h2f((half_bits)(pr >> 16));
    const u32 s8 = f2h(__fmul_rn(d, (float)(sb & 15u)));
    const u32 m8 = f2h(-__fmul_rn(dm, (float)(sb >> 4)));
    return make_uint2(s8 | (m8 << 16), corr);
}
// 16 g's table, read from the matrix.
__device__ __forceinline__ uint2 ap8_table(const Ap8Part& a, size_t g) {
    return ap8_table_of(__ldg(a.pairs + g / (size_t)a.gpr), __ldg(a.subs + g),
                        a.k <= 4 ? (u32)__ldg(a.corr + (g >> 2)) : 0u);
}

// v / 3 rounded as f32 division rounds it, for an integer v in -8..7 (a product by 1/3 is off for
// +-5 and +-7; one residual step mends it: checked for all 16 values in tools/c32_emulate.py).
__device__ __forceinline__ float ap8_third(float v) {
    const float q = __fmul_rn(v, 1.f / 3.f);
    return __fmaf_rn(__fmaf_rn(-q, 3.f, v), 1.f / 3.f, q);
}

// A group's (scale, min) at width k from its table: format::ap8::group_params, each f32 step in
// its order (no contraction), rounded to f16 as it does.
__device__ __forceinline__ float2 ap8_params(uint2 t, int k) {
    const float s8 = h2f((half_bits)(t.x & 0xffffu)), m8 = h2f((half_bits)(t.x >> 16));
    if (k >= 8) return make_float2(s8, m8);
    const float h = (float)(1 << (8 - k));
    const float s = __fmul_rn(s8, h);
    const float m = __fadd_rn(m8, __fmul_rn(s8, (h - 1.f) * 0.5f));
    if (k > 4) return make_float2(h2f(f2h(s)), h2f(f2h(m)));
    const float ca = (float)((int)(signed char)(u8)(t.y << 4) >> 4);
    const float cb = (float)((int)(signed char)(u8)t.y >> 4);
    // a / 96 = (a / 3) 2^-5 and b / 24 = (b / 3) 2^-3, both exact scalings.
    const float fa = __fmaf_rn(ap8_third(ca), 0.03125f, 1.f), fb = __fmul_rn(ap8_third(cb), 0.125f);
    return make_float2(h2f(f2h(__fmul_rn(s, fa))), h2f(f2h(__fadd_rn(m, __fmul_rn(s, fb)))));
}

// The raw bits of unit u (elements 16u .. 16u + 15 of the matrix): a word of top bits and a
// u16 of each plane the width reads.
struct Ap8Unit {
    u32 top;
    u32 pl[6];
};

template <int K>
__device__ __forceinline__ Ap8Unit ap8_load(const Ap8Part& a, size_t u) {
    Ap8Unit b;
    b.top = __ldg(reinterpret_cast<const u32*>(a.top) + u);
#pragma unroll
    for (int j = 0; j < K - 2; j++)
        b.pl[j] = __ldg(reinterpret_cast<const unsigned short*>(a.planes[j]) + u);
    return b;
}

// Bits 0..3 of v to bit 0 of bytes 0..3 (the products land on distinct bits: no carries).
__device__ __forceinline__ u32 ap8_spread1(u32 v) { return ((v & 15u) * 0x00204081u) & 0x01010101u; }
// The four 2-bit fields of byte v to bytes 0..3.
__device__ __forceinline__ u32 ap8_spread2(u32 v) {
    return (v | (v << 6) | (v << 12) | (v << 18)) & 0x03030303u;
}

// Codes 4i .. 4i + 3 of a unit at width K, as bytes.
template <int K>
__device__ __forceinline__ u32 ap8_word(const Ap8Unit& b, int i) {
    u32 w = ap8_spread2((b.top >> (8 * i)) & 0xffu) << (K - 2);
#pragma unroll
    for (int j = 0; j < K - 2; j++) w |= ap8_spread1(b.pl[j] >> (4 * i)) << (K - 3 - j);
    return w;
}

// F<K>(args...) for the width k of a view (2..8).
#define AP8_WIDTHS(F, k, ...)                  \
    switch (k) {                               \
        case 2: return F<2>(__VA_ARGS__);      \
        case 3: return F<3>(__VA_ARGS__);      \
        case 4: return F<4>(__VA_ARGS__);      \
        case 5: return F<5>(__VA_ARGS__);      \
        case 6: return F<6>(__VA_ARGS__);      \
        case 7: return F<7>(__VA_ARGS__);      \
        default: return F<8>(__VA_ARGS__);     \
    }

// Byte j of v as a float (exact: under 2^23's exponent, less 2^23).
__device__ __forceinline__ float ap8_byte(u32 v, int j) {
    return __uint_as_float(__byte_perm(v, 0x4b000000u, 0x7440u + j)) - 8388608.f;
}

// x staged in shared memory for all of a block's rows (the staged kernels' dynamic shared
// memory, whole passes of 512 columns): unit u's word i (columns 16 u + 4 i .. + 3) at float4
// (u >> 5) * 128 + i * 32 + (u & 31), so that a warp's loads of 32 consecutive units are
// consecutive. (Read from global memory, a lane's x lies 64 bytes from the next lane's.)
extern __shared__ float4 ap8_xs[];

__device__ __forceinline__ void ap8_stage_x(const float* __restrict__ x, int cols) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int j = threadIdx.x; j < (cols >> 2); j += blockDim.x) {
        const int u = j >> 2, i = j & 3;
        ap8_xs[(u >> 5) * 128 + i * 32 + (u & 31)] = x4[j];
    }
    __syncthreads();
}

// Row r's product with x, summed across the warp. Passes of 32 groups: a lane computes one
// group's (scale, min); then the pass's 16-value units a lane at a time (DEPTH in flight, loaded
// with the tables), each unit's codes times x and its sum of x under its group's pair, shuffled
// from the lane that computed it. With `wait`: pdl_wait() once the first loads are out (x is the kernel
// before's output). STAGED: x from ap8_xs (x unused, wait false).
template <int K, bool STAGED = false, int DEPTH = 2>
__device__ __forceinline__ float ap8_row_dot_k(const Mat& w, const Ap8Part& a, int r,
                                             const float* __restrict__ x, int lane,
                                             bool wait) {
    const int gpr = w.cols / w.group, upg = w.group >> 4;
    const int ushift = (upg & (upg - 1)) == 0 ? __ffs(upg) - 1 : -1;
    const size_t g0 = (size_t)r * gpr, u0 = (size_t)r * (w.cols >> 4);
    float acc = 0.f;
    for (int gb = 0; gb < gpr; gb += 32) {
        const int ng = min(32, gpr - gb), nu = ng * upg;
        const size_t ub = u0 + (size_t)gb * upg;
        // The pass's first DEPTH units a lane and its group's table in one round trip.
        uint2 t = make_uint2(0u, 0u);
        if (lane < ng) t = ap8_table(a, g0 + gb + lane);
        Ap8Unit b[DEPTH];
#pragma unroll
        for (int d = 0; d < DEPTH; d++)
            if (lane + 32 * d < nu) b[d] = ap8_load<K>(a, ub + lane + 32 * d);
        if (wait) {
            pdl_wait();
            wait = false;
        }
        const float2 sm = lane < ng ? ap8_params(t, K) : make_float2(0.f, 0.f);
        for (int i0 = 0; i0 < nu; i0 += 32 * DEPTH) {
            if (i0 > 0) {
#pragma unroll
                for (int d = 0; d < DEPTH; d++)
                    if (i0 + lane + 32 * d < nu) b[d] = ap8_load<K>(a, ub + i0 + lane + 32 * d);
            }
#pragma unroll
            for (int d = 0; d < DEPTH; d++) {
                const int u = i0 + lane + 32 * d;
                const int gi = ushift >= 0 ? u >> ushift : u / upg;
                const float s = __shfl_sync(0xffffffffu, sm.x, gi & 31);
                const float m = __shfl_sync(0xffffffffu, sm.y, gi & 31);
                if (u >= nu) continue;
                const int ug = gb * upg + u;
                const float4* xv = reinterpret_cast<const float4*>(x + (size_t)ug * 16);
                float qx = 0.f, sx = 0.f;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const u32 q = ap8_word<K>(b[d], i);
                    const float4 xq = STAGED ? ap8_xs[(ug >> 5) * 128 + i * 32 + (ug & 31)] : xv[i];
                    qx = __fmaf_rn(ap8_byte(q, 0), xq.x, qx);
                    qx = __fmaf_rn(ap8_byte(q, 1), xq.y, qx);
                    qx = __fmaf_rn(ap8_byte(q, 2), xq.z, qx);
                    qx = __fmaf_rn(ap8_byte(q, 3), xq.w, qx);
                    sx += (xq.x + xq.y) + (xq.z + xq.w);
                }
                acc = __fmaf_rn(s, qx, __fmaf_rn(m, sx, acc));
            }
        }
    }
    if (wait) pdl_wait();
    return warp_sum(acc);
}

__device__ __forceinline__ float ap8_row_dot(const Mat& w, const Ap8Part& a, int r,
                                           const float* __restrict__ x, int lane, bool wait) {
    AP8_WIDTHS(ap8_row_dot_k, a.k, w, a, r, x, lane, wait)
}

template <int K>
__device__ __forceinline__ float ap8_row_dot_xs_k(const Mat& w, const Ap8Part& a, int r,
                                                int lane) {
    return ap8_row_dot_k<K, true>(w, a, r, nullptr, lane, false);
}

// ap8_row_dot with x staged (ap8_stage_x).
__device__ __forceinline__ float ap8_row_dot_xs(const Mat& w, const Ap8Part& a, int r, int lane) {
    AP8_WIDTHS(ap8_row_dot_xs_k, a.k, w, a, r, lane)
}

// A block's rows (a warp a row, blockIdx.x * warps + warp, then gridDim.x * warps on) on x staged.
__device__ __forceinline__ void ap8_rows_xs(const Mat& w, const float* __restrict__ x,
                                            float* __restrict__ y) {
    ap8_stage_x(x, w.cols);
    const Ap8Part a = ap8_part(w);
    const int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
    for (int r = blockIdx.x * warps + (threadIdx.x >> 5); r < w.rows; r += gridDim.x * warps) {
        const float v = ap8_row_dot_xs(w, a, r, lane);
        if (lane == 0) y[r] = v;
    }
}

// y = W x: a warp a row, 8 rows a block; x 16-byte aligned. staged: x in shared memory (its
// size from ap8_stage_x), the blocks walking the rows.
extern "C" __global__ void matvec_ap8(const Mat w, const float* x, float* y, int staged) {
    pdl_trigger();
    if (staged) {
        pdl_wait();
        ap8_rows_xs(w, x, y);
        return;
    }
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= w.rows) {
        pdl_wait();
        return;
    }
    const Ap8Part a = ap8_part(w);
    const float v = ap8_row_dot(w, a, r, x, lane, true);
    if (lane == 0) y[r] = v;
}

// The routed experts of one token (matvec_mxfp4_sel's contract: moe.cu sel_mat and "Ordering";
// glu refused by the launcher, tchunks unused; split: x staged, as matvec_ap8's staged). The
// table's matrices may differ in width (a high and a low view of one file): each entry carries
// its own.
extern "C" __global__ void matvec_ap8_sel(SEL_ARGS, int split, int tchunks) {
    if (which0 == 0) {
        pdl_wait();
        pdl_trigger();
    }
    const Mat w = sel_mat(tab, routes, k, which0);
    const float* xin = SEL_X;
    float* yout = SEL_Y;
    if (split) {
        if (which0 > 0) pdl_wait();
        ap8_rows_xs(w, xin, yout);
        return;
    }
    const Ap8Part a = ap8_part(w);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    bool wait = which0 > 0;
    for (int r = blockIdx.x * warps + warp; r < w.rows; r += gridDim.x * warps) {
        // Waits (after its first loads) where which0 > 0: x is the kernel before's output.
        const float v = ap8_row_dot(w, a, r, xin, lane, wait);
        wait = false;
        if (lane == 0) yout[r] = v;
    }
    if (wait) pdl_wait();
}

// ---------------------------------------------------------------------------------------------
// The dp4a form (decode; matvec_c32.cu's loop, C32_PLANES order): a chunk's words built straight
// from the planes' natural bit order (one shift and one AND a plane and word), the top bits
// brought into the same order by two byte permutes. A chunk holds two 16s (bytes 0-1 of every
// such word in the first, 2-3 in the second): two more byte permutes pair words j and j + 1 into
// one word a 16 (C32_PLANES' staged order), each meets x once, and each half's sum takes its own
// (scale, min). A lane loads its own chunk's two tables a row with its codes.

// Word j of a chunk: the K-bit codes of columns j + 8b at byte b, from the rearranged top bits
// (tp: words 0-3 of A, 4-7 of B) and the K - 2 planes.
template <int K>
__device__ __forceinline__ u32 ap8d_word(u32 tp, const u32 (&pl)[6], int j) {
    const int sh = 2 * (j & 3) - (K - 2);
    u32 w = (sh >= 0 ? tp >> sh : tp << -sh) & (0x03030303u << (K - 2));
#pragma unroll
    for (int p = 0; p < K - 2; p++) {
        const int tb = K - 3 - p, ps = j - tb;
        w |= (ps >= 0 ? pl[p] >> ps : pl[p] << -ps) & (0x01010101u << tb);
    }
    return w;
}

template <int K>
struct Ap8C32 {
    Ap8Part a;

    __device__ __forceinline__ explicit Ap8C32(const Mat& w) : a(ap8_part(w)) {}

    template <int R>
    struct Buf {
        uint2 top[R];
        u32 pl[R][6];
        // The chunk's two bytes (a 16's each) with its 64's correction byte at bits 16..23; the
        // row's pair is read in `step` (an L1 hit after a tile's first step: fewer registers in
        // flight), where the two tables are made.
        u32 sc[R];
        int r0;  // the tile's first row
    };

    template <int R>
    __device__ __forceinline__ void load(const Mat& w, int t, int s, int lane, Buf<R>& b) const {
        const int nch = w.cols >> 5, c = s * 32 + lane;
        const bool in = c < nch;
        b.r0 = t * R;
#pragma unroll
        for (int ri = 0; ri < R; ri++) {
            const size_t r = (size_t)min(t * R + ri, w.rows - 1), u = r * nch + c;
            b.top[ri] = in ? qld2(reinterpret_cast<const uint2*>(a.top) + u) : make_uint2(0u, 0u);
#pragma unroll
            for (int p = 0; p < K - 2; p++)
                b.pl[ri][p] = in ? c32_ld1(reinterpret_cast<const u32*>(a.planes[p]) + u) : 0u;
            const size_t g = r * a.gpr + 2 * c;  // even: rows are whole 64s
            b.sc[ri] = in ? (u32)__ldg(reinterpret_cast<const unsigned short*>(a.subs) + g / 2) |
                                (K <= 4 ? (u32)__ldg(a.corr + (g >> 2)) << 16 : 0u)
                          : 0u;
        }
    }

    template <int R>
    __device__ __forceinline__ void step(const Mat& w, const Buf<R>& b, int s, int lane,
                                         const uint4* xq, float (&acc)[R]) const {
        const int c = s * 32 + lane;
        const bool in = c < (w.cols >> 5);
        const C32X x = c32_x(xq, w.cols, c, in);
#pragma unroll
        for (int ri = 0; ri < R; ri++) {
            if (!in) continue;
            const u32 A = __byte_perm(b.top[ri].x, b.top[ri].y, 0x6420);
            const u32 B = __byte_perm(b.top[ri].x, b.top[ri].y, 0x7531);
            int hi0 = 0, lo0 = 0, hi1 = 0, lo1 = 0;
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                const u32 q0 = ap8d_word<K>(j < 4 ? A : B, b.pl[ri], j);
                const u32 q1 = ap8d_word<K>(j < 4 ? A : B, b.pl[ri], j + 1);
                c32_dot(__byte_perm(q0, q1, 0x5410), x, j, hi0, lo0);
                c32_dot(__byte_perm(q0, q1, 0x7632), x, j + 1, hi1, lo1);
            }
            const u32 pr = __ldg(a.pairs + min(b.r0 + ri, w.rows - 1)), sc = b.sc[ri];
            const float2 s0 = ap8_params(ap8_table_of(pr, sc & 0xffu, sc >> 16), K);
            const float2 s1 = ap8_params(ap8_table_of(pr, (sc >> 8) & 0xffu, sc >> 16), K);
            const float v0 = __int2float_rn(hi0 * 256 + lo0) * x.e.x;
            const float v1 = __int2float_rn(hi1 * 256 + lo1) * x.e.x;
            acc[ri] = __fmaf_rn(s0.x, v0, __fmaf_rn(s0.y, x.e.y, acc[ri]));
            acc[ri] = __fmaf_rn(s1.x, v1, __fmaf_rn(s1.y, x.e.z, acc[ri]));
        }
    }
};

// The tiles at width K: 4 rows at widths 2-4 (more bytes in flight a lane, x read once for
// more rows), 2 above (registers).
template <int K, typename F>
__device__ __forceinline__ void ap8d_rows_k(const Mat& w, float* y, const uint4* xq, int split,
                                            F&& stage) {
    c32_rows<K <= 4 ? 4 : 2>(Ap8C32<K>(w), w, y, split, xq, stage);
}

// y = W x (the dp4a form); x 16-byte aligned, cols a multiple of the group (64 columns or more);
// dynamic shared memory as c32_stage places x (Gpu::c32_launch). Each matrix at its own width.
struct Ap8dRows {
    template <typename F>
    __device__ __forceinline__ void operator()(const Mat& w, float* y, const uint4* xq, int split,
                                               F& stage) const {
        AP8_WIDTHS(ap8d_rows_k, w.row_bytes & 0xff, w, y, xq, split, stage)
    }
};
extern "C" __global__ void __launch_bounds__(256, C32_BLOCKS)
    matvec_ap8d(const Mat w, const float* x, float* y, int split) {
    c32_plain<C32_PLANES>(w, x, y, split, Ap8dRows());
}

// The routed experts of one token (c32_routed; tchunks unused). The table's matrices may differ in
// width (a high and a low view of one file): the launcher's split suits each (Gpu::c32_split).
extern "C" __global__ void __launch_bounds__(256, C32_BLOCKS) matvec_ap8d_sel(SEL_ARGS, int split, int tchunks) {
    c32_routed<C32_PLANES>(tab, routes, k, which0, x, xs, glu, y, ys, split, Ap8dRows());
}

// Unit u of a view of width K as 16 f16 values s q + m (f32 arithmetic) at o.
template <int K>
__device__ __forceinline__ void ap8_unit_h(const Ap8Part& a, size_t u, float2 sm, uint4* o) {
    const Ap8Unit b = ap8_load<K>(a, u);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        u32 v[4];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const u32 q = ap8_word<K>(b, 2 * h + i);
#pragma unroll
            for (int j = 0; j < 2; j++)
                v[2 * i + j] = (u32)f2h(__fmaf_rn(sm.x, ap8_byte(q, 2 * j), sm.y)) |
                               ((u32)f2h(__fmaf_rn(sm.x, ap8_byte(q, 2 * j + 1), sm.y)) << 16);
        }
        o[h] = make_uint4(v[0], v[1], v[2], v[3]);
    }
}

// out[r * cols + c] = f16(W[r0 + r, c]) for r < nrows (prefill's row tiles for cuBLAS): a thread
// a 16-value unit. Grid (ceil(cols / 16 / block), nrows).
extern "C" __global__ void dequant_ap8_h(const Mat w, half_bits* __restrict__ out, int r0,
                                         int nrows) {
    PDL_ENTRY();
    const int uc = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y, n = w.cols >> 4;
    if (uc >= n || r >= nrows) return;
    const Ap8Part a = ap8_part(w);
    const size_t u = (size_t)(r0 + r) * n + uc;
    const float2 sm =
        ap8_params(ap8_table(a, (size_t)(r0 + r) * (w.cols / w.group) + uc / (w.group >> 4)), a.k);
    uint4* o = reinterpret_cast<uint4*>(out + (size_t)r * w.cols + 16 * uc);
    AP8_WIDTHS(ap8_unit_h, a.k, a, u, sm, o)
}
