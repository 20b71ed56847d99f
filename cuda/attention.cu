// Attention over an f16 KV cache. Grid (n_heads, t); a block of up to ATT_MAX_WARPS warps. Each
// warp walks a strided subset of the visible positions with an online softmax; the warps then
// merge. `sinks` (gpt-oss; null elsewhere): each head's logit beside the positions' scores in the
// softmax's denominator, with no value.

#define ATT_MAX_WARPS 16
#define ATT_MAX_J 8  // head_dim up to 256
#define ATT_WIDE_J 18  // attention_wide: head_dim up to 576 (DeepSeek's MLA latent, 512 + 64)
#define ATT_PREFETCH 128  // positions whose keys and values a block prefetches into L2

// `qrow(pos, h, kvh)`, called once the kernel before has finished, gives the head's q row (a decode
// token's may first be computed there: attention_prep).
template <int MAXJ, typename QRow>
__device__ __forceinline__ void attention_body(QRow qrow, const half_bits* __restrict__ kc,
                                               const half_bits* __restrict__ vc,
                                               float* __restrict__ out, int n_heads,
                                               int n_kv_heads, int hd, int start_pos, int window,
                                               const int* __restrict__ posp,
                                               const float* __restrict__ sinks) {
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
    const float* q = qrow(pos, h, kvh);

    float qv[MAXJ], acc[MAXJ];
#pragma unroll
    for (int j = 0; j < MAXJ; j++) {
        int d = lane + 32 * j;
        qv[j] = d < hd ? q[d] : 0.f;
        acc[j] = 0.f;
    }
    float m = NEG_INF, l = 0.f;
    // The position's keys and values load together (one memory latency per position), and the
    // warp's next position loads while this one is computed
    // (benches/results/2026-11-25-h100-token-gap.md).
    half_bits kr[MAXJ], vr[MAXJ], kn[MAXJ], vn[MAXJ];
    auto kv_load = [&](int p, half_bits (&ko)[MAXJ], half_bits (&vo)[MAXJ]) {
        const half_bits* k = kc + (size_t)p * kv_dim + kvh * hd;
        const half_bits* v = vc + (size_t)p * kv_dim + kvh * hd;
        const bool in = p <= pos;
#pragma unroll
        for (int j = 0; j < MAXJ; j++) {
            int d = lane + 32 * j;
            ko[j] = in && d < hd ? k[d] : 0;
            vo[j] = in && d < hd ? v[d] : 0;
        }
    };
    kv_load(first + warp, kn, vn);
    for (int p = first + warp; p <= pos; p += warps) {
#pragma unroll
        for (int j = 0; j < MAXJ; j++) {
            kr[j] = kn[j];
            vr[j] = vn[j];
        }
        kv_load(p + warps, kn, vn);
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < MAXJ; j++) {
            int d = lane + 32 * j;
            if (d < hd) dot += qv[j] * h2f(kr[j]);
        }
        float s = warp_sum(dot) * scale;
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new);
        float e = expf(s - m_new);
        l = l * corr + e;
#pragma unroll
        for (int j = 0; j < MAXJ; j++) {
            int d = lane + 32 * j;
            if (d < hd) acc[j] = acc[j] * corr + e * h2f(vr[j]);
        }
        m = m_new;
    }
    __shared__ float sm_m[ATT_MAX_WARPS], sm_l[ATT_MAX_WARPS];
    __shared__ float sm_acc[ATT_MAX_WARPS][32 * MAXJ];
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < MAXJ; j++) sm_acc[warp][lane + 32 * j] = acc[j];
    __syncthreads();
    float mx = sinks ? sinks[h] : NEG_INF;
    for (int w = 0; w < warps; w++) mx = fmaxf(mx, sm_m[w]);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0.f, den = sinks ? expf(sinks[h] - mx) : 0.f;
        for (int w = 0; w < warps; w++) {
            if (sm_m[w] == NEG_INF) continue;
            float f = expf(sm_m[w] - mx);
            num += sm_acc[w][d] * f;
            den += sm_l[w] * f;
        }
        out[(size_t)i * q_dim + h * hd + d] = num / den;
    }
}

#define ATTENTION_ARGS                                                                           \
    const float *__restrict__ q, const half_bits *__restrict__ kc,                              \
        const half_bits *__restrict__ vc, float *__restrict__ out, int n_heads, int n_kv_heads, \
        int hd, int start_pos, int window, const int *__restrict__ posp,                        \
        const float *__restrict__ sinks
