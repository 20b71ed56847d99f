// Dequantize-matvec: y[r] = sum_c W[r, c] x[c]. Float kinds (f32/f16/bf16): one warp per row; each
// lane reads 16-byte chunks of the row (coalesced across the warp), several in flight, and converts
// them in registers. Needs row_bytes % 16 == 0 and 16-byte aligned codes and x; matvec_any handles
// the rest (dequant.cu). The integer kinds have their own kernels (matvec_q.cu, matvec_qm.cu).

// Four f32 weights (their bits) times four x values: the one expression every f32 product adds,
// its roundings spelled out (as sq4's: the same bits wherever it is inlined).
__device__ __forceinline__ float dot4_f32(const uint4& v, const float4& xv) {
    return __fmaf_rn(__uint_as_float(v.w), xv.w,
                     __fmaf_rn(__uint_as_float(v.z), xv.z,
                               __fmaf_rn(__uint_as_float(v.y), xv.y,
                                         __fmul_rn(__uint_as_float(v.x), xv.x))));
}

// The contribution of one 16-byte chunk `c` of row r (float kinds; int8 for MLA's maps).
template <int KIND>
__device__ __forceinline__ float chunk_dot(const uint4& v, const float* __restrict__ x, int c,
                                           const Mat& w, int r) {
    const u32 word[4] = {v.x, v.y, v.z, v.w};
    if (KIND == KIND_F32) {
        return dot4_f32(v, *reinterpret_cast<const float4*>(x + c * 4));
    } else if (KIND == KIND_INT8) {
        // 16 signed codes of one group (its size a multiple of 16: CudaBackend's MLA maps), their
        // products in order, then the group's scale.
        const float* xc = x + c * 16;
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float4 xv = *reinterpret_cast<const float4*>(xc + 4 * k);
            const float xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int j = 0; j < 4; j++)
                s = __fmaf_rn((float)(signed char)(word[k] >> (8 * j)), xs[j], s);
        }
        const int gi = r * (w.cols / w.group) + c * 16 / w.group;
        return __fmul_rn(h2f(__ldg(w.scales + gi)), s);
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

// The contribution of one 16-byte MXFP4 chunk c: one block of 32 codes (element 2i in the low
// nibble of byte i) with exponent byte e; the doubled codes times x in order, then the scale.
__device__ __forceinline__ float mx_chunk_dot(const uint4& v, u32 e, const float* __restrict__ x,
                                              int c) {
    const u32 word[4] = {v.x, v.y, v.z, v.w};
    const float* xb = x + c * 32;
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float4 xa = *reinterpret_cast<const float4*>(xb + 8 * k);
        const float4 xc = *reinterpret_cast<const float4*>(xb + 8 * k + 4);
        const float xs[8] = {xa.x, xa.y, xa.z, xa.w, xc.x, xc.y, xc.z, xc.w};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const u32 b = mx_bytes(word[k] >> (16 * h));
#pragma unroll
            for (int j = 0; j < 4; j++) s = __fmaf_rn(mx_byte_value(b, j), xs[4 * h + j], s);
        }
    }
    return __fmul_rn(mx_half_scale(e), s);
}

