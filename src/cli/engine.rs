//! What every model command shares: the flags that open a .hob file, pick the device and set
//! up the expert engine, turned into one `SessionConfig` (experts::engine::EngineConfig holds
//! the one budget calculation).

use std::path::PathBuf;

use clap::Args;

use crate::backend::cuda;
use crate::experts::cache::Policy;
use crate::experts::engine::{Budget, EngineConfig, Tier, Tuning};
use crate::experts::predictor::Predictor;
use crate::experts::replay::Replay;
use crate::experts::trace::{TraceHeader, TraceWriter, TRACE_PRED_DEPTH};
use crate::experts::{PrecisionPlan, Thresholds};
use crate::format::{keys, HobFile};
use crate::generate::{open_session, Generator, SessionConfig, Tokenizer};
use crate::model::{Model, ModelConfig};
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

// `-h`'s groups after the command's own (prompt and sampling first, as llama.cpp's help).
const DEVICE: &str = "Device";
const ENGINE: &str = "Experts (the HOBBIT engine)";
const DIAGNOSTICS: &str = "Diagnostics";

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// The .hob model file.
    #[arg(short = 'm', long = "model", help_heading = "Model")]
    pub model: PathBuf,
    /// CPU threads (-1 or 0, the default: one per core; a count above the cores is capped to
    /// them). `hob bench` takes a comma list (-t 1,2,4): one set of rows per count.
    #[arg(short = 't', long = "threads", value_name = "N", value_delimiter = ',', value_parser = parse_threads, help_heading = DEVICE)]
    pub threads: Vec<usize>,
    /// Expert variant to compute with (the high precision of HOBBIT's scorer): a stored one
    /// (f16, int8, int4, ...) or a width of an ap8 file (ap8@2 .. ap8@7, ap8 for all 8 bits;
    /// CPU only for now). Default: the profile's high_variant, else the file's first.
    #[arg(
        long = "expert-variant",
        visible_alias = "high",
        help_heading = ENGINE
    )]
    pub expert_variant: Option<String>,
    /// Low-precision expert variant: turns on HOBBIT's dynamic precision (experts that matter
    /// little to a token run in this variant, or are skipped). Default: the profile's; "none"
    /// turns it off.
    #[arg(long = "low", help_heading = ENGINE)]
    pub low: Option<String>,
    /// Scorer threshold T1: a selected expert whose higher-ranked gate weights sum to <= T1 runs
    /// in high precision (default: the profile's, else 0.6 with --low, else 1 = all high).
    #[arg(long = "t1", help_heading = ENGINE)]
    pub t1: Option<f32>,
    /// Scorer threshold T2: above T1 and <= T2 low precision, above T2 skipped (default: the
    /// profile's, else 0.9 with --low, else 1 = none skipped).
    #[arg(long = "t2", help_heading = ENGINE)]
    pub t2: Option<f32>,
    /// After skipping an expert, rescale the token's other expert weights to the full sum.
    #[arg(long = "renorm-skips", help_heading = ENGINE)]
    pub renorm_skips: bool,
    /// Expert cache policy: lru, lfu, or hobbit (HOBBIT Eq. 3: LRU, LFU, LHU and FLD terms).
    #[arg(
        long = "cache-policy",
        default_value = "hobbit",
        help_heading = ENGINE
    )]
    pub cache_policy: String,
    /// Weights of the hobbit policy's LRU, LFU, LHU and FLD terms, summing to 1 (e.g.
    /// "0.4,0.2,0.3,0.1"; default: fitted with `hob sim --fit`, see the README).
    #[arg(long = "cache-weights", help_heading = ENGINE)]
    pub cache_weights: Option<String>,
    /// Share of the expert cache's bytes for low-precision experts (with --low).
    #[arg(long = "low-share", default_value_t = crate::experts::cache::DEFAULT_LOW_SHARE, help_heading = ENGINE)]
    pub low_share: f64,
    /// Never run a high-precision miss from its cached low-precision copy (default: do, except
    /// for a token's top-1 expert).
    #[arg(long = "no-substitute", help_heading = ENGINE)]
    pub no_substitute: bool,
    /// Predict this many layers ahead with stacked gates and prefetch (0: off, the default:
    /// measured, a wrong prediction costs a whole load on a link-bound card; see the README).
    #[arg(
        long = "prefetch",
        default_value_t = 0,
        help_heading = ENGINE
    )]
    pub prefetch: usize,
    /// Prefetch only predicted experts whose predicted gate weight (after top-k) is at least
    /// this (0, the default: every predicted expert, as HOBBIT does).
    #[arg(
        long = "prefetch-min-weight",
        default_value_t = 0.0,
        value_name = "W",
        help_heading = ENGINE
    )]
    pub prefetch_min_weight: f32,
    /// Let CPU threads compute missed experts from host memory when that beats loading them
    /// (cooperative mode; -t sets the threads).
    #[arg(long = "cpu-experts", help_heading = ENGINE)]
    pub cpu_experts: bool,
    /// Cooperative mode: never load a miss the CPU computes into the cache (by default it is
    /// loaded behind the CPU when the link is idle, so that the cache follows the routing).
    #[arg(long = "no-load-behind", help_heading = ENGINE)]
    pub no_load_behind: bool,
    /// Read missed experts from the SSD (io_uring + O_DIRECT) instead of the page cache
    /// (default on unified-memory platforms).
    #[arg(
        long = "ssd",
        conflicts_with = "no_ssd",
        help_heading = ENGINE
    )]
    pub ssd: bool,
    /// Read missed experts from the page cache even on unified-memory platforms, paced to the
    /// profile's SSD bandwidth: emulates that SSD on a host whose own disk is slower.
    #[arg(long = "no-ssd", help_heading = ENGINE)]
    pub no_ssd: bool,
    /// Copy missed experts through pinned staging buffers instead of page-locking the model
    /// file's expert pages for direct DMA (the default, when they fit in half the RAM).
    #[arg(long = "no-pin", help_heading = ENGINE)]
    pub no_pin: bool,
    /// Print a per-token breakdown after the run: hits, misses and skips per precision,
    /// prefetch accuracy, bytes per tier, time waiting for loads and CPU experts.
    #[arg(long = "stats", help_heading = DIAGNOSTICS)]
    pub stats: bool,
    /// Write every routing decision (layer, experts, gate weights, precision) to FILE, for
    /// `hob sim`.
    #[arg(
        long = "record-trace",
        value_name = "FILE",
        help_heading = DIAGNOSTICS
    )]
    pub record_trace: Option<PathBuf>,
    /// Take every MoE layer's experts and gate weights from a trace written by --record-trace
    /// instead of the model's router (model layer l uses the trace's layer l mod its layers;
    /// each sequence starts at the trace's next one). For speed studies of synthetic-weight
    /// models routed as a trained router routes: the text such a run writes is meaningless.
    #[arg(
        long = "replay-trace",
        value_name = "FILE",
        help_heading = DIAGNOSTICS
    )]
    pub replay_trace: Option<PathBuf>,
    /// Where to compute.
    #[arg(long, value_enum, default_value_t = Device::Auto, help_heading = DEVICE)]
    pub device: Device,
    /// llama.cpp's GPU layers (-ngl): 0 computes on the CPU, as --device cpu; any other value
    /// uses the GPU, where hob places every layer itself (dense weights resident, experts
    /// cached within --gpu-mem).
    #[arg(
        long = "n-gpu-layers",
        visible_alias = "gpu-layers",
        value_name = "N",
        help_heading = DEVICE
    )]
    pub n_gpu_layers: Option<i64>,
    /// Device memory hob may use in total, GiB (default: what the GPU has free).
    #[arg(long = "gpu-mem", help_heading = DEVICE)]
    pub gpu_mem: Option<f64>,
    /// Device memory for the expert cache, GiB (default: what --gpu-mem leaves after the
    /// resident weights, the KV cache and work buffers; without either, room for every expert).
    #[arg(long = "expert-cache", help_heading = DEVICE)]
    pub expert_cache: Option<f64>,
    /// Hardware profile: a name (rtx4090-24g, rtx4060ti-16g, rtx3060-12g, jetson-orin-32g,
    /// jetson-orin-64g, jetson-orin-nx-16g, jetson-orin-nano-8g, h100, h200) or a .toml path. Sets the defaults of --gpu-mem and --expert-cache, paces expert loads to the
    /// profile's link when it asks for it, and gives `hob bench` its physical limit.
    #[arg(long, help_heading = DEVICE)]
    pub platform: Option<String>,
}

