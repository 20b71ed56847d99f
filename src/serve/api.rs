//! The OpenAI request bodies hob reads, checked into a [`Request`], and OpenAI's error shape.
//!
//! Unknown fields are tolerated (clients send many); a field hob reads but cannot honour (n > 1,
//! logprobs, echo) is refused by name rather than ignored.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::tools::ToolChoice;
use crate::generate::Message;

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a Retry-After header (429, 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400 naming the request field at fault.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_owned()),
            ..ApiError::new(StatusCode::BAD_REQUEST, message)
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND | StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => {
                "invalid_request_error"
            }
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            _ => "server_error",
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry = self.retry_after;
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = retry {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        r
    }
}

/// What a request asks the model to continue.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Messages through the chat template, with the request's template variables.
    Chat {
        messages: Vec<Message>,
        vars: Map<String, Value>,
    },
    /// Raw text (BOS added as the model wants), or token ids as given.
    Text(String),
    Ids(Vec<u32>),
}

/// A checked request: the prompt, the sampling fields it set (None: the server's default) and
/// how to stream.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Prompt,
    pub sampling: Sampling,
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub model: Option<String>,
    /// llama.cpp server's extension: generate past the end of the answer (benchmarks).
    pub ignore_eos: bool,
    /// The functions the model may call (OpenAI's `tools`, given to the template) and how.
    pub tools: Option<(Vec<Value>, ToolChoice)>,
    /// `response_format`: the JSON schema the answer must follow.
    pub format: Option<Value>,
}

/// The sampling fields of a request, OpenAI's and llama.cpp server's extensions.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub seed: Option<i64>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// `stop`: one string or a list.
#[derive(Deserialize)]
#[serde(untagged, expecting = "a string or a list of strings")]
enum Stops {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(untagged, expecting = "a string or a list of content parts")]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    tool_calls: Option<Vec<Value>>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

/// The fields both endpoints share.
#[derive(Deserialize)]
struct Common {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    stop: Option<Stops>,
    #[serde(default)]
    n: Option<i64>,
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    min_p: Option<f32>,
    #[serde(default)]
    repeat_penalty: Option<f32>,
    #[serde(default)]
    presence_penalty: Option<f32>,
    #[serde(default)]
    frequency_penalty: Option<f32>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    ignore_eos: Option<bool>,
    #[serde(default)]
    response_format: Option<Value>,
}

#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<ChatMessage>,
    #[serde(default)]
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
}

#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a string, a list of one string, or a list of token ids"
)]
enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
}

#[derive(Deserialize)]
struct CompletionBody {
    prompt: PromptField,
    #[serde(default)]
    echo: Option<bool>,
    #[serde(default)]
    suffix: Option<String>,
}

/// Stop strings a request may give (OpenAI allows 4; llama.cpp's server more).
const MAX_STOPS: usize = 16;

/// `body` as JSON of type T; a type error names the field (`messages[1].content`).
fn parse<T: for<'de> Deserialize<'de>>(body: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let missing = inner
            .strip_prefix("missing field `")
            .and_then(|r| r.split('`').next());
        match (path.as_str(), missing) {
            ("." | "", Some(field)) => ApiError::invalid(field, inner.clone()),
            ("." | "", None) => ApiError::new(StatusCode::BAD_REQUEST, inner),
            _ => ApiError::invalid(&path, format!("{path}: {inner}")),
        }
    })
}

/// The body as a JSON object.
pub fn json_object(bytes: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the body is not valid JSON: {e}"),
        )
    })?;
    if !v.is_object() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "the body must be a JSON object",
        ));
    }
    Ok(v)
}

fn common(body: &Value) -> Result<Request, ApiError> {
    let c: Common = parse(body)?;
    if c.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid(
            "n",
            "n: hob generates one choice per request (n = 1)",
        ));
    }
    if c.logprobs
        .as_ref()
        .is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
    {
        return Err(ApiError::invalid(
            "logprobs",
            "logprobs: not supported by hob",
        ));
    }
    let stop: Vec<String> = match &c.stop {
        None => vec![],
        Some(Stops::One(s)) => vec![s.clone()],
        Some(Stops::Many(v)) => v.clone(),
    };
    if stop.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop",
            format!("stop: at most {MAX_STOPS} sequences, found {}", stop.len()),
        ));
    }
    let stop = stop.into_iter().filter(|s| !s.is_empty()).collect();
    let sampling = Sampling {
        temperature: c.temperature,
        top_p: c.top_p,
        top_k: c.top_k,
        min_p: c.min_p,
        repeat_penalty: c.repeat_penalty,
        presence_penalty: c.presence_penalty,
        frequency_penalty: c.frequency_penalty,
        seed: c.seed,
    };
    check_sampling(&sampling)?;
    let req = Request {
        prompt: Prompt::Text(String::new()),
        sampling,
        max_tokens: max_tokens("max_tokens", c.max_tokens)?,
        stop,
        stream: c.stream.unwrap_or(false),
        include_usage: c.stream_options.as_ref().is_some_and(|o| o.include_usage),
        model: c.model,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        tools: None,
        format: response_format(c.response_format)?,
    };
    Ok(req)
}

/// OpenAI's `response_format`: text, `json_object` (any object) or `json_schema` (its schema).
fn response_format(v: Option<Value>) -> Result<Option<Value>, ApiError> {
    let bad = |why: &str| ApiError::invalid("response_format", format!("response_format: {why}"));
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "object"}))),
        Some("json_schema") => match v.get("json_schema").and_then(|j| j.get("schema")) {
            Some(s @ (Value::Object(_) | Value::Bool(_))) => Ok(Some(s.clone())),
            _ => Err(bad("json_schema.schema: expected a JSON schema object")),
        },
        _ => Err(bad("type must be text, json_object or json_schema")),
    }
}

