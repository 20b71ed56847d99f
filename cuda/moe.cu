// Decode MoE on the device: the weighted sum of the experts' outputs, float-kind experts from a
// table of resident experts, the fused router kernels (routing rules in route.cu), and the table
// and routes the integer kernels' routed forms read (matvec_q.cu _sel, _gu).

// The route (index into re's k experts) with the next expert index above route `prev`'s (prev
// -1: the lowest): walks a token's routes in ascending expert order (k is small).
__device__ __forceinline__ int next_route_up(const int* re, int k, int prev) {
    const int last = prev < 0 ? -1 : re[prev];
    int jb = -1;
    for (int j = 0; j < k; j++)
        if (re[j] > last && (jb < 0 || re[j] < re[jb])) jb = j;
    return jb;
}

// ord[m] = the route of the m-th lowest expert of the k (next_route_up's walk, the order the
// weighted sums take), by threads 0..k-1 at once (one thread walking took ~1 us at k = 8); the
// experts are distinct. The caller syncs before reading ord.
__device__ __forceinline__ void route_order(const int* re, int k, int* ord) {
    const int t = threadIdx.x;
    if (t < k) {
        int rank = 0;
        for (int i = 0; i < k; i++) rank += re[i] < re[t];
        ord[rank] = t;
    }
}

// x[:n] += sum_j w_j * d[j, :n] over the k routed experts of one token (routes as route_topk
// writes them, t = 1), the experts taken in ascending index order and summed as a zeroed buffer
// and axpy then add_assign would: the same roundings as the engine's per-expert path.
// `extra` (gated decode's CPU experts, cuda/gate.cu): n values and a flag word after them; where
// the flag is set they are added to the experts' sum before it meets x, as the host-routed path
// adds its CPU result (add_host) before the residual add.
extern "C" __global__ void moe_combine(float* __restrict__ x, const float* __restrict__ d,
                                       const float* __restrict__ routes, int k, int n,
                                       const float* __restrict__ extra) {
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int* re = reinterpret_cast<const int*>(routes);
    float o = 0.f;
    for (int m = 0, jb = -1; m < k; m++) {
        jb = next_route_up(re, k, jb);
        o = __fmaf_rn(routes[k + jb], d[(size_t)jb * n + i], o);
    }
    if (extra && __ldcg(extra + n) != 0.f) o = o + __ldcg(extra + i);
    x[i] = x[i] + o;
}

