//! `hob serve` on the tiny Qwen3-MoE fixture (ChatML template): answers equal `hob run`'s,
//! streaming equals the whole answer, the KV cache is reused across turns, stop sequences, and
//! bad requests get OpenAI's error shape with the right status and field.

mod common;

use common::http::{self, Served};
use serde_json::{json, Value};

fn fixture() -> (tempfile::TempDir, std::path::PathBuf) {
    common::convert_dir(&common::family_dir("qwen3-moe"), "f16", &[])
}

fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content in {v}"))
        .to_string()
}

/// `hob run --temp 0` of one user message (chat mode), its stdout without the final newline.
fn hob_run(model: &std::path::Path, args: &[&str]) -> String {
    let mut all = vec![
        "run",
        "-m",
        model.to_str().unwrap(),
        "--temp",
        "0",
        "-t",
        "1",
    ];
    all.extend_from_slice(args);
    let (ok, stdout, stderr) = common::hob(&all);
    assert!(ok, "{stderr}");
    stdout.strip_suffix('\n').unwrap_or(&stdout).to_string()
}

#[test]
fn greedy_answers_equal_hob_run_streamed_or_not() {
    let (_dir, model) = fixture();
    let s = Served::start(&model, &[]);
    let run_text = hob_run(&model, &["-p", "Hello there", "-n", "20"]);
    let body = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hello there"}],
        "temperature": 0,
        "max_tokens": 20,
    });
    let (status, v) = s.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(content(&v), run_text, "{v}");
    assert_eq!(v["object"], "chat.completion");
    let usage = &v["usage"];
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=20).contains(&completion), "{v}");
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert_eq!(finish, if completion == 20 { "length" } else { "stop" });
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + completion
    );
    // The engine over the answer (the chat page's panel): every routed expert of every decoded
    // token (2 layers, top-4) served in f16.
    let f16 = &v["timings"]["experts"]["by_precision"]["f16"];
    assert_eq!(f16["hits"].as_u64(), Some(completion * 2 * 4), "{v}");

    // The same request streamed: a role chunk, content deltas, the finish, usage, [DONE].
    let mut body = body;
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let events: Vec<String> = http::stream(&s.url("/v1/chat/completions"), &body).collect();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, run_text);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"]["completion_tokens"].as_u64(),
        Some(completion)
    );
    let ends: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?.get("finish_reason"))
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(ends, [&json!(finish)]);
    // The second, identical request found its whole prompt in the KV cache but the last token.
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        last["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(prompt - 1)
    );
}

#[test]
fn text_completions_equal_hob_run_without_the_template() {
    let (_dir, model) = fixture();
    let s = Served::start(&model, &[]);
    let run_text = hob_run(&model, &["--no-chat", "-p", "Once upon a time", "-n", "12"]);
    let (status, v) = s.post(
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "temperature": 0, "max_tokens": 12}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"].as_str(), Some(run_text.as_str()));
    // llama.cpp server's ignore_eos: exactly max_tokens, whatever the model samples.
    let (_, v) = s.post(
        "/v1/completions",
        &json!({"prompt": "Once", "max_tokens": 40, "ignore_eos": true, "seed": 3}),
    );
    assert_eq!(v["usage"]["completion_tokens"], 40, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    let streamed: String = http::stream(
        &s.url("/v1/completions"),
        &json!({"prompt": ["Once upon a time"], "temperature": 0, "max_tokens": 12, "stream": true}),
    )
    .filter(|e| e != "[DONE]")
    .map(|e| {
        let v: Value = serde_json::from_str(&e).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_string()
    })
    .collect();
    assert_eq!(streamed, run_text);
}

#[test]
fn a_second_turn_prefills_only_what_is_new() {
    let (_dir, model) = fixture();
    let s = Served::start(&model, &[]);
    let mut messages = vec![json!({"role": "user", "content": "What is the capital of France?"})];
    let ask = |messages: &Vec<Value>| {
        let (status, v) = s.post(
            "/v1/chat/completions",
            &json!({"messages": messages, "temperature": 0, "max_tokens": 8}),
        );
        assert_eq!(status, 200, "{v}");
        v
    };
    let first = ask(&messages);
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // (The tiny model's own answer is often not valid UTF-8, which no tokenizer gives back.)
    messages.push(json!({"role": "assistant", "content": "Paris."}));
    messages.push(json!({"role": "user", "content": "And of Italy?"}));
    let second = ask(&messages);
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let first_prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached >= first_prompt,
        "the history was prefilled again: {second}"
    );
}

