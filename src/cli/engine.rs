//! What `run`, `perplexity` and `bench` share: open a .hob file, pick the device, build the
//! backend, the expert executor and the tokenizer from the flags every model command takes.

use std::path::PathBuf;

use clap::Args;

use crate::backend::cpu::{CpuBackend, CpuExperts};
use crate::backend::cuda::{self, CacheConfig, CudaBackend, CudaExperts, Gpu, Split, Tier};
use crate::experts::cache::Policy;
use crate::experts::predictor::Predictor;
use crate::experts::replay::{Replay, Replayed};
use crate::experts::trace::{TraceHeader, TraceWriter, TRACE_PRED_DEPTH};
use crate::experts::{PrecisionPlan, Thresholds};
use crate::format::{keys, HobFile};
use crate::generate::Tokenizer;
use crate::model::{Backend, Bound, ExpertStats, Experts, Model, ModelConfig, Session};
use crate::platform::{Platform, PlatformKind};
use crate::quant::Matrix;
use crate::Error;

/// Where a model command computes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// CUDA when a GPU and its libraries are usable, else the CPU (the reason is printed).
    Auto,
    Cpu,
    Cuda,
}

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// The .hob model file.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// CPU threads (0: one per core).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: usize,
    /// Expert variant to compute with (the high precision of HOBBIT's scorer): f16, bf16,
    /// int8, int4 or int2 (default: the profile's high_variant, else the file's first).
    #[arg(long = "expert-variant", visible_alias = "high")]
    pub expert_variant: Option<String>,
    /// Low-precision expert variant: turns on HOBBIT's dynamic precision (experts that matter
    /// little to a token run in this variant, or are skipped). Default: the profile's; "none"
    /// turns it off.
    #[arg(long = "low")]
    pub low: Option<String>,
    /// Scorer threshold T1: a selected expert whose higher-ranked gate weights sum to <= T1 runs
    /// in high precision (default: the profile's, else 0.6 with --low, else 1 = all high).
    #[arg(long = "t1")]
    pub t1: Option<f32>,
    /// Scorer threshold T2: above T1 and <= T2 low precision, above T2 skipped (default: the
    /// profile's, else 0.9 with --low, else 1 = none skipped).
    #[arg(long = "t2")]
    pub t2: Option<f32>,
    /// After skipping an expert, rescale the token's other expert weights to the full sum.
    #[arg(long = "renorm-skips")]
    pub renorm_skips: bool,
    /// Expert cache policy: lru, lfu, or hobbit (HOBBIT Eq. 3: LRU, LFU, LHU and FLD terms).
    #[arg(long = "cache-policy", default_value = "hobbit")]
    pub cache_policy: String,
    /// Weights of the hobbit policy's LRU, LFU, LHU and FLD terms, summing to 1 (e.g.
    /// "0.4,0.2,0.3,0.1"; default: fitted with `hob sim --fit`, see the README).
    #[arg(long = "cache-weights")]
    pub cache_weights: Option<String>,
    /// Share of the expert cache's bytes for low-precision experts (with --low).
    #[arg(long = "low-share", default_value_t = crate::experts::cache::DEFAULT_LOW_SHARE)]
    pub low_share: f64,
    /// Never run a high-precision miss from its cached low-precision copy (default: do, except
    /// for a token's top-1 expert).
    #[arg(long = "no-substitute")]
    pub no_substitute: bool,
    /// Predict this many layers ahead with stacked gates and prefetch (0: off, the default:
    /// measured, a wrong prediction costs a whole load on a link-bound card; see the README).
    #[arg(long = "prefetch", default_value_t = 0)]
    pub prefetch: usize,
    /// Prefetch only predicted experts whose predicted gate weight (after top-k) is at least
    /// this (0, the default: every predicted expert, as HOBBIT does).
    #[arg(long = "prefetch-min-weight", default_value_t = 0.0, value_name = "W")]
    pub prefetch_min_weight: f32,
    /// Let CPU threads compute missed experts from host memory when that beats loading them
    /// (cooperative mode; -t sets the threads).
    #[arg(long = "cpu-experts")]
    pub cpu_experts: bool,
    /// Cooperative mode: never load a miss the CPU computes into the cache (by default it is
    /// loaded behind the CPU when the link is idle, so that the cache follows the routing).
    #[arg(long = "no-load-behind")]
    pub no_load_behind: bool,
    /// Read missed experts from the SSD (io_uring + O_DIRECT) instead of the page cache
    /// (default on unified-memory platforms).
    #[arg(long = "ssd", conflicts_with = "no_ssd")]
    pub ssd: bool,
    /// Read missed experts from the page cache even on unified-memory platforms, paced to the
    /// profile's SSD bandwidth: emulates that SSD on a host whose own disk is slower.
    #[arg(long = "no-ssd")]
    pub no_ssd: bool,
    /// Cooperative mode: split a CPU-computed f16/bf16 expert with the GPU, which loads and
    /// computes its last rows over the otherwise idle link: auto (share balanced per layer),
    /// off, or a fixed share of the rows (0-1). Off by default: where the link's DMA and the
    /// CPU read the same host memory, it moved bytes without saving time (see the README).
    #[arg(long = "split-experts", default_value = "off")]
    pub split_experts: String,
    /// Copy missed experts through pinned staging buffers instead of page-locking the model
    /// file's expert pages for direct DMA (the default, when they fit in half the RAM).
    #[arg(long = "no-pin")]
    pub no_pin: bool,
    /// Route every decode token on the host, even when every expert is resident in one
    /// precision (where decode otherwise routes and computes its experts on the device, with
    /// no round trip per layer). For A/B runs.
    #[arg(long = "host-routing")]
    pub host_routing: bool,
    /// Print a per-token breakdown after the run: hits, misses and skips per precision,
    /// prefetch accuracy, bytes per tier, time waiting for loads and CPU experts.
    #[arg(long = "stats")]
    pub stats: bool,
    /// Write every routing decision (layer, experts, gate weights, precision) to FILE, for
    /// `hob sim`.
    #[arg(long = "record-trace", value_name = "FILE")]
    pub record_trace: Option<PathBuf>,
    /// Take every MoE layer's experts and gate weights from a trace written by --record-trace
    /// instead of the model's router (model layer l uses the trace's layer l mod its layers;
    /// each sequence starts at the trace's next one). For speed studies of synthetic-weight
    /// models routed as a trained router routes: the text such a run writes is meaningless.
    #[arg(long = "replay-trace", value_name = "FILE")]
    pub replay_trace: Option<PathBuf>,
    /// Where to compute.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    /// Device memory hob may use in total, GiB (default: what the GPU has free).
    #[arg(long = "gpu-mem")]
    pub gpu_mem: Option<f64>,
    /// Device memory for the expert cache, GiB (default: what --gpu-mem leaves after the
    /// resident weights, the KV cache and work buffers; without either, room for every expert).
    #[arg(long = "expert-cache")]
    pub expert_cache: Option<f64>,
    /// Hardware profile: a name (rtx4090-24g, jetson-orin-32g, jetson-orin-64g, h100, h200) or a .toml
    /// path. Sets the defaults of --gpu-mem and --expert-cache, paces expert loads to the
    /// profile's link when it asks for it, and gives `hob bench` its physical limit.
    #[arg(long)]
    pub platform: Option<String>,
}

