//! `hob run` and `hob perplexity` end to end on the tiny fixture: the golden greedy text from
//! transformers, sampling determinism, chat mode, and bad input.

mod common;

use std::io::Write;
use std::process::Stdio;

use common::{convert_fixture, fixture_dir, hob, reference};
use hob::format::{keys, HobFile};
use hob::generate::Tokenizer;

const PROMPT: &str = "The quick brown fox jumps over the lazy dog. To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer";

fn tokenizer(path: &std::path::Path) -> Tokenizer {
    let file = HobFile::open(path).unwrap();
    let json = file.metadata().get_str(keys::TOKENIZER_HF_JSON).unwrap();
    Tokenizer::from_json(json, 1, 2, true).unwrap()
}

#[test]
fn greedy_run_prints_transformers_continuation() {
    let r = reference();
    let (_dir, path) = convert_fixture("f16");
    let tok = tokenizer(&path);
    assert_eq!(tok.encode(PROMPT, true).unwrap(), r.input_ids, "prompt ids");
    let n = r.greedy_ids.len().to_string();
    let p = path.to_str().unwrap();
    let (ok, stdout, stderr) = hob(&[
        "run",
        "-m",
        p,
        "-p",
        PROMPT,
        "--no-chat",
        "--temp",
        "0",
        "-n",
        &n,
        "--ignore-eos",
    ]);
    assert!(ok, "{stderr}");
    let expected = tok.decode(&r.greedy_ids, true).unwrap();
    assert_eq!(stdout.strip_suffix('\n').unwrap(), expected);
    assert!(
        stderr.contains(&format!("generation: {n} tokens")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("prompt: {} tokens", r.input_ids.len())),
        "{stderr}"
    );
}

#[test]
fn same_seed_same_text_and_threads_do_not_matter() {
    let (_dir, path) = convert_fixture("f16,int4");
    let p = path.to_str().unwrap();
    let run = |seed: &str, threads: &str| {
        let (ok, stdout, stderr) = hob(&[
            "run",
            "-m",
            p,
            "-p",
            "Hello",
            "-n",
            "24",
            "--temp",
            "1.0",
            "-s",
            seed,
            "-t",
            threads,
            "--expert-variant",
            "int4",
        ]);
        assert!(ok, "{stderr}");
        stdout
    };
    let a = run("7", "1");
    assert_eq!(a, run("7", "2"));
    assert_ne!(
        a,
        run("8", "2"),
        "different seeds gave the same 24 sampled tokens"
    );
}

#[test]
fn interactive_chat_keeps_turns_and_exits_on_command() {
    let (_dir, path) = convert_fixture("f16");
    let mut child = common::hob_command()
        .args([
            "run",
            "-m",
            path.to_str().unwrap(),
            "-i",
            "-n",
            "4",
            "--temp",
            "0",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of France?\nAnd of Italy?\n/exit\nnever read\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("generation: ").count(), 2, "{stderr}");
    // The second turn reuses the first turn's KV cache: its prompt is only the new part.
    let prompts: Vec<usize> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("prompt: "))
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(prompts.len(), 2);
    assert!(
        prompts[1] < prompts[0] + 12,
        "second turn re-fed the history: {prompts:?}"
    );
}

