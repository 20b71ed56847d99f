//! `hob serve` in process: the tiny Qwen3-MoE fixture behind a session that sleeps before every
//! forward pass, so that a request is still generating while others arrive (full queue -> 429
//! with Retry-After, FIFO order, a client that goes away stops its generation, stopping the
//! server ends what is in flight), or whose logits follow a script, so that the model "answers"
//! with a known text (tool calls end to end).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use common::http;
use hob::cli::engine::{tokenizer, ModelArgs};
use hob::cli::run::chat_template;
use hob::experts::ExpertStats;
use hob::generate::{open_session, Generator, Grammars, SamplerConfig, Session};
use hob::model::{Logits, Model, ModelConfig};
use hob::serve::{Loaded, Server, ServerConfig};
use serde_json::json;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    m: ModelArgs,
}

/// A session that takes `delay` per forward pass, counting them; with a script, each answer's
/// logits pick the script's tokens in turn (then the end of sequence).
struct Slow<'a> {
    inner: Box<dyn Session + 'a>,
    delay: Duration,
    passes: Arc<AtomicUsize>,
    script: Vec<u32>,
    eos: u32,
    /// Script position: reset when a request starts (the generator truncates the cache).
    at: usize,
    logits: Vec<f32>,
}

impl Session for Slow<'_> {
    fn forward(&mut self, tokens: &[u32], want: Logits) -> hob::Result<&[f32]> {
        std::thread::sleep(self.delay);
        self.passes.fetch_add(1, Ordering::SeqCst);
        let real = self.inner.forward(tokens, want)?;
        if self.script.is_empty() || matches!(want, Logits::None) {
            return Ok(real);
        }
        self.logits = vec![-1e9; real.len()];
        let next = self.script.get(self.at).copied().unwrap_or(self.eos);
        self.logits[next as usize] = 0.0;
        self.at += 1;
        Ok(&self.logits)
    }
    fn pos(&self) -> usize {
        self.inner.pos()
    }
    fn ctx(&self) -> usize {
        self.inner.ctx()
    }
    fn truncate(&mut self, pos: usize) {
        self.at = 0;
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
    _dirs: Vec<tempfile::TempDir>,
}

