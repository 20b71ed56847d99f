// The integer matvec kernels (matvec_q_*, matvec_qd_*, and their routed _sel and _gu forms): the
// loop over row tiles and chunk steps, on x staged as matvec_q_stage.cu describes.

// The sums of R rows held across a warp: returns, in lanes l with l % (32 / R) == 0, the full sum
// of row l / (32 / R) (the other lanes hold partial or repeated sums). Fixed order.
template <int R>
__device__ __forceinline__ float qreduce(float (&v)[R], int lane) {
#pragma unroll
    for (int half = R / 2, off = 16; half >= 1; half >>= 1, off >>= 1) {
        const bool up = lane & off;
#pragma unroll
        for (int i = 0; i < half; i++) {
            const float send = up ? v[i] : v[i + half];
            const float keep = up ? v[i + half] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
    }
    float r = v[0];
#pragma unroll
    for (int off = 16 / R; off >= 1; off >>= 1) r += __shfl_xor_sync(0xffffffffu, r, off);
    return r;
}

// A streamed 16-byte load that skips L1: the weights are read once, and x lives in shared memory
// (benches/results/2026-11-22-h100-int-matvec.md).
__device__ __forceinline__ uint4 qld(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// The same for 8 bytes (int3's high bits of a chunk).
__device__ __forceinline__ uint2 qld2(const uint2* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

// The step after step k of tile t, for a block walking its tiles (blockIdx.x, + gridDim.x, ...)
// ksteps steps each: (nt, nk).
__device__ __forceinline__ void next_step(int t, int k, int ksteps, int& nt, int& nk) {
    nk = k + 1;
    nt = t;
    if (nk == ksteps) {
        nk = 0;
        nt += gridDim.x;
    }
}

// One step's loads of a lane: a chunk of each of the R rows, with its scale and min bits.
template <int R>
struct QBuf {
    uint4 v[R];
    u32 sm[R];  // scale bits | min bits << 16 (when a chunk lies in one group)
    uint2 h[R];  // int3: the chunk's high bits (unused by the other kinds)
};

// y = W x for int8/int4/int2 (row_bytes % 16 == 0; codes and x 16-byte aligned, scales and mins
// 2-byte). blockDim.x = 32 * warps, warps % split == 0; a tile is (warps / split) * R rows, tiles
// go to blocks round-robin; the columns go in tiles of tchunks chunks (a multiple of 32 when there
// is more than one), each staged in turn (y then accumulated by the same thread, in order).
// Dynamic shared memory: q_smem in mod.rs. DP: the integer-dot-product form (qdstage), for groups
// of whole chunks.
// GU (DP only, one column tile: tchunks covers the row): gate and up of one expert in one block,
// y = SwiGLU(w x, wu x) (matvec_qd_*_gu). A warp's R row slots hold R/2 rows of w (gate) and the
// same R/2 rows of wu (up), so a row's SwiGLU takes one shuffle (split 1) or the shared-memory sums
// the split already needs: no barrier the plain kernel does not have. Each row's sum is the plain
// kernel's (same split, same order; qreduce's sums do not depend on the slot), and SwiGLU rounds
// as the swiglu kernel does: the same bits as the two products and the swiglu launch.
//
// EARLY_STEPS: ring steps issued before the kernel waits (and so ahead of x's loads), 0 for all of
// the first RING - 1; the rest go out behind x's loads. Every kernel issues all of them first but
// the plain int2 one, which issues 1 (matvec_qd_body;
// benches/results/2026-11-27-h100-int2-column-slices.md).
// RING > 0 (DP only): the codes, scales and mins of the next RING - 1 steps stream into a ring in
// shared memory by cp.async (no registers held for loads in flight) instead of AHEAD steps of
// registers; the same sums. Layouts where each group is 1, 2 or 4 chunks, a row's groups a
// multiple of 8 and scales and mins 16-byte aligned (Gpu::ring_ok); q_smem reserves the ring.
//
// ADD (not GU; one column tile: tchunks covers the row): y[r] += the row's sum, a projection's
// residual add in its product (matvec_qd_*_add): the bits of the plain kernel then add_assign.
template <int KIND, int R, bool DP = false, int AHEAD = 1, bool GU = false, int RING = 0,
          int EARLY_STEPS = 0, bool ADD = false>
__device__ __forceinline__ void matvec_q_body(const Mat w, const float* __restrict__ x,
                                              const float* __restrict__ u,
                                              float* __restrict__ y, int split, int tchunks,
                                              const Mat wu = Mat()) {
    static_assert(!GU || DP, "the gate-up form is a dp4a kernel");
    static_assert(RING == 0 || (DP && RING >= 2), "the ring is a dp4a form of 2 or more steps");
    static_assert(KIND != KIND_INT3 || DP, "int3 is a dp4a kernel");
    static_assert(!ADD || !GU, "the residual add is a plain product's");
    pdl_trigger();
    constexpr int CC = QTraits<KIND>::CC, P = QTraits<KIND>::P, Q = CC / 4,
                  EPW = QTraits<KIND>::EPW;
    extern __shared__ float4 qsm[];
    // Chunks a row (int3: of its low bits, the first cols / 4 of its row_bytes).
    const int n = KIND == KIND_INT3 ? w.cols >> 6 : w.row_bytes >> 4;
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // split is a power of two (q_plan): shifts, and the tile count from a reciprocal
    // (ceil_div_small), so that no integer division delays the first weight load
    // (benches/results/2026-11-28-h200-x-staging-16bit.md).
    const int split_sh = __ffs(split) - 1;
    const int g = warp >> split_sh, s = warp - g * split;
    // Rows of a matrix per warp group (GU: slot i takes row i % RM of w, then of wu).
    constexpr int RM = GU ? R / 2 : R;
    const int tile_rows = (warps >> split_sh) * RM;
    const int ntiles = ceil_div_small(w.rows, tile_rows);
    if ((int)blockIdx.x >= ntiles) return;
    const int tpad = (tchunks + 31) & ~31;
    float4* xs4 = qsm;
    float* sxp = reinterpret_cast<float*>(qsm + tpad * Q);
    // DP: the byte planes (qd_parts * S 16-byte words a chunk), then (2^e, sum) per chunk.
    u32* xq = reinterpret_cast<u32*>(qsm);
    float2* xsx = reinterpret_cast<float2*>(qsm + tpad * QD_PARTS * QDTraits<KIND>::S);
    float* red = DP ? reinterpret_cast<float*>(xsx + tpad) : sxp + tpad * P;  // [2][warps][R]
    int* wsm = reinterpret_cast<int*>(red + 2 * warps * R);  // [2][warps]
    // RING: this warp's RING steps of RSB bytes after wsm (16-byte aligned): codes [R][32 lanes]
    // of 16 bytes, then per row 64 bytes of scales and 64 of mins (the step's 32 chunks' groups);
    // int3: then its high bits [R][32 lanes] of 8 bytes (at RHI).
    constexpr int RHI = R * 512 + R * 128;
    constexpr int RSB = RHI + (KIND == KIND_INT3 ? R * 256 : 0);
    // (An offset from qsm, not an integer round trip of the address, which would lose the shared
    // space and make the ring's reads generic loads.)
    const int ring_off =
        ((int)(reinterpret_cast<const char*>(wsm + 2 * warps) - reinterpret_cast<const char*>(qsm)) + 15) & ~15;
    u8* const ring = reinterpret_cast<u8*>(qsm) + ring_off + warp * RING * RSB;
    // (RING: groups of 1, 2 or 4 chunks, a power of two.)
    const int gpr = RING > 0 ? w.cols >> (__ffs(w.group) - 1) : w.cols / w.group;
    const bool fast = DP || KIND == KIND_INT8 || w.group % CC == 0;
    const int cpg = w.group / CC;
    const int cpg_shift = (cpg & (cpg - 1)) == 0 ? __ffs(cpg) - 1 : -1;
    // RING: the piece of a step's scales or mins this lane copies, fixed for the launch: row slot
    // ri_s, array (0 scales, 1 mins) and 16-byte piece pc_s of its 4 / cpg pieces; its place in a
    // ring slot, so_s. Lanes from R * pieces * arrays on copy none.
    const int ppr_s = RING > 0 ? 4 >> cpg_shift : 1, per_s = ppr_s * (KIND == KIND_INT8 ? 1 : 2);
    const bool lane_s = RING > 0 && lane < R * per_s;
    // (ppr_s and per_s are powers of two.)
    const int ppr_sh = RING > 0 ? 2 - cpg_shift : 0, per_sh = ppr_sh + (KIND == KIND_INT8 ? 0 : 1);
    const int ri_s = lane >> per_sh;
    const int a_s = (lane - ri_s * per_s) >> ppr_sh;
    const int pc_s = lane - ri_s * per_s - a_s * ppr_s;
    const int so_s = R * 512 + (ri_s * 2 + a_s) * 64 + pc_s * 16;
    const int step = 32 * split, c0 = s * 32 + lane;
    int parity = 0;

    for (int ct0 = 0; ct0 < n; ct0 += tchunks) {
        const int tn = min(tchunks, n - ct0);
        const int ksteps = (tn + step - 1) >> (5 + split_sh);
        // The rows' code and scale bases of the tile being loaded, set once per tile.
        const uint4* lrow[R];
        const uint2* lhrow[R];  // int3: the rows' high bits
        int lsrow[R];
        int lr[R];  // int4k: the rows (their pairs, loads in registers)
        const unsigned short* lsrc = nullptr;  // RING: this lane's scale or min piece, the tile's row
        int ltile = -1;
        auto set_tile = [&](int t) {
            if (t != ltile) {
                ltile = t;
#pragma unroll
                for (int i = 0; i < R; i++) {
                    const int r = min(t * tile_rows + g * RM + i % RM, w.rows - 1);
                    const u8* codes = GU && i >= RM ? wu.codes : w.codes;
                    lrow[i] = reinterpret_cast<const uint4*>(codes + (size_t)r * w.row_bytes) + ct0;
                    if (KIND == KIND_INT3)
                        lhrow[i] = reinterpret_cast<const uint2*>(codes + (size_t)r * w.row_bytes + (w.cols >> 2)) + ct0;
                    lsrow[i] = r * gpr;
                    lr[i] = r;
                }
                if (lane_s) {
                    const bool up = GU && ri_s >= RM;
                    const int r = min(t * tile_rows + g * RM + ri_s % RM, w.rows - 1);
                    const unsigned short* base = a_s == 0 ? (up ? wu.scales : w.scales) : (up ? wu.mins : w.mins);
                    // (int4k's mins lanes: the row's pair, its two f16.)
                    lsrc = KIND == KIND_INT4K && a_s == 1 ? base + 2 * (size_t)r
                                                          : base + (size_t)r * gpr + (ct0 >> cpg_shift) + 8 * pc_s;
                }
            }
        };
        auto load = [&](QBuf<R>& b, int t, int k) {
            set_tile(t);
            const int c = c0 + k * step;
            const bool in = c < tn;
            const int cg = ct0 + c;
            const int gi = fast ? (cpg_shift >= 0 ? cg >> cpg_shift : cg / cpg) : 0;
#pragma unroll
            for (int i = 0; i < R; i++) {
                b.v[i] = in ? qld(lrow[i] + c) : make_uint4(0, 0, 0, 0);
                if (KIND == KIND_INT3) b.h[i] = in ? qld2(lhrow[i] + c) : make_uint2(0, 0);
                u32 sm = 0;
                if (fast && in) {
                    const bool up = GU && i >= RM;
                    if (KIND == KIND_MXFP4) {
                        // One E8M0 byte a chunk (group), a row's after the row before's.
                        sm = __ldg(reinterpret_cast<const u8*>(up ? wu.scales : w.scales) + lsrow[i] + gi);
                    } else if (KIND == KIND_INT4K) {
                        sm = int4k_sm(up ? wu : w, (size_t)lsrow[i] + gi, lr[i]);
                    } else {
                        sm = __ldg((up ? wu.scales : w.scales) + lsrow[i] + gi);
                    }
                    if (!qd_signed<KIND>() && KIND != KIND_INT4K) sm |= (u32)__ldg((up ? wu.mins : w.mins) + lsrow[i] + gi) << 16;
                }
                b.sm[i] = sm;
            }
        };
        // RING: step (t, k)'s codes, scales and mins into ring slot `slot` as one committed group
        // (an empty group past the last tile, so that every step commits one). Lane l copies its
        // chunk of each row; the step's scales and mins (32 / cpg groups a row, 4 / cpg pieces of
        // 16 bytes per array) go one piece a lane; bytes past the column tile are zero-filled.
        auto issue = [&](int slot, int t, int k) {
            if (RING > 0 && t < ntiles) {
                set_tile(t);
                u8* st = ring + slot * RSB;
                const int c = c0 + k * step;
                // Past the column tile: 0 bytes from its last chunk (an address in the row).
                const int cl = min(c, tn - 1), nb = c < tn ? 16 : 0;
                u8* dst = st + lane * 16;
#pragma unroll
                for (int i = 0; i < R; i++) cp_async16z(dst + i * 512, lrow[i] + cl, nb);
                if (KIND == KIND_INT3) {
#pragma unroll
                    for (int i = 0; i < R; i++) cp_async8z(st + RHI + (i * 32 + lane) * 8, lhrow[i] + cl, nb / 2);
                }
                if (KIND == KIND_INT4K && lane_s && a_s == 1) {
                    // The row's pair where int4's step keeps its mins (fetch reads it there).
                    if (pc_s == 0) cp_async4(st + so_s, lsrc);
                } else if (lane_s) {
                    const int cb = s * 32 + k * step;  // the warp's first chunk of the step
                    if (cb + 32 <= tn) {
                        cp_async16z(st + so_s, lsrc + (cb >> cpg_shift), 16);
                    } else {
                        const int vg = min(max((tn - cb + cpg - 1) >> cpg_shift, 0), 32 >> cpg_shift);
                        const int bytes = min(max(vg * 2 - 16 * pc_s, 0), 16);
                        cp_async16z(st + so_s, bytes > 0 ? lsrc + (cb >> cpg_shift) : lsrc, bytes);
                    }
                }
            }
            cp_async_commit();
        };
        // RING: slot `slot`'s step as a QBuf (after its group completed and the warp synced).
        auto fetch = [&](QBuf<R>& b, int slot) {
            const u8* st = ring + slot * RSB;
            const int gl = lane >> cpg_shift;
#pragma unroll
            for (int i = 0; i < R; i++) {
                b.v[i] = *reinterpret_cast<const uint4*>(st + (i * 32 + lane) * 16);
                if (KIND == KIND_INT3) b.h[i] = *reinterpret_cast<const uint2*>(st + RHI + (i * 32 + lane) * 8);
                const unsigned short* sp = reinterpret_cast<const unsigned short*>(st + R * 512 + i * 128);
                u32 sm = sp[gl];
                if (KIND == KIND_INT4K) sm = int4k_ab(sm, *reinterpret_cast<const u32*>(sp + 32));
                else if (KIND != KIND_INT8) sm |= (u32)sp[32 + gl] << 16;
                b.sm[i] = sm;
            }
        };
        // A ring of AHEAD + 1 buffers: step (t, k) computes from one while the next AHEAD steps
        // load into the others ((lt, lk): the last step loaded).
        QBuf<R> b0, b1, b2;
        int t = blockIdx.x, k = 0, lt = t, lk = 0;
        // RING: steps 1 .. RING - 2 into their slots (step 0 is issued before the wait).
        auto issue_first = [&](int j0, int j1) {
#pragma unroll
            for (int j = 1; j < RING - 1; j++) {
                if (j < j0 || j >= j1) continue;
                int nt, nk;
                next_step(lt, lk, ksteps, nt, nk);
                lt = nt;
                lk = nk;
                issue(j, lt, lk);
            }
        };
        constexpr int EARLY = EARLY_STEPS == 0 || EARLY_STEPS > RING - 1 ? RING - 1 : EARLY_STEPS;
        if (RING > 0) {
            // Steps 0 .. EARLY - 1 before the wait and x's staging, the rest of the first RING - 1
            // behind x's loads.
            issue(0, t, k);
            issue_first(1, EARLY);
        } else {
            load(b0, t, k);
        }
        if (RING == 0 && AHEAD == 2) {
            int nt, nk;
            next_step(lt, lk, ksteps, nt, nk);
            lt = nt;
            lk = nk;
            if (lt < ntiles) load(b1, lt, lk);
        }
        pdl_wait();  // the first codes are loading; x may come from the kernel before
        const float* xt = x + (size_t)ct0 * CC;
        const float* ut = u ? u + (size_t)ct0 * CC : nullptr;
        float kscale = 1.f;
        if (DP) {
            qdstage<KIND, (RING > 0 ? 2 : 1)>(xt, ut, tn, xq, xsx, [&] {
                if (RING > 0) issue_first(EARLY, RING - 1);
            });
        } else {
            kscale = qstage<KIND>(xt, ut, tn, xs4, sxp, wsm);
        }
        float racc[R];
#pragma unroll
        for (int i = 0; i < R; i++) racc[i] = 0.f;
        // Compute step (t, k) from `cur` and move on; false when no step is left.
        auto compute = [&](const QBuf<R>& cur) -> bool {
            int nk, nt;
            next_step(t, k, ksteps, nt, nk);
            const int c = c0 + k * step;
            if (DP && c < tn) {
                constexpr int S = QDTraits<KIND>::S, PP = QD_PARTS;
                int a[PP][R];
#pragma unroll
                for (int p = 0; p < PP; p++)
#pragma unroll
                    for (int i = 0; i < R; i++) a[p][i] = 0;
#pragma unroll
                for (int wd = 0; wd < 4; wd++) {
                    u32 xp[PP][S];
#pragma unroll
                    for (int p = 0; p < PP; p++) qd_load<S>(xq + qd_at<KIND>(c, p, wd), xp[p]);
#pragma unroll
                    for (int i = 0; i < R; i++) {
                        const u32 wv = qword(cur.v[i], wd);
#pragma unroll
                        for (int s = 0; s < S; s++) {
                            u32 cd = qd_codes<KIND>(wv, s);
                            if (KIND == KIND_INT3) cd |= qd_hi3(cur.h[i], wd, s);
                            a[0][i] = qd_dot<KIND, true>(cd, xp[0][s], a[0][i]);
#pragma unroll
                            for (int p = 1; p < PP; p++) a[p][i] = qd_dot<KIND, false>(cd, xp[p][s], a[p][i]);
                        }
                    }
                }
                const float2 es = xsx[c];
#pragma unroll
                for (int i = 0; i < R; i++) {
                    // MXFP4: the doubled codes' scale 2^(e - 128) (exact; the products are too).
                    const float sc = KIND == KIND_MXFP4 ? mx_half_scale(cur.sm[i])
                                                        : h2f((half_bits)(cur.sm[i] & 0xffff));
                    const float d = qd_sum<PP, R>(a, i) * es.x;
                    if (qd_signed<KIND>()) {
                        racc[i] = fmaf(sc, d, racc[i]);
                    } else {
                        const float mn = h2f((half_bits)(cur.sm[i] >> 16));
                        racc[i] = fmaf(sc, d, fmaf(mn, es.y, racc[i]));
                    }
                }
            } else if (!DP && c < tn) {
                const float4* xb = xs4 + (c >> 5) * Q * 32 + lane;
                if (fast) {
                    float a[R];
#pragma unroll
                    for (int i = 0; i < R; i++) a[i] = 0.f;
#pragma unroll
                    for (int wd = 0; wd < 4; wd++) {
                        float xv[EPW];
                        x_word<EPW>(xb, wd, xv);
#pragma unroll
                        for (int i = 0; i < R; i++) a[i] = qword_dot<KIND>(qword(cur.v[i], wd), xv, a[i]);
                    }
                    float sx;
                    if (P == 4) {
                        const float4 p4 = reinterpret_cast<const float4*>(sxp)[c];
                        sx = (p4.x + p4.y) + (p4.z + p4.w);
                    } else if (P == 2) {
                        const float2 p2 = reinterpret_cast<const float2*>(sxp)[c];
                        sx = p2.x + p2.y;
                    } else {
                        sx = sxp[c];
                    }
#pragma unroll
                    for (int i = 0; i < R; i++) {
                        const float sc = h2f((half_bits)(cur.sm[i] & 0xffff));
                        if (KIND == KIND_INT8) {
                            racc[i] = fmaf(sc, fmaf(-128.f, sx, a[i]), racc[i]);
                        } else {
                            const float mn = h2f((half_bits)(cur.sm[i] >> 16));
                            racc[i] = fmaf(sc, a[i], fmaf(mn, sx, racc[i]));
                        }
                    }
                } else {
                    // A chunk spans groups: scale per 16-column piece.
                    constexpr int WPP = 16 / EPW;  // words per piece
#pragma unroll
                    for (int p = 0; p < P; p++) {
                        float a[R];
#pragma unroll
                        for (int i = 0; i < R; i++) a[i] = 0.f;
#pragma unroll
                        for (int wp = 0; wp < WPP; wp++) {
                            const int wd = p * WPP + wp;
                            float xv[EPW];
                            x_word<EPW>(xb, wd, xv);
#pragma unroll
                            for (int i = 0; i < R; i++) a[i] = qword_dot<KIND>(qword(cur.v[i], wd), xv, a[i]);
                        }
                        const float sx = sxp[c * P + p];
                        const int gi = ((ct0 + c) * CC + 16 * p) / w.group;
#pragma unroll
                        for (int i = 0; i < R; i++) {
                            const int r = min(t * tile_rows + g * R + i, w.rows - 1);
                            const size_t si = (size_t)r * gpr + gi;
                            if (KIND == KIND_INT2K) {
                                const u32 sm = int2k_sm(w, si, r);
                                const float sc = h2f((half_bits)(sm & 0xffffu));
                                racc[i] = fmaf(sc, a[i], fmaf(h2f((half_bits)(sm >> 16)), sx, racc[i]));
                                continue;
                            }
                            const float sc = h2f(__ldg(w.scales + si));
                            if (KIND == KIND_INT8) {
                                racc[i] = fmaf(sc, fmaf(-128.f, sx, a[i]), racc[i]);
                            } else {
                                racc[i] = fmaf(sc, a[i], fmaf(h2f(__ldg(w.mins + si)), sx, racc[i]));
                            }
                        }
                    }
                }
            }
            if (nk == 0) {
                // Tile t done: its rows' sums, in a fixed order.
                const float v = qreduce<R>(racc, lane);
                const int ri = lane / (32 / R);
                const bool writer = (lane & (32 / R - 1)) == 0;
                if (split == 1) {
                    if (GU) {
                        // Slot ri (gate) and slot ri + RM (up) of a row: up's sum is (32 / R) RM
                        // lanes higher.
                        const float uv = __shfl_down_sync(0xffffffffu, v, (32 / R) * RM);
                        const int r = t * tile_rows + g * RM + ri;
                        if (writer && ri < RM && r < w.rows) y[r] = silu_mul(v, uv);
                    } else {
                        const int r = t * tile_rows + g * R + ri;
                        if (writer && r < w.rows) {
                            const float o = v * kscale;
                            y[r] = ct0 > 0 || ADD ? y[r] + o : o;
                        }
                    }
                } else {
                    float* rb = red + parity * warps * R;
                    if (writer) rb[warp * R + ri] = v;
                    __syncthreads();
                    const int r = t * tile_rows + g * RM + lane;
                    if (s == 0 && lane < RM && r < w.rows) {
                        // Each row's sum: 0 + the warps' in order (GU: gate's slot and up's).
                        float sum = 0.f, us = 0.f;
                        for (int ss = 0; ss < split; ss++) {
                            sum += rb[(g * split + ss) * R + lane];
                            if (GU) us += rb[(g * split + ss) * R + lane + RM];
                        }
                        if (GU) {
                            y[r] = silu_mul(sum, us);
                        } else {
                            const float o = sum * kscale;
                            y[r] = ct0 > 0 || ADD ? y[r] + o : o;
                        }
                    }
                    parity ^= 1;
                }
#pragma unroll
                for (int i = 0; i < R; i++) racc[i] = 0.f;
            }
            t = nt;
            k = nk;
            return t < ntiles;
        };
        // One step: load the step after (lt, lk) into `fill`, compute (t, k) from `cur`.
        auto run = [&](const QBuf<R>& cur, QBuf<R>& fill) -> bool {
            int nk, nt;
            next_step(lt, lk, ksteps, nt, nk);
            lt = nt;
            lk = nk;
            if (lt < ntiles) load(fill, lt, lk);
            return compute(cur);
        };
        if (RING > 0) {
            // Step j: issue step j + RING - 1 into the slot step j - 1 used, wait for step j's
            // group (RING - 1 may stay pending), compute from its slot. The warp syncs make the
            // other lanes' copies (scales) visible, and keep a slot until every lane read it.
            int slot = 0;
            bool more = true;
            while (more) {
                int nk, nt;
                next_step(lt, lk, ksteps, nt, nk);
                lt = nt;
                lk = nk;
                issue(slot == 0 ? RING - 1 : slot - 1, lt, lk);
                cp_async_wait<RING - 1>();
                __syncwarp();
                fetch(b0, slot);
                __syncwarp();
                more = compute(b0);
                slot = slot == RING - 1 ? 0 : slot + 1;
            }
            cp_async_wait<0>();
            __syncwarp();
        } else if (AHEAD == 2) {
            while (run(b0, b2) && run(b1, b0) && run(b2, b1)) {
            }
        } else {
            while (run(b0, b1) && run(b1, b0)) {
            }
        }
    }
}

// The plain and routed-expert (_sel) kernels of one integer family for int8, int4 and int2:
// PREFIX##_int8 ... PREFIX##_int2_sel, the plain ones LBODY<kind, ARG>, the _sel ones
// BODY<kind, ARG>. A _sel kernel runs with its plain kernel's launch plan (Gpu::sel_supports):
// SEL_ATTR bounds its registers to the largest block a plan takes (512 threads), which its SwiGLU
// staging would otherwise exceed for int8.
#define INT_MATVEC_KERNELS(PREFIX, BODY, LBODY, ARG, ATTR, SEL_ATTR)                                  \
    extern "C" __global__ void ATTR PREFIX##_int8(const Mat w, const float* x, float* y, int split,   \
                                                  int tchunks) {                                      \
        LBODY<KIND_INT8, ARG>(w, x, nullptr, y, split, tchunks);                                       \
    }                                                                                                 \
    extern "C" __global__ void ATTR PREFIX##_int4(const Mat w, const float* x, float* y, int split,   \
                                                  int tchunks) {                                      \
        LBODY<KIND_INT4, ARG>(w, x, nullptr, y, split, tchunks);                                       \
    }                                                                                                 \
    extern "C" __global__ void ATTR PREFIX##_int2(const Mat w, const float* x, float* y, int split,   \
                                                  int tchunks) {                                      \
        LBODY<KIND_INT2, ARG>(w, x, nullptr, y, split, tchunks);                                       \
    }                                                                                                 \
    extern "C" __global__ void SEL_ATTR PREFIX##_int8_sel(SEL_ARGS, int split, int tchunks) {         \
        sel_entry(which0);                                                                            \
        BODY<KIND_INT8, ARG>(sel_mat(tab, routes, k, which0), SEL_X, SEL_U, SEL_Y, split, tchunks);   \
    }                                                                                                 \
    extern "C" __global__ void SEL_ATTR PREFIX##_int4_sel(SEL_ARGS, int split, int tchunks) {         \
        sel_entry(which0);                                                                            \
        BODY<KIND_INT4, ARG>(sel_mat(tab, routes, k, which0), SEL_X, SEL_U, SEL_Y, split, tchunks);   \
    }                                                                                                 \
    extern "C" __global__ void SEL_ATTR PREFIX##_int2_sel(SEL_ARGS, int split, int tchunks) {         \
        sel_entry(which0);                                                                            \
        BODY<KIND_INT2, ARG>(sel_mat(tab, routes, k, which0), SEL_X, SEL_U, SEL_Y, split, tchunks);   \
    }

