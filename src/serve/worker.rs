//! The generation thread: one model, one request at a time, in arrival order. A job's events
//! (its prompt's size, text as it is generated, the end) go back to the HTTP side over a channel;
//! a job whose client went away stops within a token.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use tokio::sync::mpsc::UnboundedSender;

use super::api::{ApiError, Prompt, Request};
use super::metrics::Metrics;
use super::tools::{ToolCall, ToolChoice, ToolFormat, ToolSplitter};
use crate::generate::harmony::{Calls, Channels, Part};
use crate::generate::{
    ChatTemplate, Generator, Grammars, Limits, Sampler, SamplerConfig, Stop, StreamDecoder,
    Tokenizer,
};

/// What the generation thread needs, built on it (the model borrows its file there).
pub struct Loaded<'a> {
    pub gen: Generator<'a>,
    pub tok: Tokenizer,
    pub template: Option<ChatTemplate>,
    /// The server's sampling settings for what a request leaves out.
    pub defaults: SamplerConfig,
    /// The answer's length when a request gives none (None: until the end or a full context).
    pub n_predict: Option<usize>,
    /// The vocabulary compiled for structured output (None: response_format is refused).
    pub grammars: Option<Grammars>,
    /// A harmony model's channels (gpt-oss): a chat's answer is its final channel, the analysis
    /// channel goes out as `reasoning_content`.
    pub harmony: Option<Channels>,
}

/// A request in the queue.
pub struct Job {
    pub request: Request,
    pub events: UnboundedSender<Event>,
    /// Raised when the client goes away (or the server stops): generation ends within a token.
    pub cancel: Arc<AtomicBool>,
    pub queued: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The end of the answer or a stop sequence.
    Stop,
    /// max_tokens, or the context is full.
    Length,
    /// The answer is tool calls.
    ToolCalls,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
        }
    }
}

/// Token counts and times of one request.
#[derive(Clone, Debug, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV cache the previous request left (not prefilled again).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub prompt_time: Duration,
    pub gen_time: Duration,
    /// The expert engine over the answer: uses served and loaded per precision, skips, CPU
    /// computes, bytes loaded.
    pub experts: crate::experts::ExpertStats,
}

pub enum Event {
    /// The prompt was accepted and is being prefilled.
    Started,
    /// Generated text (never splits a character; held back while it may begin a stop sequence).
    Text(String),
    /// Generated reasoning (a harmony model's analysis channel).
    Reasoning(String),
    /// The answer's tool calls, parsed at its end.
    ToolCalls(Vec<ToolCall>),
    Done(Finish, Box<Usage>),
    Failed(ApiError),
}

/// Jobs until the channel closes (the server stops).
pub fn serve_jobs(
    mut loaded: Loaded<'_>,
    jobs: crossbeam_channel::Receiver<Job>,
    metrics: &Metrics,
) {
    for job in jobs {
        metrics.dequeued(job.queued.elapsed());
        if job.cancel.load(Ordering::SeqCst) {
            continue;
        }
        metrics.busy(true);
        let result = run_job(&mut loaded, &job, metrics);
        metrics.busy(false);
        match result {
            Ok(Some((finish, usage))) => {
                metrics.finished(&usage);
                job.events.send(Event::Done(finish, Box::new(usage))).ok();
            }
            Ok(None) => metrics.cancelled(),
            Err(e) => {
                job.events.send(Event::Failed(e)).ok();
            }
        }
    }
}

/// A chat's tool-call format, the text its answer was forced to start with, and the grammar
/// of the rest of a forced call.
type ToolPlan = Option<(ToolFormat, String, Option<String>)>;

