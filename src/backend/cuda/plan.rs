//! Launch plans of the integer matvec kernels: how many warps a block, how a row's chunks are
//! split between warps, how much of x is staged at once, for a GPU's limits.

use super::*;

/// Shared memory an integer matvec block stages x into, at most (x of a column tile, scaled, and
/// its 16-column sums): 96 KiB holds 23k columns (Mixtral's 14336 take 61 KB in one tile).
const Q_XS_CAP: usize = 96 << 10;

/// Warps per block the integer matvec plans try, most first.
const Q_WARPS: [usize; 4] = [16, 12, 8, 4];

/// What an SM offers the integer matvec kernels.
#[derive(Clone, Copy, Debug)]
pub struct QLimits {
    pub sm_count: usize,
    /// Shared memory per SM, and what the hardware keeps per block out of it.
    pub smem_per_sm: usize,
    pub smem_reserved: usize,
    /// Dynamic shared memory a block may have (opted in at load: kernels.rs).
    pub smem_max: usize,
    pub regs_per_sm: usize,
    pub threads_per_sm: usize,
}

impl QLimits {
    /// Blocks of `block` threads at `regs` registers a thread that one wave holds on every SM
    /// (registers are allocated a warp at a time in units of 256).
    pub fn wave_blocks(&self, regs: usize, block: usize) -> usize {
        let warps = block.div_ceil(32).max(1);
        let per_warp = (regs.max(1) * 32).div_ceil(256) * 256;
        let per_sm =
            (self.regs_per_sm / (per_warp * warps)).min(self.threads_per_sm / (warps * 32));
        per_sm * self.sm_count
    }
}

/// The shape of an integer matvec kernel (matvec_qm.cu matvec_q_* or matvec_qm_*).
#[derive(Clone, Copy, Debug)]
pub struct QShape {
    /// Kind code: 3 int8, 4 int4, 5 int2, 6 mxfp4, 7 int3, 8 int4k, 9 int2k.
    pub kind: i32,
    /// Rows per warp: R for matvec_q_*, 16 for matvec_qm_* (an mma's rows).
    pub rows: usize,
    /// Registers per thread.
    pub regs: usize,
    /// The tensor-core kernel (matvec_qm_*): its quads (four 16-byte chunks of each of a warp's
    /// rows) per step, U. 0: the scalar kernel (matvec_q_*).
    pub quads: usize,
    /// The dp4a kernel (matvec_qd_*): x's byte planes (matvec_q_stage.cu QD_PARTS); 0 for the
    /// others.
    pub dp_parts: usize,
    /// The dp4a kernel's steps in its shared-memory ring (matvec_q_stage.cu QD_RING_*,
    /// matvec_q_body RING); 0: loads in registers (and for the other kernels).
    pub ring: usize,
}

/// matvec_qm_*'s U (cuda/*.cu).
pub const QM_QUADS_PER_STEP: usize = 2;

impl QShape {
    /// Columns per 16-byte chunk of codes (MXFP4, kind 6, and int4k, kind 8: int4's 32; int3,
    /// kind 7: int2's 64, its high bits beside; int2k, kind 9: int2's).
    fn chunk_cols(&self) -> usize {
        match self.kind {
            6 | 8 => 32,
            7 | 9 => 64,
            k => 16usize << (k - 3),
        }
    }

    /// The tensor-core kernel (matvec_qm_*).
    pub fn mma(&self) -> bool {
        self.quads > 0
    }

    /// The NMSE bound of this kernel's products against the CPU backend (cuda/README.md): 1e-8
    /// for the dp4a kernels (x rounded to 16 bits of its chunk's largest |x|), 1e-10 where the
    /// products are exact and only the summation order differs.
    pub fn nmse_bound(&self) -> f64 {
        if self.dp_parts > 0 {
            1e-8
        } else {
            1e-10
        }
    }

    /// Chunks of a row a warp reads per step: one per lane (matvec_q_*), or U quads.
    pub fn step_chunks(&self) -> usize {
        if self.mma() {
            4 * self.quads
        } else {
            32
        }
    }

