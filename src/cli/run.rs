//! `hob run`: generate from a prompt (-p, -f) or chat (-i), streaming tokens to stdout, with
//! llama.cpp's flag names and meanings. A timing summary goes to stderr.

use clap::Args;
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::engine::{tokenizer, ModelArgs};
use super::out::{out, outln};
use crate::format::keys;
use crate::generate::harmony::{Channels, Part};
use crate::generate::{
    ChatTemplate, Generator, Limits, Message, Sampler, SamplerConfig, Stop, StreamDecoder,
    Tokenizer,
};
use crate::model::{Architecture, Model};
use crate::Error;

/// Sampling flags, llama.cpp's names and defaults (`hob run`, and `hob serve`'s defaults for
/// what a request leaves out).
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 or less means greedy.
    #[arg(
        long = "temp",
        default_value_t = 0.8,
        allow_negative_numbers = true,
        help_heading = "Sampling"
    )]
    pub temp: f32,
    /// Keep the K most likely tokens (0 or -1: off).
    #[arg(long = "top-k", default_value_t = 40, value_parser = top_k, help_heading = "Sampling")]
    pub top_k: usize,
    /// Nucleus sampling threshold (1.0: off).
    #[arg(long = "top-p", default_value_t = 0.95, help_heading = "Sampling")]
    pub top_p: f32,
    /// Drop tokens below this fraction of the top token's probability (0.0: off).
    #[arg(long = "min-p", default_value_t = 0.05, help_heading = "Sampling")]
    pub min_p: f32,
    /// Penalize repeats of the last --repeat-last-n tokens (1.0: off).
    #[arg(
        long = "repeat-penalty",
        default_value_t = 1.0,
        help_heading = "Sampling"
    )]
    pub repeat_penalty: f32,
    /// Subtract this from a token's logit once it is among the last --repeat-last-n tokens
    /// (OpenAI's presence_penalty; 0.0: off).
    #[arg(
        long = "presence-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true,
        help_heading = "Sampling"
    )]
    pub presence_penalty: f32,
    /// Subtract this times its count among the last --repeat-last-n tokens from a token's logit
    /// (OpenAI's frequency_penalty; 0.0: off).
    #[arg(
        long = "frequency-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true,
        help_heading = "Sampling"
    )]
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at (0: off, -1: the whole context).
    #[arg(long = "repeat-last-n", default_value_t = 64, value_parser = repeat_last_n,
          help_heading = "Sampling")]
    pub repeat_last_n: i64,
    /// Random seed (-1: from the clock; printed on stderr).
    #[arg(short = 's', long = "seed", default_value_t = -1, value_parser = seed,
          help_heading = "Sampling")]
    pub seed: i64,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The prompt (the first user message in chat mode); "-" reads it from stdin.
    #[arg(short = 'p', long = "prompt", help_heading = "Prompt")]
    pub prompt: Option<String>,
    /// Read the prompt from FILE ("-": stdin), for prompts too long for a command line.
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with = "prompt",
        help_heading = "Prompt"
    )]
    pub file: Option<PathBuf>,
    /// Interactive multi-turn chat (llama.cpp's -cnv): Ctrl-D, /exit or Ctrl-C at the prompt
    /// quits; Ctrl-C stops an answer; /clear starts over.
    #[arg(
        short = 'i',
        long = "interactive",
        visible_alias = "conversation",
        help_heading = "Prompt"
    )]
    pub interactive: bool,
    /// One answer and exit (llama.cpp's -no-cnv; hob's default without -i).
    #[arg(long = "no-conversation", conflicts_with = "interactive", hide = true)]
    pub no_conversation: bool,
    /// System message for chat mode (llama.cpp's -sys).
    #[arg(
        long = "system",
        visible_alias = "system-prompt",
        help_heading = "Prompt"
    )]
    pub system: Option<String>,
    /// Plain completion of the prompt, without the chat template.
    #[arg(long = "no-chat", help_heading = "Prompt")]
    pub no_chat: bool,
    /// Print gpt-oss's reasoning (its analysis channel) to stderr before each answer; without
    /// it only the final channel is printed.
    #[arg(long = "show-reasoning", help_heading = "Prompt")]
    pub show_reasoning: bool,
    /// Variables for the chat template, a JSON object (as llama.cpp's), e.g.
    /// '{"enable_thinking": false}' for Qwen3's answers without a thinking block.
    #[arg(long = "chat-template-kwargs", value_name = "JSON", value_parser = json_object,
          help_heading = "Prompt")]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Tokens to generate per answer (-1, -2: until the end of the answer or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, value_parser = n_predict,
          help_heading = "Prompt")]
    pub n_predict: i64,
    /// Context size in tokens (0: the model's, capped at 4096).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0, value_parser = ctx_size,
          help_heading = "Prompt")]
    pub ctx: usize,
    /// Keep generating past the end-of-sequence token (for benchmarks).
    #[arg(long = "ignore-eos", help_heading = "Prompt")]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