// moe_combine, then the next RMSNorm of the new x (xn = RMSNorm(x) * g, as rms_norm_row's float4
// path computes it) in one launch: one block of rms_block(n) threads, n % 4 == 0, k <= 16, x, d, g
// and xn 16-byte aligned (Gpu::moe_combine checks). Each thread computes its float4s of the new x
// from the old x (no thread reads what another wrote): its first one once, kept in registers from
// the sum of squares to the stores, the rest (rows over 4 * 1024) again for the stores.
// It follows a routed down launch (Gpu::routed_ffn), so the routes and x are complete before it
// starts (sel_mat, "Ordering"): it copies the routes into shared memory and reads its first float4
// of x and of g before it waits; only the experts' outputs d are read after
// (benches/results/2026-11-24-h100-early-down.md), the k experts' at once (one after another, they
// were k round trips).
extern "C" __global__ void __launch_bounds__(1024)
    moe_combine_norm(float* __restrict__ x, const float* __restrict__ d,
                     const float* __restrict__ routes, int k, int n, const float* __restrict__ g,
                     float eps, float* __restrict__ xn, const float* __restrict__ extra) {
    __shared__ float rs[32];
    __shared__ int ord[16];
    pdl_trigger();
    l2_prefetch_block(g, (size_t)n * 4);
    float4* x4 = reinterpret_cast<float4*>(x);
    const int i0 = threadIdx.x;
    const float4* g4 = reinterpret_cast<const float4*>(g);
    float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), g0 = x0;
    if (threadIdx.x < 2 * k) rs[threadIdx.x] = __ldcg(routes + threadIdx.x);
    if (i0 < n / 4) {
        x0 = __ldcg(x4 + i0);
        g0 = g4[i0];
    }
    pdl_wait();
    // (extra: moe_combine's; 16-byte aligned.)
    const bool add = extra && __ldcg(extra + n) != 0.f;
    __syncthreads();
    route_order(reinterpret_cast<int*>(rs), k, ord);
    __syncthreads();
    auto val = [&](int i) {
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int m0 = 0; m0 < k; m0 += 8) {
            float4 dv[8];
#pragma unroll
            for (int q = 0; q < 8; q++)
                if (m0 + q < k)
                    dv[q] = __ldcg(reinterpret_cast<const float4*>(d + (size_t)ord[m0 + q] * n) + i);
#pragma unroll
            for (int q = 0; q < 8; q++)
                if (m0 + q < k) {
                    const float wj = rs[k + ord[m0 + q]];
                    o.x = __fmaf_rn(wj, dv[q].x, o.x);
                    o.y = __fmaf_rn(wj, dv[q].y, o.y);
                    o.z = __fmaf_rn(wj, dv[q].z, o.z);
                    o.w = __fmaf_rn(wj, dv[q].w, o.w);
                }
        }
        if (add) {
            const float4 e = __ldcg(reinterpret_cast<const float4*>(extra) + i);
            o = make_float4(o.x + e.x, o.y + e.y, o.z + e.z, o.w + e.w);
        }
        const float4 v = i == i0 ? x0 : x4[i];
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
        const float4 v = i == i0 ? v0 : val(i), w = i == i0 ? g0 : g4[i];
        x4[i] = v;
        reinterpret_cast<float4*>(xn)[i] =
            make_float4(w.x * (v.x * inv), w.y * (v.y * inv), w.z * (v.z * inv), w.w * (v.w * inv));
    }
}

// A table entry of resident experts' matrices: DevMat's layout in src/backend/cuda/mod.rs.
// Tables are [experts][3] (gate, up, down).
//
// Decode MoE from such a table, float kinds, one token routed to k experts (routes: k expert
// indices, then k weights):
// - moe_route_*: the router's logits (one block, a warp per row, ne <= 256) and route_one;
// - moe_gate_up_*: h[j, r] = silu(gate_j[r] x) * (up_j[r] x), grid (ceil(ffn / 4), k);
// - moe_down_*: x[r] += sum_j w_j (down_j[r] h_j), experts in ascending index order.
// Each row's sum is row_dot's, and SwiGLU and the weighted sum round as swiglu, axpy and
// add_assign do: the same results as the per-expert path, bit for bit.
struct MatEntry {
    Mat m;
    int kind, pad;
};

template <int KIND>
__device__ __forceinline__ void moe_route_body(const Mat w, const float* __restrict__ x, int k,
                                               int rule, float reps, float* __restrict__ routes,
                                               const float* __restrict__ bias = nullptr) {
    // A grouped rule's bias picks experts (route_rule_warp); gpt-oss's adds to the logits.
    __shared__ float lg[256], ch[256];
    const bool add = bias && !rule_grouped(rule);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int r = warp; r < w.rows; r += warps) {
        const float v = row_dot<KIND, 16>(w, r, x, lane);
        if (lane == 0) lg[r] = add ? v + bias[r] : v;
    }
    __syncthreads();
    if (warp == 0)
        route_rule_warp(lg, ch, w.rows, k, rule, reps, bias, reinterpret_cast<int*>(routes),
                        routes + k, lane);
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