// R = 4 rows per warp, one chunk position per step (benches/results/2026-11-22-h100-int-matvec.md).
INT_MATVEC_KERNELS(matvec_q, matvec_q_body, matvec_q_body, 4, , __launch_bounds__(512))

// int2k (kind 9): int2's scalar loop, its 16-value groups a 16-column piece each (the loop's
// path for chunks that span groups), each piece's scale and min from int2k_sm. Plain and routed.
extern "C" __global__ void __launch_bounds__(512)
    matvec_q_int2k(const Mat w, const float* x, float* y, int split, int tchunks) {
    matvec_q_body<KIND_INT2K, 4>(w, x, nullptr, y, split, tchunks);
}
extern "C" __global__ void __launch_bounds__(512) matvec_q_int2k_sel(SEL_ARGS, int split, int tchunks) {
    sel_entry(which0);
    matvec_q_body<KIND_INT2K, 4>(sel_mat(tab, routes, k, which0), SEL_X, SEL_U, SEL_Y, split, tchunks);
}

// The integer-dot-product kernels (matvec_qd_*), for layouts whose groups are whole chunks.
// LONE: a plain kernel, whose int2 form issues one ring step before it waits (matvec_q_body).
template <int KIND, int R, bool LONE = false, bool ADD = false>
__device__ __forceinline__ void matvec_qd_body(const Mat w, const float* __restrict__ x,
                                               const float* __restrict__ u,
                                               float* __restrict__ y, int split, int tchunks) {
    constexpr int EARLY = LONE && KIND == KIND_INT2 ? 1 : 0;
    matvec_q_body<KIND, R, true, (int)QDTraits<KIND>::AHEAD, false, QD_RING_OF(KIND), EARLY, ADD>(
        w, x, u, y, split, tchunks);
}
template <int KIND, int R>
__device__ __forceinline__ void matvec_qd_lone_body(const Mat w, const float* x, const float* u,
                                                    float* y, int split, int tchunks) {
    matvec_qd_body<KIND, R, true>(w, x, u, y, split, tchunks);
}
INT_MATVEC_KERNELS(matvec_qd, matvec_qd_body, matvec_qd_lone_body, 4, , __launch_bounds__(512))

