//! `hob run`: generate from a prompt (-p) or chat (-i), streaming tokens to stdout, with
//! llama.cpp's flag names. A timing summary goes to stderr.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;

use super::engine::{tokenizer, ModelArgs};
use crate::format::keys;
use crate::generate::{ChatTemplate, Message, Sampler, SamplerConfig, StreamDecoder, Tokenizer};
use crate::model::{Logits, Model, Session};
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

/// Tokens fed to the model per forward call during prefill.
const PREFILL_BATCH: usize = 256;

/// Timing of one prompt + answer.
#[derive(Default)]
struct Stats {
    prompt_tokens: usize,
    prompt_time: Duration,
    gen_tokens: usize,
    gen_time: Duration,
    /// The expert engine's counters over the generation.
    experts: Option<crate::model::ExpertStats>,
}

impl Stats {
    /// The timing lines; with `experts`, the engine's breakdown too (--stats).
    fn print_all(&self, experts: bool) {
        self.print();
        if let (true, Some(e)) = (experts, &self.experts) {
            super::engine::print_expert_stats(e, self.gen_tokens, self.gen_time.as_secs_f64());
        }
    }

    fn print(&self) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let per = |d: Duration, n: usize| if n > 0 { ms(d) / n as f64 } else { 0.0 };
        let rate = |d: Duration, n: usize| {
            if d.as_secs_f64() > 0.0 {
                n as f64 / d.as_secs_f64()
            } else {
                0.0
            }
        };
        eprintln!(
            "\nprompt: {} tokens, {:.1} ms, {:.2} ms/token ({:.1} tokens/s)",
            self.prompt_tokens,
            ms(self.prompt_time),
            per(self.prompt_time, self.prompt_tokens),
            rate(self.prompt_time, self.prompt_tokens)
        );
        eprintln!(
            "generation: {} tokens, {:.1} ms, {:.2} ms/token ({:.2} tokens/s)",
            self.gen_tokens,
            ms(self.gen_time),
            per(self.gen_time, self.gen_tokens),
            rate(self.gen_time, self.gen_tokens)
        );
    }
}

/// One conversation: the model session and the tokens its KV cache holds.
struct Chat<'a> {
    model: &'a Model<'a>,
    st: Box<dyn Session + 'a>,
    /// Tokens in the KV cache, in order.
    cached: Vec<u32>,
    tok: &'a Tokenizer,
    sampler: Sampler,
    stop: Arc<AtomicBool>,
    ignore_eos: bool,
}

impl Chat<'_> {
    /// Bring the KV cache to `ids` (reusing the longest common prefix), then generate up to
    /// `n_predict` tokens, streaming them to `out`. Returns the answer's text.
    fn answer(
        &mut self,
        ids: &[u32],
        n_predict: Option<usize>,
        out: &mut dyn Write,
    ) -> crate::Result<(String, Stats)> {
        let ctx = self.st.ctx();
        if ids.len() >= ctx {
            return Err(Error::Invalid(format!(
                "the prompt is {} tokens but the context holds {ctx} (use a larger -c/--ctx-size, at most {})",
                ids.len(),
                self.model.cfg.context_length
            )));
        }
        let common = self
            .cached
            .iter()
            .zip(ids)
            .take_while(|(a, b)| a == b)
            .count();
        // Re-feed at least the last prompt token: its logits start the answer.
        let keep = common.min(ids.len() - 1);
        self.st.truncate(keep);
        self.cached.truncate(keep);
        let mut stats = Stats {
            prompt_tokens: ids.len() - keep,
            ..Stats::default()
        };
        let started = Instant::now();
        let mut logits = Vec::new();
        for chunk in ids[keep..].chunks(PREFILL_BATCH) {
            let last = chunk.as_ptr_range().end == ids.as_ptr_range().end;
            let want = if last { Logits::Last } else { Logits::None };
            let l = self.st.forward(chunk, want)?;
            if last {
                logits = l.to_vec();
            }
            self.cached.extend_from_slice(chunk);
        }
        stats.prompt_time = started.elapsed();

        self.st.reset_stats();
        let started = Instant::now();
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
        loop {
            if n_predict.is_some_and(|n| stats.gen_tokens >= n) || self.stop.load(Ordering::SeqCst)
            {
                break;
            }
            let next = self.sampler.sample(&logits, &self.cached);
            if self.tok.is_eos(next) && !self.ignore_eos {
                break;
            }
            stats.gen_tokens += 1;
            emit(stream.push(next)?, out)?;
            if self.st.pos() + 1 >= ctx {
                emit(stream.flush()?, out)?;
                eprintln!("\n[context full: {ctx} tokens]");
                break;
            }
            logits = self.st.forward(&[next], Logits::Last)?.to_vec();
            self.cached.push(next);
        }
        emit(stream.flush()?, out)?;
        stats.gen_time = started.elapsed();
        stats.experts = Some(self.st.expert_stats());
        Ok((text, stats))
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
    let n_predict = usize::try_from(args.n_predict).ok();
    let stop = Arc::new(AtomicBool::new(false));
    if args.interactive {
        let flag = stop.clone();
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
            .map_err(|e| Error::Invalid(format!("cannot install the Ctrl-C handler: {e}")))?;
    }
    let st = args.model.session(&file, &model, ctx)?;
    eprintln!(
        "hob: {} ({} layers, {} experts, top-{}), ctx {ctx}, seed {seed}; {}",
        file.path().display(),
        model.cfg.n_layers,
        model.cfg.n_experts,
        model.cfg.top_k,
        st.describe()
    );
    let mut session = Chat {
        model: &model,
        st,
        cached: Vec::new(),
        tok: &tok,
        sampler,
        stop,
        ignore_eos: args.ignore_eos,
    };
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(Message::system(system));
    }
    let stdout = std::io::stdout();
    let encode = |messages: &[Message], raw: &str| -> crate::Result<Vec<u32>> {
        Ok(match &template {
            Some(t) => tok.encode(&t.render(messages, true)?, false)?,
            None => tok.encode(raw, true)?,
        })
    };

    if !args.interactive {
        let prompt = args.prompt.as_deref().unwrap_or_default();
        messages.push(Message::user(prompt));
        let ids = encode(&messages, prompt)?;
        let (_, stats) = session.answer(&ids, n_predict, &mut stdout.lock())?;
        println!();
        stats.print_all(args.model.stats);
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
        let (answer, stats) = session.answer(&ids, n_predict, &mut stdout.lock())?;
        println!();
        stats.print_all(args.model.stats);
        transcript.push_str(&answer);
        messages.push(Message::assistant(&answer));
    }
    Ok(())
}