// A warp a row of gate or of up (warp pairs: row blockIdx.x * 4 + warp / 2), so that a warp
// waits for one row's loads, not two in turn; 256 threads. With a null table, one MLP's gate g
// and up u (k 1: a shared expert's, a dense layer's; Gpu::mlp_gate_up): weights, so their first
// loads go out before the wait (row_dot's WAIT), as a plain product's do.
template <int KIND>
__device__ __forceinline__ void moe_gate_up_body(const MatEntry* __restrict__ tab,
                                                 const float* __restrict__ routes, int k,
                                                 const Mat& g, const Mat& u,
                                                 const float* __restrict__ x,
                                                 float* __restrict__ h) {
    __shared__ float gu[8];
    const int j = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (tab) pdl_wait();
    const Mat m = tab ? tab[reinterpret_cast<const int*>(routes)[j] * 3 + (warp & 1)].m
                      : (warp & 1 ? u : g);
    const int r = blockIdx.x * 4 + (warp >> 1);
    if (r < m.rows) {
        const float v = row_dot<KIND, 4, true>(m, r, x, lane);
        if (lane == 0) gu[warp] = v;
    }
    __syncthreads();
    const int rt = blockIdx.x * 4 + threadIdx.x;
    if (threadIdx.x < 4 && rt < m.rows)
        h[(size_t)j * m.rows + rt] = silu_mul(gu[2 * threadIdx.x], gu[2 * threadIdx.x + 1]);
}

// A warp a (row, expert) pair: rpb = max(1, 8 / k) rows a block of 256 threads, the warps taking
// the block's rpb * k pairs in turn, so that the k experts' rows load at once; then one thread a
// row adds them in ascending expert order (the same roundings as before).
template <int KIND>
__device__ __forceinline__ void moe_down_body(const MatEntry* __restrict__ tab,
                                              const float* __restrict__ routes, int k,
                                              const float* __restrict__ h,
                                              float* __restrict__ x) {
    __shared__ float dv[16];
    __shared__ int ord[16];
    const int* re = reinterpret_cast<const int*>(routes);
    route_order(re, k, ord);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int rpb = k >= 8 ? 1 : 8 / k, rows = tab[re[0] * 3 + 2].m.rows;
    const int r0 = blockIdx.x * rpb;
    for (int t = warp; t < rpb * k; t += warps) {
        const int i = t / k, jb = t - i * k;
        if (r0 + i >= rows) continue;
        const Mat d = tab[re[jb] * 3 + 2].m;
        const float v = row_dot<KIND>(d, r0 + i, h + (size_t)jb * d.cols, lane);
        if (lane == 0) dv[t] = v;
    }
    __syncthreads();
    const int i = threadIdx.x, r = r0 + i;
    if (i >= rpb || r >= rows) return;
    float o = 0.f;
    for (int m = 0; m < k; m++) o = __fmaf_rn(routes[k + ord[m]], dv[i * k + ord[m]], o);
    x[r] = x[r] + o;
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
                                                float* __restrict__ xn, int k, int rule, float reps,
                                                float* __restrict__ routes, float* sp,
                                                const float* __restrict__ bias) {
    __shared__ float lg[ROUTE_REG_ROWS], ch[ROUTE_REG_ROWS];
    const bool add = bias && !rule_grouped(rule);
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
        if (lane == 0) lg[warp] = add ? acc + bias[warp] : acc;
    }
    __syncthreads();
    if (warp == 0)
        route_rule_warp(lg, ch, w.rows, k, rule, reps, bias, reinterpret_cast<int*>(routes),
                        routes + k, lane);
}