#[test]
fn a_stop_sequence_ends_the_answer_before_it() {
    let (_dir, model) = fixture();
    let s = Served::start(&model, &[]);
    let body =
        |stop: Value| json!({"prompt": "The", "temperature": 0, "max_tokens": 24, "stop": stop});
    let (_, v) = s.post("/v1/completions", &body(Value::Null));
    let whole = v["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<char> = whole.chars().collect();
    assert!(chars.len() >= 8, "too short to cut: {whole:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let before = &whole[..whole.find(&stop).unwrap()];
    let (status, v) = s.post("/v1/completions", &body(json!(["never in it", stop])));
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["choices"][0]["text"].as_str(),
        Some(before),
        "stop {stop:?}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let streamed: String = http::stream(
        &s.url("/v1/completions"),
        &json!({"prompt": "The", "temperature": 0, "max_tokens": 24, "stop": stop, "stream": true}),
    )
    .filter(|e| e != "[DONE]")
    .map(|e| {
        let v: Value = serde_json::from_str(&e).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_string()
    })
    .collect();
    assert_eq!(streamed, before);
}

/// (status, error.param, error.code, a word of error.message) of each bad request.
#[test]
fn bad_requests_get_openai_errors_naming_the_field() {
    let (_dir, model) = fixture();
    let s = Served::start(&model, &["--max-body", "1", "-c", "64"]);
    let user = json!([{"role": "user", "content": "hi"}]);
    let cases: Vec<(Value, u16, Value, Value, &str)> = vec![
        (
            json!({"messages": user, "temperature": "hot"}),
            400,
            json!("temperature"),
            json!(null),
            "invalid type",
        ),
        (
            json!({"messages": user, "temperature": 3}),
            400,
            json!("temperature"),
            json!(null),
            "[0, 2]",
        ),
        (
            json!({"messages": user, "top_p": 0}),
            400,
            json!("top_p"),
            json!(null),
            "(0, 1]",
        ),
        (
            json!({"messages": user, "max_tokens": 0}),
            400,
            json!("max_tokens"),
            json!(null),
            "at least 1",
        ),
        (
            json!({"messages": user, "n": 2}),
            400,
            json!("n"),
            json!(null),
            "one choice",
        ),
        (
            json!({"messages": []}),
            400,
            json!("messages"),
            json!(null),
            "at least one",
        ),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            400,
            json!("messages[0].role"),
            json!(null),
            "wizard",
        ),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            400,
            json!("messages[0].content"),
            json!(null),
            "content parts",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            400,
            json!("messages[0].content[0]"),
            json!(null),
            "text parts",
        ),
        (
            json!({"messages": user, "stop": 7}),
            400,
            json!("stop"),
            json!(null),
            "list of strings",
        ),
        (
            json!({"prompt": "x"}),
            400,
            json!("messages"),
            json!(null),
            "missing field",
        ),
        (
            json!({"messages": user, "model": "gpt-4"}),
            404,
            json!("model"),
            json!("model_not_found"),
            "gpt-4",
        ),
        (
            json!({"messages": [{"role": "user", "content": "word ".repeat(80)}]}),
            400,
            json!("messages"),
            json!("context_length_exceeded"),
            "context holds 64",
        ),
    ];
    for (body, status, param, code, needle) in cases {
        let (got, v) = s.post("/v1/chat/completions", &body);
        let e = &v["error"];
        assert_eq!(got, status, "{body} -> {v}");
        assert_eq!(e["param"], param, "{body} -> {v}");
        assert_eq!(e["code"], code, "{body} -> {v}");
        let message = e["message"].as_str().unwrap();
        assert!(
            message.contains(needle),
            "{body} -> {message:?} lacks {needle:?}"
        );
        assert!(e["type"].is_string(), "{v}");
    }
    // Not JSON, not an object, too large, a token id outside the vocabulary, no such route.
    let url = s.url("/v1/chat/completions");
    let (status, _, v) = http::post_raw(&url, b"{\"messages\": [", &[]);
    assert_eq!(
        (
            status,
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("not valid JSON")
        ),
        (400, true),
        "{v}"
    );
    let (status, _, v) = http::post_raw(&url, b"[1, 2]", &[]);
    assert_eq!(status, 400, "{v}");
    let (status, v) = http::announce_large_body(&s.base, "/v1/chat/completions", 2 << 20);
    assert_eq!(status, 413, "{v}");
    assert!(v["error"].is_object(), "{v}");
    let (status, v) = s.post("/v1/completions", &json!({"prompt": [1, 2, 100000]}));
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("prompt")),
        "{v}"
    );
    let (status, v) = http::get(&s.url("/v1/nothing"), &[]);
    assert_eq!(status, 404, "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
    // The server is still answering after all that.
    let (status, v) = s.post(
        "/v1/chat/completions",
        &json!({"messages": user, "max_tokens": 2}),
    );
    assert_eq!(status, 200, "{v}");
}

