//! Multi-head latent attention on the device (cuda/mla.cu): the cache rows, the queries mapped
//! into the latent and the values out of it, without the host copies of Backend's defaults.

use super::*;

impl CudaBackend {
    /// MLA's per-head maps (k_b, v_b) on the device: in their stored kind where mla.cu's
    /// kernels read it (f32, f16, bf16, int8), else as f32 (the host's dequantized values). Maps not
    /// in f32 share room for one map's f32 rows, which a prefill's batched GEMM reads (mla.cu
    /// mla_dequant).
    pub(super) fn upload_mla(&mut self, m: &Matrix<'_>) -> crate::Result<()> {
        if mla_stored(m) {
            let n = m.rows * m.cols;
            if m.kind != WeightKind::F32 && self.mla_rows.as_ref().is_none_or(|d| d.len() < n) {
                let d = self.gpu.alloc::<f32>(n, "an MLA map's prefill rows")?;
                self.resident_bytes += d.len() * 4;
                if let Some(old) = self.mla_rows.replace(d) {
                    self.resident_bytes -= old.len() * 4;
                }
            }
            return self.upload_matrix(m);
        }
        let key = m.codes.as_ptr() as usize;
        if self.mla.contains_key(&key) {
            return Ok(());
        }
        let d = self.gpu.stream.clone_htod(&m.to_f32()).map_err(cuda_err)?;
        self.resident_bytes += m.rows * m.cols * 4;
        let dm = DevMat::f32_rows(ptr(&d, &self.gpu.stream), m.rows, m.cols);
        self.mla.insert(key, (dm, d));
        Ok(())
    }

