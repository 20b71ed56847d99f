// hob's CUDA kernels, compiled at run time by NVRTC (src/backend/cuda/kernels.rs) for the GPU at
// hand and cached on disk. Activations are f32; weights are read in their stored form (f32, f16,
// bf16, or the planar int8/int4/int2 variants of formats/hob.md) and dequantized in registers.
//
// Every kernel waits for the kernel before it (pdl_wait, below) before it touches memory an
// earlier kernel writes or reads: on sm_90 the compute stream launches with programmatic dependent
// launch (src/backend/cuda/kernels.rs tests this for every __global__ function).
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

// Programmatic dependent launch (sm_90 and later; src/backend/cuda/mod.rs Gpu::launch): a kernel
// launched with it may start while the kernel before it in the stream still runs. Every kernel
// calls pdl_wait() before it reads anything an earlier kernel wrote or writes anything an earlier
// kernel may read: that waits until the kernel before has finished and its writes are visible.
// Weights (written only by copies, never by kernels) may be read before it: a matrix product
// issues its first weight loads, then waits, so the loads overlap the previous kernel's tail.
// pdl_trigger() lets the next kernel's blocks be scheduled at once (into whatever an SM has free;
// they then sit in their own pdl_wait). Both are no-ops before sm_90 and in launches without the
// attribute.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// The prologue of a kernel that reads no weights before it waits.
#define PDL_ENTRY() \
    do {            \
        pdl_trigger(); \
        pdl_wait();    \
    } while (0)

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

// A float4's sum of squares, in the order every RMSNorm of hob's kernels adds them, each rounding
// spelled out: written as a * a + b * b + ..., NVVM contracts it into FMAs differently where it is
// inlined, and two RMSNorms of the same row would differ in the last bit.
__device__ __forceinline__ float sq4(const float4 v) {
    return __fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.y, v.y, __fmul_rn(v.x, v.x))));
}

// 1 / sqrt(mean + eps) of a row of n from each thread's partial sum of squares, summed across
// the block in a fixed order (warps, then their sums); every thread gets it.
__device__ __forceinline__ float rms_inv(float ss, int n, float eps) {
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
    return 1.0f / sqrtf(part[0] / (float)n + eps);
}

// Prefetch into L2 the 128-byte lines of [p, p + bytes), a line per thread of the block: small
// weights a latency-bound kernel reads after it waits for the kernel before (pdl_wait).
__device__ __forceinline__ void l2_prefetch_block(const void* p, size_t bytes) {
    const size_t a = reinterpret_cast<size_t>(p) & ~(size_t)127;
    const size_t end = reinterpret_cast<size_t>(p) + bytes;
    for (size_t l = a + (size_t)threadIdx.x * 128; l < end; l += (size_t)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(l));
}

// o = w * (xr * rsqrt(mean(xr²) + eps)) for one row of n, by the whole block (up to 1024 threads,
// float4s where the row allows: a row is a few KB, so the cost is load latency, and each thread
// takes as few dependent loads as it can: benches/results/2026-11-23-h100-decode-graphs.md), also
// into `so` (shared memory, 16-byte aligned) when given. The bits depend on blockDim: every caller
// launches rms_block(n) threads (src/backend/cuda/mod.rs).
__device__ __forceinline__ void rms_norm_row(const float* __restrict__ xr,
                                             const float* __restrict__ w, float* __restrict__ o,
                                             float* __restrict__ so, int n, float eps) {
    const bool vec = (n & 3) == 0 && ((reinterpret_cast<size_t>(xr) | reinterpret_cast<size_t>(o) |
                                       reinterpret_cast<size_t>(w)) & 15) == 0;
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    float ss = 0.f;
    if (vec) {
        for (int i = threadIdx.x; i < n / 4; i += blockDim.x) ss += sq4(x4[i]);
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    }
    const float inv = rms_inv(ss, n, eps);
    if (vec) {
        for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
            const float4 v = x4[i], g = w4[i];
            const float4 r = make_float4(g.x * (v.x * inv), g.y * (v.y * inv), g.z * (v.z * inv),
                                         g.w * (v.w * inv));
            reinterpret_cast<float4*>(o)[i] = r;
            if (so) reinterpret_cast<float4*>(so)[i] = r;
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float r = w[i] * (xr[i] * inv);
            o[i] = r;
            if (so) so[i] = r;
        }
    }
}

// out[r, :] = RMSNorm(x[r0 + r, :]) * w; one block per row.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                    float* __restrict__ out, int n, int r0, float eps) {
    pdl_trigger();
    l2_prefetch_block(w, (size_t)n * 4);
    pdl_wait();
    rms_norm_row(x + (size_t)(r0 + blockIdx.x) * n, w, out + (size_t)blockIdx.x * n, nullptr, n,
                 eps);
}

// Pair `idx` of rotate-half RoPE on x ([rows, width], heads of 2 * half values; row i at
// start_pos + i), in place; the rotated pair also stored as f16 at the same place of h when given.
__device__ __forceinline__ void rope_pair(float* __restrict__ x, const float* __restrict__ inv_freq,
                                          int width, int half, int start_pos, int idx,
                                          half_bits* __restrict__ h) {
    int heads = width / (2 * half);
    int i = idx % half;
    int hd = (idx / half) % heads;
    int row = idx / (half * heads);
    float angle = (float)(start_pos + row) * inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    const size_t at = (size_t)row * width + hd * 2 * half;
    float* p = x + at;
    float a = p[i], b = p[i + half];
    const float ra = a * c - b * s, rb = b * c + a * s;
    p[i] = ra;
    p[i + half] = rb;
    if (h) {
        h[at + i] = f2h(ra);
        h[at + i + half] = f2h(rb);
    }
}

// Rotate-half RoPE in place: x is [t, width], heads of 2 * half values; row i at start_pos + i.
extern "C" __global__ void rope(float* __restrict__ x, const float* __restrict__ inv_freq, int t,
                                int width, int half, int start_pos) {
    PDL_ENTRY();
    int heads = width / (2 * half);
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= t * heads * half) return;
    rope_pair(x, inv_freq, width, half, start_pos, idx, nullptr);
}

// RoPE, the stored keys and values in one launch: q ([t, qw]) and k ([t, kvw]) rotated in place as
// `rope` rotates them, the rotated k and v stored as f16 at kc and vc ([t, kvw] each: the cache
// rows of the new positions) as `to_half` stores them.
extern "C" __global__ void rope_kv(float* __restrict__ q, float* __restrict__ k,
                                   const float* __restrict__ v, const float* __restrict__ inv_freq,
                                   int t, int qw, int kvw, int half, int start_pos,
                                   half_bits* __restrict__ kc, half_bits* __restrict__ vc) {
    PDL_ENTRY();
    const int nq = t * qw / 2, nk = t * kvw / 2, nv = t * kvw;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < nq) {
        rope_pair(q, inv_freq, qw, half, start_pos, idx, nullptr);
    } else if ((idx -= nq) < nk) {
        rope_pair(k, inv_freq, kvw, half, start_pos, idx, kc);
    } else if ((idx -= nk) < nv) {
        vc[idx] = f2h(v[idx]);
    }
}

extern "C" __global__ void add_assign(float* __restrict__ x, const float* __restrict__ y, int n) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// silu(g) * u as the CPU computes it, g / (1 + exp(-g)) * u: the one expression every SwiGLU on
// the GPU takes (the same roundings wherever it is inlined, so the fused forms give the swiglu
// kernel's bits).
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// g = silu(g) * u.
extern "C" __global__ void swiglu(float* __restrict__ g, const float* __restrict__ u, int n) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = silu_mul(g[i], u[i]);
}

// act[i] = f16(silu(g[i]) * u[i]) for i < n: swiglu and to_half in one pass, with their arithmetic
// (a prefill expert's down input, src/backend/cuda/experts.rs expert_ffn_q4h).
extern "C" __global__ void swiglu_half(const float* __restrict__ g, const float* __restrict__ u,
                                       half_bits* __restrict__ act, int n) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    act[i] = f2h(silu_mul(g[i], u[i]));
}

// Store n f32 values as f16 at dst: four a thread (launch ceil(n / 4) threads), one 16-byte load
// and one 8-byte store where src and dst allow.
extern "C" __global__ void to_half(const float* __restrict__ src, half_bits* __restrict__ dst, int n) {
    PDL_ENTRY();
    const long i = 4l * (blockIdx.x * (long)blockDim.x + threadIdx.x);
    if (i >= n) return;
    const bool vec = i + 3 < n && ((reinterpret_cast<size_t>(src) & 15) | (reinterpret_cast<size_t>(dst) & 7)) == 0;
    if (vec) {
        const float4 v = *reinterpret_cast<const float4*>(src + i);
        const uint2 o = make_uint2((u32)f2h(v.x) | ((u32)f2h(v.y) << 16),
                                   (u32)f2h(v.z) | ((u32)f2h(v.w) << 16));
        *reinterpret_cast<uint2*>(dst + i) = o;
    } else {
        for (long j = i; j < min((long)n, i + 4); j++) dst[j] = f2h(src[j]);
    }
}

// dst[j, :] = src[idx[j], :] for j < m; rows of n values, stored as f32 (gather_rows) or f16
// (gather_rows_half: an expert's tokens for gemm_q4h).
__device__ __forceinline__ float stored_as(float v, float*) { return v; }
__device__ __forceinline__ half_bits stored_as(float v, half_bits*) { return f2h(v); }

template <typename T>
__device__ __forceinline__ void gather_rows_body(const float* __restrict__ src, const int* __restrict__ idx,
                                                 T* __restrict__ dst, int n, int m) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * m) return;
    int j = i / n;
    dst[i] = stored_as(src[(size_t)idx[j] * n + (i - j * n)], dst);
}

extern "C" __global__ void gather_rows(const float* __restrict__ src, const int* __restrict__ idx,
                                       float* __restrict__ dst, int n, int m) {
    gather_rows_body<float>(src, idx, dst, n, m);
}

extern "C" __global__ void gather_rows_half(const float* __restrict__ src, const int* __restrict__ idx,
                                            half_bits* __restrict__ dst, int n, int m) {
    gather_rows_body<half_bits>(src, idx, dst, n, m);
}

// out[idx[j], :] += w[j] * y[j, :] for j < m (rows of n), y the sum over z < splits of the
// split-K partials at y + z m n, in z order (sum_splits' order). Each output row appears at most
// once per call, so there are no races.
extern "C" __global__ void scatter_axpy(float* __restrict__ out, const int* __restrict__ idx,
                                        const float* __restrict__ w, const float* __restrict__ y,
                                        int n, int m, int splits) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * m) return;
    int j = i / n;
    float v = y[i];
    for (int z = 1; z < splits; z++) v += y[(size_t)z * n * m + i];
    float* o = out + (size_t)idx[j] * n + (i - j * n);
    *o = *o + w[j] * v;
}

// out[:n] += w * y[:n]
extern "C" __global__ void axpy(float* __restrict__ out, float w, const float* __restrict__ y, int n) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __fmaf_rn(w, y[i], out[i]);
}

// Mixtral routing on the device, as the host's route_softmax_topk computes it: softmax over the
// ne router logits l of a token, the top k (ties: lower index first), weights renormalized to sum
// to 1, best first, into re (experts) and rw (weights). k <= 16.
#define ROUTE_MAX_K 16
// The top K of the probabilities p(e) (e < ne), descending, weights renormalized, into re and
// rw (k <= K entries). A template on K: the insertion below unrolls over K slots, so the common
// k = 1, 2 take a few instructions per expert instead of ROUTE_MAX_K's (the same results: slots
// at or past k are never touched).
template <int K, typename P>
__device__ __forceinline__ void route_top(P p, int ne, int k, int* re, float* rw) {
    // The best k so far, descending, in registers (every index below is a constant once the
    // loops unroll: a dynamically indexed array would live in local memory).
    float w[K];
    int ex[K];
#pragma unroll
    for (int j = 0; j < K; j++) {
        w[j] = NEG_INF;
        ex[j] = -1;
    }
    for (int e = 0; e < ne; e++) {
        const float pe = p(e);
        // pe goes to the first slot it beats (strictly: ties keep the lower index first); the
        // slots after it shift down one.
#pragma unroll
        for (int j = K - 1; j >= 0; j--) {
            const int jp = j > 0 ? j - 1 : 0;
            if (j < k && pe > w[j]) {
                const bool shift = j > 0 && pe > w[jp];
                w[j] = shift ? w[jp] : pe;
                ex[j] = shift ? ex[jp] : e;
            }
        }
    }
    float total = 0.f;
#pragma unroll
    for (int j = 0; j < K; j++)
        if (j < k) total += w[j];
#pragma unroll
    for (int j = 0; j < K; j++)
        if (j < k) {
            re[j] = ex[j];
            rw[j] = w[j] / total;
        }
}

