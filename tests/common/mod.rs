//! Shared test support: the tiny Mixtral fixture converted to .hob, and its transformers reference.
#![allow(dead_code)]

pub mod damage;
pub mod gpu;
pub mod http;
pub mod paths;
pub mod random;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The index of the largest value (the first of equal ones), as a token id: greedy decoding.
pub fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32
}

pub fn fixture_dir() -> PathBuf {
    family_dir("mixtral")
}

/// A copy of the checkpoint folder `from` at `to` (created), to change a file of it.
pub fn copy_checkpoint(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// tests/fixtures/tiny-FAMILY (tools/make_fixture.py --family).
pub fn family_dir(family: &str) -> PathBuf {
    paths::repo_root().join(format!("tests/fixtures/tiny-{family}"))
}

/// A `Command` for the hob binary that cargo built for this test's target (or its staged copy,
/// `paths::hob_bin`).
///
/// When the tests run under an emulator (cross-compiled: `.ci/run` runs the aarch64 suite under
/// `qemu-aarch64`), the test process itself is emulated but the binary it spawns is not: the
/// kernel cannot execute an aarch64 ELF on x86-64 unless binfmt_misc is registered, which
/// containers usually lack. So the binary is started through the same runner cargo used for the
/// test: `HOB_TEST_RUNNER` if set, else cargo's `CARGO_TARGET_<TRIPLE>_RUNNER` for aarch64 Linux
/// (cargo's own environment reaches the test process). Natively neither is set.
pub fn hob_command() -> Command {
    let bin = paths::hob_bin();
    let runner = std::env::var("HOB_TEST_RUNNER").ok().or_else(|| {
        if cfg!(all(
            target_arch = "aarch64",
            target_os = "linux",
            target_env = "gnu"
        )) {
            std::env::var("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER").ok()
        } else {
            None
        }
    });
    let mut words = runner.as_deref().unwrap_or("").split_whitespace();
    match words.next() {
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words).arg(bin);
            cmd
        }
        None => Command::new(bin),
    }
}

/// Run the hob binary; returns (success, stdout, stderr).
pub fn hob(args: &[&str]) -> (bool, String, String) {
    let out = hob_command()
        .args(args)
        .output()
        .expect("the hob binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `hob perplexity` of `model` on `text` on the CPU with a context of `ctx`, plus `extra`
/// flags: (success, stdout, stderr).
pub fn perplexity_run(
    model: &Path,
    text: &Path,
    ctx: usize,
    extra: &[&str],
) -> (bool, String, String) {
    let ctx = ctx.to_string();
    let mut args = vec![
        "perplexity",
        "-m",
        model.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
        "-c",
        &ctx,
        "--device",
        "cpu",
    ];
    args.extend_from_slice(extra);
    hob(&args)
}

/// perplexity_run; asserts success and returns stdout.
pub fn perplexity_stdout(model: &Path, text: &Path, ctx: usize, extra: &[&str]) -> String {
    let (ok, stdout, stderr) = perplexity_run(model, text, ctx, extra);
    assert!(ok, "{extra:?}:\n{stderr}");
    stdout
}

/// Convert the tiny fixture with the given `--experts` list into a fresh temporary directory.
pub fn convert_fixture(experts: &str) -> (tempfile::TempDir, PathBuf) {
    convert_dir(&fixture_dir(), experts, &[])
}

/// Convert the checkpoint in `src` with `--experts experts` and `extra` flags.
pub fn convert_dir(src: &Path, experts: &str, extra: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let (dir, out, _) = convert_dir_stdout(src, experts, extra);
    (dir, out)
}

/// `convert_dir`, with convert's stdout (its per-variant summary).
pub fn convert_dir_stdout(
    src: &Path,
    experts: &str,
    extra: &[&str],
) -> (tempfile::TempDir, PathBuf, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("tiny.hob");
    let mut args = vec![
        "convert",
        "--from",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--experts",
        experts,
        "--no-progress",
    ];
    args.extend_from_slice(extra);
    let (ok, stdout, stderr) = hob(&args);
    assert!(ok, "convert failed:\n{stdout}\n{stderr}");
    (dir, out, stdout)
}

/// The transformers reference stored beside the fixture (tools/make_fixture.py).
pub struct Reference {
    pub input_ids: Vec<u32>,
    /// [T, vocab]
    pub logits: Vec<f32>,
    pub greedy_ids: Vec<u32>,
    /// [32, vocab]
    pub greedy_logits: Vec<f32>,
}

pub fn reference() -> Reference {
    reference_in(&fixture_dir())
}

/// Integer ids stored as i64 under `name` in the reference file of `dir`, if present.
pub fn reference_ids(dir: &Path, name: &str) -> Option<Vec<u32>> {
    let bytes = std::fs::read(dir.join("reference.safetensors")).expect("reference file");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("reference parses");
    let t = st.tensor(name).ok()?;
    Some(
        t.data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect(),
    )
}

/// The transformers reference beside the checkpoint in `dir`.
pub fn reference_in(dir: &Path) -> Reference {
    let bytes = std::fs::read(dir.join("reference.safetensors")).expect("reference file");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("reference parses");
    let ids = |name: &str| -> Vec<u32> {
        let t = st.tensor(name).unwrap();
        t.data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect()
    };
    let floats = |name: &str| -> Vec<f32> {
        let t = st.tensor(name).unwrap();
        t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    Reference {
        input_ids: ids("input_ids"),
        logits: floats("logits"),
        greedy_ids: ids("greedy_ids"),
        greedy_logits: floats("greedy_logits"),
    }
}

/// Normalized MSE: sum((a - b)^2) / sum(b^2).
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den
}