#[test]
fn perplexity_prints_running_and_final_values() {
    let (dir, path) = convert_fixture("f16");
    let text = dir.path().join("text.txt");
    std::fs::write(
        &text,
        "To be, or not to be, that is the question. ".repeat(40),
    )
    .unwrap();
    let (ok, stdout, stderr) = hob(&[
        "perplexity",
        "-m",
        path.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
        "-c",
        "64",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("[1]") && stdout.contains("[2]"), "{stdout}");
    let ppl: f64 = stdout
        .split("Final estimate: PPL = ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    // A random 512-token model is near-uniform: finite, above 1, below a few times the vocabulary.
    assert!(ppl.is_finite() && ppl > 1.0 && ppl < 5000.0, "{ppl}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let (dir, path) = convert_fixture("f16");
    let p = path.to_str().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["run", "-m", "/nonexistent/model.hob", "-p", "hi"]
                .into_iter()
                .map(String::from)
                .collect(),
            "does not exist",
        ),
        (
            vec![
                "run".into(),
                "-m".into(),
                fixture_dir().join("config.json").to_str().unwrap().into(),
                "-p".into(),
                "hi".into(),
            ],
            "not a .hob file",
        ),
        (
            vec![
                "run".into(),
                "-m".into(),
                p.into(),
                "-c".into(),
                "16".into(),
                "-p".into(),
                "word ".repeat(40),
            ],
            "context holds 16",
        ),
        (
            vec!["run", "-m", p, "-p", "hi", "--frobnicate"]
                .into_iter()
                .map(String::from)
                .collect(),
            "--frobnicate",
        ),
        (
            vec!["run", "-m", p].into_iter().map(String::from).collect(),
            "-p PROMPT",
        ),
        (
            vec!["run", "-m", p, "-p", "hi", "--expert-variant", "int2"]
                .into_iter()
                .map(String::from)
                .collect(),
            "stores only f16",
        ),
        (
            vec!["run", "-m", p, "-p", "hi", "--top-p", "1.5"]
                .into_iter()
                .map(String::from)
                .collect(),
            "top_p",
        ),
        (
            vec![
                "perplexity".into(),
                "-m".into(),
                p.into(),
                "-f".into(),
                dir.path().join("missing.txt").to_str().unwrap().into(),
            ],
            "missing.txt",
        ),
    ];
    // The expert engine's flags are checked whatever the device.
    let mut cases = cases;
    for (flag, value, needle) in [
        ("--cache-policy", "bogus", "expected one of lru"),
        ("--cache-weights", "0.5,0.6,0,0", "summing to 1"),
        ("--low-share", "2", "--low-share 2"),
        ("--low", "int2", "--low int2"),
        ("--t1", "0.9", "need 0 <= T1 <= T2 <= 1"),
    ] {
        let mut args: Vec<String> = ["run", "-m", p, "-p", "hi", "--device", "cpu", flag, value]
            .into_iter()
            .map(String::from)
            .collect();
        if flag == "--t1" {
            args.extend(["--t2".to_string(), "0.5".to_string()]);
        }
        cases.push((args, needle));
    }
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, _, stderr) = hob(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(
            stderr.contains(needle),
            "{args:?}: stderr lacks {needle:?}:\n{stderr}"
        );
    }
}

// Issue 49, -t as llama.cpp users give it (items 7 and 12).

/// `hob run` on the CPU with `threads` as -t: (success, stderr).
fn run_with_threads(p: &str, threads: &[&str]) -> (bool, String) {
    let mut args = vec!["run", "-m", p, "-p", "hi", "-n", "2", "--device", "cpu"];
    args.extend_from_slice(threads);
    let (ok, _, stderr) = hob(&args);
    assert!(!stderr.contains("panicked"), "{stderr}");
    (ok, stderr)
}

/// Issue 49 item 7: `-t 1000` on a small machine was accepted and ran 7-100x slower (the pool
/// spins); the count is capped at the cores, with a note.
#[test]
fn threads_above_the_cores_are_capped_with_a_note() {
    let (_dir, path) = convert_fixture("f16");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (ok, stderr) = run_with_threads(path.to_str().unwrap(), &["-t", "1000"]);
    assert!(ok, "{stderr}");
    if cores < 1000 {
        let plural = if cores == 1 { "" } else { "s" };
        let note = format!("-t 1000: this machine has {cores} core{plural}; using {cores}");
        assert!(stderr.contains(&note), "{stderr}");
        assert!(
            stderr.contains(&format!("cpu: {cores} thread{plural}")),
            "{stderr}"
        );
    }
}

/// Issue 49 item 12: `-t -1` was "unexpected argument '-1'"; as in llama.cpp, -1 (and 0) mean one
/// thread per core, and other negative counts are refused by name.
#[test]
fn threads_minus_one_means_one_per_core() {
    let (_dir, path) = convert_fixture("f16");
    let p = path.to_str().unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_core = format!("cpu: {cores} thread{}", if cores == 1 { "" } else { "s" });
    for t in [&["-t", "-1"][..], &["-t", "0"], &["--threads=-1"], &[]] {
        let (ok, stderr) = run_with_threads(p, t);
        assert!(ok, "{t:?}: {stderr}");
        assert!(stderr.contains(&per_core), "{t:?}: {stderr}");
    }
    let (ok, stderr) = run_with_threads(p, &["-t", "-5"]);
    assert!(!ok && stderr.contains("-t -5:"), "{stderr}");
    // Lists are for `hob bench`: elsewhere -t takes one count.
    let (ok, stderr) = run_with_threads(p, &["-t", "1,2"]);
    assert!(
        !ok && stderr.contains("comma lists are for hob bench"),
        "{stderr}"
    );
}