/// The prompt's ids (and, for a chat with tools, how its answer carries calls), or a 400 naming
/// what is wrong with it.
fn prompt_ids(l: &Loaded<'_>, r: &Request) -> Result<(Vec<u32>, ToolPlan), ApiError> {
    let encode = |text: &str, special: bool| {
        l.tok
            .encode(text, special)
            .map_err(|e| ApiError::invalid("prompt", e.to_string()))
    };
    match &r.prompt {
        Prompt::Chat { messages, vars } => {
            let Some(t) = &l.template else {
                return Err(ApiError::invalid(
                    "messages",
                    "this model has no chat template: use /v1/completions",
                ));
            };
            let mut vars = vars.clone();
            let mut plan = None;
            if let Some((tools, choice)) = &r.tools {
                let format = match (&l.harmony, ToolFormat::detect(t.source())) {
                    (Some(_), _) => ToolFormat::Harmony,
                    (None, Some(f)) => f,
                    (None, None) => return Err(ApiError::invalid(
                        "tools",
                        "this model's chat template teaches no tool-call format hob reads (Hermes <tool_call>, Mistral [TOOL_CALLS], harmony)",
                    )),
                };
                if format == ToolFormat::Harmony && *choice == ToolChoice::Required {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        "tool_choice \"required\": a harmony model (gpt-oss) takes \"auto\" or a named function",
                    ));
                }
                vars.insert("tools".into(), serde_json::Value::Array(tools.clone()));
                let grammar = format.forced_grammar(choice, tools);
                plan = Some((format, format.forced_prefix(choice), grammar));
            }
            let mut text = t
                .render_with(messages, true, &vars)
                .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
            if let Some((_, prefix, _)) = &plan {
                text.push_str(prefix);
            }
            Ok((encode(&text, false)?, plan))
        }
        Prompt::Text(text) => Ok((encode(text, true)?, None)),
        Prompt::Ids(ids) => {
            let vocab = l.tok.vocab_size();
            match ids.iter().find(|&&id| id as usize >= vocab) {
                Some(id) => Err(ApiError::invalid(
                    "prompt",
                    format!("prompt: token id {id} is outside the vocabulary ({vocab} tokens)"),
                )),
                None => Ok((ids.clone(), None)),
            }
        }
    }
}

/// The sampler for a request: its fields over the server's defaults.
fn sampler(l: &Loaded<'_>, r: &Request) -> Result<Sampler, ApiError> {
    let s = &r.sampling;
    let d = &l.defaults;
    let cfg = SamplerConfig {
        temperature: s.temperature.unwrap_or(d.temperature),
        top_p: s.top_p.unwrap_or(d.top_p),
        top_k: s.top_k.map_or(d.top_k, |k| usize::try_from(k).unwrap_or(0)),
        min_p: s.min_p.unwrap_or(d.min_p),
        repeat_penalty: s.repeat_penalty.unwrap_or(d.repeat_penalty),
        presence_penalty: s.presence_penalty.unwrap_or(d.presence_penalty),
        frequency_penalty: s.frequency_penalty.unwrap_or(d.frequency_penalty),
        repeat_last_n: d.repeat_last_n,
        seed: s.seed.map_or_else(fresh_seed, |v| v as u64),
    };
    let mut sampler =
        Sampler::new(cfg).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    if let Some(schema) = &r.format {
        let Some(g) = &l.grammars else {
            return Err(ApiError::invalid(
                "response_format",
                "response_format: structured output is not available for this model's tokenizer",
            ));
        };
        let c = g
            .json_schema(schema.clone())
            .map_err(|e| ApiError::invalid("response_format", format!("response_format: {e}")))?;
        sampler.constrain(c);
    }
    Ok(sampler)
}

fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A request's prompt ids, its tool plan and its sampler (constrained to the tools' grammar where
/// the plan has one), once the prompt is known to fit the context.
fn prepare(l: &mut Loaded<'_>, r: &Request) -> Result<(Vec<u32>, ToolPlan, Sampler), ApiError> {
    let (ids, plan) = prompt_ids(l, r)?;
    let ctx = l.gen.session().ctx();
    if ids.len() >= ctx {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "the prompt is {} tokens and the context holds {ctx}: shorten it (the server's -c sets the context)",
                ids.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    l.gen
        .check_fits(ids.len())
        .map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
    let mut sampler = sampler(l, r)?;
    if let (Some((_, _, Some(grammar))), Some(g), None) = (&plan, &l.grammars, &r.format) {
        let c = g.lark(grammar).map_err(|e| {
            ApiError::invalid(
                "tools",
                format!("tools: a parameters schema does not compile: {e}"),
            )
        })?;
        sampler.constrain(c);
    }
    Ok((ids, plan, sampler))
}

/// One request; None when its client went away.
fn run_job(
    l: &mut Loaded<'_>,
    job: &Job,
    metrics: &Metrics,
) -> Result<Option<(Finish, Usage)>, ApiError> {
    let r = &job.request;
    let (ids, plan, mut sampler) = prepare(l, r)?;
    if job.events.send(Event::Started).is_err() {
        return Ok(None);
    }
    let mut stream = StreamDecoder::new(&l.tok, true);
    // Harmony's calls come from the answer's channels (the forced header read into them first).
    let harmony_prefix = match &plan {
        Some((ToolFormat::Harmony, prefix, _)) => Some(
            l.tok
                .encode(prefix, false)
                .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?,
        ),
        _ => None,
    };
    let mut out = Outgoing {
        job,
        stops: StopMatcher::new(&r.stop),
        tools: plan
            .filter(|(f, ..)| *f != ToolFormat::Harmony)
            .map(|(f, prefix, _)| (f, ToolSplitter::new(f, prefix))),
        stopped: false,
    };
    let limits = Limits {
        n_predict: r.max_tokens.or(l.n_predict),
        ignore_eos: r.ignore_eos,
        stop: Some(&job.cancel),
    };
    let mut harmony = match r.prompt {
        Prompt::Chat { .. } => l.harmony.take(),
        Prompt::Text(_) | Prompt::Ids(_) => None,
    };
    let mut reasoning = StreamDecoder::new(&l.tok, true);
    let tok = &l.tok;
    if let Some(h) = harmony.as_mut() {
        h.begin();
        for &id in harmony_prefix.iter().flatten() {
            h.push(tok, id)
                .map_err(|e| ApiError::invalid("tool_choice", e.to_string()))?;
        }
    }
    let mut calls = harmony_prefix.as_ref().map(|_| Calls::default());
    let result = l.gen.generate(&ids, (&mut sampler, tok), limits, |id| {
        let part = harmony.as_mut().map(|h| h.push(tok, id)).transpose()?;
        if let (Some(c), Some(p)) = (calls.as_mut(), part) {
            c.push(p, harmony.as_ref().and_then(|h| h.recipient()), id);
        }
        match part {
            None | Some(Part::Final) => {
                if out.push(&stream.push(id)?) {
                    job.cancel.store(true, Ordering::SeqCst);
                }
            }
            Some(Part::Analysis) => out.reason(reasoning.push(id)?),
            Some(Part::Header | Part::Call | Part::Other) => {}
        }
        metrics.token();
        Ok(())
    });
    if harmony.is_some() {
        out.reason(reasoning.flush().unwrap_or_default());
        l.harmony = harmony;
    }
    let (stop, timing) = result.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("generation failed: {e}"),
        )
    })?;
    if stop == Stop::Interrupted && !out.stopped {
        return Ok(None);
    }
    if !out.stopped {
        out.push(&stream.flush().unwrap_or_default());
    }
    let stopped = out.stopped;
    let texted = out.finish();
    let called = harmony_calls(calls, tok, job)?;
    let finish = match (texted || called, stop) {
        (true, _) => Finish::ToolCalls,
        _ if stopped => Finish::Stop,
        (_, Stop::Eos | Stop::Interrupted) => Finish::Stop,
        (_, Stop::Length | Stop::ContextFull) => Finish::Length,
    };
    let usage = Usage {
        prompt_tokens: ids.len(),
        cached_tokens: ids.len() - timing.prompt_tokens,
        completion_tokens: timing.gen_tokens,
        prompt_time: timing.prompt_time,
        gen_time: timing.gen_time,
        experts: timing.experts,
    };
    metrics.experts(&usage.experts);
    Ok(Some((finish, usage)))
}

/// A harmony answer's calls as OpenAI's tool_calls (true where there were any).
fn harmony_calls(calls: Option<Calls>, tok: &Tokenizer, job: &Job) -> Result<bool, ApiError> {
    let calls = match calls {
        Some(c) => c.finish(tok).map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("tool calls: {e}"),
            )
        })?,
        None => return Ok(false),
    };
    if calls.is_empty() {
        return Ok(false);
    }
    let calls = calls
        .into_iter()
        .map(|(name, arguments)| ToolCall { name, arguments })
        .collect();
    job.events.send(Event::ToolCalls(calls)).ok();
    Ok(true)
}

