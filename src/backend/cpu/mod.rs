//! The CPU backend: a persistent thread pool (rayon, built once) running quant's row kernels.
//! Every output element is computed by one thread in a fixed order, so results do not depend on
//! the thread count (`-t 1` and `-t N` give identical logits).

use rayon::prelude::*;

use std::ops::Range;

use crate::model::forward;
use crate::model::ops::{AttentionShape, Backend, Telemetry};
use crate::quant::Matrix;

pub struct CpuBackend {
    pool: rayon::ThreadPool,
}

/// Rows handed to one task: enough work to amortize scheduling, small enough to balance.
const MIN_ROWS_PER_TASK: usize = 16;

impl CpuBackend {
    /// A pool of `threads` workers (0: one per available core).
    pub fn new(threads: usize) -> crate::Result<CpuBackend> {
        Ok(CpuBackend {
            pool: crate::platform::thread_pool(threads, "hob-cpu")?,
        })
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Host memory read bandwidth with this pool's threads, GB/s: the best of three parallel
    /// passes summing a `bytes`-sized buffer (what CPU experts can stream at most; the physical
    /// limit of cooperative decoding uses it).
    pub fn read_bandwidth_gbs(&self, bytes: usize) -> f64 {
        let words = vec![1u64; bytes / 8];
        let mut best = 0.0f64;
        for _ in 0..3 {
            let started = std::time::Instant::now();
            let sum: u64 = self.pool.install(|| {
                words
                    .par_chunks(1 << 16)
                    .map(|c| c.iter().fold(0u64, |a, &w| a.wrapping_add(w)))
                    .reduce(|| 0, u64::wrapping_add)
            });
            let secs = started.elapsed().as_secs_f64();
            std::hint::black_box(sum);
            best = best.max(words.len() as f64 * 8.0 / secs / 1e9);
        }
        best
    }

    fn rows_per_task(&self, rows: usize) -> usize {
        rows.div_ceil(self.threads() * 4).max(MIN_ROWS_PER_TASK)
    }
}

impl CpuBackend {
    /// out[t, w.rows] = x[t, w.cols] · wᵀ on host slices.
    pub fn matmul_f32(&self, w: &Matrix<'_>, x: &[f32], t: usize, out: &mut [f32]) {
        let (rows, cols) = (w.rows, w.cols);
        assert_eq!(x.len(), t * cols, "matmul input length");
        assert_eq!(out.len(), t * rows, "matmul output length");
        let chunk = self.rows_per_task(rows);
        if t == 1 {
            self.pool.install(|| {
                out.par_chunks_mut(chunk).enumerate().for_each(|(i, o)| {
                    let r0 = i * chunk;
                    w.matvec_rows(x, r0..r0 + o.len(), o);
                })
            });
            return;
        }
        // Batched: each task dequantizes its block of rows once and multiplies it with every
        // token's input; outt is (rows, t), transposed into out afterwards.
        let mut outt = vec![0.0f32; rows * t];
        self.pool.install(|| {
            outt.par_chunks_mut(chunk * t)
                .enumerate()
                .for_each_init(Vec::new, |scratch, (i, o)| {
                    let r0 = i * chunk;
                    w.matmul_rows(x, t, r0..r0 + o.len() / t, o, scratch);
                })
        });
        for (r, col) in outt.chunks_exact(t).enumerate() {
            for (ti, &v) in col.iter().enumerate() {
                out[ti * rows + r] = v;
            }
        }
    }

    /// Causal GQA attention over f32 caches [positions, kv_dim] (the new tokens written).
    pub fn attention_f32(
        &self,
        s: AttentionShape,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        out: &mut [f32],
    ) {
        let (hd, qd) = (s.head_dim, s.n_heads * s.head_dim);
        let kvd = s.n_kv_heads * hd;
        let group = s.n_heads / s.n_kv_heads;
        let scale = 1.0 / (hd as f32).sqrt();
        // One head of one token: softmax(q·Kᵀ * scale) · V over positions 0..=pos.
        let head = |i: usize, h: usize, o: &mut [f32], scores: &mut Vec<f32>| {
            let pos = s.start_pos + i;
            let qh = &q[i * qd + h * hd..i * qd + (h + 1) * hd];
            let kvh = (h / group) * hd;
            let first = s.window.map_or(0, |w| (pos + 1).saturating_sub(w));
            scores.clear();
            scores.extend((first..=pos).map(|p| {
                let k = &k_cache[p * kvd + kvh..p * kvd + kvh + hd];
                qh.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale
            }));
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            o.fill(0.0);
            for (p, &w) in (first..).zip(scores.iter()) {
                let v = &v_cache[p * kvd + kvh..p * kvd + kvh + hd];
                let w = w / sum;
                for (o, &v) in o.iter_mut().zip(v) {
                    *o += w * v;
                }
            }
        };
        self.pool.install(|| {
            if s.t == 1 {
                out.par_chunks_mut(hd)
                    .enumerate()
                    .for_each_init(Vec::new, |scores, (h, o)| head(0, h, o, scores));
            } else {
                out.par_chunks_mut(qd)
                    .enumerate()
                    .for_each_init(Vec::new, |scores, (i, o)| {
                        for (h, oh) in o.chunks_exact_mut(hd).enumerate() {
                            head(i, h, oh, scores);
                        }
                    });
            }
        });
    }
}

/// The CPU does no work of its own to report.
impl Telemetry for CpuBackend {}

/// The CPU KV cache: (layer, ctx, kv_dim) keys and values in f32.
pub struct CpuKv {
    ctx: usize,
    kv_dim: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Kv = CpuKv;
    type Host = Vec<f32>;

