//! `hob calibrate`: fit HOBBIT's scorer thresholds (T1, T2) to a model.
//!
//! The model runs over a text in llama.cpp-perplexity-style chunks (every chunk starts with BOS),
//! all experts in the high variant, and an expert-executor wrapper records the score of every
//! route of every layer (HOBBIT Eq. 2: the gate weights ranked above it as a share of the selected
//! ones, src/experts/scorer.rs; the top-1 route scores 0 and is always high). T1 and T2 are then
//! the score quantiles that make the share of all selected routes (top-1 included) computed
//! high / low / skipped match `--split`: T1 gives the high share, T2 the high + low share.
//!
//! The shares are those of an all-high run; a dynamic run routes slightly differently downstream
//! of low or skipped experts, so `hob perplexity` reports the split a dynamic run actually used.

use super::out::outln;
use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

use clap::Args;

use super::engine::{tokenizer, Device, ModelArgs};
use super::perplexity::{chunk_ctx, read_tokens};
use crate::backend::cpu::CpuBackend;
use crate::experts::{DirectExperts, ExpertReport, ExpertStats, Precision, Thresholds};
use crate::generate::{Bound, Generator};
use crate::model::{Batch, ExpertExecutor, Model, Route};
use crate::Error;

#[derive(Args, Debug)]
pub struct CalibrateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Calibration text (UTF-8). Evaluate the thresholds on a different text.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Target shares of all selected routes, percent: high/low/skipped (sum 100). The top-1
    /// route of every token is always high, so high cannot be below 100/top_k.
    #[arg(long, default_value = "67/30/3")]
    pub split: String,
    /// Tokens per chunk (default 512, at most the model's context).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx: Option<usize>,
    /// Use at most this many chunks (default: all).
    #[arg(long = "chunks")]
    pub chunks: Option<usize>,
    /// Write the --platform profile with the fitted t1/t2 (and the --high/--low flags, or the
    /// fitted --widths, if given) to this .toml file, named "<profile>-calibrated"; load it with
    /// --platform FILE.
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// ap8 files: also fit the widths of the high and low tiers. Each pair HIGH:LOW runs over
    /// the text with the fitted T1/T2; its KL against the stored width (all high) and the bits
    /// a routed weight reads are printed, and the least KL within --bits wins (default pairs:
    /// high 8, 6, 5, 4 with low 4, 3, 2 below it). Costs a pass over the text per pair, on the
    /// GPU where one is usable (--device).
    #[arg(long, value_name = "H:L,...", num_args = 0..=1, default_missing_value = "")]
    pub widths: Option<String>,
    /// With --widths: the most bits a routed weight may read on average (default: what ap8@5 +
    /// ap8@3, the engine's pair for ap8 files, reads on the text).
    #[arg(long, value_name = "B", requires = "widths")]
    pub bits: Option<f64>,
}

/// Target shares of all selected routes, as fractions summing to 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Split {
    pub high: f64,
    pub low: f64,
    pub skip: f64,
}

impl Split {
    /// "67/30/3": three non-negative percentages summing to 100.
    pub fn parse(s: &str) -> crate::Result<Split> {
        let bad = |why: &str| Error::Invalid(format!("--split {s}: {why}"));
        let parts: Vec<&str> = s.split('/').collect();
        if parts.len() != 3 {
            return Err(bad(
                "expected three percentages HIGH/LOW/SKIP such as 67/30/3",
            ));
        }
        let mut v = [0.0f64; 3];
        for (x, p) in v.iter_mut().zip(&parts) {
            *x = p
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| bad(&format!("'{p}' is not a non-negative number")))?;
        }
        let sum: f64 = v.iter().sum();
        if (sum - 100.0).abs() > 1e-6 {
            return Err(bad(&format!("the shares sum to {sum}, not 100")));
        }
        Ok(Split {
            high: v[0] / 100.0,
            low: v[1] / 100.0,
            skip: v[2] / 100.0,
        })
    }

    /// The split as "67.0 / 30.0 / 3.0 %".
    pub fn show(&self) -> String {
        format!(
            "{:.1} / {:.1} / {:.1} %",
            100.0 * self.high,
            100.0 * self.low,
            100.0 * self.skip
        )
    }
}

