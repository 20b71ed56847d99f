//! Launchers of the one-token products: plain matvecs, the routed experts' kernels (a table of
//! slots, the routes on the device), routing and the MoE block's fused launches.

use super::*;
use crate::model::routing::{Grouped, Routing, MAX_GROUPS};

/// A routing rule as the routing kernels take it (cuda/route.cu RULE_*): the rule and its eps, for
/// k routes of ne experts.
fn route_rule(routing: Routing, k: usize, ne: usize) -> crate::Result<(i32, f32)> {
    if k == 0 || k > 16 || k > ne {
        return Err(Error::Invalid(format!(
            "CUDA: routing to {k} of {ne} experts (the kernels take 1 to 16)"
        )));
    }
    Ok(match routing {
        Routing::Softmax { renormalize: true } => (0, 0.0),
        Routing::Softmax { renormalize: false } => (1, 0.0),
        Routing::SparseMixer { jitter_eps } if k == 2 => (2, jitter_eps),
        Routing::SparseMixer { .. } => {
            return Err(Error::Invalid(format!(
                "CUDA: sparsemixer routing picks 2 experts, not {k}"
            )))
        }
        Routing::TopkSoftmax => (3, 0.0),
        // route.cu RULE_GROUPED's word, taken by the fused router kernels alone.
        Routing::Grouped { rule: g, .. } if grouped_on_device(ne, g) => (
            4 | i32::from(g.softmax) << 4
                | i32::from(g.renormalize) << 5
                | (g.groups as i32) << 8
                | (g.topk_groups as i32) << 16,
            g.scale,
        ),
        Routing::Grouped { .. } => {
            return Err(Error::Invalid(format!(
                "CUDA: grouped routing of {ne} experts has no kernel (it routes on the host)"
            )))
        }
    })
}

/// route_topk's rules: a grouped rule has its own kernel (`Gpu::route_grouped`).
fn topk_rule(routing: Routing, k: usize, ne: usize) -> crate::Result<(i32, f32)> {
    if matches!(routing, Routing::Grouped { .. }) {
        return Err(Error::Invalid(
            "CUDA: grouped routing goes through route_grouped or moe_route_norm".into(),
        ));
    }
    route_rule(routing, k, ne)
}

/// Whether route_grouped takes a router of `ne` experts under rule `g` (a warp holds 256
/// experts; a group mask of 64 bits).
pub fn grouped_on_device(ne: usize, g: Grouped) -> bool {
    (1..=256).contains(&ne)
        && (1..=MAX_GROUPS.min(64)).contains(&g.groups)
        && ne.is_multiple_of(g.groups)
        && (1..=g.groups).contains(&g.topk_groups)
}

/// The ap8 kernels take x in 32-column chunks, whole within groups of 64 columns or more (a
/// step spans 16 groups at most: ap8.cu ap8d_load).
fn ap8_input(w: &DevMat, x: u64) -> crate::Result<()> {
    if !x.is_multiple_of(16) || w.group != 16 || w.cols % 64 != 0 {
        return Err(Error::Invalid(format!(
            "CUDA: an ap8 product of {} columns in groups of {} needs parent ranges of 16, rows \
             of whole 64s and a 16-byte aligned input",
            w.cols, w.group
        )));
    }
    Ok(())
}

/// One token's routed experts on the device: the table of their matrices (`tab`, [experts][gate,
/// up, down] DevMat), their routes (`routes`: k expert ranks, then k weights) and k.
#[derive(Clone, Copy, Debug)]
pub struct Routed {
    pub tab: u64,
    pub routes: u64,
    pub k: usize,
}

impl Gpu {
    /// A launch of matvec_c32.cu's loop (ap8, int2k) over `w`'s rows, `per` products a launch:
    /// about three blocks of 256 an SM walking the rows, each with x staged in shared memory
    /// (c32_stage: 80 bytes a 32-column chunk, the planes in whole 32-chunk runs). The grid's x
    /// size, the bytes of shared memory and the tiles' team (`c32_split`), or an error where x
    /// does not fit.
    fn c32_launch(&self, w: &DevMat, per: usize) -> crate::Result<(u32, u32, i32)> {
        let (rows, chunks) = (w.rows.max(0) as usize, w.cols.max(0) as usize / 32);
        let bytes = chunks.div_ceil(32) * 2048 + chunks * 16;
        if bytes > self.kernels.ap8_smem {
            return Err(Error::Invalid(format!(
                "CUDA: a product of {} columns stages {bytes} bytes of x; the GPU gives a block {}",
                w.cols, self.kernels.ap8_smem
            )));
        }
        // At most the ~3 blocks an SM holds at once: a few past them would wait a second wave.
        let walkers = (3 * self.q_limits.sm_count / per.max(1)).max(1) as u32;
        let split = c32_split(w, self.q_limits.sm_count);
        Ok((
            blocks(rows * split, 16).min(walkers),
            bytes as u32,
            split as i32,
        ))
    }

