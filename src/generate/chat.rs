//! Chat templates: the model's own Jinja template from tokenizer_config.json, rendered the way
//! Hugging Face transformers renders it (`apply_chat_template`), so that the prompt text, and
//! therefore the prompt ids, are the ones the model was tuned on.

use std::fmt::Write;
use std::io;
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ValueKind};
use minijinja::{context, Environment, Error, ErrorKind, Value};

use super::GenerateError;

const TEMPLATE_NAME: &str = "chat_template";

/// The most work one render may do, in minijinja fuel (about one step per instruction, one per 64
/// bytes of text made). Mixtral's template renders a 4000-message, 4 MB conversation with 1/30
/// of it; a runaway loop is stopped in well under a second.
pub const TEMPLATE_FUEL: u64 = 10_000_000;

/// The longest prompt a render may produce: far beyond any model's context (1M tokens are about
/// 4 MiB of text).
pub const TEMPLATE_MAX_OUTPUT: usize = 64 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// Further fields the template may read after role and content, in order: an assistant's
    /// `tool_calls`, a tool result's `tool_call_id` and `name`.
    pub extra: Vec<(String, serde_json::Value)>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.to_owned(),
            content: content.to_owned(),
            extra: Vec::new(),
        }
    }
    pub fn system(content: &str) -> Self {
        Message::new("system", content)
    }
    pub fn user(content: &str) -> Self {
        Message::new("user", content)
    }
    pub fn assistant(content: &str) -> Self {
        Message::new("assistant", content)
    }
}

/// A message as the template sees it: a map with "role", "content", then the extra fields, in
/// that order as in the Python dicts transformers passes (it shows in `tojson` and `.items()`).
#[derive(Debug)]
struct MessageObject(Message);

impl Object for MessageObject {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "role" => Some(Value::from(self.0.role.as_str())),
            "content" => Some(Value::from(self.0.content.as_str())),
            k => self
                .0
                .extra
                .iter()
                .find(|(name, _)| name == k)
                .map(|(_, v)| Value::from(minijinja::value::Serde(v))),
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        if self.0.extra.is_empty() {
            return Enumerator::Str(&["role", "content"]);
        }
        let keys = ["role", "content"].into_iter().map(Value::from);
        let extra = self.0.extra.iter().map(|(k, _)| Value::from(k.as_str()));
        Enumerator::Values(keys.chain(extra).collect())
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    /// Extra variables the template reads (Qwen3's `enable_thinking`): llama.cpp's
    /// --chat-template-kwargs, transformers' apply_chat_template keyword arguments.
    vars: std::collections::BTreeMap<String, Value>,
}