/// One -t value, llama.cpp's way: -1 and 0 are one thread per core; a count above the cores is
/// capped to them, with a note (extra threads only slow the spinning pools down).
fn parse_threads(s: &str) -> Result<usize, String> {
    let n: i64 = s
        .trim()
        .parse()
        .map_err(|_| "expected a number of threads (-1 or 0: one per core)".to_string())?;
    let cores = crate::platform::cores();
    match n {
        -1 | 0 => Ok(cores),
        n if n < 0 => Err(format!(
            "-t {n}: a thread count is positive, or -1 or 0 for one per core"
        )),
        n => {
            let (threads, capped) =
                crate::platform::user_threads(usize::try_from(n).unwrap_or(usize::MAX), cores);
            if capped {
                let plural = if cores == 1 { "" } else { "s" };
                eprintln!("-t {n}: this machine has {cores} core{plural}; using {threads}");
            }
            Ok(threads)
        }
    }
}

impl ModelArgs {
    /// The -t thread counts (each already resolved: one per core by default, capped at the
    /// cores); `hob bench` runs each.
    pub fn thread_counts(&self) -> Vec<usize> {
        if self.threads.is_empty() {
            vec![crate::platform::cores()]
        } else {
            self.threads.clone()
        }
    }

    /// The one -t thread count of a command that is not `hob bench`.
    pub fn thread_count(&self) -> crate::Result<usize> {
        match self.thread_counts()[..] {
            [n] => Ok(n),
            ref many => Err(Error::Invalid(format!(
                "-t: one thread count here, not a list of {} (comma lists are for hob bench)",
                many.len()
            ))),
        }
    }

