//! CPU helper threads computing decode experts from host memory (cooperative mode,
//! `--cpu-experts`): a persistent pool, and one layer's experts as two parallel passes (the gate
//! and up rows of every expert, then the down rows of every expert). Every output element is
//! one row's dot product in a fixed order, so results do not depend on the thread count.
//!
//! The passes run on a fork-join team (the CPU backend's), whose idle threads spin, then yield,
//! then park: a Qwen3-sized expert is ~10 us of work per thread, which rayon's wake-ups per pass
//! dwarfed. The rayon pool stays for tasks that run beside the caller (`in_place_scope`) and for
//! the loader's checksums.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use std::sync::Mutex;

use crate::backend::cpu::Team;
use crate::model::ExpertAct;
use crate::quant::Matrix;

/// One expert for one decode token: `weight * down · swiglu(gate · x, up · x)`.
#[derive(Clone, Copy)]
pub struct FfnJob<'m> {
    /// gate [ffn, hidden], up [ffn, hidden], down [hidden, ffn]
    pub mats: [Matrix<'m>; 3],
    pub weight: f32,
    /// The activation, and the expert's gate, up and down biases where it has them.
    pub act: ExpertAct,
    pub biases: Option<[&'m [f32]; 3]>,
}

/// One product of [`HelperPool::matvec_many`]: out = w · x.
pub struct MatVec<'m, 'x, 'o> {
    pub w: Matrix<'m>,
    pub x: &'x [f32],
    pub out: &'o mut [f32],
}

/// How the helpers' parallel passes went, summed since the pool started: passes, the worker
/// threads that took part in each, and how long after the first of them the last finished (a
/// pass's ragged end: longer when the host deschedules a core).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PassStats {
    pub passes: u64,
    pub threads: u64,
    pub spread_seconds: f64,
}

impl PassStats {
    /// self minus an earlier snapshot `base`.
    pub fn since(self, base: PassStats) -> PassStats {
        PassStats {
            passes: self.passes - base.passes,
            threads: self.threads - base.threads,
            spread_seconds: self.spread_seconds - base.spread_seconds,
        }
    }
}

#[derive(Default)]
struct PassCounters {
    passes: AtomicU64,
    threads: AtomicU64,
    spread_ns: AtomicU64,
}

/// Rows handed to one task: enough work to amortize scheduling, small enough to balance.
const MIN_ROWS_PER_TASK: usize = 16;

/// The helper threads (cheap to clone: one pool).
#[derive(Clone)]
pub struct HelperPool {
    pool: Arc<rayon::ThreadPool>,
    team: Arc<Team>,
    passes: Arc<PassCounters>,
}

impl HelperPool {
    /// A pool of `threads` workers (0: one per available core).
    pub fn new(threads: usize) -> crate::Result<HelperPool> {
        let pool = crate::platform::thread_pool(threads, "hob-helper")?;
        let team = Team::new(pool.current_num_threads(), "hob-expert")?;
        Ok(HelperPool {
            pool: Arc::new(pool),
            team: Arc::new(team),
            passes: Arc::default(),
        })
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// [`PassStats`] since this pool started.
    pub fn pass_stats(&self) -> PassStats {
        let c = &self.passes;
        PassStats {
            passes: c.passes.load(Ordering::Relaxed),
            threads: c.threads.load(Ordering::Relaxed),
            spread_seconds: c.spread_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }

    /// Run `f` on this thread with a scope whose spawned tasks run on the pool; returns once
    /// they have all finished.
    pub fn in_place_scope<'s, R>(&self, f: impl FnOnce(&rayon::Scope<'s>) -> R) -> R {
        self.pool.in_place_scope(f)
    }