// y += W x (the plain dp4a kernels' residual-add form, matvec_q_body ADD): Backend::matmul_add of
// a decode token where x is one column tile. int4 and int2 with loads in registers likewise (_r).
#define QD_ADD_KERNEL(NAME, KIND, AHEAD, RING, EARLY)                                               \
    extern "C" __global__ void __launch_bounds__(512)                                               \
        NAME(const Mat w, const float* x, float* y, int split, int tchunks) {                       \
        matvec_q_body<KIND, 4, true, (int)(AHEAD), false, RING, EARLY, true>(w, x, nullptr, y, split,\
                                                                      tchunks);                     \
    }
QD_ADD_KERNEL(matvec_qd_int8_add, KIND_INT8, QDTraits<KIND_INT8>::AHEAD, QD_RING_OF(KIND_INT8), 0)
QD_ADD_KERNEL(matvec_qd_int4_add, KIND_INT4, QDTraits<KIND_INT4>::AHEAD, QD_RING_OF(KIND_INT4), 0)
QD_ADD_KERNEL(matvec_qd_int2_add, KIND_INT2, QDTraits<KIND_INT2>::AHEAD, QD_RING_OF(KIND_INT2), 1)

// Three products of one x in one launch (a decode token's k, v and q, Gpu::matvec3_int):
// blockIdx.y = j takes w_j, y_j and split_j, each row summed as its plain kernel sums it with its
// own plan (the same split and column tiles: the same bits); the grid's x is the largest plan's (a
// block walks its matrix's tiles; past them it returns). Launched k and v first, so that their
// few blocks are not queued behind q's.
#define QD3_KERNEL(NAME, KIND)                                                                      \
    extern "C" __global__ void __launch_bounds__(512)                                               \
        NAME(const Mat w0, const Mat w1, const Mat w2, const float* x, float* y0, float* y1,        \
             float* y2, int s0, int s1, int s2, int tchunks) {                                      \
        const int j = blockIdx.y;                                                                   \
        matvec_qd_body<KIND, 4>(j == 0 ? w0 : j == 1 ? w1 : w2, x, nullptr,                         \
                                j == 0 ? y0 : j == 1 ? y1 : y2, j == 0 ? s0 : j == 1 ? s1 : s2,     \
                                tchunks);                                                           \
    }