fn int(s: &str) -> Result<i64, String> {
    s.parse::<i64>()
        .map_err(|_| format!("{s:?} is not a whole number"))
}

/// llama.cpp's -n: -1 until the end of the answer, -2 until the context is full (hob never
/// shifts the context, so both stop at a full context).
pub(crate) fn n_predict(s: &str) -> Result<i64, String> {
    match int(s)? {
        n if n >= -2 => Ok(n),
        _ => Err("a number of tokens, or -1 (no limit)".into()),
    }
}

pub(crate) fn ctx_size(s: &str) -> Result<usize, String> {
    usize::try_from(int(s)?).map_err(|_| "a number of tokens (0: the model's)".into())
}

/// llama.cpp's --top-k: 0 or less turns it off.
pub(crate) fn top_k(s: &str) -> Result<usize, String> {
    Ok(usize::try_from(int(s)?).unwrap_or(0))
}

pub(crate) fn repeat_last_n(s: &str) -> Result<i64, String> {
    match int(s)? {
        n if n >= -1 => Ok(n),
        _ => Err("0 or more tokens, or -1 (the whole context)".into()),
    }
}

pub(crate) fn seed(s: &str) -> Result<i64, String> {
    match int(s)? {
        n if n >= -1 => Ok(n),
        _ => Err("0 or more, or -1 (from the clock)".into()),
    }
}

/// The prompt of -p or -f ("-": stdin), if any.
fn prompt_text(args: &RunArgs) -> crate::Result<Option<String>> {
    let from_stdin = |what: &str| -> crate::Result<String> {
        if args.interactive {
            return Err(Error::Invalid(format!(
                "{what} -: stdin is the chat's input with -i; give the first message with -p TEXT or -f FILE"
            )));
        }
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| Error::io("<stdin>", "read the prompt", e))?;
        Ok(s)
    };
    let text = match (&args.prompt, &args.file) {
        (Some(p), _) if p == "-" => from_stdin("-p")?,
        (Some(p), _) => return Ok(Some(p.clone())),
        (None, Some(f)) if f.as_os_str() == "-" => from_stdin("-f")?,
        (None, Some(f)) => std::fs::read_to_string(f).map_err(|e| Error::io(f, "read", e))?,
        (None, None) => return Ok(None),
    };
    // As llama.cpp reads -f: a file's last newline ends the file, not the prompt.
    let text = text.strip_suffix('\n').unwrap_or(&text);
    Ok(Some(text.strip_suffix('\r').unwrap_or(text).to_string()))
}

/// One conversation: the generator (a session and the tokens its KV cache holds), the tokenizer,
/// the sampler and the chat template.
pub(super) struct Chat<'a> {
    /// The .hob file, named by template errors.
    pub path: &'a std::path::Path,
    pub gen: Generator<'a>,
    pub tok: &'a Tokenizer,
    pub template: Option<&'a ChatTemplate>,
    sampler: Sampler,
    pub stop: Arc<AtomicBool>,
    ignore_eos: bool,
    stats: bool,
    pub n_predict: Option<usize>,
    /// How long the last `encode` took (reported beside the prompt's time: a first token waits
    /// for both).
    tokenized: std::time::Duration,
    /// A harmony answer's channels (gpt-oss), and whether its reasoning is shown.
    harmony: Option<(Channels, bool)>,
}

