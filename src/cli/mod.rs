//! The `hob` command line: clap definitions; each command lives in its own file.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub mod bench;
pub mod calibrate;
mod calibrate_widths;
mod chat;
pub mod compat;
pub mod convert;
pub mod engine;
mod entropy;
pub mod inspect;
pub mod kl_file;
mod out;
pub mod perplexity;
pub mod run;
pub mod serve;
pub mod signals;
pub mod sim;

#[derive(Parser, Debug)]
#[command(
    name = "hob",
    version,
    about = "Mixture-of-Experts inference with mixed-precision expert offloading"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Build a .hob file from a Hugging Face checkpoint directory (or random weights: --synthetic).
    Convert(ConvertArgs),
    /// Show (and optionally verify) a .hob file.
    Inspect(InspectArgs),
    /// Generate text from a prompt, or chat interactively.
    Run(run::RunArgs),
    /// Perplexity of a text file, llama.cpp's method.
    Perplexity(perplexity::PerplexityArgs),
    /// An OpenAI-compatible HTTP server (chat and text completions, streaming) with a chat page.
    Serve(serve::ServeArgs),
    /// Tokens per second, llama-bench style, with the MoE columns and the physical limit.
    Bench(bench::BenchArgs),
    /// Replay a routing trace through the expert cache policies (miss penalty per cache size).
    Sim(sim::SimArgs),
    /// Fit the precision scorer's thresholds T1/T2 to a model on a text; optionally write them
    /// into a platform profile.
    Calibrate(calibrate::CalibrateArgs),
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["from", "synthetic"])))]
pub struct ConvertArgs {
    /// Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json), or a
    /// llama.cpp GGUF file (NAME.gguf, or the first file of a split set; its tokenizer too).
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub from: Option<PathBuf>,
    /// Instead of --from: random weights in this model's exact shapes, for speed benchmarks only
    /// (the output is noise). Each in its own architecture (routing, norms, biases, shared
    /// expert), with no tokenizer: feed token ids.
    #[arg(long, value_name = "MODEL",
          value_parser = clap::builder::PossibleValuesParser::new(crate::import::synthetic::PRESETS))]
    pub synthetic: Option<String>,
    /// With --synthetic: keep only the first N layers (default: all).
    #[arg(long, value_name = "N", requires = "synthetic")]
    pub layers: Option<usize>,
    /// With --synthetic: random seed (default 0); the same command gives the same bytes.
    #[arg(long, requires = "synthetic")]
    pub seed: Option<u64>,
    /// With --synthetic: embed a real tokenizer (a folder with tokenizer.json and, for its chat
    /// template, tokenizer_config.json), so the file runs on text (`hob run`, `hob serve`); its
    /// vocabulary must fit the model's.
    #[arg(long, value_name = "DIR", requires = "synthetic")]
    pub tokenizer: Option<PathBuf>,
    /// Output .hob file.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Expert variants to store, comma-separated: f16, bf16, int8, int4, int4k, int3, int2, int2k,
    /// mxfp4, ap8 (one 8-bit copy read at any width 2..8: --expert-variant ap8@4)
    /// (optionally with a group size, e.g. int4/g32; int3's and ap8's a multiple of 64). Default: f16,int4; from a GGUF, the width that holds
    /// most of its expert blocks and one below (int4,int2 for Q4_K/Q4_0 and narrower,
    /// int8,int4 for Q5-Q8, f16,int4 for float).
    #[arg(long)]
    pub experts: Option<String>,
    /// Storage of dense matrices: f32, f16, bf16, int8 or int4 (a group size may follow:
    /// int4/g32), for all, per class (embed, attn, output, shared: `attn=int8,output=int4`) or
    /// both (`f16,output=int8`). Default: the source dtype (f16 with --synthetic; from a GGUF
    /// whose matrices are quantized, int4/g32 for those in 4-bit blocks and int8 for the rest).
    /// Norms, biases and routers are always f32.
    #[arg(long)]
    pub dense: Option<String>,
    /// Group size of the quantized variants that do not name one (default 64; 32 from a GGUF,
    /// whose blocks are 32 values).
    #[arg(long)]
    pub group_size: Option<u32>,
    /// Never draw a progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The .hob file.
    pub file: PathBuf,
    /// Check every checksum; exit non-zero naming the first bad tensor or expert.
    #[arg(long)]
    pub verify: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also measure the entropy of each integer variant's codes (reads every expert).
    #[arg(long)]
    pub entropy: bool,
}

/// The command line as clap reads it after llama.cpp's habits are translated ([`compat`]); the
/// notes on ignored flags go to stderr. A usage error exits here, as clap does.
pub fn parse(args: Vec<std::ffi::OsString>) -> crate::Result<Cli> {
    use clap::CommandFactory;
    let normalized = compat::normalize(&Cli::command(), args)?;
    for note in &normalized.notes {
        eprintln!("{note}");
    }
    Ok(Cli::parse_from(normalized.args))
}

pub fn main_with(cli: Cli) -> crate::Result<()> {
    match cli.command {
        Command::Convert(a) => convert::run(&a),
        Command::Inspect(a) => inspect::run(&a),
        Command::Run(a) => run::run(&a),
        Command::Serve(a) => serve::run(&a),
        Command::Perplexity(a) => perplexity::run(&a),
        Command::Bench(a) => bench::run(&a),
        Command::Sim(a) => sim::run(&a),
        Command::Calibrate(a) => calibrate::run(&a),
    }
}