    /// A map as mla.cu's kernels take it (its kind code 0..=3 picks the kernel).
    fn mla_map(&self, m: &Matrix<'_>) -> crate::Result<DevMat> {
        if mla_stored(m) {
            return self.mat(m).copied();
        }
        self.mla
            .get(&(m.codes.as_ptr() as usize))
            .map(|(d, _)| *d)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "CUDA backend: an MLA map [{}, {}] was never uploaded",
                    m.rows, m.cols
                ))
            })
    }

    /// Backend::mla_inputs on the device: mla_rows (the norm, RoPE and the cache rows), then
    /// each head's q_nope into the latent; for one token both in one launch (mla_rows_q).
    pub(super) fn mla_inputs_dev(
        &self,
        (q, ckv): (&CudaSlice<f32>, &CudaSlice<f32>),
        w: &MlaInputs<'_>,
        step: &QkvStep<'_>,
        (row, q_out): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        kv: &mut CudaKv,
    ) -> crate::Result<()> {
        let (m, t, heads) = (w.shape, step.t, w.heads);
        let (qw, lw) = (m.nope + m.rope, m.kv_lora + m.rope);
        check_len("MLA q", q.len(), t * heads * qw)?;
        check_len("MLA kv_a", ckv.len().min(row.len()), t * lw)?;
        check_len("MLA q out", q_out.len(), t * heads * lw)?;
        if kv.kv_dim != lw || step.inv_freq.len() * 2 < m.rope || w.kv_norm.len() != m.kv_lora {
            return Err(Error::Invalid(format!(
                "CUDA MLA: cache rows of {} for a latent of {} + {}",
                kv.kv_dim, m.kv_lora, m.rope
            )));
        }
        // The cache keeps MLA's rows once (the values are the keys: alloc_kv).
        let (kd, _, posp) = self.kv_target(kv, step.layer, step.start, t)?;
        let (qp, cp, qop, rp) = (self.p(q), self.p(ckv), self.p(q_out), self.p(row));
        let (np, fp) = (self.vector(w.kv_norm)?, self.vector(step.inv_freq)?);
        let (hi, ni, ri, li) = (heads as i32, m.nope as i32, m.rope as i32, m.kv_lora as i32);
        let (si, eps, qs) = (step.start as i32, w.eps, w.q_scale);
        let c = LaunchConfig {
            grid_dim: (t as u32, 2, 1),
            block_dim: (rms_block(m.kv_lora), 1, 1),
            shared_mem_bytes: 0,
        };
        let k_b = self.mla_map(w.k_b)?;
        if t == 1 {
            // One launch: mla.cu mla_rows_q (the map's rows a warp each, then mla_rows' two blocks).
            mla_aligned(&k_b, qp, qw)?;
            let nm = blocks(heads * m.kv_lora, c.block_dim.0 as usize / 32);
            let c = LaunchConfig {
                grid_dim: (nm + 2, 1, 1),
                ..c
            };
            let (f, nmi) = (&self.gpu.kernels.mla_rows_q[k_b.kind as usize], nm as i32);
            return launch!(self.gpu, f, c; qp, cp, qop, rp, np, eps, fp, hi, ni, ri, li, si, kd, posp, qs, k_b, nmi);
        }
        let f = &self.gpu.kernels.mla_rows;
        launch!(self.gpu, f, c; qp, cp, qop, rp, np, eps, fp, hi, ni, ri, li, si, kd, posp, qs)?;
        self.mla_matvec(
            &k_b,
            (qp, qw),
            (qop, lw),
            (heads, m.kv_lora),
            (t, w.q_scale),
        )
    }

    /// Backend::mla_values on the device: each head's latent output through its v_b rows.
    pub(super) fn mla_values_dev(
        &self,
        att: &CudaSlice<f32>,
        (v_b, shape): (&Matrix<'_>, &MlaShape),
        (t, heads): (usize, usize),
        out: &mut CudaSlice<f32>,
    ) -> crate::Result<()> {
        let lw = shape.kv_lora + shape.rope;
        check_len("MLA attention", att.len(), t * heads * lw)?;
        check_len("MLA values", out.len(), t * heads * shape.v)?;
        let w = self.mla_map(v_b)?;
        let (ap, op) = (self.p(att), self.p(out));
        self.mla_matvec(&w, (ap, lw), (op, shape.v), (heads, shape.v), (t, 1.0))
    }

    /// y[tok, h, :rows] = scale · w[h * rows.., :] · x[tok, h, :w.cols], x and y given with
    /// their floats per head: a decode token through mla.cu mla_matvec_* (a warp a row), a
    /// prefill batch through one batched GEMM (Gpu::gemm_heads) of f32 rows (another kind's
    /// converted first), which reads each head's map once for every token instead of once a
    /// token.
    fn mla_matvec(
        &self,
        w: &DevMat,
        (x, xs): (u64, usize),
        (y, ys): (u64, usize),
        (heads, rows): (usize, usize),
        (t, scale): (usize, f32),
    ) -> crate::Result<()> {
        mla_aligned(w, x, xs)?;
        let cols = w.cols as usize;
        if t > 1 {
            let rows_f32 = if w.kind == 0 {
                w.codes
            } else {
                let d = self.mla_rows.as_ref().ok_or_else(|| {
                    Error::Invalid("CUDA MLA: a map without room for its prefill rows".into())
                })?;
                let (wm, kind, out) = (*w, w.kind, ptr(d, &self.gpu.stream));
                let c = cfg(blocks(heads * rows * cols, 256), 256);
                launch!(self.gpu, self.gpu.kernels.mla_dequant, c; wm, kind, out)?;
                out
            };
            return self.gpu.gemm_heads(
                rows_f32,
                (x, xs),
                (y, ys),
                (heads, rows, cols),
                (t, scale),
            );
        }
        let c = LaunchConfig {
            grid_dim: (blocks(heads * rows, 8), t as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (wm, hi, ri, xsi, ysi) = (*w, heads as i32, rows as i32, xs as i32, ys as i32);
        let f = &self.gpu.kernels.mla_matvec[w.kind as usize];
        launch!(self.gpu, f, c; wm, x, y, hi, ri, xsi, ysi, scale)
    }
}

/// Whether mla.cu reads this map in its stored kind: a float kind, or int8 whose groups are whole
/// 16-byte chunks (chunk_dot).
fn mla_stored(m: &Matrix<'_>) -> bool {
    let g = m.group_size;
    let kind = match m.kind {
        WeightKind::F32 | WeightKind::F16 | WeightKind::Bf16 => true,
        WeightKind::Int8 => g > 0 && g.is_multiple_of(16) && m.cols.is_multiple_of(g),
        _ => false,
    };
    kind && m.row_bytes().is_multiple_of(16)
}

/// A map's bytes on the device (upload_mla).
pub(super) fn mla_bytes(m: &Matrix<'_>) -> usize {
    match mla_stored(m) {
        true => m.codes.len() + m.scales.len() + m.mins.len(),
        false => m.rows * m.cols * 4,
    }
}

/// The f32 room a prefill's GEMM of the map needs (upload_mla's `mla_rows`).
pub(super) fn mla_room(m: &Matrix<'_>) -> usize {
    match mla_stored(m) && m.kind != WeightKind::F32 {
        true => m.rows * m.cols * 4,
        false => 0,
    }
}

/// mla_matvec's 16-byte loads: w and x 16-byte aligned, rows of whole 16-byte chunks, heads of
/// x a whole number of float4s apart.
fn mla_aligned(w: &DevMat, x: u64, xs: usize) -> crate::Result<()> {
    let aligned = [w.codes, x].iter().all(|p| p.is_multiple_of(16))
        && w.row_bytes % 16 == 0
        && w.cols % 4 == 0
        && xs.is_multiple_of(4);
    if !aligned {
        return Err(Error::Invalid(format!(
            "CUDA MLA: heads of {} values ({xs} apart) are not 16-byte rows",
            w.cols
        )));
    }
    Ok(())
}
