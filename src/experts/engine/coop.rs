//! Cooperative decode (`--cpu-experts`): a missed expert may be computed by the CPU helpers from
//! host memory instead of loaded, whichever of the link and the CPU frees up first by a cost
//! model (measured load bandwidth against the moving-average CPU time per expert and variant);
//! a miss the CPU computes may also be loaded behind it over an idle link (experts::behind), so
//! the cache keeps following the routing.

use std::time::{Duration, Instant};

use super::helpers::{FfnJob, HelperPool, PassStats};
use crate::experts::behind::LoadBehind;
use crate::format::HobFile;
use crate::model::experts::ExpertFfn;
use crate::model::ExpertDevice;
use crate::quant::Matrix;

/// A variant's misses sent to the link in a row before one goes to the CPU to re-measure it (a
/// slow sample would otherwise keep a variant off the CPU for good).
const PROBE_EVERY: u32 = 8;

/// A decode expert the CPU helpers compute.
#[derive(Clone, Copy, Debug)]
pub struct CpuJob {
    pub expert: usize,
    pub variant: usize,
    pub weight: f32,
}

/// What the helpers report per job: (variant, seconds).
pub type CpuTimes = Vec<(usize, f64)>;

/// What a background CPU task sends back: its output ([hidden]), per-job times, and when it
/// started and ended.
pub type CpuResult = (Vec<f32>, CpuTimes, Instant, Instant);

pub struct Cooperative {
    pub pool: HelperPool,
    /// Seconds per CPU-computed expert, per variant (measured at start, refreshed by every CPU
    /// expert), and the misses per variant sent to the link since the CPU last computed one.
    cpu_s: Vec<Option<f64>>,
    since_cpu: Vec<u32>,
    /// The current layer's input on the host, and the layer it was read for.
    pub host_x: Vec<f32>,
    x_layer: Option<usize>,
    /// Seconds the helpers computed and the engine waited for them, since the last reset.
    pub busy: f64,
    pub wait: Duration,
    /// The helpers' idle time between two consecutive layers' jobs of one token (the parts of
    /// `ExpertStats::cpu_gaps`), and the last layer with background jobs: (layer, when its CPU
    /// work ended, when the layer returned).
    pub gaps: [Duration; 4],
    /// The placing part of `gaps` in four: planning, placing the experts (their loads queued),
    /// predicting the next layers, x's read-back and the hand-over.
    pub placing: [Duration; 4],
    mark: Option<(usize, Instant, Instant)>,
    pass_base: PassStats,
    pub load_behind: bool,
    pub behind: LoadBehind,
}

impl Cooperative {
    /// Room for decode layer `layer`'s input ([hidden]), which the backend reads back with the
    /// layer's routes.
    pub fn x_with_routes(&mut self, layer: usize, hidden: usize) -> &mut [f32] {
        self.host_x.resize(hidden, 0.0);
        self.x_layer = Some(layer);
        &mut self.host_x
    }

    /// host_x = `xs`, layer `layer`'s input, unless it is there already.
    pub fn read_x<D: ExpertDevice>(
        &mut self,
        dev: &D,
        layer: usize,
        (xs, hidden): (&D::Buf, usize),
    ) -> crate::Result<()> {
        if self.x_layer != Some(layer) {
            self.host_x.resize(hidden, 0.0);
            dev.download(xs, &mut self.host_x)?;
            self.x_layer = Some(layer);
        }
        Ok(())
    }

    /// The layer has run: host_x is no longer its input's copy.
    /// Layer `layer`'s input x, as the device sent it (gated decode's mailbox).
    pub fn set_x(&mut self, layer: usize, x: &[f32]) {
        self.host_x.clear();
        self.host_x.extend_from_slice(x);
        self.x_layer = Some(layer);
    }

    pub fn layer_done(&mut self) {
        self.x_layer = None;
    }

    pub fn new(threads: usize, variants: usize, load_behind: bool) -> crate::Result<Self> {
        Ok(Cooperative {
            pool: HelperPool::new(threads)?,
            cpu_s: vec![None; variants],
            since_cpu: vec![0; variants],
            host_x: Vec::new(),
            x_layer: None,
            busy: 0.0,
            wait: Duration::ZERO,
            gaps: [Duration::ZERO; 4],
            placing: [Duration::ZERO; 4],
            mark: None,
            pass_base: PassStats::default(),
            load_behind,
            behind: LoadBehind::default(),
        })
    }

    /// The cost model's estimates, seconds per expert per variant.
    pub fn estimates(&self) -> Vec<Option<f64>> {
        self.cpu_s.clone()
    }

    pub fn estimate(&self, variant: usize) -> Option<f64> {
        self.cpu_s[variant]
    }

    /// Greedy: whether a miss (as `variant`) goes to the CPU, busy for `cpu_busy` seconds,
    /// rather than the link, busy for `load_busy` and then `load_s` for it. Unmeasured variants
    /// go to the CPU once to be measured.
    pub fn goes_to_cpu(
        &mut self,
        variant: usize,
        cpu_busy: f64,
        load_busy: f64,
        load_s: f64,
    ) -> bool {
        let go = match self.cpu_s[variant] {
            None => true,
            Some(_) if self.since_cpu[variant] >= PROBE_EVERY => true,
            Some(c) => cpu_busy + c < load_busy + load_s,
        };
        if !go {
            self.since_cpu[variant] += 1;
        }
        go
    }

