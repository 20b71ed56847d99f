// Routing on the device (decode and prefill): the routing rules' top k of a token's router
// logits, one warp or one thread per token (route_topk); moe.cu's fused router kernels take
// route_one too.

// Routing on the device, as the host's routing rules compute it (src/model/routing.rs): softmax
// over the ne router logits l of a token, the top k (ties: lower index first), weights
// renormalized to sum to 1 or not, best first, into re (experts) and rw (weights), k <= 16; or
// Phi-3.5-MoE's sparsemixer (k = 2). A rule and its eps, as every routing kernel takes them:
#define RULE_SOFTMAX_RENORM 0
#define RULE_SOFTMAX 1
#define RULE_SPARSEMIXER 2
// gpt-oss: the top k logits, then the softmax over those k.
#define RULE_TOPK_SOFTMAX 3
#define ROUTE_MAX_K 16
// The top K of the probabilities p(e) (e < ne), descending, weights renormalized (renorm) or
// not, into re and rw (k <= K entries). A template on K: the insertion below unrolls over K slots, so the common
// k = 1, 2 take a few instructions per expert instead of ROUTE_MAX_K's (the same results: slots
// at or past k are never touched).
template <int K, typename P>
__device__ __forceinline__ void route_top(P p, int ne, int k, bool renorm, int* re, float* rw) {
    // The best k so far, descending, in registers (every index below is a constant once the
    // loops unroll: a dynamically indexed array would live in local memory).
    float w[K];
    int ex[K];
#pragma unroll
    for (int j = 0; j < K; j++) {
        w[j] = NEG_INF;
        // In range even when no weight beats -inf (NaN logits): the kernels that use the route
        // before the host sees its NaN weight (and reports the layer) must not read out of bounds.
        ex[j] = j;
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
            rw[j] = renorm ? w[j] / total : w[j];
        }
}

// route_top for any k <= ROUTE_MAX_K, called (not inlined) so that its registers do not count
// against the common k's.
template <typename P>
__device__ __noinline__ void route_top_max(P p, int ne, int k, bool renorm, int* re, float* rw) {
    route_top<ROUTE_MAX_K>(p, ne, k, renorm, re, rw);
}

template <typename P>
__device__ __forceinline__ void route_top_k(P p, int ne, int k, bool renorm, int* re, float* rw) {
    if (k == 1) {
        route_top<1>(p, ne, k, renorm, re, rw);
    } else if (k == 2) {
        route_top<2>(p, ne, k, renorm, re, rw);
    } else {
        route_top_max(p, ne, k, renorm, re, rw);
    }
}

// Phi-3.5-MoE's sparsemixer at inference (route_sparsemixer's arithmetic), k = 2: the best logit
// not yet taken (ties: the lower index), weighted by the softmax over the logits within a relative
// 2 eps of it. A non-finite logit gives experts 0, 1 with NaN weights (the host's refusal, which
// names the layer).
__device__ __noinline__ void route_sparsemixer(const float* l, int ne, float eps, int* re,
                                               float* rw) {
    bool finite = true;
    for (int e = 0; e < ne; e++) finite &= isfinite(l[e]);
    if (!finite) {
        re[0] = 0;
        re[1] = 1;
        rw[0] = rw[1] = __int_as_float(0x7fc00000);
        return;
    }
    int excluded = -1;
    for (int j = 0; j < 2; j++) {
        int best = 0;
        float mx = NEG_INF;
        for (int e = 0; e < ne; e++)
            if (e != excluded && l[e] > mx) {
                best = e;
                mx = l[e];
            }
        float sum = 0.f;
        for (int e = 0; e < ne; e++)
            if (e != excluded && (mx - l[e]) / fmaxf(fabsf(l[e]), mx) <= 2.f * eps)
                sum += expf(l[e] - mx);
        re[j] = best;
        rw[j] = 1.f / sum;
        excluded = best;
    }
}

// The softmax's denominator in the one order every routing form adds it in (the weights' bits
// depend on it): lane l of a warp adds terms l, l + 32, ... in turn, then the lanes' sums meet in a
// butterfly (xor 16, 8, 4, 2, 1; a + b = b + a, so every lane ends with the same bits). One lane
// adding all ne in turn took ~2 us for 128 experts.
__device__ __forceinline__ float route_sum_warp(float part) {
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    return part;
}

// route_sum_warp's sum by one thread, of the terms term(e), e < ne.
template <typename T>
__device__ __forceinline__ float route_sum_one(T term, int ne) {
    float v[32];
    for (int l = 0; l < 32; l++) {
        v[l] = 0.f;
        for (int e = l; e < ne; e += 32) v[l] += term(e);
    }
    for (int o = 16; o >= 1; o >>= 1)
        for (int l = 0; l < 32; l++)
            if ((l & o) == 0) v[l] = v[l | o] = v[l] + v[l | o];
    return v[0];
}

