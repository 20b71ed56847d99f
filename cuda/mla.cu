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
// scale · (w[h * rows + i, :] · x[tok, h, :]) (xs floats a head, heads * xs a token), w the map
// in its stored kind (f32, f16, bf16, int8: Mat, [heads * rows, cols]; chunk_dot's arithmetic). One warp
// a row, 8 rows a block; grid (rows * heads / 8, t). x 16-byte aligned, rows of whole 16-byte
// chunks (CudaBackend::mla_map checks). A lane's first MLA_PRE chunks of its row (k_b's rows and
// v_b's of 512 f32 whole) load before the wait: w is a weight (written only by copies), so they
// overlap the kernel before's tail.
#define MLA_PRE 4
#define MLA_MV_ARGS                                                                             \
    const Mat w, const float *__restrict__ x, float *__restrict__ y, int heads, int rows,      \
        int xs, int ys, float scale
#define MLA_MV_PASS w, x, y, heads, rows, xs, ys, scale
// Row r of token tok (a warp); waits itself, after its weight loads.
template <int KIND>
__device__ __forceinline__ void mla_matvec_body(int r, int tok, MLA_MV_ARGS) {
    const int lane = threadIdx.x & 31, n = w.row_bytes / 16;
    const bool in = r < heads * rows;
    const uint4* row =
        reinterpret_cast<const uint4*>(w.codes + (size_t)(in ? r : 0) * w.row_bytes);
    uint4 wp[MLA_PRE];
#pragma unroll
    for (int p = 0; p < MLA_PRE; p++)
        if (in && lane + 32 * p < n) wp[p] = __ldg(row + lane + 32 * p);
    pdl_wait();
    if (!in) return;
    const int h = r / rows, i = r - h * rows;
    const float* xh = x + ((size_t)tok * heads + h) * xs;
    float s = 0.f;
#pragma unroll
    for (int p = 0; p < MLA_PRE; p++)
        if (lane + 32 * p < n) s += chunk_dot<KIND>(wp[p], xh, lane + 32 * p, w, r);
    for (int j = lane + 32 * MLA_PRE; j < n; j += 32)
        s += chunk_dot<KIND>(__ldg(row + j), xh, j, w, r);
    s = warp_sum(s);
    if (lane == 0) y[((size_t)tok * heads + h) * ys + i] = s * scale;
}

// One decode token's mla_rows and its queries' map into the latent (mla_matvec of k_b, x = q,
// y = qo) in one launch: blocks 0 .. nm - 1 take the map's rows (a warp a row, blockDim / 32 a
// block), blocks nm and nm + 1 mla_rows' roles 0 and 1 (disjoint parts of qo). blockDim:
// rms_block(lora), mla_rows' (its norm's bits depend on it).
template <int KIND>
__device__ __forceinline__ void mla_rows_q_body(MLA_ROWS_ARGS, const Mat& kb, int nm) {
    const int b = blockIdx.x, lw = lora + rope;
    if (b < nm) {
        const int r = b * (blockDim.x >> 5) + (threadIdx.x >> 5);
        mla_matvec_body<KIND>(r, 0, kb, q, qo, heads, lora, nope + rope, lw, qs);
        return;
    }
    pdl_wait();
    mla_rows_body(0, b - nm, MLA_ROWS_PASS);
}

// A map's rows as f32 ([rows, cols] at out; kind 1 f16, 2 bf16, 3 int8) for a prefill's batched
// GEMM, a thread a value.
extern "C" __global__ void mla_dequant(const Mat w, int kind, float* __restrict__ out) {
    PDL_ENTRY();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)w.rows * w.cols) return;
    const int r = (int)(i / w.cols), c = (int)(i - (size_t)r * w.cols);
    const u8* row = w.codes + (size_t)r * w.row_bytes;
    if (kind == KIND_INT8) {
        const float sc = h2f(w.scales[(size_t)r * (w.cols / w.group) + c / w.group]);
        out[i] = sc * (float)(signed char)row[c];
        return;
    }
    const unsigned short v = reinterpret_cast<const unsigned short*>(row)[c];
    out[i] = kind == KIND_F16 ? h2f(v) : bf2f(v);
}

#define MLA_KERNELS(SUFFIX, KIND)                                                              \
    extern "C" __global__ void mla_matvec_##SUFFIX(MLA_MV_ARGS) {                              \
        mla_matvec_body<KIND>(blockIdx.x * 8 + (threadIdx.x >> 5), blockIdx.y, MLA_MV_PASS);  \
    }                                                                                          \
    extern "C" __global__ void mla_rows_q_##SUFFIX(MLA_ROWS_ARGS, const Mat kb, int nm) {       \
        pdl_trigger();                                                                         \
        mla_rows_q_body<KIND>(MLA_ROWS_PASS, kb, nm);                                          \
    }
MLA_KERNELS(f32, KIND_F32)
MLA_KERNELS(f16, KIND_F16)
MLA_KERNELS(bf16, KIND_BF16)
MLA_KERNELS(int8, KIND_INT8)
