//! The HOBBIT expert engine, device-generic: `Engine<D>` keeps a cache of experts in slots of a
//! device (`model::ExpertDevice`) and computes each layer's routed experts from them, loading a
//! missed expert in the precision the scorer picks, prefetching with stacked gates, and (in
//! cooperative mode) letting CPU helpers compute misses. How it works, and each decision HOBBIT
//! leaves open: src/experts/README.md.
//!
//! Parts: `config` (EngineConfig, the budget), `slots` (pools of slots, the policy, loads and
//! the link model), `loader` (the loader thread's worker), `prefetch` (stacked gates), `coop`
//! and `helpers` (CPU experts), `routing` (decode routed on the device), `layer` and `place`
//! (one layer: plan -> place -> launch -> account), `stats` (what it counts).

mod config;
mod coop;
mod gated;
mod helpers;
mod layer;
mod loader;
mod place;
mod prefetch;
mod routing;
mod slots;
mod stats;

pub use config::{kv_bytes, work_bytes, Budget, DeviceMemory, EngineConfig, Tier, Tuning};
pub use helpers::{FfnJob, HelperPool, MatVec, PassStats};
pub use stats::{ExpertReport, ExpertStats, VariantStats};

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use coop::Cooperative;
use layer::Io;
use loader::{LoadCounters, Loader};
use prefetch::Prefetcher;
use routing::DeviceRouting;
use slots::{Slots, SlotsSetup};

use crate::experts::cache::{pool_slots, ExpertCache, PoolKind};
use crate::experts::io::open_reader;
use crate::experts::scheduler::Scheduler;
use crate::experts::trace::TraceWriter;
use crate::experts::{LayerPlan, PrecisionPlan};
use crate::format::HobFile;
use crate::model::{
    Batch, BeforeExperts, CopierSetup, ExpertAct, ExpertDevice, ExpertExecutor, Model, MoeBlock,
    OnDevice, Route, RouteReads,
};
use crate::Error;

/// What the engine counts itself (the loader and the helpers count their own).
#[derive(Default)]
struct Counters {
    hits: Vec<u64>,
    misses: Vec<u64>,
    skipped: u64,
    substituted: u64,
    cpu_computed: u64,
    cpu_bytes: u64,
    prefetch_used: u64,
    late_to_cpu: u64,
    loaded_behind: u64,
    behind_chances: u64,
    slot_layers: u64,
    slot_part_layers: u64,
    grouped_layers: u64,
    early_layers: u64,
    /// Host-routed decode layers, and the host's time in the engine for them: in all (a wait for
    /// the layer's CPU experts included), and up to where its experts start going to the device.
    host_layers: u64,
    host_in: std::time::Duration,
    host_before: std::time::Duration,
    /// Gated decode: tokens, layers held at their gate, the host's time placing those layers'
    /// misses, and its time following the tokens (misses included).
    gated_tokens: u64,
    gated_stalls: u64,
    gated_stall_host: std::time::Duration,
    gated_follow: std::time::Duration,
    /// Loader counters (bytes, disk bytes, nanoseconds) at the last reset.
    base: (u64, u64, u64),
}

pub struct Engine<'f, D: ExpertDevice> {
    file: &'f HobFile,
    plan: PrecisionPlan,
    tuning: Tuning,
    substitute_low: bool,
    top_k: usize,
    slots: Slots<'f, D>,
    prefetch: Option<Prefetcher<D>>,
    coop: Option<Cooperative>,
    routing: DeviceRouting<D>,
    work: D::Work,
    trace: Option<TraceWriter>,
    layer_plan: LayerPlan,
    count: Counters,
    decoded: u64,
    /// Decode: moving average of the seconds between consecutive layers' starts, and when the
    /// last one started.
    layer_s: Option<f64>,
    layer_started: Option<(usize, Instant)>,
    /// Per pool: whether its layout suits the routed kernels (decided on first use).
    slot_kinds: [Option<bool>; 2],
    /// For `describe`.
    tier: Tier,
    direct: bool,
    pace: Option<f64>,
}