    /// A miss (as `variant`) goes to the CPU: its expected seconds.
    pub fn take(&mut self, variant: usize) -> f64 {
        self.since_cpu[variant] = 0;
        self.cpu_s[variant].unwrap_or(0.0)
    }

    /// Time one expert of each of `variants` on the helpers (the second of two runs, so thread
    /// start-up is not charged): the cost model's first estimates.
    pub fn calibrate(&mut self, file: &HobFile, variants: &[usize]) {
        let x = vec![0.01f32; file.expert_dims().0];
        for &v in variants {
            let job = [CpuJob {
                expert: 0,
                variant: v,
                weight: 1.0,
            }];
            let mut secs = 0.0;
            let est = self.estimates();
            for _ in 0..2 {
                let plain = &ExpertFfn::PLAIN;
                let (_, times) = compute(file, &self.pool, (&job, plain), (0, &x), &est);
                secs = times.first().map_or(0.0, |t| t.1);
            }
            self.cpu_s[v] = Some(secs);
            log::info!(
                "CPU experts: one {} expert in {:.2} ms ({:.1} GB/s)",
                file.variants()[v],
                secs * 1e3,
                file.expert_layout(v).size as f64 / secs.max(1e-9) / 1e9
            );
        }
    }

    /// Compute `jobs` of `layer` (its experts' `ffn`) now from `host_x`, adding into `acc`.
    pub fn run(
        &mut self,
        file: &HobFile,
        jobs: (&[CpuJob], &ExpertFfn),
        layer: usize,
        acc: &mut Vec<f32>,
    ) -> crate::Result<()> {
        let started = Instant::now();
        let est = self.estimates();
        let (pool, x) = (&self.pool, &self.host_x);
        let (res, times) = compute(file, pool, jobs, (layer, x), &est);
        self.wait += started.elapsed();
        self.absorb(res, times, acc);
        Ok(())
    }

    /// Add CPU results `res` into `acc` ([hidden] once non-empty) and refresh the cost model with
    /// the seconds each job took.
    pub fn absorb(&mut self, res: Vec<f32>, times: CpuTimes, acc: &mut Vec<f32>) {
        for (v, secs) in times {
            self.busy += secs;
            self.cpu_s[v] = Some(match self.cpu_s[v] {
                Some(old) => 0.8 * old + 0.2 * secs,
                None => secs,
            });
        }
        if acc.is_empty() {
            *acc = res;
        } else {
            for (a, r) in acc.iter_mut().zip(&res) {
                *a += r;
            }
        }
    }

    /// A decode layer ended (`entered` its start, `spawned` when its CPU task was handed over,
    /// `span` the task's run): the helpers' idle time since the previous layer's task, in parts.
    pub fn mark_layer(
        &mut self,
        layer: usize,
        (entered, marks, spawned): (Instant, [Instant; 3], Instant),
        span: Option<(Instant, Instant)>,
    ) {
        let Some((start, end)) = span else {
            self.mark = None;
            return;
        };
        if let Some((l, prev_end, prev_exit)) = self.mark {
            if l + 1 == layer {
                let [planned, placed, predicted] = marks;
                add_spans(
                    &mut self.gaps,
                    [prev_end, prev_exit, entered, spawned, start],
                );
                let at = [entered, planned, placed, predicted, spawned];
                add_spans(&mut self.placing, at);
            }
        }
        self.mark = Some((layer, end, Instant::now()));
    }

    /// The helpers' passes since the last reset.
    pub fn passes(&self) -> PassStats {
        self.pool.pass_stats().since(self.pass_base)
    }

    pub fn reset(&mut self) {
        self.busy = 0.0;
        self.wait = Duration::ZERO;
        self.gaps = [Duration::ZERO; 4];
        self.placing = [Duration::ZERO; 4];
        self.mark = None;
        self.pass_base = self.pool.pass_stats();
    }
}

/// Each of `acc` += the span between consecutive instants of `at` (zero where one runs back).
fn add_spans(acc: &mut [Duration; 4], at: [Instant; 5]) {
    for (g, w) in acc.iter_mut().zip(at.windows(2)) {
        *g += w[1].saturating_duration_since(w[0]);
    }
}

/// The helpers compute `jobs` of `layer` for the decode input x from the mapped file; returns
/// their weighted outputs summed ([hidden]) and each job's share of the time, apportioned by
/// `est` (seconds per expert per variant; bytes where unmeasured).
pub fn compute(
    file: &HobFile,
    pool: &HelperPool,
    (jobs, ffn): (&[CpuJob], &ExpertFfn),
    (layer, x): (usize, &[f32]),
    est: &[Option<f64>],
) -> (Vec<f32>, CpuTimes) {
    let started = Instant::now();
    let ffn_jobs: Vec<FfnJob<'_>> = jobs
        .iter()
        .map(|j| {
            let v = file.expert(layer, j.expert, j.variant);
            FfnJob {
                mats: [
                    Matrix::from_view(v.gate()),
                    Matrix::from_view(v.up()),
                    Matrix::from_view(v.down()),
                ],
                weight: j.weight,
                act: ffn.act,
                biases: ffn.expert_biases(j.expert),
            }
        })
        .collect();
    let out = pool.ffn_decode(&ffn_jobs, x);
    let secs = started.elapsed().as_secs_f64();
    let guess = |j: &CpuJob| est[j.variant].unwrap_or(file.expert_layout(j.variant).size as f64);
    let total: f64 = jobs.iter().map(guess).sum();
    let times = jobs
        .iter()
        .map(|j| (j.variant, secs * guess(j) / total.max(1e-30)))
        .collect();
    (out, times)
}
