// hob's CUDA kernels, compiled at run time by NVRTC (src/backend/cuda/kernels.rs) for the GPU at
// hand and cached on disk. Activations are f32; weights are read in their stored form (f32, f16,
// bf16, or the planar int8/int4/int2 variants of formats/hob.md) and dequantized in registers.
//
// Conventions: every matrix is row-major [rows, cols]; a "row_bytes" is the stored bytes of one
// row of codes; scales and mins are f16 [rows, cols / group]. Kind codes match WeightKind in
// src/backend/cuda/mod.rs: 0 f32, 1 f16, 2 bf16, 3 int8, 4 int4, 5 int2.

// No headers: NVRTC needs no include path. f16 values travel as their 16-bit patterns.

#define KIND_F32 0
#define KIND_F16 1
#define KIND_BF16 2
#define KIND_INT8 3
#define KIND_INT4 4
#define KIND_INT2 5

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

typedef unsigned short half_bits;

__device__ __forceinline__ float h2f(half_bits bits) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
}

__device__ __forceinline__ half_bits f2h(float f) {
    half_bits b;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(f));
    return b;
}

#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float bf2f(unsigned short bits) {
    return __uint_as_float(((u32)bits) << 16);
}

// ---------------------------------------------------------------------------------------------
// Element-wise and normalization kernels.

// out[r, :] = w * (x[r0 + r, :] * rsqrt(mean(x²) + eps)); one block per row.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                    float* __restrict__ out, int n, int r0, float eps) {
    const float* xr = x + (size_t)(r0 + blockIdx.x) * n;
    float* o = out + (size_t)blockIdx.x * n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    __shared__ float part[32];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
        v = warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    float inv = 1.0f / sqrtf(part[0] / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = w[i] * (xr[i] * inv);
}

// Rotate-half RoPE in place: x is [t, width], heads of 2 * half values; row i at start_pos + i.
extern "C" __global__ void rope(float* __restrict__ x, const float* __restrict__ inv_freq, int t,
                                int width, int half, int start_pos) {
    int heads = width / (2 * half);
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= t * heads * half) return;
    int i = idx % half;
    int h = (idx / half) % heads;
    int row = idx / (half * heads);
    float angle = (float)(start_pos + row) * inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    float* p = x + (size_t)row * width + h * 2 * half;
    float a = p[i], b = p[i + half];
    p[i] = a * c - b * s;
    p[i + half] = b * c + a * s;
}

extern "C" __global__ void add_assign(float* __restrict__ x, const float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// g = silu(g) * u, as the CPU computes it: g / (1 + exp(-g)) * u.
extern "C" __global__ void swiglu(float* __restrict__ g, const float* __restrict__ u, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = g[i];
        g[i] = v / (1.0f + expf(-v)) * u[i];
    }
}

// Store n f32 values as f16 at dst.
extern "C" __global__ void to_half(const float* __restrict__ src, half_bits* __restrict__ dst, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = f2h(src[i]);
}

// dst[j, :] = src[idx[j], :] for j < m; rows of n values.
extern "C" __global__ void gather_rows(const float* __restrict__ src, const int* __restrict__ idx,
                                       float* __restrict__ dst, int n, int m) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * m) return;
    int j = i / n;
    dst[i] = src[(size_t)idx[j] * n + (i - j * n)];
}

// out[idx[j], :] += w[j] * y[j, :] for j < m (rows of n). Each output row appears at most once
// per call, so there are no races.
extern "C" __global__ void scatter_axpy(float* __restrict__ out, const int* __restrict__ idx,
                                        const float* __restrict__ w, const float* __restrict__ y,
                                        int n, int m) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * m) return;
    int j = i / n;
    float* o = out + (size_t)idx[j] * n + (i - j * n);
    *o = *o + w[j] * y[i];
}

// out[:n] += w * y[:n]
extern "C" __global__ void axpy(float* __restrict__ out, float w, const float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = out[i] + w * y[i];
}

// ---------------------------------------------------------------------------------------------
// Attention over an f16 KV cache. Grid (n_heads, t); block ATT_WARPS warps. Each warp walks a
// strided subset of the visible positions with an online softmax; the warps then merge.

#define ATT_WARPS 4
#define ATT_MAX_J 8  // head_dim up to 256

