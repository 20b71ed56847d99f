// The integer dequantize-matvec kernels hob used before 2026-11-22's rewrite (cuda/kernels.cu
// matvec_q_*), kept only so that benches/gpu_matvec.rs can time them beside the new ones. The
// bench compiles this file appended to cuda/kernels.cu (Mat, h2f, warp_sum come from there).
// Launch: 2 warps per block, 4 rows per warp (prev_matvec_int8_r2: 2 rows, used below 8192 rows).

template <int KIND>
__device__ __forceinline__ float prev_chunk_dot(const uint4& v, const float* __restrict__ x, int c,
                                                const Mat& w, int r) {
    const u32 word[4] = {v.x, v.y, v.z, v.w};
    if (KIND == KIND_INT8) {
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

// Several rows per warp (the quantized kinds): x is read once per chunk position for all R rows
// (an int4 chunk of 16 bytes needs 128 bytes of x), and R x 2 loads are in flight per lane.
template <int KIND, int R>
__device__ __forceinline__ void prev_matvec_rows_body(const Mat w, const float* __restrict__ x,
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
            acc[i] += prev_chunk_dot<KIND>(a[i], x, c, w, rr[i]);
            acc[i] += prev_chunk_dot<KIND>(b[i], x, c + 32, w, rr[i]);
        }
    }
    for (; c < n; c += 32) {
#pragma unroll
        for (int i = 0; i < R; i++) acc[i] += prev_chunk_dot<KIND>(__ldg(row[i] + c), x, c, w, rr[i]);
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
        float v = warp_sum(acc[i]);
        if (lane == 0 && r0 + i < w.rows) y[r0 + i] = v;
    }
}

// Rows per warp of the quantized kinds (src/backend/cuda/mod.rs launches with the same figure).

extern "C" __global__ void prev_matvec_int8(const Mat w, const float* x, float* y) { prev_matvec_rows_body<KIND_INT8, 4>(w, x, y); }
extern "C" __global__ void prev_matvec_int4(const Mat w, const float* x, float* y) { prev_matvec_rows_body<KIND_INT4, 4>(w, x, y); }
extern "C" __global__ void prev_matvec_int2(const Mat w, const float* x, float* y) { prev_matvec_rows_body<KIND_INT2, 4>(w, x, y); }
extern "C" __global__ void prev_matvec_int8_r2(const Mat w, const float* x, float* y) { prev_matvec_rows_body<KIND_INT8, 2>(w, x, y); }