    fn alloc(&self, n: usize) -> crate::Result<Vec<f32>> {
        Ok(vec![0.0; n])
    }

    fn alloc_kv(&self, layers: usize, ctx: usize, kv_dim: usize) -> crate::Result<CpuKv> {
        let n = layers * ctx * kv_dim;
        Ok(CpuKv {
            ctx,
            kv_dim,
            k: vec![0.0; n],
            v: vec![0.0; n],
        })
    }

    fn upload(&self, src: &[f32], dst: &mut Vec<f32>) -> crate::Result<()> {
        dst[..src.len()].copy_from_slice(src);
        Ok(())
    }

    fn alloc_host(&self, n: usize) -> crate::Result<Vec<f32>> {
        Ok(vec![0.0; n])
    }

    fn download_host(&self, src: &Vec<f32>, dst: &mut Vec<f32>, n: usize) -> crate::Result<()> {
        self.download(src, &mut dst[..n])
    }

    fn download(&self, src: &Vec<f32>, dst: &mut [f32]) -> crate::Result<()> {
        dst.copy_from_slice(&src[..dst.len()]);
        Ok(())
    }

    fn matmul(
        &self,
        w: &Matrix<'_>,
        x: &Vec<f32>,
        t: usize,
        out: &mut Vec<f32>,
    ) -> crate::Result<()> {
        self.matmul_f32(w, &x[..t * w.cols], t, &mut out[..t * w.rows]);
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &Vec<f32>,
        rows: Range<usize>,
        w: &[f32],
        eps: f32,
        out: &mut Vec<f32>,
    ) -> crate::Result<()> {
        let n = w.len();
        forward::rms_norm(
            &x[rows.start * n..rows.end * n],
            w,
            eps,
            &mut out[..rows.len() * n],
        );
        Ok(())
    }

    fn rope(
        &self,
        x: &mut Vec<f32>,
        t: usize,
        width: usize,
        start_pos: usize,
        inv_freq: &[f32],
    ) -> crate::Result<()> {
        for (i, row) in x[..t * width].chunks_exact_mut(width).enumerate() {
            forward::rope_row(row, start_pos + i, inv_freq);
        }
        Ok(())
    }

    fn add_assign(&self, x: &mut Vec<f32>, y: &Vec<f32>, n: usize) -> crate::Result<()> {
        forward::add_assign(&mut x[..n], &y[..n]);
        Ok(())
    }

    fn kv_write(
        &self,
        kv: &mut CpuKv,
        (layer, start): (usize, usize),
        t: usize,
        k: &Vec<f32>,
        v: &Vec<f32>,
    ) -> crate::Result<()> {
        let d = kv.kv_dim;
        let at = (layer * kv.ctx + start) * d;
        kv.k[at..at + t * d].copy_from_slice(&k[..t * d]);
        kv.v[at..at + t * d].copy_from_slice(&v[..t * d]);
        Ok(())
    }

    fn attention(
        &self,
        shape: AttentionShape,
        q: &Vec<f32>,
        kv: &CpuKv,
        layer: usize,
        out: &mut Vec<f32>,
    ) -> crate::Result<()> {
        let d = kv.kv_dim;
        let seen = layer * kv.ctx * d..(layer * kv.ctx + shape.start_pos + shape.t) * d;
        let qd = shape.n_heads * shape.head_dim;
        self.attention_f32(
            shape,
            &q[..shape.t * qd],
            &kv.k[seen.clone()],
            &kv.v[seen],
            &mut out[..shape.t * qd],
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attend(window: Option<usize>) -> Vec<f32> {
        let b = CpuBackend::new(2).unwrap();
        let shape = AttentionShape {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 2,
            start_pos: 2,
            t: 1,
            window,
        };
        let q = [1.0, 0.0, 0.0, 1.0];
        let k = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut out = vec![0.0; 4];
        b.attention_f32(shape, &q, &k, &v, &mut out);
        out
    }

    #[test]
    fn attention_is_softmax_weighted_values() {
        let out = attend(None);
        // Head 0: scores (1, 0, 1) / sqrt(2) over positions 0..=2.
        let s = 1.0f32 / 2.0f32.sqrt();
        let (e1, e0) = (s.exp(), 1.0f32);
        let z = 2.0 * e1 + e0;
        let expect0 = (e1 * 1.0 + e0 * 3.0 + e1 * 5.0) / z;
        assert!((out[0] - expect0).abs() < 1e-6, "{out:?}");
        // Head 1 uses the same KV head with scores (0, 1, 1) / sqrt(2).
        let expect1 = (e0 * 2.0 + e1 * 4.0 + e1 * 6.0) / z;
        assert!((out[3] - expect1).abs() < 1e-6, "{out:?}");
    }

    #[test]
    fn sliding_window_limits_the_positions_seen() {
        // A window of 1: each query sees only its own position.
        assert_eq!(attend(Some(1)), vec![5.0, 6.0, 5.0, 6.0]);
        assert_eq!(attend(Some(3)), attend(None));
    }
}