extern "C" __global__ void attention(const float* __restrict__ q, const half_bits* __restrict__ kc,
                                     const half_bits* __restrict__ vc, float* __restrict__ out,
                                     int n_heads, int n_kv_heads, int hd, int start_pos,
                                     int window) {
    int h = blockIdx.x, i = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int q_dim = n_heads * hd, kv_dim = n_kv_heads * hd;
    int kvh = h / (n_heads / n_kv_heads);
    int pos = start_pos + i;
    int first = window > 0 ? max(0, pos + 1 - window) : 0;
    float scale = 1.0f / sqrtf((float)hd);

    float qv[ATT_MAX_J], acc[ATT_MAX_J];
#pragma unroll
    for (int j = 0; j < ATT_MAX_J; j++) {
        int d = lane + 32 * j;
        qv[j] = d < hd ? q[(size_t)i * q_dim + h * hd + d] : 0.f;
        acc[j] = 0.f;
    }
    float m = NEG_INF, l = 0.f;
    for (int p = first + warp; p <= pos; p += ATT_WARPS) {
        const half_bits* k = kc + (size_t)p * kv_dim + kvh * hd;
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < ATT_MAX_J; j++) {
            int d = lane + 32 * j;
            if (d < hd) dot += qv[j] * h2f(k[d]);
        }
        float s = warp_sum(dot) * scale;
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new);
        float e = expf(s - m_new);
        l = l * corr + e;
        const half_bits* v = vc + (size_t)p * kv_dim + kvh * hd;
#pragma unroll
        for (int j = 0; j < ATT_MAX_J; j++) {
            int d = lane + 32 * j;
            if (d < hd) acc[j] = acc[j] * corr + e * h2f(v[d]);
        }
        m = m_new;
    }
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][32 * ATT_MAX_J];
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < ATT_MAX_J; j++) sm_acc[warp][lane + 32 * j] = acc[j];
    __syncthreads();
    float mx = NEG_INF;
    for (int w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, sm_m[w]);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0.f, den = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) {
            if (sm_m[w] == NEG_INF) continue;
            float f = expf(sm_m[w] - mx);
            num += sm_acc[w][d] * f;
            den += sm_l[w] * f;
        }
        out[(size_t)i * q_dim + h * hd + d] = num / den;
    }
}

// ---------------------------------------------------------------------------------------------
// Dequantize-matvec: y[r] = sum_c W[r, c] x[c]. One warp per row; each lane reads 16-byte chunks
// of the row (coalesced across the warp), several in flight, and dequantizes them in registers.
// Needs row_bytes % 16 == 0 and 16-byte aligned codes and x; matvec_any handles the rest.

struct Mat {
    const u8* codes;
    const unsigned short* scales;  // f16 bits
    const unsigned short* mins;    // f16 bits
    int rows, cols, group, row_bytes;
};

