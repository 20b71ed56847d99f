// Integer dequantize-matvec (int8/int4/int2), the kernels the launcher picks for every layout whose
// rows are 16-byte multiples (src/backend/cuda/mod.rs, Gpu::matvec). This file: the layouts' traits
// and x's staging, scalar and dp4a; the kernels' loop: matvec_q.cu.
//
// - x is staged once per block into shared memory, pre-scaled per column (below), with the sum of
//   every 16 columns (the min term, and int8's offset); blocks loop over tiles of rows.
// - A warp takes R rows at a time; its lanes walk the rows' 16-byte chunks (coalesced), the next
//   chunks loading while the current ones are computed. `split` warps share a row group (each a
//   slice of the chunks), their sums added in a fixed order through shared memory: results do
//   not depend on the grid.
// - Codes become floats with one AND each: a code masked in place, q << p with p <= 22, is read
//   as the subnormal float q * 2^(p - 149), exact, and the staged x of that column carries the
//   factor 2^(149 - p - K), so the product is q * x * 2^-K, exact before the FMA's one rounding
//   (as an f32 product q * x). Codes above bit 22 are shifted down once per 32-bit word. The sums
//   are f32; 2^K comes off at the end (K = 64, or fitted to x's range when x is outside
//   [2^-40, 2^42)). Every scaling is by a power of two; bits are lost only where a product
//   q * x * 2^-K falls below 2^-126 and rounds as a subnormal (an error under 2^(K-150) on y).
// - int8 codes are read as q + 128 (sign bit flipped), the 128 * sum(x) taken off per chunk.
// Needs no FTZ (NVRTC's default).

template <int KIND> struct QTraits;
// CC: columns per 16-byte chunk; EPW: codes per 32-bit word; P: 16-column pieces per chunk;
// HSHIFT: the shift bringing the codes above bit 22 down.
template <> struct QTraits<KIND_INT8> { enum { CC = 16, EPW = 4, BITS = 8, P = 1, HSHIFT = 16 }; };
template <> struct QTraits<KIND_INT4> { enum { CC = 32, EPW = 8, BITS = 4, P = 2, HSHIFT = 20 }; };
template <> struct QTraits<KIND_INT2> { enum { CC = 64, EPW = 16, BITS = 2, P = 4, HSHIFT = 22 }; };
// int3 (dp4a form only: matvec_qd_int3): a chunk is int2's 16 bytes of low bits (64 columns), its
// 8 bytes of high bits loaded beside it (matvec_q_body, qd_hi3).
template <> struct QTraits<KIND_INT2K> { enum { CC = 64, EPW = 16, BITS = 2, P = 4, HSHIFT = 22 }; };
template <> struct QTraits<KIND_INT4K> { enum { CC = 32, EPW = 8, BITS = 4, P = 2, HSHIFT = 20 }; };
template <> struct QTraits<KIND_INT3> { enum { CC = 64, EPW = 16, BITS = 2, P = 4, HSHIFT = 22 }; };
// MXFP4 (dp4a form only: matvec_qd_mxfp4): int4's chunk of 32 nibbles, one group (E8M0 byte) a chunk.
template <> struct QTraits<KIND_MXFP4> { enum { CC = 32, EPW = 8, BITS = 4, P = 2, HSHIFT = 20 }; };

// Bit position of code j of a word once extracted (in place, or after the shift).
template <int KIND>
__device__ __forceinline__ constexpr int qpos(int j) {
    return QTraits<KIND>::BITS * (j + 1) <= 23 ? QTraits<KIND>::BITS * j
                                                : QTraits<KIND>::BITS * j - QTraits<KIND>::HSHIFT;
}

// acc + sum_j code_j * x'_j over the EPW codes of one word.
// The EPW staged x values of code word `wd` of a lane's chunk (xb: the lane's first float4 of
// the chunk in shared memory; a chunk's float4s are 32 apart, one per lane).
template <int EPW>
__device__ __forceinline__ void x_word(const float4* xb, int wd, float* xv) {
#pragma unroll
    for (int q = 0; q < EPW / 4; q++) {
        const float4 t4 = xb[(wd * (EPW / 4) + q) * 32];
        xv[4 * q] = t4.x;
        xv[4 * q + 1] = t4.y;
        xv[4 * q + 2] = t4.z;
        xv[4 * q + 3] = t4.w;
    }
}

