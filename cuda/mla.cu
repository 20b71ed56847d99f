// Multi-head latent attention (DeepSeek-V2) in its absorbed form: the cache row of a token is
// [RMSNorm(latent), RoPE key] (lora + rope values, cached once: attention reads it as key and
// as value, CudaKv::values), and each head's query is mapped into the latent (k_b) before
// attention and its output out of it (v_b) after (src/model/ops.rs Backend::mla_inputs,
// mla_values: the host's arithmetic).

// The cache rows and the queries' RoPE parts of t tokens: block (tok, 0) takes token tok's ckv
// ([lora + rope] at ckv + tok * lw): RMSNorm of the latent by kvn into row, RoPE of the key part
// (pairs i, i + rope / 2), the row also as f16 at kc (the cache rows of the new
// positions); block (tok, 1) rotates each head's q_rope (q: [t, heads, nope + rope]) into the
// last rope values of qo's head ([t, heads, lora + rope]), times qs (the attention's q scale).
// posp as rope_kv (one token: the position from the device, kc the layer's rows from position
// 0). blockDim: rms_block(lora).
#define MLA_ROWS_ARGS                                                                           \
    const float *__restrict__ q, const float *__restrict__ ckv, float *__restrict__ qo,          \
        float *__restrict__ row, const float *__restrict__ kvn, float eps,                      \
        const float *__restrict__ inv_freq, int heads, int nope, int rope, int lora,            \
        int start_pos, half_bits *__restrict__ kc, const int *__restrict__ posp, float qs
#define MLA_ROWS_PASS q, ckv, qo, row, kvn, eps, inv_freq, heads, nope, rope, lora, start_pos, kc, posp, qs
// Block (tok, role) of mla_rows (the caller has waited).
__device__ __forceinline__ void mla_rows_body(int tok, int role, MLA_ROWS_ARGS) {
    const int lw = lora + rope, half = rope / 2;
    if (posp) {
        start_pos = *posp;
        kc += (size_t)start_pos * lw;
    }
    const float pos = (float)(start_pos + tok);
    if (role == 1) {
        const int qw = nope + rope;
        for (int j = threadIdx.x; j < heads * half; j += blockDim.x) {
            const int h = j / half, i = j - h * half;
            const float* s = q + ((size_t)tok * heads + h) * qw + nope;
            float* d = qo + ((size_t)tok * heads + h) * lw + lora;
            float sn, cs;
            sincosf(pos * inv_freq[i], &sn, &cs);
            const float a = s[i], b = s[i + half];
            d[i] = (a * cs - b * sn) * qs;
            d[i + half] = (b * cs + a * sn) * qs;
        }
        return;
    }
    const float* c = ckv + (size_t)tok * lw;
    float* r = row + (size_t)tok * lw;
    rms_norm_row(c, kvn, r, nullptr, lora, eps);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float sn, cs;
        sincosf(pos * inv_freq[i], &sn, &cs);
        const float a = c[lora + i], b = c[lora + i + half];
        r[lora + i] = a * cs - b * sn;
        r[lora + i + half] = b * cs + a * sn;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < lw; i += blockDim.x) {
        const half_bits v = f2h(r[i]);
        kc[(size_t)tok * lw + i] = v;
    }
}

extern "C" __global__ void mla_rows(MLA_ROWS_ARGS) {
    PDL_ENTRY();
    mla_rows_body(blockIdx.x, blockIdx.y, MLA_ROWS_PASS);
}

// Each head's own product, for t tokens: y[tok, h, i] (ys floats a head, heads * ys a token) =
// scale · (w[h * rows + i, :cols] · x[tok, h, :cols]) (xs floats a head, heads * xs a token), w f32
// [heads * rows, cols]. One warp a row, 8 rows a block; grid (rows * heads / 8, t). x and w
// 16-byte aligned with cols % 4 == 0 (Gpu::mla_matvec checks), float4 loads. A lane's first
// MLA_PRE float4s of its row (k_b's rows of 128 and v_b's of 512 whole) load before the wait: w is
// a weight (written only by copies), so they overlap the kernel before's tail.
#define MLA_PRE 4
__device__ __forceinline__ float mla_dot4(const float4& a, const float4& b) {
    return __fmaf_rn(a.w, b.w, __fmaf_rn(a.z, b.z, __fmaf_rn(a.y, b.y, a.x * b.x)));
}
#define MLA_MV_ARGS                                                                             \
    const float *__restrict__ w, const float *__restrict__ x, float *__restrict__ y, int heads, \
        int rows, int cols, int xs, int ys, float scale
#define MLA_MV_PASS w, x, y, heads, rows, cols, xs, ys, scale
// Row r of token tok (a warp); waits itself, after its weight loads.
__device__ __forceinline__ void mla_matvec_body(int r, int tok, MLA_MV_ARGS) {
    const int lane = threadIdx.x & 31, n4 = cols / 4;
    const bool in = r < heads * rows;
    const float4* w4 = reinterpret_cast<const float4*>(w + (size_t)(in ? r : 0) * cols);
    float4 wp[MLA_PRE];
#pragma unroll
    for (int p = 0; p < MLA_PRE; p++)
        if (in && lane + 32 * p < n4) wp[p] = __ldg(w4 + lane + 32 * p);
    pdl_wait();
    if (!in) return;
    const int h = r / rows, i = r - h * rows;
    const float4* x4 = reinterpret_cast<const float4*>(x + ((size_t)tok * heads + h) * xs);
    float s = 0.f;
#pragma unroll
    for (int p = 0; p < MLA_PRE; p++)
        if (lane + 32 * p < n4) s += mla_dot4(wp[p], x4[lane + 32 * p]);
    for (int j = lane + 32 * MLA_PRE; j < n4; j += 32) s += mla_dot4(__ldg(w4 + j), x4[j]);
    s = warp_sum(s);
    if (lane == 0) y[((size_t)tok * heads + h) * ys + i] = s * scale;
}

extern "C" __global__ void mla_matvec(MLA_MV_ARGS) {
    mla_matvec_body(blockIdx.x * 8 + (threadIdx.x >> 5), blockIdx.y, MLA_MV_PASS);
}

// One decode token's mla_rows and its queries' map into the latent (mla_matvec of k_b, x = q,
// y = qo) in one launch: blocks 0 .. nm - 1 take the map's rows (a warp a row, blockDim / 32 a
// block), blocks nm and nm + 1 mla_rows' roles 0 and 1 (disjoint parts of qo). blockDim:
// rms_block(lora), mla_rows' (its norm's bits depend on it).
extern "C" __global__ void mla_rows_q(MLA_ROWS_ARGS, const float* __restrict__ kb, int nm) {
    pdl_trigger();
    const int b = blockIdx.x, lw = lora + rope;
    if (b < nm) {
        const int r = b * (blockDim.x >> 5) + (threadIdx.x >> 5);
        mla_matvec_body(r, 0, kb, q, qo, heads, lora, nope, nope + rope, lw, qs);
        return;
    }
    pdl_wait();
    mla_rows_body(0, b - nm, MLA_ROWS_PASS);
}
