//! `hob perplexity`: llama.cpp's method. The text is tokenized once (BOS first when the model
//! adds one), cut into chunks of `ctx` tokens whose first token becomes BOS, and each chunk
//! scores only its second half, so every scored token has at least ctx/2 tokens of context.
//!
//! `--kl-baseline` also runs an all-high session (the same high variant, T1 = T2 = 1) over the
//! same chunks and compares the two distributions token by token, like llama.cpp's
//! `--kl-divergence`: mean and 99th percentile of KL(baseline || tested), and how often the two
//! agree on the most likely token. `--kl-divergence-base FILE` does the same across two processes
//! (src/cli/kl_file.rs: one run writes its logits, a later one compares with them), and `-b N`
//! sets the tokens per forward pass (`-b 1`: the decode path).

use super::out::{out, outln};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use super::engine::{tokenizer, ModelArgs};
use crate::experts::{ExpertStats, PrecisionPlan};
use crate::generate::Generator;
use crate::model::Model;
use crate::Error;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score (UTF-8).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Tokens per chunk (default 512, at most the model's context).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx: Option<usize>,
    /// Score at most this many chunks (default: all).
    #[arg(long = "chunks")]
    pub chunks: Option<usize>,
    /// Also run an all-high baseline (the same high variant, T1 = T2 = 1, nothing skipped) and
    /// report the KL divergence of this run from it, top-token agreement and both perplexities.
    #[arg(long = "kl-baseline", conflicts_with = "kl_divergence")]
    pub kl_baseline: bool,
    /// Tokens per forward pass (llama.cpp's -b; default: half a chunk, the scored half in one
    /// pass). `-b 1` sends every token through the decode path (the kernels `hob run` and
    /// `hob bench`'s tg rows use) instead of prefill's.
    #[arg(short = 'b', long = "batch-size", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: Option<u32>,
    /// Logits of another run, to compare with (llama.cpp's flag): without --kl-divergence this
    /// run writes its scored logits to FILE; with it, this run reads them and reports its KL
    /// divergence from them. Compares two processes (another build, variant or kernel switch).
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    pub kl_base: Option<PathBuf>,
    /// With --kl-divergence-base FILE: compare this run with the logits in FILE.
    #[arg(long = "kl-divergence", requires = "kl_base")]
    pub kl_divergence: bool,
}

/// The text of `path` tokenized once, BOS first when the model adds one.
pub fn read_tokens(
    path: &std::path::Path,
    tok: &crate::generate::Tokenizer,
    add_bos: bool,
) -> crate::Result<Vec<u32>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, "read", e))?;
    let mut tokens = tok.encode(&text, false)?;
    if let (true, Some(bos)) = (add_bos, tok.bos_id()) {
        tokens.insert(0, bos);
    }
    Ok(tokens)
}

/// Per-token comparison of a tested distribution with a baseline one (llama.cpp's KL statistics).
#[derive(Default, Debug, Clone)]
pub struct KlStats {
    /// KL(baseline || tested) of every scored token, nats.
    pub kl: Vec<f64>,
    /// Tokens whose most likely next token is the same in both.
    pub same_top: usize,
}

impl KlStats {
    /// Compare one position's logits.
    pub fn add(&mut self, base: &[f32], tested: &[f32]) {
        let (lb, lt) = (log_softmax(base), log_softmax(tested));
        let kl: f64 = lb.iter().zip(&lt).map(|(&b, &t)| b.exp() * (b - t)).sum();
        self.kl.push(kl);
        if argmax(base) == argmax(tested) {
            self.same_top += 1;
        }
    }
    pub fn mean(&self) -> f64 {
        self.kl.iter().sum::<f64>() / self.kl.len().max(1) as f64
    }
    /// Standard error of the mean.
    pub fn mean_error(&self) -> f64 {
        let n = self.kl.len() as f64;
        if n < 2.0 {
            return 0.0;
        }
        let m = self.mean();
        let var = self.kl.iter().map(|k| (k - m) * (k - m)).sum::<f64>() / (n - 1.0);
        (var / n).sqrt()
    }
    /// The `q` quantile (0..=1), nearest rank.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.kl.is_empty() {
            return 0.0;
        }
        let mut v = self.kl.clone();
        v.sort_by(f64::total_cmp);
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1]
    }
    pub fn same_top_share(&self) -> f64 {
        self.same_top as f64 / self.kl.len().max(1) as f64
    }
}

