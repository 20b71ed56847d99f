//! Experts computed on the CPU straight from the mmap, in one chosen variant.

use crate::format::HobFile;
use crate::model::ops::{group_by_expert, ExpertExecutor, Route};
use crate::model::ExpertReport;
use crate::quant::Matrix;

use super::CpuBackend;

pub struct CpuExperts<'a> {
    file: &'a HobFile,
    variant: usize,
    hidden: usize,
    ffn: usize,
    /// Per expert: the batch rows (token index, gate weight) routed to it.
    groups: Vec<Vec<(usize, f32)>>,
    /// (n, hidden) gathered inputs of one expert
    xs: Vec<f32>,
    /// (n, ffn)
    gate: Vec<f32>,
    /// (n, ffn)
    up: Vec<f32>,
    /// (n, hidden)
    down: Vec<f32>,
}

impl<'a> CpuExperts<'a> {
    /// `variant`: index into `file.variants()`.
    pub fn new(file: &'a HobFile, variant: usize) -> crate::Result<Self> {
        if variant >= file.variants().len() {
            return Err(crate::Error::Invalid(format!(
                "expert variant index {variant} out of range: the file stores {}",
                file.variants().len()
            )));
        }
        let (hidden, ffn) = file.expert_dims();
        Ok(CpuExperts {
            file,
            variant,
            hidden,
            ffn,
            groups: vec![Vec::new(); file.n_experts()],
            xs: Vec::new(),
            gate: Vec::new(),
            up: Vec::new(),
            down: Vec::new(),
        })
    }
}

impl ExpertExecutor<CpuBackend> for CpuExperts<'_> {
    fn forward(
        &mut self,
        b: &CpuBackend,
        layer: usize,
        xs: &Vec<f32>,
        t: usize,
        routes: &[Route],
        out: &mut Vec<f32>,
    ) -> crate::Result<()> {
        let (h, f) = (self.hidden, self.ffn);
        let out = &mut out[..t * h];
        group_by_expert(routes, t, &mut self.groups);
        out.fill(0.0);
        // Experts in index order, so each token sums its experts in the same order whatever
        // the batch: prefill and decode agree on the summation.
        for (e, group) in self.groups.iter().enumerate() {
            let n = group.len();
            if n == 0 {
                continue;
            }
            let view = self.file.expert(layer, e, self.variant);
            self.xs.resize(n * h, 0.0);
            self.gate.resize(n * f, 0.0);
            self.up.resize(n * f, 0.0);
            self.down.resize(n * h, 0.0);
            for (j, &(i, _)) in group.iter().enumerate() {
                self.xs[j * h..(j + 1) * h].copy_from_slice(&xs[i * h..(i + 1) * h]);
            }
            // Mixtral's expert: w2(silu(w1(x)) * w3(x)).
            b.matmul_f32(&Matrix::from_view(view.gate()), &self.xs, n, &mut self.gate);
            b.matmul_f32(&Matrix::from_view(view.up()), &self.xs, n, &mut self.up);
            for (g, u) in self.gate.iter_mut().zip(&self.up) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
            b.matmul_f32(
                &Matrix::from_view(view.down()),
                &self.gate,
                n,
                &mut self.down,
            );
            for (j, &(i, w)) in group.iter().enumerate() {
                for (o, &d) in out[i * h..(i + 1) * h]
                    .iter_mut()
                    .zip(&self.down[j * h..(j + 1) * h])
                {
                    *o += w * d;
                }
            }
        }
        Ok(())
    }
}

impl ExpertReport for CpuExperts<'_> {
    fn describe(&self) -> String {
        format!(
            "{} computed on the CPU from the mapped file",
            self.file.variants()[self.variant]
        )
    }
}
