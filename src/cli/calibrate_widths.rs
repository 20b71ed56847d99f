//! `hob calibrate --widths`: fit the widths of an ap8 file's two tiers (issue 54), the way T1 and
//! T2 are fitted to a split. An ap8 file serves any width 2..8 from one copy, so the high and low
//! tiers are a choice: each candidate pair runs over the text with the fitted T1/T2, and its KL
//! divergence from the stored width (all routes high) is measured beside the bits a routed
//! weight reads on average (the pair's route split times each view's bits a weight). The pair
//! with the least KL within `--bits` wins; by default the budget is what the engine's default
//! pair (ap8@5 + ap8@3) reads on the same text, so the fit answers whether another pair does
//! better for no more bytes.

use super::calibrate::CalibrateArgs;
use super::engine::{Device, ModelArgs};
use super::kl_file::{Reader, Shape, Writer};
use super::out::outln;
use super::perplexity::{route_split, KlStats};
use crate::experts::Thresholds;
use crate::format::{HobFile, Variant, VariantKind};
use crate::generate::Tokenizer;
use crate::model::Model;
use crate::Error;

/// The pairs tried without a list: every high width from 4 up with the low widths 2..4 below it.
const DEFAULT_PAIRS: [(u8, u8); 11] = [
    (8, 4),
    (8, 3),
    (8, 2),
    (6, 4),
    (6, 3),
    (6, 2),
    (5, 4),
    (5, 3),
    (5, 2),
    (4, 3),
    (4, 2),
];

/// The pair whose bits set the default budget (the engine's pair for ap8 files).
const BUDGET_PAIR: (u8, u8) = super::engine::AP8_PAIR;

/// What `--widths` asks for, checked before the long runs.
pub struct WidthPlan {
    /// The stored ap8 variant the views are widths of.
    stored: Variant,
    pairs: Vec<(u8, u8)>,
}

/// One pair's run.
struct PairRun {
    pair: (u8, u8),
    kl: KlStats,
    /// Shares of routes high / low / skipped.
    split: [f64; 3],
    bits: f64,
}

/// Check `--widths PAIRS` against `file` (it must store an ap8 variant; widths 2..8, high above
/// low). An empty list takes the default pairs; the budget pair is added when `--bits` is not
/// given.
pub fn plan(file: &HobFile, list: &str, bits: Option<f64>) -> crate::Result<WidthPlan> {
    let names: Vec<String> = file.variants().iter().map(|v| v.to_string()).collect();
    let stored = file
        .variants()
        .iter()
        .find(|v| v.kind == VariantKind::Ap8 && !v.is_view())
        .copied()
        .ok_or_else(|| {
            Error::Invalid(format!(
                "--widths fits the widths of an ap8 file's tiers: {} stores no ap8 variant (its \
                 variants: {}); convert with --experts ap8",
                file.path().display(),
                names.join(", ")
            ))
        })?;
    let mut pairs = parse_pairs(list)?;
    if let Some(b) = bits.filter(|b| !(b.is_finite() && *b > 0.0)) {
        return Err(Error::Invalid(format!(
            "--bits {b}: must be a positive number of bits a routed weight reads"
        )));
    }
    if bits.is_none() && !pairs.contains(&BUDGET_PAIR) {
        pairs.push(BUDGET_PAIR);
    }
    Ok(WidthPlan { stored, pairs })
}