impl Chat<'_> {
    /// The prompt ids of `messages` (through the template), or of `raw` without one.
    pub fn encode(&mut self, messages: &[Message], raw: &str) -> crate::Result<Vec<u32>> {
        let started = std::time::Instant::now();
        let ids = match self.template {
            Some(t) => {
                let text = t
                    .render(messages, true)
                    .map_err(|e| template_error(self.path, e))?;
                self.tok.encode(&text, false)?
            }
            None => self.tok.encode(raw, true)?,
        };
        self.tokenized = started.elapsed();
        Ok(ids)
    }

    /// Prefill `ids` and generate up to `n_predict` tokens, streaming them to stdout; the timing
    /// to stderr. Returns the answer's text and why it stopped.
    pub fn answer(&mut self, ids: &[u32]) -> crate::Result<(String, Stop)> {
        let (tok, mut harmony) = (self.tok, self.harmony.take());
        let (mut stream, mut reasoning) =
            (StreamDecoder::new(tok, true), StreamDecoder::new(tok, true));
        let mut text = String::new();
        let mut emit = |piece: String| {
            out!("{piece}");
            text.push_str(&piece);
        };
        if let Some((h, _)) = harmony.as_mut() {
            h.begin();
        }
        self.stop.store(false, Ordering::SeqCst);
        let limits = Limits {
            n_predict: self.n_predict,
            ignore_eos: self.ignore_eos,
            stop: Some(&self.stop),
        };
        let sampling = (&mut self.sampler, self.tok);
        let generated = self.gen.generate(ids, sampling, limits, |id| {
            match harmony.as_mut().map(|(h, show)| (h.push(tok, id), *show)) {
                None | Some((Ok(Part::Final), _)) => emit(stream.push(id)?),
                Some((Ok(Part::Analysis), true)) => eprint!("{}", reasoning.push(id)?),
                Some((Ok(_), _)) => {}
                Some((Err(e), _)) => return Err(e.into()),
            }
            Ok(())
        });
        self.harmony = harmony;
        let (stop, mut timing) = generated?;
        timing.tokenize_time = std::mem::take(&mut self.tokenized);
        eprint!("{}", reasoning.flush()?);
        emit(stream.flush()?);
        match stop {
            Stop::ContextFull => eprint!("\n[context full: {} tokens]", self.gen.session().ctx()),
            Stop::Interrupted => eprint!("\n[stopped]"),
            Stop::Eos | Stop::Length => {}
        }
        outln!();
        eprint!("{}", timing.report(self.stats));
        Ok((text, stop))
    }
}

/// A chat template's error, named by the file and key it came from.
pub(crate) fn template_error(path: &std::path::Path, e: crate::generate::GenerateError) -> Error {
    Error::Invalid(format!(
        "{}: metadata key '{}': {e}",
        path.display(),
        keys::CHAT_TEMPLATE
    ))
}

impl SamplingArgs {
    /// The sampler's settings for a context of `ctx` tokens; a seed of -1 is drawn from the
    /// clock.
    pub fn config(&self, ctx: usize) -> SamplerConfig {
        let seed = if self.seed < 0 {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        } else {
            self.seed as u64
        };
        SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: usize::try_from(self.repeat_last_n).unwrap_or(ctx),
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
        }
    }
}