impl<'f, D: ExpertDevice> Engine<'f, D> {
    /// The engine for `model` on `dev`: pools carved from the budget, the loader started, the
    /// pools filled in layer order.
    pub fn new(model: &Model<'f>, dev: &mut D, mut cfg: EngineConfig) -> crate::Result<Self> {
        let file: &'f HobFile = model.file;
        let mut plan = cfg.plan.clone();
        if plan.is_exact() {
            // All high: a low pool would never be used, and substitution would change results.
            plan.low = None;
            cfg.substitute_low = false;
        }
        let total = file.n_layers() * file.n_experts();
        let used: Vec<usize> = std::iter::once(plan.high).chain(plan.low).collect();
        let (high_slots, low_slots) = Self::pool_sizes(model, dev, &cfg, &plan)?;
        let counters = Arc::new(LoadCounters::default());
        let loader = Self::start_loader(file, dev, &cfg, &used, counters.clone())?;
        let direct = loader.1;
        let slots = Slots::new(
            dev,
            SlotsSetup {
                file,
                cache: ExpertCache::new(
                    cfg.policy,
                    file.n_layers(),
                    file.n_experts(),
                    high_slots,
                    low_slots,
                ),
                pools: [
                    Some((plan.high, high_slots)),
                    plan.low.map(|l| (l, low_slots)),
                ],
                loader: loader.0,
                counters,
                mapped: cfg.mapped,
                disk: cfg.tier == Tier::Disk,
                host_waits: cfg.cpu_experts.is_some(),
                pace: cfg.pace_bytes_per_s,
                upgrade_planes: cfg.tuning.upgrade_planes,
            },
        )?;
        let prefetch = match cfg.prefetch {
            depth if depth > 0 && file.n_layers() > 1 => {
                let routers: Vec<_> = model
                    .weights()
                    .layers
                    .iter()
                    .filter_map(|l| l.router)
                    .collect();
                let shape = (depth, model.cfg.top_k);
                let p = Prefetcher::new(dev, &routers, shape, cfg.prefetch_min_weight)?;
                Some(p.upgrading_low(cfg.tuning.upgrade_low))
            }
            _ => None,
        };
        // Gated decode (gated.rs): a cache of part of the experts, in device memory, no
        // prefetch (it would change the cache under layers already queued); with CPU experts,
        // integer SwiGLU experts (their result joins the routed kernels' sum).
        let glu =
            model.cfg.expert_act != ExpertAct::SiluGlu || model.cfg.arch.sinks_and_expert_biases();
        let high_float = file.variants()[plan.high].kind.is_float();
        let plain = !glu && !high_float;
        // Group-limited routing on the device takes up to 256 experts (a warp's, route.cu).
        let grouped = matches!(
            model.cfg.routing(),
            crate::model::routing::Routing::Grouped { .. }
        );
        if grouped && file.n_experts() > 256 {
            cfg.tuning.device_routing = false;
        }
        let gated = cfg.tuning.gated_decode
            && cfg.tuning.device_routing
            && !(glu && high_float)
            && plan.is_exact()
            && plan.low.is_none()
            && high_slots < total
            && !cfg.mapped
            && prefetch.is_none()
            && (cfg.cpu_experts.is_none() || plain)
            && !cfg.trace.as_ref().is_some_and(TraceWriter::wants_inputs);
        let coop = match cfg.cpu_experts {
            Some(threads) => Some(Cooperative::new(
                threads,
                file.variants().len(),
                cfg.load_behind,
            )?),
            None => None,
        };
        let (hidden, ffn) = file.expert_dims();
        // Grouped prefill computes SwiGLU without biases; the routed kernels take other experts
        // (gpt-oss's: their activation and biases) in integer kinds and mxfp4 only, so a pool
        // of float experts runs them one at a time and routes on the host.
        let mut slot_kinds = [None; 2];
        if model.cfg.expert_act != ExpertAct::SiluGlu || model.cfg.arch.sinks_and_expert_biases() {
            cfg.tuning.grouped_prefill = false;
            if file.variants()[plan.high].kind.is_float() {
                cfg.tuning.device_routing = false;
                slot_kinds[PoolKind::High as usize] = Some(false);
            }
            if plan.low.is_some_and(|l| file.variants()[l].kind.is_float()) {
                slot_kinds[PoolKind::Low as usize] = Some(false);
            }
        }
        // (A trace that records the stacked gates' predictions needs each layer's gate input
        // on the host: such runs route on the host.)
        let device_routing = gated
            || (cfg.tuning.device_routing
                && plan.is_exact()
                && plan.low.is_none()
                && coop.is_none()
                && high_slots == total
                && !cfg.trace.as_ref().is_some_and(TraceWriter::wants_inputs));
        let nv = file.variants().len();
        let mut me = Engine {
            file,
            plan,
            tuning: cfg.tuning,
            substitute_low: cfg.substitute_low,
            top_k: model.cfg.top_k,
            slots,
            prefetch,
            coop,
            routing: DeviceRouting::new(device_routing, gated),
            work: dev.expert_work(hidden, ffn)?,
            trace: cfg.trace.take(),
            layer_plan: LayerPlan::default(),
            count: Counters {
                hits: vec![0; nv],
                misses: vec![0; nv],
                ..Counters::default()
            },
            decoded: 0,
            layer_s: None,
            layer_started: None,
            slot_kinds,
            tier: cfg.tier,
            direct,
            pace: cfg.pace_bytes_per_s,
        };
        if me.tuning.preload {
            me.slots.preload(dev)?;
        }
        crate::experts::ExpertReport::reset_stats(&mut me);
        if let Some(c) = me.coop.as_mut() {
            c.calibrate(file, &used);
        }
        Ok(me)
    }