// route_top for any k <= ROUTE_MAX_K, called (not inlined) so that its registers do not count
// against the common k's.
template <typename P>
__device__ __noinline__ void route_top_max(P p, int ne, int k, int* re, float* rw) {
    route_top<ROUTE_MAX_K>(p, ne, k, re, rw);
}

template <typename P>
__device__ __forceinline__ void route_top_k(P p, int ne, int k, int* re, float* rw) {
    if (k == 1) {
        route_top<1>(p, ne, k, re, rw);
    } else if (k == 2) {
        route_top<2>(p, ne, k, re, rw);
    } else {
        route_top_max(p, ne, k, re, rw);
    }
}

// One thread: softmax over l[:ne], then route_top_k.
__device__ void route_one(const float* l, int ne, int k, int* re, float* rw) {
    float mx = NEG_INF;
    for (int e = 0; e < ne; e++) mx = fmaxf(mx, l[e]);
    float sum = 0.f;
    for (int e = 0; e < ne; e++) sum += expf(l[e] - mx);
    route_top_k([&](int e) { return expf(l[e] - mx) / sum; }, ne, k, re, rw);
}

// route_one by one warp, the same results: the maximum and the exponentials across the lanes
// (fmaxf's maximum does not depend on the order; each exponential is the same expf), their sum
// in expert order and the top k by lane 0. l and p: shared memory of ne floats (p may be l).
__device__ __forceinline__ void route_one_warp(const float* l, float* p, int ne, int k, int* re,
                                               float* rw, int lane) {
    float mx = NEG_INF;
    for (int e = lane; e < ne; e += 32) mx = fmaxf(mx, l[e]);
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    for (int e = lane; e < ne; e += 32) p[e] = expf(l[e] - mx);
    __syncwarp();
    if (lane == 0) {
        float sum = 0.f;
        for (int e = 0; e < ne; e++) sum += p[e];
        route_top_k([&](int e) { return p[e] / sum; }, ne, k, re, rw);
    }
}

// Routes of t tokens: routes[i * k + j] = expert (int bits) and routes[t * k + i * k + j] =
// weight. One thread per token.
extern "C" __global__ void route_topk(const float* __restrict__ logits, int ne, int k, int t,
                                      float* __restrict__ routes) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= t) return;
    route_one(logits + (size_t)i * ne, ne, k, reinterpret_cast<int*>(routes) + (size_t)i * k,
              routes + (size_t)t * k + (size_t)i * k);
}

// The route (index into re's k experts) with the next expert index above route `prev`'s (prev
// -1: the lowest): walks a token's routes in ascending expert order (k is small).
__device__ __forceinline__ int next_route_up(const int* re, int k, int prev) {
    const int last = prev < 0 ? -1 : re[prev];
    int jb = -1;
    for (int j = 0; j < k; j++)
        if (re[j] > last && (jb < 0 || re[j] < re[jb])) jb = j;
    return jb;
}

// x[:n] += sum_j w_j * d[j, :n] over the k routed experts of one token (routes as route_topk
// writes them, t = 1), the experts taken in ascending index order and summed as a zeroed buffer
// and axpy then add_assign would: the same roundings as the engine's per-expert path.
extern "C" __global__ void moe_combine(float* __restrict__ x, const float* __restrict__ d,
                                       const float* __restrict__ routes, int k, int n) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int* re = reinterpret_cast<const int*>(routes);
    float o = 0.f;
    for (int m = 0, jb = -1; m < k; m++) {
        jb = next_route_up(re, k, jb);
        o = __fmaf_rn(routes[k + jb], d[(size_t)jb * n + i], o);
    }
    x[i] = x[i] + o;
}

// moe_combine, then the next RMSNorm of the new x (xn = RMSNorm(x) * g, as rms_norm_row's float4
// path computes it) in one launch: one block of rms_block(n) threads, n % 4 == 0, x, d, g and xn
// 16-byte aligned (Gpu::moe_combine checks). Each thread computes its float4s of the new x from
// the old x (no thread reads what another wrote): its first one once, kept in registers from the
// sum of squares to the stores, the rest (rows over 4 * 1024) again for the stores.
// It follows a routed down launch (Gpu::routed_ffn), so the routes and x are complete before it
// starts (sel_mat, "Ordering"): it copies the routes (k <= 16) into shared memory and reads its
// first float4 of x and of g before it waits; only the experts' outputs d are read after
// (benches/results/2026-11-24-h100-early-down.md).
extern "C" __global__ void moe_combine_norm(float* __restrict__ x, const float* __restrict__ d,
                                            const float* __restrict__ routes, int k, int n,
                                            const float* __restrict__ g, float eps,
                                            float* __restrict__ xn) {
    __shared__ float rs[32];
    pdl_trigger();
    l2_prefetch_block(g, (size_t)n * 4);
    float4* x4 = reinterpret_cast<float4*>(x);
    const int i0 = threadIdx.x;
    const bool early = k <= 16;
    const float4* g4 = reinterpret_cast<const float4*>(g);
    float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), g0 = x0;
    if (early) {
        if (threadIdx.x < 2 * k) rs[threadIdx.x] = __ldcg(routes + threadIdx.x);
        if (i0 < n / 4) {
            x0 = __ldcg(x4 + i0);
            g0 = g4[i0];
        }
    }
    pdl_wait();
    if (early) {
        __syncthreads();
        routes = rs;
    }
    const int* re = reinterpret_cast<const int*>(routes);
    auto val = [&](int i) {
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int m = 0, jb = -1; m < k; m++) {
            jb = next_route_up(re, k, jb);
            const float wj = routes[k + jb];
            const float4 dv = __ldcg(reinterpret_cast<const float4*>(d + (size_t)jb * n) + i);
            o.x = __fmaf_rn(wj, dv.x, o.x);
            o.y = __fmaf_rn(wj, dv.y, o.y);
            o.z = __fmaf_rn(wj, dv.z, o.z);
            o.w = __fmaf_rn(wj, dv.w, o.w);
        }
        const float4 v = early && i == i0 ? x0 : x4[i];
        return make_float4(v.x + o.x, v.y + o.y, v.z + o.z, v.w + o.w);
    };
    // The thread's first float4 of the new x, kept from the sum of squares to the stores: a second
    // pass would load d again (benches/results/2026-11-24-h100-small-kernels.md).
    float4 v0 = make_float4(0.f, 0.f, 0.f, 0.f);
    float ss = 0.f;
    for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
        const float4 v = val(i);
        if (i == i0) v0 = v;
        ss += sq4(v);
    }
    const float inv = rms_inv(ss, n, eps);
    for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
        const float4 v = i == i0 ? v0 : val(i), w = early && i == i0 ? g0 : g4[i];
        x4[i] = v;
        reinterpret_cast<float4*>(xn)[i] =
            make_float4(w.x * (v.x * inv), w.y * (v.y * inv), w.z * (v.z * inv), w.w * (v.w * inv));
    }
}

// ---------------------------------------------------------------------------------------------
// Attention over an f16 KV cache. Grid (n_heads, t); a block of up to ATT_MAX_WARPS warps. Each
// warp walks a strided subset of the visible positions with an online softmax; the warps then
// merge.

#define ATT_MAX_WARPS 16
#define ATT_MAX_J 8  // head_dim up to 256
#define ATT_PREFETCH 128  // positions whose keys and values a block prefetches into L2

extern "C" __global__ void attention(const float* __restrict__ q, const half_bits* __restrict__ kc,
                                     const half_bits* __restrict__ vc, float* __restrict__ out,
                                     int n_heads, int n_kv_heads, int hd, int start_pos,
                                     int window, const int* __restrict__ posp) {
    pdl_trigger();
    int h = blockIdx.x, i = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    int q_dim = n_heads * hd, kv_dim = n_kv_heads * hd;
    int kvh = h / (n_heads / n_kv_heads);
    if (gridDim.y == 1) {
        // Decode: the keys and values of the first ATT_PREFETCH positions this block reads, into
        // L2 while the kernel before runs (L2 is coherent: a line the kernel before still writes
        // is only fetched early). The position is read around L1; a stale one would only
        // prefetch other lines. (Prefill's many blocks would prefetch the same lines again.)
        int pp = start_pos;
        if (posp) asm volatile("ld.global.cg.s32 %0, [%1];" : "=r"(pp) : "l"(posp));
        pp += i;
        const int f0 = window > 0 ? max(0, pp + 1 - window) : 0;
        const int np = min(pp + 1 - f0, ATT_PREFETCH), lines = (hd * 2 + 127) / 128;
        for (int j = threadIdx.x; j < np * lines * 2; j += blockDim.x) {
            const int p = f0 + j / (2 * lines), part = j % (2 * lines);
            const half_bits* base = (part < lines ? kc : vc) + (size_t)p * kv_dim + kvh * hd;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(base + (part % lines) * 64));
        }
    }
    pdl_wait();
    // A decode step reads its position from device memory (the same launch serves every token).
    int pos = (posp ? *posp : start_pos) + i;
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
    // The position's keys and values load together (one memory latency per position), and the
    // warp's next position loads while this one is computed
    // (benches/results/2026-11-25-h100-token-gap.md).
    half_bits kr[ATT_MAX_J], vr[ATT_MAX_J], kn[ATT_MAX_J], vn[ATT_MAX_J];
    auto kv_load = [&](int p, half_bits (&ko)[ATT_MAX_J], half_bits (&vo)[ATT_MAX_J]) {
        const half_bits* k = kc + (size_t)p * kv_dim + kvh * hd;
        const half_bits* v = vc + (size_t)p * kv_dim + kvh * hd;
        const bool in = p <= pos;
#pragma unroll
        for (int j = 0; j < ATT_MAX_J; j++) {
            int d = lane + 32 * j;
            ko[j] = in && d < hd ? k[d] : 0;
            vo[j] = in && d < hd ? v[d] : 0;
        }
    };
    kv_load(first + warp, kn, vn);
    for (int p = first + warp; p <= pos; p += warps) {
#pragma unroll
        for (int j = 0; j < ATT_MAX_J; j++) {
            kr[j] = kn[j];
            vr[j] = vn[j];
        }
        kv_load(p + warps, kn, vn);
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < ATT_MAX_J; j++) {
            int d = lane + 32 * j;
            if (d < hd) dot += qv[j] * h2f(kr[j]);
        }
        float s = warp_sum(dot) * scale;
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new);
        float e = expf(s - m_new);
        l = l * corr + e;
#pragma unroll
        for (int j = 0; j < ATT_MAX_J; j++) {
            int d = lane + 32 * j;
            if (d < hd) acc[j] = acc[j] * corr + e * h2f(vr[j]);
        }
        m = m_new;
    }
    __shared__ float sm_m[ATT_MAX_WARPS], sm_l[ATT_MAX_WARPS];
    __shared__ float sm_acc[ATT_MAX_WARPS][32 * ATT_MAX_J];
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < ATT_MAX_J; j++) sm_acc[warp][lane + 32 * j] = acc[j];
    __syncthreads();
    float mx = NEG_INF;
    for (int w = 0; w < warps; w++) mx = fmaxf(mx, sm_m[w]);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0.f, den = 0.f;
        for (int w = 0; w < warps; w++) {
            if (sm_m[w] == NEG_INF) continue;
            float f = expf(sm_m[w] - mx);
            num += sm_acc[w][d] * f;
            den += sm_l[w] * f;
        }
        out[(size_t)i * q_dim + h * hd + d] = num / den;
    }
}