// The MoE block's RMSNorm and the routing in one launch: xn = RMSNorm(x) * g (as rms_norm
// writes it, for the expert launches), kept in shared memory (w.cols floats, dynamic) for the
// router's rows. rms_block(w.cols) threads.
//
// With `pre` the router's rows follow in shared memory (w.rows * w.row_bytes more, dynamic),
// copied there before the kernel waits for the one before it (the router is a weight: written
// only by copies), so that the copy overlaps that kernel's tail: one block reading them after the
// wait would pay an L2 round trip per 16 chunks at one SM's share of L2 bandwidth
// (benches/results/2026-11-24-h100-early-down.md). The sums are row_dot's, in its order: the same
// routes.
template <int KIND>
__device__ __forceinline__ void moe_route_norm_body(const Mat w, const float* __restrict__ x,
                                                    const float* __restrict__ g, float eps,
                                                    float* __restrict__ xn, int k, int rule,
                                                    float reps, float* __restrict__ routes,
                                                    int pre, const float* __restrict__ bias) {
    extern __shared__ float4 xs4[];
    if (KIND == KIND_F32 && pre && route_regs_apply(w, x, g, xn)) {
        route_norm_regs(w, x, g, eps, xn, k, rule, reps, routes, reinterpret_cast<float*>(xs4),
                        bias);
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
        moe_route_body<KIND>(w, xs, k, rule, reps, routes, bias);
        return;
    }
    __syncthreads();
    // A grouped rule's bias picks experts (route_rule_warp); gpt-oss's adds to the logits.
    __shared__ float lg[256], ch[256];
    const bool add = bias && !rule_grouped(rule);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int r = warp; r < w.rows; r += warps) {
        // row_dot's order: lane l adds chunks l, l + 32, ... in turn, then warp_sum.
        const uint4* row = wsm + (size_t)r * nc;
        float acc = 0.f;
        for (int c = lane; c < nc; c += 32) acc += chunk_dot<KIND>(row[c], xs, c, w, r);
        acc = warp_sum(acc);
        if (lane == 0) lg[r] = add ? acc + bias[r] : acc;
    }
    __syncthreads();
    if (warp == 0)
        route_rule_warp(lg, ch, w.rows, k, rule, reps, bias, reinterpret_cast<int*>(routes),
                        routes + k, lane);
}

// moe_route_norm for routers of many rows (Qwen3-MoE's 128 x 2048 f32: 1 MB), over many blocks:
// one block reading them all took ~45 us a layer (benches/results/2026-12-02-h200-issue50-routed-grid.md).
// Each block of rms_block(w.cols) threads normalizes x itself (the same bits; block 0 stores xn),
// its first rpb warps take a row each (row_dot's order) into lgs; the last block to finish (a
// fence, then a count the last block puts back to 0) routes lgs with route_one_warp: the same
// routes as the one-block forms. With `pre` the block's rows are copied into shared memory (after
// x: rpb * row_bytes, dynamic) before the wait (the router is a weight), so that no row load is
// left behind it; without, they are requested into L2 and read after it. (Rows held in registers
// instead capped a 1024-thread kernel's 64 registers and spilled.)
template <int KIND>
__device__ __forceinline__ void moe_route_norm_wide_body(const Mat w, const float* __restrict__ x,
                                                         const float* __restrict__ g, float eps,
                                                         float* __restrict__ xn, int k, int rule,
                                                         float reps, float* __restrict__ routes,
                                                         int rpb, int pre, float* __restrict__ lgs,
                                                         unsigned* __restrict__ count,
                                                         const float* __restrict__ bias) {
    extern __shared__ float4 xs4[];
    float* xs = reinterpret_cast<float*>(xs4);
    uint4* wsm = reinterpret_cast<uint4*>(xs4 + w.cols / 4);
    // A grouped rule's bias picks experts (route_rule_warp); gpt-oss's adds to the logits.
    __shared__ float lg[256], ch[256];
    const bool add = bias && !rule_grouped(rule);
    __shared__ unsigned ticket;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = blockIdx.x * rpb, r = r0 + warp, nc = w.row_bytes / 16;
    const int nr = min(rpb, w.rows - r0);
    const u8* rows = w.codes + (size_t)r0 * w.row_bytes;
    if (pre) {
        const uint4* src = reinterpret_cast<const uint4*>(rows);
        const int total = nr * nc;
#if __CUDA_ARCH__ >= 800
        for (int c = threadIdx.x; c < total; c += blockDim.x) cp_async16(wsm + c, src + c);
        asm volatile("cp.async.commit_group;" ::: "memory");
#else
        for (int c = threadIdx.x; c < total; c += blockDim.x) wsm[c] = __ldg(src + c);
#endif
    } else {
        l2_prefetch_block(rows, (size_t)nr * w.row_bytes);
    }
    l2_prefetch_block(g, (size_t)w.cols * 4);
    pdl_wait();
    const bool first = blockIdx.x == 0;
    rms_norm_row(x, g, first ? xn : xs, first ? xs : nullptr, w.cols, eps);
#if __CUDA_ARCH__ >= 800
    if (pre) asm volatile("cp.async.wait_all;" ::: "memory");
#endif
    __syncthreads();
    if (warp < nr) {
        // row_dot's order: lane l adds chunks l, l + 32, ... in turn, then warp_sum.
        const uint4* row = pre ? wsm + (size_t)warp * nc
                               : reinterpret_cast<const uint4*>(rows + (size_t)warp * w.row_bytes);
        float acc = 0.f;
        for (int c = lane; c < nc; c += 32)
            acc += chunk_dot<KIND>(pre ? row[c] : __ldg(row + c), xs, c, w, r);
        acc = warp_sum(acc);
        if (lane == 0) lgs[r] = add ? acc + bias[r] : acc;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) ticket = atomicAdd(count, 1u);
    __syncthreads();
    if (ticket != gridDim.x - 1) return;
    if (threadIdx.x == 0) *count = 0u;
    for (int i = threadIdx.x; i < w.rows; i += blockDim.x) lg[i] = __ldcg(lgs + i);
    __syncthreads();
    if (warp == 0)
        route_rule_warp(lg, ch, w.rows, k, rule, reps, bias, reinterpret_cast<int*>(routes),
                        routes + k, lane);
}

