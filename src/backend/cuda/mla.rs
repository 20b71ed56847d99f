//! Multi-head latent attention on the device (cuda/mla.cu): the cache rows, the queries mapped
//! into the latent and the values out of it, without the host copies of Backend's defaults.

use super::*;

impl CudaBackend {
    /// MLA's per-head maps (k_b, v_b) as f32 on the device, in place of their stored form: the
    /// per-head products read them as f32 rows (mla.cu mla_matvec), the host's arithmetic.
    pub(super) fn upload_mla(&mut self, m: &Matrix<'_>) -> crate::Result<()> {
        let key = m.codes.as_ptr() as usize;
        if self.mla.contains_key(&key) {
            return Ok(());
        }
        let d = self.gpu.stream.clone_htod(&m.to_f32()).map_err(cuda_err)?;
        self.resident_bytes += m.rows * m.cols * 4;
        self.mla.insert(key, d);
        Ok(())
    }

    fn mla_f32(&self, m: &Matrix<'_>) -> crate::Result<u64> {
        self.mla
            .get(&(m.codes.as_ptr() as usize))
            .map(|d| ptr(d, &self.gpu.stream))
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
        let k_b = self.mla_f32(w.k_b)?;
        if t == 1 {
            // One launch: mla.cu mla_rows_q (the map's rows a warp each, then mla_rows' two blocks).
            mla_aligned(k_b, qp, m.nope, qw)?;
            let nm = blocks(heads * m.kv_lora, c.block_dim.0 as usize / 32);
            let c = LaunchConfig {
                grid_dim: (nm + 2, 1, 1),
                ..c
            };
            let (f, nmi) = (&self.gpu.kernels.mla_rows_q, nm as i32);
            return launch!(self.gpu, f, c; qp, cp, qop, rp, np, eps, fp, hi, ni, ri, li, si, kd, posp, qs, k_b, nmi);
        }
        let f = &self.gpu.kernels.mla_rows;
        launch!(self.gpu, f, c; qp, cp, qop, rp, np, eps, fp, hi, ni, ri, li, si, kd, posp, qs)?;
        let shape = (heads, m.kv_lora, m.nope);
        self.mla_matvec(k_b, (qp, qw), (qop, lw), shape, (t, w.q_scale))
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
        let w = self.mla_f32(v_b)?;
        let (ap, op) = (self.p(att), self.p(out));
        self.mla_matvec(
            w,
            (ap, lw),
            (op, shape.v),
            (heads, shape.v, shape.kv_lora),
            (t, 1.0),
        )
    }

    /// y[tok, h, :rows] = scale · w[h * rows.., :cols] · x[tok, h, :cols], x and y given with their
    /// floats per head: a decode token through mla.cu mla_matvec (a warp a row), a prefill
    /// batch through one batched GEMM (Gpu::gemm_heads), which reads each head's map once for
    /// every token instead of once a token.
    fn mla_matvec(
        &self,
        w: u64,
        (x, xs): (u64, usize),
        (y, ys): (u64, usize),
        (heads, rows, cols): (usize, usize, usize),
        (t, scale): (usize, f32),
    ) -> crate::Result<()> {
        mla_aligned(w, x, cols, xs)?;
        if t > 1 {
            return self
                .gpu
                .gemm_heads(w, (x, xs), (y, ys), (heads, rows, cols), (t, scale));
        }
        let c = LaunchConfig {
            grid_dim: (blocks(heads * rows, 8), t as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (hi, ri, ci, xsi, ysi) = (heads as i32, rows as i32, cols as i32, xs as i32, ys as i32);
        launch!(self.gpu, self.gpu.kernels.mla_matvec, c; w, x, y, hi, ri, ci, xsi, ysi, scale)
    }
}

/// mla_matvec's float4 loads: w and x 16-byte aligned, rows of whole float4s, heads of x a
/// whole number of float4s apart.
fn mla_aligned(w: u64, x: u64, cols: usize, xs: usize) -> crate::Result<()> {
    let aligned = [w, x].iter().all(|p| p.is_multiple_of(16))
        && cols.is_multiple_of(4)
        && xs.is_multiple_of(4);
    if !aligned {
        return Err(Error::Invalid(format!(
            "CUDA MLA: heads of {cols} values ({xs} apart) are not 16-byte rows"
        )));
    }
    Ok(())
}
