//! The HTTP routes: OpenAI's chat and text completions (JSON or server-sent events), the model
//! list, health, metrics and the chat page.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request as HttpRequest, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::api::{self, ApiError, Request};
use super::metrics::Metrics;
use super::tools::ToolCall;
use super::worker::{Event, Finish, Job, Usage};
use super::ServerConfig;

pub struct AppState {
    pub cfg: ServerConfig,
    /// The generation thread's queue; None once the server stops.
    pub jobs: Mutex<Option<crossbeam_channel::Sender<Job>>>,
    /// The model is loaded and requests are taken.
    pub ready: AtomicBool,
    pub metrics: Arc<Metrics>,
    /// Every job's cancel flag, raised when the server stops.
    cancels: Mutex<Vec<Weak<AtomicBool>>>,
    created: u64,
    next_id: AtomicU64,
}

impl AppState {
    pub fn new(
        cfg: ServerConfig,
        jobs: crossbeam_channel::Sender<Job>,
        metrics: Arc<Metrics>,
    ) -> Self {
        AppState {
            cfg,
            jobs: Mutex::new(Some(jobs)),
            ready: AtomicBool::new(false),
            metrics,
            cancels: Mutex::new(Vec::new()),
            created: unix_now(),
            next_id: AtomicU64::new(0),
        }
    }

    /// Stop taking requests and end the ones in flight (their generation stops within a token).
    pub fn stop(&self) {
        if let Ok(mut j) = self.jobs.lock() {
            j.take();
        }
        if let Ok(c) = self.cancels.lock() {
            for flag in c.iter().filter_map(Weak::upgrade) {
                flag.store(true, Ordering::SeqCst);
            }
        }
    }

    fn id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        format!("{prefix}-{:x}{n:04x}", t & 0xffff_ffff_ffff)
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.cfg.max_body;
    Router::new()
        .route("/", get(page))
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .with_state(state)
}

/// Every response counted by status; a body announced larger than the limit refused before it
/// is read.
async fn count(State(st): State<Arc<AppState>>, req: HttpRequest, next: Next) -> Response {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let r = match announced {
        Some(n) if n > st.cfg.max_body as u64 => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the body is {n} bytes, more than this server takes ({} bytes: --max-body)",
                st.cfg.max_body
            ),
        )
        .into_response(),
        _ => next.run(req).await,
    };
    st.metrics.responded(r.status().as_u16());
    r
}

async fn page() -> Html<&'static str> {
    Html(include_str!("page.html"))
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such route; hob serves /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics and / (a chat page)")
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.ready.load(Ordering::SeqCst) {
        Json(json!({"status": "ok"})).into_response()
    } else {
        loading().into_response()
    }
}

fn loading() -> ApiError {
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the model is loading")
    }
}

async fn metrics(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        return e.into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}

async fn models(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorize(&st, &headers) {
        return e.into_response();
    }
    Json(json!({"object": "list", "data": [{
        "id": st.cfg.model_name,
        "object": "model",
        "created": st.created,
        "owned_by": "hob",
    }]}))
    .into_response()
}

/// `Authorization: Bearer KEY` when the server has a key.
fn authorize(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &st.cfg.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(k) if k.trim() == key => Ok(()),
        Some(_) => {
            Err(ApiError::new(StatusCode::UNAUTHORIZED, "invalid API key")
                .with_code("invalid_api_key"))
        }
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this server needs an API key: send the header Authorization: Bearer KEY",
        )
        .with_code("invalid_api_key")),
    }
}

#[derive(Clone, Copy)]
enum Endpoint {
    Chat,
    Text,
}

async fn chat(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(st, headers, body, Endpoint::Chat).await
}

async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(st, headers, body, Endpoint::Text).await
}