    /// Run `f` inside the pool (nested parallel calls use its threads).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    fn rows_per_task(&self, rows: usize) -> usize {
        rows.div_ceil(self.threads() * 4).max(MIN_ROWS_PER_TASK)
    }

    /// Several matrix-vector products in one parallel pass (one fork-join for all, their row
    /// blocks interleaved on the team).
    pub fn matvec_many(&self, tasks: Vec<MatVec<'_, '_, '_>>) {
        for task in &tasks {
            assert_eq!(task.x.len(), task.w.cols, "matvec input length");
            assert_eq!(task.out.len(), task.w.rows, "matvec output length");
        }
        let ws: Vec<(Matrix<'_>, &[f32])> = tasks.iter().map(|t| (t.w, t.x)).collect();
        let mut blocks = Vec::new();
        for (t, task) in tasks.into_iter().enumerate() {
            let chunk = self.rows_per_task(task.w.rows);
            for (i, o) in task.out.chunks_mut(chunk).enumerate() {
                blocks.push(Mutex::new((t, i * chunk, o)));
            }
        }
        // Per thread: when it finished its last block, ns after the pass started (0: none).
        let finished: Vec<AtomicU64> = (0..self.threads()).map(|_| AtomicU64::new(0)).collect();
        let started = Instant::now();
        self.team.for_each(blocks.len(), |b| {
            let mut block = blocks[b].lock().unwrap_or_else(|e| e.into_inner());
            let (t, r0, ref mut o) = *block;
            let (w, x) = &ws[t];
            w.matvec_rows(x, r0..r0 + o.len(), o);
            if let Some(f) = finished.get(Team::thread_index()) {
                let ns = started.elapsed().as_nanos().max(1) as u64;
                f.fetch_max(ns, Ordering::Relaxed);
            }
        });
        let ends: Vec<u64> = finished
            .iter()
            .map(|f| f.load(Ordering::Relaxed))
            .filter(|&e| e > 0)
            .collect();
        if let (Some(first), Some(last)) = (ends.iter().min(), ends.iter().max()) {
            let c = &self.passes;
            c.passes.fetch_add(1, Ordering::Relaxed);
            c.threads.fetch_add(ends.len() as u64, Ordering::Relaxed);
            c.spread_ns.fetch_add(last - first, Ordering::Relaxed);
        }
    }

    /// The weighted sum of `jobs`' outputs for the decode input `x` ([hidden]), [hidden].
    pub fn ffn_decode(&self, jobs: &[FfnJob<'_>], x: &[f32]) -> Vec<f32> {
        let Some(first) = jobs.first() else {
            return Vec::new();
        };
        let h = first.mats[2].rows;
        for j in jobs {
            let f = j.mats[0].rows;
            assert!(
                j.mats[0].cols == x.len()
                    && j.mats[1].cols == x.len()
                    && j.mats[1].rows == f
                    && j.mats[2].rows == h
                    && j.mats[2].cols == f,
                "FFN job shapes"
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
        let width = jobs.iter().map(|j| j.mats[0].rows).max().unwrap_or(0);
        let mut gu = vec![0.0f32; jobs.len() * 2 * width];
        let mut tasks = Vec::with_capacity(2 * jobs.len());
        for (job, buf) in jobs.iter().zip(gu.chunks_mut(2 * width)) {
            let (g, u) = buf.split_at_mut(width);
            let n = job.mats[0].rows;
            for (w, out) in [(job.mats[0], &mut g[..n]), (job.mats[1], &mut u[..n])] {
                tasks.push(MatVec { w, x, out });
            }
        }
        self.matvec_many(tasks);
        for (job, buf) in jobs.iter().zip(gu.chunks_mut(2 * width)) {
            let (g, u) = buf.split_at_mut(width);
            let n = job.mats[0].rows;
            match job.biases {
                Some([bg, bu, _]) => {
                    for (((g, &u), &bg), &bu) in g[..n].iter_mut().zip(&u[..n]).zip(bg).zip(bu) {
                        *g = job.act.apply(*g + bg, u + bu);
                    }
                }
                None => g[..n]
                    .iter_mut()
                    .zip(&u[..n])
                    .for_each(|(g, &u)| *g = job.act.apply(*g, u)),
            }
        }
        let mut down = vec![0.0f32; jobs.len() * h];
        let tasks = jobs
            .iter()
            .zip(gu.chunks(2 * width))
            .zip(down.chunks_mut(h))
            .map(|((job, buf), out)| MatVec {
                w: job.mats[2],
                x: &buf[..job.mats[2].cols],
                out,
            })
            .collect();
        self.matvec_many(tasks);
        for (job, d) in jobs.iter().zip(down.chunks_mut(h)) {
            if let Some([_, _, bd]) = job.biases {
                d.iter_mut().zip(bd).for_each(|(d, b)| *d += b);
            }
        }
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

    /// Products in one pass, each task's rows whole; a pass counted per call.
    #[test]
    fn matvec_many_multiplies_every_task_in_one_pass() {
        let (rows, cols) = (40, 24);
        let (w, v) = (mat(rows, cols, 1), mat(rows, cols, 5));
        let m = Matrix::dense(DType::F32, rows, cols, bytemuck::cast_slice(&w));
        let n = Matrix::dense(DType::F32, rows, cols, bytemuck::cast_slice(&v));
        let x: Vec<f32> = (0..cols).map(|i| 0.25 * (i % 5) as f32 - 0.5).collect();
        let p = HelperPool::new(2).unwrap();
        let (mut a, mut b) = (vec![0.0; rows], vec![0.0; rows]);
        p.matvec_many(vec![
            MatVec {
                w: m,
                x: &x,
                out: &mut a,
            },
            MatVec {
                w: n,
                x: &x,
                out: &mut b,
            },
        ]);
        for r in 0..rows {
            let dot = |m: &[f32]| (0..cols).map(|c| m[r * cols + c] * x[c]).sum::<f32>();
            assert!((a[r] - dot(&w)).abs() < 1e-4, "row {r}");
            assert!((b[r] - dot(&v)).abs() < 1e-4, "row {r}");
        }
        let first = p.pass_stats();
        assert_eq!(first.passes, 1);
        assert!((1..=2).contains(&first.threads), "{first:?}");
        p.matvec_many(vec![MatVec {
            w: m,
            x: &x,
            out: &mut a,
        }]);
        assert_eq!(p.pass_stats().since(first).passes, 1);
    }

    /// Against a plain f64 reference; bit-identical for any thread count.
    #[test]
    fn ffn_decode_agrees_with_the_reference_for_any_thread_count() {
        let (h, f) = (24, 40);
        let ws: Vec<[Vec<f32>; 3]> = (0..3)
            .map(|e| [mat(f, h, 3 * e), mat(f, h, 3 * e + 1), mat(h, f, 3 * e + 2)])
            .collect();
        let x: Vec<f32> = (0..h).map(|i| 0.1 * (i % 7) as f32 - 0.3).collect();
        let jobs: Vec<FfnJob<'_>> = ws
            .iter()
            .enumerate()
            .map(|(e, w)| FfnJob {
                mats: [
                    Matrix::dense(DType::F32, f, h, bytemuck::cast_slice(&w[0])),
                    Matrix::dense(DType::F32, f, h, bytemuck::cast_slice(&w[1])),
                    Matrix::dense(DType::F32, h, f, bytemuck::cast_slice(&w[2])),
                ],
                weight: 0.5 + e as f32,
                act: ExpertAct::SiluGlu,
                biases: None,
            })
            .collect();
        {
            let mut want = vec![0.0f64; h];
            for (e, job) in jobs.iter().enumerate() {
                let w = &ws[e];
                let act: Vec<f64> = (0..f)
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
                    let d: f64 = (0..f).map(|c| w[2][o * f + c] as f64 * act[c]).sum();
                    *want += job.weight as f64 * d;
                }
            }
            let mut first: Option<Vec<f32>> = None;
            for threads in [1, 3] {
                let got = HelperPool::new(threads).unwrap().ffn_decode(&jobs, &x);
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (*g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()),
                        "{threads} threads: {g} vs {w}"
                    );
                }
                match &first {
                    Some(f) => assert_eq!(f, &got, "{threads} threads"),
                    None => first = Some(got),
                }
            }
        }
        assert!(HelperPool::new(1).unwrap().ffn_decode(&[], &x).is_empty());
    }
}