#[test]
fn an_api_key_guards_everything_but_health_and_the_page() {
    let (_dir, model) = fixture();
    let s = Served::start(&model, &["--api-key", "sesame", "--alias", "tiny-qwen"]);
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let url = s.url("/v1/chat/completions");
    let (status, v) = http::post_json(&url, &body, &[]);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (401, Some("invalid_api_key")),
        "{v}"
    );
    let (status, v) = http::post_json(&url, &body, &[("Authorization", "Bearer nope")]);
    assert_eq!(status, 401, "{v}");
    let key = [("Authorization", "Bearer sesame")];
    let (status, v) = http::post_json(&url, &body, &key);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["model"], "tiny-qwen");
    let (status, v) = http::get(&s.url("/v1/models"), &[]);
    assert_eq!(status, 401, "{v}");
    let (status, v) = http::get(&s.url("/v1/models"), &key);
    assert_eq!(
        (status, v["data"][0]["id"].as_str()),
        (200, Some("tiny-qwen")),
        "{v}"
    );
    let (status, v) = http::get(&s.url("/health"), &[]);
    assert_eq!((status, v["status"].as_str()), (200, Some("ok")), "{v}");
    let (status, page) = http::get(&s.url("/"), &[]);
    assert_eq!(status, 200);
    assert!(page.as_str().unwrap().contains("/v1/chat/completions"));
    let (status, text) = http::get(&s.url("/metrics"), &key);
    assert_eq!(status, 200);
    let text = text.as_str().unwrap();
    // chat and models with the key, health, the page.
    assert_eq!(
        http::metric(text, "hob_requests_total{status=\"200\"}"),
        4.0,
        "{text}"
    );
    assert_eq!(
        http::metric(text, "hob_requests_total{status=\"401\"}"),
        3.0,
        "{text}"
    );
    assert!(
        http::metric(text, "hob_completion_tokens_total") >= 1.0,
        "{text}"
    );
    assert_eq!(http::metric(text, "hob_queue_length"), 0.0, "{text}");
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let (_dir, model) = fixture();
    let mut s = Served::start(&model, &[]);
    let pid = s.child.id() as libc::pid_t;
    // SAFETY: kill(2) on the child's pid, which this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", s.log());
    // The log's reader thread may still be reading the last lines.
    let log = s.log_with("stopping");
    assert!(log.contains("stopping"), "{log}");
}

/// A tool conversation (tools, an assistant's calls, their results) renders through Qwen3's real
/// template as transformers renders it (tools/make_tool_chat_fixture.py), from the JSON an OpenAI
/// client sends.
#[test]
fn tool_conversations_render_as_transformers_renders_them() {
    use hob::generate::{ChatTemplate, Message};
    let path = common::paths::repo_root().join("tests/fixtures/serve/qwen3-tools.json");
    let f: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let t = ChatTemplate::new(f["template"].as_str().unwrap(), "", "<|im_end|>").unwrap();
    let messages: Vec<Message> = f["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| Message {
            role: m["role"].as_str().unwrap().into(),
            content: m["content"].as_str().unwrap_or("").into(),
            extra: ["tool_calls", "tool_call_id"]
                .iter()
                .filter_map(|k| Some((k.to_string(), m.get(*k)?.clone())))
                .collect(),
        })
        .collect();
    let mut vars = serde_json::Map::new();
    vars.insert("tools".into(), f["tools"].clone());
    let text = t.render_with(&messages, true, &vars).unwrap();
    assert_eq!(text, f["text"].as_str().unwrap());
}