QD3_KERNEL(matvec_qd_int8_3, KIND_INT8)
QD3_KERNEL(matvec_qd_int4_3, KIND_INT4)
QD3_KERNEL(matvec_qd_int2_3, KIND_INT2)

// Gate and up of a token's k routed experts with their SwiGLU, one launch (blockIdx.y = j: expert
// routes[j], gate and up from the table as sel_mat reads them): y + j * ys = SwiGLU(gate x, up x),
// the bits of the _sel launch of both (which0 0) and the swiglu launch (matvec_q_body's GU). The
// launcher takes it where the plain plan's row groups split evenly and x fits one column tile
// (Gpu::routed_ffn). Ordering as a which0 = 0 routed launch (sel_entry).
// With a null table, one MLP's gate g and up u instead (k 1, a shared expert or a dense layer's
// MLP: Gpu::mlp_gate_up), ordered as a plain product (the body waits).
#define GU_ARGS                                                                                    \
    const MatEntry *tab, const float *routes, int k, const Mat g, const Mat u, const float *x,     \
        float *y, int ys
__device__ __forceinline__ Mat gu_mat(const MatEntry* tab, const float* routes, int k, int which,
                                      const Mat& m) {
    return tab ? sel_mat(tab, routes, k, which) : m;
}
#define QD_GU_KERNEL(NAME, KIND)                                                                    \
    extern "C" __global__ void __launch_bounds__(512) NAME(GU_ARGS, int split, int tchunks) {       \
        if (tab) sel_entry(0);                                                                      \
        matvec_q_body<KIND, 4, true, (int)QDTraits<KIND>::AHEAD, true, QD_RING_OF(KIND)>(          \
            gu_mat(tab, routes, k, 0, g), x, nullptr, y + (size_t)blockIdx.y * ys, split, tchunks,  \
            gu_mat(tab, routes, k, 1, u));                                                          \
    }
