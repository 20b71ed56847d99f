//! The harmony format of gpt-oss (github.com/openai/harmony, docs/format.md): the chat template
//! hob writes where a gpt-oss checkpoint carries none, and the channels of an answer. An
//! assistant turn is messages `<|channel|>NAME<|message|>TEXT`, each ended by `<|end|>` (the next
//! one opened by `<|start|>assistant`) or, the turn's last, by `<|return|>` or `<|call|>`. The
//! answer is the `final` channel; `analysis` is the model's reasoning.

use super::{GenerateError, Tokenizer};

/// The conversation in harmony: a system message (identity, knowledge cutoff, reasoning effort
/// from the template variable `reasoning_effort`, default medium; the valid channels), the
/// system prompt as the developer's instructions with the request's `tools` as the format's
/// `functions` namespace (each one's parameters schema as JSON), each user turn, each earlier
/// answer as a `final` message, its tool calls as `commentary` messages to `functions.NAME`
/// ended by `<|call|>`, tool results as messages from the tool, and the assistant's turn opened.
pub const HARMONY_TEMPLATE: &str = concat!(
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n",
    "Knowledge cutoff: 2024-06\n\n",
    "Reasoning: {{ reasoning_effort if reasoning_effort is defined else 'medium' }}\n\n",
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.",
    "{%- if tools %}{{ '\\nCalls to these tools must go to the commentary channel: \\'functions\\'.' }}",
    "{%- endif %}<|end|>",
    "{%- set ns = namespace(dev='', call='') %}",
    "{%- for message in messages %}",
    "{%- if message['role'] == 'system' or message['role'] == 'developer' %}",
    "{%- set ns.dev = message['content'] %}",
    "{%- endif %}",
    "{%- endfor %}",
    "{%- if ns.dev or tools %}<|start|>developer<|message|>",
    "{%- if ns.dev %}{{ '# Instructions\\n\\n' + ns.dev }}{% endif %}",
    "{%- if ns.dev and tools %}{{ '\\n\\n' }}{% endif %}",
    "{%- if tools %}{{ '# Tools\\n\\n## functions\\n\\nnamespace functions {\\n\\n' }}",
    "{%- for tool in tools %}{% set f = tool['function'] %}",
    "{%- if f['description'] %}{{ '// ' + f['description'] + '\\n' }}{% endif %}",
    "{{- 'type ' + f['name'] + ' = (_: ' + (f['parameters'] | tojson) + ') => any;\\n\\n' }}",
    "{%- endfor %}{{ '} // namespace functions' }}{% endif %}<|end|>",
    "{%- endif %}",
    "{%- for message in messages %}",
    "{%- if message['role'] == 'user' %}",
    "{{ '<|start|>user<|message|>' + message['content'] + '<|end|>' }}",
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}",
    "{%- for call in message['tool_calls'] %}{% set ns.call = call['function']['name'] %}",
    "{%- set args = call['function']['arguments'] %}",
    "{{- '<|start|>assistant<|channel|>commentary to=functions.' + ns.call }}",
    "{{- ' <|constrain|>json<|message|>' + (args if args is string else args | tojson) + '<|call|>' }}",
    "{%- endfor %}",
    "{%- elif message['role'] == 'assistant' %}",
    "{{ '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' }}",
    "{%- elif message['role'] == 'tool' %}",
    "{{- '<|start|>functions.' + (message['name'] or ns.call) + ' to=assistant<|channel|>commentary' }}",
    "{{- '<|message|>' + message['content'] + '<|end|>' }}",
    "{%- endif %}",
    "{%- endfor %}",
    "{%- if add_generation_prompt %}<|start|>assistant{% endif %}",
);

/// Which part of an answer a sampled token belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// A marker or a header (role, channel name, content type): not text.
    Header,
    /// The text of the `final` channel: the answer.
    Final,
    /// The text of the `analysis` channel: the reasoning.
    Analysis,
    /// The text of a message addressed to a tool (`to=functions.NAME` in its header): a call's
    /// arguments (`Channels::recipient` names the tool).
    Call,
    /// Text of another channel (`commentary` preambles).
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// After `<|start|>` (or at the turn's start): the role, up to `<|channel|>`.
    Role,
    /// The channel's name (and a recipient or content type), up to `<|message|>`.
    Channel,
    Text(Part),
}