/// Six decimals, or scientific notation below 0.001 so that small values stay visible (an exact
/// 0 prints as "0.000e0").
fn show_kl(x: f64) -> String {
    if x.abs() >= 1e-3 {
        format!("{x:.6}")
    } else {
        format!("{x:.3e}")
    }
}

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln();
    logits.iter().map(|&l| l as f64 - max - lse).collect()
}

/// The index of the largest value (the first of equal ones).
fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv {
                (i, x)
            } else {
                (bi, bv)
            }
        })
        .0
}

/// Shares of the routes a session computed high, low, and skipped, from its expert counters:
/// (high, low, skipped); None when nothing ran. With no separate low variant, low-scored routes
/// ran in the high variant and count as high.
pub fn route_split(stats: &ExpertStats, plan: &PrecisionPlan) -> Option<[f64; 3]> {
    let used = |v: usize| stats.per_variant.get(v).map_or(0, |s| s.hits + s.misses);
    let high = used(plan.high);
    let low = plan.low.map_or(0, used);
    let total = stats.uses() + stats.skipped;
    (total > 0).then(|| {
        let t = total as f64;
        [high as f64 / t, low as f64 / t, stats.skipped as f64 / t]
    })
}

/// Running totals of llama.cpp's estimate.
#[derive(Default, Debug, Clone, Copy)]
pub struct Nll {
    pub sum: f64,
    pub sum_sq: f64,
    pub count: usize,
}

impl Nll {
    pub fn ppl(&self) -> f64 {
        (self.sum / self.count as f64).exp()
    }
    /// llama.cpp's error of the final estimate: ppl * sqrt(var(nll) / (count - 1)).
    pub fn ppl_error(&self) -> f64 {
        let n = self.count as f64;
        let mean = self.sum / n;
        let var = self.sum_sq / n - mean * mean;
        if var > 0.0 && self.count > 1 {
            self.ppl() * (var / (n - 1.0)).sqrt()
        } else {
            0.0
        }
    }
    /// Add -log softmax(logits)[target].
    pub fn add(&mut self, logits: &[f32], target: u32) {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum_exp: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let nll = -((logits[target as usize] - max) as f64 - sum_exp.ln());
        self.sum += nll;
        self.sum_sq += nll * nll;
        self.count += 1;
    }
}

/// The context of a command's chunks: -c as given (at most the model's), or `default`
/// clamped to the model's context (said on stderr).
pub fn chunk_ctx(
    (cmd, model): (&str, &std::path::Path),
    given: Option<usize>,
    default: usize,
    model_ctx: usize,
) -> crate::Result<usize> {
    match given {
        Some(c) if c > model_ctx => Err(Error::Invalid(format!(
            "-c/--ctx-size {c}: the context length of {} is {model_ctx}",
            model.display()
        ))),
        Some(c) => Ok(c),
        None if default > model_ctx => {
            eprintln!(
                "{cmd}: -c/--ctx-size defaults to {default}, beyond the model's context length: {model_ctx}"
            );
            Ok(model_ctx)
        }
        None => Ok(default),
    }
}

/// What a perplexity run compares against, and where it writes its logits.
struct Compare<'a> {
    baseline: Option<Generator<'a>>,
    file: Option<super::kl_file::Reader>,
    out: Option<super::kl_file::Writer>,
}