// Prefill attention (t > 1 tokens; `attention` serves decode): a block takes ATP_ROWS (query,
// head) rows that share one KV head (the GQA group's heads of ATP_ROWS / group consecutive
// queries), walks the visible positions ATP_CHUNK at a time with each chunk's keys and values in
// shared memory (read from L2 once per block, not once per query and head), and keeps an online
// softmax per row: a warp owns ATP_ROWS / 8 rows; lane j scores position j of the chunk (keys
// stored with one padding word a row, so the 32 lanes read 32 banks) and owns DPL dims of the
// output. Grid (n_kv_heads, tiles); 256 threads; head_dim = 32 * DPL; ATP_ROWS % group == 0
// (Gpu::attention checks). `attention` would read every position from L2 once per query and head
// (benches/results/2026-11-24-h100-prefill.md).
#define ATP_ROWS 32
#define ATP_CHUNK 32
template <int DPL>
__device__ __forceinline__ void attention_prefill_body(
    const float* __restrict__ q, const half_bits* __restrict__ kc, const half_bits* __restrict__ vc,
    float* __restrict__ out, int n_heads, int n_kv_heads, int t, int start_pos, int window) {
    constexpr int HD = 32 * DPL, KW = HD / 2 + 1, RPW = ATP_ROWS / 8;  // key row: KW words
    __shared__ float qs[ATP_ROWS][HD];
    __shared__ u32 ks[ATP_CHUNK][KW];
    __shared__ __align__(16) half_bits vs[ATP_CHUNK][HD];
    const int group = n_heads / n_kv_heads, qpb = ATP_ROWS / group;
    const int kvh = blockIdx.x, q0 = blockIdx.y * qpb;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int q_dim = n_heads * HD, kv_dim = n_kv_heads * HD;
    // Row r: query q0 + r / group, head kvh * group + r % group.
    for (int i = threadIdx.x; i < ATP_ROWS * HD; i += blockDim.x) {
        const int r = i / HD, d = i % HD, qi = q0 + r / group;
        qs[r][d] = qi < t ? q[(size_t)qi * q_dim + (kvh * group + r % group) * HD + d] : 0.f;
    }
    // The positions some row of the block sees: [lo, hi].
    const int qlast = min(q0 + qpb, t) - 1;
    const int hi = start_pos + qlast;
    const int lo = window > 0 ? max(0, start_pos + q0 + 1 - window) : 0;
    float m[RPW], l[RPW], acc[RPW][DPL];
    int pos[RPW], first[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int r = warp * RPW + i, qi = q0 + r / group;
        pos[i] = qi < t ? start_pos + qi : -1;  // a padding row sees nothing
        first[i] = window > 0 ? max(0, pos[i] + 1 - window) : 0;
        m[i] = NEG_INF;
        l[i] = 0.f;
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[i][d] = 0.f;
    }
    const float scale = 1.0f / sqrtf((float)HD);
    for (int p0 = lo; p0 <= hi; p0 += ATP_CHUNK) {
        __syncthreads();  // the last chunk's readers are done (and qs is written, the first time)
        // The chunk's keys and values, 8 halves a thread at a time (positions past hi: zeros).
        for (int i = threadIdx.x; i < ATP_CHUNK * HD / 8; i += blockDim.x) {
            const int j = i / (HD / 8), c = i % (HD / 8), p = p0 + j;
            uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = kv4;
            if (p <= hi) {
                kv4 = *reinterpret_cast<const uint4*>(kc + (size_t)p * kv_dim + kvh * HD + c * 8);
                vv4 = *reinterpret_cast<const uint4*>(vc + (size_t)p * kv_dim + kvh * HD + c * 8);
            }
            ks[j][c * 4] = kv4.x;
            ks[j][c * 4 + 1] = kv4.y;
            ks[j][c * 4 + 2] = kv4.z;
            ks[j][c * 4 + 3] = kv4.w;
            *reinterpret_cast<uint4*>(&vs[j][c * 8]) = vv4;
        }
        __syncthreads();
        // Scores: lane j against position p0 + j, for the warp's rows.
        float sc[RPW];
#pragma unroll
        for (int i = 0; i < RPW; i++) sc[i] = 0.f;
        const float* qw = &qs[warp * RPW][0];
#pragma unroll 8
        for (int w2 = 0; w2 < HD / 2; w2++) {
            const u32 kw = ks[lane][w2];
            const float k0 = h2f((half_bits)(kw & 0xffff)), k1 = h2f((half_bits)(kw >> 16));
#pragma unroll
            for (int i = 0; i < RPW; i++) {
                const float2 qv = *reinterpret_cast<const float2*>(qw + i * HD + 2 * w2);
                sc[i] = fmaf(qv.y, k1, fmaf(qv.x, k0, sc[i]));
            }
        }
        const int p = p0 + lane;
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            const bool vis = p <= pos[i] && p >= first[i];
            const float s = vis ? sc[i] * scale : NEG_INF;
            float cm = s;
#pragma unroll
            for (int o = 16; o >= 1; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
            const float m_new = fmaxf(m[i], cm);
            if (m_new == NEG_INF) {
                sc[i] = 0.f;  // nothing visible yet
                continue;
            }
            const float corr = expf(m[i] - m_new);
            const float e = vis ? expf(s - m_new) : 0.f;
            l[i] = l[i] * corr + warp_sum(e);
#pragma unroll
            for (int d = 0; d < DPL; d++) acc[i][d] *= corr;
            m[i] = m_new;
            sc[i] = e;
        }
        // Values: every lane adds the chunk's 32 positions to its DPL dims.
#pragma unroll 4
        for (int j = 0; j < ATP_CHUNK; j++) {
            float vv[DPL];
#pragma unroll
            for (int d = 0; d < DPL; d++) vv[d] = h2f(vs[j][lane * DPL + d]);
#pragma unroll
            for (int i = 0; i < RPW; i++) {
                const float e = __shfl_sync(0xffffffffu, sc[i], j);
#pragma unroll
                for (int d = 0; d < DPL; d++) acc[i][d] = fmaf(e, vv[d], acc[i][d]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int r = warp * RPW + i, qi = q0 + r / group;
        if (qi >= t) continue;
        float* o = out + (size_t)qi * q_dim + (kvh * group + r % group) * HD + lane * DPL;
#pragma unroll
        for (int d = 0; d < DPL; d++) o[d] = acc[i][d] / l[i];
    }
}

#define ATTENTION_PREFILL(DPL)                                                                  \
    extern "C" __global__ void __launch_bounds__(256) attention_prefill_##DPL(                  \
        const float* __restrict__ q, const half_bits* __restrict__ kc,                          \
        const half_bits* __restrict__ vc, float* __restrict__ out, int n_heads, int n_kv_heads, \
        int t, int start_pos, int window) {                                                     \
        PDL_ENTRY();                                                                            \
        attention_prefill_body<DPL>(q, kc, vc, out, n_heads, n_kv_heads, t, start_pos, window); \
    }
ATTENTION_PREFILL(1)
ATTENTION_PREFILL(2)
ATTENTION_PREFILL(4)

// ---------------------------------------------------------------------------------------------
// Dequantize-matvec: y[r] = sum_c W[r, c] x[c]. Float kinds (f32/f16/bf16): one warp per row; each
// lane reads 16-byte chunks of the row (coalesced across the warp), several in flight, and converts
// them in registers. Needs row_bytes % 16 == 0 and 16-byte aligned codes and x; matvec_any handles
// the rest. The integer kinds have their own kernels (matvec_q_*, below).

struct Mat {
    const u8* codes;
    const unsigned short* scales;  // f16 bits
    const unsigned short* mins;    // f16 bits
    int rows, cols, group, row_bytes;
};

// Four f32 weights (their bits) times four x values: the one expression every f32 product adds,
// its roundings spelled out (as sq4's: the same bits wherever it is inlined).
__device__ __forceinline__ float dot4_f32(const uint4& v, const float4& xv) {
    return __fmaf_rn(__uint_as_float(v.w), xv.w,
                     __fmaf_rn(__uint_as_float(v.z), xv.z,
                               __fmaf_rn(__uint_as_float(v.y), xv.y,
                                         __fmul_rn(__uint_as_float(v.x), xv.x))));
}

// The contribution of one 16-byte chunk `c` of row r (float kinds).
template <int KIND>
__device__ __forceinline__ float chunk_dot(const uint4& v, const float* __restrict__ x, int c,
                                           const Mat& w, int r) {
    const u32 word[4] = {v.x, v.y, v.z, v.w};
    if (KIND == KIND_F32) {
        return dot4_f32(v, *reinterpret_cast<const float4*>(x + c * 4));
    } else {  // f16, bf16
        const float4 xa = *reinterpret_cast<const float4*>(x + c * 8);
        const float4 xb = *reinterpret_cast<const float4*>(x + c * 8 + 4);
        const float xs[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            unsigned short lo = word[k] & 0xffff, hi = word[k] >> 16;
            float a = KIND == KIND_F16 ? h2f(lo) : bf2f(lo);
            float b = KIND == KIND_F16 ? h2f(hi) : bf2f(hi);
            // Roundings spelled out, as in dot4_f32.
            s = __fmaf_rn(b, xs[2 * k + 1], __fmaf_rn(a, xs[2 * k], s));
        }
        return s;
    }
}

// Row r of W times x, summed across the warp (every lane gets the sum): the one order of
// summation every float-kind product of a token uses.
// DEPTH chunks in flight per lane; the chunks are summed in ascending order whatever DEPTH is, so
// every DEPTH gives the same bits (a lone router launch loads deeper: it is latency-bound).
// WAIT: pdl_wait() once the first DEPTH chunks of the row are loading (before x is read).
// ROW_DEPTH: the depth of the float products of the attention block and the output head: rows of
// a few KB, so each round trip counts.
constexpr int ROW_DEPTH = 8;
// TRIG: pdl_trigger() right after that wait (a kernel whose dependents may then rely on everything
// the kernel before it finished: matvec3_rope, see matvec_body's `early`).
template <int KIND, int DEPTH = 4, bool WAIT = false, bool TRIG = false>
__device__ __forceinline__ float row_dot(const Mat& w, int r, const float* __restrict__ x,
                                         int lane) {
    const uint4* row = reinterpret_cast<const uint4*>(w.codes + (size_t)r * w.row_bytes);
    int n = w.row_bytes / 16;
    float acc = 0.f;
    int c = lane;
    bool waited = !WAIT;
    for (; c + 32 * (DEPTH - 1) < n; c += 32 * DEPTH) {
        uint4 v[DEPTH];
#pragma unroll
        for (int d = 0; d < DEPTH; d++) v[d] = __ldg(row + c + 32 * d);
        if (!waited) {
            pdl_wait();
            if (TRIG) pdl_trigger();
            waited = true;
        }
#pragma unroll
        for (int d = 0; d < DEPTH; d++) acc += chunk_dot<KIND>(v[d], x, c + 32 * d, w, r);
    }
    if (!waited) {
        pdl_wait();
        if (TRIG) pdl_trigger();
    }
    for (; c < n; c += 32) acc += chunk_dot<KIND>(__ldg(row + c), x, c, w, r);
    return warp_sum(acc);
}

// ACC with `early`: y (the residual) is read before the wait, which holds where the q/k/v launch
// of the layer (matvec3_rope) came between its last writer and this launch: that launch lets
// later kernels start only after its own wait (Gpu's caller passes early only then).
template <int KIND, bool ACC = false>
__device__ __forceinline__ void matvec_body(const Mat w, const float* __restrict__ x,
                                            float* __restrict__ y, int early = 0) {
    pdl_trigger();
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= w.rows) return;
    const float y0 = ACC && early && lane == 0 ? __ldcg(y + r) : 0.f;
    const float acc = row_dot<KIND, ROW_DEPTH, true>(w, r, x, lane);
    if (lane == 0) y[r] = ACC ? (early ? y0 : y[r]) + acc : acc;
}

extern "C" __global__ void matvec_f32(const Mat w, const float* x, float* y) { matvec_body<KIND_F32>(w, x, y); }
extern "C" __global__ void matvec_f16(const Mat w, const float* x, float* y) { matvec_body<KIND_F16>(w, x, y); }
extern "C" __global__ void matvec_bf16(const Mat w, const float* x, float* y) { matvec_body<KIND_BF16>(w, x, y); }

// y += W x (a projection and its residual add: the sum rounded as matvec then add_assign).
extern "C" __global__ void matvec_add_f32(const Mat w, const float* x, float* y, int early) { matvec_body<KIND_F32, true>(w, x, y, early); }
extern "C" __global__ void matvec_add_f16(const Mat w, const float* x, float* y, int early) { matvec_body<KIND_F16, true>(w, x, y, early); }
extern "C" __global__ void matvec_add_bf16(const Mat w, const float* x, float* y, int early) { matvec_body<KIND_BF16, true>(w, x, y, early); }

// Three products of one x in one launch (q, k and v): blockIdx.y picks the matrix; blocks past
// its rows return.
#define MATVEC3(NAME, KIND)                                                                    \
    extern "C" __global__ void NAME(const Mat a, const Mat b, const Mat c, const float* x,     \
                                    float* ya, float* yb, float* yc) {                         \
        if (blockIdx.y == 0) matvec_body<KIND>(a, x, ya);                                      \
        else if (blockIdx.y == 1) matvec_body<KIND>(b, x, yb);                                 \
        else matvec_body<KIND>(c, x, yc);                                                      \
    }
MATVEC3(matvec3_f32, KIND_F32)
MATVEC3(matvec3_f16, KIND_F16)
MATVEC3(matvec3_bf16, KIND_BF16)

// One decode token's q, k and v with RoPE and the KV store in one launch: matvec3's products (each
// row's sum as row_dot makes it) and then rope_kv's rotation (rope_pair's arithmetic at position
// *posp, read from device memory so the same launch serves every token) and f16 stores into row
// *posp of the layer's caches kc and vc. Blocks of 8 warps: blockIdx.y 0 (q) and 1 (k)
// take 4 rotation pairs each (rows i and i + half of a head: warps w and w + 4), 2 (v) 8 rows.
template <int KIND>
__device__ __forceinline__ void matvec3_rope_body(const Mat a, const Mat b, const Mat c,
                                                  const float* __restrict__ x, float* yq,
                                                  float* yk, float* yv,
                                                  const float* __restrict__ inv_freq, int half,
                                                  const int* __restrict__ posp,
                                                  half_bits* __restrict__ kc,
                                                  half_bits* __restrict__ vc) {
    // Dependents start only after this launch's wait (row_dot TRIG, or below): see matvec_body.
    // The position and the frequencies are written only by copies (the host's, ordered before
    // this launch), so they load before the wait, beside the first weights.
    const int pos = __ldg(posp);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (blockIdx.y == 2) {
        const int r = blockIdx.x * 8 + warp;
        if (r >= c.rows) return;
        const float v = row_dot<KIND, ROW_DEPTH, true, true>(c, r, x, lane);
        vc += (size_t)pos * c.rows;
        if (lane == 0) {
            yv[r] = v;
            vc[r] = f2h(v);
        }
        return;
    }
    const bool isq = blockIdx.y == 0;
    const Mat w = isq ? a : b;
    float* y = isq ? yq : yk;
    const int pairs = w.rows / 2;
    __shared__ float d[8];
    const int q = blockIdx.x * 4 + threadIdx.x;
    const float freq = threadIdx.x < 4 && q < pairs ? __ldg(inv_freq + q % half) : 0.f;
    const int p = blockIdx.x * 4 + (warp & 3);
    if (p < pairs) {
        const int at = (p / half) * 2 * half, i = p % half;
        const float v =
            row_dot<KIND, ROW_DEPTH, true, true>(w, at + i + (warp >> 2) * half, x, lane);
        if (lane == 0) d[warp] = v;
    }
    pdl_wait();  // (a no-op where row_dot waited: every warp that writes below did)
    pdl_trigger();
    __syncthreads();
    kc += (size_t)pos * b.rows;
    if (threadIdx.x < 4 && q < pairs) {
        const int at = (q / half) * 2 * half, i = q % half;
        const float angle = (float)pos * freq;
        float sn, cs;
        sincosf(angle, &sn, &cs);
        const float va = d[threadIdx.x], vb = d[threadIdx.x + 4];
        const float ra = va * cs - vb * sn, rb = vb * cs + va * sn;
        y[at + i] = ra;
        y[at + i + half] = rb;
        if (!isq) {
            kc[at + i] = f2h(ra);
            kc[at + i + half] = f2h(rb);
        }
    }
}

// Four blocks an SM (at most 64 registers a thread), so that Mixtral's 768 blocks of q, k and v
// take fewer waves (benches/results/2026-11-24-h100-launch-bounds.md).
#define MATVEC3_ROPE(NAME, KIND)                                                                \
    extern "C" __global__ void __launch_bounds__(256, 4)                                        \
    NAME(const Mat a, const Mat b, const Mat c, const float* x,                                 \
                                    float* yq, float* yk, float* yv, const float* inv_freq,     \
                                    int half, const int* posp, half_bits* kc, half_bits* vc) {  \
        matvec3_rope_body<KIND>(a, b, c, x, yq, yk, yv, inv_freq, half, posp, kc, vc);          \
    }
MATVEC3_ROPE(matvec3_rope_f32, KIND_F32)
MATVEC3_ROPE(matvec3_rope_f16, KIND_F16)
MATVEC3_ROPE(matvec3_rope_bf16, KIND_BF16)

// A table entry of resident experts' matrices: DevMat's layout in src/backend/cuda/mod.rs.
// Tables are [experts][3] (gate, up, down).
//
// Decode MoE from such a table, float kinds, one token routed to k experts (routes: k expert
// indices, then k weights):
// - moe_route_*: the router's logits (one block, a warp per row, ne <= 256) and route_one;
// - moe_gate_up_*: h[j, r] = silu(gate_j[r] x) * (up_j[r] x), grid (ceil(ffn / 8), k);
// - moe_down_*: x[r] += sum_j w_j (down_j[r] h_j), experts in ascending index order.
// Each row's sum is row_dot's, and SwiGLU and the weighted sum round as swiglu, axpy and
// add_assign do: the same results as the per-expert path, bit for bit.
struct MatEntry {
    Mat m;
    int kind, pad;
};

template <int KIND>
__device__ __forceinline__ void moe_route_body(const Mat w, const float* __restrict__ x, int k,
                                               float* __restrict__ routes) {
    __shared__ float lg[256];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int r = warp; r < w.rows; r += warps) {
        const float v = row_dot<KIND, 16>(w, r, x, lane);
        if (lane == 0) lg[r] = v;
    }
    __syncthreads();
    if (warp == 0) route_one_warp(lg, lg, w.rows, k, reinterpret_cast<int*>(routes), routes + k, lane);
}

