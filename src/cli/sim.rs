//! `hob sim`: replay a routing trace (formats/trace.md) through cache policies and sizes, as
//! HOBBIT's Fig. 18: per policy and cache size the miss penalty (a high miss costs 1, a low miss
//! low_bytes / high_bytes), the hit rate and the change against LRU. The replay is
//! `experts::cache::simulate`, the engine's own sequence of cache calls.
//!
//! Cache sizes: `--high-slots` (with `--low-slots`) gives pool sizes directly; `--cache-frac F`
//! gives a byte budget of F × (every expert at high precision), split by `pool_slots`:
//! `--low-share` of the bytes buy low slots, the rest high slots.
//! `--fit` grid-searches Eq. 3's weights (step 0.1, summing to 1, forward FLD) for the lowest
//! mean penalty relative to LRU over the sizes.

use super::out::{out, outln};
use std::path::PathBuf;

use clap::Args;
use rayon::prelude::*;
use serde_json::json;

use crate::experts::cache::{pool_slots, simulate, widths_nest, HobbitWeights, Policy, SimResult};
use crate::experts::Trace;
use crate::Error;

#[derive(Args, Debug)]
pub struct SimArgs {
    /// Routing trace (JSON lines, formats/trace.md).
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// High-pool slot counts, one column each (instead of --cache-frac).
    #[arg(
        long,
        value_name = "N,...",
        value_delimiter = ',',
        conflicts_with = "cache_frac"
    )]
    pub high_slots: Vec<usize>,
    /// With --high-slots: low-pool slot counts, one for all columns or one per column
    /// (default 0).
    #[arg(
        long,
        value_name = "N,...",
        value_delimiter = ',',
        requires = "high_slots"
    )]
    pub low_slots: Vec<usize>,
    /// Cache budgets as fractions of the bytes of every expert at high precision, one column
    /// each (default 0.1,0.25,0.5).
    #[arg(long, value_name = "F,...", value_delimiter = ',')]
    pub cache_frac: Vec<f64>,
    /// With --cache-frac: the share of each budget's bytes given to the low pool.
    #[arg(long, value_name = "S", default_value_t = crate::experts::cache::DEFAULT_LOW_SHARE)]
    pub low_share: f64,
    /// Policies, one row each: lru, lfu, lhu, fld, fld-back, hobbit, hobbit-back.
    #[arg(
        long,
        value_name = "P,...",
        default_value = "lru,lfu,lhu,fld,fld-back,hobbit,hobbit-back"
    )]
    pub policies: String,
    /// Weights lru,lfu,lhu,fld of the hobbit policies (default 0.5,0,0.5,0: fitted, see the
    /// README).
    #[arg(long, value_name = "W,W,W,W")]
    pub cache_weights: Option<String>,
    /// Serve a missed high route (not the token's top-1) from the low pool when it is there.
    #[arg(long)]
    pub substitute_low: bool,
    /// Also grid-search the hobbit weights (step 0.1) and print the best.
    #[arg(long)]
    pub fit: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_parser = ["md", "json"], default_value = "md")]
    pub output: String,
}

/// One cache size.
struct Column {
    label: String,
    high_slots: usize,
    low_slots: usize,
}

fn columns(args: &SimArgs, trace: &Trace) -> crate::Result<Vec<Column>> {
    let h = &trace.header;
    if !args.high_slots.is_empty() {
        let n = args.high_slots.len();
        let low: Vec<usize> = match args.low_slots.len() {
            0 => vec![0; n],
            1 => vec![args.low_slots[0]; n],
            m if m == n => args.low_slots.clone(),
            m => {
                return Err(Error::Invalid(format!(
                    "--low-slots: {m} values for {n} --high-slots columns (give 1 or {n})"
                )))
            }
        };
        return Ok(args
            .high_slots
            .iter()
            .zip(low)
            .map(|(&hs, ls)| Column {
                label: format!("{hs} high + {ls} low"),
                high_slots: hs,
                low_slots: ls,
            })
            .collect());
    }
    if !(0.0..=1.0).contains(&args.low_share) {
        return Err(Error::Invalid(format!(
            "--low-share {}: must be in [0, 1]",
            args.low_share
        )));
    }
    let fracs = if args.cache_frac.is_empty() {
        vec![0.1, 0.25, 0.5]
    } else {
        args.cache_frac.clone()
    };
    let all_high = (h.layers * h.experts) as f64 * h.high_bytes as f64;
    fracs
        .iter()
        .map(|&f| {
            if !(f.is_finite() && f > 0.0) {
                return Err(Error::Invalid(format!(
                    "--cache-frac {f}: each fraction must be a number above 0"
                )));
            }
            let budget = (f * all_high).round() as u64;
            let (hs, ls) = pool_slots(budget, h.high_bytes, h.low_bytes, args.low_share);
            Ok(Column {
                label: format!("{:.0}%: {hs} high + {ls} low", f * 100.0),
                high_slots: hs,
                low_slots: ls,
            })
        })
        .collect()
}

