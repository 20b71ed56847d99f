//! `hob serve`'s queue and cancellation, in process: the tiny Qwen3-MoE fixture behind a session
//! that sleeps before every forward pass, so that a request is still generating while others
//! arrive. Full queue -> 429 with Retry-After, FIFO order, a client that goes away stops its
//! generation, and stopping the server ends what is in flight.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use common::http;
use hob::cli::engine::{tokenizer, ModelArgs};
use hob::cli::run::chat_template;
use hob::experts::ExpertStats;
use hob::generate::{open_session, Generator, SamplerConfig, Session};
use hob::model::{Logits, Model, ModelConfig};
use hob::serve::{Loaded, Server, ServerConfig};
use serde_json::json;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    m: ModelArgs,
}

/// A session that takes `delay` per forward pass, counting them.
struct Slow<'a> {
    inner: Box<dyn Session + 'a>,
    delay: Duration,
    passes: Arc<AtomicUsize>,
}

impl Session for Slow<'_> {
    fn forward(&mut self, tokens: &[u32], want: Logits) -> hob::Result<&[f32]> {
        std::thread::sleep(self.delay);
        self.passes.fetch_add(1, Ordering::SeqCst);
        self.inner.forward(tokens, want)
    }
    fn pos(&self) -> usize {
        self.inner.pos()
    }
    fn ctx(&self) -> usize {
        self.inner.ctx()
    }
    fn truncate(&mut self, pos: usize) {
        self.inner.truncate(pos)
    }
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn expert_stats(&self) -> ExpertStats {
        self.inner.expert_stats()
    }
    fn reset_stats(&mut self) {
        self.inner.reset_stats()
    }
    fn check_logits(&mut self, on: bool) {
        self.inner.check_logits(on)
    }
}

struct InProcess {
    base: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<hob::Result<()>>>,
    passes: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
}

impl InProcess {
    fn start(queue: usize, delay: Duration) -> InProcess {
        let (dir, path) = common::convert_dir(&common::family_dir("qwen3-moe"), "f16", &[]);
        let server = Server::bind(ServerConfig {
            host: "127.0.0.1".into(),
            port: 0,
            api_key: None,
            model_name: "tiny".into(),
            queue,
            max_body: 1 << 20,
        })
        .unwrap();
        let base = format!("http://{}", server.addr);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let passes = Arc::new(AtomicUsize::new(0));
        let counter = passes.clone();
        let thread = std::thread::spawn(move || {
            let load = Box::new(move |serve: &mut dyn FnMut(Loaded<'_>)| {
                let args = Args::parse_from(["x", "-m", path.to_str().unwrap(), "-t", "1"]);
                let file = args.m.open()?;
                let model = Model::load(&file)?;
                let tok = tokenizer(&file, &model.cfg)?;
                let template = chat_template(&file, &model, &tok, None)?;
                let cfg = args.m.session_config(&file, &model)?;
                let inner = open_session(&model, 256, cfg)?;
                let slow = Slow {
                    inner,
                    delay,
                    passes: counter,
                };
                serve(Loaded {
                    gen: Generator::new(Box::new(slow)),
                    tok,
                    template,
                    defaults: SamplerConfig {
                        temperature: 0.0,
                        ..SamplerConfig::default()
                    },
                    n_predict: None,
                });
                Ok(())
            });
            server.serve(load, async move {
                rx.await.ok();
            })
        });
        let s = InProcess {
            base,
            stop: Some(tx),
            thread: Some(thread),
            passes,
            _dir: dir,
        };
        let started = Instant::now();
        while http::get(&s.url("/health"), &[]).0 != 200 {
            assert!(started.elapsed() < Duration::from_secs(60), "never ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn metric(&self, name: &str) -> f64 {
        let (_, text) = http::get(&self.url("/metrics"), &[]);
        http::metric(text.as_str().unwrap(), name)
    }

    /// Until `name` reaches `value` (panics after 20 s).
    fn wait_metric(&self, name: &str, value: f64) {
        let started = Instant::now();
        while self.metric(name) != value {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{name} never reached {value}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn shut_down(&mut self) -> hob::Result<()> {
        if let Some(tx) = self.stop.take() {
            tx.send(()).ok();
        }
        self.thread.take().map_or(Ok(()), |t| t.join().unwrap())
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.shut_down().ok();
    }
}

fn chat(max_tokens: u32, stream: bool) -> serde_json::Value {
    json!({
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

#[test]
fn a_full_queue_answers_429_and_the_queue_is_first_in_first_out() {
    let s = InProcess::start(2, Duration::from_millis(15));
    let url = s.url("/v1/chat/completions");
    // A generates for a while; B and C wait in the queue; D finds it full.
    let a = {
        let url = url.clone();
        std::thread::spawn(move || http::post_json(&url, &chat(40, false), &[]))
    };
    s.wait_metric("hob_busy", 1.0);
    let finished = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiting = vec![];
    for name in ["B", "C"] {
        let (url, finished) = (url.clone(), finished.clone());
        waiting.push(std::thread::spawn(move || {
            let r = http::post_json(&url, &chat(3, false), &[]);
            finished.lock().unwrap().push(name);
            r
        }));
        // One at a time, so that their order in the queue is known.
        s.wait_metric("hob_queue_length", if name == "B" { 1.0 } else { 2.0 });
    }
    let (status, headers, v) = http::post_raw(&url, chat(3, false).to_string().as_bytes(), &[]);
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    let retry = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("retry-after"))
        .map(|(_, v)| v.parse::<u64>().unwrap());
    assert!(retry.is_some_and(|s| s >= 1), "{headers:?}");
    assert_eq!(a.join().unwrap().0, 200);
    for w in waiting {
        let (status, v) = w.join().unwrap();
        assert_eq!(status, 200, "{v}");
    }
    assert_eq!(*finished.lock().unwrap(), ["B", "C"]);
    assert!(s.metric("hob_queue_wait_seconds{quantile=\"0.99\"}") > 0.0);
}

#[test]
fn a_client_that_goes_away_stops_its_generation_within_a_token() {
    let s = InProcess::start(4, Duration::from_millis(20));
    let mut events = http::stream(&s.url("/v1/chat/completions"), &chat(200, true));
    assert_eq!(events.status, 200);
    for _ in 0..3 {
        events.next().expect("a chunk");
    }
    drop(events);
    s.wait_metric("hob_requests_cancelled_total", 1.0);
    s.wait_metric("hob_busy", 0.0);
    // Stopped long before its 200 tokens (20 ms a token: the client left after ~2).
    let passes = s.passes.load(Ordering::SeqCst);
    assert!(passes < 40, "{passes} forward passes after the client left");
    // The next request is served at once.
    let started = Instant::now();
    let (status, v) = http::post_json(&s.url("/v1/chat/completions"), &chat(2, false), &[]);
    assert_eq!(status, 200, "{v}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn stopping_the_server_ends_requests_in_flight() {
    let mut s = InProcess::start(4, Duration::from_millis(20));
    let mut events = http::stream(&s.url("/v1/chat/completions"), &chat(200, true));
    events.next().expect("a chunk");
    let started = Instant::now();
    s.shut_down().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    // The stream ends (with an error event rather than [DONE]).
    let rest: Vec<String> = events.collect();
    assert!(rest.len() < 150, "{} events after the stop", rest.len());
    assert_ne!(rest.last().map(String::as_str), Some("[DONE]"), "{rest:?}");
}