pub fn run(args: &RunArgs) -> crate::Result<()> {
    let prompt = prompt_text(args)?;
    if prompt.is_none() && !args.interactive {
        return Err(Error::Invalid(
            "give a prompt with -p TEXT or -f FILE, or chat with -i".into(),
        ));
    }
    let file = args.model.open()?;
    let model = Model::load(&file)?;
    let tok = tokenizer(&file, &model.cfg)?;
    let ctx = context_size(&file, &model, args.ctx)?;
    let config = args.sampling.config(ctx);
    let seed = config.seed;
    let sampler = Sampler::new(config)?;
    let template = match args.no_chat {
        false => chat_template(&file, &model, &tok, args.chat_template_kwargs.as_ref())?,
        true => None,
    };
    if template.is_none() && !args.no_chat {
        eprintln!("note: the file has no chat template: plain completion");
    }
    let stop = Arc::new(AtomicBool::new(false));
    if args.interactive {
        // Ctrl-C stops an answer; SIGTERM and SIGHUP keep their default: they end hob.
        signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())
            .map_err(|e| Error::Invalid(format!("cannot install the Ctrl-C handler: {e}")))?;
    }
    let gen = args.model.generator(&file, &model, ctx)?;
    eprintln!(
        "{}",
        started(&file, &model, &format!("ctx {ctx}, seed {seed}"), &gen)
    );
    let mut chat = Chat {
        path: file.path(),
        gen,
        tok: &tok,
        template: template.as_ref(),
        sampler,
        stop,
        ignore_eos: args.ignore_eos,
        stats: args.model.stats,
        n_predict: usize::try_from(args.n_predict).ok(),
        tokenized: std::time::Duration::ZERO,
        harmony: match (model.cfg.arch, template.is_some()) {
            (Architecture::GptOss, true) => Channels::new(&tok).map(|c| (c, args.show_reasoning)),
            _ => None,
        },
    };
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(Message::system(system));
    }
    if args.interactive {
        return super::chat::converse(&mut chat, messages, prompt);
    }
    let prompt = prompt.unwrap_or_default();
    messages.push(Message::user(&prompt));
    let ids = chat.encode(&messages, &prompt)?;
    chat.gen
        .check_fits(ids.len())
        .map_err(|e| Error::Invalid(format!("{}: {e}", file.path().display())))?;
    chat.answer(&ids)?;
    Ok(())
}

/// `-c`: the context in tokens (0: the model's, at most 4096), at most the model's.
pub(crate) fn context_size(
    file: &crate::format::HobFile,
    model: &Model<'_>,
    requested: usize,
) -> crate::Result<usize> {
    let max = model.cfg.context_length;
    let ctx = if requested == 0 {
        max.min(4096)
    } else {
        requested
    };
    if ctx > max {
        return Err(Error::Invalid(format!(
            "-c {ctx}: the context length of {} is {max}",
            file.path().display()
        )));
    }
    Ok(ctx)
}

/// The line a generating command prints once the model is ready: file, shape, `what`, engine.
pub(crate) fn started(
    file: &crate::format::HobFile,
    model: &Model<'_>,
    what: &str,
    gen: &Generator<'_>,
) -> String {
    format!(
        "hob: {} ({} layers, {} experts, top-{}), {what}; {}",
        file.path().display(),
        model.cfg.n_layers,
        model.cfg.n_experts,
        model.cfg.top_k,
        gen.describe()
    )
}

/// The file's chat template with `kwargs` (--chat-template-kwargs) set, or None when it has
/// none.
pub fn chat_template(
    file: &crate::format::HobFile,
    model: &Model<'_>,
    tok: &Tokenizer,
    kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
) -> crate::Result<Option<ChatTemplate>> {
    let Ok(src) = file.metadata().get_str(keys::CHAT_TEMPLATE) else {
        return Ok(None);
    };
    let name = |id: Option<u32>| id.and_then(|i| tok.id_to_token(i)).unwrap_or_default();
    let mut t = ChatTemplate::new(src, &name(model.cfg.bos), &name(model.cfg.eos))
        .map_err(|e| template_error(file.path(), e))?;
    for (k, v) in kwargs.into_iter().flatten() {
        t.set_var(k, v)
            .map_err(|e| Error::Invalid(format!("--chat-template-kwargs: {e}")))?;
    }
    Ok(Some(t))
}

/// A JSON object (--chat-template-kwargs).
pub(crate) fn json_object(s: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(other) => Err(format!(
            "a JSON object, e.g. '{{\"enable_thinking\": false}}', not {other}"
        )),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}
