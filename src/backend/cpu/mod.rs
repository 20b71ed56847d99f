//! The CPU backend: a team of threads (the caller and helpers, built once) running quant's row
//! kernels. Every output element is computed by one thread in a fixed order, so results do not
//! depend on the thread count (`-t 1` and `-t N` give identical logits).

mod team;

use std::cell::RefCell;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::model::forward;
use crate::model::ops::{AttentionShape, Backend, Telemetry};
use crate::quant::Matrix;

pub use team::Team;

pub struct CpuBackend {
    team: Team,
}

/// Rows handed to one item: enough work to amortize claiming it, small enough to balance.
const MIN_ROWS_PER_TASK: usize = 16;

thread_local! {
    /// Per-thread scratch: dequantized rows of a batched product, or attention scores.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl CpuBackend {
    /// A team of `threads` (0: one per available core), the calling thread included.
    pub fn new(threads: usize) -> crate::Result<CpuBackend> {
        let threads = if threads == 0 {
            crate::platform::cores()
        } else {
            threads
        };
        Ok(CpuBackend {
            team: Team::new(threads, "hob-cpu")?,
        })
    }

    pub fn threads(&self) -> usize {
        self.team.threads()
    }

    /// Host memory read bandwidth with this team, GB/s: the best of three parallel passes
    /// summing a `bytes`-sized buffer (what CPU experts can stream at most; the physical limit
    /// of cooperative decoding uses it).
    pub fn read_bandwidth_gbs(&self, bytes: usize) -> f64 {
        let words = vec![1u64; bytes / 8];
        let pieces: Vec<&[u64]> = words.chunks(1 << 16).collect();
        let mut best = 0.0f64;
        for _ in 0..3 {
            let started = std::time::Instant::now();
            let sum = AtomicU64::new(0);
            self.team.for_each(pieces.len(), |i| {
                let s = pieces[i].iter().fold(0u64, |a, &w| a.wrapping_add(w));
                sum.fetch_add(s, Ordering::Relaxed);
            });
            let secs = started.elapsed().as_secs_f64();
            std::hint::black_box(sum.load(Ordering::Relaxed));
            best = best.max(words.len() as f64 * 8.0 / secs / 1e9);
        }
        best
    }

    fn rows_per_task(&self, rows: usize) -> usize {
        rows.div_ceil(self.threads() * 4).max(MIN_ROWS_PER_TASK)
    }

    /// `f(i, chunk i)` for the `chunk`-long pieces of `out`, spread over the team.
    fn for_each_chunk(&self, out: &mut [f32], chunk: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
        let parts: Vec<Mutex<&mut [f32]>> = out.chunks_mut(chunk.max(1)).map(Mutex::new).collect();
        self.team.for_each(parts.len(), |i| {
            let mut part = parts[i].lock().unwrap_or_else(|e| e.into_inner());
            f(i, &mut part)
        });
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
            self.for_each_chunk(out, chunk, |i, o| {
                let r0 = i * chunk;
                w.matvec_rows(x, r0..r0 + o.len(), o);
            });
            return;
        }
        // Batched: each item dequantizes its block of rows once and multiplies it with every
        // token's input; outt is (rows, t), transposed into out afterwards.
        let mut outt = vec![0.0f32; rows * t];
        self.for_each_chunk(&mut outt, chunk * t, |i, o| {
            let r0 = i * chunk;
            SCRATCH
                .with_borrow_mut(|scratch| w.matmul_rows(x, t, r0..r0 + o.len() / t, o, scratch));
        });
        // Transposed back over the team in token ranges, 16 rows at a time (the 16 rows' lines
        // of outt stay in L1 across the range's tokens).
        let tokens = t.div_ceil(self.threads() * 2);
        self.for_each_chunk(out, tokens * rows, |j, o| {
            let t0 = j * tokens;
            for r0 in (0..rows).step_by(16) {
                let r1 = (r0 + 16).min(rows);
                for (ti, dst) in o.chunks_exact_mut(rows).enumerate() {
                    for (d, r) in dst[r0..r1].iter_mut().zip(r0..r1) {
                        *d = outt[r * t + t0 + ti];
                    }
                }
            }
        });
    }

    /// Causal GQA attention over f32 caches [positions, kv_dim] (the new tokens written).
    pub fn attention_f32(
        &self,
        s: AttentionShape<'_>,
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
                dot(qh, k) * scale
            }));
            let sink = s.sinks.map(|k| k[h]);
            let max = scores
                .iter()
                .copied()
                .fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
            let mut sum = sink.map_or(0.0, |k| (k - max).exp());
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
        let per = if s.t == 1 { hd } else { qd };
        self.for_each_chunk(out, per, |i, o| {
            SCRATCH.with_borrow_mut(|scores| {
                if s.t == 1 {
                    head(0, i, o, scores);
                } else {
                    for (h, oh) in o.chunks_exact_mut(hd).enumerate() {
                        head(i, h, oh, scores);
                    }
                }
            })
        });
    }
}