QD_GU_KERNEL(matvec_qd_int8_gu, KIND_INT8)
QD_GU_KERNEL(matvec_qd_int4_gu, KIND_INT4)
QD_GU_KERNEL(matvec_qd_int2_gu, KIND_INT2)

// Plain, routed and gate-up dp4a kernels of one kind with its own ring depth: NAME, NAME_sel,
// NAME_gu (AHEAD: register steps ahead where RING is 0; EARLY: the plain kernel's ring steps
// issued before it waits, matvec_q_body).
#define RING_KIND_KERNELS(NAME, KIND, AHEAD, RING, EARLY)                                           \
    extern "C" __global__ void __launch_bounds__(512)                                               \
        NAME(const Mat w, const float* x, float* y, int split, int tchunks) {                       \
        matvec_q_body<KIND, 4, true, AHEAD, false, RING, EARLY>(w, x, nullptr, y, split, tchunks);  \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(512) NAME##_sel(SEL_ARGS, int split, int tchunks) { \
        sel_entry(which0);                                                                          \
        matvec_q_body<KIND, 4, true, AHEAD, false, RING>(sel_mat(tab, routes, k, which0), SEL_X,    \
                                                         SEL_U, SEL_Y, split, tchunks);             \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(512) NAME##_gu(GU_ARGS, int split, int tchunks) {  \
        if (tab) sel_entry(0);                                                                      \
        matvec_q_body<KIND, 4, true, AHEAD, true, RING>(gu_mat(tab, routes, k, 0, g), x, nullptr,   \
                                                        y + (size_t)blockIdx.y * ys, split,         \
                                                        tchunks, gu_mat(tab, routes, k, 1, u));     \
    }

