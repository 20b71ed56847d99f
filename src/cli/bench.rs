//! `hob bench`: llama-bench's table (prefill pp and decode tg tokens/s, mean ± sd over -r runs)
//! plus the MoE columns (hit rate per variant, experts and bytes loaded per token, link GB/s) and
//! the physical limit of the same bytes (shared/REFERENCE.md) beside each decode figure.
//!
//! Tokens come from a fixed pseudo-random trace (--seed), not from sampling, so two runs (A/B)
//! route identically. Each repetition starts from an empty context, as llama-bench does.
//!
//! A profile emulated on a faster device (`--platform` with slower memory than the device's
//! measured copy) gets a projection beside each CUDA decode row: one more run with every kernel
//! timed gives the GPU-busy time a token, scaled by the two memories' ratio (`bench::project`).

use super::out::{out, outln};
use clap::Args;

use super::engine::ModelArgs;
use crate::bench::{
    achieved_gbs, physical_limit, project, render_json, render_markdown, BenchRow, BenchTest,
    HitRate, Limit, MoeStats, Projection,
};
use crate::experts::ExpertStats;
use crate::format::keys;
use crate::generate::Generator;
use crate::model::{KernelTime, Model};
use crate::Error;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens of the prefill tests, a comma list (0: none; default 512, at most the
    /// model's context).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_name = "N",
        value_delimiter = ','
    )]
    pub n_prompt: Vec<usize>,
    /// Tokens of the decode tests, a comma list (0: none; default 128, at most the model's
    /// context).
    #[arg(short = 'n', long = "n-gen", value_name = "N", value_delimiter = ',')]
    pub n_gen: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Output format.
    #[arg(short = 'o', long = "output", value_parser = ["md", "json"], default_value = "md")]
    pub output: String,
    /// Seed of the token trace.
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    /// After each test, one more run with every GPU kernel timed (an event pair per launch; not
    /// in the table): GPU time per kernel per token, and the time outside kernels.
    #[arg(long)]
    pub kernel_times: bool,
}

/// A deterministic token trace over the vocabulary (xorshift64*), skipping ids 0..3 (special).
pub fn token_trace(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let lo = 3.min(vocab.saturating_sub(1));
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let r = s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33;
            (lo + (r as usize) % (vocab - lo)) as u32
        })
        .collect()
}

