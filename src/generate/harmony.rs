//! The harmony format of gpt-oss (github.com/openai/harmony, docs/format.md): the chat template
//! hob writes where a gpt-oss checkpoint carries none, and the channels of an answer. An
//! assistant turn is messages `<|channel|>NAME<|message|>TEXT`, each ended by `<|end|>` (the next
//! one opened by `<|start|>assistant`) or, the turn's last, by `<|return|>` or `<|call|>`. The
//! answer is the `final` channel; `analysis` is the model's reasoning.

use super::{GenerateError, Tokenizer};

/// The conversation in harmony: a system message (identity, knowledge cutoff, reasoning effort
/// from the template variable `reasoning_effort`, default medium; the valid channels), the
/// system prompt as the developer's instructions, each user turn, each earlier answer as a
/// `final` message, and the assistant's turn opened.
pub const HARMONY_TEMPLATE: &str = concat!(
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n",
    "Knowledge cutoff: 2024-06\n\n",
    "Reasoning: {{ reasoning_effort if reasoning_effort is defined else 'medium' }}\n\n",
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.",
    "<|end|>",
    "{%- for message in messages %}",
    "{%- if message['role'] == 'system' or message['role'] == 'developer' %}",
    "{{ '<|start|>developer<|message|># Instructions\\n\\n' + message['content'] + '<|end|>' }}",
    "{%- elif message['role'] == 'user' %}",
    "{{ '<|start|>user<|message|>' + message['content'] + '<|end|>' }}",
    "{%- elif message['role'] == 'assistant' %}",
    "{{ '<|start|>assistant<|channel|>final<|message|>' + message['content'] + '<|end|>' }}",
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
    /// Text of another channel (`commentary`: tool-call preambles and calls).
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
    /// The ids of the channel header read so far.
    name: Vec<u32>,
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
        })
    }

    /// A new answer: the prompt ended with `<|start|>assistant`.
    pub fn begin(&mut self) {
        self.state = State::Role;
        self.name.clear();
    }

    /// The part `id` belongs to.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<Part, GenerateError> {
        if id == self.start {
            self.state = State::Role;
            return Ok(Part::Header);
        }
        if id == self.end {
            self.state = State::Role;
            return Ok(Part::Header);
        }
        match self.state {
            State::Role | State::Channel if id == self.channel => {
                self.state = State::Channel;
                self.name.clear();
                Ok(Part::Header)
            }
            State::Role | State::Channel if id == self.message => {
                let header = tok.decode(&self.name, true)?;
                // "final", "analysis", "commentary to=functions.x <|constrain|>json": the
                // channel is the header's first word.
                let part = match header.split_whitespace().next() {
                    Some("final") | None => Part::Final,
                    Some("analysis") => Part::Analysis,
                    Some(_) => Part::Other,
                };
                self.name.clear();
                self.state = State::Text(part);
                Ok(Part::Header)
            }
            State::Channel => {
                self.name.push(id);
                Ok(Part::Header)
            }
            State::Role => Ok(Part::Header),
            State::Text(part) => Ok(part),
        }
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
