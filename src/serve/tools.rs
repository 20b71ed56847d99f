//! Tool calls in the model's own format, parsed into OpenAI's `tool_calls`.
//!
//! Hermes style (Qwen2/Qwen3 templates): `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
//! one block per call. Mistral style: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
//! Harmony (gpt-oss): a message to `functions.NAME` on the commentary channel, read from the
//! answer's channels (generate/harmony.rs `Calls`), not from its text.
//! The format is read off the chat template (the marker it teaches the model). Output that does not
//! parse stays text: a model's broken JSON is the answer's content, never an error.

use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Mistral,
    Harmony,
}

/// How the request lets the model call tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    /// Some call must come: the answer starts with the format's marker.
    Required,
    /// This function must be called: the answer starts with its name.
    Named(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text (OpenAI's form).
    pub arguments: String,
}

impl ToolFormat {
    /// The format a chat template teaches, if hob knows it.
    pub fn detect(template: &str) -> Option<ToolFormat> {
        if template.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else if template.contains("[TOOL_CALLS]") {
            Some(ToolFormat::Mistral)
        } else {
            None
        }
    }

    /// Where the model's calls begin.
    pub fn marker(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "<tool_call>",
            ToolFormat::Mistral => "[TOOL_CALLS]",
            ToolFormat::Harmony => "<|call|>",
        }
    }

    /// Text that opens the answer for `choice`, so that the model continues a call.
    pub fn forced_prefix(self, choice: &ToolChoice) -> String {
        let name = |n: &str| Value::String(n.to_owned()).to_string();
        match (self, choice) {
            (_, ToolChoice::Auto) => String::new(),
            (ToolFormat::Hermes, ToolChoice::Required) => "<tool_call>\n".into(),
            (ToolFormat::Hermes, ToolChoice::Named(n)) => {
                format!("<tool_call>\n{{\"name\": {}, \"arguments\": ", name(n))
            }
            (ToolFormat::Mistral, ToolChoice::Required) => "[TOOL_CALLS][".into(),
            (ToolFormat::Mistral, ToolChoice::Named(n)) => {
                format!("[TOOL_CALLS][{{\"name\": {}, \"arguments\": ", name(n))
            }
            // Any tool: refused before (a grammar over text cannot write the header's tokens).
            (ToolFormat::Harmony, ToolChoice::Required) => String::new(),
            (ToolFormat::Harmony, ToolChoice::Named(n)) => {
                format!("<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>")
            }
        }
    }

    /// For a forced choice, a Lark grammar of the answer after `forced_prefix`: the named
    /// function's arguments (its parameters schema), or any one tool's whole call, then the
    /// call's end, so that a forced call always parses.
    pub fn forced_grammar(self, choice: &ToolChoice, tools: &[Value]) -> Option<String> {
        let q = |s: &str| Value::String(s.to_owned()).to_string();
        let name_of = |t: &Value| t.get("function")?.get("name")?.as_str().map(str::to_owned);
        let params = |t: &Value| {
            let p = t.get("function").and_then(|f| f.get("parameters"));
            let mut p = p
                .filter(|p| p.is_object())
                .cloned()
                .unwrap_or_else(|| serde_json::json!({"type": "object"}));
            crate::generate::bound_whitespace(&mut p);
            p
        };
        let end = q(match self {
            ToolFormat::Hermes => "}\n</tool_call>",
            ToolFormat::Mistral => "}]",
            // The arguments alone: the call's end (<|call|>) is an end-of-generation token.
            ToolFormat::Harmony => {
                let ToolChoice::Named(n) = choice else {
                    return None;
                };
                let t = tools.iter().find(|t| name_of(t).as_deref() == Some(n))?;
                return Some(format!("start: %json {}\n", params(t)));
            }
        });
        match choice {
            ToolChoice::Auto => None,
            ToolChoice::Named(n) => {
                let t = tools.iter().find(|t| name_of(t).as_deref() == Some(n))?;
                Some(format!("start: args {end}\nargs: %json {}\n", params(t)))
            }
            ToolChoice::Required => {
                let mut g = String::from("start: ");
                let mut rules = String::new();
                for (i, t) in tools.iter().enumerate() {
                    let name = name_of(t)?;
                    let head = q(&format!("{{\"name\": {}, \"arguments\": ", q(&name)));
                    g.push_str(if i == 0 { "" } else { " | " });
                    g.push_str(&format!("c{i}"));
                    rules.push_str(&format!(
                        "c{i}: {head} a{i} {end}\na{i}: %json {}\n",
                        params(t)
                    ));
                }
                Some(format!("{g}\n{rules}"))
            }
        }
    }

    /// The calls in `text`, which starts at the marker; None when it is not well-formed calls.
    pub fn parse(self, text: &str) -> Option<Vec<ToolCall>> {
        match self {
            ToolFormat::Hermes => parse_hermes(text),
            ToolFormat::Mistral => {
                let rest = text.trim_start().strip_prefix("[TOOL_CALLS]")?;
                let list: Vec<Value> = serde_json::from_str(rest.trim()).ok()?;
                list.iter().map(call).collect()
            }
            ToolFormat::Harmony => None,
        }
    }
}