#define ATTENTION_QROW \
    [&](int, int h, int) { return q + (size_t)blockIdx.y * n_heads * hd + (size_t)h * hd; }
extern "C" __global__ void attention(ATTENTION_ARGS) {
    attention_body<ATT_MAX_J>(ATTENTION_QROW, kc, vc, out, n_heads, n_kv_heads, hd, start_pos,
                              window, posp, sinks);
}
// The same over heads up to 576 wide (more registers a thread; the CUDA backend picks it only
// where head_dim is above 256).
extern "C" __global__ void attention_wide(ATTENTION_ARGS) {
    attention_body<ATT_WIDE_J>(ATTENTION_QROW, kc, vc, out, n_heads, n_kv_heads, hd, start_pos,
                               window, posp, sinks);
}

// One decode token's attention from its raw q, k and v rows ([n_heads * hd], [kvw], [kvw]), the
// launches before it in one (CudaBackend::attention_prep): each block (a q head) computes first,
// warp 0 its q row, warp 1 its KV head's k row, warp 2 that v row, as the separate kernels would
// (biases bq, bk, bv as add_rows; per-head RMSNorm by qn, kn as qk_norm_rope_kv; rope_pair's
// rotation; q times q_scale as `scale`) and stores k and v as f16 at position *posp of kc, vc (the
// layer's rows from position 0). Every block of a KV head stores the same bits there, and reads
// them after its own store (__syncthreads), so no block waits for another. Null biases or norms:
// none. hd <= 32 * ATT_MAX_J.
extern "C" __global__ void attention_prep(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ bq, const float* __restrict__ bk, const float* __restrict__ bv,
    const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ inv_freq, float q_scale, half_bits* kc, half_bits* vc,
    float* __restrict__ out, int n_heads, int n_kv_heads, int hd, int window,
    const int* __restrict__ posp, const float* __restrict__ sinks) {
    __shared__ float sq[32 * ATT_MAX_J], sk[32 * ATT_MAX_J];
    auto qrow = [&](int pos, int h, int kvh) -> const float* {
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, half = hd >> 1;
        const size_t kv_at = (size_t)pos * n_kv_heads * hd + (size_t)kvh * hd;
        if (warp < 2) {
            const bool isq = warp == 0;
            const int at = (isq ? h : kvh) * hd;
            const float* src = (isq ? q : k) + at;
            const float* b = isq ? bq : bk;
            const float* w = isq ? qn : kn;
            float* row = isq ? sq : sk;
            float ss = 0.f;
            for (int i = lane; i < hd; i += 32) {
                const float x = b ? src[i] + b[at + i] : src[i];
                row[i] = x;
                ss += x * x;
            }
            const float inv = w ? 1.0f / sqrtf(warp_sum(ss) / (float)hd + eps) : 1.f;
            __syncwarp();
            // A lane takes pairs (i, i + half) whole: no other lane reads or writes them.
            const float pf = (float)pos;
            for (int i = lane; i < half; i += 32) {
                float a = row[i], c = row[i + half];
                if (w) {
                    a = w[i] * (a * inv);
                    c = w[i + half] * (c * inv);
                }
                float sn, cs;
                sincosf(pf * inv_freq[i], &sn, &cs);
                const float ra = a * cs - c * sn, rb = c * cs + a * sn;
                if (isq) {
                    sq[i] = ra * q_scale;
                    sq[i + half] = rb * q_scale;
                } else {
                    kc[kv_at + i] = f2h(ra);
                    kc[kv_at + i + half] = f2h(rb);
                }
            }
        } else if (warp == 2) {
            for (int d = lane; d < hd; d += 32) {
                const float x = bv ? v[kvh * hd + d] + bv[kvh * hd + d] : v[kvh * hd + d];
                vc[kv_at + d] = f2h(x);
            }
        }
        __syncthreads();
        return sq;
    };
    attention_body<ATT_MAX_J>(qrow, kc, vc, out, n_heads, n_kv_heads, hd, 0, window, posp, sinks);
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

// The prefill kernels' shared steps over one chunk of ATP_CHUNK positions, for a warp's RPW
// rows (q at qw, HD floats a row; keys as KW-word rows of f16 pairs in ks): lane j's scores
// against position j,
template <int RPW, int HD, int KW>
__device__ __forceinline__ void chunk_scores(const float* qw, const u32 (*ks)[KW], int lane,
                                             float* sc) {
#pragma unroll
    for (int i = 0; i < RPW; i++) sc[i] = 0.f;
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
}

// the online softmax over them (vis: lane's position visible to row i; sc becomes each lane's
// weight, m, l and acc rescaled to the new maximum),
template <int RPW, int DPL>
__device__ __forceinline__ void chunk_softmax(const bool* vis, float scale, float* sc, float* m,
                                              float* l, float (*acc)[DPL]) {
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const float s = vis[i] ? sc[i] * scale : NEG_INF;
        float cm = s;
#pragma unroll
        for (int o = 16; o >= 1; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
        const float m_new = fmaxf(m[i], cm);
        if (m_new == NEG_INF) {
            sc[i] = 0.f;  // nothing visible yet
            continue;
        }
        const float corr = expf(m[i] - m_new);
        const float e = vis[i] ? expf(s - m_new) : 0.f;
        l[i] = l[i] * corr + warp_sum(e);
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[i][d] *= corr;
        m[i] = m_new;
        sc[i] = e;
    }
}

// and position j's value dims vv (the lane's DPL) added to each row's output by its weight.
template <int RPW, int DPL>
__device__ __forceinline__ void chunk_value(const float* sc, int j, const float* vv,
                                            float (*acc)[DPL]) {
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const float e = __shfl_sync(0xffffffffu, sc[i], j);
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[i][d] = fmaf(e, vv[d], acc[i][d]);
    }
}
template <int DPL>
__device__ __forceinline__ void attention_prefill_body(
    const float* __restrict__ q, const half_bits* __restrict__ kc, const half_bits* __restrict__ vc,
    float* __restrict__ out, int n_heads, int n_kv_heads, int t, int start_pos, int window,
    const float* __restrict__ sinks) {
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
        chunk_scores<RPW, HD, KW>(&qs[warp * RPW][0], ks, lane, sc);
        const int p = p0 + lane;
        bool vis[RPW];
#pragma unroll
        for (int i = 0; i < RPW; i++) vis[i] = p <= pos[i] && p >= first[i];
        chunk_softmax<RPW, DPL>(vis, scale, sc, m, l, acc);
        // Values: every lane adds the chunk's 32 positions to its DPL dims.
#pragma unroll 4
        for (int j = 0; j < ATP_CHUNK; j++) {
            float vv[DPL];
#pragma unroll
            for (int d = 0; d < DPL; d++) vv[d] = h2f(vs[j][lane * DPL + d]);
            chunk_value<RPW, DPL>(sc, j, vv, acc);
        }
    }
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int r = warp * RPW + i, qi = q0 + r / group;
        if (qi >= t) continue;
        float* o = out + (size_t)qi * q_dim + (kvh * group + r % group) * HD + lane * DPL;
        float num = 1.f, den = l[i];
        if (sinks) {
            // The sink joins the denominator at the row's running maximum or above it.
            const float sk = sinks[kvh * group + r % group], mf = fmaxf(m[i], sk);
            num = expf(m[i] - mf);
            den = l[i] * num + expf(sk - mf);
        }