/// The scores of one layer's routes.
#[derive(Clone, Debug, Default)]
pub struct LayerScores {
    /// Top-1 routes (score 0, always high).
    pub top1: u64,
    /// Scores of the other routes.
    pub scores: Vec<f32>,
}

impl LayerScores {
    /// Record one token's routes.
    pub fn add(&mut self, routes: &[Route], buf: &mut Vec<f32>) {
        Thresholds::scores(routes, buf);
        // The top-ranked route: the highest weight, the lower expert index among equal ones (the
        // scorer's order).
        let first = (0..routes.len()).min_by(|&a, &b| {
            let (ra, rb) = (routes[a], routes[b]);
            rb.weight
                .total_cmp(&ra.weight)
                .then(ra.expert.cmp(&rb.expert))
        });
        for (i, &s) in buf.iter().enumerate() {
            if Some(i) == first {
                self.top1 += 1;
            } else {
                self.scores.push(s);
            }
        }
    }

    /// Shares of all routes (top-1 included) high / low / skipped under `th`.
    pub fn split(&self, th: Thresholds) -> Split {
        let mut n = [self.top1, 0, 0];
        for &s in &self.scores {
            n[match th.classify(s) {
                Precision::High => 0,
                Precision::Low => 1,
                Precision::Skip => 2,
            }] += 1;
        }
        let total = (self.top1 as usize + self.scores.len()).max(1) as f64;
        Split {
            high: n[0] as f64 / total,
            low: n[1] as f64 / total,
            skip: n[2] as f64 / total,
        }
    }

    pub fn merge(&mut self, other: &LayerScores) {
        self.top1 += other.top1;
        self.scores.extend_from_slice(&other.scores);
    }
}

/// The threshold T (in [0, 1]) whose count #{s <= T} of the ascending `sorted` scores is the
/// achievable count nearest `want` (ties among equal scores make some counts unreachable).
/// T = 1 counts everything (the scorer treats T >= 1 as "none above").
fn threshold_for_count(sorted: &[f32], want: usize) -> f32 {
    let m = sorted.len();
    let want = want.min(m);
    if want == m {
        return 1.0;
    }
    let count = |t: f32| sorted.partition_point(|&x| x <= t);
    // Achievable counts around `want`: all scores below the value at `want`, or up to and
    // including the value just below it.
    let at = sorted[want];
    let below = sorted.partition_point(|&x| x < at);
    let hi = if want > 0 {
        count(sorted[want - 1])
    } else {
        below
    };
    let c = if want.abs_diff(below) <= hi.abs_diff(want) {
        below
    } else {
        hi
    };
    if c == 0 {
        return 0.0;
    }
    if c >= m {
        return 1.0;
    }
    // Halfway between the last score counted and the first one not: robust to a text that
    // differs a little from the calibration text.
    let (a, b) = (sorted[c - 1], sorted[c]);
    let mid = a + (b - a) / 2.0;
    if mid >= a && mid < b && mid <= 1.0 {
        mid
    } else {
        a
    }
}

/// The most repeated score of `sorted` and its count, where one score holds a tenth or more.
fn largest_tie(sorted: &[f32]) -> Option<(f32, usize)> {
    sorted
        .chunk_by(|a, b| a == b)
        .map(|run| (run[0], run.len()))
        .max_by_key(|&(_, n)| n)
        .filter(|&(_, n)| n * 10 >= sorted.len())
}

/// T1 and T2 making the shares of all routes (the `top1` routes plus the `sorted` other scores)
/// high / low / skipped as close to `split` as the scores allow.
pub fn fit(sorted: &[f32], top1: u64, split: Split, top_k: usize) -> crate::Result<Thresholds> {
    let n = (top1 as usize + sorted.len()) as f64;
    let floor = top1 as f64 / n.max(1.0);
    if split.high + 1e-9 < floor {
        return Err(Error::Invalid(format!(
            "--split: the high share {:.1} % is below the top-1 share {:.1} % (1/top_k, top_k = \
             {top_k}): the top-ranked expert of every token always runs in high precision, so at \
             least that share of routes is high",
            100.0 * split.high,
            100.0 * floor
        )));
    }
    let want = |share: f64| ((share * n - top1 as f64).round().max(0.0)) as usize;
    let t1 = threshold_for_count(sorted, want(split.high));
    let t2 = threshold_for_count(sorted, want(split.high + split.low)).max(t1);
    Thresholds::new(t1, t2)
}

