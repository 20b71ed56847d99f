// Element-wise and normalization kernels: RMSNorm, LayerNorm, RoPE, SwiGLU, biases and scales,
// f16 stores, row gathers and scatters, axpy.

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
// With `bias` ([width]), each value first gets its column's bias (as add_rows adds it).
__device__ __forceinline__ void rope_pair(float* __restrict__ x, const float* __restrict__ inv_freq,
                                          int width, int half, int start_pos, int idx,
                                          half_bits* __restrict__ h,
                                          const float* __restrict__ bias = nullptr) {
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
    if (bias) {
        const float* bh = bias + hd * 2 * half;
        a += bh[i];
        b += bh[i + half];
    }
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
// rows of the new positions) as `to_half` stores them. With posp (one token), the position is
// read from device memory and kc, vc are the layer's rows from position 0 (a recorded decode
// step replays with each token's position). With biases bq, bk, bv (all or none), q, k and v
// first get them in place, as three add_rows launches would.
extern "C" __global__ void rope_kv(float* __restrict__ q, float* __restrict__ k,
                                   float* __restrict__ v, const float* __restrict__ inv_freq,
                                   int t, int qw, int kvw, int half, int start_pos,
                                   half_bits* __restrict__ kc, half_bits* __restrict__ vc,
                                   const int* __restrict__ posp, const float* __restrict__ bq,
                                   const float* __restrict__ bk, const float* __restrict__ bv) {
    PDL_ENTRY();
    if (posp) {
        start_pos = *posp;
        kc += (size_t)start_pos * kvw;
        vc += (size_t)start_pos * kvw;
    }
    const int nq = t * qw / 2, nk = t * kvw / 2, nv = t * kvw;
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < nq) {
        rope_pair(q, inv_freq, qw, half, start_pos, idx, nullptr, bq);
    } else if ((idx -= nq) < nk) {
        rope_pair(k, inv_freq, kvw, half, start_pos, idx, kc, bk);
    } else if ((idx -= nk) < nv) {
        float val = v[idx];
        if (bv) {
            val += bv[idx % kvw];
            v[idx] = val;
        }
        vc[idx] = f2h(val);
    }
}

// Per-head QK-norm, RoPE and the stored keys and values in one launch (Qwen3-MoE's attention
// inputs): each head row of q ([t, qw]) and k ([t, kvw]), heads of 2 * half values, by one warp:
// RMSNorm by qn / kn (w * (x * inv), as rms_norm_row; the sum of squares in warp order), then
// rope_pair's rotation into qo / ko, the rotated k also as f16 at kc; the threads after the rows'
// warps store v as f16 at vc. posp as rope_kv (one token: the position from the device).
extern "C" __global__ void qk_norm_rope_kv(const float* __restrict__ q, const float* __restrict__ k,
                                           const float* __restrict__ v, float* __restrict__ qo,
                                           float* __restrict__ ko, const float* __restrict__ qn,
                                           const float* __restrict__ kn, float eps,
                                           const float* __restrict__ inv_freq, int t, int qw,
                                           int kvw, int half, int start_pos,
                                           half_bits* __restrict__ kc, half_bits* __restrict__ vc,
                                           const int* __restrict__ posp) {
    PDL_ENTRY();
    if (posp) {
        start_pos = *posp;
        kc += (size_t)start_pos * kvw;
        vc += (size_t)start_pos * kvw;
    }
    const int hd = 2 * half, qh = qw / hd, kh = kvw / hd, rows = t * (qh + kh);
    const int gid = blockIdx.x * blockDim.x + threadIdx.x, row = gid >> 5, lane = threadIdx.x & 31;
    if (row >= rows) {
        const int idx = gid - rows * 32;
        if (idx < t * kvw) vc[idx] = f2h(v[idx]);
        return;
    }
    const int tok = row / (qh + kh), r = row - tok * (qh + kh);
    const bool isq = r < qh;
    const int width = isq ? qw : kvw;
    const size_t at = (size_t)tok * width + (size_t)(isq ? r : r - qh) * hd;
    const float* src = (isq ? q : k) + at;
    float* dst = (isq ? qo : ko) + at;
    const float* w = isq ? qn : kn;
    float ss = 0.f;
    for (int i = lane; i < hd; i += 32) ss += src[i] * src[i];
    const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)hd + eps);
    const float pos = (float)(start_pos + tok);
    for (int i = lane; i < half; i += 32) {
        const float a = w[i] * (src[i] * inv), b = w[i + half] * (src[i + half] * inv);
        float sn, cs;
        sincosf(pos * inv_freq[i], &sn, &cs);
        const float ra = a * cs - b * sn, rb = b * cs + a * sn;
        dst[i] = ra;
        dst[i + half] = rb;
        if (!isq) {
            kc[at + i] = f2h(ra);
            kc[at + i + half] = f2h(rb);
        }
    }
}