async fn complete(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    ep: Endpoint,
) -> Response {
    match start(st, &headers, body, ep).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Raises a job's cancel flag when the response (or its stream) is dropped: the client went away.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What every chunk and answer names.
struct Meta {
    id: String,
    created: u64,
    model: String,
    ep: Endpoint,
    include_usage: bool,
}

async fn start(
    st: Arc<AppState>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    ep: Endpoint,
) -> Result<Response, ApiError> {
    authorize(&st, headers)?;
    let bytes = body.map_err(|r| ApiError::new(r.status(), r.body_text()))?;
    let v = api::json_object(&bytes)?;
    let req = match ep {
        Endpoint::Chat => api::chat_request(&v)?,
        Endpoint::Text => api::completion_request(&v)?,
    };
    check_model(&st, req.model.as_deref())?;
    if !st.ready.load(Ordering::SeqCst) {
        return Err(loading());
    }
    let (tx, mut rx) = unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let guard = CancelOnDrop(cancel.clone());
    let meta = Meta {
        id: st.id(match ep {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Text => "cmpl",
        }),
        created: unix_now(),
        model: st.cfg.model_name.clone(),
        ep,
        include_usage: req.include_usage,
    };
    let stream = req.stream;
    enqueue(&st, req, tx, &cancel)?;
    match rx.recv().await {
        Some(Event::Started) => {}
        Some(Event::Failed(e)) => return Err(e),
        Some(_) | None => return Err(stopping()),
    }
    if stream {
        return Ok(sse(rx, guard, meta));
    }
    let (mut text, mut reasoning) = (String::new(), String::new());
    let mut calls = Vec::new();
    loop {
        match rx.recv().await {
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Reasoning(t)) => reasoning.push_str(&t),
            Some(Event::ToolCalls(c)) => calls = c,
            Some(Event::Done(finish, usage)) => {
                drop(guard);
                let whole = answer(&meta, (&text, &reasoning, &calls), finish, &usage);
                return Ok(Json(whole).into_response());
            }
            Some(Event::Failed(e)) => return Err(e),
            Some(Event::Started) => {}
            None => return Err(stopping()),
        }
    }
}

fn stopping() -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping")
}

/// The request's model must be this server's (or left out).
fn check_model(st: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        None | Some("") => Ok(()),
        Some(m) if m == st.cfg.model_name => Ok(()),
        Some(m) => Err(ApiError {
            param: Some("model".into()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "the model `{m}` does not exist: this server serves `{}`",
                    st.cfg.model_name
                ),
            )
            .with_code("model_not_found")
        }),
    }
}

/// Into the bounded queue, or 429 when it is full.
fn enqueue(
    st: &AppState,
    request: Request,
    events: tokio::sync::mpsc::UnboundedSender<Event>,
    cancel: &Arc<AtomicBool>,
) -> Result<(), ApiError> {
    let jobs = st.jobs.lock().map_err(|_| stopping())?;
    let Some(jobs) = jobs.as_ref() else {
        return Err(stopping());
    };
    if let Ok(mut c) = st.cancels.lock() {
        c.retain(|w| w.strong_count() > 0);
        c.push(Arc::downgrade(cancel));
    }
    st.metrics.queued.fetch_add(1, Ordering::SeqCst);
    let job = Job {
        request,
        events,
        cancel: cancel.clone(),
        queued: Instant::now(),
    };
    match jobs.try_send(job) {
        Ok(()) => Ok(()),
        Err(e) => {
            st.metrics.queued.fetch_sub(1, Ordering::SeqCst);
            Err(match e {
                crossbeam_channel::TrySendError::Full(_) => ApiError {
                    retry_after: Some(retry_after(st)),
                    ..ApiError::new(
                        StatusCode::TOO_MANY_REQUESTS,
                        format!(
                            "the queue is full ({} requests waiting): try again later",
                            st.cfg.queue
                        ),
                    )
                },
                crossbeam_channel::TrySendError::Disconnected(_) => stopping(),
            })
        }
    }
}