// The experts a token was routed to, from a table of resident experts, several matrices in one
// launch (decode with routing left on the device; the integer kinds). tab: a table of MatEntry;
// routes: the token's k experts (route_topk).
// Launch j = blockIdx.y takes matrix which0 + j / k of expert routes[j % k], reading x + (j % k) *
// xs and writing y + j * ys: gate and up of every routed expert (which0 0, 2k launches, xs 0), or
// down (which0 2, k launches, xs the gate outputs' stride).

//
// Ordering (sm_90, dependent launches): the first routed launch of a token (which0 0: gate and
// up) reads routes the kernel right before it wrote, so it waits first, and only then lets the
// kernels after it start (pdl_trigger). A later routed launch (which0 > 0: down) therefore starts
// only once the routes and the table are complete and visible in L2: it reads them (through L2,
// __ldcg: an SM's L1 may hold the previous token's) before it waits, and its first weight loads
// go out while the kernel before it (SwiGLU) still runs, as a plain product's do
// (benches/results/2026-11-24-h100-early-down.md).
// ceil(a / b) for 0 <= a < 2^24 and 0 < b < 2^24 (a matrix's rows, a tile's rows) without an
// integer division: a quotient from the reciprocal (off by at most one), then corrected.
__device__ __forceinline__ int ceil_div_small(int a, int b) {
    int q = __float2int_rz((float)a * __frcp_rn((float)b));
    q -= q * b > a;
    q += (q + 1) * b <= a;
    return q + (q * b < a);
}
__device__ __forceinline__ Mat sel_mat(const MatEntry* __restrict__ tab, const float* routes, int k,
                                       int which0) {
    // j / k and j % k without a division where j < 2k (every routed launch: gate and up 2k, the
    // gate-up form and down k), which runs before the routes' load
    // (benches/results/2026-11-28-h200-x-staging-16bit.md).
    const int j = blockIdx.y, jq = j < k ? 0 : j < 2 * k ? 1 : j / k;
    const int jr = j - jq * k;
    const int e = __ldcg(reinterpret_cast<const int*>(routes) + jr);
    static_assert(sizeof(MatEntry) == 48, "MatEntry: three 16-byte words");
    const uint4* p = reinterpret_cast<const uint4*>(tab + e * 3 + which0 + jq);
    union {
        uint4 w[3];
        MatEntry m;
    } u;
#pragma unroll
    for (int i = 0; i < 3; i++) u.w[i] = __ldcg(p + i);
    return u.m.m;
}

// The prologue of a routed launch (the ordering above).
__device__ __forceinline__ void sel_entry(int which0) {
    if (which0 == 0) {
        pdl_wait();
        pdl_trigger();
    }
}

template <int KIND>
__device__ __forceinline__ void moe_gate_up_body(const MatEntry* __restrict__ tab,
                                                 const float* __restrict__ routes, int k,
                                                 const float* __restrict__ x,
                                                 float* __restrict__ h) {
    const int j = blockIdx.y, e = reinterpret_cast<const int*>(routes)[j];
    const Mat g = tab[e * 3].m, u = tab[e * 3 + 1].m;
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= g.rows) return;
    const float gv = row_dot<KIND>(g, r, x, lane);
    const float uv = row_dot<KIND>(u, r, x, lane);
    if (lane == 0) h[(size_t)j * g.rows + r] = silu_mul(gv, uv);
}

template <int KIND>
__device__ __forceinline__ void moe_down_body(const MatEntry* __restrict__ tab,
                                              const float* __restrict__ routes, int k,
                                              const float* __restrict__ h,
                                              float* __restrict__ x) {
    const int* re = reinterpret_cast<const int*>(routes);
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= tab[re[0] * 3 + 2].m.rows) return;
    float o = 0.f;
    for (int m = 0, jb = -1; m < k; m++) {
        jb = next_route_up(re, k, jb);
        const Mat d = tab[re[jb] * 3 + 2].m;
        const float v = row_dot<KIND>(d, r, h + (size_t)jb * d.cols, lane);
        o = __fmaf_rn(routes[k + jb], v, o);
    }
    if (lane == 0) x[r] = x[r] + o;
}

// The MoE block's RMSNorm and the routing in one launch: xn = RMSNorm(x) * g (as rms_norm
// writes it, for the expert launches), kept in shared memory (w.cols floats, dynamic) for the
// router's rows. rms_block(w.cols) threads.
//
// With `pre` the router's rows follow in shared memory (w.rows * w.row_bytes more, dynamic),
// copied there before the kernel waits for the one before it (the router is a weight: written
// only by copies), so that the copy overlaps that kernel's tail, where a single block reading
// them after the wait took an L2 round trip per 16 chunks at one SM's share of L2 bandwidth
// (128 KB for Mixtral's f32 router). The sums are row_dot's, in its order: the same routes.
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem));
}
#endif

// 16 bytes of shared memory from the first `bytes` (0..16, even) at gmem, the rest zero: an
// asynchronous copy (cp.async, committed and waited for by the caller) from sm_80 on, a plain
// one before (its cp_async_* calls are then no-ops). gmem is 16-byte aligned (read only where
// bytes > 0).
__device__ __forceinline__ void cp_async16z(void* smem, const void* gmem, int bytes) {
#if __CUDA_ARCH__ >= 800
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa), "l"(gmem), "r"(bytes));
#else
    union {
        uint4 v;
        unsigned short h[8];
    } u;
    u.v = make_uint4(0, 0, 0, 0);
    if (bytes == 16) {
        u.v = *reinterpret_cast<const uint4*>(gmem);
    } else {
        for (int i = 0; i < bytes / 2; i++) u.h[i] = reinterpret_cast<const unsigned short*>(gmem)[i];
    }
    *reinterpret_cast<uint4*>(smem) = u.v;
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// moe_route_norm_body for a router of f32 rows with one 16-byte chunk of each row a thread
// (cols == 4 * blockDim.x: Mixtral's 4096 with 1024 threads) and up to ROUTE_REG_ROWS rows: each
// thread loads its chunk of every row into registers before the wait (the router is a weight),
// normalizes its own float4 of x (rms_norm_row's arithmetic), multiplies it into its chunks and
// leaves the products in shared memory (sp: rows * blockDim.x floats); warp r then adds row r's
// products in row_dot's order (lane l: chunks l, l + 32, ..., then the warp sum; dot4_f32's
// roundings): the same logits as the other forms, from 36 KB of shared-memory traffic where a warp
// a row reading x and the row took 256 KB (benches/results/2026-11-24-h100-small-kernels.md).
#define ROUTE_REG_ROWS 8
__device__ __forceinline__ bool route_regs_apply(const Mat& w, const float* x, const float* g,
                                                 const float* xn) {
    return w.rows <= ROUTE_REG_ROWS && w.cols == 4 * (int)blockDim.x &&
           w.row_bytes == 4 * w.cols &&
           ((reinterpret_cast<size_t>(x) | reinterpret_cast<size_t>(g) |
             reinterpret_cast<size_t>(xn) | reinterpret_cast<size_t>(w.codes)) & 15) == 0;
}

