// MXFP4 experts (formats/hob.md; src/quant/mxfp4.rs) where the dp4a kernels (matvec_q.cu
// matvec_qd_mxfp4) have no plan: a warp a row through row_dot (matvec_float.cu
// chunk_dot: one 16-byte chunk is one block of 32 codes and its E8M0 scale), so every product of
// a row, plain or routed, has the same sums and bits.

extern "C" __global__ void matvec_mxfp4(const Mat w, const float* x, float* y) {
    matvec_body<KIND_MXFP4>(w, x, y);
}

// The routed experts of one token (the integer kinds' matvec_q_*_sel contract, moe.cu sel_mat and
// "Ordering"): launch j = blockIdx.y takes matrix which0 + j / k of expert routes[j % k] times
// x + (j % k) * xs into y + j * ys. A warp a row; the grid's blocks step over the rows. glu is
// refused by the launcher (src/backend/cuda/matvec.rs); split and tchunks are unused.
extern "C" __global__ void matvec_mxfp4_sel(SEL_ARGS, int split, int tchunks) {
    if (which0 == 0) {
        pdl_wait();
        pdl_trigger();
    }
    const Mat w = sel_mat(tab, routes, k, which0);
    const float* xin = SEL_X;
    float* yout = SEL_Y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int r = blockIdx.x * warps + warp; r < w.rows; r += gridDim.x * warps) {
        // Waits (after its first loads) where which0 > 0: x is the kernel before's output.
        const float v = row_dot<KIND_MXFP4, ROW_DEPTH, true>(w, r, xin, lane);
        if (lane == 0) yout[r] = v;
    }
}