/// "8:3,5:3": high:low widths, each 2..=8, high above low, none repeated; "" is the default list.
fn parse_pairs(list: &str) -> crate::Result<Vec<(u8, u8)>> {
    if list.trim().is_empty() {
        return Ok(DEFAULT_PAIRS.to_vec());
    }
    let mut pairs = Vec::new();
    for item in list.split(',').map(str::trim) {
        let bad = |why: &str| Error::Invalid(format!("--widths {list}: '{item}' {why}"));
        let (h, l) = item
            .split_once(':')
            .ok_or_else(|| bad("is not HIGH:LOW (e.g. 5:3)"))?;
        let width = |s: &str| {
            s.trim()
                .parse::<u8>()
                .ok()
                .filter(|w| (2..=8).contains(w))
                .ok_or_else(|| bad("has a width outside 2..8"))
        };
        let pair = (width(h)?, width(l)?);
        if pair.0 <= pair.1 {
            return Err(bad("needs the high width above the low one"));
        }
        if pairs.contains(&pair) {
            return Err(bad("is listed twice"));
        }
        pairs.push(pair);
    }
    Ok(pairs)
}

/// Run every pair of `wp` over the chunks beside the stored width, print the table and the
/// fitted pair: its (high, low) variant names.
pub fn fit(
    args: &CalibrateArgs,
    (file, model, tok): (&HobFile, &Model<'_>, &Tokenizer),
    (tokens, n_ctx, n_chunk): (&[u32], usize, usize),
    (wp, th): (&WidthPlan, Thresholds),
) -> crate::Result<(String, String)> {
    let name = |k: u8| wp.stored.at_width(k).to_string();
    let platform = args.model.platform()?;
    // Once for all the passes (Auto: the GPU where one is usable).
    let device = args.model.resolve_device()?;
    let with = |high: u8, low: Option<u8>| -> ModelArgs {
        let mut a = args.model.clone();
        a.device = device;
        a.expert_variant = Some(name(high));
        a.low = Some(low.map_or("none".into(), name));
        // The stored width alone: every route high, nothing skipped.
        let t = low.map_or(Thresholds::ALL_HIGH, |_| th);
        (a.t1, a.t2, a.renorm_skips) = (Some(t.t1), Some(t.t2), false);
        a
    };
    let (vocab, first) = (model.cfg.vocab, n_ctx / 2);
    let shape = Shape {
        vocab,
        ctx: n_ctx,
        chunks: n_chunk,
        scored: n_ctx - 1 - first,
    };
    let chunk = |i: usize| {
        let mut c = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
        if let (true, Some(bos)) = (model.cfg.add_bos, tok.bos_id()) {
            c[0] = bos;
        }
        c
    };
    // One pass at a time (a GPU holds one session's cache), each pair's logits against the
    // stored width's, kept in a logits file (perplexity's --kl-divergence-base format).
    let dir = tempfile::tempdir().map_err(|e| Error::io("a temporary directory", "create", e))?;
    let base_path = dir.path().join("base.kld");
    let started = std::time::Instant::now();
    {
        let mut base = with(8, None).generator(file, model, n_ctx)?;
        let mut w = Writer::create(&base_path, shape)?;
        let mut logits = Vec::new();
        for i in 0..n_chunk {
            let c = chunk(i);
            base.score(&c, first, None, &mut logits)?;
            w.chunk(&c, &logits[..shape.scored * vocab])?;
        }
        w.finish()?;
    }
    eprintln!(
        "calibrate: width bands, {} pairs over {n_chunk} chunks against {} on the {}: ETA {:.1} \
         min",
        wp.pairs.len(),
        name(8),
        if device == Device::Cuda { "GPU" } else { "CPU" },
        started.elapsed().as_secs_f64() * wp.pairs.len() as f64 / 60.0
    );
    let (rows, cols) = (model.cfg.ffn, model.cfg.hidden);
    let bpw = |k: u8| wp.stored.at_width(k).bits_per_weight(rows, cols);
    let mut runs = Vec::with_capacity(wp.pairs.len());
    for &(h, l) in &wp.pairs {
        let a = with(h, Some(l));
        let mut g = a.generator(file, model, n_ctx)?;
        let mut base = Reader::open(&base_path, shape)?;
        let (mut base_logits, mut logits) = (Vec::new(), Vec::new());
        let mut kl = KlStats::default();
        for i in 0..n_chunk {
            let c = chunk(i);
            base.chunk(&c, &mut base_logits)?;
            g.score(&c, first, None, &mut logits)?;
            for j in 0..shape.scored {
                let row = j * vocab..(j + 1) * vocab;
                kl.add(&base_logits[row.clone()], &logits[row]);
            }
        }
        let plan = a.plan(file, platform.as_ref())?;
        let split = route_split(&g.session().expert_stats(), &plan).unwrap_or([1.0, 0.0, 0.0]);
        runs.push(PairRun {
            pair: (h, l),
            kl,
            split,
            bits: split[0] * bpw(h) + split[1] * bpw(l),
        });
    }
    let budget = args.bits.unwrap_or_else(|| {
        runs.iter()
            .find(|r| r.pair == BUDGET_PAIR)
            .map_or(f64::INFINITY, |r| r.bits)
    });
    print_table(&runs, &name(8), th, n_chunk * shape.scored);
    let best = runs
        .iter()
        .filter(|r| r.bits <= budget + 1e-9)
        .min_by(|a, b| a.kl.mean().total_cmp(&b.kl.mean()))
        .ok_or_else(|| {
            let least = runs.iter().map(|r| r.bits).fold(f64::INFINITY, f64::min);
            Error::Invalid(format!(
                "--bits {budget}: no pair reads that few bits a routed weight on this text (the \
                 fewest: {least:.3}); raise --bits or list narrower pairs with --widths"
            ))
        })?;
    let why = match args.bits {
        Some(_) => "--bits".to_string(),
        None => format!(
            "what {} + {} reads",
            name(BUDGET_PAIR.0),
            name(BUDGET_PAIR.1)
        ),
    };
    let (h, l) = (name(best.pair.0), name(best.pair.1));
    outln!(
        "fitted widths: {h} high + {l} low, the least KL ({:.3e}) at most {budget:.3} bits a \
         routed weight reads ({why})",
        best.kl.mean()
    );
    Ok((h, l))
}

fn print_table(runs: &[PairRun], stored: &str, th: Thresholds, tokens: usize) {
    outln!(
        "width bands: each pair with T1 = {}, T2 = {}, KL against {stored} (all high), {tokens} \
         tokens scored; * the pairs no other beats on both KL and bits:",
        th.t1,
        th.t2
    );
    outln!("| high | low | routes high / low / skip % | bits a routed weight reads | mean KL | same top | |");
    outln!("|---|---|---|---:|---:|---:|---|");
    for r in runs {
        let beaten = runs.iter().any(|o| {
            (o.bits < r.bits && o.kl.mean() <= r.kl.mean())
                || (o.bits <= r.bits && o.kl.mean() < r.kl.mean())
        });
        outln!(
            "| @{} | @{} | {:.1} / {:.1} / {:.1} | {:.3} | {:.4e} | {:.2} % | {} |",
            r.pair.0,
            r.pair.1,
            100.0 * r.split[0],
            100.0 * r.split[1],
            100.0 * r.split[2],
            r.bits,
            r.kl.mean(),
            100.0 * r.kl.same_top_share(),
            if beaten { "" } else { "*" }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::parse_pairs;

    #[test]
    fn pairs_parse_and_checks_name_the_item() {
        assert_eq!(parse_pairs("8:3, 5:2").unwrap(), [(8, 3), (5, 2)]);
        assert_eq!(parse_pairs("").unwrap().len(), 11);
        for (bad, want) in [
            ("8-3", "'8-3' is not HIGH:LOW"),
            ("9:3", "'9:3' has a width outside 2..8"),
            ("5:1", "outside 2..8"),
            ("3:5", "'3:5' needs the high width above"),
            ("5:3,5:3", "listed twice"),
        ] {
            let e = parse_pairs(bad).unwrap_err().to_string();
            assert!(e.contains("--widths") && e.contains(want), "{bad}: {e}");
        }
    }
}