#define MOE_KERNELS(SUFFIX, KIND)                                                              \
    extern "C" __global__ void __launch_bounds__(1024)                                         \
        moe_route_##SUFFIX(const Mat w, const float* x, int k, int rule, float reps,          \
                           float* routes) {                                                    \
        PDL_ENTRY();                                                                           \
        moe_route_body<KIND>(w, x, k, rule, reps, routes);                                     \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(1024)                                         \
        moe_route_norm_##SUFFIX(const Mat w, const float* x, const float* g, float eps,         \
                                float* xn, int k, int rule, float reps, float* routes,         \
                                int pre, const float* bias) {                                  \
        pdl_trigger();                                                                         \
        moe_route_norm_body<KIND>(w, x, g, eps, xn, k, rule, reps, routes, pre, bias);         \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(1024) moe_route_norm_wide_##SUFFIX(           \
        const Mat w, const float* x, const float* g, float eps, float* xn, int k, int rule,    \
        float reps, float* routes, int rpb, int pre, float* lgs, unsigned* count,              \
        const float* bias) {                                                                   \
        pdl_trigger();                                                                         \
        moe_route_norm_wide_body<KIND>(w, x, g, eps, xn, k, rule, reps, routes, rpb, pre, lgs, \
                                       count, bias);                                           \
    }                                                                                          \
    extern "C" __global__ void moe_gate_up_##SUFFIX(const MatEntry* tab, const float* routes,  \
                                                    int k, const Mat g, const Mat u,           \
                                                    const float* x, float* h) {                \
        pdl_trigger();                                                                         \
        moe_gate_up_body<KIND>(tab, routes, k, g, u, x, h);                                    \
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
// order of the real indices, so the kernels sum in the same order as for the real ones; the real
// indices follow at routes + 2 * SLOTS_MAX_K, for the kernels that look up an expert's biases.
#define SLOTS_MAX_K 8
struct SlotArgs {
    MatEntry e[3 * SLOTS_MAX_K];
    float routes[2 * SLOTS_MAX_K];  // n ranks (int bits), then n weights
    float ids[SLOTS_MAX_K];         // the real expert index of each rank (int bits)
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
        routes[2 * SLOTS_MAX_K + i] = a.ids[i];
    }
}

#define SEL_ARGS                                                                                  \
    const MatEntry *tab, const float *routes, int k, int which0, const float *x, int xs, int glu,  \
        float *y, int ys
#define SEL_X x + (size_t)(blockIdx.y % k) * xs
// glu: x holds k gate products and then k up products (xs apart): the input is their SwiGLU.
#define SEL_U (glu ? x + (size_t)(blockIdx.y % k + k) * xs : nullptr)
#define SEL_Y y + (size_t)blockIdx.y * ys