/// response_format: whatever the (random) model samples, the answer is JSON that the schema
/// accepts; json_object gives an object; a schema that does not compile is a 400.
#[test]
fn structured_output_follows_the_schema() {
    let (_dir, model) = fixture();
    let s = Served::start(&model, &[]);
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        },
        "required": ["name", "age"],
        "additionalProperties": false,
    });
    let format =
        json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema}});
    for seed in 0..4 {
        let body = json!({
            "messages": [{"role": "user", "content": "A person, please."}],
            "max_tokens": 200, "temperature": 1.0, "seed": seed, "response_format": format,
        });
        let (status, v) = s.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{v}");
        let text = content(&v);
        let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        let o = answer.as_object().unwrap();
        assert!(
            o.keys()
                .all(|k| ["name", "age", "tags"].contains(&k.as_str())),
            "{text}"
        );
        assert!(o["name"].as_str().unwrap().chars().count() <= 8, "{text}");
        assert!((0..=120).contains(&o["age"].as_i64().unwrap()), "{text}");
        if let Some(tags) = o.get("tags") {
            let tags = tags.as_array().unwrap();
            assert!(
                tags.len() <= 3 && tags.iter().all(|t| t == "a" || t == "b"),
                "{text}"
            );
        }
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    }
    let body = json!({
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 100, "seed": 1,
        "response_format": {"type": "json_object"}, "stream": true,
    });
    let streamed: String = http::stream(&s.url("/v1/chat/completions"), &body)
        .filter(|e| e != "[DONE]")
        .filter_map(|e| {
            let v: Value = serde_json::from_str(&e).unwrap();
            Some(
                v["choices"].get(0)?["delta"]["content"]
                    .as_str()?
                    .to_string(),
            )
        })
        .collect();
    let answer: Value =
        serde_json::from_str(&streamed).unwrap_or_else(|e| panic!("{e}: {streamed:?}"));
    assert!(answer.is_object(), "{streamed}");
    for bad in [
        json!({"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}),
        json!({"type": "json_schema"}),
        json!({"type": "yaml"}),
    ] {
        let body = json!({"messages": [{"role": "user", "content": "x"}], "response_format": bad});
        let (status, v) = s.post("/v1/chat/completions", &body);
        assert_eq!(
            (status, v["error"]["param"].as_str()),
            (400, Some("response_format")),
            "{v}"
        );
    }
}

/// Start-up failures are errors that say what and where, and the process exits.
#[test]
fn start_up_errors_name_the_cause() {
    let (_dir, model) = fixture();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let m = model.to_str().unwrap();
    let missing = model.with_file_name("missing.hob");
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["serve", "-m", m, "--port", &port],
            format!("cannot listen on 127.0.0.1:{port}"),
        ),
        (
            vec!["serve", "-m", missing.to_str().unwrap(), "--port", "0"],
            "missing.hob".into(),
        ),
        (vec!["serve", "-m", m, "--queue", "0"], "--queue".into()),
        (
            vec!["serve", "-m", m, "--host", "not a host", "--port", "0"],
            "cannot listen on not a host".into(),
        ),
    ];
    for (args, needle) in cases {
        let (ok, _, stderr) = common::hob(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(stderr.contains(&needle), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// llama-server's habits: -np and -cb are ignored with a note, --embedding is refused by name.
#[test]
fn llama_server_flags_are_ignored_or_refused_by_name() {
    let (_dir, model) = fixture();
    let m = model.to_str().unwrap();
    let s = Served::start(&model, &["-np", "4", "-cb"]);
    let log = s.log();
    assert!(
        log.contains("-np") && log.contains("one request at a time"),
        "{log}"
    );
    let (ok, _, stderr) = common::hob(&["serve", "-m", m, "--embedding"]);
    assert!(
        !ok && stderr.contains("--embedding") && stderr.contains("no embeddings"),
        "{stderr}"
    );
}
