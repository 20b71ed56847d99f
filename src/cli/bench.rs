//! `hob bench`: llama-bench's table (prefill pp and decode tg tokens/s, mean ± sd over -r runs)
//! plus the MoE columns (hit rate per variant, experts and bytes loaded per token, link GB/s) and
//! the physical limit of the same bytes (shared/REFERENCE.md) beside each decode figure.
//!
//! Tokens come from a fixed pseudo-random trace (--seed), not from sampling, so two runs (A/B)
//! route identically. Each repetition starts from an empty context, as llama-bench does.

use std::time::Instant;

use clap::Args;

use super::engine::ModelArgs;
use crate::bench::{
    achieved_gbs, physical_limit, render_json, render_markdown, BenchRow, BenchTest, HitRate,
    MoeStats,
};
use crate::format::keys;
use crate::model::{ExpertStats, Logits, Model, Session};
use crate::Error;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens of the prefill test (0: skip it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Tokens of the decode test (0: skip it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
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

pub fn run(args: &BenchArgs) -> crate::Result<()> {
    if args.reps == 0 {
        return Err(Error::Invalid("-r/--repetitions: at least 1".into()));
    }
    if args.n_prompt == 0 && args.n_gen == 0 {
        return Err(Error::Invalid(
            "nothing to measure: -p and -n are both 0".into(),
        ));
    }
    let file = args.model.open()?;
    let model = Model::load(&file)?;
    let cfg = &model.cfg;
    let ctx = (args.n_prompt.max(args.n_gen) + 1).min(cfg.context_length);
    if args.n_prompt.max(args.n_gen) >= cfg.context_length {
        return Err(Error::Invalid(format!(
            "-p/-n: at most {} tokens (the model's context)",
            cfg.context_length - 1
        )));
    }
    let platform = args.model.platform()?;
    // Without --platform, this device's own figures for the limit, measured before the session
    // takes device memory for its expert cache (the copy needs 2 GiB).
    let measured = (platform.is_none()
        && args.n_gen > 0
        && !matches!(args.model.device, super::engine::Device::Cpu)
        && crate::backend::cuda::probe().is_ok())
    .then(measure_device);
    let mut session = args.model.session(&file, &model, ctx)?;
    eprintln!("bench: {}", session.describe());
    let plan = args.model.plan(&file, platform.as_ref())?;
    let variant = plan.high;
    let trace = token_trace(ctx, cfg.vocab, args.seed);

    // Warm-up (not measured), as llama-bench does: one prefill of the test's size (buffers grow
    // and cuBLAS picks its kernels for that shape once) and a few decode steps.
    let warm = args.n_prompt.max(1);
    session.truncate(0);
    session.forward(&trace[..warm], Logits::Last)?;
    session.truncate(0);
    for &t in &trace[..4.min(ctx - 1)] {
        session.forward(&[t], Logits::Last)?;
    }

    let backend = if session.describe().starts_with("cuda") {
        "CUDA"
    } else {
        "CPU"
    };
    let name = file
        .metadata()
        .get_str(keys::NAME)
        .map(str::to_string)
        .unwrap_or_else(|_| {
            file.path()
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        });
    let size_bytes = file.bytes().len() as u64;
    let model_label = match plan.low {
        Some(l) => format!(
            "{name} {}+{} T1 {} T2 {}",
            file.variants()[variant],
            file.variants()[l],
            plan.thresholds.t1,
            plan.thresholds.t2
        ),
        None => format!("{name} {}", file.variants()[variant]),
    };
    let model_label = if args.model.replay_trace.is_some() {
        format!("{model_label}, replayed routing")
    } else {
        model_label
    };

    // Bytes one decode token reads on the device: every dense matrix except the embedding table
    // (one row), plus each expert it computes.
    let dense: u64 = file
        .tensors()
        .iter()
        .filter(|t| t.name != keys::TOKEN_EMBD || cfg.tie_embeddings)
        .map(|t| t.size)
        .sum();
    // Bytes of one expert in each variant (what a use reads from device memory).
    let variant_bytes: Vec<f64> = (0..file.variants().len())
        .map(|v| file.expert_layout(v).size as f64)
        .collect();

    // The limit's figures: the profile's, or without --platform this device's own (measured
    // above: a device-to-device copy and the link from page-locked memory), so that every CUDA
    // decode row has its limit beside it.
    let figures = match (&platform, measured) {
        (Some(p), _) => Some((p.memory_bandwidth_gbs, p.load_gbs())),
        (None, Some(m)) if backend == "CUDA" => match m {
            Ok((mem, link)) => {
                eprintln!(
                    "bench: no --platform: the limit takes this device's measured figures, memory {mem:.0} GB/s (device copy, read + write) and host link {link:.1} GB/s"
                );
                Some((mem, link))
            }
            Err(e) => {
                eprintln!("bench: no --platform, and this device's figures could not be measured ({e}): no limit column");
                None
            }
        },
        _ => None,
    };

    // Cooperative mode: missed experts also stream from host memory into the CPU helpers, so the
    // bound spreads the missed bytes over the link and the host's memory together. The link's
    // DMA reads host memory too: the two are measured together, and the bound takes the lesser
    // of their sum alone and what they reach at once.
    let host_gbs = if args.model.cpu_experts && backend == "CUDA" {
        let cpu = crate::backend::cpu::CpuBackend::new(args.model.threads)?;
        let alone = cpu.read_bandwidth_gbs(1 << 30);
        let link = figures.map_or(f64::INFINITY, |f| f.1);
        let pace = platform
            .as_ref()
            .and_then(|p| p.pacing())
            .map(|p| p.gbs * 1e9);
        let together = crate::backend::cuda::Gpu::open(0)
            .and_then(|gpu| gpu.dma_during(pace, || cpu.read_bandwidth_gbs(1 << 30)));
        let gbs = match together {
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
        };
        Some(gbs)
    } else {
        None
    };

    let mut rows = Vec::new();
    let tests = [
        (args.n_prompt > 0).then_some(BenchTest::Prompt(args.n_prompt)),
        (args.n_gen > 0).then_some(BenchTest::Generate(args.n_gen)),
    ];
    for test in tests.into_iter().flatten() {
        let mut samples = Vec::new();
        let mut total = ExpertStats::default();
        let mut tokens = 0usize;
        let replays = session.decode_replays();
        for rep in 0..args.reps {
            session.reset_stats();
            let (n, secs) = run_test(&mut *session, test, &trace)?;
            samples.push(n as f64 / secs);
            tokens += n;
            total.accumulate(&session.expert_stats());
            eprintln!(
                "bench: {test} run {}/{}: {:.2} tok/s",
                rep + 1,
                args.reps,
                n as f64 / secs
            );
        }
        if let (BenchTest::Generate(_), n) = (test, session.decode_replays() - replays) {
            if n > 0 {
                eprintln!("bench: {test}: {n} of {tokens} decode steps replayed from a CUDA graph");
            }
        }
        if args.kernel_times {
            print_kernel_times(&mut *session, test, &trace)?;
        }
        let tok = tokens as f64;
        let expert_read_per_token: f64 = total
            .per_variant
            .iter()
            .zip(&variant_bytes)
            .map(|(v, b)| (v.hits + v.misses) as f64 * b)
            .sum::<f64>()
            / tok;
        if args.model.stats {
            eprintln!("bench: {test}:");
            super::engine::print_expert_stats(
                &total,
                tokens,
                samples.iter().map(|r| args_n(test) as f64 / r).sum(),
            );
        }
        let moe = MoeStats {
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
            // The loader's rate while busy (not bytes over the compute thread's waits, which
            // prefetches and CPU experts hide).
            link_gbs: if total.link_seconds > 0.0 {
                total.bytes_loaded as f64 / total.link_seconds / 1e9
            } else {
                0.0
            },
        };
        let limit = match (test, figures, host_gbs) {
            (BenchTest::Generate(_), Some((mem, link)), None) if backend == "CUDA" => {
                Some(physical_limit(
                    dense as f64 + expert_read_per_token,
                    moe.bytes_moved_per_token,
                    mem,
                    link,
                ))
            }
            // Cooperative: every missed expert crosses the link or is streamed by the CPU, the
            // two in parallel; the best split of the missed bytes between them bounds the time.
            (BenchTest::Generate(_), Some((mem, _)), Some(host)) if backend == "CUDA" => {
                let streamed = total.cpu_bytes as f64 / tok;
                Some(physical_limit(
                    dense as f64 + expert_read_per_token,
                    moe.bytes_moved_per_token + streamed,
                    mem,
                    host,
                ))
            }
            _ => None,
        };
        if let (BenchTest::Generate(_), Some(l)) = (test, &limit) {
            let mean = crate::bench::mean_sd(&samples).0;
            eprintln!(
                "bench: {test}: {:.2} tok/s; limit {:.2} tok/s (overlap) / {:.2} (no overlap); reads {:.2} GB/s of device memory",
                mean,
                l.overlap_tok_s,
                l.no_overlap_tok_s,
                achieved_gbs(dense as f64 + expert_read_per_token, mean)
            );
            if mean > l.overlap_tok_s {
                // A profile emulated on a faster device paces only its link: what stays resident
                // is read at this device's speed, not the profile's.
                if let Some(p) = &platform {
                    log::warn!(
                        "bench: {test} ran above the {} profile's limit: this device's memory is faster than the profile's {} GB/s, and an emulated profile paces only the loads; the row does not measure that platform",
                        p.name,
                        p.memory_bandwidth_gbs
                    );
                }
            }
        }
        rows.push(BenchRow {
            model: model_label.clone(),
            size_bytes,
            params: None,
            backend: backend.to_string(),
            profile: platform
                .as_ref()
                .map_or_else(|| "native".to_string(), |p| p.name.clone()),
            test,
            samples_tok_s: samples,
            moe: (backend == "CUDA").then_some(moe),
            limit,
        });
    }
    match args.output.as_str() {
        "json" => println!("{}", render_json(&rows)),
        _ => print!("{}", render_markdown(&rows)),
    }
    Ok(())
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

/// One run of `test` from an empty context: (tokens, seconds).
fn run_test(
    session: &mut dyn Session,
    test: BenchTest,
    trace: &[u32],
) -> crate::Result<(usize, f64)> {
    session.truncate(0);
    let started = Instant::now();
    let n = match test {
        BenchTest::Prompt(n) => {
            session.forward(&trace[..n], Logits::Last)?;
            n
        }
        BenchTest::Generate(n) => {
            for &t in &trace[..n] {
                session.forward(&[t], Logits::Last)?;
            }
            n
        }
    };
    Ok((n, started.elapsed().as_secs_f64()))
}

/// One more run of `test` with every kernel timed; the GPU time per kernel and token to stderr.
fn print_kernel_times(
    session: &mut dyn Session,
    test: BenchTest,
    trace: &[u32],
) -> crate::Result<()> {
    if !session.kernel_clock(true) {
        eprintln!("bench: --kernel-times: no kernel clock on this device (CUDA only)");
        return Ok(());
    }
    session.kernel_times()?; // drop anything recorded before
    let run = run_test(session, test, trace);
    session.kernel_clock(false);
    let (n, secs) = run?;
    let times = session.kernel_times()?;
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
    for t in &times {
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
    Ok(())
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