template <int KIND>
__device__ __forceinline__ float qword_dot(u32 w, const float* xv, float acc) {
    constexpr int BITS = QTraits<KIND>::BITS, EPW = QTraits<KIND>::EPW;
    constexpr u32 MASK = (1u << BITS) - 1;
    if (KIND == KIND_INT8) w ^= 0x80808080u;
    const u32 h = w >> QTraits<KIND>::HSHIFT;
#pragma unroll
    for (int j = 0; j < EPW; j++) {
        const int lo = BITS * j;
        const u32 bits = BITS * (j + 1) <= 23 ? (w & (MASK << lo))
                                               : (h & (MASK << (lo - QTraits<KIND>::HSHIFT)));
        acc = fmaf(__uint_as_float(bits), xv[j], acc);
    }
    return acc;
}

__device__ __forceinline__ u32 qword(const uint4& v, int k) {
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// x * 2^e for e in [-252, 254], exact while the result is a normal float.
__device__ __forceinline__ float ldexp2(float x, int e) {
    const int a = e / 2, b = e - a;
    return x * __uint_as_float((u32)(127 + a) << 23) * __uint_as_float((u32)(127 + b) << 23);
}

// Flags of staged x values: bit 0 any |x| >= 2^-40, bit 1 any finite |x| >= 2^42.
__device__ __forceinline__ int qflags(float v) {
    const int e = (__float_as_uint(v) >> 23) & 0xff;
    return (e >= 127 - 40 ? 1 : 0) | (e >= 127 + 42 && e != 255 ? 2 : 0);
}

__device__ __forceinline__ int qexp(float v) {
    const int e = (__float_as_uint(v) >> 23) & 0xff;
    return e == 255 ? 0 : e;
}

// Stage columns [0, tn * CC) of xt into shared memory: xs4 (the scaled x, laid out so that lane l
// of a warp reads chunk 32 i + l's quad q at float4 (i * CC/4 + q) * 32 + l: no bank conflicts)
// and sxp (sum of each 16 columns, times 2^-K). Returns 2^K. Block-wide; ends with a barrier.
// Four staged inputs at x4[m]; with u4 (the up products of a SwiGLU), silu(x) * u as the swiglu
// kernel rounds it, so a down product can stage its input without that launch.
__device__ __forceinline__ float4 xin(const float4* __restrict__ x4, const float4* __restrict__ u4,
                                      int m) {
    float4 v = __ldg(x4 + m);
    if (u4) {
        const float4 u = __ldg(u4 + m);
        v = make_float4(silu_mul(v.x, u.x), silu_mul(v.y, u.y), silu_mul(v.z, u.z), silu_mul(v.w, u.w));
    }
    return v;
}

template <int KIND>
__device__ float qstage(const float* __restrict__ xt, const float* __restrict__ ut, int tn, float4* xs4,
                       float* sxp, int* wsm) {
    constexpr int CC = QTraits<KIND>::CC, Q = CC / 4, EPW = QTraits<KIND>::EPW;
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float4* x4 = reinterpret_cast<const float4*>(xt);
    const float4* u4 = reinterpret_cast<const float4*>(ut);
    const int nq = tn * Q;
    int fl = 0;
    __syncthreads();  // earlier readers of the shared arrays are done
    for (int m0 = 0; m0 < nq; m0 += blockDim.x) {
        const int m = m0 + threadIdx.x;
        const bool in = m < nq;
        const float4 v = in ? xin(x4, u4, m) : make_float4(0.f, 0.f, 0.f, 0.f);
        fl |= qflags(v.x) | qflags(v.y) | qflags(v.z) | qflags(v.w);
        if (in) {
            const int c = m / Q, q = m - c * Q, j0 = (4 * m) % EPW;
            // K = 64: x * 2^(149 - p - 64)
            float4 o;
            o.x = v.x * __uint_as_float((u32)(127 + 85 - qpos<KIND>(j0)) << 23);
            o.y = v.y * __uint_as_float((u32)(127 + 85 - qpos<KIND>(j0 + 1)) << 23);
            o.z = v.z * __uint_as_float((u32)(127 + 85 - qpos<KIND>(j0 + 2)) << 23);
            o.w = v.w * __uint_as_float((u32)(127 + 85 - qpos<KIND>(j0 + 3)) << 23);
            xs4[((c >> 5) * Q + q) * 32 + (c & 31)] = o;
        }
        float ps = (v.x + v.y) + (v.z + v.w);
        ps += __shfl_xor_sync(0xffffffffu, ps, 1);
        ps += __shfl_xor_sync(0xffffffffu, ps, 2);
        if (in && (m & 3) == 0) sxp[m >> 2] = ps * 0x1p-64f;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) fl |= __shfl_xor_sync(0xffffffffu, fl, o);
    if (lane == 0) wsm[warp] = fl;
    __syncthreads();
    int all = 0;
    for (int i = 0; i < warps; i++) all |= wsm[i];
    if ((all & 1) && !(all & 2)) return 0x1p64f;
    // x is outside [2^-40, 2^42) (or all zero): fit K to its largest exponent E (K = E + 24, so
    // the largest |x'| stays below 2^127) and stage again.
    int e = 0;
    for (int m = threadIdx.x; m < nq; m += blockDim.x) {
        const float4 v = xin(x4, u4, m);
        e = max(max(e, max(qexp(v.x), qexp(v.y))), max(qexp(v.z), qexp(v.w)));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) e = max(e, __shfl_xor_sync(0xffffffffu, e, o));
    if (lane == 0) wsm[warps + warp] = e;
    __syncthreads();
    int emax = 0;
    for (int i = 0; i < warps; i++) emax = max(emax, wsm[warps + i]);
    const int k = min(max(emax - 127 + 24, -103), 127);
    for (int m0 = 0; m0 < nq; m0 += blockDim.x) {
        const int m = m0 + threadIdx.x;
        const bool in = m < nq;
        const float4 v = in ? xin(x4, u4, m) : make_float4(0.f, 0.f, 0.f, 0.f);
        if (in) {
            const int c = m / Q, q = m - c * Q, j0 = (4 * m) % EPW;
            float4 o;
            o.x = ldexp2(v.x, 149 - qpos<KIND>(j0) - k);
            o.y = ldexp2(v.y, 149 - qpos<KIND>(j0 + 1) - k);
            o.z = ldexp2(v.z, 149 - qpos<KIND>(j0 + 2) - k);
            o.w = ldexp2(v.w, 149 - qpos<KIND>(j0 + 3) - k);
            xs4[((c >> 5) * Q + q) * 32 + (c & 31)] = o;
        }
        float ps = (v.x + v.y) + (v.z + v.w);
        ps += __shfl_xor_sync(0xffffffffu, ps, 1);
        ps += __shfl_xor_sync(0xffffffffu, ps, 2);
        if (in && (m & 3) == 0) sxp[m >> 2] = ldexp2(ps, -k);
    }
    __syncthreads();
    return __uint_as_float((u32)(127 + k) << 23);
}

// ---------------------------------------------------------------------------------------------
// The integer-dot-product form of matvec_q_body (DP = true: the matvec_qd_* kernels), for layouts
// whose groups are whole chunks. x is staged as integers: per chunk, xq = round(x * 2^-e) with e
// chosen so that the chunk's largest |x| lies in [2^(XB-2), 2^(XB-1)) (XB = 8 * QD_PARTS bits), held
// in QD_PARTS byte planes (the top one signed, the rest unsigned: xq = sum of plane p << 8 (PARTS-1-p)).
// A code word's codes, masked in place into its four bytes (set s: codes b * S + s of bytes b;
// MXFP4 4 s + b, as doubled e2m1 values), meet
// each plane in one dp4a (four 8-bit products summed in 32-bit integers, exact): eight int4 codes
// take 3 mask and shift instructions and 2 * QD_PARTS dp4a where the scalar kernel spends an AND
// and an FMA on each code (plus shifts). Per chunk and row, the planes' integer sums become one
// float (exact, or one rounding) times 2^e, then scale and min as in the scalar kernel. The only
// approximation is x's rounding to XB bits relative to its chunk's largest |x| (2^-(XB-1)); NaN or
// infinite x make the chunk's sums NaN.
//
// QD_PARTS (x's byte planes: 2, 16-bit x, benches/results/2026-11-24-h100-dp4a.md) and the ring
// depths QD_RING_* come from src/backend/cuda/kernels.rs, which sizes shared memory with them.
#ifndef QD_PARTS
#error "QD_PARTS: passed by src/backend/cuda/kernels.rs (Kernels::nvrtc_options)"
#endif

template <int KIND> struct QDTraits;
// S: sets (bytes' worth of codes) per 32-bit word; M: the mask keeping one code per byte; AHEAD:
// the steps loaded ahead of the one computed in the registers' form (matvec_q_body;
// benches/results/2026-11-24-h100-dp4a.md).
template <> struct QDTraits<KIND_INT8> { enum : u32 { S = 1, M = 0xffffffffu, AHEAD = 2 }; };
template <> struct QDTraits<KIND_INT4> { enum : u32 { S = 2, M = 0x0f0f0f0fu, AHEAD = 2 }; };
template <> struct QDTraits<KIND_INT2> { enum : u32 { S = 4, M = 0x03030303u, AHEAD = 1 }; };
template <> struct QDTraits<KIND_INT2K> { enum : u32 { S = 4, M = 0x03030303u, AHEAD = 1 }; };
template <> struct QDTraits<KIND_INT4K> { enum : u32 { S = 2, M = 0x0f0f0f0fu, AHEAD = 2 }; };
template <> struct QDTraits<KIND_INT3> { enum : u32 { S = 4, M = 0x03030303u, AHEAD = 1 }; };
// MXFP4: set s holds a word's elements 4s .. 4s + 3 (its low or high four nibbles, in order: one
// byte permute turns them into signed doubled e2m1 values, qd_codes), not int4's every other one.
template <> struct QDTraits<KIND_MXFP4> { enum : u32 { S = 2, M = 0x0f0f0f0fu, AHEAD = 2 }; };

// The kinds whose codes are signed bytes for dp4a and carry no min (scale * sum only).
template <int KIND>
__device__ __forceinline__ constexpr bool qd_signed() {
    return KIND == KIND_INT8 || KIND == KIND_MXFP4;
}
// The element of a code word that byte `by` of set `s` holds (qdstage lays x out the same way).
template <int KIND>
__device__ __forceinline__ constexpr int qd_elem(int by, int s) {
    return KIND == KIND_MXFP4 ? 4 * s + by : by * (int)QDTraits<KIND>::S + s;
}
// The shared-memory ring's steps per kind (matvec_q_body RING; 0: AHEAD steps in registers),
// chosen by architecture in kernels.rs (qd_ring), which reserves the ring's shared memory
// (QShape::ring; benches/results/2026-11-25-h100-qd-ring.md).
#if !defined(QD_RING_INT8) || !defined(QD_RING_INT4) || !defined(QD_RING_INT2) || !defined(QD_RING_INT3)
#error "QD_RING_INT8/INT4/INT2/INT3: passed by src/backend/cuda/kernels.rs (Kernels::nvrtc_options)"
#endif
#define QD_RING_OF(KIND)                                                                 \
    ((KIND) == KIND_INT8 ? QD_RING_INT8 : (KIND) == KIND_INT4 ? QD_RING_INT4 \
     : (KIND) == KIND_INT2 ? QD_RING_INT2 : (KIND) == KIND_INT3 ? QD_RING_INT3 : 0)

// Set s of code word w: one code per byte (int8: the word, its bytes signed).
// MXFP4: the nibbles' low 3 bits pick a doubled magnitude {0, 1, 2, 3, 4, 6, 8, 12} from the
// positive or the negated table; bit 3 (the sign) picks the table, byte by byte.
template <int KIND>
__device__ __forceinline__ u32 qd_codes(u32 w, int s) {
    if (KIND == KIND_INT8) return w;
    if (KIND == KIND_MXFP4) {
        // The table selector of both sets at once (the same w for s = 0 and 1: computed once).
        const u32 pick = 0x32103210u | ((w & 0x88888888u) >> 1);
        const u32 m = (s == 0 ? w : w >> 16) & 0x7777u;
        const u32 pos = __byte_perm(0x03020100u, 0x0c080604u, m);
        const u32 neg = __byte_perm(0xfdfeff00u, 0xf4f8fafcu, m);
        return __byte_perm(pos, neg, s == 0 ? pick : pick >> 16);
    }
    return (s == 0 ? w : w >> (QTraits<KIND>::BITS * s)) & (u32)QDTraits<KIND>::M;
}

// int3: the high bits of set s of low code word wd (of a chunk whose 8 high bytes are h), at bit 2
// of each byte, to OR into qd_codes' low bits. Element 16 wd + 4 b + s keeps its high bit in bit
// 4 (wd % 2) + s of high byte 4 (wd / 2) + b (formats' int3_hi_bit): one shift and mask.
__device__ __forceinline__ u32 qd_hi3(uint2 h, int wd, int s) {
    const u32 hw = wd < 2 ? h.x : h.y;
    const int sh = 4 * (wd & 1) + s;
    return (sh >= 2 ? hw >> (sh - 2) : hw << (2 - sh)) & 0x04040404u;
}

// acc + the dot product of four codes (a: signed bytes for int8, else unsigned) and four bytes of
// an x plane (b: signed for the top plane, else unsigned).
template <int KIND, bool TOP>
__device__ __forceinline__ int qd_dot(u32 a, u32 b, int acc) {
    int d;
#if __CUDA_ARCH__ < 610
    // No dp4a (the launcher does not take these kernels there; this keeps the module loading).
    d = acc;
    for (int j = 0; j < 4; j++) {
        const int xb = (int)((b >> (8 * j)) & 0xffu), cb = (int)((a >> (8 * j)) & 0xffu);
        d += (TOP ? (int)(signed char)xb : xb) * (qd_signed<KIND>() ? (int)(signed char)cb : cb);
    }
#else
    if (qd_signed<KIND>()) {
        if (TOP) asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(acc));
        else asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(acc));
    } else {
        if (TOP) asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(acc));
        else asm("dp4a.u32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(acc));
    }
