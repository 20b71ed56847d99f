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

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use super::engine::{tokenizer, ModelArgs};
use crate::experts::PrecisionPlan;
use crate::model::{Logits, Model};
use crate::Error;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score (UTF-8).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Tokens per chunk.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx: usize,
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

/// A chunk's logits, llama.cpp's way: from an empty context, the first `first` tokens
/// unscored, then the logits of every later position, `batch` tokens per forward pass.
fn chunk_logits(
    session: &mut (dyn crate::model::Session + '_),
    chunk: &[u32],
    first: usize,
    batch: Option<u32>,
    out: &mut Vec<f32>,
) -> crate::Result<()> {
    session.truncate(0);
    out.clear();
    let b = batch.map_or(first.max(chunk.len() - first), |b| b as usize);
    for part in chunk[..first].chunks(b) {
        session.forward(part, Logits::None)?;
    }
    for part in chunk[first..].chunks(b) {
        out.extend_from_slice(session.forward(part, Logits::All)?);
    }
    Ok(())
}

/// The text of `path` tokenized once, BOS first when the model adds one.
pub fn read_tokens(
    path: &std::path::Path,
    tok: &crate::generate::Tokenizer,
    add_bos: bool,
) -> crate::Result<Vec<u32>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, "read", e))?;
    let mut tokens = tok.encode(&text, false)?;
    if add_bos {
        tokens.insert(0, tok.bos_id());
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
pub fn route_split(stats: &crate::model::ExpertStats, plan: &PrecisionPlan) -> Option<[f64; 3]> {
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

pub fn run(args: &PerplexityArgs) -> crate::Result<()> {
    let file = args.model.open()?;
    let model = Model::load(&file)?;
    let tok = tokenizer(&file, &model.cfg)?;
    let tokens = read_tokens(&args.file, &tok, model.cfg.add_bos)?;
    let n_ctx = args.ctx;
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
    let mut session = args.model.session(&file, &model, n_ctx)?;
    let base_args = args.kl_baseline.then(|| {
        let mut a = args.model.clone();
        a.expert_variant = Some(file.variants()[plan.high].name());
        a.low = None;
        a.t1 = Some(1.0);
        a.t2 = Some(1.0);
        a.renorm_skips = false;
        a
    });
    let mut baseline = match &base_args {
        Some(a) => Some(a.session(&file, &model, n_ctx)?),
        None => None,
    };
    let first = n_ctx / 2;
    let shape = super::kl_file::Shape {
        vocab: model.cfg.vocab,
        ctx: n_ctx,
        chunks: n_chunk,
        scored: n_ctx - 1 - first,
    };
    let (mut base_file, mut base_out) = match &args.kl_base {
        Some(p) if args.kl_divergence => (Some(super::kl_file::Reader::open(p, shape)?), None),
        Some(p) => (None, Some(super::kl_file::Writer::create(p, shape)?)),
        None => (None, None),
    };
    let compare = baseline.is_some() || base_file.is_some();
    eprintln!(
        "perplexity: {} tokens, {n_chunk} chunks of {n_ctx}; {}",
        tokens.len(),
        session.describe()
    );
    if let Some(b) = &baseline {
        eprintln!("perplexity: KL baseline: {}", b.describe());
    }
    let started = Instant::now();
    let mut nll = Nll::default();
    let mut base_nll = Nll::default();
    let mut kl = KlStats::default();
    let (mut base_logits, mut logits) = (Vec::new(), Vec::new());
    let vocab = model.cfg.vocab;
    for i in 0..n_chunk {
        let start = i * n_ctx;
        let mut chunk = tokens[start..start + n_ctx].to_vec();
        if model.cfg.add_bos {
            chunk[0] = tok.bos_id();
        }
        if let Some(b) = baseline.as_mut() {
            chunk_logits(b.as_mut(), &chunk, first, args.batch, &mut base_logits)?;
        }
        if let Some(r) = base_file.as_mut() {
            r.chunk(&chunk, &mut base_logits)?;
        }
        chunk_logits(session.as_mut(), &chunk, first, args.batch, &mut logits)?;
        if let Some(w) = base_out.as_mut() {
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
        print!("[{}]{:.4},", i + 1, nll.ppl());
        std::io::stdout().flush().ok();
        if i == 0 {
            let pass = started.elapsed().as_secs_f64();
            eprintln!(
                "perplexity: {pass:.2} s per chunk, ETA {:.1} min",
                pass * n_chunk as f64 / 60.0
            );
        }
    }
    println!();
    println!(
        "Final estimate: PPL = {:.4} +/- {:.5}",
        nll.ppl(),
        nll.ppl_error()
    );
    if let Some(w) = base_out {
        w.finish()?;
        if let Some(p) = &args.kl_base {
            eprintln!(
                "perplexity: logits of {n_chunk} chunks written to {}",
                p.display()
            );
        }
    }
    if compare {
        let what = match &args.kl_base {
            Some(p) if base_file.is_some() => format!("{}", p.display()),
            _ => format!("all high, {}", file.variants()[plan.high]),
        };
        println!(
            "Baseline ({what}): PPL = {:.4} +/- {:.5}",
            base_nll.ppl(),
            base_nll.ppl_error()
        );
        println!(
            "Mean KL(baseline || tested): {} +/- {} nats",
            show_kl(kl.mean()),
            show_kl(kl.mean_error())
        );
        println!("99th percentile KL: {} nats", show_kl(kl.quantile(0.99)));
        println!(
            "Maximum KL: {} nats",
            show_kl(kl.kl.iter().copied().fold(0.0, f64::max))
        );
        println!("Same top token: {:.3} %", 100.0 * kl.same_top_share());
    }
    if compare || !plan.is_exact() {
        if let Some([h, l, s]) = route_split(&session.expert_stats(), &plan) {
            let v = file.variants();
            let low = match plan.low {
                Some(i) => format!("{}", v[i]),
                None => "none: low-scored routes ran high".into(),
            };
            println!(
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
    }
    eprintln!(
        "perplexity: {} tokens scored in {:.1} s",
        nll.count,
        started.elapsed().as_secs_f64()
    );
    if args.model.stats {
        let st = session.expert_stats();
        let tokens =
            (st.uses() + st.skipped) as usize / (model.cfg.n_layers * model.cfg.top_k).max(1);
        super::engine::print_expert_stats(
            &session.expert_stats(),
            tokens,
            started.elapsed().as_secs_f64(),
        );
    }
    Ok(())
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