__device__ __forceinline__ void route_norm_regs(const Mat& w, const float* __restrict__ x,
                                                const float* __restrict__ g, float eps,
                                                float* __restrict__ xn, int k,
                                                float* __restrict__ routes, float* sp) {
    __shared__ float lg[ROUTE_REG_ROWS];
    const int t = threadIdx.x, nc = blockDim.x, warp = t >> 5, lane = t & 31;
    const uint4* rows = reinterpret_cast<const uint4*>(w.codes);
    uint4 rc[ROUTE_REG_ROWS];
#pragma unroll
    for (int r = 0; r < ROUTE_REG_ROWS; r++)
        rc[r] = r < w.rows ? __ldg(rows + (size_t)r * nc + t) : make_uint4(0, 0, 0, 0);
    const float4 g0 = __ldg(reinterpret_cast<const float4*>(g) + t);
    pdl_wait();
    const float4 v = __ldcg(reinterpret_cast<const float4*>(x) + t);
    const float inv = rms_inv(sq4(v), w.cols, eps);
    const float4 o = make_float4(g0.x * (v.x * inv), g0.y * (v.y * inv), g0.z * (v.z * inv),
                                 g0.w * (v.w * inv));
    reinterpret_cast<float4*>(xn)[t] = o;
#pragma unroll
    for (int r = 0; r < ROUTE_REG_ROWS; r++)
        if (r < w.rows) sp[r * nc + t] = dot4_f32(rc[r], o);
    __syncthreads();
    if (warp < w.rows) {
        float acc = 0.f;
        for (int c = lane; c < nc; c += 32) acc += sp[warp * nc + c];
        acc = warp_sum(acc);
        if (lane == 0) lg[warp] = acc;
    }
    __syncthreads();
    if (warp == 0) route_one_warp(lg, lg, w.rows, k, reinterpret_cast<int*>(routes), routes + k, lane);
}

template <int KIND>
__device__ __forceinline__ void moe_route_norm_body(const Mat w, const float* __restrict__ x,
                                                    const float* __restrict__ g, float eps,
                                                    float* __restrict__ xn, int k,
                                                    float* __restrict__ routes, int pre) {
    extern __shared__ float4 xs4[];
    if (KIND == KIND_F32 && pre && route_regs_apply(w, x, g, xn)) {
        route_norm_regs(w, x, g, eps, xn, k, routes, reinterpret_cast<float*>(xs4));
        return;
    }
    float* xs = reinterpret_cast<float*>(xs4);
    uint4* wsm = reinterpret_cast<uint4*>(xs4 + w.cols / 4);
    const int nc = w.row_bytes / 16, total = w.rows * nc;
    // With pre, the norm's weights too (w.cols floats after the rows).
    uint4* gsm = wsm + total;
    if (pre) {
        const uint4* src = reinterpret_cast<const uint4*>(w.codes);
        const uint4* gsrc = reinterpret_cast<const uint4*>(g);
#if __CUDA_ARCH__ >= 800
        for (int c = threadIdx.x; c < total; c += blockDim.x) cp_async16(wsm + c, src + c);
        for (int c = threadIdx.x; c < w.cols / 4; c += blockDim.x) cp_async16(gsm + c, gsrc + c);
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_all;" ::: "memory");
#else
        for (int c = threadIdx.x; c < total; c += blockDim.x) wsm[c] = __ldg(src + c);
        for (int c = threadIdx.x; c < w.cols / 4; c += blockDim.x) gsm[c] = __ldg(gsrc + c);
#endif
        __syncthreads();
        g = reinterpret_cast<const float*>(gsm);
    } else {
        l2_prefetch_block(g, (size_t)w.cols * 4);
        l2_prefetch_block(w.codes, (size_t)w.rows * w.row_bytes);
    }
    pdl_wait();
    rms_norm_row(x, g, xn, xs, w.cols, eps);
    if (!pre) {
        __syncthreads();
        moe_route_body<KIND>(w, xs, k, routes);
        return;
    }
    __syncthreads();
    __shared__ float lg[256];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int r = warp; r < w.rows; r += warps) {
        // row_dot's order: lane l adds chunks l, l + 32, ... in turn, then warp_sum.
        const uint4* row = wsm + (size_t)r * nc;
        float acc = 0.f;
        for (int c = lane; c < nc; c += 32) acc += chunk_dot<KIND>(row[c], xs, c, w, r);
        acc = warp_sum(acc);
        if (lane == 0) lg[r] = acc;
    }
    __syncthreads();
    if (warp == 0) route_one_warp(lg, lg, w.rows, k, reinterpret_cast<int*>(routes), routes + k, lane);
}

#define MOE_KERNELS(SUFFIX, KIND)                                                              \
    extern "C" __global__ void __launch_bounds__(1024)                                         \
        moe_route_##SUFFIX(const Mat w, const float* x, int k, float* routes) {                \
        PDL_ENTRY();                                                                           \
        moe_route_body<KIND>(w, x, k, routes);                                                 \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(1024)                                         \
        moe_route_norm_##SUFFIX(const Mat w, const float* x, const float* g, float eps,         \
                                float* xn, int k, float* routes, int pre) {                    \
        pdl_trigger();                                                                         \
        moe_route_norm_body<KIND>(w, x, g, eps, xn, k, routes, pre);                           \
    }                                                                                          \
    extern "C" __global__ void moe_gate_up_##SUFFIX(const MatEntry* tab, const float* routes,  \
                                                    int k, const float* x, float* h) {         \
        PDL_ENTRY();                                                                           \
        moe_gate_up_body<KIND>(tab, routes, k, x, h);                                          \
    }                                                                                          \
    extern "C" __global__ void moe_down_##SUFFIX(const MatEntry* tab, const float* routes,     \
                                                 int k, const float* h, float* x) {            \
        PDL_ENTRY();                                                                           \
        moe_down_body<KIND>(tab, routes, k, h, x);                                             \
    }
MOE_KERNELS(f32, KIND_F32)
MOE_KERNELS(f16, KIND_F16)
MOE_KERNELS(bf16, KIND_BF16)

// The routed experts of one host-routed decode layer (experts in cache slots), for the routed
// kernels below and moe_gate_up/moe_down/moe_combine: a table of their matrices and their routes,
// passed by value (stream-ordered, no host copy). Expert "indices" are ranks 0..n-1 in ascending
// order of the real indices, so the kernels sum in the same order as for the real ones.
#define SLOTS_MAX_K 8
struct SlotArgs {
    MatEntry e[3 * SLOTS_MAX_K];
    float routes[2 * SLOTS_MAX_K];  // n ranks (int bits), then n weights
    int n, pad;
};

extern "C" __global__ void put_slots(const SlotArgs a, MatEntry* __restrict__ tab,
                                     float* __restrict__ routes) {
    PDL_ENTRY();
    const int i = threadIdx.x;
    if (i < 3 * a.n) tab[i] = a.e[i];
    if (i < a.n) {
        routes[i] = a.routes[i];
        routes[a.n + i] = a.routes[a.n + i];
    }
}

#define SEL_ARGS                                                                                  \
    const MatEntry *tab, const float *routes, int k, int which0, const float *x, int xs, int glu,  \
        float *y, int ys
#define SEL_X x + (size_t)(blockIdx.y % k) * xs
// glu: x holds k gate products and then k up products (xs apart): the input is their SwiGLU.
#define SEL_U (glu ? x + (size_t)(blockIdx.y % k + k) * xs : nullptr)
#define SEL_Y y + (size_t)blockIdx.y * ys


// ---------------------------------------------------------------------------------------------
// Integer dequantize-matvec (int8/int4/int2), the kernels the launcher picks for every layout whose
// rows are 16-byte multiples (src/backend/cuda/mod.rs, Gpu::matvec).
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
// A code word's codes, masked in place into its four bytes (set s: codes b * S + s of bytes b), meet
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
// The shared-memory ring's steps per kind (matvec_q_body RING; 0: AHEAD steps in registers),
// chosen by architecture in kernels.rs (qd_ring), which reserves the ring's shared memory
// (QShape::ring; benches/results/2026-11-25-h100-qd-ring.md).
#if !defined(QD_RING_INT8) || !defined(QD_RING_INT4) || !defined(QD_RING_INT2)
#error "QD_RING_INT8/INT4/INT2: passed by src/backend/cuda/kernels.rs (Kernels::nvrtc_options)"
#endif
#define QD_RING_OF(KIND) \
    ((KIND) == KIND_INT8 ? QD_RING_INT8 : (KIND) == KIND_INT4 ? QD_RING_INT4 : QD_RING_INT2)

// Set s of code word w: one code per byte (int8: the word, its bytes signed).
template <int KIND>
__device__ __forceinline__ u32 qd_codes(u32 w, int s) {
    if (KIND == KIND_INT8) return w;
    return (s == 0 ? w : w >> (QTraits<KIND>::BITS * s)) & (u32)QDTraits<KIND>::M;
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
        d += (TOP ? (int)(signed char)xb : xb) * (KIND == KIND_INT8 ? (int)(signed char)cb : cb);
    }
