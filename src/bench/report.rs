//! llama-bench-style result tables with hob's MoE columns.
//!
//! One `BenchRow` per (model, configuration, test). `render_markdown` prints llama-bench's
//! `-o md` look (padded cells, numeric columns right-aligned); `render_json` prints a JSON array
//! with one object per row (llama-bench's `-o json` field names where they exist: `n_threads`,
//! `avg_ts`, `stddev_ts`, `samples_ts`, `n_prompt`, `n_gen`).
//!
//! The `limit t/s` column is the perfect-overlap bound (`Limit::overlap_tok_s`): nothing can beat
//! it on the card it describes, so `% limit` stays at or below 100 there. With `--platform P` on a
//! faster GPU the limit is P's card while the rate is this device's: a row bound by device memory
//! can pass 100% (gpt-oss-20b resident under rtx4060ti-16g on an H100: ~410%), and the projection
//! column is the rate to set beside it. The JSON carries both bounds.
//!
//! Where a row has a projection onto its profile's memory (`super::projection`), the table gets
//! one more column, last, named for the profile: `projected t/s (rtx4060ti-16g's memory)`; a
//! table without one keeps llama-bench's columns and hob's 14. The JSON always has the fields
//! (`projected_ts`, `gpu_busy_per_token_s`, `device_memory_gbs`: null when absent).

use std::fmt;

use serde::{Serialize, Serializer};
use serde_json::{json, Value};

use super::{mean_sd, Limit, Projection};

/// The test, as llama-bench names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchTest {
    /// Prefill of n tokens: "pp512".
    Prompt(usize),
    /// Decoding n tokens one by one: "tg128".
    Generate(usize),
}

impl fmt::Display for BenchTest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchTest::Prompt(n) => write!(f, "pp{n}"),
            BenchTest::Generate(n) => write!(f, "tg{n}"),
        }
    }
}

impl Serialize for BenchTest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Expert-cache hit rate of one precision (variant), 0..=1.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HitRate {
    /// "f16", "int4", ...
    pub variant: String,
    pub rate: f64,
}

/// The MoE columns, per token of the test.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct MoeStats {
    /// Hit rate per variant, in the order shown.
    pub hit_rates: Vec<HitRate>,
    /// Experts loaded (cache misses that were loaded, any precision) per token.
    pub experts_loaded_per_token: f64,
    /// Bytes moved over the link or read from disk per token.
    pub bytes_moved_per_token: f64,
    /// Link (or disk) bandwidth reached, GB/s: bytes moved / time spent.
    pub link_gbs: f64,
    /// Routes the precision scorer skipped per token (shown beside the hit rates when any).
    pub skipped_per_token: f64,
}

/// One row of the result table.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchRow {
    pub model: String,
    /// Bytes of what is benchmarked: the dense weights and the expert variants computed with
    /// (not the file's other variants).
    pub size_bytes: u64,
    /// Parameter count (dense and experts), when known.
    pub params: Option<u64>,
    /// "CPU", "CUDA", ...
    pub backend: String,
    /// CPU threads of the session (llama-bench shows them for every backend).
    pub threads: usize,
    /// The platform profile the run used or emulated ("h100", "rtx4090-24g", ...).
    pub profile: String,
    pub test: BenchTest,
    /// Tokens per second of each repetition.
    pub samples_tok_s: Vec<f64>,
    /// None where there is nothing to report (everything resident, CPU run...).
    pub moe: Option<MoeStats>,
    /// The physical limit of this configuration, when computed.
    pub limit: Option<Limit>,
    /// Tokens/s projected onto the profile's memory (CUDA decode rows of a profile whose memory
    /// is slower than the device's), when computed.
    pub projection: Option<Projection>,
}

impl BenchRow {
    /// Mean and sample standard deviation of the tokens per second.
    pub fn tok_s(&self) -> (f64, f64) {
        mean_sd(&self.samples_tok_s)
    }