/// Percent change of `p` against the LRU baseline `base` (negative: less penalty).
fn vs(p: f64, base: f64) -> f64 {
    if base > 0.0 {
        (p - base) / base * 100.0
    } else {
        0.0
    }
}

/// Every weight set of step 0.1 summing to 1 (286 of them).
fn weight_grid() -> Vec<HobbitWeights> {
    let mut out = Vec::new();
    for a in 0..=10u8 {
        for b in 0..=10 - a {
            for c in 0..=10 - a - b {
                let d = 10 - a - b - c;
                let w = |x: u8| f32::from(x) / 10.0;
                out.push(HobbitWeights {
                    lru: w(a),
                    lfu: w(b),
                    lhu: w(c),
                    fld: w(d),
                });
            }
        }
    }
    out
}

/// Every policy's results per column, LRU's penalties, and the fitted weights (with --fit).
struct Outcome {
    rows: Vec<(String, Policy)>,
    results: Vec<Vec<SimResult>>,
    lru: Vec<f64>,
    /// (weights, mean change vs LRU in %, per-column change)
    fit: Option<(HobbitWeights, f64, Vec<f64>)>,
}

pub fn run(args: &SimArgs) -> crate::Result<()> {
    let trace = Trace::read(&args.trace)?;
    let cols = columns(args, &trace)?;
    let o = simulate_all(args, &trace, &cols)?;
    if args.output == "json" {
        print_json(args, &trace, &cols, &o);
    } else {
        print_table(args, &trace, &cols, &o);
    }
    Ok(())
}

fn simulate_all(args: &SimArgs, trace: &Trace, cols: &[Column]) -> crate::Result<Outcome> {
    if args.policies.trim().is_empty() {
        return Err(Error::Invalid(
            "--policies: name at least one policy".into(),
        ));
    }
    let mut rows: Vec<(String, Policy)> = Vec::new();
    for name in args.policies.split(',').map(str::trim) {
        let w = if name.starts_with("hobbit") {
            args.cache_weights.as_deref()
        } else {
            None
        };
        rows.push((name.to_string(), Policy::parse(name, w)?));
    }
    if let Some(w) = &args.cache_weights {
        HobbitWeights::parse(w)?;
    }
    let run_all = |policy: Policy| -> Vec<SimResult> {
        cols.par_iter()
            .map(|c| {
                simulate(
                    trace,
                    policy,
                    c.high_slots,
                    c.low_slots,
                    args.substitute_low,
                )
            })
            .collect()
    };
    let results: Vec<Vec<SimResult>> = rows.par_iter().map(|(_, p)| run_all(*p)).collect();
    let lru: Vec<f64> = match rows.iter().position(|(_, p)| *p == Policy::Lru) {
        Some(i) => results[i].iter().map(|r| r.penalty).collect(),
        None => run_all(Policy::Lru).iter().map(|r| r.penalty).collect(),
    };

    // (weights, mean change vs LRU in %, per-column change)
    let fit = args.fit.then(|| {
        let scored: Vec<(HobbitWeights, f64, Vec<f64>)> = weight_grid()
            .into_par_iter()
            .map(|w| {
                let per: Vec<f64> = run_all(Policy::Hobbit(w))
                    .iter()
                    .zip(&lru)
                    .map(|(r, &b)| vs(r.penalty, b))
                    .collect();
                let mean = per.iter().sum::<f64>() / per.len().max(1) as f64;
                (w, mean, per)
            })
            .collect();
        // The first (in grid order) of the lowest mean.
        scored
            .into_iter()
            .reduce(|best, x| if x.1 < best.1 { x } else { best })
    });
    let fit = fit.flatten();
    Ok(Outcome {
        rows,
        results,
        lru,
        fit,
    })
}