/// A tiny fixture converted, with `template` as its chat template if given.
fn model(family: &str, template: Option<&str>) -> (Vec<tempfile::TempDir>, std::path::PathBuf) {
    let src = common::family_dir(family);
    let Some(template) = template else {
        let (dir, path) = common::convert_dir(&src, "f16", &[]);
        return (vec![dir], path);
    };
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("src");
    common::copy_checkpoint(&src, &copy);
    let cfg_path = copy.join("tokenizer_config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["chat_template"] = json!(template);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    // Room for a tool prompt in the tiny vocabulary's many short tokens.
    let config = copy.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    c["max_position_embeddings"] = json!(2048);
    std::fs::write(&config, c.to_string()).unwrap();
    let (out_dir, path) = common::convert_dir(&copy, "f16", &[]);
    (vec![dir, out_dir], path)
}

impl InProcess {
    fn start(queue: usize, delay: Duration) -> InProcess {
        InProcess::start_with(queue, delay, None, "")
    }

    /// With `template` as the model's chat template, and answers that spell `script`.
    fn start_with(
        queue: usize,
        delay: Duration,
        template: Option<&str>,
        script: &str,
    ) -> InProcess {
        InProcess::start_family("qwen3-moe", (queue, delay), template, script)
    }

    /// The tiny fixture of `family`, with a queue of `queue` and `delay` per forward pass.
    fn start_family(
        family: &str,
        (queue, delay): (usize, Duration),
        template: Option<&str>,
        script: &str,
    ) -> InProcess {
        let (dir, path) = model(family, template);
        let script = script.to_owned();
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
                let harmony = hob::generate::harmony::Channels::new(&tok);
                let template = chat_template(&file, &model, &tok, None)?;
                let json = file
                    .metadata()
                    .get_str(hob::format::keys::TOKENIZER_HF_JSON)?;
                let grammars = Grammars::new(json, model.cfg.vocab, model.cfg.eos.unwrap())?;
                let cfg = args.m.session_config(&file, &model)?;
                let inner = open_session(&model, model.cfg.context_length.min(2048), cfg)?;
                let slow = Slow {
                    inner,
                    delay,
                    passes: counter,
                    script: tok.encode(&script, false)?,
                    eos: tok
                        .token_to_id("<|im_end|>")
                        .or_else(|_| tok.token_to_id("<|return|>"))?,
                    at: 0,
                    logits: Vec::new(),
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
                    grammars: Some(grammars),
                    harmony,
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
            _dirs: dir,
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

fn tool_fixture() -> serde_json::Value {
    let path = common::paths::repo_root().join("tests/fixtures/serve/qwen3-tools.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The model answers with two Hermes-style calls after a sentence: the response carries them as
/// OpenAI tool_calls (arguments as JSON text), streamed or not; broken JSON stays text.
#[test]
fn tool_calls_come_back_as_openai_tool_calls() {
    let f = tool_fixture();
    let answer = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"local_time\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    let s = InProcess::start_with(4, Duration::ZERO, f["template"].as_str(), answer);
    let url = s.url("/v1/chat/completions");
    let body = json!({
        "messages": [{"role": "user", "content": "Weather and time in Oslo?"}],
        "tools": f["tools"],
    });
    let (status, v) = http::post_json(&url, &body, &[]);
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], "Let me look.\n", "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{v}");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: serde_json::Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Oslo"}));
    assert_eq!(calls[1]["function"]["name"], "local_time");
    assert_ne!(calls[0]["id"], calls[1]["id"]);

    // Streamed: the sentence as content deltas, then a delta per call, then the finish.
    let mut body = body;
    body["stream"] = json!(true);
    let chunks: Vec<serde_json::Value> = http::stream(&url, &body)
        .filter(|e| e != "[DONE]")
        .map(|e| serde_json::from_str(&e).unwrap())
        .collect();
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "Let me look.\n");
    let deltas: Vec<&serde_json::Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
        .collect();
    assert_eq!(deltas.len(), 2);
    assert_eq!(deltas[1][0]["index"], 1);
    assert_eq!(deltas[1][0]["function"]["name"], "local_time");
    let last = &chunks.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], "tool_calls");

    // The conversation goes on with the results (the fixture's round trip renders as
    // transformers renders it: tests/cli_serve.rs); the same script answers again.
    let (status, v) = http::post_json(
        &url,
        &json!({"messages": f["messages"], "tools": f["tools"], "tool_choice": "auto"}),
        &[],
    );
    assert_eq!(status, 200, "{v}");
}

#[test]
fn a_broken_tool_call_is_text_not_an_error() {
    let f = tool_fixture();
    let answer =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>";
    let s = InProcess::start_with(4, Duration::ZERO, f["template"].as_str(), answer);
    let body = json!({
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": f["tools"],
    });
    let (status, v) = http::post_json(&s.url("/v1/chat/completions"), &body, &[]);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], answer, "{v}");
    assert!(
        v["choices"][0]["message"].get("tool_calls").is_none(),
        "{v}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
}

/// tool_choice naming a function opens the answer with its call: the model writes only the
/// arguments.
#[test]
fn a_named_tool_choice_forces_that_call() {
    let f = tool_fixture();
    let s = InProcess::start_with(
        4,
        Duration::ZERO,
        f["template"].as_str(),
        "{\"city\": \"Rome\"}}\n</tool_call>",
    );
    let body = json!({
        "messages": [{"role": "user", "content": "Weather in Rome?"}],
        "tools": f["tools"],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    });
    let (status, v) = http::post_json(&s.url("/v1/chat/completions"), &body, &[]);
    assert_eq!(status, 200, "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{v}");
    assert_eq!(call["arguments"], r#"{"city":"Rome"}"#, "{v}");
    assert!(v["choices"][0]["message"]["content"].is_null(), "{v}");
    // A template without a tool format, an unknown function: 400 naming the field.
    let bad = json!({
        "messages": [{"role": "user", "content": "x"}],
        "tools": f["tools"],
        "tool_choice": {"type": "function", "function": {"name": "launch"}},
    });
    let (status, v) = http::post_json(&s.url("/v1/chat/completions"), &bad, &[]);
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("tool_choice")),
        "{v}"
    );
    let plain = InProcess::start(4, Duration::ZERO);
    let (status, v) = http::post_json(&plain.url("/v1/chat/completions"), &body, &[]);
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("tools")),
        "{v}"
    );
}