const GIB: f64 = (1u64 << 30) as f64;

impl ModelArgs {
    pub fn open(&self) -> crate::Result<HobFile> {
        if !self.model.exists() {
            return Err(Error::Invalid(format!(
                "model file {} does not exist",
                self.model.display()
            )));
        }
        HobFile::open(&self.model)
    }

    pub fn backend(&self) -> crate::Result<CpuBackend> {
        CpuBackend::new(self.threads)
    }

    /// The device this command will use: `--device auto` falls back to the CPU with a note.
    pub fn resolve_device(&self) -> crate::Result<Device> {
        match self.device {
            Device::Cpu => Ok(Device::Cpu),
            Device::Cuda => cuda::probe()
                .map(|_| Device::Cuda)
                .map_err(|e| Error::Invalid(format!("--device cuda: {e}"))),
            Device::Auto => match cuda::probe() {
                Ok(()) => Ok(Device::Cuda),
                Err(why) => {
                    eprintln!("hob: running on the CPU ({why})");
                    Ok(Device::Cpu)
                }
            },
        }
    }

    /// The precision plan: which variants serve as high and low, and the scorer's thresholds.
    pub fn plan(
        &self,
        file: &HobFile,
        platform: Option<&Platform>,
    ) -> crate::Result<PrecisionPlan> {
        let high_name = self
            .expert_variant
            .clone()
            .or_else(|| platform.and_then(|p| p.high_variant.clone()));
        let high = match &high_name {
            Some(n) => self.find_variant(file, n, "--expert-variant")?,
            None => 0,
        };
        let low_name = self
            .low
            .clone()
            .or_else(|| platform.and_then(|p| p.low_variant.clone()))
            .filter(|n| n != "none");
        let low = match &low_name {
            Some(n) => Some(self.find_variant(file, n, "--low")?),
            None => None,
        };
        let (def1, def2) = if low.is_some() {
            (Thresholds::HOBBIT_MIXTRAL.t1, Thresholds::HOBBIT_MIXTRAL.t2)
        } else {
            (1.0, 1.0)
        };
        let t1 = self.t1.or(platform.and_then(|p| p.t1)).unwrap_or(def1);
        let t2 = self
            .t2
            .or(platform.and_then(|p| p.t2))
            .unwrap_or(def2.max(t1));
        Ok(PrecisionPlan {
            high,
            low: low.filter(|&l| l != high),
            thresholds: Thresholds::new(t1, t2)?,
            renormalize_skips: self.renorm_skips,
        })
    }

