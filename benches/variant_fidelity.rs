//! How far each quantized expert variant moves the model's predictions from the f16 experts:
//! logit NMSE and KL(f16 || variant) per position, over one prefill of real text.
//!
//!   cargo bench --bench variant_fidelity -- MODEL TEXT [--tokens N] [--threads N]
//!
//! MODEL: a .hob with several expert variants (models/smollm2-moe.hob from tools/demo.sh); TEXT:
//! a text file (models/hamlet-60k.txt); --tokens: default 512; --threads: default all cores.
//! Prints a markdown table; with no MODEL and TEXT (plain `cargo bench`), its usage.

use hob::backend::cpu::CpuBackend;
use hob::experts::DirectExperts;
use hob::format::{keys, HobFile};
use hob::generate::Tokenizer;
use hob::model::{Logits, Model};

const USAGE: &str =
    "usage: cargo bench --bench variant_fidelity -- MODEL TEXT [--tokens N] [--threads N]
  MODEL: a .hob with several expert variants; TEXT: a text file to prefill
  --tokens N: tokens of TEXT (default 512); --threads N: CPU threads (default all cores)";

struct Args {
    model: String,
    text: String,
    tokens: usize,
    threads: usize,
}

/// The command line; None where MODEL and TEXT are not both given (`cargo bench` runs every
/// bench, this one with only the `--bench` cargo adds, which is ignored).
fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let (mut tokens, mut threads) = (512, 0);
    let mut paths = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bench" => {}
            "--tokens" | "--threads" => {
                let v = args.next().ok_or(format!("{a} needs a number"))?;
                let n = v.parse().map_err(|_| format!("{a} {v}: not a number"))?;
                *(if a == "--tokens" {
                    &mut tokens
                } else {
                    &mut threads
                }) = n;
            }
            "-h" | "--help" => return Ok(None),
            _ if a.starts_with('-') => return Err(format!("unknown option {a}")),
            _ => paths.push(a),
        }
    }
    match <[String; 2]>::try_from(paths) {
        Ok([model, text]) => Ok(Some(Args {
            model,
            text,
            tokens,
            threads,
        })),
        Err(paths) if paths.len() < 2 => Ok(None),
        Err(paths) => Err(format!("expected MODEL TEXT, got {paths:?}")),
    }
}

fn main() {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("variant_fidelity: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let (model_path, text_path, n, threads) = (args.model, args.text, args.tokens, args.threads);
    let file = HobFile::open(std::path::Path::new(&model_path)).expect("open the model");
    let model = Model::load(&file).expect("load the model");
    let cfg = &model.cfg;
    let tok = Tokenizer::from_json(
        file.metadata()
            .get_str(keys::TOKENIZER_HF_JSON)
            .expect("tokenizer"),
        cfg.bos.unwrap_or(0),
        cfg.eos.unwrap_or(0),
        cfg.add_bos,
    )
    .expect("tokenizer loads");
    let text = std::fs::read_to_string(&text_path).expect("read the text");
    let mut ids = tok.encode(&text, true).expect("encode");
    ids.truncate(n.min(cfg.context_length));
    let backend = CpuBackend::new(threads).expect("threads");
    let logits_of = |v: usize| -> Vec<f32> {
        let mut experts = DirectExperts::new(&file, v).expect("variant");
        let mut st = model.new_state(&backend, ids.len()).expect("state");
        model
            .forward(&mut st, &ids, &backend, &mut experts, Logits::All)
            .expect("forward")
            .to_vec()
    };
    let base = logits_of(0);
    let vocab = cfg.vocab;
    println!(
        "model {model_path}, {} tokens of {text_path}, reference: {} experts",
        ids.len(),
        file.variants()[0]
    );
    println!(
        "| variant | logit NMSE vs {} | mean KL (nats/token) | top-1 agreement |",
        file.variants()[0]
    );
    println!("|---|---|---|---|");
    for v in 1..file.variants().len() {
        let q = logits_of(v);
        let (mut num, mut den, mut kl, mut agree) = (0f64, 0f64, 0f64, 0usize);
        for (a, b) in base.chunks_exact(vocab).zip(q.chunks_exact(vocab)) {
            let (pa, pb) = (log_softmax(a), log_softmax(b));
            kl += pa
                .iter()
                .zip(&pb)
                .map(|(x, y)| x.exp() * (x - y))
                .sum::<f64>();
            agree += usize::from(argmax(a) == argmax(b));
            for (x, y) in a.iter().zip(b) {
                num += ((x - y) as f64).powi(2);
                den += (*x as f64).powi(2);
            }
        }
        let t = ids.len() as f64;
        println!(
            "| {} | {:.3e} | {:.4} | {:.1}% |",
            file.variants()[v],
            num / den,
            kl / t,
            100.0 * agree as f64 / t
        );
    }
}

fn log_softmax(l: &[f32]) -> Vec<f64> {
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = l.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln() + max;
    l.iter().map(|&x| x as f64 - lse).collect()
}

fn argmax(l: &[f32]) -> usize {
    (0..l.len()).fold(0, |best, i| if l[i] > l[best] { i } else { best })
}
