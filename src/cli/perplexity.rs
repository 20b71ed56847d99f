//! `hob perplexity`: llama.cpp's method. The text is tokenized once (BOS first when the model
//! adds one), cut into chunks of `ctx` tokens whose first token becomes BOS, and each chunk
//! scores only its second half, so every scored token has at least ctx/2 tokens of context.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use super::engine::{tokenizer, ModelArgs};
use crate::model::{Logits, Model};
use crate::Error;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score (UTF-8).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Tokens per chunk.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx: usize,
    /// Score at most this many chunks (default: all).
    #[arg(long = "chunks")]
    pub chunks: Option<usize>,
}

/// Running totals of llama.cpp's estimate.
#[derive(Default, Debug, Clone, Copy)]
pub struct Nll {
    pub sum: f64,
    pub sum_sq: f64,
    pub count: usize,
}

impl Nll {
    pub fn ppl(&self) -> f64 {
        (self.sum / self.count as f64).exp()
    }
    /// llama.cpp's error of the final estimate: ppl * sqrt(var(nll) / (count - 1)).
    pub fn ppl_error(&self) -> f64 {
        let n = self.count as f64;
        let mean = self.sum / n;
        let var = self.sum_sq / n - mean * mean;
        if var > 0.0 && self.count > 1 {
            self.ppl() * (var / (n - 1.0)).sqrt()
        } else {
            0.0
        }
    }
    /// Add -log softmax(logits)[target].
    pub fn add(&mut self, logits: &[f32], target: u32) {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum_exp: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let nll = -((logits[target as usize] - max) as f64 - sum_exp.ln());
        self.sum += nll;
        self.sum_sq += nll * nll;
        self.count += 1;
    }
}

pub fn run(args: &PerplexityArgs) -> crate::Result<()> {
    let file = args.model.open()?;
    let model = Model::load(&file)?;
    let tok = tokenizer(&file, &model.cfg)?;
    let text = std::fs::read_to_string(&args.file).map_err(|e| Error::io(&args.file, "read", e))?;
    let mut tokens = tok.encode(&text, false)?;
    if model.cfg.add_bos {
        tokens.insert(0, tok.bos_id());
    }
    let n_ctx = args.ctx;
    if n_ctx < 4 {
        return Err(Error::Invalid(format!(
            "--ctx-size {n_ctx}: must be at least 4"
        )));
    }
    if tokens.len() < 2 * n_ctx {
        return Err(Error::Invalid(format!(
            "{}: {} tokens, need at least 2 * ctx-size = {}",
            args.file.display(),
            tokens.len(),
            2 * n_ctx
        )));
    }
    let mut n_chunk = tokens.len() / n_ctx;
    if let Some(c) = args.chunks {
        n_chunk = n_chunk.min(c.max(1));
    }
    let mut session = args.model.session(&file, &model, n_ctx)?;
    let first = n_ctx / 2;
    eprintln!(
        "perplexity: {} tokens, {n_chunk} chunks of {n_ctx}; {}",
        tokens.len(),
        session.describe()
    );
    let started = Instant::now();
    let mut nll = Nll::default();
    let vocab = model.cfg.vocab;
    for i in 0..n_chunk {
        let start = i * n_ctx;
        let mut chunk = tokens[start..start + n_ctx].to_vec();
        if model.cfg.add_bos {
            chunk[0] = tok.bos_id();
        }
        session.truncate(0);
        session.forward(&chunk[..first], Logits::None)?;
        let logits = session.forward(&chunk[first..], Logits::All)?;
        for j in 0..n_ctx - 1 - first {
            nll.add(
                &logits[j * vocab..(j + 1) * vocab],
                tokens[start + first + j + 1],
            );
        }
        print!("[{}]{:.4},", i + 1, nll.ppl());
        std::io::stdout().flush().ok();
        if i == 0 {
            let pass = started.elapsed().as_secs_f64();
            eprintln!(
                "perplexity: {pass:.2} s per chunk, ETA {:.1} min",
                pass * n_chunk as f64 / 60.0
            );
        }
    }
    println!();
    println!(
        "Final estimate: PPL = {:.4} +/- {:.5}",
        nll.ppl(),
        nll.ppl_error()
    );
    eprintln!(
        "perplexity: {} tokens scored in {:.1} s",
        nll.count,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
