//! `hob run`: generate from a prompt (-p) or chat (-i), streaming tokens to stdout, with
//! llama.cpp's flag names. A timing summary goes to stderr.

use clap::Args;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::engine::{tokenizer, ModelArgs};
use crate::format::keys;
use crate::generate::{
    ChatTemplate, Generator, Limits, Message, Sampler, SamplerConfig, Stop, StreamDecoder,
    Tokenizer,
};
use crate::model::Model;
use crate::Error;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt (the first user message in chat mode).
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Interactive multi-turn chat on stdin; /exit or EOF ends it, Ctrl-C stops an answer.
    #[arg(short = 'i', long = "interactive")]
    pub interactive: bool,
    /// Tokens to generate per answer (-1: until EOS or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// Context size in tokens (0: the model's, capped at 4096).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub ctx: usize,
    /// Temperature; 0 or less means greedy.
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Keep the K most likely tokens (0: off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Nucleus sampling threshold (1.0: off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens below this fraction of the top token's probability (0.0: off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalize repeats of the last --repeat-last-n tokens (1.0: off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the repeat penalty looks at.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed (-1: from the clock; printed on stderr).
    #[arg(short = 's', long = "seed", default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,
    /// System message for chat mode.
    #[arg(long = "system")]
    pub system: Option<String>,
    /// Keep generating past the end-of-sequence token (for benchmarks).
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// Plain completion of the prompt, without the chat template.
    #[arg(long = "no-chat")]
    pub no_chat: bool,
}

/// One conversation: the generator (a session and the tokens its KV cache holds), the tokenizer
/// and the sampler.
struct Chat<'a> {
    gen: Generator<'a>,
    tok: &'a Tokenizer,
    sampler: Sampler,
    stop: Arc<AtomicBool>,
    ignore_eos: bool,
    stats: bool,
}

impl Chat<'_> {
    /// Prefill `ids` and generate up to `n_predict` tokens, streaming them to `out`; the timing
    /// to stderr. Returns the answer's text.
    fn answer(
        &mut self,
        ids: &[u32],
        n_predict: Option<usize>,
        out: &mut dyn Write,
    ) -> crate::Result<String> {
        let mut stream = StreamDecoder::new(self.tok, true);
        let mut text = String::new();
        let mut emit = |piece: String, out: &mut dyn Write| -> crate::Result<()> {
            out.write_all(piece.as_bytes())
                .and_then(|_| out.flush())
                .map_err(|e| Error::io("<stdout>", "write", e))?;
            text.push_str(&piece);
            Ok(())
        };
        self.stop.store(false, Ordering::SeqCst);
        let limits = Limits {
            n_predict,
            ignore_eos: self.ignore_eos,
            stop: Some(&self.stop),
        };
        let sampling = (&mut self.sampler, self.tok);
        let (stop, timing) = self.gen.generate(ids, sampling, limits, |id| {
            let piece = stream.push(id)?;
            emit(piece, out)
        })?;
        emit(stream.flush()?, out)?;
        if stop == Stop::ContextFull {
            eprintln!("\n[context full: {} tokens]", self.gen.session().ctx());
        }
        println!();
        eprint!("{}", timing.report(self.stats));
        Ok(text)
    }
}

pub fn run(args: &RunArgs) -> crate::Result<()> {
    if args.prompt.is_none() && !args.interactive {
        return Err(Error::Invalid(
            "give a prompt with -p PROMPT, or chat with -i".into(),
        ));
    }
    let file = args.model.open()?;
    let model = Model::load(&file)?;
    let tok = tokenizer(&file, &model.cfg)?;
    let ctx = match args.ctx {
        0 => model.cfg.context_length.min(4096),
        c => c,
    };
    if ctx > model.cfg.context_length {
        return Err(Error::Invalid(format!(
            "-c {ctx}: the model's context length is {}",
            model.cfg.context_length
        )));
    }
    let seed = if args.seed < 0 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    } else {
        args.seed as u64
    };
    let sampler = Sampler::new(SamplerConfig {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        seed,
    })?;
    let template = match (args.no_chat, file.metadata().get_str(keys::CHAT_TEMPLATE)) {
        (false, Ok(src)) => {
            let name = |id: Option<u32>| id.and_then(|i| tok.id_to_token(i)).unwrap_or_default();
            Some(ChatTemplate::new(
                src,
                &name(model.cfg.bos),
                &name(model.cfg.eos),
            )?)
        }
        (false, Err(_)) => {
            eprintln!("note: the file has no chat template: plain completion");
            None
        }
        (true, _) => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    if args.interactive {
        let flag = stop.clone();
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
            .map_err(|e| Error::Invalid(format!("cannot install the Ctrl-C handler: {e}")))?;
    }
    let gen = args.model.generator(&file, &model, ctx)?;
    eprintln!(
        "hob: {} ({} layers, {} experts, top-{}), ctx {ctx}, seed {seed}; {}",
        file.path().display(),
        model.cfg.n_layers,
        model.cfg.n_experts,
        model.cfg.top_k,
        gen.describe()
    );
    let mut chat = Chat {
        gen,
        tok: &tok,
        sampler,
        stop,
        ignore_eos: args.ignore_eos,
        stats: args.model.stats,
    };
    converse(args, &mut chat, template.as_ref())
}

/// The conversation: one prompt, or (-i) turns read from stdin until /exit or EOF.
fn converse(
    args: &RunArgs,
    chat: &mut Chat<'_>,
    template: Option<&ChatTemplate>,
) -> crate::Result<()> {
    let n_predict = usize::try_from(args.n_predict).ok();
    let tok = chat.tok;
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(Message::system(system));
    }
    let stdout = std::io::stdout();
    let encode = |messages: &[Message], raw: &str| -> crate::Result<Vec<u32>> {
        Ok(match template {
            Some(t) => tok.encode(&t.render(messages, true)?, false)?,
            None => tok.encode(raw, true)?,
        })
    };
    if !args.interactive {
        let prompt = args.prompt.as_deref().unwrap_or_default();
        messages.push(Message::user(prompt));
        let ids = encode(&messages, prompt)?;
        chat.answer(&ids, n_predict, &mut stdout.lock())?;
        return Ok(());
    }
    let mut pending = args.prompt.clone();
    let mut transcript = String::new();
    let stdin = std::io::stdin();
    loop {
        let line = match pending.take() {
            Some(p) => p,
            None => {
                eprint!("\n> ");
                std::io::stderr().flush().ok();
                let mut line = String::new();
                let read = stdin
                    .lock()
                    .read_line(&mut line)
                    .map_err(|e| Error::io("<stdin>", "read", e))?;
                if read == 0 {
                    break;
                }
                line.trim_end_matches(['\n', '\r']).to_string()
            }
        };
        if line.trim() == "/exit" {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        messages.push(Message::user(&line));
        // Without a template the conversation is the running transcript.
        transcript.push_str(&line);
        let ids = encode(&messages, &transcript)?;
        let answer = chat.answer(&ids, n_predict, &mut stdout.lock())?;
        transcript.push_str(&answer);
        messages.push(Message::assistant(&answer));
    }
    Ok(())
}
