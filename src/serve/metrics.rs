//! The server's counters, and `GET /metrics` in Prometheus' text format.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::worker::Usage;
use crate::experts::ExpertStats;

/// Queue waits kept for the percentiles.
const WAITS_KEPT: usize = 1024;

#[derive(Default)]
pub struct Metrics {
    /// Requests waiting for the generation thread.
    pub queued: AtomicUsize,
    busy: AtomicBool,
    requests: Mutex<BTreeMap<u16, u64>>,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    tokens_streamed: AtomicU64,
    cancelled: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    waits: VecDeque<f64>,
    prompt_seconds: f64,
    gen_seconds: f64,
    last_prompt_rate: f64,
    last_gen_rate: f64,
    experts: ExpertStats,
}

impl Metrics {
    /// A response went out with `status`.
    pub fn responded(&self, status: u16) {
        if let Ok(mut r) = self.requests.lock() {
            *r.entry(status).or_default() += 1;
        }
    }

    pub fn dequeued(&self, waited: Duration) {
        self.queued.fetch_sub(1, Ordering::SeqCst);
        if let Ok(mut i) = self.inner.lock() {
            if i.waits.len() == WAITS_KEPT {
                i.waits.pop_front();
            }
            i.waits.push_back(waited.as_secs_f64());
        }
    }

    pub fn busy(&self, on: bool) {
        self.busy.store(on, Ordering::SeqCst);
    }

    pub fn token(&self) {
        self.tokens_streamed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    pub fn finished(&self, u: &Usage) {
        self.prompt_tokens
            .fetch_add(u.prompt_tokens as u64, Ordering::Relaxed);
        self.cached_tokens
            .fetch_add(u.cached_tokens as u64, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(u.completion_tokens as u64, Ordering::Relaxed);
        if let Ok(mut i) = self.inner.lock() {
            let (p, g) = (u.prompt_time.as_secs_f64(), u.gen_time.as_secs_f64());
            i.prompt_seconds += p;
            i.gen_seconds += g;
            let prefilled = u.prompt_tokens - u.cached_tokens;
            if p > 0.0 && prefilled > 0 {
                i.last_prompt_rate = prefilled as f64 / p;
            }
            if g > 0.0 && u.completion_tokens > 0 {
                i.last_gen_rate = u.completion_tokens as f64 / g;
            }
        }
    }

    pub fn experts(&self, s: &ExpertStats) {
        if let Ok(mut i) = self.inner.lock() {
            i.experts.accumulate(s);
        }
    }

    /// The queue wait at quantile q (0..1) over the last waits, in seconds.
    pub fn wait_quantile(&self, q: f64) -> f64 {
        let Ok(i) = self.inner.lock() else { return 0.0 };
        let mut w: Vec<f64> = i.waits.iter().copied().collect();
        if w.is_empty() {
            return 0.0;
        }
        w.sort_by(f64::total_cmp);
        w[((w.len() - 1) as f64 * q).round() as usize]
    }

    /// Prometheus' text exposition format.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<(String, f64)>| {
            write_metric(&mut s, (name, kind, help), lines)
        };
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let requests = self
            .requests
            .lock()
            .map(|r| {
                r.iter()
                    .map(|(code, c)| (format!("{{status=\"{code}\"}}"), *c as f64))
                    .collect()
            })
            .unwrap_or_default();
        metric(
            "requests_total",
            "counter",
            "HTTP responses by status.",
            requests,
        );
        metric(
            "queue_length",
            "gauge",
            "Requests waiting for the model.",
            one(self.queued.load(Ordering::SeqCst) as f64),
        );
        metric(
            "busy",
            "gauge",
            "1 while a request is generating.",
            one(f64::from(u8::from(self.busy.load(Ordering::SeqCst)))),
        );
        metric(
            "queue_wait_seconds",
            "summary",
            "Time from arrival to the start of generation (last 1024 requests).",
            vec![
                ("{quantile=\"0.5\"}".into(), self.wait_quantile(0.5)),
                ("{quantile=\"0.99\"}".into(), self.wait_quantile(0.99)),
            ],
        );
        metric(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of finished requests.",
            one(n(&self.prompt_tokens)),
        );
        metric(
            "prompt_tokens_cached_total",
            "counter",
            "Prompt tokens whose KV cache was reused from the previous request.",
            one(n(&self.cached_tokens)),
        );
        metric(
            "completion_tokens_total",
            "counter",
            "Generated tokens of finished requests.",
            one(n(&self.completion_tokens)),
        );
        metric(
            "tokens_generated_total",
            "counter",
            "Every generated token, cancelled requests included.",
            one(n(&self.tokens_streamed)),
        );
        metric(
            "requests_cancelled_total",
            "counter",
            "Requests whose client went away mid-generation.",
            one(n(&self.cancelled)),
        );
        if let Ok(i) = self.inner.lock() {
            render_engine(&i, &mut s);
        }
        s
    }
}

fn one(v: f64) -> Vec<(String, f64)> {
    vec![(String::new(), v)]
}

/// One metric: its HELP and TYPE lines, then a line per label set.
fn write_metric(s: &mut String, (name, kind, help): (&str, &str, &str), lines: Vec<(String, f64)>) {
    let _ = writeln!(s, "# HELP hob_{name} {help}\n# TYPE hob_{name} {kind}");
    for (labels, v) in lines {
        let _ = writeln!(s, "hob_{name}{labels} {v}");
    }
}

/// Speeds and the expert engine's counters.
fn render_engine(i: &Inner, s: &mut String) {
    let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<(String, f64)>| {
        write_metric(s, (name, kind, help), lines)
    };
    metric(
        "prompt_seconds_total",
        "counter",
        "Seconds spent prefilling.",
        one(i.prompt_seconds),
    );
    metric(
        "generation_seconds_total",
        "counter",
        "Seconds spent decoding.",
        one(i.gen_seconds),
    );
    metric(
        "prompt_tokens_per_second",
        "gauge",
        "Prefill speed of the last request.",
        one(i.last_prompt_rate),
    );
    metric(
        "generation_tokens_per_second",
        "gauge",
        "Decode speed of the last request.",
        one(i.last_gen_rate),
    );
    let per = |f: fn(&crate::experts::VariantStats) -> u64| {
        i.experts
            .per_variant
            .iter()
            .map(|v| (format!("{{variant=\"{}\"}}", v.name), f(v) as f64))
            .collect()
    };
    metric(
        "expert_hits_total",
        "counter",
        "Expert uses served from the GPU cache or memory, by precision.",
        per(|v| v.hits),
    );
    metric(
        "expert_misses_total",
        "counter",
        "Expert uses that needed a load, by precision.",
        per(|v| v.misses),
    );
    metric(
        "expert_bytes_loaded_total",
        "counter",
        "Bytes copied into the expert cache.",
        one(i.experts.bytes_loaded as f64),
    );
    metric(
        "expert_bytes_from_disk_total",
        "counter",
        "Bytes read from the SSD tier.",
        one(i.experts.bytes_from_disk as f64),
    );
    metric(
        "experts_cpu_computed_total",
        "counter",
        "Missed experts computed by CPU helpers.",
        one(i.experts.cpu_computed as f64),
    );
    metric(
        "experts_skipped_total",
        "counter",
        "Routes the precision scorer skipped.",
        one(i.experts.skipped as f64),
    );
}