// The contribution of one 16-byte chunk `c` of row r.
template <int KIND>
__device__ __forceinline__ float chunk_dot(const uint4& v, const float* __restrict__ x, int c,
                                           const Mat& w, int r) {
    const u32 word[4] = {v.x, v.y, v.z, v.w};
    if (KIND == KIND_F32) {
        const float4 xv = *reinterpret_cast<const float4*>(x + c * 4);
        return __uint_as_float(v.x) * xv.x + __uint_as_float(v.y) * xv.y +
               __uint_as_float(v.z) * xv.z + __uint_as_float(v.w) * xv.w;
    } else if (KIND == KIND_F16 || KIND == KIND_BF16) {
        const float4 xa = *reinterpret_cast<const float4*>(x + c * 8);
        const float4 xb = *reinterpret_cast<const float4*>(x + c * 8 + 4);
        const float xs[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            unsigned short lo = word[k] & 0xffff, hi = word[k] >> 16;
            float a = KIND == KIND_F16 ? h2f(lo) : bf2f(lo);
            float b = KIND == KIND_F16 ? h2f(hi) : bf2f(hi);
            s += a * xs[2 * k] + b * xs[2 * k + 1];
        }
        return s;
    } else if (KIND == KIND_INT8) {
        // 16 codes, inside one group (groups are multiples of 16).
        int e0 = c * 16;
        const float4* xp = reinterpret_cast<const float4*>(x + e0);
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float4 xv = xp[k];
            u32 wd = word[k];
            s += (float)(signed char)(wd & 0xff) * xv.x + (float)(signed char)((wd >> 8) & 0xff) * xv.y +
                 (float)(signed char)((wd >> 16) & 0xff) * xv.z + (float)(signed char)(wd >> 24) * xv.w;
        }
        int gpr = w.cols / w.group;
        return h2f(w.scales[(size_t)r * gpr + e0 / w.group]) * s;
    } else {
        // int4: 32 codes per chunk, int2: 64; handled as 16-element pieces (each inside one group).
        // A code q becomes the float 1 + q / 2^bits by placing it in the top mantissa bits of 1.0
        // (no int-to-float conversion): sum(v x) = sum(x) + sum(q x) / 2^bits.
        const int per_word = KIND == KIND_INT4 ? 8 : 16;
        const int bits = KIND == KIND_INT4 ? 4 : 2;
        const u32 mask = KIND == KIND_INT4 ? 0xfu : 0x3u;
        const float unit = KIND == KIND_INT4 ? 16.f : 4.f;
        const int e0 = c * (KIND == KIND_INT4 ? 32 : 64);
        const int gpr = w.cols / w.group;
        float acc = 0.f;
        const int pieces = KIND == KIND_INT4 ? 2 : 4;
#pragma unroll
        for (int p = 0; p < pieces; p++) {
            const int pe = e0 + p * 16;
            const float4* xp = reinterpret_cast<const float4*>(x + pe);
            float vx = 0.f, sx = 0.f;
#pragma unroll
            for (int k4 = 0; k4 < 4; k4++) {
                const float4 xv = xp[k4];
                const float xe[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int e = p * 16 + k4 * 4 + u;  // element within the chunk
                    const int sh = bits * (e % per_word);
                    const u32 q = (word[e / per_word] >> sh) & mask;
                    const float v = __uint_as_float(0x3f800000u | (q << (23 - bits)));
                    vx = fmaf(v, xe[u], vx);
                    sx += xe[u];
                }
            }
            const float qx = unit * (vx - sx);
            size_t g = (size_t)r * gpr + pe / w.group;
            acc += h2f(w.scales[g]) * qx + h2f(w.mins[g]) * sx;
        }
        return acc;
    }
}

template <int KIND>
__device__ __forceinline__ void matvec_body(const Mat w, const float* __restrict__ x,
                                            float* __restrict__ y) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= w.rows) return;
    const uint4* row = reinterpret_cast<const uint4*>(w.codes + (size_t)r * w.row_bytes);
    int n = w.row_bytes / 16;
    float acc = 0.f;
    int c = lane;
    // Four chunks in flight per lane.
    for (; c + 96 < n; c += 128) {
        uint4 v0 = __ldg(row + c), v1 = __ldg(row + c + 32), v2 = __ldg(row + c + 64),
              v3 = __ldg(row + c + 96);
        acc += chunk_dot<KIND>(v0, x, c, w, r);
        acc += chunk_dot<KIND>(v1, x, c + 32, w, r);
        acc += chunk_dot<KIND>(v2, x, c + 64, w, r);
        acc += chunk_dot<KIND>(v3, x, c + 96, w, r);
    }
    for (; c < n; c += 32) acc += chunk_dot<KIND>(__ldg(row + c), x, c, w, r);
    acc = warp_sum(acc);
    if (lane == 0) y[r] = acc;
}

// Several rows per warp (the quantized kinds): x is read once per chunk position for all R rows
// (an int4 chunk of 16 bytes needs 128 bytes of x), and R x 2 loads are in flight per lane.
template <int KIND, int R>
__device__ __forceinline__ void matvec_rows_body(const Mat w, const float* __restrict__ x,
                                                 float* __restrict__ y) {
    int r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
    int lane = threadIdx.x & 31;
    if (r0 >= w.rows) return;
    const uint4* row[R];
    int rr[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        rr[i] = min(r0 + i, w.rows - 1);
        row[i] = reinterpret_cast<const uint4*>(w.codes + (size_t)rr[i] * w.row_bytes);
    }
    int n = w.row_bytes / 16;
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; i++) acc[i] = 0.f;
    int c = lane;
    for (; c + 32 < n; c += 64) {
        uint4 a[R], b[R];
#pragma unroll
        for (int i = 0; i < R; i++) {
            a[i] = __ldg(row[i] + c);
            b[i] = __ldg(row[i] + c + 32);
        }
#pragma unroll
        for (int i = 0; i < R; i++) {
            acc[i] += chunk_dot<KIND>(a[i], x, c, w, rr[i]);
            acc[i] += chunk_dot<KIND>(b[i], x, c + 32, w, rr[i]);
        }
    }
    for (; c < n; c += 32) {
#pragma unroll
        for (int i = 0; i < R; i++) acc[i] += chunk_dot<KIND>(__ldg(row[i] + c), x, c, w, rr[i]);
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
        float v = warp_sum(acc[i]);
        if (lane == 0 && r0 + i < w.rows) y[r0 + i] = v;
    }
}

