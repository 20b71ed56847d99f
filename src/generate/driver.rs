//! The one generation driver: prompt -> prefill -> decode loop -> stop conditions -> timing,
//! over a [`Session`]. `hob run` samples with it, `hob bench` feeds it a fixed token trace,
//! `hob perplexity` scores chunks with it and `hob calibrate` feeds chunks through it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{Sampler, Session, Tokenizer};
use crate::experts::ExpertStats;
use crate::model::Logits;
use crate::Error;

/// Tokens fed to the model per forward call while prefilling a prompt.
pub const PREFILL_BATCH: usize = 256;

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The model ended its answer (end of sequence, or a stop token).
    Eos,
    /// `n_predict` tokens were generated.
    Length,
    /// The KV cache is full.
    ContextFull,
    /// The stop flag was raised (Ctrl-C).
    Interrupted,
}

/// When a decode loop ends, besides the end-of-sequence token.
#[derive(Clone, Copy, Default)]
pub struct Limits<'s> {
    /// Tokens to generate at most (None: until EOS or a full context).
    pub n_predict: Option<usize>,
    /// Keep generating past EOS (benchmarks).
    pub ignore_eos: bool,
    /// Checked before every prompt batch and every token.
    pub stop: Option<&'s AtomicBool>,
}

/// Timing of one prompt and its answer, and the expert engine's counters over the answer.
#[derive(Clone, Debug, Default)]
pub struct Timing {
    /// Turning the prompt into ids, where the caller timed it (zero: not reported).
    pub tokenize_time: Duration,
    pub prompt_tokens: usize,
    pub prompt_time: Duration,
    pub gen_tokens: usize,
    pub gen_time: Duration,
    pub experts: ExpertStats,
}

impl Timing {
    /// llama.cpp-style timing lines; with `experts`, the engine's breakdown too (--stats).
    pub fn report(&self, experts: bool) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let per = |d: Duration, n: usize| if n > 0 { ms(d) / n as f64 } else { 0.0 };
        let rate = |d: Duration, n: usize| {
            let s = d.as_secs_f64();
            if s > 0.0 {
                n as f64 / s
            } else {
                0.0
            }
        };
        let mut s = String::new();
        if !self.tokenize_time.is_zero() {
            s += &format!("\ntokenize: {:.1} ms", ms(self.tokenize_time));
        }
        s += &format!(
            "\nprompt: {} tokens, {:.1} ms, {:.2} ms/token ({:.1} tokens/s)\ngeneration: {} tokens, {:.1} ms, {:.2} ms/token ({:.2} tokens/s)\n",
            self.prompt_tokens,
            ms(self.prompt_time),
            per(self.prompt_time, self.prompt_tokens),
            rate(self.prompt_time, self.prompt_tokens),
            self.gen_tokens,
            ms(self.gen_time),
            per(self.gen_time, self.gen_tokens),
            rate(self.gen_time, self.gen_tokens)
        );
        if experts {
            s += &self
                .experts
                .report(self.gen_tokens, self.gen_time.as_secs_f64());
        }
        s
    }
}

/// A session and the tokens its KV cache holds.
pub struct Generator<'a> {
    session: Box<dyn Session + 'a>,
    /// Tokens in the KV cache, in order.
    cached: Vec<u32>,
}

impl<'a> Generator<'a> {
    pub fn new(session: Box<dyn Session + 'a>) -> Self {
        Generator {
            session,
            cached: Vec::new(),
        }
    }

    pub fn session(&mut self) -> &mut (dyn Session + 'a) {
        &mut *self.session
    }

    pub fn describe(&self) -> String {
        self.session.describe()
    }

    /// Forget the sequence: the next tokens start at position 0.
    pub fn reset(&mut self) {
        self.session.truncate(0);
        self.cached.clear();
    }