    /// Slots of the high and the low pool: the budget (EngineConfig::expert_budget) split by
    /// the low share, each at most every expert; Err when no high slot fits.
    fn pool_sizes(
        model: &Model<'f>,
        dev: &D,
        cfg: &EngineConfig,
        plan: &PrecisionPlan,
    ) -> crate::Result<(usize, usize)> {
        let file = model.file;
        let total = file.n_layers() * file.n_experts();
        let high_bytes = file.expert_layout(plan.high).padded_size;
        let low_bytes = plan.low.map(|l| file.expert_layout(l).padded_size);
        let free = dev.free_memory()?;
        let mem = DeviceMemory {
            free,
            resident: dev.resident_bytes(),
            all_experts: total * (high_bytes + low_bytes.unwrap_or(0)),
        };
        let budget = cfg.expert_budget(&model.cfg, mem)?;
        let (high, low) = match low_bytes {
            Some(lb) => pool_slots(budget as u64, high_bytes as u64, lb as u64, cfg.low_share),
            None => (budget / high_bytes, 0),
        };
        let (high, low) = (high.min(total), low.min(total));
        if high < 1 {
            return Err(Error::Invalid(format!(
                "{}: the expert cache needs at least one {} slot of {}; its budget of {} allows none ({} free on the device)",
                dev.device_name(),
                file.variants()[plan.high],
                config::size(high_bytes),
                config::size(budget),
                config::size(free),
            )));
        }
        let arena = high * high_bytes + low * low_bytes.unwrap_or(0);
        if !cfg.mapped && arena + config::RESERVE > free {
            return Err(Error::Invalid(format!(
                "{}: an expert cache of {high} + {low} slots ({:.2} GiB) does not fit in the {:.2} GiB free; lower --expert-cache",
                dev.device_name(),
                config::gib(arena),
                config::gib(free),
            )));
        }
        Ok((high, low))
    }

    /// The loader thread, and whether it copies directly from page-locked file pages.
    #[allow(clippy::type_complexity)]
    fn start_loader(
        file: &HobFile,
        dev: &D,
        cfg: &EngineConfig,
        used: &[usize],
        counters: Arc<LoadCounters>,
    ) -> crate::Result<(Scheduler<Loader<D::Copier>>, bool)> {
        let memory = cfg.tier == Tier::Memory;
        let pin = (memory && !cfg.mapped && cfg.pin_file)
            .then(|| fit_in_half_ram(file, used, "expert loads go through staging"))
            .and_then(|fits| fits.then(|| used_ranges(file, used)));
        let (copier, direct) = dev.copier(CopierSetup {
            map: file.shared_map(),
            pin,
            staging: !cfg.mapped,
            pace: cfg.pace_bytes_per_s,
        })?;
        let disk = match cfg.tier {
            Tier::Disk => {
                let r = open_reader(file.path(), true)?;
                log::info!("expert loads read {} from the SSD", file.path().display());
                Some(r)
            }
            Tier::Memory => None,
        };
        if memory && !direct {
            populate(file, used);
        }
        let loader = Loader::new(
            copier,
            file.shared_map(),
            direct,
            (cfg.pace_bytes_per_s, disk),
            counters,
        )?
        .with_checks(file.blob_checks());
        Ok((
            Scheduler::spawn_with(loader, cfg.tuning.load_stall)?,
            direct,
        ))
    }

