//! Issue 55, item 3: long runs. Greedy generation to the context limit, with the decode logits at
//! sampled positions compared with a fresh prefill of the same tokens (drift of the KV cache
//! over a long context), and the process's RSS and open files at start and end. The tiny
//! fixture's config is given a long context (RoPE works at any position; its weights are random,
//! which makes no difference to drift). 1024 and 8192 positions (the second natively only: it
//! takes 20 s on the CI machine). Results: benches/results/2026-12-03-cpu-issue55-soak.md.

mod common;

use std::path::{Path, PathBuf};

use common::{argmax, convert_dir, copy_checkpoint, fixture_dir};
use hob::backend::cpu::CpuBackend;
use hob::experts::DirectExperts;
use hob::format::HobFile;
use hob::generate::{Bound, Session};
use hob::model::{Logits, Model};

/// The tiny fixture with `max_position_embeddings = ctx`, converted with f16 experts.
fn long_context_model(ctx: usize) -> (tempfile::TempDir, tempfile::TempDir, PathBuf) {
    let src = tempfile::tempdir().unwrap();
    let ckpt = src.path().join("ckpt");
    copy_checkpoint(&fixture_dir(), &ckpt);
    let config = ckpt.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    let patched = text.replace(
        "\"max_position_embeddings\": 256",
        &format!("\"max_position_embeddings\": {ctx}"),
    );
    assert_ne!(text, patched, "the fixture's context length moved");
    std::fs::write(&config, patched).unwrap();
    let (dir, path) = convert_dir(&ckpt, "f16", &[]);
    (src, dir, path)
}

fn session<'a>(file: &'a HobFile, model: &'a Model<'a>, ctx: usize) -> Box<dyn Session + 'a> {
    let backend = CpuBackend::new(2).unwrap();
    let experts = DirectExperts::new(file, 0).unwrap();
    Box::new(Bound::new(model, backend, Box::new(experts), ctx, "cpu".into()).unwrap())
}

/// Resident memory of this process, KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

struct Soak {
    tokens: usize,
    /// (position, max |decode - prefill| / max |prefill|) at each sampled position.
    drift: Vec<(usize, f32)>,
    rss_kib: (u64, u64),
    files: (usize, usize),
}

/// Generate greedily from one token to `ctx` positions; at every `every`-th position, compare
/// the decode logits with a fresh session's prefill of the same tokens.
fn soak(path: &Path, ctx: usize, every: usize) -> Soak {
    let file = HobFile::open(path).unwrap();
    let model = Model::load(&file).unwrap();
    let mut s = session(&file, &model, ctx);
    let mut fresh = session(&file, &model, ctx);
    let vocab = s.config().vocab;
    let mut tokens = vec![1u32];
    let mut logits = s.forward(&tokens, Logits::Last).unwrap().to_vec();
    let (rss0, files0) = (rss_kib(), open_files());
    let mut sampled = Vec::new();
    while tokens.len() < ctx {
        let next = argmax(&logits);
        tokens.push(next);
        logits = s.forward(&[next], Logits::Last).unwrap().to_vec();
        assert_eq!(logits.len(), vocab);
        if tokens.len() % every == 0 || tokens.len() == ctx {
            sampled.push((tokens.len(), logits.clone()));
        }
    }
    // Memory and files of the generating session, before the fresh prefills (whose work
    // buffers grow with the prompt) are run.
    let (rss1, files1) = (rss_kib(), open_files());
    let drift = sampled
        .iter()
        .map(|(n, got)| {
            fresh.truncate(0);
            let want = fresh.forward(&tokens[..*n], Logits::Last).unwrap();
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let diff = want
                .iter()
                .zip(got)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            (*n, diff / scale)
        })
        .collect();
    Soak {
        tokens: tokens.len(),
        drift,
        rss_kib: (rss0, rss1),
        files: (files0, files1),
    }
}

fn check(r: &Soak, ctx: usize) {
    for (pos, d) in &r.drift {
        println!("position {pos}: max |decode - prefill| / max |logit| = {d:.3e}");
    }
    println!(
        "{} tokens; RSS {} -> {} KiB; open files {} -> {}",
        r.tokens, r.rss_kib.0, r.rss_kib.1, r.files.0, r.files.1
    );
    assert_eq!(r.tokens, ctx);
    // Prefill and decode sum in different orders (batched products against row by row): float
    // rounding, which must not grow into a drift.
    assert!(r.drift.iter().all(|&(_, d)| d < 1e-4), "{:?}", r.drift);
    assert_eq!(r.files.0, r.files.1, "open files grew");
    // The KV cache is allocated for the whole context up front: nothing grows per token beyond
    // the pages of that cache as they are first written (2 layers x K and V x ctx x 128 f32 here,
    // 8 MiB at 8192 positions).
    let kv_kib = (2 * 2 * ctx * 128 * 4 / 1024) as u64;
    assert!(
        r.rss_kib.1 <= r.rss_kib.0 + kv_kib + 1024,
        "RSS grew {} -> {} KiB",
        r.rss_kib.0,
        r.rss_kib.1
    );
}

/// Convert, soak and check: one at a time, as RSS and open files are the whole process's.
fn soak_to(ctx: usize, every: usize) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_src, _dir, path) = long_context_model(ctx);
    check(&soak(&path, ctx, every), ctx);
}

#[test]
fn kv_cache_does_not_drift_over_1k_positions() {
    soak_to(1024, 256);
}

#[test]
#[cfg_attr(
    target_arch = "aarch64",
    ignore = "20 s natively, many minutes under qemu-user: run natively"
)]
fn kv_cache_does_not_drift_to_8k_positions() {
    soak_to(8192, 1024);
}