// int4 and int2 with loads in registers (no ring), for layouts `ring_ok` refuses on GPUs whose
// matvec_qd_* take a ring (rows of groups not a multiple of 8: Qwen3-MoE's and Phi-3.5-MoE's
// down); before sm_90 matvec_qd_* themselves are this form.
RING_KIND_KERNELS(matvec_qd_int4_r, KIND_INT4, 2, 0, 0)
RING_KIND_KERNELS(matvec_qd_int2_r, KIND_INT2, 1, 0, 0)
QD_ADD_KERNEL(matvec_qd_int4_r_add, KIND_INT4, 2, 0, 0)
QD_ADD_KERNEL(matvec_qd_int2_r_add, KIND_INT2, 1, 0, 0)

// int3 (kind 7) through the dp4a loop: int2's codes and staging, each code's high bit OR'ed in at
// bit 2 (qd_hi3), the chunk's 8 bytes of high bits loaded beside its 16 of low bits. Through the
// ring (QD_RING_INT3; the plain kernel issues one step before it waits, as int2's), and in
// registers (_r) for layouts the ring does not take.
RING_KIND_KERNELS(matvec_qd_int3, KIND_INT3, 1, QD_RING_INT3, 1)
RING_KIND_KERNELS(matvec_qd_int3_r, KIND_INT3, 1, 0, 0)