    /// Slots of each pool.
    pub fn slots(&self) -> (usize, usize) {
        (
            self.slots.cache.capacity(PoolKind::High),
            self.slots.cache.capacity(PoolKind::Low),
        )
    }

    /// Decode tokens that routed on the device (every expert resident).
    pub fn device_routed_tokens(&self) -> u64 {
        self.routing.tokens
    }

    /// Decode: the moving average of the time between consecutive layers' starts.
    fn time_layer(&mut self, layer: usize, decode: bool) {
        if !decode {
            self.layer_started = None;
            return;
        }
        let now = Instant::now();
        if let Some((l, at)) = self.layer_started {
            if l + 1 == layer {
                let secs = now.duration_since(at).as_secs_f64();
                self.layer_s = Some(self.layer_s.map_or(secs, |old| 0.9 * old + 0.1 * secs));
            }
        }
        self.layer_started = Some((layer, now));
    }

    /// Write a layer's routing to the trace (with its gate inputs where the trace records the
    /// stacked gates' predictions).
    fn record(
        &mut self,
        dev: &D,
        layer: usize,
        batch: &Batch<'_, D::Buf>,
        lp: &LayerPlan,
    ) -> crate::Result<()> {
        let Some(tw) = self.trace.as_mut() else {
            return Ok(());
        };
        let x = if tw.wants_inputs() {
            let mut v = vec![0.0f32; batch.t * batch.hidden];
            dev.download(batch.xs, &mut v)?;
            Some(v)
        } else {
            None
        };
        tw.record_layer(layer, batch.routes, &lp.decisions, batch.t, x.as_deref())
    }
}

impl<D: ExpertDevice> ExpertExecutor<D> for Engine<'_, D> {
    fn begin_sequence(&mut self) -> crate::Result<()> {
        self.count_held()?;
        self.slots.cache.reset_sequence();
        if let Some(tw) = self.trace.as_mut() {
            tw.begin_sequence();
        }
        if let Some(p) = self.prefetch.as_mut() {
            p.predictor.forget();
        }
        Ok(())
    }

    fn forward(
        &mut self,
        dev: &D,
        layer: usize,
        batch: &Batch<'_, D::Buf>,
        out: &mut D::Buf,
    ) -> crate::Result<()> {
        let io = Io {
            xs: batch.xs,
            out,
            residual: None,
            ffn: batch.ffn.clone(),
        };
        self.run_layer(dev, layer, batch, io).map(|_| ())
    }

    fn forward_add(
        &mut self,
        dev: &D,
        layer: usize,
        batch: &Batch<'_, D::Buf>,
        out: &mut D::Buf,
        x: &mut D::Buf,
    ) -> crate::Result<()> {
        let io = Io {
            xs: batch.xs,
            out: &mut *out,
            residual: Some(&mut *x),
            ffn: batch.ffn.clone(),
        };
        if !self.run_layer(dev, layer, batch, io)? {
            dev.add_assign(x, out, batch.t * batch.hidden)?;
        }
        Ok(())
    }

    fn route_reads(&mut self, layer: usize) -> RouteReads<'_, D> {
        let hidden = self.file.expert_dims().0;
        RouteReads {
            product: self.prefetch.as_mut().and_then(|p| p.route_reads(layer)),
            xn: self.coop.as_mut().map(|c| c.x_with_routes(layer, hidden)),
        }
    }

    fn replayed_predictions(&mut self, _layer: usize, predicted: Vec<(usize, Vec<Route>)>) {
        if let Some(p) = self.prefetch.as_mut() {
            p.replayed = Some(predicted);
        }
    }

    fn decode_on_device(&mut self, dev: &D) -> crate::Result<bool> {
        self.routing.token = self.device_ready(dev)?;
        if self.routing.token && self.routing.gated {
            self.gate_begin(dev, None)?;
            return Ok(true);
        }
        // A replayed token skips forward_on_device: its routes are read back all the same.
        self.routing.pending |= self.routing.token;
        Ok(self.routing.token)
    }

    fn decode_replayed(&mut self, dev: &D, routes: &[Route]) -> crate::Result<bool> {
        if !self.routing.gated || !self.device_ready(dev)? {
            return Ok(false);
        }
        self.routing.token = true;
        self.gate_begin(dev, Some(routes))?;
        Ok(true)
    }

    fn forward_on_device(
        &mut self,
        dev: &D,
        layer: usize,
        block: &MoeBlock<'_>,
        xs: &mut D::Buf,
        x: &mut D::Buf,
        before: BeforeExperts<'_, D>,
    ) -> crate::Result<OnDevice> {
        if layer == 0 {
            self.routing.token = self.device_ready(dev)?;
        }
        let (true, Some(r)) = (self.routing.token, self.routing.resident.as_ref()) else {
            return Ok(OnDevice::No);
        };
        let normed = dev.routed_layer(r, layer, block, (xs, x), before)?;
        let lag = self.tuning.gated_follow_lag;
        if self.routing.follow && self.routing.now && layer + 1 >= lag {
            self.follow_until(dev, layer + 1 - lag)?;
        }
        if layer + 1 == self.file.n_layers() && !self.routing.gated {
            // Read back in end_forward, once the output head is launched too.
            self.routing.pending = true;
        }
        Ok(if normed {
            OnDevice::DoneNormed
        } else {
            OnDevice::Done
        })
    }

    fn launches_run_now(&mut self, now: bool) {
        self.routing.now = now;
    }

    fn end_forward(&mut self, dev: &D) -> crate::Result<()> {
        if std::mem::take(&mut self.routing.follow) {
            self.gate_follow(dev)?;
        }
        // The last token's routes, while the device computes this one.
        self.count_held()?;
        if std::mem::take(&mut self.routing.pending) {
            if let Some(r) = self.routing.resident.as_mut() {
                // Counted in after_forward: the logits' read waits for both.
                dev.queue_routes(r)?;
                self.routing.queued = true;
            }
        }
        // The logits are read back next (after every load this pass waited for).
        self.slots.time_gpu_waits()
    }

    fn after_forward(&mut self, dev: &D) -> crate::Result<()> {
        if std::mem::take(&mut self.routing.queued) {
            self.account_device(dev, true)?;
        }
        Ok(())
    }
}