// A chunk of row r: chunk_dot, or for MXFP4 mx_chunk_dot with its exponent byte e (loaded beside
// the chunk, so that the two loads share one round trip).
template <int KIND>
__device__ __forceinline__ float any_chunk_dot(const uint4& v, u32 e, const float* __restrict__ x,
                                               int c, const Mat& w, int r) {
    if (KIND == KIND_MXFP4) return mx_chunk_dot(v, e, x, c);
    return chunk_dot<KIND>(v, x, c, w, r);
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
// TAIL: the tail's chunks a lane at a time (default: up to 4).
template <int KIND, int DEPTH = 4, bool WAIT = false, bool TRIG = false,
          int TAIL = (DEPTH < 4 ? DEPTH : 4)>
__device__ __forceinline__ float row_dot(const Mat& w, int r, const float* __restrict__ x,
                                         int lane) {
    const uint4* row = reinterpret_cast<const uint4*>(w.codes + (size_t)r * w.row_bytes);
    int n = w.row_bytes / 16;
    // MXFP4: the row's exponent bytes, one a chunk.
    const u8* es = reinterpret_cast<const u8*>(w.scales) + (size_t)r * n;
    float acc = 0.f;
    int c = lane;
    bool waited = !WAIT;
    for (; c + 32 * (DEPTH - 1) < n; c += 32 * DEPTH) {
        uint4 v[DEPTH];
        u32 e[DEPTH];
#pragma unroll
        for (int d = 0; d < DEPTH; d++) {
            v[d] = __ldg(row + c + 32 * d);
            e[d] = KIND == KIND_MXFP4 ? __ldg(es + c + 32 * d) : 0u;
        }
        if (!waited) {
            pdl_wait();
            if (TRIG) pdl_trigger();
            waited = true;
        }
#pragma unroll
        for (int d = 0; d < DEPTH; d++) acc += any_chunk_dot<KIND>(v[d], e[d], x, c + 32 * d, w, r);
    }
    // The tail (fewer than DEPTH chunks a lane) loads TAIL at a time too: a short row (a small
    // expert's 768 columns) is all tail, and chunk by chunk it cost a round trip each.
    for (; c < n; c += 32 * TAIL) {
        uint4 v[TAIL];
        u32 e[TAIL];
#pragma unroll
        for (int d = 0; d < TAIL; d++)
            if (c + 32 * d < n) {
                v[d] = __ldg(row + c + 32 * d);
                e[d] = KIND == KIND_MXFP4 ? __ldg(es + c + 32 * d) : 0u;
            }
        if (!waited) {
            pdl_wait();
            if (TRIG) pdl_trigger();
            waited = true;
        }
#pragma unroll
        for (int d = 0; d < TAIL; d++)
            if (c + 32 * d < n) acc += any_chunk_dot<KIND>(v[d], e[d], x, c + 32 * d, w, r);
    }
    if (!waited) {
        pdl_wait();
        if (TRIG) pdl_trigger();
    }
    return warp_sum(acc);
}

// ACC with `early`: y (the residual) is read before the wait, which holds where the q/k/v launch
// of the layer (matvec3_rope) came between its last writer and this launch: that launch lets
// later kernels start only after its own wait (Gpu's caller passes early only then).
// DEPTH: chunks a lane held before the wait; the deep residual forms (matvec_add_deep_*) hold a
// whole row of up to 16 (4096 columns of f16), tail included.
template <int KIND, bool ACC = false, int DEPTH = ROW_DEPTH>
__device__ __forceinline__ void matvec_body(const Mat w, const float* __restrict__ x,
                                            float* __restrict__ y, int early = 0) {
    pdl_trigger();
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= w.rows) return;
    const float y0 = ACC && early && lane == 0 ? __ldcg(y + r) : 0.f;
    constexpr int TAIL = DEPTH > ROW_DEPTH ? DEPTH : (DEPTH < 4 ? DEPTH : 4);
    const float acc = row_dot<KIND, DEPTH, true, false, TAIL>(w, r, x, lane);
    if (lane == 0) y[r] = ACC ? (early ? y0 : y[r]) + acc : acc;
}

extern "C" __global__ void matvec_f32(const Mat w, const float* x, float* y) { matvec_body<KIND_F32>(w, x, y); }
extern "C" __global__ void matvec_f16(const Mat w, const float* x, float* y) { matvec_body<KIND_F16>(w, x, y); }
extern "C" __global__ void matvec_bf16(const Mat w, const float* x, float* y) { matvec_body<KIND_BF16>(w, x, y); }

// y += W x (a projection and its residual add: the sum rounded as matvec then add_assign).
extern "C" __global__ void matvec_add_f32(const Mat w, const float* x, float* y, int early) { matvec_body<KIND_F32, true>(w, x, y, early); }
extern "C" __global__ void matvec_add_f16(const Mat w, const float* x, float* y, int early) { matvec_body<KIND_F16, true>(w, x, y, early); }
extern "C" __global__ void matvec_add_bf16(const Mat w, const float* x, float* y, int early) { matvec_body<KIND_BF16, true>(w, x, y, early); }
// The same with a whole row held before the wait: more registers, so launched only where every
// block is resident at once (CudaBackend::matmul_add; a second wave lost: benches/results/2026-12-06-h100-l2-prefetch.md).
extern "C" __global__ void matvec_add_deep_f32(const Mat w, const float* x, float* y, int early) { matvec_body<KIND_F32, true, 2 * ROW_DEPTH>(w, x, y, early); }
extern "C" __global__ void matvec_add_deep_f16(const Mat w, const float* x, float* y, int early) { matvec_body<KIND_F16, true, 2 * ROW_DEPTH>(w, x, y, early); }
extern "C" __global__ void matvec_add_deep_bf16(const Mat w, const float* x, float* y, int early) { matvec_body<KIND_BF16, true, 2 * ROW_DEPTH>(w, x, y, early); }

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