    /// Shared memory per staged chunk of x.
    fn staged_per_chunk(&self) -> usize {
        let cc = self.chunk_cols();
        if self.mma() {
            // Two f16 parts per column, the chunk's sum, and its quad's scale (4 bytes a quad).
            cc * 4 + 4 + 1
        } else if self.dp_parts > 0 {
            // A byte per column per plane, and the chunk's power of two and sum.
            cc * self.dp_parts + 8
        } else {
            // The scaled f32 x, and its 16-column sums.
            cc * 4 + cc / 16 * 4
        }
    }
}

/// Dynamic shared memory of an integer matvec block (the layouts at the top of matvec_q.cu's
/// matvec_q_body and matvec_qm_body): staged x for `tchunks` chunks (padded to 32), then the
/// warps' partial sums (two tiles) and flags, then (from a 16-byte boundary) each warp's ring of
/// `ring` steps: a chunk of each of its rows a lane, and 128 bytes of scales and mins a row (int3:
/// and 8 bytes of high bits a lane a row).
pub fn q_smem(k: &QShape, warps: usize, tchunks: usize) -> usize {
    let tpad = tchunks.div_ceil(32) * 32;
    let staged = tpad * k.staged_per_chunk();
    if k.mma() {
        staged + 2 * warps * 16 * 4
    } else {
        let sums = staged + 2 * warps * k.rows * 4 + 2 * warps * 4;
        if k.ring > 0 {
            // int3 (kind 7): each step's high bits too, 8 bytes a lane a row.
            let hi = if k.kind == 7 { k.rows * 256 } else { 0 };
            sums.next_multiple_of(16) + warps * k.ring * (k.rows * 512 + k.rows * 128 + hi)
        } else {
            sums
        }
    }
}

/// Whether the ring form of the dp4a kernels (QShape::ring) takes `w`: its groups are 1, 2 or 4
/// chunks (a step's 32 chunks then have whole 16-byte pieces of scales and mins), its rows' groups
/// a multiple of 8 and its scales and mins 16-byte aligned (matvec_q.cu matvec_q_body's `issue`).
pub fn ring_ok(w: &DevMat) -> bool {
    // (int4k, kind 8: int4's 32 columns a chunk; its mins are the rows' pairs, 16-byte aligned.)
    let cc = if w.is_int4k() {
        32
    } else {
        16 << (w.kind - 3).clamp(0, 2)
    };
    let cpg = if w.group > 0 && w.group % cc == 0 {
        w.group / cc
    } else {
        0
    };
    let gpr = if w.group > 0 { w.cols / w.group } else { 0 };
    matches!(cpg, 1 | 2 | 4)
        && gpr > 0
        && gpr % 8 == 0
        && w.scales.is_multiple_of(16)
        && (w.kind == 3 || w.mins.is_multiple_of(16))
}

/// How an integer matvec is launched: matvec_qm.cu matvec_q_* (w, x, y, split, tchunks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QPlan {
    pub grid: u32,
    pub block: u32,
    pub smem: u32,
    /// Warps sharing a row group (each takes a slice of the row's chunks): a power of two (the
    /// kernels shift by it).
    pub split: i32,
    /// 16-byte chunks per column tile (x is staged one tile at a time).
    pub tchunks: i32,
    /// Blocks of this plan the GPU holds at once (the grid's cap).
    pub cap: u32,
}

impl QPlan {
    /// The grid's x for `ny` matrices of `rows` rows in one routed launch (blockIdx.y: the
    /// matrix), `rm` rows a warp (R, or R / 2 for the gate-up form): every row tile of every
    /// matrix its own block while they fit the GPU at once, else the cap shared out (a block
    /// loops over its matrix's tiles, so any grid gives the same sums). Dividing the one-matrix
    /// grid by ny left small experts' tiles queued behind a few blocks
    /// (benches/results/2026-12-02-h200-issue50-routed-grid.md); the share rounds down, as a
    /// few blocks past the cap wait for a second wave that doubles the launch
    /// (benches/results/2026-12-06-h100-issue53-routed-wave.md).
    pub fn routed_grid(&self, rows: usize, rm: usize, ny: usize) -> u32 {
        let warps = self.block as usize / 32;
        let groups = (warps >> self.split.trailing_zeros()).max(1);
        let tiles = rows.div_ceil(groups * rm.max(1)).max(1);
        let share = (self.cap as usize / ny.max(1)).max(1);
        tiles.min(share) as u32
    }
}