    fn find_variant(&self, file: &HobFile, want: &str, flag: &str) -> crate::Result<usize> {
        let names: Vec<String> = file.variants().iter().map(|v| v.name()).collect();
        file.variants()
            .iter()
            .position(|v| v.kind.name() == want || v.name() == want)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{flag} {want}: {} stores only {}",
                    self.model.display(),
                    names.join(", ")
                ))
            })
    }

    /// The --record-trace writer, if asked for.
    pub fn trace_writer(
        &self,
        file: &HobFile,
        model: &Model<'_>,
    ) -> crate::Result<Option<TraceWriter>> {
        let Some(path) = &self.record_trace else {
            return Ok(None);
        };
        let platform = self.platform()?;
        let plan = self.plan(file, platform.as_ref())?;
        let v = file.variants();
        let header = TraceHeader {
            model: file.path().display().to_string(),
            layers: model.cfg.n_layers,
            experts: model.cfg.n_experts,
            top_k: model.cfg.top_k,
            high: v[plan.high].to_string(),
            low: plan.low.map(|l| v[l].to_string()),
            high_bytes: file.expert_layout(plan.high).padded_size as u64,
            low_bytes: plan
                .low
                .map_or(0, |l| file.expert_layout(l).padded_size as u64),
            t1: plan.thresholds.t1,
            t2: plan.thresholds.t2,
            pred_depth: 0,
        };
        // The stacked gates' predictions TRACE_PRED_DEPTH layers ahead go with the routes, so a
        // replay of this trace can prefetch as this model would.
        let predictor = if model.cfg.n_layers > 1 {
            let routers: Vec<Matrix<'_>> =
                model.weights().layers.iter().map(|l| l.router).collect();
            Some(Predictor::new(
                &routers,
                TRACE_PRED_DEPTH.min(model.cfg.n_layers - 1),
                model.cfg.top_k,
            )?)
        } else {
            None
        };
        Ok(Some(TraceWriter::create_predicting(
            path, &header, predictor,
        )?))
    }

    /// The --platform profile, if one was named.
    pub fn platform(&self) -> crate::Result<Option<Platform>> {
        self.platform.as_deref().map(Platform::resolve).transpose()
    }

    /// A session on the chosen device with a KV cache of `ctx` positions.
    pub fn session<'a>(
        &self,
        file: &'a HobFile,
        model: &'a Model<'a>,
        ctx: usize,
    ) -> crate::Result<Box<dyn Session + 'a>> {
        for (flag, v) in [
            ("--gpu-mem", self.gpu_mem),
            ("--expert-cache", self.expert_cache),
        ] {
            if v.is_some_and(|g| !(g.is_finite() && g > 0.0)) {
                return Err(Error::Invalid(format!(
                    "{flag}: give a positive number of GiB"
                )));
            }
        }
        let platform = self.platform()?;
        let plan = self.plan(file, platform.as_ref())?;
        // Checked whatever the device, so a typo never passes silently on the CPU.
        let policy = Policy::parse(&self.cache_policy, self.cache_weights.as_deref())?;
        let split = Split::parse(&self.split_experts)?;
        if !(0.0..=1.0).contains(&self.prefetch_min_weight) {
            return Err(Error::Invalid(format!(
                "--prefetch-min-weight {}: give a gate weight between 0 and 1",
                self.prefetch_min_weight
            )));
        }
        if !(0.0..=1.0).contains(&self.low_share) {
            return Err(Error::Invalid(format!(
                "--low-share {}: give a share of the expert cache between 0 and 1",
                self.low_share
            )));
        }
        let replay = match &self.replay_trace {
            Some(path) => {
                let r = Replay::read(path, &model.cfg)?;
                // The model's own stacked gates predict its router, not the replayed one: a
                // replay prefetches from the predictions recorded with the trace.
                if self.prefetch > r.pred_depth() {
                    return Err(Error::Invalid(if r.pred_depth() == 0 {
                        format!(
                            "--replay-trace {} with --prefetch: the trace records no stacked-gate predictions (written by an older hob?); record it again, or leave --prefetch at 0",
                            path.display()
                        )
                    } else {
                        format!(
                            "--prefetch {}: the trace {} records predictions {} layer(s) ahead",
                            self.prefetch,
                            path.display(),
                            r.pred_depth()
                        )
                    }));
                }
                Some(r)
            }
            None => None,
        };
        let gpu_mem = self
            .gpu_mem
            .or(platform.as_ref().and_then(|p| p.gpu_mem_gib));
        let expert_cache = self
            .expert_cache
            .or(platform.as_ref().and_then(|p| p.expert_cache_gib));
        let pace = platform
            .as_ref()
            .and_then(|p| p.pacing())
            .map(|p| p.gbs * 1e9);
        match self.resolve_device()? {
            Device::Cuda => {
                let gpu = Gpu::open(0)?;
                let backend = CudaBackend::new(gpu.clone(), model)?;
                let cfg = &model.cfg;
                let kv = cfg.n_layers * ctx * cfg.kv_dim() * 2 * 2;
                let work = (ctx.min(512) * (cfg.vocab + 8 * cfg.hidden + 4 * cfg.ffn)) * 4;
                let budget = match (expert_cache, gpu_mem) {
                    (Some(e), _) => Some((e * GIB) as usize),
                    (None, Some(total)) => {
                        let used = backend.resident_bytes() + kv + work;
                        let left = ((total * GIB) as usize).checked_sub(used).ok_or_else(|| {
                            Error::Invalid(format!(
                                "--gpu-mem {total}: the resident weights, KV cache and work buffers alone need {:.2} GiB",
                                used as f64 / GIB
                            ))
                        })?;
                        Some(left)
                    }
                    (None, None) => None,
                };
                let unified = platform
                    .as_ref()
                    .is_some_and(|p| p.kind == PlatformKind::Unified);
                if unified && self.cpu_experts {
                    return Err(Error::Invalid(
                        "--cpu-experts with a unified-memory profile: not supported yet (the CPU would have to read missed experts from the SSD too, and the cost model does not charge that)".into(),
                    ));
                }
                let cfg = CacheConfig {
                    budget,
                    pace_bytes_per_s: pace,
                    preload: true,
                    plan,
                    policy,
                    low_share: self.low_share,
                    substitute_low: !self.no_substitute,
                    upgrade_low: true,
                    prefetch: self.prefetch,
                    prefetch_min_weight: self.prefetch_min_weight,
                    cpu_experts: self.cpu_experts.then_some(self.threads),
                    load_behind: !self.no_load_behind,
                    tier: if self.ssd || (unified && !self.no_ssd) {
                        Tier::Disk
                    } else {
                        Tier::Memory
                    },
                    mapped: unified,
                    pin_file: !self.no_pin,
                    split,
                    device_routing: !self.host_routing,
                    routed_slots: true,
                    trace: self.trace_writer(file, model)?,
                };
                let experts = CudaExperts::new(model, &backend, cfg)?;
                let label = format!(
                    "cuda: {} (sm_{}{}), {:.2} GiB resident weights",
                    gpu.name,
                    gpu.compute_capability.0,
                    gpu.compute_capability.1,
                    backend.resident_bytes() as f64 / GIB
                );
                bind(model, backend, Box::new(experts), replay, ctx, label)
            }
            _ => {
                let backend = self.backend()?;
                let label = format!("cpu: {} threads", backend.threads());
                let experts = CpuExperts::with_plan(file, plan)?
                    .with_trace(self.trace_writer(file, model)?)
                    .with_predictor(model, if self.stats { self.prefetch } else { 0 })?;
                bind(model, backend, Box::new(experts), replay, ctx, label)
            }
        }
    }
}