fn max_tokens(field: &str, v: Option<i64>) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(n) if n >= 1 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        Some(n) => Err(ApiError::invalid(
            field,
            format!("{field}: must be at least 1, found {n}"),
        )),
    }
}

/// OpenAI's ranges (and the extensions' own).
fn check_sampling(s: &Sampling) -> Result<(), ApiError> {
    let range = |field: &str, v: Option<f32>, lo: f32, hi: f32, lo_open: bool| {
        let Some(x) = v else { return Ok(()) };
        let ok = x.is_finite() && x <= hi && if lo_open { x > lo } else { x >= lo };
        if ok {
            return Ok(());
        }
        let bracket = if lo_open { "(" } else { "[" };
        Err(ApiError::invalid(
            field,
            format!("{field}: must be in {bracket}{lo}, {hi}], found {x}"),
        ))
    };
    range("temperature", s.temperature, 0.0, 2.0, false)?;
    range("top_p", s.top_p, 0.0, 1.0, true)?;
    range("min_p", s.min_p, 0.0, 1.0, false)?;
    range("presence_penalty", s.presence_penalty, -2.0, 2.0, false)?;
    range("frequency_penalty", s.frequency_penalty, -2.0, 2.0, false)?;
    range("repeat_penalty", s.repeat_penalty, 0.0, f32::MAX, true)?;
    Ok(())
}

/// `POST /v1/chat/completions`.
pub fn chat_request(body: &Value) -> Result<Request, ApiError> {
    let mut req = common(body)?;
    let b: ChatBody = parse(body)?;
    if let Some(n) = max_tokens("max_completion_tokens", b.max_completion_tokens)? {
        req.max_tokens = Some(n);
    }
    if b.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages: give at least one message",
        ));
    }
    let mut messages = Vec::with_capacity(b.messages.len());
    for (i, m) in b.messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "user" | "assistant" | "tool" => m.role,
            // OpenAI's newer name for the system role; chat templates know only "system".
            "developer" => "system".to_owned(),
            other => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    format!(
                        "messages[{i}].role: {other:?} is not one of system, developer, user, assistant, tool"
                    ),
                ))
            }
        };
        let content = match m.content {
            None => String::new(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.into_iter().enumerate() {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => text.push_str(&t),
                        (kind, _) => {
                            return Err(ApiError::invalid(
                                &format!("messages[{i}].content[{j}]"),
                                format!(
                                    "messages[{i}].content[{j}]: hob reads text parts only, found type {kind:?}"
                                ),
                            ))
                        }
                    }
                }
                text
            }
        };
        let mut extra = Vec::new();
        if let Some(calls) = m.tool_calls {
            extra.push(("tool_calls".to_owned(), Value::Array(calls)));
        }
        if let Some(id) = m.tool_call_id {
            extra.push(("tool_call_id".to_owned(), Value::String(id)));
        }
        if let Some(name) = m.name {
            extra.push(("name".to_owned(), Value::String(name)));
        }
        messages.push(Message {
            role,
            content,
            extra,
        });
    }
    req.prompt = Prompt::Chat {
        messages,
        vars: b.chat_template_kwargs.unwrap_or_default(),
    };
    req.tools = tools(b.tools, b.tool_choice)?;
    Ok(req)
}

/// `tools` and `tool_choice`: None when there are no tools or the choice is "none".
fn tools(
    tools: Option<Vec<Value>>,
    choice: Option<Value>,
) -> Result<Option<(Vec<Value>, ToolChoice)>, ApiError> {
    let tools = tools.unwrap_or_default();
    let mut names = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let name = t
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str);
        match (t.get("type").and_then(Value::as_str), name) {
            (Some("function"), Some(n)) => names.push(n.to_owned()),
            _ => {
                return Err(ApiError::invalid(
                    &format!("tools[{i}]"),
                    format!("tools[{i}]: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
                ))
            }
        }
    }
    let bad = |why: &str| ApiError::invalid("tool_choice", format!("tool_choice: {why}"));
    let choice = match &choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => return Ok(None),
            "required" => ToolChoice::Required,
            other => return Err(bad(&format!("{other:?} is not auto, none or required"))),
        },
        Some(v) => match v
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
        {
            Some(n) if names.iter().any(|m| m == n) => ToolChoice::Named(n.to_owned()),
            Some(n) => return Err(bad(&format!("{n:?} is not one of the tools"))),
            None => {
                return Err(bad(
                    "expected {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ))
            }
        },
    };
    if tools.is_empty() {
        return match choice {
            ToolChoice::Auto => Ok(None),
            _ => Err(bad("there are no tools to call")),
        };
    }
    Ok(Some((tools, choice)))
}

/// `POST /v1/completions`.
pub fn completion_request(body: &Value) -> Result<Request, ApiError> {
    let mut req = common(body)?;
    let b: CompletionBody = parse(body)?;
    if b.echo == Some(true) {
        return Err(ApiError::invalid("echo", "echo: not supported by hob"));
    }
    if b.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "suffix: not supported by hob"));
    }
    req.prompt = match b.prompt {
        PromptField::Text(t) => Prompt::Text(t),
        PromptField::Texts(mut v) if v.len() == 1 => Prompt::Text(v.remove(0)),
        PromptField::Texts(v) => {
            return Err(ApiError::invalid(
                "prompt",
                format!("prompt: one prompt per request (n = 1), found {}", v.len()),
            ))
        }
        PromptField::Ids(ids) => Prompt::Ids(ids),
    };
    Ok(req)
}