    /// Measured mean as a percentage of the perfect-overlap limit.
    pub fn limit_pct(&self) -> Option<f64> {
        self.limit
            .map(|l| 100.0 * self.tok_s().0 / l.overlap_tok_s)
            .filter(|p| p.is_finite())
    }

    /// Measured mean as a percentage of the no-overlap limit (above 100: loads overlapped).
    pub fn no_overlap_pct(&self) -> Option<f64> {
        self.limit
            .map(|l| 100.0 * self.tok_s().0 / l.no_overlap_tok_s)
            .filter(|p| p.is_finite())
    }
}

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

/// (header, right-aligned)
const COLUMNS: [(&str, bool); 14] = [
    ("model", false),
    ("size", true),
    ("params", true),
    ("backend", false),
    ("threads", true),
    ("profile", false),
    ("test", true),
    ("t/s", true),
    ("hit rate", false),
    ("exp/tok", true),
    ("MB/tok", true),
    ("link GB/s", true),
    ("limit t/s", true),
    ("% limit", true),
];

/// llama-bench's size cell: MiB below a GiB, else GiB.
fn size_cell(bytes: u64) -> String {
    let b = bytes as f64;
    if b < GIB {
        format!("{:.2} MiB", b / MIB)
    } else {
        format!("{:.2} GiB", b / GIB)
    }
}

/// llama-bench's params cell: M below a billion, else B.
fn params_cell(params: u64) -> String {
    let p = params as f64;
    if p < 1e9 {
        format!("{:.2} M", p / 1e6)
    } else {
        format!("{:.2} B", p / 1e9)
    }
}

fn cells(r: &BenchRow) -> Vec<String> {
    let dash = || "-".to_string();
    let (mean, sd) = r.tok_s();
    let moe = r.moe.as_ref();
    [
        r.model.clone(),
        size_cell(r.size_bytes),
        r.params.map_or_else(dash, params_cell),
        r.backend.clone(),
        r.threads.to_string(),
        r.profile.clone(),
        r.test.to_string(),
        format!("{mean:.2} ± {sd:.2}"),
        moe.filter(|m| !m.hit_rates.is_empty() || m.skipped_per_token > 0.0)
            .map_or_else(dash, |m| {
                let mut parts: Vec<String> = m
                    .hit_rates
                    .iter()
                    .map(|h| format!("{} {:.1}%", h.variant, 100.0 * h.rate))
                    .collect();
                if m.skipped_per_token > 0.0 {
                    parts.push(format!("{:.2} skipped/tok", m.skipped_per_token));
                }
                parts.join(", ")
            }),
        moe.map_or_else(dash, |m| format!("{:.2}", m.experts_loaded_per_token)),
        moe.map_or_else(dash, |m| format!("{:.1}", m.bytes_moved_per_token / 1e6)),
        moe.map_or_else(dash, |m| format!("{:.2}", m.link_gbs)),
        r.limit
            .map_or_else(dash, |l| format!("{:.2}", l.overlap_tok_s)),
        r.limit_pct().map_or_else(dash, |p| format!("{p:.1}%")),
    ]
    .into()
}

/// The columns of `rows`: hob's 14, and the projection's when a row has one. It names the
/// profile when every projected row shares it (one bench run has one profile).
fn columns(rows: &[BenchRow]) -> Vec<(String, bool)> {
    let mut columns: Vec<(String, bool)> = COLUMNS
        .iter()
        .map(|&(h, right)| (h.to_string(), right))
        .collect();
    let mut projected = rows.iter().filter(|r| r.projection.is_some());
    if let Some(first) = projected.next() {
        let name = match projected.all(|r| r.profile == first.profile) {
            true => format!("{}'s", first.profile),
            false => "the profile's".to_string(),
        };
        columns.push((format!("projected t/s ({name} memory)"), true));
    }
    columns
}