// A sum over the block, every thread getting it (warps, then their sums, in a fixed order).
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    __syncthreads();  // part may still be read by a previous call's threads
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float s = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
        s = warp_sum(s);
        if (threadIdx.x == 0) part[0] = s;
    }
    __syncthreads();
    return part[0];
}

// out[r, :] = LayerNorm(x[r0 + r, :]) * w + b: (x - mean) / sqrt(var + eps), the variance about
// the mean (Phi-3.5-MoE); one block per row.
extern "C" __global__ void layer_norm(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ b, float* __restrict__ out, int n,
                                      int r0, float eps) {
    PDL_ENTRY();
    const float* xr = x + (size_t)(r0 + blockIdx.x) * n;
    float* o = out + (size_t)blockIdx.x * n;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
    const float mean = block_sum(s) / (float)n;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float d = xr[i] - mean;
        ss += d * d;
    }
    const float inv = 1.0f / sqrtf(block_sum(ss) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

// x[i] += b[i % n] for i < t * n: a bias on each of t rows.
extern "C" __global__ void add_rows(float* __restrict__ x, const float* __restrict__ b, int n,
                                    int total) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] += b[i % n];
}

// x[i] *= f for i < n.
extern "C" __global__ void scale(float* __restrict__ x, float f, int n) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= f;
}

extern "C" __global__ void add_assign(float* __restrict__ x, const float* __restrict__ y, int n) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// x[i] = (x[i] + y[i]) + b[i % n] for i < total: add_assign then add_rows in one launch (a
// projection's residual add and its bias).
extern "C" __global__ void add_assign_rows(float* __restrict__ x, const float* __restrict__ y,
                                           const float* __restrict__ b, int n, int total) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] = (x[i] + y[i]) + b[i % n];
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

// gpt-oss's expert activation with its biases (ExpertAct::apply's arithmetic): for i < n, rows of
// width f, with g' = min(g[i] + bg[i % f], limit) and u' = clamp(u[i] + bu[i % f], -limit, limit),
// g[i] = (u' + 1) * g' * sigmoid(alpha * g').
extern "C" __global__ void expert_glu(float* __restrict__ g, const float* __restrict__ u,
                                      const float* __restrict__ bg, const float* __restrict__ bu,
                                      int f, int n, float alpha, float limit) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float gv = fminf(g[i] + bg[i % f], limit);
    const float uv = fminf(fmaxf(u[i] + bu[i % f], -limit), limit);
    const float glu = gv * (1.0f / (1.0f + expf(-(gv * alpha))));
    g[i] = (uv + 1.0f) * glu;
}

// expert_glu for one decode token's k routed experts: g holds k gate rows, then k up rows, of f
// values; row j's biases are those of expert routes[j] (int bits) in bg and bu ([n_experts, f]).
extern "C" __global__ void expert_glu_routed(float* __restrict__ g, const float* __restrict__ routes,
                                             const float* __restrict__ bg,
                                             const float* __restrict__ bu, int f, int k,
                                             float alpha, float limit) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k * f) return;
    const int c = i % f;
    const size_t e = (size_t)__float_as_int(routes[i / f]) * f;
    const float gv = fminf(g[i] + bg[e + c], limit);
    const float uv = fminf(fmaxf(g[(size_t)k * f + i] + bu[e + c], -limit), limit);
    const float glu = gv * (1.0f / (1.0f + expf(-(gv * alpha))));
    g[i] = (uv + 1.0f) * glu;
}

// d[j * n + i] += b[routes[j] * n + i] for j < k, i < n: each routed expert's down bias (add_rows's
// arithmetic).
extern "C" __global__ void add_routed_rows(float* __restrict__ d, const float* __restrict__ routes,
                                           const float* __restrict__ b, int n, int k) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k * n) return;
    d[i] += b[(size_t)__float_as_int(routes[i / n]) * n + i % n];
}

// An MLP's activations: g[i] = sigmoid(s[i / width]) * silu(g[i]) * u[i] for i < t * width, s a
// shared expert's gate logit per row (Qwen2-MoE); with s null, silu(g[i]) * u[i] (GLM-4.5). With u
// null, g already holds silu(g) * u (matvec_qd_*_gu): only the gate's factor, the same bits.
extern "C" __global__ void shared_gate(float* __restrict__ g, const float* __restrict__ u,
                                       const float* __restrict__ s, int width, int total) {
    PDL_ENTRY();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const float sg = s ? 1.0f / (1.0f + expf(-s[i / width])) : 1.0f;
    g[i] = sg * (u ? silu_mul(g[i], u[i]) : g[i]);
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