impl ChatTemplate {
    /// Compile `source`; `bos_token`/`eos_token` are the token texts the template may print.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, GenerateError> {
        let mut env = Environment::new();
        // transformers: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with
        // the loopcontrols extension. keep_trailing_newline stays at Jinja's default (off) as
        // there: a template file's final newline is not part of the prompt.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| GenerateError::TemplateSyntax {
                reason: describe(&e),
            })?;
        env.set_syntax(syntax);
        env.set_fuel(Some(TEMPLATE_FUEL));
        // Python string/dict methods (.strip(), .startswith(), .items()) used by HF templates.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| GenerateError::TemplateSyntax {
                reason: describe(&e),
            })?;
        Ok(ChatTemplate {
            env,
            source: source.to_owned(),
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            vars: Default::default(),
        })
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Set template variable `name` (e.g. `enable_thinking` to false); the names the renderer
    /// sets itself (messages, add_generation_prompt, bos_token, eos_token) cannot be replaced.
    pub fn set_var(&mut self, name: &str, value: &serde_json::Value) -> Result<(), GenerateError> {
        check_var(name)?;
        self.vars
            .insert(name.to_owned(), Value::from(minijinja::value::Serde(value)));
        Ok(())
    }

    /// The prompt text for `messages`; `add_generation_prompt` appends the opening of the
    /// assistant's turn where the template has one (ChatML's `<|im_start|>assistant\n`).
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, GenerateError> {
        self.render_with(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// `render` with `extra` variables for this render only, over those of `set_var` (a
    /// request's `chat_template_kwargs`).
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, GenerateError> {
        let mut vars = self.vars.clone();
        for (name, value) in extra {
            check_var(name)?;
            vars.insert(name.clone(), Value::from(minijinja::value::Serde(value)));
        }
        let template =
            self.env
                .get_template(TEMPLATE_NAME)
                .map_err(|e| GenerateError::TemplateSyntax {
                    reason: describe(&e),
                })?;
        let mut out = CappedWriter::default();
        let rendered = template.render_captured_to(
            context! {
                messages => messages
                    .iter()
                    .map(|m| Value::from_object(MessageObject(m.clone())))
                    .collect::<Vec<_>>(),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
                ..Value::from(vars)
            },
            &mut out,
        );
        match rendered {
            Ok(_) => String::from_utf8(out.bytes).map_err(|e| GenerateError::TemplateRender {
                reason: format!("the output is not UTF-8: {e}"),
            }),
            Err(_) if out.overflowed => Err(GenerateError::TemplateTooLong {
                limit: TEMPLATE_MAX_OUTPUT,
            }),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(GenerateError::TemplateTooMuchWork {
                steps: TEMPLATE_FUEL,
                reason: match at_line(&e).as_str() {
                    "" => "stopped".to_string(),
                    line => format!("stopped{line} of the template"),
                },
            }),
            Err(e) => Err(GenerateError::TemplateRender {
                reason: describe(&e),
            }),
        }
    }
}

/// A variable name a caller may set: not one the renderer sets itself.
fn check_var(name: &str) -> Result<(), GenerateError> {
    if [
        "messages",
        "add_generation_prompt",
        "bos_token",
        "eos_token",
    ]
    .contains(&name)
    {
        return Err(GenerateError::TemplateRender {
            reason: format!("'{name}' is set by hob, not by a template variable"),
        });
    }
    Ok(())
}

/// The render's output, refused beyond [`TEMPLATE_MAX_OUTPUT`] bytes.
#[derive(Default)]
struct CappedWriter {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.bytes.len() + buf.len() > TEMPLATE_MAX_OUTPUT {
            self.overflowed = true;
            return Err(io::Error::other("chat template output too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// " at line N" where the error has a line in the template.
fn at_line(err: &Error) -> String {
    match err.line() {
        Some(line) if err.name().is_some() => format!(" at line {line}"),
        _ => String::new(),
    }
}

/// A minijinja error with its causes, on one line: its detail (the kind too where the detail
/// alone would not say what went wrong), the line, then the causes. The variant of
/// [`GenerateError`] already says whether it is a syntax or a render error.
fn describe(err: &Error) -> String {
    let mut text = match (err.kind(), err.detail()) {
        (ErrorKind::SyntaxError | ErrorKind::InvalidOperation, Some(detail)) => detail.to_string(),
        (kind, Some(detail)) => format!("{kind}: {detail}"),
        (kind, None) => kind.to_string(),
    };
    text.push_str(&at_line(err));
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

/// HF templates call `raise_exception(message)` to refuse a conversation (roles out of order).
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=indent,
/// sort_keys=sort_keys)`, so ", " and ": " separators and no HTML escaping (minijinja's own
/// filter escapes `<`, `>`, `&` and `'`, which would change prompts that embed tool schemas).
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    if ensure_ascii == Some(true) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson(ensure_ascii=true) is not supported",
        ));
    }
    let mut out = String::new();
    write_json(&mut out, value, indent, sort_keys.unwrap_or(false), 0)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(
    out: &mut String,
    value: &Value,
    indent: Option<usize>,
    sort_keys: bool,
    depth: usize,
) -> Result<(), Error> {
    let unsupported = || {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: cannot serialize a value of kind {}", value.kind()),
        )
    };
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => match i64::try_from(value.clone()) {
            Ok(int) => out.push_str(&int.to_string()),
            Err(_) => {
                let float = f64::try_from(value.clone()).map_err(|_| unsupported())?;
                out.push_str(&json_scalar(&float)?);
            }
        },
        ValueKind::String => {
            let text = value.as_str().ok_or_else(unsupported)?;
            out.push_str(&json_scalar(text)?);
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, ('[', ']'), &items, (indent, depth), |out, item| {
                write_json(out, item, indent, sort_keys, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if sort_keys {
                keys.sort();
            }
            write_container(out, ('{', '}'), &keys, (indent, depth), |out, key| {
                let name = key.to_string();
                out.push_str(&json_scalar(name.as_str())?);
                out.push_str(": ");
                write_json(out, &value.get_item(key)?, indent, sort_keys, depth + 1)
            })?;
        }
        _ => return Err(unsupported()),
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    (open, close): (char, char),
    items: &[Value],
    (indent, depth): (Option<usize>, usize),
    mut write_item: impl FnMut(&mut String, &Value) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        match indent {
            Some(width) => {
                out.push_str(if i == 0 { "\n" } else { ",\n" });
                out.push_str(&" ".repeat(width * (depth + 1)));
            }
            None if i > 0 => out.push_str(", "),
            None => {}
        }
        write_item(out, item)?;
    }
    if let Some(width) = indent {
        out.push('\n');
        out.push_str(&" ".repeat(width * depth));
    }
    out.push(close);
    Ok(())
}

/// JSON text of a scalar through serde_json, whose escapes match Python's json with
/// ensure_ascii=False (`\"`, `\\`, `\n`, `\u001b` ...).
fn json_scalar<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    serde_json::to_string(value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))
}

/// What to feed the model for the conversation's latest state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderDelta {
    /// The previous render is a prefix of the new one: feed only this text, continuing the KV
    /// cache (encode it with `Tokenizer::encode_continuation`).
    Append(String),
    /// The template rewrote earlier text (some templates move the system prompt or drop old
    /// reasoning): this is the whole prompt, to be prefilled from an empty cache.
    Rerender(String),
}

/// A multi-turn chat that keeps its KV cache between turns: it remembers the text already fed to
/// the model and hands out only what is new.
#[derive(Debug, Default, Clone)]
pub struct Conversation {
    messages: Vec<Message>,
    rendered: String,
}

impl Conversation {
    pub fn new() -> Self {
        Conversation::default()
    }

    pub fn push(&mut self, message: Message) {
        self.messages.push(message);
    }

    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The text that the model has been fed so far, as of the last render.
    pub fn rendered(&self) -> &str {
        &self.rendered
    }

    /// Render the whole conversation and return what is new since the last call.
    pub fn render_delta(
        &mut self,
        template: &ChatTemplate,
        add_generation_prompt: bool,
    ) -> Result<RenderDelta, GenerateError> {
        let full = template.render(&self.messages, add_generation_prompt)?;
        let delta = match full.strip_prefix(self.rendered.as_str()) {
            Some(new) => RenderDelta::Append(new.to_owned()),
            None => RenderDelta::Rerender(full.clone()),
        };
        self.rendered = full;
        Ok(delta)
    }
}
