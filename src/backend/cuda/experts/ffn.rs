//! The per-expert steps of the CUDA expert device: an expert's FFN a product at a time (its
//! gpt-oss biases and activation where it has them), and a prefill expert through gemm_q4h.

use super::{align256, CudaWork, FfnDev};
use crate::backend::cuda::{CudaBackend, DevMat};
use crate::model::experts::ExpertFfn;
use crate::model::ExpertAct;
use crate::Error;

impl CudaBackend {
    /// The device side of a layer's `ExpertFfn`: its bias tables among the resident vectors.
    pub(super) fn ffn_dev(&self, ffn: &ExpertFfn) -> crate::Result<FfnDev> {
        let ExpertAct::ClampedSwiglu { alpha, limit } = ffn.act else {
            if ffn.biases.is_some() {
                return Err(Error::Invalid(
                    "CUDA experts: biases without gpt-oss's activation".into(),
                ));
            }
            return Ok(FfnDev::default());
        };
        let b = ffn.biases.as_ref().ok_or_else(|| {
            Error::Invalid("CUDA experts: gpt-oss's activation without its biases".into())
        })?;
        let tables = [
            self.vector(&b.gate)?,
            self.vector(&b.up)?,
            self.vector(&b.down)?,
        ];
        Ok(FfnDev {
            glu: Some(((alpha, limit), tables)),
        })
    }

    /// Step `step` of expert `expert` on `n` tokens at `input`: 0 the gate product, 1 the up
    /// product and the activation, 2 the down product (and bias) into rows `row`.. of the
    /// work's down outputs.
    pub(super) fn ffn_step(
        &self,
        w: &CudaWork,
        ([wg, wu, wd], expert): (&[DevMat; 3], usize),
        input: u64,
        (n, row): (usize, usize),
        step: usize,
    ) -> crate::Result<()> {
        let (gp, up, f, h) = (self.p(&w.gate), self.p(&w.up), w.ffn, w.hidden);
        match (step, w.act.glu) {
            (0, _) => self.matmul_dev(wg, input, n, gp),
            (1, None) => {
                self.matmul_dev(wu, input, n, up)?;
                self.gpu.swiglu(gp, up, n * f)
            }
            (1, Some((act, [bg, bu, _]))) => {
                self.matmul_dev(wu, input, n, up)?;
                let at = (expert * f * 4) as u64;
                self.gpu
                    .expert_glu((gp, up, n * f), (bg + at, bu + at, f), act)
            }
            (_, glu) => {
                let dp = self.p(&w.down) + (row * h * 4) as u64;
                self.matmul_dev(wd, gp, n, dp)?;
                match glu {
                    Some((_, [_, _, bd])) => {
                        let bias = bd + (expert * h * 4) as u64;
                        self.gpu.add_bias_rows(dp, bias, h, n * h)
                    }
                    None => Ok(()),
                }
            }
        }
    }

    /// A prefill expert of int4 (groups of a multiple of 32) through gemm_q4h: its `n` tokens
    /// (rows `idx` of `x`) gathered as f16 once for gate and up, SwiGLU straight to f16 (down's
    /// input), down's output added by the weighted scatter into `out`. False (nothing
    /// launched) where gemm_q4h does not apply.
    pub(super) fn expert_q4h(
        &self,
        w: &CudaWork,
        [wg, wu, wd]: &[DevMat; 3],
        (x, idx, wts): (u64, u64, u64),
        n: usize,
        out: u64,
    ) -> crate::Result<bool> {
        let (h, f) = (w.hidden, w.ffn);
        let (scratch, scratch_len) = self.scratch();
        // Scratch: the gathered tokens (f16), the SwiGLU output (f16), then down's output.
        let xh = scratch;
        let act = scratch + align256(n * h * 2) as u64;
        let down = act + align256(n * f * 2) as u64;
        let gpu = &self.gpu;
        if (scratch_len * 4).saturating_sub((down - scratch) as usize) < n * h * 4
            || !gpu.gemm_q4h_applies(wd, act)
            || ![wg, wu].iter().all(|m| gpu.gemm_q4h_applies(m, xh))
        {
            return Ok(false);
        }
        let (gp, up) = (self.p(&w.gate), self.p(&w.up));
        // K is not split (one part: no partial sums): a grouped layer (experts_grouped)
        // computes these sums, bit for bit.
        let q4 = |m: &DevMat, xh: u64, dst: u64| {
            gpu.gemm_q4h(m, xh, n, (dst, dst), 1)?
                .ok_or_else(|| Error::Invalid("gemm_q4h refused a checked matrix".into()))
        };
        gpu.gather_rows((x, idx), xh, h, n, true)?;
        q4(wg, xh, gp)?;
        q4(wu, xh, up)?;
        gpu.swiglu_half(gp, up, act, n * f)?;
        q4(wd, act, down)?;
        gpu.scatter_axpy(out, (idx, wts), down, h, n, 1)?;
        Ok(true)
    }
}