pub fn run(args: &PerplexityArgs) -> crate::Result<()> {
    let file = args.model.open()?;
    let model = Model::load(&file)?;
    let tok = tokenizer(&file, &model.cfg)?;
    let tokens = read_tokens(&args.file, &tok, model.cfg.add_bos)?;
    let n_ctx = chunk_ctx(
        ("perplexity", &args.model.model),
        args.ctx,
        512,
        model.cfg.context_length,
    )?;
    if n_ctx < 4 {
        return Err(Error::Invalid(format!(
            "--ctx-size {n_ctx}: must be at least 4"
        )));
    }
    if tokens.len() < 2 * n_ctx {
        return Err(Error::Invalid(format!(
            "{}: {} tokens, need at least 2 * ctx-size = {}",
            args.file.display(),
            tokens.len(),
            2 * n_ctx
        )));
    }
    let mut n_chunk = tokens.len() / n_ctx;
    if let Some(c) = args.chunks {
        n_chunk = n_chunk.min(c.max(1));
    }
    let plan = args.model.plan(&file, args.model.platform()?.as_ref())?;
    let mut gen = args.model.generator(&file, &model, n_ctx)?;
    let first = n_ctx / 2;
    let shape = super::kl_file::Shape {
        vocab: model.cfg.vocab,
        ctx: n_ctx,
        chunks: n_chunk,
        scored: n_ctx - 1 - first,
    };
    let mut cmp = Compare {
        baseline: match args.kl_baseline {
            true => {
                // The same high variant, nothing low or skipped.
                let mut a = args.model.clone();
                a.expert_variant = Some(file.variants()[plan.high].name());
                a.low = Some("none".into());
                (a.t1, a.t2, a.renorm_skips) = (None, None, false);
                Some(a.generator(&file, &model, n_ctx)?)
            }
            false => None,
        },
        file: match &args.kl_base {
            Some(p) if args.kl_divergence => Some(super::kl_file::Reader::open(p, shape)?),
            _ => None,
        },
        out: match &args.kl_base {
            Some(p) if !args.kl_divergence => Some(super::kl_file::Writer::create(p, shape)?),
            _ => None,
        },
    };
    eprintln!(
        "perplexity: {} tokens, {n_chunk} chunks of {n_ctx}; {}",
        tokens.len(),
        gen.describe()
    );
    if let Some(b) = &cmp.baseline {
        eprintln!("perplexity: KL baseline: {}", b.describe());
    }
    let started = Instant::now();
    let (nll, base_nll, kl) = score_chunks(args, (&mut gen, &mut cmp), &tokens, shape, &tok)?;
    outln!();
    outln!(
        "Final estimate: PPL = {:.4} +/- {:.5}",
        nll.ppl(),
        nll.ppl_error()
    );
    if let Some(w) = cmp.out.take() {
        w.finish()?;
        if let Some(p) = &args.kl_base {
            eprintln!(
                "perplexity: logits of {n_chunk} chunks written to {}",
                p.display()
            );
        }
    }
    let compared = cmp.baseline.is_some() || cmp.file.is_some();
    if compared {
        let what = match &args.kl_base {
            Some(p) if cmp.file.is_some() => format!("{}", p.display()),
            _ => format!("all high, {}", file.variants()[plan.high]),
        };
        print_comparison(&what, &base_nll, &kl);
    }
    let stats = gen.session().expert_stats();
    if compared || !plan.is_exact() {
        print_routes(&file, &plan, &stats);
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!("perplexity: {} tokens scored in {secs:.1} s", nll.count);
    if args.model.stats {
        let n = (stats.uses() + stats.skipped) as usize
            / (model.cfg.moe_layers() * model.cfg.top_k).max(1);
        eprint!("{}", stats.report(n, secs));
    }
    Ok(())
}

/// Score every chunk: this run's NLL, the baseline's, and the KL between them where one is
/// compared.
fn score_chunks(
    args: &PerplexityArgs,
    (gen, cmp): (&mut Generator<'_>, &mut Compare<'_>),
    tokens: &[u32],
    shape: super::kl_file::Shape,
    tok: &crate::generate::Tokenizer,
) -> crate::Result<(Nll, Nll, KlStats)> {
    let (n_ctx, vocab, first) = (shape.ctx, shape.vocab, shape.ctx / 2);
    let compare = cmp.baseline.is_some() || cmp.file.is_some();
    let batch = args.batch.map(|b| b as usize);
    let started = Instant::now();
    let (mut nll, mut base_nll, mut kl) = (Nll::default(), Nll::default(), KlStats::default());
    let (mut base_logits, mut logits) = (Vec::new(), Vec::new());
    for i in 0..shape.chunks {
        let start = i * n_ctx;
        let mut chunk = tokens[start..start + n_ctx].to_vec();
        if let (true, Some(bos)) = (tok.add_bos(), tok.bos_id()) {
            chunk[0] = bos;
        }
        if let Some(b) = cmp.baseline.as_mut() {
            b.score(&chunk, first, batch, &mut base_logits)?;
        }
        if let Some(r) = cmp.file.as_mut() {
            r.chunk(&chunk, &mut base_logits)?;
        }
        gen.score(&chunk, first, batch, &mut logits)?;
        if let Some(w) = cmp.out.as_mut() {
            w.chunk(&chunk, &logits[..shape.scored * vocab])?;
        }
        for j in 0..shape.scored {
            let target = tokens[start + first + j + 1];
            let row = j * vocab..(j + 1) * vocab;
            nll.add(&logits[row.clone()], target);
            if compare {
                base_nll.add(&base_logits[row.clone()], target);
                kl.add(&base_logits[row.clone()], &logits[row]);
            }
        }
        out!("[{}]{:.4},", i + 1, nll.ppl());
        std::io::stdout().flush().ok();
        if i == 0 {
            let pass = started.elapsed().as_secs_f64();
            eprintln!(
                "perplexity: {pass:.2} s per chunk, ETA {:.1} min",
                pass * shape.chunks as f64 / 60.0
            );
        }
    }
    Ok((nll, base_nll, kl))
}

fn print_comparison(what: &str, base_nll: &Nll, kl: &KlStats) {
    outln!(
        "Baseline ({what}): PPL = {:.4} +/- {:.5}",
        base_nll.ppl(),
        base_nll.ppl_error()
    );
    outln!(
        "Mean KL(baseline || tested): {} +/- {} nats",
        show_kl(kl.mean()),
        show_kl(kl.mean_error())
    );
    outln!("99th percentile KL: {} nats", show_kl(kl.quantile(0.99)));
    outln!(
        "Maximum KL: {} nats",
        show_kl(kl.kl.iter().copied().fold(0.0, f64::max))
    );
    outln!("Same top token: {:.3} %", 100.0 * kl.same_top_share());
}

fn print_routes(file: &crate::format::HobFile, plan: &PrecisionPlan, stats: &ExpertStats) {
    let Some([h, l, s]) = route_split(stats, plan) else {
        return;
    };
    let v = file.variants();
    let low = match plan.low {
        Some(i) => format!("{}", v[i]),
        None => "none: low-scored routes ran high".into(),
    };
    outln!(
        "Routes: high {:.2} % ({}), low {:.2} % ({low}), skipped {:.2} % (T1 {}, T2 {}{})",
        100.0 * h,
        v[plan.high],
        100.0 * l,
        100.0 * s,
        plan.thresholds.t1,
        plan.thresholds.t2,
        if plan.renormalize_skips {
            ", skips renormalized"
        } else {
            ""
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_of_hand_computed_distributions() {
        let mut k = KlStats::default();
        // Identical logits: exactly 0, same top token.
        k.add(&[1.0, 2.0, 3.0], &[1.0, 2.0, 3.0]);
        assert_eq!(k.kl[0], 0.0);
        // Shifted logits are the same distribution.
        k.add(&[0.0, 0.0], &[5.0, 5.0]);
        assert!(k.kl[1].abs() < 1e-12);
        // P = (1/2, 1/2), Q = (e/(1+e), 1/(1+e)): KL = ln(1/2) - (ln Q0 + ln Q1) / 2.
        k.add(&[0.0, 0.0], &[1.0, 0.0]);
        let e = std::f64::consts::E;
        let q0 = e / (1.0 + e);
        let want = 0.5f64.ln() - 0.5 * (q0.ln() + (1.0 - q0).ln());
        assert!((k.kl[2] - want).abs() < 1e-12, "{} vs {want}", k.kl[2]);
        // Top tokens: 2 = 2, 0 = 0 (ties take the first), 0 = 0.
        assert_eq!(k.same_top, 3);
        k.add(&[0.0, 1.0], &[1.0, 0.0]);
        assert_eq!((k.same_top, k.kl.len()), (3, 4));
        assert_eq!(k.quantile(0.99), k.kl[3]);
        assert_eq!(k.quantile(0.25), 0.0);
    }
}
