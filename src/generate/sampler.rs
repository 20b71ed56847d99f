//! Token sampling with llama.cpp's flags and order: repetition penalty, top-k, top-p, min-p,
//! temperature, then a draw from the remaining distribution with a seeded ChaCha8 stream (same
//! seed and logits, same tokens, on every platform).

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Constraint, GenerateError};

#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; <= 0 picks the most likely token (greedy).
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p; 1.0 = off.
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely one; 0.0 = off.
    pub min_p: f32,
    /// llama.cpp's repeat penalty over the last `repeat_last_n` tokens; 1.0 = off.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at; 0 = off.
    pub repeat_last_n: usize,
    /// OpenAI's penalties, as llama.cpp applies them over the same window: a token's logit
    /// less `presence_penalty` once it is there and `frequency_penalty` per occurrence; 0 = off.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults (`llama-cli`), seed aside: llama.cpp draws a random one.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    pub fn validate(&self) -> Result<(), GenerateError> {
        let invalid = |field, expected, found: f32| GenerateError::InvalidSampler {
            field,
            expected,
            found: found.to_string(),
        };
        if !self.temperature.is_finite() {
            return Err(invalid("temperature", "a finite number", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(invalid("top_p", "in (0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(invalid("min_p", "in [0, 1]", self.min_p));
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return Err(invalid(
                "repeat_penalty",
                "a finite number > 0",
                self.repeat_penalty,
            ));
        }
        for (field, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !v.is_finite() {
                return Err(invalid(field, "a finite number", v));
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
struct Candidate {
    id: u32,
    logit: f32,
}

/// Most likely first; equal logits in id order, so that the result never depends on the sort.
fn by_logit_desc(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha8Rng,
    /// (vocab) candidates of the current step, reused so that a step allocates nothing.
    candidates: Vec<Candidate>,
    /// (vocab) occurrences of each id in the penalty window, zero again once it is penalized:
    /// a token repeated in the window is penalized once, as in llama.cpp.
    counts: Vec<u32>,
    /// A grammar the answer must follow (structured output), and its scratch logits.
    constraint: Option<Constraint>,
    masked: Vec<f32>,
    /// Why the grammar was dropped mid-answer, if it was.
    constraint_error: Option<String>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Result<Self, GenerateError> {
        cfg.validate()?;
        Ok(Sampler {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            candidates: Vec::new(),
            counts: Vec::new(),
            constraint: None,
            masked: Vec::new(),
            constraint_error: None,
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// From now on, only tokens that `c` allows (the end of sequence once it is complete).
    pub fn constrain(&mut self, c: Constraint) {
        self.constraint = Some(c);
        self.constraint_error = None;
    }

    /// Why the constraint stopped applying (a grammar error mid-answer), if it did.
    pub fn constraint_error(&self) -> Option<&str> {
        self.constraint_error.as_deref()
    }

    /// Pick the next token from `logits` (vocab, non-empty); `history` holds the tokens so far
    /// (prompt and generated) for the repeat penalty.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        assert!(!logits.is_empty(), "sampler: empty logits");
        let mut logits = logits;
        if let Some(c) = &mut self.constraint {
            self.masked.clear();
            self.masked.extend_from_slice(logits);
            match c.mask(&mut self.masked) {
                Ok(()) => logits = &self.masked,
                Err(e) => {
                    log::warn!("structured output dropped: {e}");
                    self.constraint_error = Some(e.to_string());
                    self.constraint = None;
                }
            }
        }
        self.candidates.clear();
        self.candidates
            .extend(logits.iter().enumerate().map(|(id, &logit)| Candidate {
                id: id as u32,
                logit,
            }));
        let id = self.pick(history);
        if let Some(c) = &mut self.constraint {
            if let Err(e) = c.accept(id) {
                self.constraint_error = Some(e.to_string());
                self.constraint = None;
            }
        }
        id
    }

    /// The draw itself, over `candidates`.
    fn pick(&mut self, history: &[u32]) -> u32 {
        self.apply_penalties(history);

        if self.cfg.temperature <= 0.0 {
            return self.argmax();
        }
        let cfg = &self.cfg;
        let candidates = &mut self.candidates;

        if cfg.top_k > 0 && cfg.top_k < candidates.len() {
            candidates.select_nth_unstable_by(cfg.top_k - 1, by_logit_desc);
            candidates.truncate(cfg.top_k);
        }
        candidates.sort_unstable_by(by_logit_desc);
        let max_logit = candidates[0].logit;

        if cfg.top_p < 1.0 {
            // llama.cpp: probabilities at temperature 1 over what top-k left; keep up to and
            // including the token whose cumulative probability reaches p.
            let total: f64 = candidates
                .iter()
                .map(|c| f64::from(c.logit - max_logit).exp())
                .sum();
            let mut cumulative = 0.0;
            let mut keep = candidates.len();
            for (i, c) in candidates.iter().enumerate() {
                cumulative += f64::from(c.logit - max_logit).exp() / total;
                if cumulative >= f64::from(cfg.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            candidates.truncate(keep);
        }

        if cfg.min_p > 0.0 {
            // p >= min_p * p_max  <=>  logit >= max_logit + ln(min_p); the first always stays.
            let threshold = max_logit + cfg.min_p.ln();
            let keep = candidates.partition_point(|c| c.logit >= threshold);
            candidates.truncate(keep.max(1));
        }

        let inv_temperature = 1.0 / f64::from(cfg.temperature);
        let weight = |c: &Candidate| (f64::from(c.logit - max_logit) * inv_temperature).exp();
        let total: f64 = candidates.iter().map(weight).sum();
        let target = uniform(&mut self.rng) * total;
        let mut cumulative = 0.0;
        for c in candidates.iter() {
            cumulative += weight(c);
            if cumulative > target {
                return c.id;
            }
        }
        // Rounding left `target` at the very top of the range.
        candidates[candidates.len() - 1].id
    }

    /// llama.cpp's penalties: a logit that would favour the token is divided by the repeat
    /// penalty, one that already disfavours it is multiplied, so the token always gets less
    /// likely; then the count-based presence and frequency terms come off.
    fn apply_penalties(&mut self, history: &[u32]) {
        let cfg = &self.cfg;
        let none = cfg.repeat_penalty == 1.0
            && cfg.presence_penalty == 0.0
            && cfg.frequency_penalty == 0.0;
        if none || cfg.repeat_last_n == 0 {
            return;
        }
        if self.counts.len() != self.candidates.len() {
            self.counts.clear();
            self.counts.resize(self.candidates.len(), 0);
        }
        let window = &history[history.len().saturating_sub(cfg.repeat_last_n)..];
        for &id in window {
            if let Some(c) = self.counts.get_mut(id as usize) {
                *c += 1;
            }
        }
        for &id in window {
            let Some(c) = self.counts.get_mut(id as usize) else {
                continue;
            };
            if *c == 0 {
                continue;
            }
            let n = std::mem::take(c) as f32;
            let logit = &mut self.candidates[id as usize].logit;
            if *logit <= 0.0 {
                *logit *= cfg.repeat_penalty;
            } else {
                *logit /= cfg.repeat_penalty;
            }
            *logit -= n * cfg.frequency_penalty + cfg.presence_penalty;
        }
    }

    /// The first id with the largest logit.
    fn argmax(&self) -> u32 {
        let mut best = self.candidates[0];
        for &c in &self.candidates[1..] {
            if c.logit > best.logit {
                best = c;
            }
        }
        best.id
    }
}

/// A uniform draw in [0, 1) from the top 53 bits, independent of any distribution crate's
/// algorithm so that a seed means the same tokens in every build.
fn uniform(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}