/// Sorts an answer's sampled ids into parts, token by token.
pub struct Channels {
    start: u32,
    channel: u32,
    message: u32,
    end: u32,
    state: State,
    /// The ids of the message's header read so far (role, then channel).
    name: Vec<u32>,
    /// The tool the current message is addressed to.
    recipient: Option<String>,
}

impl Channels {
    /// The harmony markers of `tok`; None where it lacks them (not a harmony tokenizer).
    pub fn new(tok: &Tokenizer) -> Option<Channels> {
        let id = |t: &str| tok.token_to_id(t).ok();
        Some(Channels {
            start: id("<|start|>")?,
            channel: id("<|channel|>")?,
            message: id("<|message|>")?,
            end: id("<|end|>")?,
            state: State::Role,
            name: Vec::new(),
            recipient: None,
        })
    }

    /// The tool the current message is addressed to (`functions.NAME` as `NAME`; others, such
    /// as `browser.search`, whole).
    pub fn recipient(&self) -> Option<&str> {
        let r = self.recipient.as_deref()?;
        Some(r.strip_prefix("functions.").unwrap_or(r))
    }

    /// A new answer: the prompt ended with `<|start|>assistant`.
    pub fn begin(&mut self) {
        self.state = State::Role;
        self.name.clear();
        self.recipient = None;
    }

    /// The part `id` belongs to.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<Part, GenerateError> {
        if id == self.start || id == self.end {
            self.state = State::Role;
            self.name.clear();
            return Ok(Part::Header);
        }
        match self.state {
            State::Role | State::Channel if id == self.channel => {
                self.state = State::Channel;
                // The role's header stays: a recipient may be named there.
                self.name.push(id);
                Ok(Part::Header)
            }
            State::Role | State::Channel if id == self.message => {
                let header = tok.decode(&self.name, false)?;
                let part = self.header_part(&header);
                self.name.clear();
                self.state = State::Text(part);
                Ok(Part::Header)
            }
            State::Role | State::Channel => {
                self.name.push(id);
                Ok(Part::Header)
            }
            State::Text(part) => Ok(part),
        }
    }

    /// The part a message's text belongs to, from its header: "assistant to=functions.x
    /// <|channel|>commentary json", "assistant<|channel|>final", ...: addressed to a tool (a
    /// `to=` word anywhere), else by the channel's first word.
    fn header_part(&mut self, header: &str) -> Part {
        let (role, channel) = header.split_once("<|channel|>").unwrap_or(("", header));
        let words = || role.split_whitespace().chain(channel.split_whitespace());
        let to = |w: &str| Some(w.strip_prefix("to=")?.split('<').next()?.to_owned());
        self.recipient = words().find_map(to);
        if self.recipient.is_some() {
            return Part::Call;
        }
        match channel.split_whitespace().next() {
            Some("final") | None => Part::Final,
            Some("analysis") => Part::Analysis,
            Some(_) => Part::Other,
        }
    }
}

/// The tool calls of an answer, from its parts: each message addressed to a tool is one call,
/// its text the arguments.
#[derive(Default)]
pub struct Calls {
    open: Option<(String, Vec<u32>)>,
    done: Vec<(String, Vec<u32>)>,
}

impl Calls {
    /// Take token `id` of `part`; `recipient`: the tool the current message is addressed to.
    pub fn push(&mut self, part: Part, recipient: Option<&str>, id: u32) {
        match part {
            Part::Call => {
                let name = recipient.unwrap_or_default().to_owned();
                self.open
                    .get_or_insert_with(|| (name, Vec::new()))
                    .1
                    .push(id);
            }
            Part::Header => self.done.extend(self.open.take()),
            Part::Final | Part::Analysis | Part::Other => {}
        }
    }

