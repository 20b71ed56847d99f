//! A model bound to a backend and an expert executor, with one sequence's state: what the
//! generation driver (and through it run, bench, perplexity, calibrate) drives, whatever the
//! device.

use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, Gpu};
use crate::experts::replay::{Replay, Replayed};
use crate::experts::{DirectExperts, Engine, EngineConfig, ExpertStats, Experts};
use crate::model::{
    Backend, ExpertExecutor, KernelTime, Logits, Model, ModelConfig, RunState, Telemetry,
};

/// One sequence on one device, driven token by token.
pub trait Session {
    /// Run `tokens` after the cached ones and return the logits asked for.
    fn forward(&mut self, tokens: &[u32], want: Logits) -> crate::Result<&[f32]>;
    /// Tokens in the KV cache.
    fn pos(&self) -> usize;
    /// KV cache capacity.
    fn ctx(&self) -> usize;
    /// Drop cached tokens past `pos`.
    fn truncate(&mut self, pos: usize);
    fn config(&self) -> &ModelConfig;
    /// One line naming the device and its setup, for logs.
    fn describe(&self) -> String;
    /// Expert counters since the last `reset_stats`.
    fn expert_stats(&self) -> ExpertStats;
    fn reset_stats(&mut self);
    /// Refuse non-finite output logits (the default) or not (for a caller that discards them).
    fn check_logits(&mut self, on: bool);
    /// Decode steps the backend ran from a recording (CUDA graphs) so far.
    fn decode_replays(&self) -> u64 {
        0
    }
    /// Time every kernel launch from now on (true) or stop; false where the device cannot.
    fn kernel_clock(&mut self, _on: bool) -> bool {
        false
    }
    /// GPU time per kernel since the last call.
    fn kernel_times(&mut self) -> crate::Result<Vec<KernelTime>> {
        Ok(Vec::new())
    }
}

/// A model, a backend, an expert executor and a run state, bound together.
pub struct Bound<'a, B: Backend + Telemetry> {
    model: &'a Model<'a>,
    backend: B,
    experts: Box<dyn Experts<B> + 'a>,
    st: RunState<B>,
    label: String,
}

impl<'a, B: Backend + Telemetry> Bound<'a, B> {
    /// `label` names the backend in `describe()`.
    pub fn new(
        model: &'a Model<'a>,
        backend: B,
        experts: Box<dyn Experts<B> + 'a>,
        ctx: usize,
        label: String,
    ) -> crate::Result<Self> {
        let st = model.new_state(&backend, ctx)?;
        Ok(Bound {
            model,
            backend,
            experts,
            st,
            label,
        })
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }
}

impl<B: Backend + Telemetry> Session for Bound<'_, B> {
    fn forward(&mut self, tokens: &[u32], want: Logits) -> crate::Result<&[f32]> {
        let experts: &mut dyn ExpertExecutor<B> = &mut *self.experts;
        if self.st.pos() == 0 {
            experts.begin_sequence()?;
        }
        self.model
            .forward(&mut self.st, tokens, &self.backend, experts, want)
    }
    fn pos(&self) -> usize {
        self.st.pos()
    }
    fn ctx(&self) -> usize {
        self.st.ctx()
    }
    fn truncate(&mut self, pos: usize) {
        self.st.truncate(pos);
    }
    fn config(&self) -> &ModelConfig {
        &self.model.cfg
    }
    fn describe(&self) -> String {
        format!("{}, experts: {}", self.label, self.experts.describe())
    }
    fn expert_stats(&self) -> ExpertStats {
        let mut s = self.experts.stats();
        (s.graph_launch_seconds, s.read_back_seconds) = self.backend.host_times();
        s
    }
    fn reset_stats(&mut self) {
        self.experts.reset_stats();
        self.backend.reset_host_times();
    }
    fn check_logits(&mut self, on: bool) {
        self.st.check_logits(on);
    }
    fn decode_replays(&self) -> u64 {
        self.backend.decode_replays()
    }
    fn kernel_clock(&mut self, on: bool) -> bool {
        self.backend.kernel_clock(on)
    }
    fn kernel_times(&mut self) -> crate::Result<Vec<KernelTime>> {
        self.backend.kernel_times()
    }
}

/// Where a session computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
}

/// What a session is built from (cli/engine.rs makes it from the flags and the profile).
pub struct SessionConfig {
    pub device: Device,
    /// CPU threads (0: one per core): the CPU backend's, and the CPU helpers' in cooperative
    /// mode.
    pub threads: usize,
    /// The expert engine's configuration (on the CPU: its plan and trace; its prefetch depth
    /// scores stacked-gate predictions when `score_predictions`).
    pub engine: EngineConfig,
    /// On the CPU, score the stacked gates' predictions (`--stats`: nothing to prefetch there).
    pub score_predictions: bool,
    /// Route from a recorded trace instead of the model's router.
    pub replay: Option<Replay>,
}

/// A session of `model` with a KV cache of `ctx` positions on the configured device.
pub fn open_session<'a>(
    model: &'a Model<'a>,
    ctx: usize,
    mut cfg: SessionConfig,
) -> crate::Result<Box<dyn Session + 'a>> {
    let file = model.file;
    let replay = cfg.replay.take();
    match cfg.device {
        Device::Cuda => {
            let gpu = Gpu::open(0)?;
            let mut backend = CudaBackend::new(gpu.clone(), model)?;
            let label = format!(
                "cuda: {} (sm_{}{}), {:.2} GiB resident weights",
                gpu.name,
                gpu.compute_capability.0,
                gpu.compute_capability.1,
                backend.resident_bytes() as f64 / (1u64 << 30) as f64
            );
            cfg.engine.ctx = ctx;
            let experts = Engine::new(model, &mut backend, cfg.engine)?;
            bind(model, backend, Box::new(experts), (replay, ctx), label)
        }
        Device::Cpu => {
            let backend = CpuBackend::new(cfg.threads)?;
            let n = backend.threads();
            let label = format!("cpu: {n} thread{}", if n == 1 { "" } else { "s" });
            let depth = if cfg.score_predictions {
                cfg.engine.prefetch
            } else {
                0
            };
            let experts = DirectExperts::with_plan(file, cfg.engine.plan.clone())?
                .with_trace(cfg.engine.trace.take())
                .with_predictor(model, depth)?;
            bind(model, backend, Box::new(experts), (replay, ctx), label)
        }
    }
}

/// A boxed session of `model` on `backend` with `experts`, routed by the replay where given.
fn bind<'a, B: Backend + Telemetry + 'a>(
    model: &'a Model<'a>,
    backend: B,
    experts: Box<dyn Experts<B> + 'a>,
    (replay, ctx): (Option<Replay>, usize),
    label: String,
) -> crate::Result<Box<dyn Session + 'a>> {
    let experts: Box<dyn Experts<B> + 'a> = match replay {
        Some(r) => Box::new(Replayed::new(experts, r, model.cfg.moe_layers())),
        None => experts,
    };
    Ok(Box::new(Bound::new(model, backend, experts, ctx, label)?))
}