    /// Whether int2k's `w` runs on matvec_c32.cu's loop: 32-column chunks (rows of 8-byte
    /// multiples), groups of 16, x 16-byte aligned; else int2's scalar loop.
    pub fn c32_int2k(&self, w: &DevMat, x: u64) -> bool {
        w.is_int2k()
            && w.group == 16
            && w.cols > 0
            && w.cols % 32 == 0
            && w.codes.is_multiple_of(8)
            && x.is_multiple_of(16)
            && self.c32_launch(w, 1).is_ok()
    }

    /// y[rows] = W · x for one token (pointers to device memory).
    pub fn matvec(&self, w: &DevMat, x: u64, y: u64) -> crate::Result<()> {
        let w = *w;
        if w.is_ap8() || self.c32_int2k(&w, x) {
            // matvec_c32.cu's loop: ap8.cu matvec_ap8d, matvec_int2k_c32.
            if w.is_ap8() {
                ap8_input(&w, x)?;
            }
            let (grid, smem, split) = self.c32_launch(&w, 1)?;
            let c = LaunchConfig {
                shared_mem_bytes: smem,
                ..cfg(grid, 256)
            };
            let f = if w.is_ap8() {
                &self.kernels.matvec_ap8d
            } else {
                &self.kernels.matvec_i2k_c32
            };
            return launch!(self, f, c; w, x, y, split);
        }
        if w.vectorizable() && x.is_multiple_of(16) {
            if w.is_mxfp4() {
                if self.qd_mxfp4() && self.matvec_int(&w, &self.kernels.matvec_qd_mx, x, y)? {
                    return Ok(());
                }
                return self.matvec_mxfp4_rows(&w, x, y);
            }
            if w.is_packed_int() {
                if self.matvec_int(&w, self.q_kernels(&w).0, x, y)? {
                    return Ok(());
                }
            } else {
                // Float kinds: one row per warp, 8 warps per block.
                let c = cfg(blocks(w.rows as usize, 8), 256);
                return launch!(self, self.kernels.matvec[w.kind as usize], c; w, x, y);
            }
        }
        let c = cfg(blocks(w.rows as usize, 8), 256);
        let kind = w.kind;
        launch!(self, self.kernels.matvec_any, c; w, kind, x, y)
    }

    /// The first `n` (2 or 3) of three products of one token's x from integer matrices of one
    /// kind in one launch (matvec_q.cu matvec_qd_*_3: blockIdx.y = j takes w[j], y[j]), each row
    /// summed as `matvec` sums it (its own plan's split and column tiles); false, nothing
    /// launched, where any of them does not take the plain dp4a kernel or their plans differ in
    /// block, shared memory or column tiles.
    pub fn matvec3_int(&self, w: [&DevMat; 3], x: u64, y: [u64; 3], n: u32) -> crate::Result<bool> {
        let kind = w[0].kind;
        let used = &w[..n.clamp(1, 3) as usize];
        let same = used
            .iter()
            .all(|m| m.kind == kind && m.is_packed_int() && m.vectorizable());
        if !same || !(3..=5).contains(&kind) || !x.is_multiple_of(16) {
            return Ok(false);
        }
        let i = (kind - 3) as usize;
        let plain = &self.kernels.matvec_qd[i];
        if used
            .iter()
            .any(|m| !std::ptr::eq(self.q_kernels(m).0, plain))
        {
            return Ok(false);
        }
        let plans: Vec<_> = used.iter().map(|m| self.q_plan_for(plain, m)).collect();
        let Some(plans) = plans.into_iter().collect::<Option<Vec<_>>>() else {
            return Ok(false);
        };
        let p0 = plans[0];
        if plans
            .iter()
            .any(|p| p.block != p0.block || p.smem != p0.smem || p.tchunks != p0.tchunks)
        {
            return Ok(false);
        }
        let c = LaunchConfig {
            grid_dim: (plans.iter().map(|p| p.grid).max().unwrap_or(1), n, 1),
            block_dim: (p0.block, 1, 1),
            shared_mem_bytes: p0.smem,
        };
        // A third matrix past the grid's rows is never read: its split is the first's.
        let split = |j: usize| plans.get(j).map_or(p0.split, |p| p.split);
        let (w0, w1, w2) = (*w[0], *w[1], *w[2]);
        let (s0, s1, s2, tc) = (split(0), split(1), split(2), p0.tchunks);
        let f = &self.kernels.matvec_qd3[i].f;
        launch!(self, f, c; w0, w1, w2, x, y[0], y[1], y[2], s0, s1, s2, tc)?;
        Ok(true)
    }