/// A boxed session of `model` on `backend` with `experts`, routed by `replay` where given.
fn bind<'a, B: Backend + 'a>(
    model: &'a Model<'a>,
    backend: B,
    experts: Box<dyn Experts<B> + 'a>,
    replay: Option<Replay>,
    ctx: usize,
    label: String,
) -> crate::Result<Box<dyn Session + 'a>> {
    let experts: Box<dyn Experts<B> + 'a> = match replay {
        Some(r) => Box::new(Replayed::new(experts, r, model.cfg.n_layers)),
        None => experts,
    };
    Ok(Box::new(Bound::new(model, backend, experts, ctx, label)?))
}

/// The tokenizer embedded in the file, with BOS/EOS from the metadata.
pub fn tokenizer(file: &HobFile, cfg: &ModelConfig) -> crate::Result<Tokenizer> {
    let json = file
        .metadata()
        .get_str(keys::TOKENIZER_HF_JSON)
        .map_err(|e| Error::Format {
            path: file.path().to_path_buf(),
            source: e,
        })?;
    let missing = |what: &str| {
        Error::Invalid(format!(
            "{}: the metadata has no {what}",
            file.path().display()
        ))
    };
    let bos = cfg.bos.ok_or_else(|| missing(keys::BOS_TOKEN_ID))?;
    let eos = cfg.eos.ok_or_else(|| missing(keys::EOS_TOKEN_ID))?;
    Ok(Tokenizer::from_json(json, bos, eos, cfg.add_bos)?)
}