/// The answer's text on its way out: stop sequences first, then the split at a tool call.
struct Outgoing<'j> {
    job: &'j Job,
    stops: StopMatcher<'j>,
    tools: Option<(ToolFormat, ToolSplitter)>,
    /// A stop sequence matched: the rest of the answer is dropped.
    stopped: bool,
}

impl Outgoing<'_> {
    /// Take the next piece of text; true when a stop sequence matched.
    fn push(&mut self, piece: &str) -> bool {
        if self.stopped {
            return true;
        }
        let (ready, hit) = self.stops.push(piece);
        self.send(ready);
        self.stopped = hit;
        hit
    }

    /// Reasoning text: sent as it comes (stop sequences and tool calls apply to the answer).
    fn reason(&mut self, text: String) {
        if !self.stopped
            && !text.is_empty()
            && self.job.events.send(Event::Reasoning(text)).is_err()
        {
            self.job.cancel.store(true, Ordering::SeqCst);
        }
    }

    fn send(&mut self, text: String) {
        let text = match &mut self.tools {
            Some((_, split)) => split.push(&text),
            None => text,
        };
        if !text.is_empty() && self.job.events.send(Event::Text(text)).is_err() {
            self.job.cancel.store(true, Ordering::SeqCst);
        }
    }

    /// The end of the answer: what was held back goes out, as tool calls when it parses as
    /// such (returns true), else as text.
    fn finish(mut self) -> bool {
        if !self.stopped {
            let rest = self.stops.finish();
            self.send(rest);
        }
        let Some((format, split)) = self.tools.take() else {
            return false;
        };
        let (held, capturing) = split.finish();
        if capturing {
            if let Some(calls) = format.parse(&held) {
                self.job.events.send(Event::ToolCalls(calls)).ok();
                return true;
            }
        }
        if !held.is_empty() {
            self.job.events.send(Event::Text(held)).ok();
        }
        false
    }
}

/// Stop sequences over streamed text: text is released once it cannot be the start of a stop
/// sequence; at a match, the text before it is released and the rest dropped.
pub struct StopMatcher<'s> {
    stops: &'s [String],
    held: String,
}

impl<'s> StopMatcher<'s> {
    pub fn new(stops: &'s [String]) -> Self {
        StopMatcher {
            stops,
            held: String::new(),
        }
    }

    /// Take `piece`; returns the text now safe to send and whether a stop sequence matched.
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), false);
        }
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let out = self.held[..at].to_owned();
            self.held.clear();
            return (out, true);
        }
        // Hold back the longest tail that is a prefix of some stop sequence.
        let keep = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        (out, false)
    }

    /// The end of the answer: what was held back.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length in bytes of the longest suffix of `text` (on a character boundary) that is a proper
/// prefix of `stop`.
pub(super) fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = text.len().min(stop.len().saturating_sub(1));
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = vec![];
        for p in pieces {
            let (text, hit) = m.push(p);
            out.push(text);
            if hit {
                return (out, true, String::new());
            }
        }
        (out, false, m.finish())
    }

    #[test]
    fn stop_sequences_split_over_pieces() {
        assert_eq!(
            run(&["END"], &["ab", "cE", "N", "Dxy"]),
            (
                vec!["ab".into(), "c".into(), "".into(), "".into()],
                true,
                "".into()
            )
        );
        // A false start is released when it stops matching.
        assert_eq!(
            run(&["END"], &["aE", "Nx", "y"]),
            (vec!["a".into(), "ENx".into(), "y".into()], false, "".into())
        );
        // Held text comes out at the end.
        assert_eq!(
            run(&["END"], &["aEN"]),
            (vec!["a".into()], false, "EN".into())
        );
        // The earliest of several matches wins; multi-byte text is never split.
        assert_eq!(
            run(&["é!", "b"], &["aé", "!b"]),
            (vec!["a".into(), "".into()], true, "".into())
        );
        assert_eq!(run(&[], &["x", "y"]).0, vec!["x".to_string(), "y".into()]);
    }
}