/// A forced call is constrained to the function's parameters schema: even the random model's
/// answer parses as a call whose arguments the schema accepts (strings bounded here: a random
/// model never ends one by itself).
#[test]
fn forced_tool_calls_parse_even_from_a_random_model() {
    let f = tool_fixture();
    let s = InProcess::start_with(4, Duration::ZERO, f["template"].as_str(), "");
    let city = json!({"type": "string", "maxLength": 6});
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": city, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "local_time", "parameters": {"type": "object",
            "properties": {"city": city}, "required": ["city"], "additionalProperties": false}}},
    ]);
    for (seed, choice) in [
        (
            1,
            json!({"type": "function", "function": {"name": "get_weather"}}),
        ),
        (2, json!("required")),
        (3, json!("required")),
    ] {
        let body = json!({
            "messages": [{"role": "user", "content": "Weather in Rome?"}],
            "tools": tools, "tool_choice": choice,
            "temperature": 1.0, "seed": seed, "max_tokens": 400,
        });
        let (status, v) = http::post_json(&s.url("/v1/chat/completions"), &body, &[]);
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
        let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
        let name = call["name"].as_str().unwrap();
        assert!(["get_weather", "local_time"].contains(&name), "{v}");
        let args: serde_json::Value =
            serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert!(args["city"].is_string(), "{v}");
        if let Some(unit) = args.get("unit") {
            assert!(unit == "celsius" || unit == "fahrenheit", "{v}");
        }
    }
}

/// gpt-oss calls a tool with a message to `functions.NAME` on the commentary channel: it comes
/// back as OpenAI's tool_calls (finish_reason tool_calls), its reasoning as reasoning_content;
/// the tools reach the prompt through the harmony template; "required" is refused by field.
#[test]
fn a_harmony_tool_call_comes_back_as_tool_calls() {
    let answer = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant\
                  <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                  {\"city\": \"Rome\"}";
    let s = InProcess::start_family("gpt-oss", (4, Duration::ZERO), None, answer);
    let url = s.url("/v1/chat/completions");
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather.", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}}}}]);
    let body = json!({"messages": [{"role": "user", "content": "Weather in Rome?"}],
        "tools": tools});
    let (status, v) = http::post_json(&url, &body, &[]);
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{v}");
    assert_eq!(call["arguments"], "{\"city\": \"Rome\"}", "{v}");
    assert_eq!(
        choice["message"]["reasoning_content"], "Need the weather.",
        "{v}"
    );

    let mut required = body.clone();
    required["tool_choice"] = json!("required");
    let (status, v) = http::post_json(&url, &required, &[]);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "tool_choice", "{v}");
}

/// A named tool_choice opens the answer with the call's header; the tiny gpt-oss (weights, not a
/// script) then writes arguments its schema accepts.
#[test]
fn a_named_harmony_tool_choice_forces_that_call() {
    let s = InProcess::start_family("gpt-oss", (4, Duration::ZERO), None, "");
    let city = json!({"type": "string", "maxLength": 6});
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters":
        {"type": "object", "properties": {"city": city}, "required": ["city"],
         "additionalProperties": false}}}]);
    let body = json!({"messages": [{"role": "user", "content": "Weather in Rome?"}],
        "tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "temperature": 1.0, "seed": 5, "max_tokens": 200});
    let (status, v) = http::post_json(&s.url("/v1/chat/completions"), &body, &[]);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{v}");
    let args: serde_json::Value =
        serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string(), "{v}");
}

/// gpt-oss answers in harmony channels: the final channel is the message's content, the
/// analysis channel its reasoning_content (as llama.cpp's server and vLLM send it), streamed
/// or not; the channel headers are neither.
#[test]
fn a_harmony_answer_splits_into_content_and_reasoning() {
    let answer = "<|channel|>analysis<|message|>They want a capital.<|end|><|start|>assistant\
                  <|channel|>final<|message|>Rome.";
    let s = InProcess::start_family("gpt-oss", (4, Duration::ZERO), None, answer);
    let url = s.url("/v1/chat/completions");
    let body = json!({"messages": [{"role": "user", "content": "Capital of Italy?"}]});
    let (status, v) = http::post_json(&url, &body, &[]);
    assert_eq!(status, 200, "{v}");
    let message = &v["choices"][0]["message"];
    assert_eq!(message["content"], "Rome.", "{v}");
    assert_eq!(message["reasoning_content"], "They want a capital.", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");

    let mut body = body;
    body["stream"] = json!(true);
    let chunks: Vec<serde_json::Value> = http::stream(&url, &body)
        .filter(|e| e != "[DONE]")
        .map(|e| serde_json::from_str(&e).unwrap())
        .collect();
    let joined = |field: &str| -> String {
        chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"][field].as_str())
            .collect()
    };
    assert_eq!(joined("content"), "Rome.");
    assert_eq!(joined("reasoning_content"), "They want a capital.");

    // A raw completion is not a chat turn: its text comes back whole.
    let (status, v) = http::post_json(
        &s.url("/v1/completions"),
        &json!({"prompt": "<|start|>assistant", "max_tokens": 40}),
        &[],
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["choices"][0]["text"], "analysisThey want a capital.assistantfinalRome.",
        "{v}"
    );
}