    /// y = W · x for MXFP4 through the exact warp-a-row kernel (mxfp4.cu matvec_mxfp4: every
    /// product exact, f32 sums), where the dp4a one has no plan; w vectorizable, x 16-byte
    /// aligned.
    pub fn matvec_mxfp4_rows(&self, w: &DevMat, x: u64, y: u64) -> crate::Result<()> {
        let w = *w;
        let c = cfg(blocks(w.rows as usize, 8), 256);
        launch!(self, self.kernels.matvec_mx, c; w, x, y)
    }

    /// y = W · x through the integer kernel `q` (matvec_q_* or matvec_qm_* of w's kind, for a
    /// vectorizable w) with its plan; false (nothing launched) where no plan fits.
    pub fn matvec_int(&self, w: &DevMat, q: &QKernel, x: u64, y: u64) -> crate::Result<bool> {
        let Some(p) = self.q_plan_for(q, w) else {
            return Ok(false);
        };
        self.launch_int(q, &p, w, x, y)?;
        Ok(true)
    }

    /// One plain integer matvec launch of kernel `q` (w, x, y, split, tchunks) by plan `p`.
    fn launch_int(&self, q: &QKernel, p: &QPlan, w: &DevMat, x: u64, y: u64) -> crate::Result<()> {
        let c = LaunchConfig {
            grid_dim: (p.grid, 1, 1),
            block_dim: (p.block, 1, 1),
            shared_mem_bytes: p.smem,
        };
        let (w, split, tchunks) = (*w, p.split, p.tchunks);
        launch!(self, q.f, c; w, x, y, split, tchunks)
    }

    /// y += w x for a decode token through the residual-add twin of `matvec`'s dp4a kernel
    /// (matvec_qd_*_add: the bits of `matvec` then add_assign), where x is one column tile;
    /// false, nothing launched, elsewhere.
    pub fn matvec_add_int(&self, w: &DevMat, x: u64, y: u64) -> crate::Result<bool> {
        if !w.is_packed_int() || !w.vectorizable() || !x.is_multiple_of(16) {
            return Ok(false);
        }
        let (plain, i) = (self.q_kernels(w).0, (w.kind - 3) as usize);
        let add = match self.reg_set(w) {
            _ if i < 3 && std::ptr::eq(plain, &self.kernels.matvec_qd[i]) => {
                &self.kernels.matvec_qd_add[i]
            }
            Some(r) if std::ptr::eq(plain, &r[0]) => &r[3],
            _ => return Ok(false),
        };
        // The plain kernel's plan (its split: the same sums), one column tile.
        let Some(p) = self.routed_plan(w, add) else {
            return Ok(false);
        };
        if p.tchunks as usize != (w.chunk_bytes().max(0) as usize / 16).max(1) {
            return Ok(false);
        }
        self.launch_int(add, &p, w, x, y)?;
        Ok(true)
    }

    /// The integer matvec kernels for `w` (plain, selecting): for groups of whole 16-byte chunks
    /// the dp4a ones (matvec_qd_*; where their ring does not take the layout, the same loop with
    /// loads in registers, matvec_qd_*_r) where `qd_kinds` has the kind, else the tensor-core ones where
    /// the GPU has them and the groups are 1, 2 or a multiple of 4 chunks (cuda/matvec_qm.cu
    /// matvec_qm_body) and `qm_kinds` has the kind, else matvec_q_*.
    pub fn q_kernels(&self, w: &DevMat) -> (&QKernel, &QKernel) {
        if w.is_mxfp4() {
            return (&self.kernels.matvec_qd_mx, &self.kernels.matvec_qd_mx_sel);
        }
        if let Some(set) = self.ring_set(w) {
            return (&set[0], &set[1]);
        }
        if w.is_int2k() {
            let k = &self.kernels.matvec_q_i2k;
            return (&k[0], &k[1]);
        }
        let i = (w.kind - 3) as usize;
        let cc = 16 << (w.kind - 3);
        let cpg = w.group / cc;
        let chunks = w.group > 0 && w.group % cc == 0;
        let ring = self.kernels.matvec_qd[i].shape.ring;
        if chunks && self.qd_kinds[i] && (ring == 0 || ring_ok(w)) {
            return (&self.kernels.matvec_qd[i], &self.kernels.matvec_qd_sel[i]);
        }
        if let (true, true, Some(r)) = (chunks, self.qd_kinds[i], self.reg_set(w)) {
            return (&r[0], &r[1]);
        }
        let whole = chunks && (cpg <= 2 || cpg % 4 == 0);
        match (&self.kernels.matvec_qm, &self.kernels.matvec_qm_sel) {
            (Some(p), Some(s)) if whole && self.qm_kinds[i] => (&p[i], &s[i]),
            _ => (&self.kernels.matvec_q[i], &self.kernels.matvec_q_sel[i]),
        }
    }