/// Wraps the CPU experts and records every route's score per layer.
struct Recorder<'a> {
    inner: DirectExperts<'a>,
    layers: Rc<RefCell<Vec<LayerScores>>>,
    buf: Vec<f32>,
}

impl ExpertExecutor<CpuBackend> for Recorder<'_> {
    fn forward(
        &mut self,
        backend: &CpuBackend,
        layer: usize,
        batch: &Batch<'_, Vec<f32>>,
        out: &mut Vec<f32>,
    ) -> crate::Result<()> {
        {
            let mut layers = self.layers.borrow_mut();
            if layers.len() <= layer {
                layers.resize(layer + 1, LayerScores::default());
            }
            let k = batch.routes.len() / batch.t.max(1);
            for token in batch.routes.chunks_exact(k.max(1)) {
                layers[layer].add(token, &mut self.buf);
            }
        }
        self.inner.forward(backend, layer, batch, out)
    }
}

impl ExpertReport for Recorder<'_> {
    fn describe(&self) -> String {
        self.inner.describe() + ", recording route scores"
    }
    fn stats(&self) -> ExpertStats {
        self.inner.stats()
    }
    fn reset_stats(&mut self) {
        self.inner.reset_stats()
    }
}

/// What a calibration run recorded: every layer's route scores, over `tokens` tokens.
struct Recorded {
    layers: Vec<LayerScores>,
    tokens: usize,
    chunks: usize,
    ctx: usize,
    high: String,
    seconds: f64,
}

pub fn run(args: &CalibrateArgs) -> crate::Result<()> {
    let split = Split::parse(&args.split)?;
    if args.model.device == Device::Cuda && args.widths.is_none() {
        return Err(Error::Invalid(
            "hob calibrate records route scores on the CPU: drop --device cuda (it applies to \
             the passes of --widths)"
                .into(),
        ));
    }
    let platform = args.model.platform()?;
    if args.output.is_some() && platform.is_none() {
        return Err(Error::Invalid(
            "-o/--output writes a platform profile with the fitted thresholds: name the profile \
             to start from with --platform (e.g. --platform rtx4090-24g)"
                .into(),
        ));
    }
    let file = args.model.open()?;
    let model = Model::load(&file)?;
    let cfg = &model.cfg;
    // Fail before the long run when the split cannot be met.
    let floor = 1.0 / cfg.top_k.max(1) as f64;
    if split.high + 1e-9 < floor {
        return Err(Error::Invalid(format!(
            "--split {}: the high share {:.1} % is below the top-1 share {:.1} % (1/top_k, \
             top_k = {}): the top-ranked expert of every token always runs in high precision",
            args.split,
            100.0 * split.high,
            100.0 * floor,
            cfg.top_k
        )));
    }
    let widths = match &args.widths {
        Some(list) => Some(super::calibrate_widths::plan(&file, list, args.bits)?),
        None => None,
    };
    let text = chunks(args, (&file, &model), widths.is_some())?;
    let rec = record(args, (&file, &model), platform.as_ref(), &text)?;
    let mut all = LayerScores::default();
    for l in &rec.layers {
        all.merge(l);
    }
    all.scores.sort_by(f32::total_cmp);
    let routes = all.top1 as usize + all.scores.len();
    outln!(
        "calibrate: {} tokens in {} chunks of {} ({:.1} s), {} layers, top-{} of {} experts, {} \
         experts: {routes} routes, {} top-1 (always high)",
        rec.tokens,
        rec.chunks,
        rec.ctx,
        rec.seconds,
        cfg.moe_layers(),
        cfg.top_k,
        cfg.n_experts,
        rec.high,
        all.top1
    );
    print_histogram(&all.scores);
    let th = fit(&all.scores, all.top1, split, cfg.top_k)?;
    let got = all.split(th);
    let hobbit = all.split(Thresholds::HOBBIT_MIXTRAL);
    outln!("target split high/low/skip: {}", split.show());
    outln!(
        "fitted: T1 = {}, T2 = {} -> {} on this text",
        th.t1,
        th.t2,
        got.show()
    );
    if (got.high - split.high).abs() > 0.02 || (got.low - split.low).abs() > 0.02 {
        if let Some((score, n)) = largest_tie(&all.scores) {
            outln!(
                "{:.1} % of the non-top-1 routes score exactly {score:.4} (their gate weights tie): \
                 a threshold takes all of them or none, so the target split cannot be met",
                100.0 * n as f64 / all.scores.len() as f64
            );
        }
    }
    outln!(
        "HOBBIT's Mixtral defaults T1 = {}, T2 = {} -> {} on this text",
        Thresholds::HOBBIT_MIXTRAL.t1,
        Thresholds::HOBBIT_MIXTRAL.t2,
        hobbit.show()
    );
    outln!("per layer with the fitted thresholds (high / low / skip):");
    for (i, l) in rec.layers.iter().enumerate() {
        outln!("  layer {i:>3}: {}", l.split(th).show());
    }
    outln!(
        "(shares of an all-high run; a dynamic run's routing shifts downstream of low or skipped \
         experts: `hob perplexity --low ... --kl-baseline` reports the split it used)"
    );
    let pair = match &widths {
        Some(wp) => Some(super::calibrate_widths::fit(
            args,
            (&file, &model, &text.tok),
            (&text.tokens, text.n_ctx, text.n_chunk),
            (wp, th),
        )?),
        None => None,
    };
    if let (Some(out), Some(p)) = (&args.output, platform) {
        write_profile(args, (out, p), (th, split, got), (&rec, pair))?;
    }
    Ok(())
}

