//! Decode experts on the CPU helper threads (cooperative mode, `--cpu-experts`): each job is one
//! expert's SwiGLU FFN for one token, restricted to the leading `rows` rows of its ffn dimension
//! when another device computes the rest.
//!
//! A layer's jobs take two parallel passes: the gate and up rows of every job, then the down
//! rows of every job (each output element is one row's dot product in a fixed order, whichever
//! thread computes it). Measured on the device host (benches/cpu_ffn.rs, 2026-11-23): a layer
//! of two f16 experts streams at the host's read rate, and a schedule that starts each job's
//! down rows as soon as its own gate/up rows are done (one ragged end per layer instead of
//! two) was no faster, in the bench or in cooperative decoding; nor were 4x smaller blocks.

use crate::quant::Matrix;

use super::{CpuBackend, MatVec};

/// One expert for one decode token: `weight * down[.., ..rows] · swiglu(gate[..rows] · x,
/// up[..rows] · x)`.
#[derive(Clone, Copy)]
pub struct FfnJob<'m> {
    /// gate [ffn, hidden], up [ffn, hidden], down [hidden, ffn]
    pub mats: [Matrix<'m>; 3],
    /// Leading rows of the ffn dimension computed here (for quantized down matrices a whole
    /// number of groups).
    pub rows: usize,
    pub weight: f32,
}

fn silu_mul(g: &mut [f32], u: &[f32]) {
    for (g, u) in g.iter_mut().zip(u) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

impl CpuBackend {
    /// The weighted sum of `jobs`' outputs for the decode input `x` ([hidden]), [hidden].
    pub fn ffn_decode(&self, jobs: &[FfnJob<'_>], x: &[f32]) -> Vec<f32> {
        let Some(first) = jobs.first() else {
            return Vec::new();
        };
        let h = first.mats[2].rows;
        for j in jobs {
            assert!(
                j.mats[0].cols == x.len() && j.mats[1].cols == x.len() && j.mats[2].rows == h,
                "FFN job shapes"
            );
            assert!(
                j.rows <= j.mats[0].rows && j.rows <= j.mats[2].cols,
                "FFN job rows"
            );
        }
        let downs = self.ffn_downs(jobs, x, h);
        let mut out = vec![0.0f32; h];
        for (job, d) in jobs.iter().zip(downs.chunks(h)) {
            for (o, d) in out.iter_mut().zip(d) {
                *o += job.weight * d;
            }
        }
        out
    }

    /// Each job's down output, [jobs, hidden].
    fn ffn_downs(&self, jobs: &[FfnJob<'_>], x: &[f32], h: usize) -> Vec<f32> {
        let width = jobs.iter().map(|j| j.rows).max().unwrap_or(0);
        let mut gu = vec![0.0f32; jobs.len() * 2 * width];
        let mut tasks = Vec::with_capacity(2 * jobs.len());
        for (job, buf) in jobs.iter().zip(gu.chunks_mut(2 * width)) {
            let (g, u) = buf.split_at_mut(width);
            let n = job.rows;
            for (w, out) in [(job.mats[0], &mut g[..n]), (job.mats[1], &mut u[..n])] {
                tasks.push(MatVec {
                    w: w.top_rows(n),
                    cols: x.len(),
                    x,
                    out,
                });
            }
        }
        self.matvec_many(tasks);
        for (job, buf) in jobs.iter().zip(gu.chunks_mut(2 * width)) {
            let (g, u) = buf.split_at_mut(width);
            silu_mul(&mut g[..job.rows], &u[..job.rows]);
        }
        let mut down = vec![0.0f32; jobs.len() * h];
        let tasks = jobs
            .iter()
            .zip(gu.chunks(2 * width))
            .zip(down.chunks_mut(h))
            .map(|((job, buf), out)| MatVec {
                w: job.mats[2],
                cols: job.rows,
                x: &buf[..job.rows],
                out,
            })
            .collect();
        self.matvec_many(tasks);
        down
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::DType;

    fn mat(rows: usize, cols: usize, seed: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| (((i + seed) * 7919) % 23) as f32 / 11.0 - 1.0)
            .collect()
    }

    /// Against a plain f64 reference, whole and split rows; bit-identical for any thread count.
    #[test]
    fn schedules_agree_with_the_reference_and_each_other() {
        let (h, f) = (24, 40);
        let ws: Vec<[Vec<f32>; 3]> = (0..3)
            .map(|e| [mat(f, h, 3 * e), mat(f, h, 3 * e + 1), mat(h, f, 3 * e + 2)])
            .collect();
        let x: Vec<f32> = (0..h).map(|i| 0.1 * (i % 7) as f32 - 0.3).collect();
        let jobs_of = |rows: &[usize]| -> Vec<FfnJob<'_>> {
            ws.iter()
                .zip(rows)
                .enumerate()
                .map(|(e, (w, &rows))| FfnJob {
                    mats: [
                        Matrix::dense(DType::F32, f, h, bytemuck::cast_slice(&w[0])),
                        Matrix::dense(DType::F32, f, h, bytemuck::cast_slice(&w[1])),
                        Matrix::dense(DType::F32, h, f, bytemuck::cast_slice(&w[2])),
                    ],
                    rows,
                    weight: 0.5 + e as f32,
                })
                .collect()
        };
        for rows in [[f, f, f], [f, 16, 3]] {
            let jobs = jobs_of(&rows);
            let mut want = vec![0.0f64; h];
            for (e, job) in jobs.iter().enumerate() {
                let w = &ws[e];
                let act: Vec<f64> = (0..job.rows)
                    .map(|r| {
                        let dot = |m: &[f32]| {
                            (0..h)
                                .map(|c| m[r * h + c] as f64 * x[c] as f64)
                                .sum::<f64>()
                        };
                        let g = dot(&w[0]);
                        g / (1.0 + (-g).exp()) * dot(&w[1])
                    })
                    .collect();
                for (o, want) in want.iter_mut().enumerate() {
                    let d: f64 = (0..job.rows).map(|c| w[2][o * f + c] as f64 * act[c]).sum();
                    *want += job.weight as f64 * d;
                }
            }
            let mut first: Option<Vec<f32>> = None;
            for threads in [1, 3] {
                let got = CpuBackend::new(threads).unwrap().ffn_decode(&jobs, &x);
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (*g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()),
                        "{threads} threads, rows {rows:?}: {g} vs {w}"
                    );
                }
                match &first {
                    Some(f) => assert_eq!(f, &got, "{threads} threads"),
                    None => first = Some(got),
                }
            }
        }
        assert!(CpuBackend::new(1).unwrap().ffn_decode(&[], &x).is_empty());
    }
}