// gpt-oss's routing (route_topk_softmax's arithmetic): the top k logits, then their softmax,
// summed in slot order. A non-finite logit gives experts 0..k with NaN weights (the host's
// refusal, which names the layer).
__device__ __noinline__ void route_topk_softmax(const float* l, int ne, int k, int* re,
                                                float* rw) {
    bool finite = true;
    for (int e = 0; e < ne; e++) finite &= isfinite(l[e]);
    if (!finite) {
        for (int j = 0; j < k; j++) {
            re[j] = j;
            rw[j] = __int_as_float(0x7fc00000);
        }
        return;
    }
    route_top_k([&](int e) { return l[e]; }, ne, k, false, re, rw);
    const float mx = rw[0];
    float sum = 0.f;
    for (int j = 0; j < k; j++) sum += expf(rw[j] - mx);
    for (int j = 0; j < k; j++) rw[j] = expf(rw[j] - mx) / sum;
}

// One thread: the rule's routes of l[:ne] (softmax, then route_top_k; sparsemixer; or the top k
// logits' softmax).
__device__ void route_one(const float* l, int ne, int k, int rule, float reps, int* re, float* rw) {
    if (rule == RULE_SPARSEMIXER) {
        route_sparsemixer(l, ne, reps, re, rw);
        return;
    }
    if (rule == RULE_TOPK_SOFTMAX) {
        route_topk_softmax(l, ne, k, re, rw);
        return;
    }
    float mx = NEG_INF;
    for (int e = 0; e < ne; e++) mx = fmaxf(mx, l[e]);
    const float sum = route_sum_one([&](int e) { return expf(l[e] - mx); }, ne);
    route_top_k([&](int e) { return expf(l[e] - mx) / sum; }, ne, k, rule == RULE_SOFTMAX_RENORM,
                re, rw);
}