fn print_json(args: &SimArgs, trace: &Trace, cols: &[Column], o: &Outcome) {
    let (rows, results, lru, fit) = (&o.rows, &o.results, &o.lru, &o.fit);
    let h = &trace.header;
    let low_cost = h.low_bytes as f64 / h.high_bytes as f64;
    let out = json!({
        "trace": args.trace.display().to_string(),
        "model": h.model,
        "layers": h.layers,
        "experts": h.experts,
        "top_k": h.top_k,
        "tokens": trace.tokens(),
        "sequences": trace.sequences(),
        "low_miss_cost": low_cost,
        "substitute_low": args.substitute_low,
        "columns": cols.iter().map(|c| json!({
            "label": c.label, "high_slots": c.high_slots, "low_slots": c.low_slots,
        })).collect::<Vec<_>>(),
        "rows": rows.iter().zip(results).map(|((name, p), rs)| json!({
            "policy": name,
            "config": p.to_string(),
            "cells": rs.iter().zip(lru).map(|(r, &b)| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                v["hit_rate"] = json!(r.hit_rate());
                v["vs_lru_pct"] = json!(vs(r.penalty, b));
                v
            }).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "fit": fit.as_ref().map(|(w, mean, per)| json!({
            "weights": [w.lru, w.lfu, w.lhu, w.fld],
            "mean_vs_lru_pct": mean,
            "vs_lru_pct": per,
        })),
    });
    outln!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
}

fn print_table(args: &SimArgs, trace: &Trace, cols: &[Column], o: &Outcome) {
    let (rows, results, lru, fit) = (&o.rows, &o.results, &o.lru, &o.fit);
    let h = &trace.header;
    let low_cost = h.low_bytes as f64 / h.high_bytes as f64;

    let low = match &h.low {
        Some(name) => format!(
            ", low {name} ({} B; a miss costs {low_cost:.3})",
            h.low_bytes
        ),
        None => ", no low variant".into(),
    };
    outln!(
        "trace {}: {}, {} layers x {} experts, top-{}; {} tokens in {} sequences; high {} ({} B){low}",
        args.trace.display(),
        h.model,
        h.layers,
        h.experts,
        h.top_k,
        trace.tokens(),
        trace.sequences(),
        h.high,
        h.high_bytes,
    );
    if let Some(r) = results.first().and_then(|r| r.first()) {
        outln!(
            "routes: {} computed, {} skipped{}",
            r.served(),
            r.skips,
            if args.substitute_low {
                "; missed high routes may use a cached low copy"
            } else {
                ""
            }
        );
    }
    if let Some(low) = h.low.as_deref().filter(|l| widths_nest(&h.high, l)) {
        outln!(
            "{} and {low} are widths of one ap8 blob: a high miss whose low copy is cached loads \
             only the missing planes ({:.3} of a high load)",
            h.high,
            1.0 - low_cost
        );
    }
    outln!("cells: miss penalty (high miss = 1) (hit rate, change vs lru)");
    outln!();
    let mut table: Vec<Vec<String>> = vec![std::iter::once("policy".to_string())
        .chain(cols.iter().map(|c| c.label.clone()))
        .collect()];
    for ((name, p), rs) in rows.iter().zip(results) {
        let mut line = vec![name.clone()];
        for (r, &b) in rs.iter().zip(lru) {
            line.push(if *p == Policy::Lru {
                format!("{:.2} ({:.1}% hit)", r.penalty, r.hit_rate() * 100.0)
            } else {
                format!(
                    "{:.2} ({:.1}% hit, {:+.1}%)",
                    r.penalty,
                    r.hit_rate() * 100.0,
                    vs(r.penalty, b)
                )
            });
        }
        table.push(line);
    }
    out!("{}", markdown(&table));
    if let Some((w, mean, per)) = &fit {
        let per: Vec<String> = per.iter().map(|p| format!("{p:+.1}%")).collect();
        outln!();
        outln!(
            "fit (hobbit, forward FLD, 286 weight sets of step 0.1): best --cache-weights {w} \
             (lru,lfu,lhu,fld): penalty vs lru {mean:+.2}% mean ({})",
            per.join(", ")
        );
    }
}

/// A markdown table, first row the header; the first column left-aligned, the rest right.
fn markdown(rows: &[Vec<String>]) -> String {
    let n = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
                .max(3)
        })
        .collect();
    let mut out = String::new();
    for (k, r) in rows.iter().enumerate() {
        out.push('|');
        for (i, cell) in r.iter().enumerate() {
            let fill = " ".repeat(widths[i] - cell.chars().count());
            if i == 0 {
                out.push_str(&format!(" {cell}{fill} |"));
            } else {
                out.push_str(&format!(" {fill}{cell} |"));
            }
        }
        out.push('\n');
        if k == 0 {
            out.push('|');
            for (i, w) in widths.iter().enumerate() {
                if i == 0 {
                    out.push_str(&format!(" {} |", "-".repeat(*w)));
                } else {
                    out.push_str(&format!(" {}: |", "-".repeat(w - 1)));
                }
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_has_every_step_point_summing_to_one() {
        let g = weight_grid();
        assert_eq!(g.len(), 286); // C(13, 3)
        for w in &g {
            assert!(
                HobbitWeights::new(w.lru, w.lfu, w.lhu, w.fld).is_ok(),
                "{w}"
            );
        }
        assert!(g.contains(&HobbitWeights::DEFAULT));
    }

    #[test]
    fn markdown_aligns() {
        let t = markdown(&[
            vec!["policy".into(), "a".into()],
            vec!["lru".into(), "12.50".into()],
        ]);
        assert_eq!(
            t,
            "| policy |     a |\n| ------ | ----: |\n| lru    | 12.50 |\n"
        );
    }
}