/// Plan an integer matvec of `rows` rows of `row_bytes` bytes (a multiple of 16) for kernel `k`:
/// the most warps per block whose shared memory holds the whole x (else the most that hold a tile
/// of 32 chunks), a grid of as many blocks as the SMs take at once, each looping over tiles of
/// rows, and the `split` with the fewest steps for the busiest block, a tile counting one step more
/// (its reduction; near the best split and block size for Mixtral's shapes:
/// benches/results/2026-11-22-h100-int-matvec.md); the smallest split on a tie. None where no
/// block fits the GPU's shared memory (matvec_any then).
pub fn q_plan(k: &QShape, rows: usize, row_bytes: usize, lim: &QLimits) -> Option<QPlan> {
    let n = (row_bytes / 16).max(1);
    let per_chunk = k.staged_per_chunk();
    // A block's registers (allocated per warp in units of 256) must fit an SM's.
    let regs_per_warp = (k.regs.max(1) * 32).div_ceil(256) * 256;
    let ok = |warps: usize, t: usize| {
        q_smem(k, warps, t) <= lim.smem_max
            && t * per_chunk <= Q_XS_CAP
            && regs_per_warp * warps <= lim.regs_per_sm
    };
    let fit = |warps: usize| -> Option<usize> {
        if ok(warps, n) {
            return Some(n);
        }
        (1..)
            .map(|i| 32 * i)
            .take_while(|&t| t < n && ok(warps, t))
            .last()
    };
    let (warps, tchunks) = Q_WARPS
        .iter()
        .find_map(|&w| fit(w).filter(|&t| t == n).map(|t| (w, t)))
        .or_else(|| Q_WARPS.iter().find_map(|&w| fit(w).map(|t| (w, t))))?;
    let smem = q_smem(k, warps, tchunks);
    let block = 32 * warps;
    let per_sm = (lim.regs_per_sm / (regs_per_warp * warps))
        .min(lim.threads_per_sm / block)
        .min(lim.smem_per_sm / (smem + lim.smem_reserved))
        .max(1);
    let cap = (lim.sm_count * per_sm).max(1);
    let tn = tchunks.min(n);
    let sc = k.step_chunks();
    let mut best: Option<(usize, usize, usize)> = None; // (cost, split, grid)
    for split in (0..5).map(|i| 1usize << i) {
        if warps % split != 0 || (split > 1 && sc * split > tn) {
            continue;
        }
        let tiles = rows.div_ceil(warps / split * k.rows).max(1);
        let grid = tiles.min(cap);
        let cost = tiles.div_ceil(grid) * (tn.div_ceil(sc * split) + 1);
        if best.is_none_or(|(c, _, _)| cost < c) {
            best = Some((cost, split, grid));
        }
    }
    let (_, split, grid) = best?;
    Some(QPlan {
        grid: grid as u32,
        block: block as u32,
        smem: smem as u32,
        split: split as i32,
        tchunks: tchunks as i32,
        cap: cap as u32,
    })
}

impl Gpu {
    /// The plan of an integer matvec (kind 3..=5, vectorizable) on this GPU, for the kernel
    /// `matvec` runs.
    pub fn q_plan(&self, w: &DevMat) -> Option<QPlan> {
        self.q_plan_for(self.q_kernels(w).0, w)
    }

    /// The plan of an integer matvec through kernel `q`.
    pub fn q_plan_for(&self, q: &QKernel, w: &DevMat) -> Option<QPlan> {
        q_plan(
            &q.shape,
            w.rows.max(0) as usize,
            w.chunk_bytes().max(0) as usize,
            &self.q_limits,
        )
    }