// int4k (kind 8) through int4's dp4a loop: each chunk's (scale, min) from its group's sub-scale
// bytes and its row's pair (int4k_ab). Through int4's ring (the row's pair copied into the step
// where int4's mins go), and in registers (_r) where `ring_ok` refuses.
RING_KIND_KERNELS(matvec_qd_int4k, KIND_INT4K, 2, QD_RING_INT4, 0)
RING_KIND_KERNELS(matvec_qd_int4k_r, KIND_INT4K, 2, 0, 0)

// MXFP4 (kind 6) through the dp4a loop: the codes as signed doubled e2m1 bytes (qd_codes), each
// chunk's E8M0 byte as its scale, no min, loads in registers (no ring). Plain and routed like the
// integer kinds' (no _gu form: gpt-oss's experts take their own activation).
extern "C" __global__ void __launch_bounds__(512)
    matvec_qd_mxfp4(const Mat w, const float* x, float* y, int split, int tchunks) {
    matvec_q_body<KIND_MXFP4, 4, true, (int)QDTraits<KIND_MXFP4>::AHEAD>(w, x, nullptr, y, split, tchunks);
}
extern "C" __global__ void __launch_bounds__(512) matvec_qd_mxfp4_sel(SEL_ARGS, int split, int tchunks) {
    sel_entry(which0);
    matvec_q_body<KIND_MXFP4, 4, true, (int)QDTraits<KIND_MXFP4>::AHEAD>(
        sel_mat(tab, routes, k, which0), SEL_X, SEL_U, SEL_Y, split, tchunks);
}