#endif
    return d;
}

// u32 index of plane p, code word wd of chunk c in the staged x (its S sets follow): lane-contiguous
// runs of S words, so a lane reads one plane's sets of a word with one vector load, no bank conflicts.
template <int KIND>
__device__ __forceinline__ int qd_at(int c, int p, int wd) {
    constexpr int S = QDTraits<KIND>::S;
    return ((((c >> 5) * QD_PARTS + p) * 4 + wd) * 32 + (c & 31)) * S;
}

template <int S>
__device__ __forceinline__ void qd_load(const u32* __restrict__ p, u32 (&o)[S]) {
    if (S == 4) {
        const uint4 v = *reinterpret_cast<const uint4*>(p);
        o[0] = v.x; o[1] = v.y; o[2 % S] = v.z; o[3 % S] = v.w;
    } else if (S == 2) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        o[0] = v.x; o[1 % S] = v.y;
    } else {
        o[0] = p[0];
    }
}

// The planes of one chunk's staged x as one float per row: (top << 8 (PARTS-1)) + the rest.
template <int PP, int R>
__device__ __forceinline__ float qd_sum(const int (&a)[PP][R], int i) {
    if (PP == 1) return (float)a[0][i];
    if (PP == 2) return (float)(a[0][i] * 256 + a[1 % PP][i]);
    return fmaf((float)a[0][i], 65536.f, (float)(a[1 % PP][i] * 256 + a[2 % PP][i]));
}