// route_top's results for k > 2 by a warp: k rounds of an arg-max across the lanes (the larger
// probability, on a tie the lower index: route_top's order), each lane holding the probabilities
// p[e] / sum of its experts (e = lane + 32 i, ne <= 256). One thread's insertion into k slots took
// ~7 us for Qwen3-MoE's 128 experts and top 8. Probabilities are all NaN or none is (a NaN logit
// makes the sum NaN): then, as route_top, expert j in slot j with weight -inf.
__device__ __noinline__ void route_top_warp(const float* p, float sum, int ne, int k, bool renorm,
                                            int* re, float* rw, int lane) {
    float q[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int e = lane + 32 * i;
        q[i] = e < ne ? p[e] / sum : NEG_INF;
    }
    float total = 0.f;
    for (int j = 0; j < k; j++) {
        float bv = NEG_INF;
        int bi = 1 << 30;
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (q[i] > bv) {
                bv = q[i];
                bi = lane + 32 * i;
            }
#pragma unroll
        for (int o = 16; o >= 1; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (!(bv > NEG_INF)) bi = j;
#pragma unroll
        for (int i = 0; i < 8; i++)
            if (bv > NEG_INF && bi == lane + 32 * i) q[i] = NEG_INF;
        total += bv;
        if (lane == 0) {
            re[j] = bi;
            rw[j] = bv;
        }
    }
    if (lane == 0 && renorm)
        for (int j = 0; j < k; j++) rw[j] = rw[j] / total;
}

// route_topk_softmax by one warp, the same results: the finiteness by a vote, the top k logits
// by route_top_warp (x / 1 is x: the same order and values), their softmax by lane 0 as the one
// thread adds it. One thread's scan took ~20 us for gpt-oss-120b's 128 experts.
__device__ __forceinline__ void route_topk_softmax_warp(const float* l, int ne, int k, int* re,
                                                        float* rw, int lane) {
    bool finite = true;
    for (int e = lane; e < ne; e += 32) finite &= isfinite(l[e]);
    if (!__all_sync(0xffffffffu, finite)) {
        if (lane == 0) route_topk_softmax(l, ne, k, re, rw);
        return;
    }
    route_top_warp(l, 1.f, ne, k, false, re, rw, lane);
    if (lane != 0) return;
    const float mx = rw[0];
    float sum = 0.f;
    for (int j = 0; j < k; j++) sum += expf(rw[j] - mx);
    for (int j = 0; j < k; j++) rw[j] = expf(rw[j] - mx) / sum;
}

// route_one by one warp, the same results: the maximum and the exponentials across the lanes
// (fmaxf's maximum does not depend on the order; each exponential is the same expf), their sum
// (route_sum_warp) and the top k by lane 0 (k <= 2) or the warp (route_top_warp). l and p: shared
// memory of ne floats (p may be l).
__device__ __forceinline__ void route_one_warp(const float* l, float* p, int ne, int k, int rule,
                                               float reps, int* re, float* rw, int lane) {
    if (rule == RULE_TOPK_SOFTMAX) {
        route_topk_softmax_warp(l, ne, k, re, rw, lane);
        return;
    }
    if (rule == RULE_SPARSEMIXER) {
        if (lane == 0) route_one(l, ne, k, rule, reps, re, rw);
        return;
    }
    float mx = NEG_INF;
    for (int e = lane; e < ne; e += 32) mx = fmaxf(mx, l[e]);
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float part = 0.f;
    for (int e = lane; e < ne; e += 32) {
        p[e] = expf(l[e] - mx);
        part += p[e];
    }
    __syncwarp();
    const float sum = route_sum_warp(part);
    if (k <= 2) {
        if (lane == 0)
            route_top_k([&](int e) { return p[e] / sum; }, ne, k, rule == RULE_SOFTMAX_RENORM, re,
                        rw);
        return;
    }
    route_top_warp(p, sum, ne, k, rule == RULE_SOFTMAX_RENORM, re, rw, lane);
}

// Routes of t tokens: routes[i * k + j] = expert (int bits) and routes[t * k + i * k + j] =
// weight. A warp a token (route_one_warp, route_topk_softmax_warp: route_one's results), blocks of
// ROUTE_TOPK_WARPS warps; routers of more than ROUTE_WARP_NE experts by lane 0 alone. With `bias`
// ([ne]), each logit first gets its expert's bias in place (as add_bias_rows adds it).
#define ROUTE_TOPK_WARPS 4
#define ROUTE_WARP_NE 256
extern "C" __global__ void route_topk(float* __restrict__ logits, int ne, int k, int t,
                                      int rule, float reps, float* __restrict__ routes,
                                      const float* __restrict__ bias) {
    __shared__ float p[ROUTE_TOPK_WARPS][ROUTE_WARP_NE];
    PDL_ENTRY();
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x * ROUTE_TOPK_WARPS + w;
    if (i >= t) return;
    float* lb = logits + (size_t)i * ne;
    if (bias) {
        for (int e = lane; e < ne; e += 32) lb[e] += bias[e];
        __syncwarp();
    }
    const float* l = lb;
    int* re = reinterpret_cast<int*>(routes) + (size_t)i * k;
    float* rw = routes + (size_t)t * k + (size_t)i * k;
    if (ne > ROUTE_WARP_NE) {
        if (lane == 0) route_one(l, ne, k, rule, reps, re, rw);
    } else if (rule == RULE_TOPK_SOFTMAX) {
        route_topk_softmax_warp(l, ne, k, re, rw, lane);
    } else {
        route_one_warp(l, p[w], ne, k, rule, reps, re, rw, lane);
    }
}

// GLM-4.5's and DeepSeek's group-limited routing (route_grouped in src/model/routing.rs) of one
// token's logits l by a warp: scores s(e) = sigmoid(l[e]), or the softmax over every logit
// (`softmax`, summed as route_one_warp sums it); experts chosen by s(e) + bias[e] (c: ne floats of
// the warp's own, not l) within the best `topk_groups` of `groups` equal groups (a group's value:
// the sum of its two best choices, or its best under softmax; ties: the lower group), the top k by
// choice (route_top_warp: ties, the lower index), weighted by their scores, renormalized to sum to
// 1 (+ 1e-20) or not, times `scale`. ne <= ROUTE_WARP_NE, groups <= 64. Non-finite logits, or
// fewer experts in the kept groups than k, give experts 0..k with NaN weights (the host's refusal,
// which names the layer).
__device__ __noinline__ void route_grouped_warp(const float* l, float* c, int ne, int k,
                                                int softmax, int groups, int topk_groups,
                                                int renorm, float scale,
                                                const float* __restrict__ bias, int* re,
                                                float* rw, int lane) {
    const float nan = __int_as_float(0x7fc00000);
    bool finite = true;
    for (int e = lane; e < ne; e += 32) finite &= isfinite(l[e]);
    if (!__all_sync(0xffffffffu, finite)) {
        if (lane == 0)
            for (int j = 0; j < k; j++) {
                re[j] = j;
                rw[j] = nan;
            }
        return;
    }
    float mx = NEG_INF, sum = 1.f;
    if (softmax) {
        for (int e = lane; e < ne; e += 32) mx = fmaxf(mx, l[e]);
#pragma unroll
        for (int o = 16; o >= 1; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float part = 0.f;
        for (int e = lane; e < ne; e += 32) part += expf(l[e] - mx);
        sum = route_sum_warp(part);
    }
    auto score = [&](int e) {
        return softmax ? expf(l[e] - mx) / sum : 1.f / (1.f + expf(-l[e]));
    };
    for (int e = lane; e < ne; e += 32) c[e] = score(e) + (bias ? bias[e] : 0.f);
    __syncwarp();
    const int size = ne / groups;
    unsigned long long kept = ~0ull;
    if (lane == 0 && topk_groups < groups) {
        // The best topk_groups groups by value, descending (lane 0 alone: a few hundred reads).
        float bv[64];
        int bg[64];
        for (int j = 0; j < topk_groups; j++) {
            bv[j] = NEG_INF;
            bg[j] = 0;
        }
        for (int g = 0; g < groups; g++) {
            float a = NEG_INF, b = NEG_INF;
            for (int e = g * size; e < (g + 1) * size; e++) {
                const float v = c[e];
                if (v > a) {
                    b = a;
                    a = v;
                } else if (v > b) {
                    b = v;
                }
            }
            const float value = softmax || size < 2 ? a : a + b;
            int at = 0;
            while (at < topk_groups && !(value > bv[at])) at++;
            for (int j = topk_groups - 1; j > at; j--) {
                bv[j] = bv[j - 1];
                bg[j] = bg[j - 1];
            }
            if (at < topk_groups) {
                bv[at] = value;
                bg[at] = g;
            }
        }
        kept = 0;
        for (int j = 0; j < topk_groups; j++) kept |= 1ull << bg[j];
    }
    kept = __shfl_sync(0xffffffffu, kept, 0);
    for (int e = lane; e < ne; e += 32)
        if (!((kept >> (e / size)) & 1ull)) c[e] = NEG_INF;
    __syncwarp();
    route_top_warp(c, 1.f, ne, k, false, re, rw, lane);
    if (lane != 0) return;
    bool enough = true;
    for (int j = 0; j < k; j++) enough &= rw[j] > NEG_INF;
    float total = 0.f;
    for (int j = 0; j < k; j++) {
        rw[j] = enough ? score(re[j]) : nan;
        if (!enough) re[j] = j;
        total += rw[j];
    }
    const float norm = renorm ? total + 1e-20f : 1.f;
    for (int j = 0; j < k; j++) rw[j] = rw[j] / norm * scale;
}

// A grouped rule as the fused router kernels (moe.cu) take it, in their (rule, reps) pair:
// RULE_GROUPED | softmax << 4 | renorm << 5 | groups << 8 | topk_groups << 16, with the scale in
// reps, and the kernels' bias the selection bias (not added to the logits).
#define RULE_GROUPED 4
__device__ __forceinline__ bool rule_grouped(int rule) { return (rule & 15) == RULE_GROUPED; }

// route_one_warp, or a grouped rule's route_grouped_warp (sel: its selection bias; c: ne floats
// apart from l), for the fused router kernels.
__device__ __forceinline__ void route_rule_warp(float* l, float* c, int ne, int k, int rule,
                                                float reps, const float* __restrict__ sel,
                                                int* re, float* rw, int lane) {
    if (rule_grouped(rule)) {
        route_grouped_warp(l, c, ne, k, (rule >> 4) & 1, (rule >> 8) & 255, (rule >> 16) & 255,
                           (rule >> 5) & 1, reps, sel, re, rw, lane);
    } else {
        route_one_warp(l, l, ne, k, rule, reps, re, rw, lane);
    }
}

// Group-limited routing of t tokens' logits (route_grouped_warp), a warp a token,
// ROUTE_TOPK_WARPS a block: routes as route_topk writes them.
extern "C" __global__ void route_grouped(const float* __restrict__ logits, int ne, int k, int t,
                                         int softmax, int groups, int topk_groups, int renorm,
                                         float scale, const float* __restrict__ bias,
                                         float* __restrict__ routes) {
    __shared__ float choice[ROUTE_TOPK_WARPS][ROUTE_WARP_NE];
    PDL_ENTRY();
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x * ROUTE_TOPK_WARPS + w;
    if (i >= t) return;
    int* re = reinterpret_cast<int*>(routes) + (size_t)i * k;
    float* rw = routes + (size_t)t * k + (size_t)i * k;
    route_grouped_warp(logits + (size_t)i * ne, choice[w], ne, k, softmax, groups, topk_groups,
                       renorm, scale, bias, re, rw, lane);
}