/// Seconds until a slot is likely: the median queue wait, at least one.
fn retry_after(st: &AppState) -> u64 {
    st.metrics.wait_quantile(0.5).ceil().max(1.0) as u64
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// llama.cpp server's `timings` beside OpenAI's fields (clients ignore it).
fn timings_json(u: &Usage) -> Value {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let rate = |n: usize, d: std::time::Duration| {
        if d.as_secs_f64() > 0.0 {
            n as f64 / d.as_secs_f64()
        } else {
            0.0
        }
    };
    let prefilled = u.prompt_tokens - u.cached_tokens;
    let e = &u.experts;
    let per: serde_json::Map<String, Value> = e
        .per_variant
        .iter()
        .map(|v| (v.name.clone(), json!({"hits": v.hits, "misses": v.misses})))
        .collect();
    json!({
        "prompt_n": prefilled,
        "prompt_ms": ms(u.prompt_time),
        "prompt_per_second": rate(prefilled, u.prompt_time),
        "predicted_n": u.completion_tokens,
        "predicted_ms": ms(u.gen_time),
        "predicted_per_second": rate(u.completion_tokens, u.gen_time),
        "experts": {
            "by_precision": per,
            "skipped": e.skipped,
            "cpu_computed": e.cpu_computed,
            "bytes_loaded": e.bytes_loaded,
        },
    })
}

/// OpenAI's `tool_calls` entries; `index` for a streamed delta.
fn tool_calls_json(m: &Meta, calls: &[ToolCall], streamed: bool) -> Value {
    let id = m.id.rsplit('-').next().unwrap_or("0");
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({
                "id": format!("call_{id}_{i}"),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            });
            if streamed {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

/// The whole answer (stream: false): its text and tool calls.
/// An answer's text, reasoning and tool calls.
type Answer<'a> = (&'a str, &'a str, &'a [ToolCall]);

fn answer(m: &Meta, (text, reasoning, calls): Answer<'_>, finish: Finish, u: &Usage) -> Value {
    let choice = match m.ep {
        Endpoint::Chat => {
            let mut message = json!({"role": "assistant", "content": text});
            if !reasoning.is_empty() {
                message["reasoning_content"] = Value::from(reasoning);
            }
            if !calls.is_empty() {
                if text.trim().is_empty() {
                    message["content"] = Value::Null;
                }
                message["tool_calls"] = tool_calls_json(m, calls, false);
            }
            json!({
                "index": 0,
                "message": message,
                "logprobs": null,
                "finish_reason": finish.as_str(),
            })
        }
        Endpoint::Text => json!({
            "index": 0,
            "text": text,
            "logprobs": null,
            "finish_reason": finish.as_str(),
        }),
    };
    json!({
        "id": m.id,
        "object": match m.ep { Endpoint::Chat => "chat.completion", Endpoint::Text => "text_completion" },
        "created": m.created,
        "model": m.model,
        "choices": [choice],
        "usage": usage_json(u),
        "timings": timings_json(u),
    })
}

/// One streamed chunk: `text` (None with the role, at the start of a chat), or the end.
fn chunk(m: &Meta, text: Option<&str>, finish: Option<Finish>) -> SseEvent {
    let finish = finish.map(Finish::as_str);
    let choice = match m.ep {
        Endpoint::Chat => {
            let delta = match (text, finish) {
                (None, None) => json!({"role": "assistant", "content": ""}),
                (Some(t), _) => json!({"content": t}),
                (None, Some(_)) => json!({}),
            };
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
        }
        Endpoint::Text => {
            json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
        }
    };
    data(&json!({
        "id": m.id,
        "object": match m.ep { Endpoint::Chat => "chat.completion.chunk", Endpoint::Text => "text_completion" },
        "created": m.created,
        "model": m.model,
        "choices": [choice],
    }))
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

struct StreamState {
    rx: UnboundedReceiver<Event>,
    _guard: CancelOnDrop,
    meta: Meta,
    out: VecDeque<SseEvent>,
    done: bool,
}

/// Server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.
fn sse(rx: UnboundedReceiver<Event>, guard: CancelOnDrop, meta: Meta) -> Response {
    let mut out = VecDeque::new();
    if let Endpoint::Chat = meta.ep {
        out.push_back(chunk(&meta, None, None));
    }
    let state = StreamState {
        rx,
        _guard: guard,
        meta,
        out,
        done: false,
    };
    let events = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(e) = s.out.pop_front() {
                return Some((Ok::<_, Infallible>(e), s));
            }
            if s.done {
                return None;
            }
            next_events(&mut s).await;
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn next_events(s: &mut StreamState) {
    match s.rx.recv().await {
        Some(Event::Text(t)) => s.out.push_back(chunk(&s.meta, Some(&t), None)),
        Some(Event::Reasoning(t)) => s.out.push_back(data(&json!({
            "id": s.meta.id,
            "object": "chat.completion.chunk",
            "created": s.meta.created,
            "model": s.meta.model,
            "choices": [{"index": 0, "delta": {"reasoning_content": t}, "logprobs": null, "finish_reason": null}],
        }))),
        Some(Event::ToolCalls(calls)) => {
            // A delta per call, each whole (clients join a call's deltas by index).
            for call in tool_calls_json(&s.meta, &calls, true)
                .as_array()
                .into_iter()
                .flatten()
            {
                s.out.push_back(data(&json!({
                    "id": s.meta.id,
                    "object": "chat.completion.chunk",
                    "created": s.meta.created,
                    "model": s.meta.model,
                    "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "logprobs": null, "finish_reason": null}],
                })));
            }
        }
        Some(Event::Started) => {}
        Some(Event::Done(finish, usage)) => {
            s.out.push_back(chunk(&s.meta, None, Some(finish)));
            if s.meta.include_usage {
                s.out.push_back(data(&json!({
                    "id": s.meta.id,
                    "object": match s.meta.ep { Endpoint::Chat => "chat.completion.chunk", Endpoint::Text => "text_completion" },
                    "created": s.meta.created,
                    "model": s.meta.model,
                    "choices": [],
                    "usage": usage_json(&usage),
                    "timings": timings_json(&usage),
                })));
            }
            s.out.push_back(SseEvent::default().data("[DONE]"));
            s.done = true;
        }
        Some(Event::Failed(e)) => {
            s.out.push_back(data(&e.body()));
            s.done = true;
        }
        None => {
            s.out.push_back(data(&stopping().body()));
            s.done = true;
        }
    }
}