    /// The dp4a kernels with loads in registers (plain, routed, gate-up) of int4 or int2 for
    /// `w`; None for the other kinds.
    fn reg_set(&self, w: &DevMat) -> Option<&[QKernel; 4]> {
        match w.kind {
            4 | 5 => Some(&self.kernels.matvec_qd_r[(w.kind - 4) as usize]),
            _ => None,
        }
    }

    /// The plain, routed and gate-up kernels of int3 or int4k for `w` (`Kernels::matvec_qd_i3`,
    /// `matvec_qd_i4k`): the ring's where it takes the layout, else those with loads in
    /// registers; None for the other kinds.
    fn ring_set(&self, w: &DevMat) -> Option<&[QKernel]> {
        let k = match w.kind {
            7 => &self.kernels.matvec_qd_i3,
            8 => &self.kernels.matvec_qd_i4k,
            _ => return None,
        };
        Some(if k[0].shape.ring == 0 || ring_ok(w) {
            &k[..3]
        } else {
            &k[3..]
        })
    }

    /// Integer-kind matrices of the routed experts of one token, `ny` of them in one launch
    /// (matvec_q.cu matvec_q_*_sel): matrix `which0 + j / k` of expert `routes[j % k]` from the
    /// device table `tab` ([experts][3] DevMat: gate, up, down) times x + (j % k) * xs floats,
    /// into y + j * ys floats; with `glu`, times SwiGLU(x + (j % k) * xs, x + (j % k + k) * xs)
    /// instead (k gate products, then k up products). `w` is any one of those matrices (they
    /// share kind and shape). A launch with which0 > 0 reads the routes and the table before it
    /// waits for the kernel before it (moe.cu sel_mat, "Ordering"): it must follow the
    /// which0 = 0 launch of the same routes, as in `routed_ffn`.
    pub fn matvec_sel(
        &self,
        w: &DevMat,
        Routed { tab, routes, k }: Routed,
        (which0, ny): (i32, usize),
        (x, xs, glu): (u64, usize, bool),
        (y, ys): (u64, usize),
    ) -> crate::Result<()> {
        let (ki, xsi, ysi, glui) = (k as i32, xs as i32, ys as i32, i32::from(glu));
        if (w.is_ap8() || self.c32_int2k(w, x)) && !glu {
            // matvec_c32.cu's loop (ap8.cu matvec_ap8d_sel, matvec_int2k_c32_sel); split and
            // tchunks unused.
            if w.is_ap8() {
                ap8_input(w, x)?;
            }
            let (grid, smem, split) = self.c32_launch(w, ny)?;
            let c = LaunchConfig {
                grid_dim: (grid, ny as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: smem,
            };
            let z = 0i32;
            let f = if w.is_ap8() {
                &self.kernels.matvec_ap8d_sel
            } else {
                &self.kernels.matvec_i2k_c32_sel
            };
            return launch!(self, f, c; tab, routes, ki, which0, x, xsi, glui, y, ysi, split, z);
        }
        // MXFP4: the dp4a kernel where it has a plan, else a warp a row.
        let dp_mx = (w.is_mxfp4() && self.qd_mxfp4() && w.vectorizable())
            .then(|| self.routed_plan(w, &self.kernels.matvec_qd_mx_sel))
            .flatten();
        if w.is_mxfp4() && !glu && dp_mx.is_none() {
            // A warp a row, 8 rows a block (mxfp4.cu matvec_mxfp4_sel); split, tchunks unused.
            let c = LaunchConfig {
                grid_dim: (blocks(w.rows.max(0) as usize, 8), ny as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let z = 0i32;
            let f = &self.kernels.matvec_mx_sel;
            return launch!(self, f, c; tab, routes, ki, which0, x, xsi, glui, y, ysi, z, z);
        }
        if !w.is_packed_int() && (glu || dp_mx.is_none()) {
            return Err(Error::Invalid(
                "CUDA: matvec_sel takes integer kinds and mxfp4 without glu (float kinds: \
                 moe_gate_up, moe_down)"
                    .into(),
            ));
        }
        // The plain kernel's plan (the same split and column tiles: the same sums as
        // `matvec`). Its grid fills the GPU once; the ny matrices share it (a block loops over
        // its matrix's row tiles, so any grid computes the same sums).
        let q = self.q_kernels(w).1;
        let p = match dp_mx {
            Some(p) => p,
            None => self.routed_plan(w, q).ok_or_else(|| {
                Error::Invalid("CUDA: no integer matvec plan for a routed expert".into())
            })?,
        };
        let c = LaunchConfig {
            grid_dim: (
                p.routed_grid(w.rows.max(0) as usize, q.shape.rows, ny),
                ny as u32,
                1,
            ),
            block_dim: (p.block, 1, 1),
            shared_mem_bytes: p.smem,
        };
        let (split, tchunks) = (p.split, p.tchunks);
        launch!(self, q.f, c; tab, routes, ki, which0, x, xsi, glui, y, ysi, split, tchunks)
    }

    /// One decode token's routed experts from the table `tab` (integer kinds, every matrix like
    /// `gate` / `down`), through the routed kernels: gate and up of the k experts in one launch
    /// into g ([2k, f]: k gate rows, then k up rows), their SwiGLU, and down of all k into dn
    /// ([k, h]).
    pub fn routed_ffn(
        &self,
        (gate, down): (&DevMat, &DevMat),
        r: Routed,
        x: u64,
        (g, dn): (u64, u64),
        (h, f): (usize, usize),
    ) -> crate::Result<()> {
        self.routed_gate_up(gate, r, x, (g, f))?;
        self.matvec_sel(down, r, (2, r.k), (g, f, false), (dn, h))
    }

    /// SwiGLU(gate x, up x) of one token's k routed experts (integer kinds, every gate matrix
    /// like `gate`) into the first k rows of g ([2k, f]; the other k are scratch): one launch
    /// where matvec_qd_*_gu applies (Gpu::gu_launch), else the routed gate and up launch and the
    /// swiglu launch. The same bits either way.
    pub fn routed_gate_up(
        &self,
        gate: &DevMat,
        r: Routed,
        x: u64,
        (g, f): (u64, usize),
    ) -> crate::Result<()> {
        let Routed { tab, routes, k } = r;
        if let Some((q, c, split, tchunks)) = self.gu_launch(gate, k) {
            let (ki, fi, none) = (k as i32, f as i32, DevMat::default());
            return launch!(self, q.f, c; tab, routes, ki, none, none, x, g, fi, split, tchunks);
        }
        self.matvec_sel(gate, r, (0, 2 * k), (x, 0, false), (g, f))?;
        // SwiGLU in its own launch: each block of the down launch staging it measured slower
        // (benches/results/2026-11-24-h100-routed.md), as did staging its x once for the
        // launch (benches/results/2026-11-24-h100-decode-host.md).
        self.swiglu(g, g + (k * f * 4) as u64, k * f)
    }

    /// One token's SwiGLU(gate x, up x) of an MLP (a shared expert, a dense layer's) into g in
    /// one launch (moe_gate_up_* for float kinds, matvec_qd_*_gu for integer ones, with a null
    /// table), where the routed form would take matrices like `gate` and `up` is laid out as
    /// `gate`: the bits of the two products and shared_gate's. Ok(false), nothing launched,
    /// where it does not apply.
    pub fn mlp_gate_up(
        &self,
        (gate, up): (&DevMat, &DevMat),
        x: u64,
        g: u64,
    ) -> crate::Result<bool> {
        let alike = gate.kind == up.kind
            && (gate.rows, gate.cols, gate.group, gate.row_bytes)
                == (up.rows, up.cols, up.group, up.row_bytes);
        let (none, gm, um) = (0u64, *gate, *up);
        if alike && gate.kind < 3 && gate.vectorizable() && up.vectorizable() {
            // Float kinds: moe.cu moe_gate_up_* with a null table (4 rows a block).
            let c = cfg(blocks(gate.rows.max(0) as usize, 4), 256);
            let (f, one) = (&self.kernels.moe_gate_up[gate.kind as usize], 1i32);
            launch!(self, f, c; none, none, one, gm, um, x, g)?;
            return Ok(true);
        }
        let Some((q, c, split, tchunks)) = alike.then(|| self.gu_launch(gate, 1)).flatten() else {
            return Ok(false);
        };
        let (one, ys) = (1i32, gate.rows);
        launch!(self, q.f, c; none, none, one, gm, um, x, g, ys, split, tchunks)?;
        Ok(true)
    }

    /// Whether routed_ffn may take gate, up and SwiGLU in one launch (the default). Both forms
    /// give the same results.
    pub fn set_routed_gu(&self, on: bool) {
        self.routed_gu.store(on, Ordering::Relaxed);
    }

    /// The launch of matvec_q.cu matvec_qd_*_gu for k routed experts whose gate matrices are like
    /// `gate`: where the dp4a kernels serve it and the plain plan's x is one column tile. The
    /// plain plan's split: each row's sum is the plain kernel's.
    fn gu_launch(&self, gate: &DevMat, k: usize) -> Option<(&QKernel, LaunchConfig, i32, i32)> {
        // (int2k: no dp4a form; its routed gate and up, then swiglu.)
        if !self.routed_gu.load(Ordering::Relaxed) || !gate.is_packed_int() || gate.is_int2k() {
            return None;
        }
        let q = if let Some(set) = self.ring_set(gate) {
            &set[2]
        } else {
            let i = (gate.kind - 3) as usize;
            let plain = self.q_kernels(gate).0;
            match self.reg_set(gate) {
                _ if std::ptr::eq(plain, &self.kernels.matvec_qd[i]) => {
                    &self.kernels.matvec_qd_gu[i]
                }
                Some(r) if std::ptr::eq(plain, &r[0]) => &r[2],
                _ => return None,
            }
        };
        let p = self.routed_plan(gate, q)?;
        let whole = p.tchunks as usize == (gate.chunk_bytes().max(0) as usize / 16).max(1);
        if !whole {
            return None;
        }
        let c = LaunchConfig {
            grid_dim: (
                p.routed_grid(gate.rows.max(0) as usize, q.shape.rows / 2, k),
                k as u32,
                1,
            ),
            block_dim: (p.block, 1, 1),
            shared_mem_bytes: p.smem,
        };
        Some((q, c, p.split, p.tchunks))
    }

    /// One token's routes ([k] experts then [k] weights at `routes`) from the router `w` and
    /// x: one launch for a float-kind router of at most 256 rows (moe.cu moe_route_*), else
    /// the product into `logits` ([w.rows]) and route_topk. The same routes either way.
    pub fn moe_route(
        &self,
        w: &DevMat,
        x: u64,
        (k, routing): (usize, Routing),
        routes: u64,
        logits: u64,
    ) -> crate::Result<()> {
        let (rule, reps) = topk_rule(routing, k, w.rows.max(0) as usize)?;
        if w.kind >= 3 || !w.vectorizable() || !x.is_multiple_of(16) || w.rows > 256 {
            self.matvec(w, x, logits)?;
            return self.route(logits, 1, w.rows as usize, (k, routing), routes);
        }
        let warps = (w.rows as u32).clamp(1, 32);
        let (wm, ki) = (*w, k as i32);
        let f = &self.kernels.moe_route[w.kind as usize];
        launch!(self, f, cfg(1, 32 * warps); wm, x, ki, rule, reps, routes)
    }

    /// Whether later routing launches may copy the router into the block before they wait (the
    /// default). Both forms give the same results.
    pub fn set_router_preload(&self, on: bool) {
        self.router_preload.store(on, Ordering::Relaxed);
    }

    /// The MoE block's RMSNorm and routing of one token in one launch (cuda/moe.cu
    /// moe_route_norm_*): xn = RMSNorm(x) * g as `rms_norm` writes it, and the routes as
    /// `moe_route` computes them from xn; with `bias` (a device vector of w.rows, 0: none) each
    /// logit first gets its expert's bias, as `route_topk` adds it, or under a grouped rule
    /// (route_grouped's results) the bias is the rule's selection bias. Ok(false), nothing
    /// launched, where that kernel does not apply (the caller then launches the two).
    pub fn moe_route_norm(
        &self,
        w: &DevMat,
        (x, xn): (u64, u64),
        (g, eps): (u64, f32),
        (k, routing): (usize, Routing),
        (bias, routes): (u64, u64),
    ) -> crate::Result<bool> {
        let (n, ne) = (w.cols as usize, w.rows.max(0) as usize);
        if let Routing::Grouped { rule, .. } = routing {
            if !grouped_on_device(ne, rule) {
                return Ok(false);
            }
        }
        let (rule, reps) = route_rule(routing, k, ne)?;
        // The row in shared memory within the 48 KB a launch gets without opting in.
        if w.kind >= 3 || !w.vectorizable() || w.rows as usize > ROUTE_WIDE_MAX || n * 4 > 48 << 10
        {
            return Ok(false);
        }
        // The router's rows and the norm's weights loaded before the kernel waits (into shared
        // memory, or registers: moe.cu route_norm_regs), where they fit beside x; a router they
        // do not fit (gpt-oss-20b's 32 x 2880 f32) is read by many blocks.
        let rows_bytes = w.rows as usize * w.row_bytes as usize;
        let fits = n.is_multiple_of(4) && 2 * n * 4 + rows_bytes <= self.kernels.route_norm_smem;
        if w.rows as usize > ROUTE_WIDE_MIN || !fits {
            let p = (k, rule, reps);
            return self.moe_route_norm_wide(w, (x, xn), (g, eps), p, (bias, routes));
        }
        let pre = self.router_preload.load(Ordering::Relaxed) && fits;
        let c = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (rms_block(n), 1, 1),
            // x, then with `pre` the router's rows and the norm's weights.
            shared_mem_bytes: (n * 4 + if pre { rows_bytes + n * 4 } else { 0 }) as u32,
        };
        let (wm, ki, prei) = (*w, k as i32, i32::from(pre));
        let f = &self.kernels.moe_route_norm[w.kind as usize];
        launch!(self, f, c; wm, x, g, eps, xn, ki, rule, reps, routes, prei, bias)?;
        Ok(true)
    }

    /// moe_route_norm over many blocks (moe.cu moe_route_norm_wide_*): a row a warp, as few rows
    /// a block as fill the SMs.
    fn moe_route_norm_wide(
        &self,
        w: &DevMat,
        (x, xn): (u64, u64),
        (g, eps): (u64, f32),
        (k, rule, reps): (usize, i32, f32),
        (bias, routes): (u64, u64),
    ) -> crate::Result<bool> {
        let (n, rows) = (w.cols as usize, w.rows as usize);
        let block = rms_block(n);
        let rpb = rows
            .div_ceil(self.q_limits.sm_count.max(1))
            .clamp(1, block as usize / 32);
        // A block's rows copied in before the wait, beside x, within the 48 KB a launch gets
        // without opting in.
        let rows_bytes = rpb * w.row_bytes as usize;
        let pre = self.router_preload.load(Ordering::Relaxed) && n * 4 + rows_bytes <= 48 << 10;
        let c = LaunchConfig {
            grid_dim: (rows.div_ceil(rpb) as u32, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: (n * 4 + if pre { rows_bytes } else { 0 }) as u32,
        };
        let lgs = ptr(&self.route_wide, &self.stream);
        let count = lgs + (ROUTE_WIDE_MAX * 4) as u64;
        let (wm, ki, rpbi, prei) = (*w, k as i32, rpb as i32, i32::from(pre));
        let f = &self.kernels.moe_route_norm_wide[w.kind as usize];
        launch!(self, f, c; wm, x, g, eps, xn, ki, rule, reps, routes, rpbi, prei, lgs, count, bias)?;
        Ok(true)
    }

    /// Float-kind experts of one token from the table `tab`: h ([k, ffn]) = SwiGLU of the
    /// routed experts' gate and up rows (`gate` is one of those gate matrices: kind and shape).
    pub fn moe_gate_up(
        &self,
        gate: &DevMat,
        Routed { tab, routes, k }: Routed,
        x: u64,
        h: u64,
    ) -> crate::Result<()> {
        let c = LaunchConfig {
            grid_dim: (blocks(gate.rows as usize, 4), k as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ki, none) = (k as i32, DevMat::default());
        let f = &self.kernels.moe_gate_up[gate.kind as usize];
        launch!(self, f, c; tab, routes, ki, none, none, x, h)
    }

    /// Float-kind experts of one token: x += the routed experts' down rows times h, weighted
    /// and summed in ascending expert order (`down` is one of those down matrices).
    pub fn moe_down(
        &self,
        down: &DevMat,
        Routed { tab, routes, k }: Routed,
        h: u64,
        x: u64,
    ) -> crate::Result<()> {
        let ki = k as i32;
        // moe.cu moe_down_body: max(1, 8 / k) rows a block.
        let c = cfg(blocks(down.rows as usize, (8 / k.max(1)).max(1)), 256);
        launch!(self, self.kernels.moe_down[down.kind as usize], c; tab, routes, ki, h, x)
    }

    /// Whether decode's routed-expert kernels take matrices like `w`: a vectorizable layout
    /// (and for integer kinds, a plan for matvec_sel).
    pub fn sel_supports(&self, w: &DevMat) -> bool {
        if w.is_ap8() {
            return true;
        }
        if !w.vectorizable() {
            return false;
        }
        if !w.is_packed_int() {
            return true;
        }
        self.routed_plan(w, self.q_kernels(w).1).is_some()
    }

    /// Routing of t tokens by `routing` from router logits ([t, ne] at `logits`) into `routes`:
    /// [t, k] expert indices (i32) then [t, k] weights (route.cu route_topk).
    pub fn route(
        &self,
        logits: u64,
        t: usize,
        ne: usize,
        (k, routing): (usize, Routing),
        routes: u64,
    ) -> crate::Result<()> {
        self.route_biased(logits, (t, ne, 0), (k, routing), routes)
    }

    /// `route` with the router's bias ([ne] at `bias`; 0: none) added to the logits in place
    /// first, in the same launch.
    pub fn route_biased(
        &self,
        logits: u64,
        (t, ne, bias): (usize, usize, u64),
        (k, routing): (usize, Routing),
        routes: u64,
    ) -> crate::Result<()> {
        let (rule, reps) = topk_rule(routing, k, ne)?;
        let (nei, ki, ti) = (ne as i32, k as i32, t as i32);
        // A warp a token, 4 a block (route.cu ROUTE_TOPK_WARPS).
        let c = cfg(blocks(t, 4), 128);
        launch!(self, self.kernels.route_topk, c; logits, nei, ki, ti, rule, reps, routes, bias)
    }

    /// Group-limited routing (route.cu route_grouped) of t tokens' logits with the layer's
    /// selection bias ([ne] at `bias`; 0: none): the routes `route` writes, a warp a token.
    pub fn route_grouped(
        &self,
        logits: u64,
        (t, ne, bias): (usize, usize, u64),
        (k, g): (usize, Grouped),
        routes: u64,
    ) -> crate::Result<()> {
        if k == 0 || k > 16 || k > ne || !grouped_on_device(ne, g) {
            return Err(Error::Invalid(format!(
                "CUDA: grouped routing to {k} of {ne} experts in {} groups (top {}) has no kernel",
                g.groups, g.topk_groups
            )));
        }
        let (nei, ki, ti) = (ne as i32, k as i32, t as i32);
        let (softmax, groups, top) = (g.softmax as i32, g.groups as i32, g.topk_groups as i32);
        let (renorm, scale) = (g.renormalize as i32, g.scale);
        let c = cfg(blocks(t, 4), 128);
        launch!(self, self.kernels.route_grouped, c; logits, nei, ki, ti, softmax, groups, top, renorm, scale, bias, routes)
    }

    /// Write `a`'s table ([n][gate, up, down] at `tab`) and routes (n ranks then n weights at
    /// `routes`) on the compute stream.
    pub fn put_slots(&self, a: &SlotArgs, tab: u64, routes: u64) -> crate::Result<()> {
        let a = *a;
        launch!(self, self.kernels.put_slots, cfg(1, (3 * SLOTS_MAX_K) as u32); a, tab, routes)
    }

    /// x[:n] += the k routed experts' outputs d ([k, n]) weighted by `routes` (one token), summed
    /// in ascending expert order with the roundings of zero + axpy per expert + add. With `norm`
    /// = ((g, eps), xn), also xn = RMSNorm(x) * g (as `rms_norm` computes it) in the same launch
    /// where that kernel applies (n % 4 == 0, every pointer 16-byte aligned); returns whether xn
    /// was written (if not, the caller normalizes). With `norm`, it must follow `routed_ffn` of
    /// the same routes: that kernel reads the routes and x before it waits (cuda/moe.cu
    /// moe_combine_norm). `extra` (0: none): n values and a flag after them, added to the
    /// experts' sum where the flag is set (gated decode's CPU experts).
    pub fn moe_combine(
        &self,
        x: u64,
        d: u64,
        routes: u64,
        (k, n): (usize, usize),
        norm: Option<((u64, f32), u64)>,
        extra: u64,
    ) -> crate::Result<bool> {
        let (ki, ni) = (k as i32, n as i32);
        if let Some(((g, eps), xn)) = norm {
            if n.is_multiple_of(4) && ((x | d | g | xn | extra) & 15) == 0 && k <= 16 {
                launch!(self, self.kernels.moe_combine_norm, cfg(1, rms_block(n)); x, d, routes, ki, ni, g, eps, xn, extra)?;
                return Ok(true);
            }
        }
        launch!(self, self.kernels.moe_combine, cfg(blocks(n, 256), 256); x, d, routes, ki, ni, extra)?;
        Ok(false)
    }

    /// The NMSE bound of a one-token product (`matvec`) of `m` against the CPU backend: the
    /// integer kernel's (QShape::nmse_bound), 1e-10 for the rest.
    pub fn matvec_nmse_bound(&self, m: &Matrix<'_>) -> f64 {
        let d = DevMat::new(m, 0, 0, 0);
        if (d.is_packed_int() || (d.is_mxfp4() && self.qd_mxfp4())) && d.row_bytes % 16 == 0 {
            self.q_kernels(&d).0.shape.nmse_bound()
        } else {
            1e-10
        }
    }

    /// Whether MXFP4 products take the dp4a kernels (matvec_qd_mxfp4, _sel; sm_61 on: dp4a)
    /// where they have a plan, rather than the exact warp-a-row ones (mxfp4.cu): 4.5-5x their
    /// bandwidth (benches/results/2026-12-04-h200-issue53-mxfp4-dp4a.md).
    pub fn qd_mxfp4(&self) -> bool {
        self.compute_capability >= (6, 1)
    }
}
