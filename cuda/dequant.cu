// Dequantization for prefill and for layouts the matvec kernels do not take: any-kind matvec
// (matvec_any), f16 row tiles for cuBLAS (dequant_rows_h, dequant_words_h), int4 prefill products
// on the tensor cores (gemm_q4h_*, sum_splits), and a decode token's embedding row (embed_token).

// Element (r, c) of any kind, dequantized.
__device__ __forceinline__ float element(const Mat& w, int kind, int r, int c) {
    const u8* row = w.codes + (size_t)r * w.row_bytes;
    switch (kind) {
        case KIND_F32: return reinterpret_cast<const float*>(row)[c];
        case KIND_F16: return h2f(reinterpret_cast<const unsigned short*>(row)[c]);
        case KIND_BF16: return bf2f(reinterpret_cast<const unsigned short*>(row)[c]);
        case KIND_MXFP4: {
            const u8 e = reinterpret_cast<const u8*>(w.scales)[(size_t)r * (w.cols >> 5) + (c >> 5)];
            return e2m1x2(row[c / 2] >> (4 * (c % 2))) * mx_half_scale(e);
        }
        default: break;
    }
    size_t g = (size_t)r * (w.cols / w.group) + c / w.group;
    if (kind == KIND_INT4K || kind == KIND_INT2K) {
        const u32 sm = kind == KIND_INT4K ? int4k_sm(w, g, r) : int2k_sm(w, g, r);
        const float q = kind == KIND_INT4K ? (float)((row[c / 2] >> (4 * (c % 2))) & 0xf)
                                           : (float)((row[c / 4] >> (2 * (c % 4))) & 0x3);
        return h2f((half_bits)(sm & 0xffffu)) * q + h2f((half_bits)(sm >> 16));
    }
    float s = h2f(w.scales[g]);
    if (kind == KIND_INT8) return s * (float)(signed char)row[c];
    float q = kind == KIND_INT4 ? (float)((row[c / 2] >> (4 * (c % 2))) & 0xf)
                                : (float)((row[c / 4] >> (2 * (c % 4))) & 0x3);
    if (kind == KIND_INT3) {
        // The high bit of element e of its 64-value block (formats' int3_hi_bit).
        const int e = c & 63, hb = 32 * (e >> 5) + 8 * ((e & 15) >> 2) + 4 * ((e >> 4) & 1) + (e & 3);
        const u8 h = row[(w.cols >> 2) + (c >> 6) * 8 + (hb >> 3)];
        q += (float)(((h >> (hb & 7)) & 1) << 2);
    }
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

// out[r * cols + c] = f16(W[r0 + r, c]) for r < nrows: row tiles for cuBLAS's tensor-core GEMM.
// Grid (ceil(cols / block), nrows).
extern "C" __global__ void dequant_rows_h(const Mat w, int kind, half_bits* __restrict__ out, int r0,
                                          int nrows) {
    PDL_ENTRY();
    int c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c >= w.cols || r >= nrows) return;
    out[(size_t)r * w.cols + c] = f2h(element(w, kind, r0 + r, c));
}