/// `--stats`: what the expert engine did over `tokens` decoded tokens taking `seconds`.
pub fn print_expert_stats(s: &ExpertStats, tokens: usize, seconds: f64) {
    let n = tokens.max(1) as f64;
    let ms = |x: f64| 1e3 * x / n;
    eprintln!("expert engine, per decoded token ({tokens} tokens):");
    eprintln!(
        "  time {:.2} ms = waiting for loads {:.2} + waiting for CPU experts {:.2} + compute (attention, routing, cached experts) {:.2}",
        ms(seconds),
        ms(s.load_seconds),
        ms(s.cpu_wait_seconds),
        ms((seconds - s.load_seconds - s.cpu_wait_seconds).max(0.0))
    );
    for v in s.per_variant.iter().filter(|v| v.hits + v.misses > 0) {
        eprintln!(
            "  {:<10} uses {:.2}  hits {:.2}  misses {:.2}  (hit rate {:.1}%)",
            v.name,
            (v.hits + v.misses) as f64 / n,
            v.hits as f64 / n,
            v.misses as f64 / n,
            100.0 * v.hits as f64 / (v.hits + v.misses).max(1) as f64
        );
    }
    eprintln!(
        "  skipped {:.2}  high->low substitutions {:.2}  computed on the CPU {:.2} ({:.2} while their load was in flight; {:.2} loaded behind them, of {:.2} with the link idle and load-behind wanted)",
        s.skipped as f64 / n,
        s.substituted as f64 / n,
        s.cpu_computed as f64 / n,
        s.late_to_cpu as f64 / n,
        s.loaded_behind as f64 / n,
        s.behind_chances as f64 / n
    );
    eprintln!(
        "  bytes loaded {:.1} MB ({:.1} MB from the SSD), streamed by CPU experts {:.1} MB; prefetches {:.2} ({:.0}% used, {:.0}% dropped while loading: their layer did not route them)",
        s.bytes_loaded as f64 / n / 1e6,
        s.bytes_from_disk as f64 / n / 1e6,
        s.cpu_bytes as f64 / n / 1e6,
        s.prefetch_issued as f64 / n,
        100.0 * s.prefetch_used as f64 / s.prefetch_issued.max(1) as f64,
        100.0 * s.prefetch_cancelled as f64 / s.prefetch_issued.max(1) as f64
    );
    let rate = |bytes: u64, secs: f64| {
        if secs > 0.0 {
            format!("{:.1} GB/s", bytes as f64 / secs / 1e9)
        } else {
            "-".into()
        }
    };
    eprintln!(
        "  link busy {:.2} ms ({}); CPU experts busy {:.2} ms ({} of weights)",
        ms(s.link_seconds),
        rate(s.bytes_loaded, s.link_seconds),
        ms(s.cpu_seconds),
        rate(s.cpu_bytes, s.cpu_seconds)
    );
    let g = s.cpu_gaps;
    if g.iter().sum::<f64>() > 0.0 {
        eprintln!(
            "  CPU experts idle between layers {:.2} ms = results back {:.2} + attention and routing {:.2} + placing {:.2} + thread start {:.2}",
            ms(g.iter().sum()),
            ms(g[0]),
            ms(g[1]),
            ms(g[2]),
            ms(g[3])
        );
    }
    if s.cpu_passes > 0 {
        let p = s.cpu_passes as f64;
        eprintln!(
            "  CPU passes {:.1} per token: {:.1} helper threads took part in each; the last finished {:.3} ms after the first",
            p / n,
            s.cpu_pass_threads as f64 / p,
            1e3 * s.cpu_pass_spread_seconds / p
        );
    }
    if s.device_routed > 0 {
        eprintln!(
            "  routed on the device (every expert resident): {} of {tokens} tokens; counting their routes on the host took {:.1} us a token",
            s.device_routed,
            1e6 * s.device_account_seconds / s.device_routed as f64
        );
    }
    if s.graph_launch_seconds > 0.0 || s.read_back_seconds > 0.0 {
        eprintln!(
            "  host per token: {:.1} us submitting recorded decode steps (CUDA graphs), {:.1} us reading results back (waiting for the device included)",
            1e6 * s.graph_launch_seconds / n,
            1e6 * s.read_back_seconds / n
        );
    }
    if s.slot_routed_layers > 0 {
        eprintln!(
            "  host-routed layers through the routed kernels (experts in slots of one precision): {:.2} per token",
            s.slot_routed_layers as f64 / n
        );
    }
    if s.early_layers > 0 {
        eprintln!(
            "  layers computing cached experts while the others load: {:.2} per token",
            s.early_layers as f64 / n
        );
    }
    if s.split_experts > 0 {
        eprintln!(
            "  split with the GPU {:.2} CPU experts ({:.1} MB of their rows loaded)",
            s.split_experts as f64 / n,
            s.split_bytes as f64 / n / 1e6
        );
    }
    for (d, (p, c)) in s.prediction.iter().enumerate() {
        if *p > 0 {
            eprintln!(
                "  prediction {} layer(s) ahead: {:.1}% of predicted experts routed",
                d + 1,
                100.0 * *c as f64 / *p as f64
            );
        }
    }
}