#else
    if (KIND == KIND_INT8) {
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
                // Per set, values b * S + s (b = 0..3) rounded to 16 bits (cvt saturates: only
                // -32768 needs the clamp to -QMAX, two values at a time), paired, and their bytes
                // split into the planes by two byte permutes. A bad chunk's values all become 0
                // (v * 0 is 0 or NaN, and NaN converts to 0): the bits of the general form.
                const float mz = bad ? 0.f : mul;
                const int c = m >> 2, wd = m & 3;
                u32 o[2][S];
    #pragma unroll
                for (int s = 0; s < S; s++) {
                    const u32 t01 = __vmaxs2(pack_s16_rn(v[s] * mz, v[S + s] * mz), 0x80018001u);
                    const u32 t23 = __vmaxs2(pack_s16_rn(v[2 * S + s] * mz, v[3 * S + s] * mz), 0x80018001u);
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
                        for (int by = 0; by < 4; by++) b |= ((u32)(q[by * S + s] >> sh) & 0xffu) << (8 * by);
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

// The sums of R rows held across a warp: returns, in lanes l with l % (32 / R) == 0, the full sum
// of row l / (32 / R) (the other lanes hold partial or repeated sums). Fixed order.
template <int R>
__device__ __forceinline__ float qreduce(float (&v)[R], int lane) {
#pragma unroll
    for (int half = R / 2, off = 16; half >= 1; half >>= 1, off >>= 1) {
        const bool up = lane & off;
#pragma unroll
        for (int i = 0; i < half; i++) {
            const float send = up ? v[i] : v[i + half];
            const float keep = up ? v[i + half] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
    }
    float r = v[0];
#pragma unroll
    for (int off = 16 / R; off >= 1; off >>= 1) r += __shfl_xor_sync(0xffffffffu, r, off);
    return r;
}

// A streamed 16-byte load that skips L1: the weights are read once, and x lives in shared memory
// (benches/results/2026-11-22-h100-int-matvec.md).
__device__ __forceinline__ uint4 qld(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// The step after step k of tile t, for a block walking its tiles (blockIdx.x, + gridDim.x, ...)
// ksteps steps each: (nt, nk).
__device__ __forceinline__ void next_step(int t, int k, int ksteps, int& nt, int& nk) {
    nk = k + 1;
    nt = t;
    if (nk == ksteps) {
        nk = 0;
        nt += gridDim.x;
    }
}

// One step's loads of a lane: a chunk of each of the R rows, with its scale and min bits.
template <int R>
struct QBuf {
    uint4 v[R];
    u32 sm[R];  // scale bits | min bits << 16 (when a chunk lies in one group)
};

// y = W x for int8/int4/int2 (row_bytes % 16 == 0; codes and x 16-byte aligned, scales and mins
// 2-byte). blockDim.x = 32 * warps, warps % split == 0; a tile is (warps / split) * R rows, tiles
// go to blocks round-robin; the columns go in tiles of tchunks chunks (a multiple of 32 when there
// is more than one), each staged in turn (y then accumulated by the same thread, in order).
// Dynamic shared memory: q_smem in mod.rs. DP: the integer-dot-product form (qdstage), for groups
// of whole chunks.
// GU (DP only, one column tile: tchunks covers the row): gate and up of one expert in one block,
// y = SwiGLU(w x, wu x) (matvec_qd_*_gu). A warp's R row slots hold R/2 rows of w (gate) and the
// same R/2 rows of wu (up), so a row's SwiGLU takes one shuffle (split 1) or the shared-memory sums
// the split already needs: no barrier the plain kernel does not have. Each row's sum is the plain
// kernel's (same split, same order; qreduce's sums do not depend on the slot), and SwiGLU rounds
// as the swiglu kernel does: the same bits as the two products and the swiglu launch.
//
// EARLY_STEPS: ring steps issued before the kernel waits (and so ahead of x's loads), 0 for all of
// the first RING - 1; the rest go out behind x's loads. Every kernel issues all of them first but
// the plain int2 one, which issues 1 (matvec_qd_body;
// benches/results/2026-11-27-h100-int2-column-slices.md).
// RING > 0 (DP only): the codes, scales and mins of the next RING - 1 steps stream into a ring in
// shared memory by cp.async (no registers held for loads in flight) instead of AHEAD steps of
// registers; the same sums. Layouts where each group is 1, 2 or 4 chunks, a row's groups a
// multiple of 8 and scales and mins 16-byte aligned (Gpu::ring_ok); q_smem reserves the ring.
template <int KIND, int R, bool DP = false, int AHEAD = 1, bool GU = false, int RING = 0,
          int EARLY_STEPS = 0>
__device__ __forceinline__ void matvec_q_body(const Mat w, const float* __restrict__ x,
                                              const float* __restrict__ u,
                                              float* __restrict__ y, int split, int tchunks,
                                              const Mat wu = Mat()) {
    static_assert(!GU || DP, "the gate-up form is a dp4a kernel");
    static_assert(RING == 0 || (DP && RING >= 2), "the ring is a dp4a form of 2 or more steps");
    pdl_trigger();
    constexpr int CC = QTraits<KIND>::CC, P = QTraits<KIND>::P, Q = CC / 4,
                  EPW = QTraits<KIND>::EPW;
    extern __shared__ float4 qsm[];
    const int n = w.row_bytes >> 4;
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // split is a power of two (q_plan): shifts, and the tile count from a reciprocal
    // (ceil_div_small), so that no integer division delays the first weight load
    // (benches/results/2026-11-28-h200-x-staging-16bit.md).
    const int split_sh = __ffs(split) - 1;
    const int g = warp >> split_sh, s = warp - g * split;
    // Rows of a matrix per warp group (GU: slot i takes row i % RM of w, then of wu).
    constexpr int RM = GU ? R / 2 : R;
    const int tile_rows = (warps >> split_sh) * RM;
    const int ntiles = ceil_div_small(w.rows, tile_rows);
    if ((int)blockIdx.x >= ntiles) return;
    const int tpad = (tchunks + 31) & ~31;
    float4* xs4 = qsm;
    float* sxp = reinterpret_cast<float*>(qsm + tpad * Q);
    // DP: the byte planes (qd_parts * S 16-byte words a chunk), then (2^e, sum) per chunk.
    u32* xq = reinterpret_cast<u32*>(qsm);
    float2* xsx = reinterpret_cast<float2*>(qsm + tpad * QD_PARTS * QDTraits<KIND>::S);
    float* red = DP ? reinterpret_cast<float*>(xsx + tpad) : sxp + tpad * P;  // [2][warps][R]
    int* wsm = reinterpret_cast<int*>(red + 2 * warps * R);  // [2][warps]
    // RING: this warp's RING steps of RSB bytes after wsm (16-byte aligned): codes [R][32 lanes]
    // of 16 bytes, then per row 64 bytes of scales and 64 of mins (the step's 32 chunks' groups).
    constexpr int RSB = R * 512 + R * 128;
    // (An offset from qsm, not an integer round trip of the address, which would lose the shared
    // space and make the ring's reads generic loads.)
    const int ring_off =
        ((int)(reinterpret_cast<const char*>(wsm + 2 * warps) - reinterpret_cast<const char*>(qsm)) + 15) & ~15;
    u8* const ring = reinterpret_cast<u8*>(qsm) + ring_off + warp * RING * RSB;
    // (RING: groups of 1, 2 or 4 chunks, a power of two.)
    const int gpr = RING > 0 ? w.cols >> (__ffs(w.group) - 1) : w.cols / w.group;
    const bool fast = DP || KIND == KIND_INT8 || w.group % CC == 0;
    const int cpg = w.group / CC;
    const int cpg_shift = (cpg & (cpg - 1)) == 0 ? __ffs(cpg) - 1 : -1;
    // RING: the piece of a step's scales or mins this lane copies, fixed for the launch: row slot
    // ri_s, array (0 scales, 1 mins) and 16-byte piece pc_s of its 4 / cpg pieces; its place in a
    // ring slot, so_s. Lanes from R * pieces * arrays on copy none.
    const int ppr_s = RING > 0 ? 4 >> cpg_shift : 1, per_s = ppr_s * (KIND == KIND_INT8 ? 1 : 2);
    const bool lane_s = RING > 0 && lane < R * per_s;
    // (ppr_s and per_s are powers of two.)
    const int ppr_sh = RING > 0 ? 2 - cpg_shift : 0, per_sh = ppr_sh + (KIND == KIND_INT8 ? 0 : 1);
    const int ri_s = lane >> per_sh;
    const int a_s = (lane - ri_s * per_s) >> ppr_sh;
    const int pc_s = lane - ri_s * per_s - a_s * ppr_s;
    const int so_s = R * 512 + (ri_s * 2 + a_s) * 64 + pc_s * 16;
    const int step = 32 * split, c0 = s * 32 + lane;
    int parity = 0;

    for (int ct0 = 0; ct0 < n; ct0 += tchunks) {
        const int tn = min(tchunks, n - ct0);
        const int ksteps = (tn + step - 1) >> (5 + split_sh);
        // The rows' code and scale bases of the tile being loaded, set once per tile.
        const uint4* lrow[R];
        int lsrow[R];
        const unsigned short* lsrc = nullptr;  // RING: this lane's scale or min piece, the tile's row
        int ltile = -1;
        auto set_tile = [&](int t) {
            if (t != ltile) {
                ltile = t;
#pragma unroll
                for (int i = 0; i < R; i++) {
                    const int r = min(t * tile_rows + g * RM + i % RM, w.rows - 1);
                    const u8* codes = GU && i >= RM ? wu.codes : w.codes;
                    lrow[i] = reinterpret_cast<const uint4*>(codes + (size_t)r * w.row_bytes) + ct0;
                    lsrow[i] = r * gpr;
                }
                if (lane_s) {
                    const bool up = GU && ri_s >= RM;
                    const int r = min(t * tile_rows + g * RM + ri_s % RM, w.rows - 1);
                    const unsigned short* base = a_s == 0 ? (up ? wu.scales : w.scales) : (up ? wu.mins : w.mins);
                    lsrc = base + (size_t)r * gpr + (ct0 >> cpg_shift) + 8 * pc_s;
                }
            }
        };
        auto load = [&](QBuf<R>& b, int t, int k) {
            set_tile(t);
            const int c = c0 + k * step;
            const bool in = c < tn;
            const int cg = ct0 + c;
            const int gi = fast ? (cpg_shift >= 0 ? cg >> cpg_shift : cg / cpg) : 0;
#pragma unroll
            for (int i = 0; i < R; i++) {
                b.v[i] = in ? qld(lrow[i] + c) : make_uint4(0, 0, 0, 0);
                u32 sm = 0;
                if (fast && in) {
                    const bool up = GU && i >= RM;
                    sm = __ldg((up ? wu.scales : w.scales) + lsrow[i] + gi);
                    if (KIND != KIND_INT8) sm |= (u32)__ldg((up ? wu.mins : w.mins) + lsrow[i] + gi) << 16;
                }
                b.sm[i] = sm;
            }
        };
        // RING: step (t, k)'s codes, scales and mins into ring slot `slot` as one committed group
        // (an empty group past the last tile, so that every step commits one). Lane l copies its
        // chunk of each row; the step's scales and mins (32 / cpg groups a row, 4 / cpg pieces of
        // 16 bytes per array) go one piece a lane; bytes past the column tile are zero-filled.
        auto issue = [&](int slot, int t, int k) {
            if (RING > 0 && t < ntiles) {
                set_tile(t);
                u8* st = ring + slot * RSB;
                const int c = c0 + k * step;
                // Past the column tile: 0 bytes from its last chunk (an address in the row).
                const int cl = min(c, tn - 1), nb = c < tn ? 16 : 0;
                u8* dst = st + lane * 16;
#pragma unroll
                for (int i = 0; i < R; i++) cp_async16z(dst + i * 512, lrow[i] + cl, nb);
                if (lane_s) {
                    const int cb = s * 32 + k * step;  // the warp's first chunk of the step
                    if (cb + 32 <= tn) {
                        cp_async16z(st + so_s, lsrc + (cb >> cpg_shift), 16);
                    } else {
                        const int vg = min(max((tn - cb + cpg - 1) >> cpg_shift, 0), 32 >> cpg_shift);
                        const int bytes = min(max(vg * 2 - 16 * pc_s, 0), 16);
                        cp_async16z(st + so_s, bytes > 0 ? lsrc + (cb >> cpg_shift) : lsrc, bytes);
                    }
                }
            }
            cp_async_commit();
        };
        // RING: slot `slot`'s step as a QBuf (after its group completed and the warp synced).
        auto fetch = [&](QBuf<R>& b, int slot) {
            const u8* st = ring + slot * RSB;
            const int gl = lane >> cpg_shift;
#pragma unroll
            for (int i = 0; i < R; i++) {
                b.v[i] = *reinterpret_cast<const uint4*>(st + (i * 32 + lane) * 16);
                const unsigned short* sp = reinterpret_cast<const unsigned short*>(st + R * 512 + i * 128);
                u32 sm = sp[gl];
                if (KIND != KIND_INT8) sm |= (u32)sp[32 + gl] << 16;
                b.sm[i] = sm;
            }
        };
        // A ring of AHEAD + 1 buffers: step (t, k) computes from one while the next AHEAD steps
        // load into the others ((lt, lk): the last step loaded).
        QBuf<R> b0, b1, b2;
        int t = blockIdx.x, k = 0, lt = t, lk = 0;
        // RING: steps 1 .. RING - 2 into their slots (step 0 is issued before the wait).
        auto issue_first = [&](int j0, int j1) {
#pragma unroll
            for (int j = 1; j < RING - 1; j++) {
                if (j < j0 || j >= j1) continue;
                int nt, nk;
                next_step(lt, lk, ksteps, nt, nk);
                lt = nt;
                lk = nk;
                issue(j, lt, lk);
            }
        };
        constexpr int EARLY = EARLY_STEPS == 0 || EARLY_STEPS > RING - 1 ? RING - 1 : EARLY_STEPS;
        if (RING > 0) {
            // Steps 0 .. EARLY - 1 before the wait and x's staging, the rest of the first RING - 1
            // behind x's loads.
            issue(0, t, k);
            issue_first(1, EARLY);
        } else {
            load(b0, t, k);
        }
        if (RING == 0 && AHEAD == 2) {
            int nt, nk;
            next_step(lt, lk, ksteps, nt, nk);
            lt = nt;
            lk = nk;
            if (lt < ntiles) load(b1, lt, lk);
        }
        pdl_wait();  // the first codes are loading; x may come from the kernel before
        const float* xt = x + (size_t)ct0 * CC;
        const float* ut = u ? u + (size_t)ct0 * CC : nullptr;
        float kscale = 1.f;
        if (DP) {
            qdstage<KIND, (RING > 0 ? 2 : 1)>(xt, ut, tn, xq, xsx, [&] {
                if (RING > 0) issue_first(EARLY, RING - 1);
            });
        } else {
            kscale = qstage<KIND>(xt, ut, tn, xs4, sxp, wsm);
        }
        float racc[R];
#pragma unroll
        for (int i = 0; i < R; i++) racc[i] = 0.f;
        // Compute step (t, k) from `cur` and move on; false when no step is left.
        auto compute = [&](const QBuf<R>& cur) -> bool {
            int nk, nt;
            next_step(t, k, ksteps, nt, nk);
            const int c = c0 + k * step;
            if (DP && c < tn) {
                constexpr int S = QDTraits<KIND>::S, PP = QD_PARTS;
                int a[PP][R];
#pragma unroll
                for (int p = 0; p < PP; p++)
#pragma unroll
                    for (int i = 0; i < R; i++) a[p][i] = 0;
#pragma unroll
                for (int wd = 0; wd < 4; wd++) {
                    u32 xp[PP][S];
#pragma unroll
                    for (int p = 0; p < PP; p++) qd_load<S>(xq + qd_at<KIND>(c, p, wd), xp[p]);
#pragma unroll
                    for (int i = 0; i < R; i++) {
                        const u32 wv = qword(cur.v[i], wd);
#pragma unroll
                        for (int s = 0; s < S; s++) {
                            const u32 cd = qd_codes<KIND>(wv, s);
                            a[0][i] = qd_dot<KIND, true>(cd, xp[0][s], a[0][i]);
#pragma unroll
                            for (int p = 1; p < PP; p++) a[p][i] = qd_dot<KIND, false>(cd, xp[p][s], a[p][i]);
                        }
                    }
                }
                const float2 es = xsx[c];
#pragma unroll
                for (int i = 0; i < R; i++) {
                    const float sc = h2f((half_bits)(cur.sm[i] & 0xffff));
                    const float d = qd_sum<PP, R>(a, i) * es.x;
                    if (KIND == KIND_INT8) {
                        racc[i] = fmaf(sc, d, racc[i]);
                    } else {
                        const float mn = h2f((half_bits)(cur.sm[i] >> 16));
                        racc[i] = fmaf(sc, d, fmaf(mn, es.y, racc[i]));
                    }
                }
            } else if (!DP && c < tn) {
                const float4* xb = xs4 + (c >> 5) * Q * 32 + lane;
                if (fast) {
                    float a[R];
#pragma unroll
                    for (int i = 0; i < R; i++) a[i] = 0.f;
#pragma unroll
                    for (int wd = 0; wd < 4; wd++) {
                        float xv[EPW];
                        x_word<EPW>(xb, wd, xv);
#pragma unroll
                        for (int i = 0; i < R; i++) a[i] = qword_dot<KIND>(qword(cur.v[i], wd), xv, a[i]);
                    }
                    float sx;
                    if (P == 4) {
                        const float4 p4 = reinterpret_cast<const float4*>(sxp)[c];
                        sx = (p4.x + p4.y) + (p4.z + p4.w);
                    } else if (P == 2) {
                        const float2 p2 = reinterpret_cast<const float2*>(sxp)[c];
                        sx = p2.x + p2.y;
                    } else {
                        sx = sxp[c];
                    }
#pragma unroll
                    for (int i = 0; i < R; i++) {
                        const float sc = h2f((half_bits)(cur.sm[i] & 0xffff));
                        if (KIND == KIND_INT8) {
                            racc[i] = fmaf(sc, fmaf(-128.f, sx, a[i]), racc[i]);
                        } else {
                            const float mn = h2f((half_bits)(cur.sm[i] >> 16));
                            racc[i] = fmaf(sc, a[i], fmaf(mn, sx, racc[i]));
                        }
                    }
                } else {
                    // A chunk spans groups: scale per 16-column piece.
                    constexpr int WPP = 16 / EPW;  // words per piece
#pragma unroll
                    for (int p = 0; p < P; p++) {
                        float a[R];
#pragma unroll
                        for (int i = 0; i < R; i++) a[i] = 0.f;
#pragma unroll
                        for (int wp = 0; wp < WPP; wp++) {
                            const int wd = p * WPP + wp;
                            float xv[EPW];
                            x_word<EPW>(xb, wd, xv);
#pragma unroll
                            for (int i = 0; i < R; i++) a[i] = qword_dot<KIND>(qword(cur.v[i], wd), xv, a[i]);
                        }
                        const float sx = sxp[c * P + p];
                        const int gi = ((ct0 + c) * CC + 16 * p) / w.group;
#pragma unroll
                        for (int i = 0; i < R; i++) {
                            const int r = min(t * tile_rows + g * R + i, w.rows - 1);
                            const size_t si = (size_t)r * gpr + gi;
                            const float sc = h2f(__ldg(w.scales + si));
                            if (KIND == KIND_INT8) {
                                racc[i] = fmaf(sc, fmaf(-128.f, sx, a[i]), racc[i]);
                            } else {
                                racc[i] = fmaf(sc, a[i], fmaf(h2f(__ldg(w.mins + si)), sx, racc[i]));
                            }
                        }
                    }
                }
            }
            if (nk == 0) {
                // Tile t done: its rows' sums, in a fixed order.
                const float v = qreduce<R>(racc, lane);
                const int ri = lane / (32 / R);
                const bool writer = (lane & (32 / R - 1)) == 0;
                if (split == 1) {
                    if (GU) {
                        // Slot ri (gate) and slot ri + RM (up) of a row: up's sum is (32 / R) RM
                        // lanes higher.
                        const float uv = __shfl_down_sync(0xffffffffu, v, (32 / R) * RM);
                        const int r = t * tile_rows + g * RM + ri;
                        if (writer && ri < RM && r < w.rows) y[r] = silu_mul(v, uv);
                    } else {
                        const int r = t * tile_rows + g * R + ri;
                        if (writer && r < w.rows) {
                            const float o = v * kscale;
                            y[r] = ct0 > 0 ? y[r] + o : o;
                        }
                    }
                } else {
                    float* rb = red + parity * warps * R;
                    if (writer) rb[warp * R + ri] = v;
                    __syncthreads();
                    const int r = t * tile_rows + g * RM + lane;
                    if (s == 0 && lane < RM && r < w.rows) {
                        // Each row's sum: 0 + the warps' in order (GU: gate's slot and up's).
                        float sum = 0.f, us = 0.f;
                        for (int ss = 0; ss < split; ss++) {
                            sum += rb[(g * split + ss) * R + lane];
                            if (GU) us += rb[(g * split + ss) * R + lane + RM];
                        }
                        if (GU) {
                            y[r] = silu_mul(sum, us);
                        } else {
                            const float o = sum * kscale;
                            y[r] = ct0 > 0 ? y[r] + o : o;
                        }
                    }
                    parity ^= 1;
                }
#pragma unroll
                for (int i = 0; i < R; i++) racc[i] = 0.f;
            }
            t = nt;
            k = nk;
            return t < ntiles;
        };
        // One step: load the step after (lt, lk) into `fill`, compute (t, k) from `cur`.
        auto run = [&](const QBuf<R>& cur, QBuf<R>& fill) -> bool {
            int nk, nt;
            next_step(lt, lk, ksteps, nt, nk);
            lt = nt;
            lk = nk;
            if (lt < ntiles) load(fill, lt, lk);
            return compute(cur);
        };
        if (RING > 0) {
            // Step j: issue step j + RING - 1 into the slot step j - 1 used, wait for step j's
            // group (RING - 1 may stay pending), compute from its slot. The warp syncs make the
            // other lanes' copies (scales) visible, and keep a slot until every lane read it.
            int slot = 0;
            bool more = true;
            while (more) {
                int nk, nt;
                next_step(lt, lk, ksteps, nt, nk);
                lt = nt;
                lk = nk;
                issue(slot == 0 ? RING - 1 : slot - 1, lt, lk);
                cp_async_wait<RING - 1>();
                __syncwarp();
                fetch(b0, slot);
                __syncwarp();
                more = compute(b0);
                slot = slot == RING - 1 ? 0 : slot + 1;
            }
            cp_async_wait<0>();
            __syncwarp();
        } else if (AHEAD == 2) {
            while (run(b0, b2) && run(b1, b0) && run(b2, b1)) {
            }
        } else {
            while (run(b0, b1) && run(b1, b0)) {
            }
        }
    }
}

// The plain and routed-expert (_sel) kernels of one integer family for int8, int4 and int2:
// PREFIX##_int8 ... PREFIX##_int2_sel, the plain ones LBODY<kind, ARG>, the _sel ones
// BODY<kind, ARG>. A _sel kernel runs with its plain kernel's launch plan (Gpu::sel_supports):
// SEL_ATTR bounds its registers to the largest block a plan takes (512 threads), which its SwiGLU
// staging would otherwise exceed for int8.
#define INT_MATVEC_KERNELS(PREFIX, BODY, LBODY, ARG, ATTR, SEL_ATTR)                                  \
    extern "C" __global__ void ATTR PREFIX##_int8(const Mat w, const float* x, float* y, int split,   \
                                                  int tchunks) {                                      \
        LBODY<KIND_INT8, ARG>(w, x, nullptr, y, split, tchunks);                                       \
    }                                                                                                 \
    extern "C" __global__ void ATTR PREFIX##_int4(const Mat w, const float* x, float* y, int split,   \
                                                  int tchunks) {                                      \
        LBODY<KIND_INT4, ARG>(w, x, nullptr, y, split, tchunks);                                       \
    }                                                                                                 \
    extern "C" __global__ void ATTR PREFIX##_int2(const Mat w, const float* x, float* y, int split,   \
                                                  int tchunks) {                                      \
        LBODY<KIND_INT2, ARG>(w, x, nullptr, y, split, tchunks);                                       \
    }                                                                                                 \
    extern "C" __global__ void SEL_ATTR PREFIX##_int8_sel(SEL_ARGS, int split, int tchunks) {         \
        sel_entry(which0);                                                                            \
        BODY<KIND_INT8, ARG>(sel_mat(tab, routes, k, which0), SEL_X, SEL_U, SEL_Y, split, tchunks);   \
    }                                                                                                 \
    extern "C" __global__ void SEL_ATTR PREFIX##_int4_sel(SEL_ARGS, int split, int tchunks) {         \
        sel_entry(which0);                                                                            \
        BODY<KIND_INT4, ARG>(sel_mat(tab, routes, k, which0), SEL_X, SEL_U, SEL_Y, split, tchunks);   \
    }                                                                                                 \
    extern "C" __global__ void SEL_ATTR PREFIX##_int2_sel(SEL_ARGS, int split, int tchunks) {         \
        sel_entry(which0);                                                                            \
        BODY<KIND_INT2, ARG>(sel_mat(tab, routes, k, which0), SEL_X, SEL_U, SEL_Y, split, tchunks);   \
    }