// The same for the integer kinds, one 32-bit code word (4, 8 or 16 codes of one group; int3: of its
// low bits, the high bits from their word) per thread,
// stored as 8-32 contiguous bytes: codes and rows 4-byte aligned, cols % 8 == 0, group a multiple
// of the codes per word (Gpu::matmul checks; dequant_rows_h otherwise). Each value as element()
// computes it. Grid (ceil(row_bytes / 4 / block), nrows).
template <int KIND>
__device__ __forceinline__ void dequant_word_h(const Mat& w, half_bits* __restrict__ out, int r0,
                                               int r, int wi) {
    constexpr int BITS = KIND == KIND_INT8 ? 8 : KIND == KIND_INT4 || KIND == KIND_INT4K ? 4 : 2,
                  EPW = 32 / BITS;
    const size_t row = (size_t)(r0 + r);
    const int c0 = wi * EPW;
    const u32 word = reinterpret_cast<const u32*>(w.codes + row * w.row_bytes)[wi];
    // int3: word wi's high bits, in high word 2 (wi / 4) + (wi % 4) / 2 of the row (bits 8 b + 4 (wi % 2) + s
    // for code 4 b + s: formats' int3_hi_bit).
    const u32 hw = KIND == KIND_INT3
                       ? reinterpret_cast<const u32*>(w.codes + row * w.row_bytes + (w.cols >> 2))[2 * (wi >> 2) + ((wi & 3) >> 1)]
                       : 0u;
    const int hn = 4 * (wi & 1);
    const size_t g = row * (w.cols / w.group) + c0 / w.group;
    constexpr bool SUB = KIND == KIND_INT4K || KIND == KIND_INT2K;
    const u32 sm = KIND == KIND_INT4K ? int4k_sm(w, g, (int)row) : KIND == KIND_INT2K ? int2k_sm(w, g, (int)row) : 0u;
    const float s = h2f(SUB ? (half_bits)(sm & 0xffffu) : w.scales[g]);
    const float mn = KIND == KIND_INT8 ? 0.f : h2f(SUB ? (half_bits)(sm >> 16) : w.mins[g]);
    u32 h[EPW / 2];
#pragma unroll
    for (int j = 0; j < EPW; j += 2) {
        float a, b;
        if (KIND == KIND_INT8) {
            a = s * (float)(signed char)(word >> (8 * j));
            b = s * (float)(signed char)(word >> (8 * j + 8));
        } else {
            constexpr u32 M = (1u << BITS) - 1;
            u32 qa = (word >> (BITS * j)) & M, qb = (word >> (BITS * j + BITS)) & M;
            if (KIND == KIND_INT3) {
                qa |= ((hw >> (8 * (j / 4) + hn + j % 4)) & 1u) << 2;
                qb |= ((hw >> (8 * ((j + 1) / 4) + hn + (j + 1) % 4)) & 1u) << 2;
            }
            a = s * (float)qa + mn;
            b = s * (float)qb + mn;
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
    // (int3: the words of the row's low bits.)
    if (wi * 4 >= (kind == KIND_INT3 ? w.cols >> 2 : w.row_bytes) || r >= nrows) return;
    switch (kind) {
        case KIND_INT8: dequant_word_h<KIND_INT8>(w, out, r0, r, wi); break;
        case KIND_INT4: dequant_word_h<KIND_INT4>(w, out, r0, r, wi); break;
        case KIND_INT2: dequant_word_h<KIND_INT2>(w, out, r0, r, wi); break;
        case KIND_INT3: dequant_word_h<KIND_INT3>(w, out, r0, r, wi); break;
        case KIND_INT4K: dequant_word_h<KIND_INT4K>(w, out, r0, r, wi); break;
        case KIND_INT2K: dequant_word_h<KIND_INT2K>(w, out, r0, r, wi); break;
        default: break;
    }
}

// Prefill products of int4 weights without an f16 tile: out[n, r] (rows ld apart) = sum_c W[r, c]
// xh[n, c] for n < t, r < w.rows, each weight dequantized in shared memory as dequant_word_h
// computes it (f16 of s * q + min) and multiplied on the tensor cores (mma m16n8k16, f16 inputs, f32
// accumulation), as cuBLAS does with the tile. A block: 128 rows x BN tokens, 64 columns a step
// (a thread's 32 codes in one group), the next step's codes and tokens loaded during the
// products; 8 warps of 32 rows x BN / 2 tokens. Block z of the grid's K parts takes steps [z ksteps, (z + 1) ksteps) and
// writes its partial sums at out + z t ld (sum_splits adds them in z order). Needs cols % 64 == 0,
// group % 32 == 0, row_bytes % 16 == 0, 16-byte aligned codes and xh (Gpu::matmul checks). Grid
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
// KIND_INT4K (gemm_q4k_*): int4's, each group's scale and min from int4k_sm.
// KIND_MXFP4 (gemm_mx4h_*): a thread's 32 codes are one MXFP4 block, its E8M0 byte the scale; each
// weight the f16 of its exact f32 value (the f16 tile dequant_rows_h makes for cuBLAS).
template <int BN, int KIND = KIND_INT4>
__device__ __forceinline__ void gemm_q4h_body(const Mat& w, const half_bits* __restrict__ xh, int t,
                                              float* __restrict__ out, int ld, int ksteps, int kz) {
#if __CUDA_ARCH__ >= 800
    constexpr int NT = BN / 16;  // n8 tiles a warp
    constexpr int XV = BN * GQ_BK / 8 / 256;  // 16-byte x loads a thread per step
    __shared__ __align__(16) half_bits ws[GQ_BM * GQ_LD];
    __shared__ __align__(16) half_bits xs[BN * GQ_LD];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp & 3, wn = warp >> 2;
    const int m0 = blockIdx.x * GQ_BM, n0 = blockIdx.y * BN;
    const int gpr = w.cols / w.group;
    // Split K: part kz takes steps [kz * ksteps, ...) and writes its own [t, ld] partial.
    const int kb = kz * ksteps * GQ_BK, ke = min(w.cols, kb + ksteps * GQ_BK);
    out += (size_t)kz * t * ld;
    // This thread's loads: 32 codes (16 bytes) of row lr, half lh of the step; XV x chunks.
    const int lr = tid >> 1, lh = tid & 1, grow = min(m0 + lr, w.rows - 1);
    const uint4* crow = reinterpret_cast<const uint4*>(w.codes + (size_t)grow * w.row_bytes);
    uint4 cv, xv[XV];
    u32 smv;
    auto gload = [&](int k0) {
        cv = crow[k0 / 32 + lh];
        // A thread's 32 codes lie in one group (group % 32 == 0: g32 from Q4_K, hob's g64).
        const size_t g = (size_t)grow * gpr + (k0 + lh * 32) / w.group;
        if (KIND == KIND_MXFP4) smv = reinterpret_cast<const u8*>(w.scales)[g];
        else if (KIND == KIND_INT4K) smv = int4k_sm(w, g, grow);
        else smv = (u32)w.scales[g] | ((u32)w.mins[g] << 16);
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
            const u32 word[4] = {cv.x, cv.y, cv.z, cv.w};
            u32 h[16];
            if (KIND == KIND_MXFP4) {
                const float s = mx_half_scale(smv);
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const u32 wd = word[j >> 2], sh = 8 * (j & 3);
                    const float a = s * e2m1x2((wd >> sh) & 0xf);
                    const float b = s * e2m1x2((wd >> (sh + 4)) & 0xf);
                    h[j] = (u32)f2h(a) | ((u32)f2h(b) << 16);
                }
            } else {
                const float s = h2f((half_bits)(smv & 0xffff)), mn = h2f((half_bits)(smv >> 16));
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const u32 wd = word[j >> 2], sh = 8 * (j & 3);
                    const float a = s * (float)((wd >> sh) & 0xf) + mn;
                    const float b = s * (float)((wd >> (sh + 4)) & 0xf) + mn;
                    h[j] = (u32)f2h(a) | ((u32)f2h(b) << 16);
                }
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
    gemm_q4h_body<64>(w, xh, t, out, ld, ksteps, blockIdx.z);
}
extern "C" __global__ void __launch_bounds__(256) gemm_q4h_128(const Mat w, const half_bits* xh, int t,
                                                               float* out, int ld, int ksteps) {
    PDL_ENTRY();
    gemm_q4h_body<128>(w, xh, t, out, ld, ksteps, blockIdx.z);
}
extern "C" __global__ void __launch_bounds__(256) gemm_q4k_64(const Mat w, const half_bits* xh, int t,
                                                              float* out, int ld, int ksteps) {
    PDL_ENTRY();
    gemm_q4h_body<64, KIND_INT4K>(w, xh, t, out, ld, ksteps, blockIdx.z);
}
extern "C" __global__ void __launch_bounds__(256) gemm_q4k_128(const Mat w, const half_bits* xh, int t,
                                                               float* out, int ld, int ksteps) {
    PDL_ENTRY();
    gemm_q4h_body<128, KIND_INT4K>(w, xh, t, out, ld, ksteps, blockIdx.z);
}
extern "C" __global__ void __launch_bounds__(256) gemm_mx4h_64(const Mat w, const half_bits* xh, int t,
                                                              float* out, int ld, int ksteps) {
    PDL_ENTRY();
    gemm_q4h_body<64, KIND_MXFP4>(w, xh, t, out, ld, ksteps, blockIdx.z);
}
extern "C" __global__ void __launch_bounds__(256) gemm_mx4h_128(const Mat w, const half_bits* xh, int t,
                                                               float* out, int ld, int ksteps) {
    PDL_ENTRY();
    gemm_q4h_body<128, KIND_MXFP4>(w, xh, t, out, ld, ksteps, blockIdx.z);
}

// A layer's prefill experts, one launch a product (gemm_q4h_grp_*): group z's tokens are rows
// [row0, row0 + n) of xh and of out, its matrix the entry's m[which]; blocks past a group's tokens
// return. K is not split, so a call of one group computes what a call of many does, bit for bit
// (Gpu::gemm_q4h_groups; the engine's grouped and per-expert prefill paths agree).
struct QGroup {
    MatEntry m[3];
    int row0, n, pad0, pad1;
};
template <int BN, int KIND = KIND_INT4>
__device__ __forceinline__ void gemm_q4h_grp(const QGroup* __restrict__ groups, int which,
                                             const half_bits* __restrict__ xh, float* __restrict__ out,
                                             int ld) {
    const QGroup& g = groups[blockIdx.z];
    if ((int)blockIdx.y * BN >= g.n) return;
    const Mat w = g.m[which].m;
    gemm_q4h_body<BN, KIND>(w, xh + (size_t)g.row0 * w.cols, g.n, out + (size_t)g.row0 * ld, ld, w.cols / GQ_BK, 0);
}
extern "C" __global__ void __launch_bounds__(256) gemm_q4h_grp_64(const QGroup* groups, int which,
                                                                  const half_bits* xh, float* out, int ld) {
    PDL_ENTRY();
    gemm_q4h_grp<64>(groups, which, xh, out, ld);
}
extern "C" __global__ void __launch_bounds__(256) gemm_q4h_grp_128(const QGroup* groups, int which,
                                                                   const half_bits* xh, float* out, int ld) {
    PDL_ENTRY();
    gemm_q4h_grp<128>(groups, which, xh, out, ld);
}
extern "C" __global__ void __launch_bounds__(256) gemm_q4k_grp_64(const QGroup* groups, int which,
                                                                  const half_bits* xh, float* out, int ld) {
    PDL_ENTRY();
    gemm_q4h_grp<64, KIND_INT4K>(groups, which, xh, out, ld);
}
extern "C" __global__ void __launch_bounds__(256) gemm_q4k_grp_128(const QGroup* groups, int which,
                                                                   const half_bits* xh, float* out, int ld) {
    PDL_ENTRY();
    gemm_q4h_grp<128, KIND_INT4K>(groups, which, xh, out, ld);
}

// out[i, :] += w[r] y[r, :] for every row r of token i (idx[r] == i), r ascending: the sums of
// one scatter_axpy a group, groups in ascending expert order, in one launch. A block a token, at
// most 32 rows a token (the routes' k).
extern "C" __global__ void __launch_bounds__(256) gather_axpy(float* __restrict__ out,
                                                              const int* __restrict__ idx,
                                                              const float* __restrict__ w,
                                                              const float* __restrict__ y, int n, int m) {
    PDL_ENTRY();
    __shared__ int rows[32];
    __shared__ int count;
    const int i = blockIdx.x;
    if (threadIdx.x < 32) {
        int c = 0;
        for (int r0 = 0; r0 < m; r0 += 32) {
            const int r = r0 + threadIdx.x;
            const bool hit = r < m && idx[r] == i;
            const unsigned b = __ballot_sync(0xffffffffu, hit);
            const int at = c + __popc(b & ((1u << threadIdx.x) - 1u));
            if (hit && at < 32) rows[at] = r;
            c += __popc(b);
        }
        if (threadIdx.x == 0) count = min(c, 32);
    }
    __syncthreads();
    for (int col = threadIdx.x; col < n; col += blockDim.x) {
        float* o = out + (size_t)i * n + col;
        float acc = *o;
        for (int j = 0; j < count; j++) {
            const int r = rows[j];
            acc = acc + w[r] * y[(size_t)r * n + col];
        }
        *o = acc;
    }
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