// qdstage's form for 16-bit x (QD_PARTS 2, sm_80 on): the largest |x| as a float, values rounded by
// a saturating cvt and split into planes by byte permutes: fewer instructions than the general
// form, the same bits (benches/results/2026-11-28-h200-x-staging-16bit.md).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define QD_MAX_NAN 0
#else
#define QD_MAX_NAN 1
#endif
// The larger of a and b, NaN when either is (max.NaN: sm_80 on).
__device__ __forceinline__ float fmax_nan(float a, float b) {
#if QD_MAX_NAN
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    return a != a || b != b ? __uint_as_float(0x7fc00000u) : fmaxf(a, b);
#endif
}
// a and b rounded to the nearest integer, saturated to 16 bits, packed (a low, b high).
__device__ __forceinline__ u32 pack_s16_rn(float a, float b) {
    unsigned short lo, hi;
    asm("cvt.rni.sat.s16.f32 %0, %1;" : "=h"(lo) : "f"(a));
    asm("cvt.rni.sat.s16.f32 %0, %1;" : "=h"(hi) : "f"(b));
    u32 r;
    asm("mov.b32 %0, {%1, %2};" : "=r"(r) : "h"(lo), "h"(hi));
    return r;
}

// Stage columns [0, tn * CC) of xt (or SwiGLU(xt, ut)) for the DP kernels: the byte planes at xq
// (qd_at) and, per chunk, (2^e, the chunk's f32 sum of x) at xsx. Block-wide; ends with a barrier.
// `after_loads` runs once the first pass's loads of x are issued (the ring form issues more of its
// first steps there: behind x's loads, not ahead of them).
template <int KIND, int QU = 1, typename F>
__device__ void qdstage(const float* __restrict__ xt, const float* __restrict__ ut, int tn,
                        u32* __restrict__ xq, float2* __restrict__ xsx, F&& after_loads) {
    constexpr int EPW = QTraits<KIND>::EPW, S = QDTraits<KIND>::S, PP = QD_PARTS, XB = 8 * PP;
    constexpr int QMAX = (1 << (XB - 1)) - 1;
    const float4* x4 = reinterpret_cast<const float4*>(xt);
    const float4* u4 = reinterpret_cast<const float4*>(ut);
    const int nw = tn * 4;  // code words (a thread each), four per chunk in adjacent lanes
    // QU words a thread per pass, their loads issued together: a pass's L2 round trip is most of
    // its time. The ring form takes 2 (no loads held in registers meanwhile); the register form 1
    // (2 would cost int4 too many registers). The words of a chunk stay in adjacent lanes: the
    // same sums and bits (benches/results/2026-11-27-h100-int2-staging.md).
    __syncthreads();  // earlier readers of the shared arrays are done
    for (int m00 = 0; m00 < nw; m00 += QU * blockDim.x) {
        float vv[QU][EPW];
#pragma unroll
        for (int u = 0; u < QU; u++) {
            const int m = m00 + u * blockDim.x + threadIdx.x;
            const bool in = m < nw;
#pragma unroll
            for (int q = 0; q < EPW / 4; q++) {
                const float4 t = in ? xin(x4, u4, m * (EPW / 4) + q) : make_float4(0.f, 0.f, 0.f, 0.f);
                vv[u][4 * q] = t.x;
                vv[u][4 * q + 1] = t.y;
                vv[u][4 * q + 2] = t.z;
                vv[u][4 * q + 3] = t.w;
            }
        }
        if (m00 == 0) after_loads();
#pragma unroll
        for (int u = 0; u < QU; u++) {
            if (m00 + u * blockDim.x >= nw) break;  // (uniform across the block)
            const int m = m00 + u * blockDim.x + threadIdx.x;
            const bool in = m < nw;
            const float* v = vv[u];
            // The largest |x| by its bits (NaN above infinity above every finite value), and the sum.
            // F16S (16-bit x, sm_80 on): the largest |x| as a float by a max that keeps NaN (bits
            // 0x7fc00000, as the integer form's): one instruction a value instead of two.
            constexpr bool F16S = PP == 2 && QD_MAX_NAN;
            u32 mb = 0;
            float am = 0.f, sum = 0.f;
    #pragma unroll
            for (int j = 0; j < EPW; j++) {
                if (F16S) am = fmax_nan(am, fabsf(v[j]));
                else mb = max(mb, __float_as_uint(v[j]) & 0x7fffffffu);
                sum += v[j];
            }
            if (F16S) {
                am = fmax_nan(am, __shfl_xor_sync(0xffffffffu, am, 1));
                am = fmax_nan(am, __shfl_xor_sync(0xffffffffu, am, 2));
                mb = __float_as_uint(am);
            } else {
                mb = max(mb, __shfl_xor_sync(0xffffffffu, mb, 1));
                mb = max(mb, __shfl_xor_sync(0xffffffffu, mb, 2));
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // a + b == b + a: every lane of the chunk
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);  // ends with the same sum
            const int E = (int)(mb >> 23);
            const bool bad = E == 255;
            // |x| < 2^(E - 126): x * 2^(XB + 125 - E) < 2^(XB - 1). E >= XB - 2 keeps that factor a
            // normal float (smaller chunks, below 2^-100, keep fewer bits).
            const int ep = max(E, XB - 2);
            const float mul = __uint_as_float((u32)(XB + 252 - ep) << 23);
            const float xs = bad ? __uint_as_float(0x7fc00000u) : ldexp2(1.0f, ep - 125 - XB);
            if (in && F16S) {
                // Per set, values qd_elem(b, s) (b = 0..3) rounded to 16 bits (cvt saturates: only
                // -32768 needs the clamp to -QMAX, two values at a time), paired, and their bytes
                // split into the planes by two byte permutes. A bad chunk's values all become 0
                // (v * 0 is 0 or NaN, and NaN converts to 0): the bits of the general form.
                const float mz = bad ? 0.f : mul;
                const int c = m >> 2, wd = m & 3;
                u32 o[2][S];
    #pragma unroll
                for (int s = 0; s < S; s++) {
                    const u32 t01 = __vmaxs2(pack_s16_rn(v[qd_elem<KIND>(0, s)] * mz, v[qd_elem<KIND>(1, s)] * mz),
                                             0x80018001u);
                    const u32 t23 = __vmaxs2(pack_s16_rn(v[qd_elem<KIND>(2, s)] * mz, v[qd_elem<KIND>(3, s)] * mz),
                                             0x80018001u);
                    o[0][s] = __byte_perm(t01, t23, 0x7531);  // high bytes: the signed top plane
                    o[1][s] = __byte_perm(t01, t23, 0x6420);  // low bytes
                }
    #pragma unroll
                for (int p = 0; p < 2; p++) {
                    u32* dst = xq + qd_at<KIND>(c, p, wd);
                    if (S == 4) {
                        *reinterpret_cast<uint4*>(dst) = make_uint4(o[p][0], o[p][1 % S], o[p][2 % S], o[p][3 % S]);
                    } else if (S == 2) {
                        *reinterpret_cast<uint2*>(dst) = make_uint2(o[p][0], o[p][1 % S]);
                    } else {
                        dst[0] = o[p][0];
                    }
                }
                if (wd == 0) xsx[c] = make_float2(xs, sum);
            } else if (in) {
                int q[EPW];
    #pragma unroll
                for (int j = 0; j < EPW; j++)
                    q[j] = bad ? 0 : min(max(__float2int_rn(v[j] * mul), -QMAX), QMAX);
                const int c = m >> 2, wd = m & 3;
    #pragma unroll
                for (int p = 0; p < PP; p++) {
                    const int sh = 8 * (PP - 1 - p);
                    u32 o[S];
    #pragma unroll
                    for (int s = 0; s < S; s++) {
                        u32 b = 0;
    #pragma unroll
                        for (int by = 0; by < 4; by++) b |= ((u32)(q[qd_elem<KIND>(by, s)] >> sh) & 0xffu) << (8 * by);
                        o[s] = b;
                    }
                    u32* dst = xq + qd_at<KIND>(c, p, wd);
                    if (S == 4) {
                        *reinterpret_cast<uint4*>(dst) = make_uint4(o[0], o[1 % S], o[2 % S], o[3 % S]);
                    } else if (S == 2) {
                        *reinterpret_cast<uint2*>(dst) = make_uint2(o[0], o[1 % S]);
                    } else {
                        dst[0] = o[0];
                    }
                }
                if (wd == 0) xsx[c] = make_float2(xs, sum);
            }
        }
    }
    __syncthreads();
}