    /// Bring the KV cache to `ids`, reusing the longest prefix it holds already and feeding the
    /// rest `batch` tokens per forward pass (the last prompt token always: its logits start
    /// the answer). Returns the last position's logits, or None when `stop` was raised between
    /// two batches (the cache then holds the part fed).
    pub fn prefill(
        &mut self,
        ids: &[u32],
        batch: usize,
        stop: Option<&AtomicBool>,
    ) -> crate::Result<Option<Vec<f32>>> {
        self.check_fits(ids.len())?;
        let common = self
            .cached
            .iter()
            .zip(ids)
            .take_while(|(a, b)| a == b)
            .count();
        let keep = common.min(ids.len() - 1);
        self.session.truncate(keep);
        self.cached.truncate(keep);
        let mut logits = Vec::new();
        for chunk in ids[keep..].chunks(batch.max(1)) {
            if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
                return Ok(None);
            }
            let last = chunk.as_ptr_range().end == ids.as_ptr_range().end;
            let want = if last { Logits::Last } else { Logits::None };
            let l = self.session.forward(chunk, want)?;
            if last {
                logits = l.to_vec();
            }
            self.cached.extend_from_slice(chunk);
        }
        Ok(Some(logits))
    }

    /// A prompt of `n` tokens can be prefilled: it is not empty and leaves room for an answer.
    pub fn check_fits(&self, n: usize) -> crate::Result<()> {
        let ctx = self.session.ctx();
        let max = self.session.config().context_length;
        if n == 0 {
            return Err(Error::Invalid(
                "the prompt is empty and the model adds no BOS token: nothing to continue (give a prompt)"
                    .into(),
            ));
        }
        if n < ctx {
            return Ok(());
        }
        let what = if ctx < max {
            format!("raise -c/--ctx-size (at most {max}, the model's) or shorten it")
        } else {
            "that is the model's whole context: shorten it".to_string()
        };
        Err(Error::Invalid(format!(
            "the prompt is {n} tokens and the context holds {ctx}: {what}"
        )))
    }

    /// Sample from `logits` and feed each token back until a limit, the end of sequence
    /// (`tok`'s EOS or stop tokens) or a full context; each generated token goes to
    /// `on_token` as it is sampled. Returns why it stopped and how many tokens it generated.
    pub fn decode(
        &mut self,
        mut logits: Vec<f32>,
        (sampler, tok): (&mut Sampler, &Tokenizer),
        limits: Limits<'_>,
        mut on_token: impl FnMut(u32) -> crate::Result<()>,
    ) -> crate::Result<(Stop, usize)> {
        let ctx = self.session.ctx();
        let mut n = 0usize;
        loop {
            if limits.n_predict.is_some_and(|max| n >= max) {
                return Ok((Stop::Length, n));
            }
            if limits.stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
                return Ok((Stop::Interrupted, n));
            }
            let next = sampler.sample(&logits, &self.cached);
            if tok.is_eos(next) && !limits.ignore_eos {
                return Ok((Stop::Eos, n));
            }
            n += 1;
            on_token(next)?;
            if self.session.pos() + 1 >= ctx {
                return Ok((Stop::ContextFull, n));
            }
            logits = self.session.forward(&[next], Logits::Last)?.to_vec();
            self.cached.push(next);
        }
    }

    /// A prompt and its answer with their timing: `prefill`, then `decode` with the engine's
    /// counters reset in between.
    pub fn generate(
        &mut self,
        ids: &[u32],
        sampling: (&mut Sampler, &Tokenizer),
        limits: Limits<'_>,
        on_token: impl FnMut(u32) -> crate::Result<()>,
    ) -> crate::Result<(Stop, Timing)> {
        let common = self.cached.iter().zip(ids).take_while(|(a, b)| a == b);
        let reused = common.count().min(ids.len().saturating_sub(1));
        let started = Instant::now();
        let Some(logits) = self.prefill(ids, PREFILL_BATCH, limits.stop)? else {
            let timing = Timing {
                prompt_time: started.elapsed(),
                ..Timing::default()
            };
            return Ok((Stop::Interrupted, timing));
        };
        let prompt_time = started.elapsed();
        self.session.reset_stats();
        let started = Instant::now();
        let (stop, gen_tokens) = self.decode(logits, sampling, limits, on_token)?;
        Ok((
            stop,
            Timing {
                tokenize_time: Duration::ZERO,
                prompt_tokens: ids.len() - reused,
                prompt_time,
                gen_tokens,
                gen_time: started.elapsed(),
                experts: self.session.expert_stats(),
            },
        ))
    }

    /// From an empty context: `tokens` in one forward pass (`one_pass`: a prefill) or one
    /// token per pass (decode), with no sampling and no logits kept. Returns the seconds taken.
    pub fn feed_timed(&mut self, tokens: &[u32], one_pass: bool) -> crate::Result<f64> {
        self.reset();
        let started = Instant::now();
        if one_pass {
            self.session.forward(tokens, Logits::Last)?;
        } else {
            for &t in tokens {
                self.session.forward(&[t], Logits::Last)?;
            }
        }
        Ok(started.elapsed().as_secs_f64())
    }

    /// From an empty context: `chunk` without logits, in one pass.
    pub fn feed(&mut self, chunk: &[u32]) -> crate::Result<()> {
        self.reset();
        self.session.forward(chunk, Logits::None)?;
        Ok(())
    }

    /// llama.cpp's perplexity chunk: from an empty context, the first `first` tokens unscored,
    /// then the logits of every later position into `out`, `batch` tokens per forward pass
    /// (default: half a chunk).
    pub fn score(
        &mut self,
        chunk: &[u32],
        first: usize,
        batch: Option<usize>,
        out: &mut Vec<f32>,
    ) -> crate::Result<()> {
        self.reset();
        out.clear();
        let b = batch.unwrap_or(first.max(chunk.len() - first)).max(1);
        for part in chunk[..first].chunks(b) {
            self.session.forward(part, Logits::None)?;
        }
        for part in chunk[first..].chunks(b) {
            out.extend_from_slice(self.session.forward(part, Logits::All)?);
        }
        Ok(())
    }
}