    /// (tool, arguments text) of each call, in order.
    pub fn finish(mut self, tok: &Tokenizer) -> Result<Vec<(String, String)>, GenerateError> {
        self.done.extend(self.open.take());
        let text = |(name, ids): (String, Vec<u32>)| -> Result<_, GenerateError> {
            Ok((name, tok.decode(&ids, true)?.trim().to_owned()))
        };
        self.done.into_iter().map(text).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{ChatTemplate, Message};

    fn tokenizer() -> Tokenizer {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny-gpt-oss");
        let json = std::fs::read_to_string(format!("{dir}/tokenizer.json")).unwrap();
        let tok = Tokenizer::from_json(&json, None, 0, false).unwrap();
        let eos = tok.token_to_id("<|return|>").unwrap();
        Tokenizer::from_json(&json, None, eos, false).unwrap()
    }

    #[test]
    fn an_answer_splits_into_its_channels() {
        let tok = tokenizer();
        let text = "<|channel|>analysis<|message|>Rome it is.<|end|><|start|>assistant\
                    <|channel|>final<|message|>Rome.<|return|>";
        let ids = tok.encode(text, false).unwrap();
        let mut ch = Channels::new(&tok).unwrap();
        ch.begin();
        let (mut parts, mut kinds) = (std::collections::BTreeMap::new(), Vec::new());
        for &id in &ids {
            let p = ch.push(&tok, id).unwrap();
            parts
                .entry(format!("{p:?}"))
                .or_insert_with(Vec::new)
                .push(id);
            kinds.push(p);
        }
        let text_of = |k: &str| tok.decode(&parts[k], true).unwrap();
        assert_eq!(text_of("Analysis"), "Rome it is.");
        assert_eq!(text_of("Final"), "Rome.");
        assert!(!kinds.contains(&Part::Other));
    }

    /// A call: the recipient in the channel header (or the role's), its text the arguments.
    #[test]
    fn a_call_is_addressed_to_its_tool() {
        let tok = tokenizer();
        for text in [
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>\
             commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Rome\"}",
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant \
             to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Rome\"}",
        ] {
            let ids = tok.encode(text, false).unwrap();
            let mut ch = Channels::new(&tok).unwrap();
            ch.begin();
            let mut calls = Calls::default();
            for &id in &ids {
                let part = ch.push(&tok, id).unwrap();
                calls.push(part, ch.recipient(), id);
            }
            let calls = calls.finish(&tok).unwrap();
            assert_eq!(
                calls,
                [("get_weather".to_owned(), "{\"city\": \"Rome\"}".to_owned())]
            );
        }
    }

    /// Tools in the developer message, an earlier call and its result as harmony messages.
    #[test]
    fn the_template_renders_tools_and_calls() {
        let t = ChatTemplate::new(HARMONY_TEMPLATE, "<|startoftext|>", "<|return|>").unwrap();
        let call = serde_json::json!([{"id": "c1", "type": "function", "function":
            {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]);
        let mut asked = Message::assistant("");
        asked.extra.push(("tool_calls".into(), call));
        let conv = [
            Message::user("Weather in Rome?"),
            asked,
            Message::new("tool", "sunny"),
        ];
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
            "description": "Current weather.", "parameters": {"type": "object"}}}]);
        let mut vars = serde_json::Map::new();
        vars.insert("tools".into(), tools);
        let got = t.render_with(&conv, true, &vars).unwrap();
        let want = "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions \
                    {\n\n// Current weather.\ntype get_weather = (_: {\"type\": \"object\"}) => \
                    any;\n\n} // namespace functions<|end|><|start|>user<|message|>Weather in \
                    Rome?<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather \
                    <|constrain|>json<|message|>{\"city\": \"Rome\"}<|call|><|start|>functions.\
                    get_weather to=assistant<|channel|>commentary<|message|>sunny<|end|>\
                    <|start|>assistant";
        assert!(got.ends_with(want), "{got}");
        assert!(got.contains("'functions'.<|end|>"), "{got}");
    }

    /// The template renders the format's documented layout (docs/format.md of openai/harmony):
    /// the system message, the system prompt as the developer's instructions, earlier answers
    /// as final messages, the assistant's turn opened.
    #[test]
    fn the_template_renders_harmony() {
        let t = ChatTemplate::new(HARMONY_TEMPLATE, "<|startoftext|>", "<|return|>").unwrap();
        let conv = [
            Message::system("Be terse."),
            Message::user("Capital of France?"),
            Message::assistant("Paris."),
            Message::user("And of Italy?"),
        ];
        let want = "<|start|>system<|message|>You are ChatGPT, a large language model trained \
                    by OpenAI.\nKnowledge cutoff: 2024-06\n\nReasoning: medium\n\n# Valid \
                    channels: analysis, commentary, final. Channel must be included for every \
                    message.<|end|><|start|>developer<|message|># Instructions\n\nBe terse.\
                    <|end|><|start|>user<|message|>Capital of France?<|end|><|start|>assistant\
                    <|channel|>final<|message|>Paris.<|end|><|start|>user<|message|>And of \
                    Italy?<|end|><|start|>assistant";
        assert_eq!(t.render(&conv, true).unwrap(), want);
    }
}