    /// The plan of a routed launch (`q`: a _sel or _gu kernel) of matrices like `w`: the plain
    /// kernel's block, split and column tiles (each row's sum is the plain kernel's), with `q`'s
    /// own shared memory (its ring may be deeper than the plain kernel's: QShape::ring). None
    /// where `q`'s registers or shared memory do not allow that block.
    pub fn routed_plan(&self, w: &DevMat, q: &QKernel) -> Option<QPlan> {
        let p = self.q_plan(w)?;
        let warps = p.block as usize / 32;
        let regs_per_warp = (q.shape.regs.max(1) * 32).div_ceil(256) * 256;
        let smem = q_smem(&q.shape, warps, p.tchunks as usize);
        let fits =
            regs_per_warp * warps <= self.q_limits.regs_per_sm && smem <= self.q_limits.smem_max;
        fits.then_some(QPlan {
            smem: smem as u32,
            ..p
        })
    }
}

/// Rows of fewer steps than this (a step: 32 chunks of 32 columns) keep a warp a tile on
/// matvec_c32.cu's loop; wider ones (Mixtral's 14336 columns: 14 steps) split a tile's steps.
const C32_SPLIT_STEPS: usize = 8;

/// The team of warps a tile of matvec_c32.cu's loop takes for `w` (its `c32_rows`): 1 for rows
/// of fewer than `C32_SPLIT_STEPS` steps, else the least power of two up to 8 that gives each
/// of the ~3 blocks of 8 warps an SM (`Gpu::c32_launch`) a tile. It depends on the matrix and
/// the GPU alone, so that a plain and a routed product of one matrix sum in one order.
pub fn c32_split(w: &DevMat, sm_count: usize) -> usize {
    let steps = (w.cols.max(0) as usize / 32).div_ceil(32);
    if steps < C32_SPLIT_STEPS {
        return 1;
    }
    // matvec_c32.cu's tile heights: ap8 above width 4 takes 2 rows a warp, the rest 4.
    let r = if w.is_ap8() && (w.row_bytes & 0xff) > 4 {
        2
    } else {
        4
    };
    let tiles = (w.rows.max(0) as usize).div_ceil(r).max(1);
    let warps = 3 * sm_count * 8;
    let mut split = 1;
    while split < 8 && tiles * split < warps {
        split *= 2;
    }
    split
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H100's figures (sm_90: 228 KB per SM, 1 KB kept per block, 227 KB per block).
    const H100: QLimits = QLimits {
        sm_count: 132,
        smem_per_sm: 233_472,
        smem_reserved: 1024,
        smem_max: 232_448,
        regs_per_sm: 65536,
        threads_per_sm: 2048,
    };

    /// One wave on the H100: 8 blocks of 256 threads an SM up to 32 registers, fewer above.
    #[test]
    fn a_wave_is_bounded_by_threads_and_registers() {
        assert_eq!(H100.wave_blocks(32, 256), 8 * 132);
        assert_eq!(H100.wave_blocks(64, 256), 4 * 132);
        assert_eq!(H100.wave_blocks(65, 256), 3 * 132);
        assert_eq!(H100.wave_blocks(128, 256), 2 * 132);
    }

    /// The ring form takes exactly the layouts its copies can serve: groups of 1, 2 or 4 chunks, a
    /// multiple of 8 groups a row, 16-byte aligned scales and mins (int8 has no mins).
    #[test]
    fn ring_takes_whole_pieces_of_scales_only() {
        let m = |kind: i32, cols: i32, group: i32, scales: u64, mins: u64| DevMat {
            codes: 0,
            scales,
            mins,
            rows: 64,
            cols,
            group,
            row_bytes: cols * [8, 4, 2][(kind - 3) as usize] / 8,
            kind,
            _pad: 0,
        };
        // Mixtral's defaults: int2/g64 (1 chunk a group), int4/g64 (2), int8/g64 (4).
        assert!(ring_ok(&m(5, 4096, 64, 1 << 20, 2 << 20)));
        assert!(ring_ok(&m(4, 14336, 64, 1 << 20, 2 << 20)));
        assert!(ring_ok(&m(3, 4096, 64, 1 << 20, 0)));
        // Groups splitting a chunk, or of 8 chunks.
        assert!(!ring_ok(&m(4, 4096, 16, 1 << 20, 2 << 20)));
        assert!(!ring_ok(&m(3, 4096, 128, 1 << 20, 0)));
        // 7 groups a row: a row's scales are not 16-byte aligned.
        assert!(!ring_ok(&m(5, 448, 64, 1 << 20, 2 << 20)));
        // Unaligned scales or mins.
        assert!(!ring_ok(&m(5, 4096, 64, (1 << 20) + 2, 2 << 20)));
        assert!(!ring_ok(&m(4, 4096, 64, 1 << 20, (2 << 20) + 8)));
    }

    /// Every plan gives the kernel the shared memory its layout needs, column tiles of whole warps
    /// of chunks, a split that divides the block's warps and leaves no warp without chunks, and no
    /// block without a tile.
    /// c32_split: tall shapes keep a warp a tile; wide rows take the least team that gives every
    /// warp of the launch a tile, at most 8.
    #[test]
    fn c32_splits_only_wide_rows_and_fill_the_warps() {
        let mat = |rows: i32, cols: i32, kind: i32, row_bytes: i32| DevMat {
            codes: 0,
            scales: 0,
            mins: 0,
            rows,
            cols,
            group: 16,
            row_bytes,
            kind,
            _pad: 0,
        };
        // Qwen3's and Mixtral's tall shapes keep a warp a tile (their sums unchanged).
        for (rows, cols) in [(768, 2048), (2048, 768), (14336, 4096), (4096, 4096)] {
            assert_eq!(
                c32_split(&mat(rows, cols, 9, cols / 4), 132),
                1,
                "{rows} x {cols}"
            );
        }
        // Mixtral's down: 1024 tiles of 4 rows for 3168 warps (132 SMs), 2048 of 2 at ap8@5.
        assert_eq!(c32_split(&mat(4096, 14336, 9, 3584), 132), 4);
        assert_eq!(c32_split(&mat(4096, 14336, 10, 3), 132), 4);
        assert_eq!(c32_split(&mat(4096, 14336, 10, 5), 132), 2);
        // Never past 8, and a tall wide matrix needs no team.
        assert_eq!(c32_split(&mat(8, 32768, 9, 8192), 132), 8);
        assert_eq!(c32_split(&mat(32768, 14336, 9, 3584), 132), 1);
    }

    /// A routed launch of small experts (Qwen3-MoE's 768 x 2048) gives every row tile of every
    /// matrix a block while the GPU holds them; of big ones (Mixtral's 14336 rows, gpt-oss's
    /// 2880) it shares the cap out, at most as many blocks in all as the GPU holds at once,
    /// never fewer than one a matrix.
    #[test]
    fn routed_grids_cover_small_experts_and_share_the_cap() {
        let k = QShape {
            kind: 4,
            rows: 4,
            regs: 96,
            quads: 0,
            dp_parts: 2,
            ring: 0,
        };
        for (rows, cols, ny) in [
            (768, 2048, 16),
            (2048, 768, 8),
            (14336, 4096, 4),
            (2880, 2880, 8),
            (5, 128, 8),
        ] {
            let p = q_plan(&k, rows, cols / 2, &H100).expect("a plan");
            let g = p.routed_grid(rows, 4, ny) as usize;
            let groups = p.block as usize / 32 / p.split as usize;
            let tiles = rows.div_ceil(groups * 4);
            let what = format!("[{rows}, {cols}] x {ny}: {p:?}, grid {g}, tiles {tiles}");
            assert!(g >= 1 && g <= tiles, "{what}");
            // One wave: never a block past the cap (unless the matrices alone are more).
            assert!(g * ny <= (p.cap as usize).max(ny), "{what}");
            assert!(g == tiles || (g + 1) * ny > p.cap as usize, "{what}");
        }
    }

    #[test]
    fn integer_matvec_plans_fit_the_kernel() {
        let limits = [
            H100,
            // Jetson Orin (sm_87) and the RTX 4090 (sm_89).
            QLimits {
                sm_count: 16,
                smem_per_sm: 167_936,
                smem_max: 166_912,
                ..H100
            },
            QLimits {
                sm_count: 128,
                smem_per_sm: 102_400,
                smem_max: 101_376,
                threads_per_sm: 1536,
                ..H100
            },
        ];
        let shapes = [
            (14336, 4096),
            (4096, 14336),
            (1, 64),
            (5, 128),
            (8203, 128),
            (4096, 28672),
            (333, 65536),
            (1536, 2048),
        ];
        for lim in &limits {
            for kind in [3, 4, 5, 7i32] {
                for &(rows, cols) in &shapes {
                    // (int3: the chunks of its low bits, as DevMat::chunk_bytes.)
                    let row_bytes = match kind {
                        7 => cols / 4,
                        k => cols * [8, 4, 2][(k - 3) as usize] / 8,
                    };
                    let n = row_bytes / 16;
                    for (r, regs, mma, dp_parts, ring) in [
                        (4, 128, false, 0, 0),
                        (2, 64, false, 0, 0),
                        (8, 168, false, 0, 0),
                        (16, 96, true, 0, 0),
                        (4, 128, false, 3, 0),
                        (4, 96, false, 2, 0),
                        // The shared-memory ring (QD_RING_*): a deep one must still fit.
                        (4, 96, false, 2, 4),
                        (4, 96, false, 1, 8),
                        // More than 128 registers: a 512-thread block cannot launch.
                        (4, 255, false, 0, 0),
                    ] {
                        // (int3's steps are 40% larger: its deepest ring here is 4, where sm_90 takes 3.)
                        if kind == 7 && ring > 4 {
                            continue;
                        }
                        let k = QShape {
                            kind,
                            rows: r,
                            regs,
                            quads: if mma { QM_QUADS_PER_STEP } else { 0 },
                            dp_parts,
                            ring,
                        };
                        let p = q_plan(&k, rows, row_bytes, lim).expect("a plan");
                        let (split, tchunks, warps) =
                            (p.split as usize, p.tchunks as usize, p.block as usize / 32);
                        let what = format!("kind {kind} [{rows}, {cols}] {k:?}: {p:?}");
                        assert_eq!(q_smem(&k, warps, tchunks), p.smem as usize, "{what}");
                        assert!(p.smem as usize <= lim.smem_max, "{what}");
                        assert!(tchunks == n || (tchunks % 32 == 0 && tchunks < n), "{what}");
                        // matvec_q.cu matvec_q_body shifts by the split (QD_NODIV).
                        assert!(split.is_power_of_two(), "{what}");
                        assert!(warps % split == 0 && p.block.is_multiple_of(32), "{what}");
                        assert!(
                            (regs * 32).div_ceil(256) * 256 * warps <= lim.regs_per_sm,
                            "{what}"
                        );
                        assert!(
                            split == 1 || k.step_chunks() * split <= tchunks.min(n),
                            "{what}"
                        );
                        let tiles = rows.div_ceil(warps / split * r);
                        assert!(p.grid >= 1 && p.grid as usize <= tiles, "{what}");
                    }
                }
            }
        }
        // Mixtral's expert shapes on the H100: x in one column tile, (nearly) every SM busy.
        for (kind, rows, row_bytes) in [(3, 14336, 4096), (4, 4096, 7168), (5, 14336, 1024)] {
            for (r, mma, dp_parts) in [(4, false, 0), (16, true, 0), (4, false, 3)] {
                let k = QShape {
                    kind,
                    rows: r,
                    regs: 128,
                    quads: if mma { QM_QUADS_PER_STEP } else { 0 },
                    dp_parts,
                    ring: 0,
                };
                let p = q_plan(&k, rows, row_bytes, &H100).expect("a plan");
                assert_eq!(p.tchunks as usize, row_bytes / 16);
                // 16-row tiles leave fewer tiles than SMs at some splits; the cost model may
                // take one of those.
                assert!(p.grid >= if mma { 100 } else { 128 }, "{p:?}");
            }
        }
    }
}
