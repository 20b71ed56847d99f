//! The GPU the tests use, when there is one.

use std::sync::Arc;

use hob::backend::cpu::CpuBackend;
use hob::backend::cuda::{self, CudaBackend, Gpu};
use hob::experts::engine::EngineConfig;
use hob::experts::{DirectExperts, Engine, PrecisionPlan, Thresholds};
use hob::format::HobFile;
use hob::generate::{Bound, Session};
use hob::model::{Backend, Model};

/// Device 0. The GPU tests are `#[ignore]`d (so a machine without a GPU counts them as ignored,
/// not passed); run with `--include-ignored`, they fail where CUDA cannot be used, saying why.
pub fn gpu() -> Arc<Gpu> {
    if let Err(why) = cuda::probe() {
        panic!("this GPU test was asked for (--include-ignored) but CUDA cannot be used: {why}");
    }
    Gpu::open(0).expect("a usable GPU opens")
}

/// A GPU session on `file` with an expert cache of `slots` experts (None: all).
pub fn gpu_session<'a>(
    g: &Arc<Gpu>,
    file: &'a HobFile,
    model: &'a Model<'a>,
    slots: Option<usize>,
) -> Box<dyn Session + 'a> {
    let slot = file.expert_layout(0).padded_size;
    let mut cfg = EngineConfig::simple(0, slots.map(|n| n * slot));
    cfg.tuning.preload = slots.is_none();
    // Host-routed, for the tests that count its layers; gated decode has cases of its own.
    cfg.tuning.gated_decode = false;
    engine_session(g, model, cfg)
}

/// A GPU session with the expert engine configured by `cfg`.
pub fn engine_session<'a>(
    g: &Arc<Gpu>,
    model: &'a Model<'a>,
    cfg: EngineConfig,
) -> Box<dyn Session + 'a> {
    let mut backend = CudaBackend::new(g.clone(), model).unwrap();
    let experts = Engine::new(model, &mut backend, cfg).unwrap();
    Box::new(Bound::new(model, backend, Box::new(experts), 128, "cuda".into()).unwrap())
}

/// The engine offloading `file` with one precision and nothing skipped: variant 0 high, 1 low
/// but every route run high (a low copy stands in only for a missed high one), a cache of
/// `slots` experts filled on demand. Its logits must be the all-resident run's.
pub fn exact_offload(file: &HobFile, slots: usize) -> EngineConfig {
    let slot = file.expert_layout(0).padded_size;
    let mut c = EngineConfig::simple(0, Some(slots * slot));
    c.tuning.preload = false;
    c.plan = PrecisionPlan {
        high: 0,
        low: Some(1),
        thresholds: Thresholds::ALL_HIGH,
        renormalize_skips: false,
    };
    c.substitute_low = true;
    // Host-routed; the gated cases switch it on.
    c.tuning.gated_decode = false;
    c
}

pub fn cpu_session<'a>(file: &'a HobFile, model: &'a Model<'a>) -> Box<dyn Session + 'a> {
    cpu_session_at(file, model, 0)
}

/// A CPU session reading the experts of variant `v`.
pub fn cpu_session_at<'a>(
    file: &'a HobFile,
    model: &'a Model<'a>,
    v: usize,
) -> Box<dyn Session + 'a> {
    let backend = CpuBackend::new(2).unwrap();
    let experts = DirectExperts::new(file, v).unwrap();
    Box::new(Bound::new(model, backend, Box::new(experts), 128, "cpu".into()).unwrap())
}

/// `v` in a new device buffer of `b`.
pub fn to_gpu(b: &CudaBackend, v: &[f32]) -> cudarc::driver::CudaSlice<f32> {
    let mut d = b.alloc(v.len()).unwrap();
    b.upload(v, &mut d).unwrap();
    d
}

/// The first `n` values of device buffer `d`.
pub fn from_gpu(b: &CudaBackend, d: &cudarc::driver::CudaSlice<f32>, n: usize) -> Vec<f32> {
    let mut v = vec![0.0; n];
    b.download(d, &mut v).unwrap();
    v
}