#pragma unroll
        for (int d = 0; d < DPL; d++) o[d] = acc[i][d] * num / den;
    }
}

#define ATTENTION_PREFILL(DPL)                                                                  \
    extern "C" __global__ void __launch_bounds__(256) attention_prefill_##DPL(                  \
        const float* __restrict__ q, const half_bits* __restrict__ kc,                          \
        const half_bits* __restrict__ vc, float* __restrict__ out, int n_heads, int n_kv_heads, \
        int t, int start_pos, int window, const float* __restrict__ sinks) {                   \
        PDL_ENTRY();                                                                            \
        attention_prefill_body<DPL>(q, kc, vc, out, n_heads, n_kv_heads, t, start_pos, window,  \
                                    sinks);                                                     \
    }
ATTENTION_PREFILL(1)
ATTENTION_PREFILL(2)
ATTENTION_PREFILL(4)

// Prefill attention over MLA's latent cache: one KV head whose rows (hd <= ATL_HD, hd % 8 == 0)
// are both the keys and the values (CudaKv::values_are_keys), no window or sinks. Every head
// shares the rows, so a block takes ATL_ROWS consecutive rows of the flattened [t, n_heads]
// (query, head) order, walks the positions its last query sees ATP_CHUNK at a time with the
// chunk's rows in shared memory once for all its rows (`attention_wide` reads every visible row
// from L2 once per query and head), and keeps an online softmax per row as
// attention_prefill_body does: a warp owns ATL_ROWS / 8 rows, lane j scores position j of the
// chunk (rows one padding word apart: 32 lanes, 32 banks) and owns ATL_HD / 32 dims of the
// output. Dims past hd are zeros in shared memory and not stored. Dynamic shared memory:
// ATL_SMEM bytes (the rows' q in f32, then the chunk's rows as u32 words); grid
// ceil(t * n_heads / ATL_ROWS); 256 threads.
#define ATL_HD 576
#define ATL_ROWS 16
#define ATL_KW (ATL_HD / 2 + 1)
#define ATL_SMEM (ATL_ROWS * ATL_HD * 4 + ATP_CHUNK * ATL_KW * 4)
extern "C" __global__ void __launch_bounds__(256)
    attention_prefill_latent(const float* __restrict__ q, const half_bits* __restrict__ kc,
                             float* __restrict__ out, int n_heads, int hd, int t, int start_pos) {
    PDL_ENTRY();
    constexpr int HD = ATL_HD, DPL = HD / 32, RPW = ATL_ROWS / 8;
    extern __shared__ __align__(16) float atl_smem[];
    float(*qs)[HD] = reinterpret_cast<float(*)[HD]>(atl_smem);
    u32(*ks)[ATL_KW] = reinterpret_cast<u32(*)[ATL_KW]>(atl_smem + ATL_ROWS * HD);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rows = t * n_heads, r0 = blockIdx.x * ATL_ROWS;
    // Row r of the block: flattened row r0 + r = query * n_heads + head, hd floats apart in q
    // and out.
    for (int i = threadIdx.x; i < ATL_ROWS * HD; i += blockDim.x) {
        const int r = i / HD, d = i % HD;
        qs[r][d] = r0 + r < rows && d < hd ? q[(size_t)(r0 + r) * hd + d] : 0.f;
    }
    const int hi = start_pos + (min(r0 + ATL_ROWS, rows) - 1) / n_heads;
    float m[RPW], l[RPW], acc[RPW][DPL];
    int pos[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int r = r0 + warp * RPW + i;
        pos[i] = r < rows ? start_pos + r / n_heads : -1;  // a padding row sees nothing
        m[i] = NEG_INF;
        l[i] = 0.f;
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[i][d] = 0.f;
    }
    const float scale = 1.0f / sqrtf((float)hd);
    const int w8 = hd / 8;
    for (int p0 = 0; p0 <= hi; p0 += ATP_CHUNK) {
        __syncthreads();  // the last chunk's readers are done (and qs is written, the first time)
        // The chunk's rows, 8 halves a thread at a time (positions past hi and dims past hd:
        // zeros).
        for (int i = threadIdx.x; i < ATP_CHUNK * (HD / 8); i += blockDim.x) {
            const int j = i / (HD / 8), c = i % (HD / 8), p = p0 + j;
            uint4 k4 = make_uint4(0, 0, 0, 0);
            if (p <= hi && c < w8) k4 = *reinterpret_cast<const uint4*>(kc + (size_t)p * hd + c * 8);
            ks[j][c * 4] = k4.x;
            ks[j][c * 4 + 1] = k4.y;
            ks[j][c * 4 + 2] = k4.z;
            ks[j][c * 4 + 3] = k4.w;
        }
        __syncthreads();
        // Scores: lane j against position p0 + j, for the warp's rows.
        float sc[RPW];
        chunk_scores<RPW, HD, ATL_KW>(&qs[warp * RPW][0], ks, lane, sc);
        const int p = p0 + lane;
        bool vis[RPW];
#pragma unroll
        for (int i = 0; i < RPW; i++) vis[i] = p <= pos[i];
        chunk_softmax<RPW, DPL>(vis, scale, sc, m, l, acc);
        // Values (the same rows): every lane adds the chunk's 32 positions to its DPL dims,
        // a word (two dims) at a time.
#pragma unroll 4
        for (int j = 0; j < ATP_CHUNK; j++) {
            float vv[DPL];
#pragma unroll
            for (int w = 0; w < DPL / 2; w++) {
                const u32 kw = ks[j][lane * (DPL / 2) + w];
                vv[2 * w] = h2f((half_bits)(kw & 0xffff));
                vv[2 * w + 1] = h2f((half_bits)(kw >> 16));
            }
            chunk_value<RPW, DPL>(sc, j, vv, acc);
        }
    }
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int r = r0 + warp * RPW + i;
        if (r >= rows) continue;
        float* o = out + (size_t)r * hd;
#pragma unroll
        for (int d = 0; d < DPL; d++) {
            const int dim = lane * DPL + d;
            if (dim < hd) o[dim] = acc[i][d] / l[i];
        }
    }
}