/// Bytes of the experts of `variants` in the file.
fn used_bytes(file: &HobFile, variants: &[usize]) -> usize {
    let n = file.n_layers() * file.n_experts();
    variants
        .iter()
        .map(|&v| n * file.expert_layout(v).size)
        .sum()
}

/// File ranges of every expert blob of `variants`.
fn used_ranges(file: &HobFile, variants: &[usize]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    for l in 0..file.n_layers() {
        for e in 0..file.n_experts() {
            out.extend(variants.iter().map(|&v| file.blob_range(l, e, v, false)));
        }
    }
    out
}

/// The host's RAM in bytes (0 when /proc/meminfo cannot be read).
fn host_ram() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Whether the experts of `variants` fit in half the host's RAM (what page-locking or mapping
/// them ahead may take); when not, logs `not` with the sizes.
fn fit_in_half_ram(file: &HobFile, variants: &[usize], not: &str) -> bool {
    let (bytes, ram) = (used_bytes(file, variants), host_ram());
    let fits = bytes <= ram / 2;
    if !fits {
        log::info!(
            "{not}: {:.1} GB of experts, {:.1} GB of RAM",
            bytes as f64 / 1e9,
            ram as f64 / 1e9
        );
    }
    fits
}

/// Map the pages of the experts in `variants` up front when they fit in half the RAM: the first
/// touch of each page costs a fault, which would otherwise land in the middle of decoding. Best
/// effort: logs and goes on when the kernel lacks MADV_POPULATE_READ (Linux < 5.14).
fn populate(file: &HobFile, variants: &[usize]) {
    if !fit_in_half_ram(file, variants, "not mapping expert pages ahead") {
        return;
    }
    let started = Instant::now();
    let map = file.shared_map();
    for r in used_ranges(file, variants) {
        if let Err(err) = map.advise_range(memmap2::Advice::PopulateRead, r.start, r.len()) {
            log::warn!("cannot map expert pages ahead (madvise POPULATE_READ): {err}");
            return;
        }
    }
    log::info!(
        "mapped {:.1} GB of expert pages in {:.1} s",
        used_bytes(file, variants) as f64 / 1e9,
        started.elapsed().as_secs_f64()
    );
}