// R = 4 rows per warp, one chunk position per step (benches/results/2026-11-22-h100-int-matvec.md).
INT_MATVEC_KERNELS(matvec_q, matvec_q_body, matvec_q_body, 4, , __launch_bounds__(512))

// The integer-dot-product kernels (matvec_qd_*), for layouts whose groups are whole chunks.
// LONE: a plain kernel, whose int2 form issues one ring step before it waits (matvec_q_body).
template <int KIND, int R, bool LONE = false>
__device__ __forceinline__ void matvec_qd_body(const Mat w, const float* __restrict__ x,
                                               const float* __restrict__ u,
                                               float* __restrict__ y, int split, int tchunks) {
    constexpr int EARLY = LONE && KIND == KIND_INT2 ? 1 : 0;
    matvec_q_body<KIND, R, true, (int)QDTraits<KIND>::AHEAD, false, QD_RING_OF(KIND), EARLY>(
        w, x, u, y, split, tchunks);
}
template <int KIND, int R>
__device__ __forceinline__ void matvec_qd_lone_body(const Mat w, const float* x, const float* u,
                                                    float* y, int split, int tchunks) {
    matvec_qd_body<KIND, R, true>(w, x, u, y, split, tchunks);
}
INT_MATVEC_KERNELS(matvec_qd, matvec_qd_body, matvec_qd_lone_body, 4, , __launch_bounds__(512))

// Gate and up of a token's k routed experts with their SwiGLU, one launch (blockIdx.y = j: expert
// routes[j], gate and up from the table as sel_mat reads them): y + j * ys = SwiGLU(gate x, up x),
// the bits of the _sel launch of both (which0 0) and the swiglu launch (matvec_q_body's GU). The
// launcher takes it where the plain plan's row groups split evenly and x fits one column tile
// (Gpu::routed_ffn). Ordering as a which0 = 0 routed launch (sel_entry).
#define QD_GU_KERNEL(NAME, KIND)                                                                    \
    extern "C" __global__ void __launch_bounds__(512)                                               \
        NAME(const MatEntry* tab, const float* routes, int k, const float* x, float* y, int ys,     \
             int split, int tchunks) {                                                              \
        sel_entry(0);                                                                               \
        matvec_q_body<KIND, 4, true, (int)QDTraits<KIND>::AHEAD, true, QD_RING_OF(KIND)>(          \
            sel_mat(tab, routes, k, 0), x, nullptr, y + (size_t)blockIdx.y * ys, split, tchunks,    \
            sel_mat(tab, routes, k, 1));                                                            \
    }
QD_GU_KERNEL(matvec_qd_int8_gu, KIND_INT8)
QD_GU_KERNEL(matvec_qd_int4_gu, KIND_INT4)
QD_GU_KERNEL(matvec_qd_int2_gu, KIND_INT2)

// ---------------------------------------------------------------------------------------------
// Integer dequantize-matvec on the tensor cores (sm_80 and later, for groups of 1, 2 or a multiple
// of 4 whole chunks; the launcher takes it only for the kinds where it is faster: Gpu::qm_kinds,
// benches/results/2026-11-23-h100-int-matvec-mma.md).
//
// The scalar kernels above spend about three instructions per weight (an AND and an FMA each,
// plus addressing). Here the products go to mma.sync m16n8k16 (f16 inputs, f32 accumulation),
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
    PDL_ENTRY();
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
    PDL_ENTRY();
    int c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c >= w.cols || r >= nrows) return;
    out[(size_t)r * w.cols + c] = f2h(element(w, kind, r0 + r, c));
}