fn parse_hermes(text: &str) -> Option<Vec<ToolCall>> {
    let mut rest = text.trim();
    let mut calls = Vec::new();
    while !rest.is_empty() {
        let body = rest.strip_prefix("<tool_call>")?;
        // A last call may lack its closing tag when the answer ended right after the JSON.
        let (json, after) = match body.find("</tool_call>") {
            Some(end) => (&body[..end], &body[end + "</tool_call>".len()..]),
            None => (body, ""),
        };
        calls.push(call(&serde_json::from_str(json.trim()).ok()?)?);
        rest = after.trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

/// `{"name": "...", "arguments": {...} or "..."}`.
fn call(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_owned();
    let arguments = match v.get("arguments") {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(_) => return None,
    };
    Some(ToolCall { name, arguments })
}

/// Streamed text split at the format's marker: what comes before it goes out as it arrives (a tail
/// that may begin the marker is held back), what follows is held until the end.
pub struct ToolSplitter {
    marker: &'static str,
    held: String,
    capturing: bool,
}

impl ToolSplitter {
    /// `prefix`: text already in the answer (a forced call's opening); capturing from the start
    /// when it is not empty.
    pub fn new(format: ToolFormat, prefix: String) -> Self {
        ToolSplitter {
            marker: format.marker(),
            capturing: !prefix.is_empty(),
            held: prefix,
        }
    }

    /// Take `piece`; returns the text that can go out as content now.
    pub fn push(&mut self, piece: &str) -> String {
        self.held.push_str(piece);
        if self.capturing {
            return String::new();
        }
        if let Some(at) = self.held.find(self.marker) {
            self.capturing = true;
            let out = self.held[..at].to_owned();
            self.held.drain(..at);
            return out;
        }
        let keep = super::worker::longest_suffix_prefix(&self.held, self.marker);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        out
    }

    /// The end: the held text, and whether it starts at the marker (calls to parse).
    pub fn finish(self) -> (String, bool) {
        (self.held, self.capturing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, args: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn hermes_calls_parse_and_broken_ones_do_not() {
        let h = ToolFormat::Hermes;
        let two = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\"}\n</tool_call>";
        assert_eq!(
            h.parse(two),
            Some(vec![
                c("get_weather", r#"{"city":"Paris"}"#),
                c("now", "{}")
            ])
        );
        assert_eq!(
            h.parse("<tool_call>{\"name\": \"f\", \"arguments\": {}}"),
            Some(vec![c("f", "{}")])
        );
        for bad in [
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",
            "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
            "<tool_call>{\"name\": \"f\"}</tool_call> and then some words",
            "<tool_call>",
        ] {
            assert_eq!(h.parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn mistral_calls_parse() {
        let m = ToolFormat::Mistral;
        assert_eq!(
            m.parse("[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"x\": 1}}]"),
            Some(vec![c("f", r#"{"x":1}"#)])
        );
        assert_eq!(m.parse("[TOOL_CALLS] [{\"name\": \"f\", "), None);
    }

    #[test]
    fn the_splitter_streams_text_before_the_marker_and_holds_the_rest() {
        let mut s = ToolSplitter::new(ToolFormat::Hermes, String::new());
        assert_eq!(s.push("Let me check. <tool"), "Let me check. ");
        assert_eq!(s.push("_call>\n{\"name\""), "");
        assert_eq!(s.push(": \"f\"}\n</tool_call>"), "");
        let (held, calls) = s.finish();
        assert!(calls);
        assert_eq!(ToolFormat::Hermes.parse(&held), Some(vec![c("f", "{}")]));
        // A false start goes out once it stops matching.
        let mut s = ToolSplitter::new(ToolFormat::Hermes, String::new());
        assert_eq!(s.push("a <to"), "a ");
        assert_eq!(s.push("p"), "<top");
        assert_eq!(s.finish(), (String::new(), false));
        // A forced call's opening is held from the start.
        let prefix = ToolFormat::Hermes.forced_prefix(&ToolChoice::Named("f".into()));
        let mut s = ToolSplitter::new(ToolFormat::Hermes, prefix);
        assert_eq!(s.push("{\"q\": 1}}\n</tool_call>"), "");
        let (held, _) = s.finish();
        assert_eq!(
            ToolFormat::Hermes.parse(&held),
            Some(vec![c("f", r#"{"q":1}"#)])
        );
    }
}