// Rows per warp of the quantized kinds (src/backend/cuda/mod.rs launches with the same figure).
#define QROWS 4

extern "C" __global__ void matvec_f32(const Mat w, const float* x, float* y) { matvec_body<KIND_F32>(w, x, y); }
extern "C" __global__ void matvec_f16(const Mat w, const float* x, float* y) { matvec_body<KIND_F16>(w, x, y); }
extern "C" __global__ void matvec_bf16(const Mat w, const float* x, float* y) { matvec_body<KIND_BF16>(w, x, y); }
extern "C" __global__ void matvec_int8(const Mat w, const float* x, float* y) { matvec_rows_body<KIND_INT8, QROWS>(w, x, y); }
extern "C" __global__ void matvec_int4(const Mat w, const float* x, float* y) { matvec_rows_body<KIND_INT4, QROWS>(w, x, y); }
extern "C" __global__ void matvec_int2(const Mat w, const float* x, float* y) { matvec_rows_body<KIND_INT2, QROWS>(w, x, y); }
// int8 with two rows per warp, for matrices with few rows (a 4096-row down projection: 59% of the copy
// bandwidth against 46% with four; int4 and int2 measured slower with two, so they keep four).
extern "C" __global__ void matvec_int8_r2(const Mat w, const float* x, float* y) { matvec_rows_body<KIND_INT8, 2>(w, x, y); }

// Element (r, c) of any kind, dequantized.
__device__ __forceinline__ float element(const Mat& w, int kind, int r, int c) {
    const u8* row = w.codes + (size_t)r * w.row_bytes;
    switch (kind) {
        case KIND_F32: return reinterpret_cast<const float*>(row)[c];
        case KIND_F16: return h2f(reinterpret_cast<const unsigned short*>(row)[c]);
        case KIND_BF16: return bf2f(reinterpret_cast<const unsigned short*>(row)[c]);
        default: break;
    }
    size_t g = (size_t)r * (w.cols / w.group) + c / w.group;
    float s = h2f(w.scales[g]);
    if (kind == KIND_INT8) return s * (float)(signed char)row[c];
    float q = kind == KIND_INT4 ? (float)((row[c / 2] >> (4 * (c % 2))) & 0xf)
                                : (float)((row[c / 4] >> (2 * (c % 4))) & 0x3);
    return s * q + h2f(w.mins[g]);
}

// Any layout: one warp per row, one element per lane step.
extern "C" __global__ void matvec_any(const Mat w, int kind, const float* __restrict__ x,
                                      float* __restrict__ y) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= w.rows) return;
    float acc = 0.f;
    for (int c = lane; c < w.cols; c += 32) acc += element(w, kind, r, c) * x[c];
    acc = warp_sum(acc);
    if (lane == 0) y[r] = acc;
}

// The same as f16 (tiles for cuBLAS's tensor-core GEMM). Grid (ceil(cols / block), nrows).
extern "C" __global__ void dequant_rows_h(const Mat w, int kind, half_bits* __restrict__ out, int r0,
                                          int nrows) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c >= w.cols || r >= nrows) return;
    out[(size_t)r * w.cols + c] = f2h(element(w, kind, r0 + r, c));
}

// out[(r - r0) * cols + c] = W[r, c] for rows r0..r0 + nrows (f32 tiles for cuBLAS).
extern "C" __global__ void dequant_rows(const Mat w, int kind, float* __restrict__ out, int r0,
                                        int nrows) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)nrows * w.cols) return;
    int r = (int)(i / w.cols), c = (int)(i % w.cols);
    out[i] = element(w, kind, r0 + r, c);
}