// The same for the integer kinds, one 32-bit code word (4, 8 or 16 codes of one group) per thread,
// stored as 8-32 contiguous bytes: codes and rows 4-byte aligned, cols % 8 == 0, group a multiple
// of the codes per word (Gpu::matmul checks; dequant_rows_h otherwise). Each value as element()
// computes it. Grid (ceil(row_bytes / 4 / block), nrows).
template <int KIND>
__device__ __forceinline__ void dequant_word_h(const Mat& w, half_bits* __restrict__ out, int r0,
                                               int r, int wi) {
    constexpr int BITS = KIND == KIND_INT8 ? 8 : KIND == KIND_INT4 ? 4 : 2, EPW = 32 / BITS;
    const size_t row = (size_t)(r0 + r);
    const int c0 = wi * EPW;
    const u32 word = reinterpret_cast<const u32*>(w.codes + row * w.row_bytes)[wi];
    const size_t g = row * (w.cols / w.group) + c0 / w.group;
    const float s = h2f(w.scales[g]);
    const float mn = KIND == KIND_INT8 ? 0.f : h2f(w.mins[g]);
    u32 h[EPW / 2];
#pragma unroll
    for (int j = 0; j < EPW; j += 2) {
        float a, b;
        if (KIND == KIND_INT8) {
            a = s * (float)(signed char)(word >> (8 * j));
            b = s * (float)(signed char)(word >> (8 * j + 8));
        } else {
            constexpr u32 M = (1u << BITS) - 1;
            a = s * (float)((word >> (BITS * j)) & M) + mn;
            b = s * (float)((word >> (BITS * j + BITS)) & M) + mn;
        }
        h[j / 2] = (u32)f2h(a) | ((u32)f2h(b) << 16);
    }
    half_bits* o = out + (size_t)r * w.cols + c0;
    if (EPW == 4) {
        *reinterpret_cast<uint2*>(o) = make_uint2(h[0], h[1]);
    } else {
#pragma unroll
        for (int v = 0; v < EPW / 8; v++)
            reinterpret_cast<uint4*>(o)[v] = make_uint4(h[4 * v], h[4 * v + 1], h[4 * v + 2], h[4 * v + 3]);
    }
}

extern "C" __global__ void dequant_words_h(const Mat w, int kind, half_bits* __restrict__ out, int r0,
                                           int nrows) {
    PDL_ENTRY();
    const int wi = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (wi * 4 >= w.row_bytes || r >= nrows) return;
    switch (kind) {
        case KIND_INT8: dequant_word_h<KIND_INT8>(w, out, r0, r, wi); break;
        case KIND_INT4: dequant_word_h<KIND_INT4>(w, out, r0, r, wi); break;
        case KIND_INT2: dequant_word_h<KIND_INT2>(w, out, r0, r, wi); break;
        default: break;
    }
}

// Prefill products of int4 weights without an f16 tile: out[n, r] (rows ld apart) = sum_c W[r, c]
// xh[n, c] for n < t, r < w.rows, each weight dequantized in shared memory as dequant_word_h
// computes it (f16 of s * q + min) and multiplied on the tensor cores (mma m16n8k16, f16 inputs, f32
// accumulation), as cuBLAS does with the tile. A block: 128 rows x BN tokens, 64 columns a step
// (one group of g64), the next step's codes and tokens loaded during the products; 8 warps of 32
// rows x BN / 2 tokens. Block z of the grid's K parts takes steps [z ksteps, (z + 1) ksteps) and
// writes its partial sums at out + z t ld (sum_splits adds them in z order). Needs cols % 64 == 0,
// group == 64, row_bytes % 16 == 0, 16-byte aligned codes and xh (Gpu::matmul checks). Grid
// (ceil(rows / 128), ceil(t / BN), parts): K in parts so that a matrix of few row blocks still
// fills the SMs (benches/results/2026-11-24-h100-prefill.md).
#define GQ_BM 128
#define GQ_BK 64
#define GQ_LD 72  // halves a shared row: 144 bytes, so ldmatrix's 8 rows hit 32 banks
__device__ __forceinline__ void ldsm_x4(u32& r0, u32& r1, u32& r2, u32& r3, const void* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a));
}
template <int BN>
__device__ __forceinline__ void gemm_q4h_body(const Mat& w, const half_bits* __restrict__ xh, int t,
                                              float* __restrict__ out, int ld, int ksteps) {
#if __CUDA_ARCH__ >= 800
    constexpr int NT = BN / 16;  // n8 tiles a warp
    constexpr int XV = BN * GQ_BK / 8 / 256;  // 16-byte x loads a thread per step
    __shared__ __align__(16) half_bits ws[GQ_BM * GQ_LD];
    __shared__ __align__(16) half_bits xs[BN * GQ_LD];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp & 3, wn = warp >> 2;
    const int m0 = blockIdx.x * GQ_BM, n0 = blockIdx.y * BN;
    const int gpr = w.cols / w.group;
    // Split K: block z takes steps [z * ksteps, ...) and writes its own [t, ld] partial.
    const int kb = blockIdx.z * ksteps * GQ_BK, ke = min(w.cols, kb + ksteps * GQ_BK);
    out += (size_t)blockIdx.z * t * ld;
    // This thread's loads: 32 codes (16 bytes) of row lr, half lh of the step; XV x chunks.
    const int lr = tid >> 1, lh = tid & 1, grow = min(m0 + lr, w.rows - 1);
    const uint4* crow = reinterpret_cast<const uint4*>(w.codes + (size_t)grow * w.row_bytes);
    uint4 cv, xv[XV];
    u32 smv;
    auto gload = [&](int k0) {
        cv = crow[k0 / 32 + lh];
        const size_t g = (size_t)grow * gpr + k0 / w.group;
        smv = (u32)w.scales[g] | ((u32)w.mins[g] << 16);
#pragma unroll
        for (int v = 0; v < XV; v++) {
            const int i = tid + v * 256, n = i >> 3, part = i & 7;
            xv[v] = n0 + n < t ? *reinterpret_cast<const uint4*>(xh + (size_t)(n0 + n) * w.cols + k0 + part * 8)
                               : make_uint4(0, 0, 0, 0);
        }
    };
    float acc[2][NT][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.f;
    if (kb < ke) gload(kb);
    for (int k0 = kb; k0 < ke; k0 += GQ_BK) {
        __syncthreads();  // the last step's readers are done
        {
            const float s = h2f((half_bits)(smv & 0xffff)), mn = h2f((half_bits)(smv >> 16));
            const u32 word[4] = {cv.x, cv.y, cv.z, cv.w};
            u32 h[16];
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const u32 wd = word[j >> 2], sh = 8 * (j & 3);
                const float a = s * (float)((wd >> sh) & 0xf) + mn;
                const float b = s * (float)((wd >> (sh + 4)) & 0xf) + mn;
                h[j] = (u32)f2h(a) | ((u32)f2h(b) << 16);
            }
            uint4* dst = reinterpret_cast<uint4*>(ws + lr * GQ_LD + lh * 32);
#pragma unroll
            for (int v = 0; v < 4; v++) dst[v] = make_uint4(h[4 * v], h[4 * v + 1], h[4 * v + 2], h[4 * v + 3]);
#pragma unroll
            for (int v = 0; v < XV; v++) {
                const int i = tid + v * 256, n = i >> 3, part = i & 7;
                *reinterpret_cast<uint4*>(xs + n * GQ_LD + part * 8) = xv[v];
            }
        }
        __syncthreads();
        if (k0 + GQ_BK < ke) gload(k0 + GQ_BK);  // in flight during the products
#pragma unroll
        for (int kk = 0; kk < GQ_BK; kk += 16) {
            u32 a[2][4];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int r = wm * 32 + i * 16 + (lane & 15), c = kk + (lane >> 4) * 8;
                ldsm_x4(a[i][0], a[i][1], a[i][2], a[i][3], ws + r * GQ_LD + c);
            }
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                u32 b0, b1, b2, b3;
                const int n = wn * (BN / 2) + j * 8 + (lane & 7) + ((lane >> 4) << 3);
                const int c = kk + ((lane >> 3) & 1) * 8;
                ldsm_x4(b0, b1, b2, b3, xs + n * GQ_LD + c);
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    asm volatile(
                        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                        : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                        : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b0), "r"(b1));
                    asm volatile(
                        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                        : "+f"(acc[i][j + 1][0]), "+f"(acc[i][j + 1][1]), "+f"(acc[i][j + 1][2]), "+f"(acc[i][j + 1][3])
                        : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b2), "r"(b3));
                }
            }
        }
    }
    // c0, c1: row lane / 4, tokens 2 (lane % 4) and + 1; c2, c3: row + 8.
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int r = m0 + wm * 32 + i * 16 + (lane >> 2) + (q >> 1) * 8;
                const int n = n0 + wn * (BN / 2) + j * 8 + 2 * (lane & 3) + (q & 1);
                if (r < w.rows && n < t) out[(size_t)n * ld + r] = acc[i][j][q];
            }
#endif
}
extern "C" __global__ void __launch_bounds__(256) gemm_q4h_64(const Mat w, const half_bits* xh, int t,
                                                              float* out, int ld, int ksteps) {
    PDL_ENTRY();
    gemm_q4h_body<64>(w, xh, t, out, ld, ksteps);
}
extern "C" __global__ void __launch_bounds__(256) gemm_q4h_128(const Mat w, const half_bits* xh, int t,
                                                               float* out, int ld, int ksteps) {
    PDL_ENTRY();
    gemm_q4h_body<128>(w, xh, t, out, ld, ksteps);
}

// out[i] = sum over z < splits of part[z * n + i], in z order (gemm_q4h's split-K partials).
extern "C" __global__ void sum_splits(const float* __restrict__ part, float* __restrict__ out, int n,
                                      int splits) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s = part[i];
    for (int z = 1; z < splits; z++) s += part[(size_t)z * n + i];
    out[i] = s;
}

// out[(r - r0) * cols + c] = W[r, c] for rows r0..r0 + nrows (f32 tiles for cuBLAS).
extern "C" __global__ void dequant_rows(const Mat w, int kind, float* __restrict__ out, int r0,
                                        int nrows) {
    PDL_ENTRY();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)nrows * w.cols) return;
    int r = (int)(i / w.cols), c = (int)(i % w.cols);
    out[i] = element(w, kind, r0 + r, c);
}

// A decode token's embedding: out[c] = row *tok of w for c < cols. The row's id is read from
// device memory (set before the step's launches: a recorded step replays with each token's own);
// each value as the host's conversion computes it (model/ops.rs embed_rows: f16 and bf16 exact,
// the integer kinds s * q + min with both roundings, as Rust computes it). Grid-stride.
extern "C" __global__ void embed_token(const Mat w, int kind, const int* __restrict__ tok,
                                       float* __restrict__ out) {
    PDL_ENTRY();
    const int r = *tok;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < w.cols; c += gridDim.x * blockDim.x) {
        const u8* row = w.codes + (size_t)r * w.row_bytes;
        float v;
        switch (kind) {
            case KIND_F32: v = reinterpret_cast<const float*>(row)[c]; break;
            case KIND_F16: v = h2f(reinterpret_cast<const unsigned short*>(row)[c]); break;
            case KIND_BF16: v = bf2f(reinterpret_cast<const unsigned short*>(row)[c]); break;
            default: {
                const size_t g = (size_t)r * (w.cols / w.group) + c / w.group;
                const float s = h2f(w.scales[g]);
                float q, mn = 0.f;
                if (kind == KIND_INT8) {
                    q = (float)(signed char)row[c];
                } else {
                    q = kind == KIND_INT4 ? (float)((row[c / 2] >> (4 * (c % 2))) & 0xf)
                                          : (float)((row[c / 4] >> (2 * (c % 4))) & 0x3);
                    mn = h2f(w.mins[g]);
                }
                v = __fadd_rn(__fmul_rn(s, q), mn);
            }
        }
        out[c] = v;
    }
}

// Emulated link (a profile's pace), on the expert loader's copy stream: link_start before a
// chunk's copy notes when the chunk starts crossing; link_wait after the copy holds the stream
// until the chunk has crossed at the profile's rate, `ns` nanoseconds later. Pacing on the GPU
// needs no host thread to wake on time (CPU experts keep every core busy).
extern "C" __global__ void link_start(unsigned long long* clk) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    clk[0] = now;
}

extern "C" __global__ void link_wait(const unsigned long long* clk, unsigned long long ns) {
    const unsigned long long end = clk[0] + ns;
    unsigned long long now;
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now < end);
}