    /// These flags with one thread count: what one of `hob bench`'s sessions runs with.
    pub fn with_threads(&self, threads: usize) -> ModelArgs {
        ModelArgs {
            threads: vec![threads],
            ..self.clone()
        }
    }

    pub fn open(&self) -> crate::Result<HobFile> {
        if !self.model.exists() {
            return Err(Error::Invalid(format!(
                "model file {} does not exist",
                self.model.display()
            )));
        }
        let file = HobFile::open(&self.model)?;
        super::signals::guard_mapped(&self.model);
        Ok(file)
    }

    /// The device this command will use: `--device auto` falls back to the CPU with a note.
    pub fn resolve_device(&self) -> crate::Result<Device> {
        let device = match (self.n_gpu_layers, self.device) {
            (Some(0), Device::Cuda) => {
                return Err(Error::Invalid(
                    "-ngl 0 asks for the CPU and --device cuda for the GPU: pick one".into(),
                ))
            }
            (Some(0), _) => Device::Cpu,
            (_, d) => d,
        };
        match device {
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
        // A profile's pair that the file does not store gives way to the file's own
        // (`fallback_pair`): a .hob from a Q4_K_M GGUF holds int4 + int2, not the f16 + int4 a
        // 24 GB profile names. A flag's choice must exist.
        let profile_pair_missing = platform.is_some_and(|p| {
            let stored = |n: &Option<String>| {
                n.as_ref()
                    .is_none_or(|n| n == "none" || self.find_variant(file, n, "").is_ok())
            };
            !stored(&p.high_variant) || !stored(&p.low_variant)
        });
        let fallback = fallback_pair(file);
        let high = match &high_name {
            Some(_) if self.expert_variant.is_none() && profile_pair_missing => fallback.0,
            Some(n) => self.find_variant(file, n, "--expert-variant")?,
            None => 0,
        };
        let low_name = self
            .low
            .clone()
            .or_else(|| platform.and_then(|p| p.low_variant.clone()))
            .filter(|n| n != "none");
        let low = match &low_name {
            Some(_) if self.low.is_none() && profile_pair_missing => fallback
                .1
                .filter(|&l| l != high)
                .or_else(|| (0..file.variants().len()).find(|&i| i != high)),
            Some(n) => Some(self.find_variant(file, n, "--low")?),
            None => None,
        };
        // Said where the file's own pair stands in, not where both flags chose.
        let fell_back = self.expert_variant.is_none() || self.low.is_none();
        if let (true, Some(p)) = (profile_pair_missing && fell_back, platform) {
            let name = |i: Option<usize>| i.map_or("none".into(), |i| file.variants()[i].name());
            eprintln!(
                "hob: {} does not store the {} profile's {} + {}; using its {} high, {} low \
                 (--expert-variant and --low choose)",
                self.model.display(),
                p.name,
                p.high_variant.as_deref().unwrap_or("-"),
                p.low_variant.as_deref().unwrap_or("none"),
                name(Some(high)),
                name(low)
            );
        }
        // A low variant equal to the high one is none, and the profile's (or HOBBIT's) thresholds
        // then do not apply: one variant computes every routed expert, unless --t1/--t2 ask
        // for skips.
        let low = low.filter(|&l| l != high);
        let (t1, t2) = match low {
            Some(_) => {
                let t1 = self
                    .t1
                    .or(platform.and_then(|p| p.t1))
                    .unwrap_or(Thresholds::HOBBIT_MIXTRAL.t1);
                let t2 = self
                    .t2
                    .or(platform.and_then(|p| p.t2))
                    .unwrap_or(Thresholds::HOBBIT_MIXTRAL.t2.max(t1));
                (t1, t2)
            }
            None => (self.t1.unwrap_or(1.0), self.t2.unwrap_or(1.0)),
        };
        Ok(PrecisionPlan {
            high,
            low,
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
            layers: model.cfg.moe_layers(),
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
        let predictor = if model.cfg.moe_layers() > 1 {
            let routers: Vec<Matrix<'_>> = model
                .weights()
                .layers
                .iter()
                .filter_map(|l| l.router)
                .collect();
            Some(Predictor::new(
                &routers,
                TRACE_PRED_DEPTH.min(model.cfg.moe_layers() - 1),
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

    /// The session these flags ask for: device, threads, and the engine's configuration from
    /// the flags and the profile.
    pub fn session_config(
        &self,
        file: &HobFile,
        model: &Model<'_>,
    ) -> crate::Result<SessionConfig> {
        self.check_values()?;
        let threads = self.thread_count()?;
        let platform = self.platform()?;
        let plan = self.plan(file, platform.as_ref())?;
        // Checked whatever the device, so a typo never passes silently on the CPU.
        let policy = Policy::parse(&self.cache_policy, self.cache_weights.as_deref())?;
        let replay = self.replay(model)?;
        let p = platform.as_ref();
        let gib = |g: f64| (g * (1u64 << 30) as f64) as usize;
        let budget = match (
            self.expert_cache.or(p.and_then(|p| p.expert_cache_gib)),
            self.gpu_mem.or(p.and_then(|p| p.gpu_mem_gib)),
        ) {
            (Some(e), _) => Budget::Bytes(gib(e)),
            (None, Some(total)) => Budget::DeviceTotal(gib(total)),
            (None, None) => Budget::Free,
        };
        let unified = p.is_some_and(|p| p.kind == PlatformKind::Unified);
        let device = self.resolve_device()?;
        if unified && self.cpu_experts && device == Device::Cuda {
            return Err(Error::Invalid(
                "--cpu-experts with a unified-memory profile: not supported yet (the CPU would have to read missed experts from the SSD too, and the cost model does not charge that)".into(),
            ));
        }
        let engine = EngineConfig {
            plan,
            policy,
            budget,
            ctx: 0,
            low_share: self.low_share,
            substitute_low: !self.no_substitute,
            prefetch: self.prefetch,
            prefetch_min_weight: self.prefetch_min_weight,
            cpu_experts: self.cpu_experts.then_some(threads),
            load_behind: !self.no_load_behind,
            tier: if self.ssd || (unified && !self.no_ssd) {
                Tier::Disk
            } else {
                Tier::Memory
            },
            mapped: unified,
            pin_file: !self.no_pin,
            pace_bytes_per_s: p.and_then(|p| p.pacing()).map(|p| p.gbs * 1e9),
            tuning: Tuning::default(),
            trace: self.trace_writer(file, model)?,
        };
        Ok(SessionConfig {
            device: match device {
                Device::Cuda => crate::generate::Device::Cuda,
                _ => crate::generate::Device::Cpu,
            },
            threads,
            engine,
            score_predictions: self.stats,
            replay,
        })
    }

    /// A generator over a session of `model` with a KV cache of `ctx` positions.
    pub fn generator<'a>(
        &self,
        file: &'a HobFile,
        model: &'a Model<'a>,
        ctx: usize,
    ) -> crate::Result<Generator<'a>> {
        let cfg = self.session_config(file, model)?;
        Ok(Generator::new(open_session(model, ctx, cfg)?))
    }

    /// Flag values out of their ranges.
    fn check_values(&self) -> crate::Result<()> {
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
        Ok(())
    }

    /// The --replay-trace routing, if asked for.
    fn replay(&self, model: &Model<'_>) -> crate::Result<Option<Replay>> {
        let Some(path) = &self.replay_trace else {
            return Ok(None);
        };
        let r = Replay::read(path, &model.cfg)?;
        // The model's own stacked gates predict its router, not the replayed one: a replay
        // prefetches from the predictions recorded with the trace.
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
        Ok(Some(r))
    }
}

/// The tokenizer embedded in the file, with BOS/EOS from the metadata.
pub fn tokenizer(file: &HobFile, cfg: &ModelConfig) -> crate::Result<Tokenizer> {
    let json = file
        .metadata()
        .get_str(keys::TOKENIZER_HF_JSON)
        .map_err(|e| e.in_file(file.path()))?;
    let missing = |what: &str| {
        Error::Invalid(format!(
            "{}: the metadata has no {what}",
            file.path().display()
        ))
    };
    let bos = match (cfg.bos, cfg.add_bos) {
        (None, true) => return Err(missing(keys::BOS_TOKEN_ID)),
        (bos, _) => bos,
    };
    let eos = cfg.eos.ok_or_else(|| missing(keys::EOS_TOKEN_ID))?;
    // Name the file and the metadata key that hold the bad value.
    let mut tok = Tokenizer::from_json(json, bos, eos, cfg.add_bos).map_err(|e| {
        use crate::format::FormatError;
        use crate::generate::GenerateError;
        let key = match &e {
            GenerateError::TokenizerLoad { .. } => keys::TOKENIZER_HF_JSON,
            GenerateError::SpecialIdOutOfRange {
                field: "bos_id", ..
            } => keys::BOS_TOKEN_ID,
            GenerateError::SpecialIdOutOfRange { .. } => keys::EOS_TOKEN_ID,
            _ => return Error::from(e),
        };
        let detail = e.to_string();
        FormatError::Metadata {
            key: key.to_string(),
            detail,
        }
        .in_file(file.path())
        .into()
    })?;
    // Every token that ends an answer (Qwen's <|im_end|> and <|endoftext|>).
    use crate::format::MetaValue;
    if let Some(MetaValue::Array { items, .. }) = file.metadata().get(keys::STOP_TOKEN_IDS) {
        for item in items {
            let bad = |detail: String| -> Error {
                crate::format::FormatError::Metadata {
                    key: keys::STOP_TOKEN_IDS.to_string(),
                    detail,
                }
                .in_file(file.path())
                .into()
            };
            let MetaValue::U32(id) = item else {
                return Err(bad(format!("{item:?} is not a token id")));
            };
            tok.add_stop_id(*id).map_err(|e| bad(e.to_string()))?;
        }
    }
    Ok(tok)
}

/// Widths of the pair an ap8 file runs where a profile's pair is missing: ap8@5 + ap8@3 offloads
/// 1.6-2.4x faster than int8 + int2 at lower KL (benches/results/2026-12-04-h200-issue54-ap8-gpu.md).
pub(crate) const AP8_PAIR: (u8, u8) = (5, 3);

/// The high and low variants a file runs when the profile's pair is not in it: an ap8 variant
/// at `AP8_PAIR`'s widths, else the file's first variant high and the next low.
fn fallback_pair(file: &HobFile) -> (usize, Option<usize>) {
    let v = file.variants();
    let at =
        |stored: &crate::format::Variant, k: u8| v.iter().position(|x| *x == stored.at_width(k));
    let ap8 = v
        .iter()
        .find(|x| x.kind == crate::format::VariantKind::Ap8 && !x.is_view());
    match ap8.and_then(|a| Some((at(a, AP8_PAIR.0)?, at(a, AP8_PAIR.1)?))) {
        Some((h, l)) => (h, Some(l)),
        None => (0, (v.len() > 1).then_some(1)),
    }
}