/// Every expert blob a run may compute with, checked before the tests: a run checks each on its
/// first use, a one-time cost that the warm-up of a few tokens does not cover (measured:
/// benches/results/2026-12-01-h200-issue49.md); the table is of the steady state.
fn check_experts(
    file: &crate::format::HobFile,
    plan: &crate::experts::PrecisionPlan,
) -> crate::Result<()> {
    let started = std::time::Instant::now();
    let variants: Vec<usize> = std::iter::once(plan.high).chain(plan.low).collect();
    for l in 0..file.n_layers() {
        for e in 0..file.n_experts() {
            for &v in &variants {
                file.verify_expert(l, e, v)?;
            }
        }
    }
    let bytes: usize = variants.iter().map(|&v| file.expert_layout(v).size).sum();
    let gb = (file.n_layers() * file.n_experts() * bytes) as f64 / 1e9;
    eprintln!(
        "bench: checked the experts' checksums ({gb:.2} GB) in {:.2} s before the tests",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The tests of one session, in llama-bench's order: each -p size as a prefill test, then each
/// -n size as a decode test (sizes 0 skipped). Each size is below the model's context; a default
/// beyond it is clamped to it (said on stderr).
fn tests(args: &BenchArgs, context: usize) -> crate::Result<Vec<BenchTest>> {
    let fit = |given: &[usize], default: usize, flag: &str| -> crate::Result<Vec<usize>> {
        if given.is_empty() && default >= context {
            eprintln!(
                "bench: {flag} defaults to {default}, beyond the model's context of {context}: {}",
                context - 1
            );
            return Ok(vec![context - 1]);
        }
        if given.is_empty() {
            return Ok(vec![default]);
        }
        match given.iter().find(|&&n| n >= context) {
            Some(n) => Err(Error::Invalid(format!(
                "{flag} {n}: at most {} tokens (the context of {})",
                context - 1,
                args.model.model.display()
            ))),
            None => Ok(given.iter().copied().filter(|&n| n > 0).collect()),
        }
    };
    let prompts = fit(&args.n_prompt, 512, "-p")?.into_iter();
    let gens = fit(&args.n_gen, 128, "-n")?.into_iter();
    let tests: Vec<BenchTest> = prompts
        .map(BenchTest::Prompt)
        .chain(gens.map(BenchTest::Generate))
        .collect();
    if tests.is_empty() {
        return Err(Error::Invalid(
            "nothing to measure: every -p and -n size is 0".into(),
        ));
    }
    Ok(tests)
}

pub fn run(args: &BenchArgs) -> crate::Result<()> {
    if args.reps == 0 {
        return Err(Error::Invalid("-r/--repetitions: at least 1".into()));
    }
    let file = args.model.open()?;
    let model = Model::load(&file)?;
    let cfg = &model.cfg;
    let tests = tests(args, cfg.context_length)?;
    let longest = tests.iter().map(|&t| args_n(t)).max().unwrap_or(1);
    let ctx = (longest + 1).min(cfg.context_length);
    let platform = args.model.platform()?;
    let decodes = tests.iter().any(|t| matches!(t, BenchTest::Generate(_)));
    let on_cuda = decodes
        && !matches!(args.model.device, super::engine::Device::Cpu)
        && crate::backend::cuda::probe().is_ok();
    // Without --platform, this device's own figures for the limit; with one, this device's
    // memory for the projection. Measured before a session takes device memory for its expert
    // cache (the copy needs 2 GiB).
    let mut measured = (platform.is_none() && on_cuda).then(measure_device);
    let projected = match (&platform, on_cuda) {
        (Some(p), true) => projection_figures(p),
        _ => None,
    };
    let mut bench = Bench::new(args, &file, platform.as_ref(), cfg.tie_embeddings)?;
    bench.projected = projected;
    check_experts(&file, &args.model.plan(&file, platform.as_ref())?)?;
    let trace = token_trace(ctx, cfg.vocab, args.seed);
    let mut figures = None;
    let mut rows = Vec::new();
    // llama-bench's order: for each thread count, its own session (the previous one and its
    // device memory gone first), the prefill tests, then the decode tests.
    for threads in args.model.thread_counts() {
        let mut gen = args
            .model
            .with_threads(threads)
            .generator(&file, &model, ctx)?;
        eprintln!("bench: {}", gen.describe());
        let cuda = gen.describe().starts_with("cuda");
        let figures = *figures.get_or_insert_with(|| {
            limit_figures(platform.as_ref(), measured.take().filter(|_| cuda))
        });
        bench.threads = threads;
        bench.backend = if cuda { "CUDA" } else { "CPU" };
        bench.figures = figures;
        bench.host_gbs = match args.model.cpu_experts && cuda {
            true => Some(cooperative_host_gbs(threads, platform.as_ref(), figures)?),
            false => None,
        };
        for &test in &tests {
            warm_up(&mut gen, test, &trace)?;
            rows.push(bench.measure(args, &mut gen, test, &trace)?);
        }
    }
    match args.output.as_str() {
        "json" => outln!("{}", render_json(&rows)),
        _ => out!("{}", render_markdown(&rows)),
    }
    Ok(())
}

/// Before each test, as llama-bench does, one run not measured: a prefill of the test's size
/// (buffers grow and cuBLAS picks its kernels for that shape once), or a few decode steps.
fn warm_up(gen: &mut Generator<'_>, test: BenchTest, trace: &[u32]) -> crate::Result<()> {
    match test {
        BenchTest::Prompt(n) => gen.feed_timed(&trace[..n], true)?,
        BenchTest::Generate(n) => gen.feed_timed(&trace[..n.min(4)], false)?,
    };
    Ok(())
}

/// What the rows of one bench run share, and the session's settings (set per thread count).
struct Bench {
    label: String,
    /// Bytes and parameters of what is benchmarked: the dense weights and every expert in the
    /// variants computed with (not the file's other variants).
    size_bytes: u64,
    params: u64,
    profile: String,
    /// Bytes one decode token reads of the dense weights.
    dense: f64,
    /// Bytes of one expert in each variant (what a use reads from device memory).
    variant_bytes: Vec<f64>,
    /// The profile's name and memory rate (a row above its limit is warned about).
    warn_profile: Option<(String, f64)>,
    /// The session's CPU threads.
    threads: usize,
    backend: &'static str,
    /// The limit's memory and link figures, GB/s.
    figures: Option<(f64, f64)>,
    /// Cooperative runs: host memory's rate for the missed bytes, GB/s.
    host_gbs: Option<f64>,
    /// This device's memory and the profile's, GB/s, where the profile's is the slower: CUDA
    /// decode rows get a projection onto it.
    projected: Option<(f64, f64)>,
}

impl Bench {
    fn new(
        args: &BenchArgs,
        file: &crate::format::HobFile,
        platform: Option<&crate::platform::Platform>,
        tied: bool,
    ) -> crate::Result<Bench> {
        let plan = args.model.plan(file, platform)?;
        let used: Vec<usize> = std::iter::once(plan.high).chain(plan.low).collect();
        let (size_bytes, params) = footprint(file, &used);
        Ok(Bench {
            label: model_label(args, file, platform)?,
            size_bytes,
            params,
            profile: platform.map_or_else(|| "native".to_string(), |p| p.name.clone()),
            dense: dense_bytes(file, tied),
            variant_bytes: (0..file.variants().len())
                .map(|v| file.expert_layout(v).size as f64)
                .collect(),
            warn_profile: platform.map(|p| (p.name.clone(), p.memory_bandwidth_gbs)),
            threads: 0,
            backend: "CPU",
            figures: None,
            host_gbs: None,
            projected: None,
        })
    }

    /// `-r` runs of `test`, the engine's counters summed over them: one row.
    fn measure(
        &self,
        args: &BenchArgs,
        gen: &mut Generator<'_>,
        test: BenchTest,
        trace: &[u32],
    ) -> crate::Result<BenchRow> {
        let mut samples = Vec::new();
        let mut total = ExpertStats::default();
        let mut tokens = 0usize;
        let replays = gen.session().decode_replays();
        // The logits are discarded: checked in the warm-up, not in the measured runs (their
        // scan is a sampler's cost, which llama-bench's tg does not include either).
        gen.session().check_logits(false);
        for rep in 0..args.reps {
            gen.session().reset_stats();
            let (n, secs) = run_test(gen, test, trace)?;
            samples.push(n as f64 / secs);
            tokens += n;
            total.accumulate(&gen.session().expert_stats());
            eprintln!(
                "bench: {test} run {}/{}: {:.2} tok/s",
                rep + 1,
                args.reps,
                n as f64 / secs
            );
        }
        gen.session().check_logits(true);
        if let (BenchTest::Generate(_), n) = (test, gen.session().decode_replays() - replays) {
            if n > 0 {
                eprintln!("bench: {test}: {n} of {tokens} decode steps replayed from a CUDA graph");
            }
        }
        let projects = matches!(test, BenchTest::Generate(_)) && self.backend == "CUDA";
        let projects = projects.then_some(self.projected).flatten();
        let timed = match args.kernel_times || projects.is_some() {
            true => kernel_run(gen, test, trace)?,
            false => None,
        };
        if args.kernel_times {
            print_kernel_times(test, timed.as_ref());
        }
        if args.model.stats {
            let secs = samples.iter().map(|r| args_n(test) as f64 / r).sum();
            eprint!("bench: {test}:\n{}", total.report(tokens, secs));
        }
        let tok = tokens as f64;
        let moe = moe_stats(&total, tok);
        let limit = self.limit(test, &total, &moe, tok);
        if let (BenchTest::Generate(_), Some(l)) = (test, &limit) {
            self.say_limit(test, l, &total, &samples, tok);
        }
        let projection = match (projects, &timed) {
            (Some(figures), Some(run)) => {
                let read = self.read_per_token(&total, tok);
                self.projection(test, figures, (run, read), &samples, &limit)
            }
            _ => None,
        };
        Ok(BenchRow {
            model: self.label.clone(),
            size_bytes: self.size_bytes,
            params: Some(self.params),
            backend: self.backend.to_string(),
            threads: self.threads,
            profile: self.profile.clone(),
            test,
            samples_tok_s: samples,
            moe: (self.backend == "CUDA" || total.skipped > 0).then_some(moe),
            limit,
            projection,
        })
    }

    /// A decode row's projection onto the profile's memory (`figures`: the device's and the
    /// profile's GB/s), from the kernel-timed `run` and the bytes a token reads; said on stderr.
    fn projection(
        &self,
        test: BenchTest,
        (device, profile): (f64, f64),
        (run, read): (&KernelRun, f64),
        samples: &[f64],
        limit: &Option<Limit>,
    ) -> Option<Projection> {
        let busy = run
            .times
            .iter()
            .filter(|t| !WAITS_FOR_HOST.contains(&t.name.as_str()))
            .map(|t| t.seconds)
            .sum::<f64>()
            / run.tokens as f64;
        let mean = crate::bench::mean_sd(samples).0;
        // `run` launched every kernel directly (the clock's event pairs keep CUDA graphs off),
        // so its GPU time can exceed the time a token of the graph-replayed repetitions:
        // `project` clamps it to that time.
        let p = project(mean, (busy, read), device, profile)?;
        let of_limit = limit
            .map(|l| format!(" ({:.0}% of its limit)", 100.0 * p.tok_s / l.overlap_tok_s))
            .unwrap_or_default();
        eprintln!(
            "bench: {test}: projected {:.2} tok/s on {}'s memory{of_limit}, a projection: of {:.2} ms a token here, {:.2} ms in kernels, whose {:.2} GB read scales by {:.0} / {:.0} GB/s (x{:.2}); the rest as measured",
            p.tok_s,
            self.profile,
            1e3 / mean,
            1e3 * p.gpu_busy_s,
            read / 1e9,
            p.device_gbs,
            p.profile_gbs,
            p.device_gbs / p.profile_gbs
        );
        Some(p)
    }

    /// Bytes one decode token reads from device memory: the dense weights and every expert it
    /// computes, at its variant's size.
    fn read_per_token(&self, total: &ExpertStats, tok: f64) -> f64 {
        let experts: f64 = total
            .per_variant
            .iter()
            .zip(&self.variant_bytes)
            .map(|(v, b)| (v.hits + v.misses) as f64 * b)
            .sum();
        self.dense + experts / tok
    }

    /// The physical limit of a CUDA decode row (shared/REFERENCE.md).
    fn limit(
        &self,
        test: BenchTest,
        total: &ExpertStats,
        moe: &MoeStats,
        tok: f64,
    ) -> Option<Limit> {
        let (BenchTest::Generate(_), Some((mem, link)), "CUDA") =
            (test, self.figures, self.backend)
        else {
            return None;
        };
        let read = self.read_per_token(total, tok);
        Some(match self.host_gbs {
            None => physical_limit(read, moe.bytes_moved_per_token, mem, link),
            // Cooperative: every missed expert crosses the link or is streamed by the CPU, the
            // two in parallel; the best split of the missed bytes between them bounds the time.
            Some(host) => {
                let streamed = total.cpu_bytes as f64 / tok;
                physical_limit(read, moe.bytes_moved_per_token + streamed, mem, host)
            }
        })
    }

    fn say_limit(
        &self,
        test: BenchTest,
        l: &Limit,
        total: &ExpertStats,
        samples: &[f64],
        tok: f64,
    ) {
        let mean = crate::bench::mean_sd(samples).0;
        eprintln!(
            "bench: {test}: {:.2} tok/s; limit {:.2} tok/s (overlap) / {:.2} (no overlap); reads {:.2} GB/s of device memory",
            mean,
            l.overlap_tok_s,
            l.no_overlap_tok_s,
            achieved_gbs(self.read_per_token(total, tok), mean)
        );
        // A profile emulated on a faster device paces only its link: what stays resident is
        // read at this device's speed, not the profile's.
        if let (true, Some((name, gbs))) = (mean > l.overlap_tok_s, &self.warn_profile) {
            log::warn!(
                "bench: {test} ran above the {name} profile's limit: this device's memory is faster than the profile's {gbs} GB/s, and an emulated profile paces only the loads; the row does not measure that platform"
            );
        }
    }
}

/// The MoE columns of one test, per token.
fn moe_stats(total: &ExpertStats, tok: f64) -> MoeStats {
    MoeStats {
        hit_rates: total
            .per_variant
            .iter()
            .filter(|v| v.hits + v.misses > 0)
            .map(|v| HitRate {
                variant: v.name.clone(),
                rate: v.hits as f64 / (v.hits + v.misses) as f64,
            })
            .collect(),
        experts_loaded_per_token: total.misses() as f64 / tok,
        bytes_moved_per_token: total.bytes_loaded as f64 / tok,
        skipped_per_token: total.skipped as f64 / tok,
        // The loader's rate while busy (not bytes over the compute thread's waits, which
        // prefetches and CPU experts hide).
        link_gbs: if total.link_seconds > 0.0 {
            total.bytes_loaded as f64 / total.link_seconds / 1e9
        } else {
            0.0
        },
    }
}

/// The model column: name, variants, thresholds, replayed routing.
fn model_label(
    args: &BenchArgs,
    file: &crate::format::HobFile,
    platform: Option<&crate::platform::Platform>,
) -> crate::Result<String> {
    let name = file
        .metadata()
        .get_str(keys::NAME)
        .map(str::to_string)
        .unwrap_or_else(|_| {
            file.path()
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        });
    let plan = args.model.plan(file, platform)?;
    let v = file.variants();
    let mut label = match plan.low {
        Some(l) => format!(
            "{name} {}+{} T1 {} T2 {}",
            v[plan.high], v[l], plan.thresholds.t1, plan.thresholds.t2
        ),
        None if !plan.is_exact() => format!(
            "{name} {} T1 {} T2 {}",
            v[plan.high], plan.thresholds.t1, plan.thresholds.t2
        ),
        None => format!("{name} {}", v[plan.high]),
    };
    if args.model.replay_trace.is_some() {
        label += ", replayed routing";
    }
    Ok(label)
}

/// Bytes one decode token reads of the dense weights: every dense matrix except the embedding
/// table (one row of it).
fn dense_bytes(file: &crate::format::HobFile, tied: bool) -> f64 {
    file.tensors()
        .iter()
        .filter(|t| t.name != keys::TOKEN_EMBD || tied)
        .map(|t| t.size)
        .sum::<u64>() as f64
}

/// Bytes and parameters of the dense weights and of every expert in `variants` (each variant
/// holds every expert: a variant's parameters are the experts' weights, whatever their
/// precision, so they count once).
fn footprint(file: &crate::format::HobFile, variants: &[usize]) -> (u64, u64) {
    let experts = (file.n_layers() * file.n_experts()) as u64;
    let (hidden, ffn) = file.expert_dims();
    let dense_bytes: u64 = file.tensors().iter().map(|t| t.size).sum();
    let dense_params: u64 = file
        .tensors()
        .iter()
        .map(|t| t.shape.iter().product::<usize>() as u64)
        .sum();
    let expert_bytes: u64 = variants
        .iter()
        .map(|&v| experts * file.expert_layout(v).size as u64)
        .sum();
    let expert_params = experts * 3 * (hidden * ffn) as u64;
    (dense_bytes + expert_bytes, dense_params + expert_params)
}

/// The limit's figures: the profile's, or without --platform this device's own (a
/// device-to-device copy and the link from page-locked memory), so that every CUDA decode row
/// has its limit beside it.
fn limit_figures(
    platform: Option<&crate::platform::Platform>,
    measured: Option<crate::Result<(f64, f64)>>,
) -> Option<(f64, f64)> {
    match (platform, measured) {
        (Some(p), _) => Some((p.memory_bandwidth_gbs, p.load_gbs())),
        (None, Some(Ok((mem, link)))) => {
            eprintln!(
                "bench: no --platform: the limit takes this device's measured figures, memory {mem:.0} GB/s (device copy, read + write) and host link {link:.1} GB/s"
            );
            Some((mem, link))
        }
        (None, Some(Err(e))) => {
            eprintln!("bench: no --platform, and this device's figures could not be measured ({e}): no limit column");
            None
        }
        (None, None) => None,
    }
}

/// Cooperative mode: missed experts also stream from host memory into the CPU helpers, so the
/// bound spreads the missed bytes over the link and the host's memory together. The link's DMA
/// reads host memory too: the two are measured together, and the bound takes the lesser of
/// their sum alone and what they reach at once.
fn cooperative_host_gbs(
    threads: usize,
    platform: Option<&crate::platform::Platform>,
    figures: Option<(f64, f64)>,
) -> crate::Result<f64> {
    let cpu = crate::backend::cpu::CpuBackend::new(threads)?;
    let alone = cpu.read_bandwidth_gbs(1 << 30);
    let link = figures.map_or(f64::INFINITY, |f| f.1);
    let pace = platform.and_then(|p| p.pacing()).map(|p| p.gbs * 1e9);
    let together = crate::backend::cuda::Gpu::open(0)
        .and_then(|gpu| gpu.dma_during(pace, || cpu.read_bandwidth_gbs(1 << 30)));
    Ok(match together {
        Ok((cpu_gbs, dma_gbs)) => {
            eprintln!(
                "bench: host memory reads {alone:.1} GB/s with {} threads alone, {cpu_gbs:.1} GB/s while the link's DMA reads {dma_gbs:.1} GB/s: {:.1} GB/s together (the cooperative term of the limit: the lesser of that and {:.1})",
                cpu.threads(),
                cpu_gbs + dma_gbs,
                alone + link
            );
            (cpu_gbs + dma_gbs).min(alone + link)
        }
        Err(e) => {
            eprintln!(
                "bench: host memory reads {alone:.1} GB/s with {} threads (link not measured beside it: {e})",
                cpu.threads()
            );
            alone + link
        }
    })
}

/// This device's memory (GB/s, a device-to-device copy of 1 GiB, read + write: gpu_matvec's copy
/// figure) and host link (GB/s, page-locked host to device for 0.3 s): the limit's figures where
/// no profile is given.
fn measure_device() -> crate::Result<(f64, f64)> {
    let gpu = crate::backend::cuda::Gpu::open(0)?;
    let mem = gpu.copy_gbs(1 << 30)?;
    let link = gpu.link_gbs(std::time::Duration::from_millis(300))?;
    Ok((mem, link))
}

/// With --platform on CUDA: this device's memory (measured as `measure_device` does, the kind of
/// figure the h100 and h200 profiles hold) and the profile's, where the profile's is slower by
/// `projection::MIN_RATIO`; else None, and why on stderr. Other profiles hold their card's
/// nominal figure, which a copy does not reach, so their projection errs on the fast side.
fn projection_figures(p: &crate::platform::Platform) -> Option<(f64, f64)> {
    let profile = p.memory_bandwidth_gbs;
    let measured = crate::backend::cuda::Gpu::open(0).and_then(|gpu| gpu.copy_gbs(1 << 30));
    match measured {
        Ok(device) if device >= crate::bench::projection::MIN_RATIO * profile => {
            eprintln!(
                "bench: this device's memory copies {device:.0} GB/s, the {} profile's reads {profile} GB/s: each decode row gets a projection onto it (one more run with its kernels timed)",
                p.name
            );
            Some((device, profile))
        }
        Ok(device) => {
            eprintln!(
                "bench: this device's memory copies {device:.0} GB/s, not above the {} profile's {profile} GB/s: no projection",
                p.name
            );
            None
        }
        Err(e) => {
            eprintln!("bench: this device's memory could not be measured ({e}): no projection");
            None
        }
    }
}

/// One run of `test` from an empty context: (tokens, seconds).
fn run_test(
    gen: &mut Generator<'_>,
    test: BenchTest,
    trace: &[u32],
) -> crate::Result<(usize, f64)> {
    let (n, one_pass) = match test {
        BenchTest::Prompt(n) => (n, true),
        BenchTest::Generate(n) => (n, false),
    };
    Ok((n, gen.feed_timed(&trace[..n], one_pass)?))
}

/// Kernels whose time is mostly a wait for the host (gated decode's gate, held while the host
/// places a miss), not memory traffic: a projection keeps it as measured, with the rest.
const WAITS_FOR_HOST: &[&str] = &["moe_gate"];

/// One run of `test` with every kernel timed (not in the table).
struct KernelRun {
    tokens: usize,
    seconds: f64,
    /// GPU time per kernel over the run.
    times: Vec<KernelTime>,
}

/// One more run of `test` with every kernel timed; None where the device has no kernel clock.
fn kernel_run(
    gen: &mut Generator<'_>,
    test: BenchTest,
    trace: &[u32],
) -> crate::Result<Option<KernelRun>> {
    if !gen.session().kernel_clock(true) {
        return Ok(None);
    }
    gen.session().kernel_times()?; // drop anything recorded before
    let run = run_test(gen, test, trace);
    gen.session().kernel_clock(false);
    let (tokens, seconds) = run?;
    let times = gen.session().kernel_times()?;
    Ok(Some(KernelRun {
        tokens,
        seconds,
        times,
    }))
}

/// `--kernel-times`: the GPU time per kernel and token of the timed run, to stderr.
fn print_kernel_times(test: BenchTest, run: Option<&KernelRun>) {
    let Some(KernelRun {
        tokens: n,
        seconds: secs,
        times,
    }) = run
    else {
        eprintln!("bench: --kernel-times: no kernel clock on this device (CUDA only)");
        return;
    };
    let (n, secs) = (*n, *secs);
    let us = |s: f64| s * 1e6 / n as f64;
    let in_kernels: f64 = times.iter().map(|t| t.seconds).sum();
    eprintln!(
        "bench: {test}, kernels timed (one extra run, {:.2} tok/s with the events): per token",
        n as f64 / secs
    );
    eprintln!(
        "  {:<28} {:>9} {:>10} {:>11} {:>7}",
        "kernel", "launches", "us", "us/launch", "share"
    );
    for t in times {
        eprintln!(
            "  {:<28} {:>9.2} {:>10.1} {:>11.2} {:>6.1}%",
            t.name,
            t.launches as f64 / n as f64,
            us(t.seconds),
            t.seconds * 1e6 / t.launches.max(1) as f64,
            100.0 * t.seconds / secs
        );
    }
    eprintln!(
        "  {:<28} {:>9} {:>10.1} {:>11} {:>6.1}%",
        "(outside kernels)",
        "",
        us(secs - in_kernels),
        "",
        100.0 * (secs - in_kernels) / secs
    );
}

/// Tokens one run of `test` processes.
fn args_n(test: BenchTest) -> usize {
    match test {
        BenchTest::Prompt(n) | BenchTest::Generate(n) => n,
    }
}

#[cfg(test)]
mod tests {
    use super::token_trace;

    #[test]
    fn the_token_trace_is_deterministic_and_inside_the_vocabulary() {
        let a = token_trace(1000, 512, 7);
        assert_eq!(a, token_trace(1000, 512, 7));
        assert_ne!(a, token_trace(1000, 512, 8));
        assert!(a.iter().all(|&t| (3..512).contains(&t)));
        // Spread over the vocabulary, not stuck in a corner.
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(distinct.len() > 300, "{} distinct ids", distinct.len());
    }
}