/// a · b over 16 independent lanes (a loop the compiler vectorizes, where one running sum does
/// not), summed pairwise at the end.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for j in 0..16 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut n = 16;
    while n > 1 {
        n /= 2;
        for j in 0..n {
            acc[j] += acc[j + n];
        }
    }
    acc[0] + tail
}

/// The CPU does no work of its own to report.
impl Telemetry for CpuBackend {}

/// The CPU KV cache: (layer, ctx, kv_dim) keys and values in f32.
pub struct CpuKv {
    ctx: usize,
    kv_dim: usize,
    k: Vec<f32>,
    /// Empty where the values are the keys (`alloc_kv`).
    v: Vec<f32>,
    values_are_keys: bool,
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Kv = CpuKv;
    type Host = Vec<f32>;

    fn alloc(&self, n: usize) -> crate::Result<Vec<f32>> {
        Ok(vec![0.0; n])
    }

    fn alloc_kv(
        &self,
        layers: usize,
        ctx: usize,
        kv_dim: usize,
        values_are_keys: bool,
    ) -> crate::Result<CpuKv> {
        let n = layers * ctx * kv_dim;
        Ok(CpuKv {
            ctx,
            kv_dim,
            k: vec![0.0; n],
            v: vec![0.0; if values_are_keys { 0 } else { n }],
            values_are_keys,
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
        if !kv.values_are_keys {
            kv.v[at..at + t * d].copy_from_slice(&v[..t * d]);
        }
        Ok(())
    }

    fn attention(
        &self,
        shape: AttentionShape<'_>,
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
            if kv.values_are_keys {
                &kv.k[seen]
            } else {
                &kv.v[seen]
            },
            &mut out[..shape.t * qd],
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attend(window: Option<usize>) -> Vec<f32> {
        attend_with(window, None)
    }

    fn attend_with(window: Option<usize>, sinks: Option<&[f32]>) -> Vec<f32> {
        let b = CpuBackend::new(2).unwrap();
        let shape = AttentionShape {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 2,
            start_pos: 2,
            t: 1,
            window,
            sinks,
        };
        let q = [1.0, 0.0, 0.0, 1.0];
        let k = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut out = vec![0.0; 4];
        b.attention_f32(shape, &q, &k, &v, &mut out);
        out
    }

    /// The reads a decode token's expert executor asks with its routes (`RouteReads`) are the
    /// product of xn and xn as the separate ops give them, and leave the routes as they are.
    #[test]
    fn reads_with_the_routes_are_the_separate_ops() {
        use crate::format::DType;
        use crate::model::experts::{ExpertFfn, MoeBlock};
        use crate::model::ops::{Route, RouteOut, RouteReads};
        use crate::model::routing::Routing;
        let b = CpuBackend::new(2).unwrap();
        let (n, ne, rows) = (8, 4, 6);
        let f = |len: usize, m: f32| -> Vec<u8> {
            (0..len)
                .flat_map(|i| ((i * 7 % 11) as f32 * m - 0.3).to_le_bytes())
                .collect()
        };
        let (rb, sb) = (f(ne * n, 0.05), f(rows * n, 0.03));
        let router = Matrix::dense(DType::F32, ne, n, &rb);
        let stacked = Matrix::dense(DType::F32, rows, n, &sb);
        let norm = vec![1.0f32; n];
        let block = MoeBlock {
            norm: &norm,
            router: &router,
            next: None,
            eps: 1e-5,
            routing: Routing::Softmax { renormalize: true },
            norm_bias: None,
            router_bias: None,
            ffn: &ExpertFfn::PLAIN,
        };
        let x: Vec<f32> = (0..n).map(|i| i as f32 - 3.5).collect();
        let none = Route {
            expert: 0,
            weight: 0.0,
        };
        let run = |reads: bool| {
            let (mut xn, mut lg, mut prod) = (vec![0.0; n], vec![0.0; ne], vec![0.0; rows]);
            let (mut routes, mut host) = (vec![none; 2], Vec::new());
            let (mut ph, mut xh) = (vec![0.0; rows], vec![0.0; n]);
            let reads = match reads {
                true => RouteReads {
                    product: Some((stacked, &mut prod, &mut ph[..])),
                    xn: Some(&mut xh[..]),
                },
                false => RouteReads::NONE,
            };
            let out = RouteOut {
                xn: &mut xn,
                logits: &mut lg,
                routes: &mut routes,
                host: &mut host,
                reads,
            };
            b.norm_route(&x, 1, &block, out).unwrap();
            (routes, xn, ph, xh)
        };
        let (r0, xn, _, _) = run(false);
        let (r1, _, ph, xh) = run(true);
        assert_eq!(r0, r1);
        assert_eq!(xh, xn);
        let mut prod = vec![0.0; rows];
        b.matmul(&stacked, &xn, 1, &mut prod).unwrap();
        assert_eq!(ph, prod);
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
    fn a_sink_takes_its_share_of_the_softmax_and_adds_no_value() {
        // A window of 1 leaves one position of score s: a sink logit k scales its value by
        // e^s / (e^s + e^k).
        let out = attend_with(Some(1), Some(&[0.5, -2.0]));
        let s = [1.0f32 / 2.0f32.sqrt(), 1.0 / 2.0f32.sqrt()];
        for (h, (k, v)) in [(0.5f32, 5.0f32), (-2.0, 6.0)].into_iter().enumerate() {
            let p = s[h].exp() / (s[h].exp() + k.exp());
            assert!((out[h * 2 + h] - p * v).abs() < 1e-6, "{out:?}");
        }
    }

    #[test]
    fn sliding_window_limits_the_positions_seen() {
        // A window of 1: each query sees only its own position.
        assert_eq!(attend(Some(1)), vec![5.0, 6.0, 5.0, 6.0]);
        assert_eq!(attend(Some(3)), attend(None));
    }

    #[test]
    fn a_cache_whose_values_are_its_keys_stores_them_once() {
        // MLA's rows: attention over a cache that keeps the keys only equals attention over
        // one that stores the same rows as keys and as values.
        let b = CpuBackend::new(1).unwrap();
        let shape = AttentionShape {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 2,
            start_pos: 0,
            t: 3,
            window: None,
            sinks: None,
        };
        let rows = vec![1.0, 0.0, 0.5, 1.0, 1.0, 1.0];
        let q = vec![1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0];
        let mut attended = Vec::new();
        for once in [false, true] {
            let mut kv = b.alloc_kv(2, 4, 2, once).unwrap();
            assert_eq!(kv.v.len(), if once { 0 } else { 16 });
            b.kv_write(&mut kv, (1, 0), 3, &rows, &rows).unwrap();
            let mut out = vec![0.0; 12];
            b.attention(shape, &q, &kv, 1, &mut out).unwrap();
            attended.push(out);
        }
        assert_eq!(attended[0], attended[1]);
    }
}