/// The text's tokens and its chunks.
struct Text {
    tok: crate::generate::Tokenizer,
    tokens: Vec<u32>,
    n_ctx: usize,
    n_chunk: usize,
}

/// Tokenize the text and cut it into chunks (`scored`: chunks whose second half is scored, as
/// perplexity scores, need 4 tokens at least).
fn chunks(
    args: &CalibrateArgs,
    (file, model): (&crate::format::HobFile, &Model<'_>),
    scored: bool,
) -> crate::Result<Text> {
    let cfg = &model.cfg;
    let tok = tokenizer(file, cfg)?;
    let tokens = read_tokens(&args.file, &tok, cfg.add_bos)?;
    let n_ctx = chunk_ctx(
        ("calibrate", &args.model.model),
        args.ctx,
        512,
        cfg.context_length,
    )?;
    let least = if scored { 4 } else { 2 };
    if n_ctx < least {
        let with = if scored { " with --widths" } else { "" };
        return Err(Error::Invalid(format!(
            "--ctx-size {n_ctx}: must be at least {least}{with}"
        )));
    }
    if tokens.len() < n_ctx {
        return Err(Error::Invalid(format!(
            "{}: {} tokens, need at least one chunk of --ctx-size {n_ctx}",
            args.file.display(),
            tokens.len()
        )));
    }
    let mut n_chunk = tokens.len() / n_ctx;
    if let Some(c) = args.chunks {
        n_chunk = n_chunk.min(c.max(1));
    }
    Ok(Text {
        tok,
        tokens,
        n_ctx,
        n_chunk,
    })
}

/// Run the model over the text's chunks, all experts high, recording every route's score.
fn record(
    args: &CalibrateArgs,
    (file, model): (&crate::format::HobFile, &Model<'_>),
    platform: Option<&crate::platform::Platform>,
    text: &Text,
) -> crate::Result<Recorded> {
    let cfg = &model.cfg;
    let mut plan = args.model.plan(file, platform)?;
    plan.low = None;
    plan.thresholds = Thresholds::ALL_HIGH;
    plan.renormalize_skips = false;
    let (tok, tokens, n_ctx, n_chunk) = (&text.tok, &text.tokens, text.n_ctx, text.n_chunk);
    let high = file.variants()[plan.high].to_string();
    let layers = Rc::new(RefCell::new(Vec::new()));
    let recorder = Recorder {
        inner: DirectExperts::with_plan(file, plan)?,
        layers: layers.clone(),
        buf: Vec::new(),
    };
    let backend = CpuBackend::new(args.model.thread_count()?)?;
    let label = format!("cpu: {} threads", backend.threads());
    let bound = Bound::new(model, backend, Box::new(recorder), n_ctx, label)?;
    let mut gen = Generator::new(Box::new(bound));
    eprintln!(
        "calibrate: {} tokens, {n_chunk} chunks of {n_ctx}; {}",
        tokens.len(),
        gen.describe()
    );
    let started = Instant::now();
    for i in 0..n_chunk {
        let mut chunk = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
        if let (true, Some(bos)) = (cfg.add_bos, tok.bos_id()) {
            chunk[0] = bos;
        }
        gen.feed(&chunk)?;
        if i == 0 {
            let pass = started.elapsed().as_secs_f64();
            eprintln!(
                "calibrate: {pass:.2} s per chunk, ETA {:.1} min",
                pass * n_chunk as f64 / 60.0
            );
        }
    }
    drop(gen);
    let layers = std::mem::take(&mut *layers.borrow_mut());
    Ok(Recorded {
        layers,
        tokens: n_chunk * n_ctx,
        chunks: n_chunk,
        ctx: n_ctx,
        high,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// `-o`: the profile with the fitted thresholds (and the --high/--low flags, if given).
fn write_profile(
    args: &CalibrateArgs,
    (out, mut p): (&std::path::Path, crate::platform::Platform),
    (th, split, got): (Thresholds, Split, Split),
    (rec, pair): (&Recorded, Option<(String, String)>),
) -> crate::Result<()> {
    let from = p.name.clone();
    p.name = format!("{from}-calibrated");
    p.t1 = Some(th.t1);
    p.t2 = Some(th.t2);
    if let Some(h) = &args.model.expert_variant {
        p.high_variant = Some(h.clone());
    }
    if let Some(l) = &args.model.low {
        p.low_variant = Some(l.clone());
    }
    if let Some((h, l)) = pair {
        (p.high_variant, p.low_variant) = (Some(h), Some(l));
    }
    let header = vec![
        format!(
            "`hob calibrate` from profile {from}: thresholds fitted to {} on {} ({} tokens),",
            args.model.model.display(),
            args.file.display(),
            rec.tokens
        ),
        format!(
            "target split {} high/low/skip, {} on that text with {} experts.",
            split.show(),
            got.show(),
            rec.high
        ),
    ];
    p.save(out, &header)?;
    outln!("wrote {} (profile {})", out.display(), p.name);
    if p.low_variant.is_none() {
        outln!("note: the profile names no low_variant: the thresholds apply with --low VARIANT");
    }
    Ok(())
}

/// Ten bins from the lowest score's tenth down to 1.
fn print_histogram(sorted: &[f32]) {
    if sorted.is_empty() {
        outln!("no scores besides top-1 routes (top_k = 1): every route is high");
        return;
    }
    let lo = ((sorted[0].max(0.0) * 10.0).floor() / 10.0).min(0.9) as f64;
    let width = (1.0 - lo) / 10.0;
    let mut bins = [0usize; 10];
    for &s in sorted {
        let b = (((s as f64 - lo) / width).floor().max(0.0) as usize).min(9);
        bins[b] += 1;
    }
    let most = *bins.iter().max().unwrap_or(&1);
    outln!(
        "scores of the non-top-1 routes (share of the gate weight ranked above), {}:",
        sorted.len()
    );
    let q = |p: f64| sorted[((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
    outln!(
        "  quantiles: min {:.4}, p10 {:.4}, p50 {:.4}, p90 {:.4}, p99 {:.4}, max {:.4}",
        sorted[0],
        q(0.1),
        q(0.5),
        q(0.9),
        q(0.99),
        sorted[sorted.len() - 1]
    );
    for (i, &c) in bins.iter().enumerate() {
        let (a, b) = (lo + i as f64 * width, lo + (i + 1) as f64 * width);
        outln!(
            "  [{a:.3}, {b:.3}{} {c:>9} {:>5.1} % {}",
            if i == 9 { "]" } else { ")" },
            100.0 * c as f64 / sorted.len() as f64,
            "#".repeat((40 * c).div_ceil(most.max(1)))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_parses_and_checks() {
        let s = Split::parse("67/30/3").unwrap();
        assert!((s.high - 0.67).abs() < 1e-12 && (s.skip - 0.03).abs() < 1e-12);
        assert_eq!(Split::parse(" 50 / 50 / 0 ").unwrap().low, 0.5);
        for (bad, want) in [
            ("67/33", "three percentages"),
            ("60/30/30", "sum to 120"),
            ("110/-10/0", "'-10' is not a non-negative"),
            ("a/b/c", "'a'"),
            ("50/NaN/50", "'NaN'"),
        ] {
            let e = Split::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--split") && e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn fit_picks_quantiles_of_all_routes() {
        // 8 tokens, top-2: 8 top-1 routes plus the second routes' scores 0.5 + i/16 (binary
        // exact, so the bands are hand-checkable).
        let sorted: Vec<f32> = (0..8).map(|i| 0.5 + i as f32 / 16.0).collect();
        let split = Split::parse("75/12.5/12.5").unwrap();
        // 75 % high of 16 routes = 12: the 8 top-1 plus 4 scores (up to 0.6875); 87.5 % high or
        // low = 14: 6 scores (up to 0.8125). Thresholds halfway to the next score.
        let th = fit(&sorted, 8, split, 2).unwrap();
        assert_eq!((th.t1, th.t2), (0.71875, 0.84375));
        let mut l = LayerScores {
            top1: 8,
            scores: sorted.clone(),
        };
        assert_eq!(l.split(th), split);
        // The Mixtral defaults on these scores: 0.5, 0.5625 high; 0.625..0.875 low; 0.9375
        // skipped.
        let h = l.split(Thresholds::HOBBIT_MIXTRAL);
        assert_eq!(
            (h.high, h.low, h.skip),
            (10.0 / 16.0, 5.0 / 16.0, 1.0 / 16.0)
        );
        // Only top-1 high, nothing low: T1 = 0 (below every score), T2 = 0.
        let th = fit(&sorted, 8, Split::parse("50/0/50").unwrap(), 2).unwrap();
        assert_eq!((th.t1, th.t2), (0.0, 0.0));
        // Everything high: T1 = 1.
        let th = fit(&sorted, 8, Split::parse("100/0/0").unwrap(), 2).unwrap();
        assert!(th.all_high());
        // Below the top-1 share: a clear error.
        let e = fit(&sorted, 8, Split::parse("40/50/10").unwrap(), 2)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("top-1 share 50.0 %") && e.contains("top_k = 2"),
            "{e}"
        );
        // Equal scores cannot be split: the nearest reachable count wins.
        l.top1 = 10;
        l.scores = vec![0.6; 10];
        let th = fit(&l.scores, 10, Split::parse("60/40/0").unwrap(), 2).unwrap();
        // Want 2 of the 10 scores high: 0 (distance 2) beats 10 (distance 8).
        assert_eq!(th.t1, 0.0);
        assert_eq!(l.split(th).high, 0.5);
    }

    #[test]
    fn a_tie_holding_a_tenth_of_the_scores_is_named() {
        let mut v = vec![0.5f32; 9];
        v.extend([0.6, 0.7, 0.7]);
        assert_eq!(largest_tie(&v), Some((0.5, 9)));
        assert_eq!(
            largest_tie(&(0..20).map(|i| i as f32).collect::<Vec<_>>()),
            None
        );
        assert_eq!(largest_tie(&[]), None);
    }

    #[test]
    fn scores_are_recorded_per_token_with_top1_apart() {
        let r = |expert, weight| Route { expert, weight };
        let mut l = LayerScores::default();
        let mut buf = Vec::new();
        l.add(&[r(3, 0.25), r(1, 0.75)], &mut buf);
        l.add(&[r(2, 0.5), r(0, 0.5)], &mut buf);
        // Top-4: ranked 2 (0.5), 4 (0.25), 1 (0.125), 7 (0.125).
        l.add(&[r(7, 0.125), r(2, 0.5), r(4, 0.25), r(1, 0.125)], &mut buf);
        assert_eq!(l.top1, 3);
        assert_eq!(l.scores, [0.75, 0.5, 0.875, 0.5, 0.75]);
    }
}