/// A markdown table in llama-bench's look, one line per row, ending with a newline.
pub fn render_markdown(rows: &[BenchRow]) -> String {
    let columns = columns(rows);
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut c = cells(r);
            if columns.len() > COLUMNS.len() {
                c.push(
                    r.projection
                        .map_or_else(|| "-".to_string(), |p| format!("{:.2}", p.tok_s)),
                );
            }
            c
        })
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, (h, _))| {
            body.iter()
                .map(|c| c[i].chars().count())
                .chain([h.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |items: &mut dyn Iterator<Item = String>| {
        let mut s = String::from("|");
        for it in items {
            s.push(' ');
            s.push_str(&it);
            s.push_str(" |");
        }
        s.push('\n');
        s
    };
    let pad = |text: &str, w: usize, right: bool| {
        let fill = " ".repeat(w.saturating_sub(text.chars().count()));
        if right {
            format!("{fill}{text}")
        } else {
            format!("{text}{fill}")
        }
    };
    let mut out = line(
        &mut columns
            .iter()
            .zip(&widths)
            .map(|((h, right), &w)| pad(h, w, *right)),
    );
    out.push_str(&line(&mut columns.iter().zip(&widths).map(
        |((_, right), &w)| {
            if *right {
                format!("{}:", "-".repeat(w - 1))
            } else {
                "-".repeat(w)
            }
        },
    )));
    for c in &body {
        out.push_str(&line(
            &mut c
                .iter()
                .zip(columns.iter().zip(&widths))
                .map(|(text, ((_, right), &w))| pad(text, w, *right)),
        ));
    }
    out
}

fn row_json(r: &BenchRow) -> Value {
    let (mean, sd) = r.tok_s();
    let (n_prompt, n_gen) = match r.test {
        BenchTest::Prompt(n) => (n, 0),
        BenchTest::Generate(n) => (0, n),
    };
    let moe = r.moe.as_ref();
    json!({
        "model": r.model,
        "size_bytes": r.size_bytes,
        "params": r.params,
        "backend": r.backend,
        "n_threads": r.threads,
        "profile": r.profile,
        "test": r.test,
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "avg_ts": mean,
        "stddev_ts": sd,
        "samples_ts": r.samples_tok_s,
        "hit_rates": moe.map(|m| &m.hit_rates),
        "experts_loaded_per_token": moe.map(|m| m.experts_loaded_per_token),
        "bytes_moved_per_token": moe.map(|m| m.bytes_moved_per_token),
        "link_gbs": moe.map(|m| m.link_gbs),
        "skipped_per_token": moe.map(|m| m.skipped_per_token),
        "limit_overlap_ts": r.limit.map(|l| l.overlap_tok_s),
        "limit_no_overlap_ts": r.limit.map(|l| l.no_overlap_tok_s),
        "limit_pct": r.limit_pct(),
        "no_overlap_pct": r.no_overlap_pct(),
        "projected_ts": r.projection.map(|p| p.tok_s),
        "gpu_busy_per_token_s": r.projection.map(|p| p.gpu_busy_s),
        "device_memory_gbs": r.projection.map(|p| p.device_gbs),
    })
}

/// A JSON array with one object per row (absent values are null), ending with a newline.
pub fn render_json(rows: &[BenchRow]) -> String {
    let v = Value::Array(rows.iter().map(row_json).collect());
    let mut s = serde_json::to_string_pretty(&v).unwrap_or_else(|_| "[]".to_string());
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::super::physical_limit;
    use super::*;

    fn rows() -> Vec<BenchRow> {
        let limit = physical_limit(3.21e9 + 64.0 * 352e6, 32.0 * 352e6, 1008.0, 25.0);
        vec![
            BenchRow {
                model: "mixtral 8x7B".into(),
                size_bytes: 29 << 30,
                params: Some(46_700_000_000),
                backend: "CUDA".into(),
                threads: 8,
                profile: "rtx4090-24g".into(),
                test: BenchTest::Generate(128),
                samples_tok_s: vec![2.0, 2.1, 2.2],
                moe: Some(MoeStats {
                    hit_rates: vec![
                        HitRate {
                            variant: "f16".into(),
                            rate: 0.931,
                        },
                        HitRate {
                            variant: "int4".into(),
                            rate: 0.41,
                        },
                    ],
                    experts_loaded_per_token: 4.4,
                    bytes_moved_per_token: 1.2345e9,
                    link_gbs: 24.5,
                    skipped_per_token: 0.0,
                }),
                limit: Some(limit),
                projection: None,
            },
            BenchRow {
                model: "mixtral 8x7B".into(),
                size_bytes: 29 << 30,
                params: None,
                backend: "CPU".into(),
                threads: 16,
                profile: "h100".into(),
                test: BenchTest::Prompt(512),
                samples_tok_s: vec![100.0],
                moe: None,
                limit: None,
                projection: None,
            },
        ]
    }

    #[test]
    fn test_names() {
        assert_eq!(BenchTest::Prompt(512).to_string(), "pp512");
        assert_eq!(BenchTest::Generate(128).to_string(), "tg128");
    }

    #[test]
    fn markdown_looks_like_llama_bench() {
        let md = render_markdown(&rows());
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines.len(), 4, "{md}");
        // Every line has the same width and 14 columns.
        for l in &lines {
            assert_eq!(l.chars().count(), lines[0].chars().count(), "{md}");
            assert_eq!(l.matches(" |").count(), 14, "{l}");
        }
        assert!(lines[0].contains("| backend | threads | profile "), "{md}");
        assert!(lines[0].starts_with("| model        |      size |"), "{md}");
        assert!(lines[1].starts_with("| ------------ | --------: |"), "{md}");
        let r = lines[2];
        for want in [
            "| 29.00 GiB |",
            " 46.70 B |",
            "| CUDA    |       8 |",
            "| rtx4090-24g |",
            " tg128 |",
            " 2.10 ± 0.10 |",
            "| f16 93.1%, int4 41.0% |",
            " 4.40 |",
            " 1234.5 |",
            " 24.50 |",
            " 2.22 |",  // overlap limit: 1 / 0.45056 s
            " 94.6% |", // 2.1 / 2.2195
        ] {
            assert!(r.contains(want), "'{want}' not in {r}");
        }
        let r = lines[3];
        assert!(
            r.contains(" pp512 |") && r.contains(" 100.00 ± 0.00 |"),
            "{r}"
        );
        assert!(r.matches(" - |").count() >= 6, "{r}");
        assert_eq!(render_markdown(&[]).lines().count(), 2);
    }

    #[test]
    fn small_models_show_mib_and_millions_as_llama_bench_does() {
        assert_eq!(size_cell(29 << 30), "29.00 GiB");
        assert_eq!(size_cell(3 << 19), "1.50 MiB");
        assert_eq!(params_cell(46_700_000_000), "46.70 B");
        assert_eq!(params_cell(234_560), "0.23 M");
    }

    #[test]
    fn json_has_one_object_per_row() {
        let v: Value = serde_json::from_str(&render_json(&rows())).unwrap();
        let a = v.as_array().unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0]["test"], "tg128");
        assert_eq!(
            (a[0]["n_threads"].as_u64(), a[1]["n_threads"].as_u64()),
            (Some(8), Some(16))
        );
        assert_eq!(
            (a[0]["n_prompt"].as_u64(), a[0]["n_gen"].as_u64()),
            (Some(0), Some(128))
        );
        assert!((a[0]["avg_ts"].as_f64().unwrap() - 2.1).abs() < 1e-12);
        assert!((a[0]["stddev_ts"].as_f64().unwrap() - 0.1).abs() < 1e-12);
        assert_eq!(a[0]["samples_ts"].as_array().unwrap().len(), 3);
        assert_eq!(a[0]["hit_rates"][1]["variant"], "int4");
        assert_eq!(a[0]["hit_rates"][0]["rate"], 0.931);
        assert!((a[0]["limit_no_overlap_ts"].as_f64().unwrap() - 2.1005).abs() < 1e-3);
        assert!((a[0]["limit_pct"].as_f64().unwrap() - 94.6).abs() < 0.05);
        assert_eq!(a[1]["test"], "pp512");
        assert!(a[1]["params"].is_null() && a[1]["hit_rates"].is_null());
        assert!(a[1]["limit_pct"].is_null());
        for field in ["projected_ts", "gpu_busy_per_token_s", "device_memory_gbs"] {
            assert!(a[0][field].is_null() && a[1][field].is_null(), "{field}");
        }
    }

    /// The rows above with the decode row projected: H200 to an RTX 4060 Ti.
    fn projected_rows() -> Vec<BenchRow> {
        let mut rows = rows();
        rows[0].profile = "rtx4060ti-16g".into();
        rows[0].projection = super::super::project(2.1, (0.1, f64::INFINITY), 4275.0, 288.0);
        rows
    }

    #[test]
    fn a_projection_adds_one_column_named_for_the_profile() {
        let md = render_markdown(&projected_rows());
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines.len(), 4, "{md}");
        for l in &lines {
            assert_eq!(l.chars().count(), lines[0].chars().count(), "{md}");
            assert_eq!(l.matches(" |").count(), 15, "{l}");
        }
        // The other columns are where they were.
        let plain = render_markdown(&rows());
        let cut = |l: &str| {
            l.split(" |")
                .take(13)
                .map(str::trim)
                .collect::<Vec<_>>()
                .join("|")
        };
        for (a, b) in md.lines().zip(plain.lines()).skip(2) {
            assert_eq!(cut(a).replace("rtx4060ti-16g", "rtx4090-24g"), cut(b));
        }
        assert!(
            lines[0].ends_with("| projected t/s (rtx4060ti-16g's memory) |"),
            "{md}"
        );
        assert!(lines[1].ends_with("-: |"), "{md}");
        let last_two = |l: &str| {
            let c: Vec<String> = l.split('|').map(|c| c.trim().to_string()).collect();
            (c[c.len() - 3].clone(), c[c.len() - 2].clone())
        };
        // 1 / (1/2.1 - 0.1 + 0.1 x 4275 / 288) = 0.5375 tok/s.
        assert_eq!(last_two(lines[2]), ("94.6%".into(), "0.54".into()), "{md}");
        assert_eq!(last_two(lines[3]), ("-".into(), "-".into()), "{md}");
        // Rows of two profiles (never one bench run): the header names neither.
        let mut mixed = projected_rows();
        mixed[1].projection = mixed[0].projection;
        let md = render_markdown(&mixed);
        assert!(
            md.starts_with("| model ")
                && md
                    .lines()
                    .next()
                    .unwrap()
                    .ends_with("| projected t/s (the profile's memory) |"),
            "{md}"
        );
    }

    #[test]
    fn json_carries_the_projection_beside_the_measured_fields() {
        let v: Value = serde_json::from_str(&render_json(&projected_rows())).unwrap();
        let a = v.as_array().unwrap();
        let want = 1.0 / (1.0 / 2.1 - 0.1 + 0.1 * 4275.0 / 288.0);
        assert!((a[0]["projected_ts"].as_f64().unwrap() - want).abs() < 1e-12);
        assert_eq!(a[0]["gpu_busy_per_token_s"], 0.1);
        assert_eq!(a[0]["device_memory_gbs"], 4275.0);
        // The measured fields scripts read are the same as without it.
        assert!((a[0]["avg_ts"].as_f64().unwrap() - 2.1).abs() < 1e-12);
        assert_eq!(a[0]["n_gen"], 128);
        assert!(a[1]["projected_ts"].is_null());
    }
}
