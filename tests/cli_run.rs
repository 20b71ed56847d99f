//! `hob run` and `hob perplexity` end to end on the tiny fixture: the golden greedy text from
//! transformers, sampling determinism, chat mode, and bad input.

mod common;

use std::io::Write;
use std::process::Stdio;

use common::damage::{damaged_fixture, tensor};
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
    // A first token waits for tokenizing too: reported beside the prompt's time.
    assert!(stderr.contains("\ntokenize: "), "{stderr}");
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
            "-p TEXT or -f FILE",
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

// ---- Damaged models (issue 49's fuzzing): each is an error naming the file, never a panic ----

/// `hob args...`: (exit code, stderr), asserting no panic.
fn exit_and_stderr(args: &[&str]) -> (Option<i32>, String) {
    let out = common::hob_command().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{args:?}:\n{stderr}");
    (out.status.code(), stderr)
}

/// `run`, `perplexity` and `bench` of `model` on the CPU (with `extra` flags) each fail with
/// exit code 1 and an error line naming the file and containing `needle`.
fn every_command_refuses(model: &std::path::Path, extra: &[&str], needle: &str) {
    let text = model.with_extension("txt");
    std::fs::write(
        &text,
        "To be, or not to be, that is the question. ".repeat(8),
    )
    .unwrap();
    let m = model.to_str().unwrap();
    let runs: [&[&str]; 3] = [
        &["run", "-m", m, "-p", "hi", "-n", "4", "--temp", "0"],
        &[
            "perplexity",
            "-m",
            m,
            "-f",
            text.to_str().unwrap(),
            "-c",
            "16",
        ],
        &["bench", "-m", m, "-p", "8", "-n", "4", "-r", "1"],
    ];
    for run in runs {
        let args: Vec<&str> = run
            .iter()
            .chain(&["--device", "cpu"])
            .chain(extra)
            .copied()
            .collect();
        let (code, stderr) = exit_and_stderr(&args);
        let line = stderr
            .lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or("");
        assert_eq!(code, Some(1), "{args:?}:\n{stderr}");
        assert!(
            line.contains(m) && line.contains(needle),
            "{args:?}: the error line lacks the file or {needle:?}:\n{stderr}"
        );
    }
}

#[test]
fn nan_router_logit_is_an_error_not_a_panic() {
    // One NaN in layer 1's router: its logits are NaN, top-k found no expert and the route's
    // index usize::MAX panicked in the file's expert lookup.
    let (_dir, path) = damaged_fixture("f16", |p, b| {
        let at = tensor(p, "blk.1.ffn_gate_inp.weight").offset as usize + 4 * 70;
        b[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    every_command_refuses(
        &path,
        &[],
        "non-finite activation at layer 1 (router logits): the model's weights or hyper-parameters are broken",
    );
}

#[test]
fn infinite_attention_weights_are_an_error_at_their_layer() {
    let (_dir, path) = damaged_fixture("f16", |p, b| {
        let at = tensor(p, "blk.0.attn_v.weight").offset as usize;
        for i in 0..64 {
            b[at + 2 * i..at + 2 * i + 2].copy_from_slice(&0x7c00u16.to_le_bytes());
        }
    });
    every_command_refuses(
        &path,
        &[],
        "non-finite activation at layer 0 (router logits)",
    );
}

#[test]
fn nan_output_logit_is_an_error_not_a_wrong_answer() {
    let (_dir, path) = damaged_fixture("f16", |p, b| {
        let at = tensor(p, "output.weight").offset as usize + 2 * 64 * 5;
        b[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    });
    every_command_refuses(&path, &[], "non-finite activation in the output logits");
}

#[test]
fn tiny_rope_freq_base_is_refused() {
    let key = b"mixtral.rope.freq_base";
    let (_dir, path) = damaged_fixture("f16", |p, b| {
        let m = p.header.metadata_offset as usize;
        let at = m + b[m..].windows(key.len()).position(|w| w == key).unwrap() + key.len();
        assert_eq!(b[at..at + 4], 6u32.to_le_bytes(), "an f32 value");
        b[at + 4..at + 8].copy_from_slice(&1.4e-45f32.to_le_bytes());
    });
    every_command_refuses(
        &path,
        &[],
        "mixtral.rope.freq_base = 1e-45: out of range (accepted: 1 to 1e12)",
    );
}

#[test]
fn flipped_expert_byte_fails_its_checksum_on_first_read() {
    // Every int4 blob of layer 0 damaged (whichever two experts the router picks), the section
    // and header CRCs intact: the file opens, and the first read of such a blob fails.
    let (dir, path) = convert_fixture("f16,int4");
    let mut b = std::fs::read(&path).unwrap();
    let p = hob::format::reader::parse(&b).unwrap();
    for e in 0..p.n_experts {
        let r = p.records[e * p.variants.len() + 1];
        b[r.offset as usize + 1000] ^= 0x04;
    }
    std::fs::write(&path, &b).unwrap();
    every_command_refuses(
        &path,
        &["--expert-variant", "int4"],
        "checksum mismatch in expert (layer 0, expert ",
    );
    // The f16 experts are intact: they run; `inspect` reads no blob, `inspect --verify` all.
    let m = path.to_str().unwrap();
    let (ok, _, stderr) = hob(&["run", "-m", m, "-p", "hi", "-n", "2", "--device", "cpu"]);
    assert!(ok, "{stderr}");
    assert!(hob(&["inspect", m]).0);
    let (code, stderr) = exit_and_stderr(&["inspect", "--verify", m]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("variant int4/g64"), "{stderr}");
    drop(dir);
}

#[test]
fn flipped_dense_byte_fails_its_checksum_when_the_model_loads() {
    let (dir, path) = convert_fixture("f16");
    let mut b = std::fs::read(&path).unwrap();
    let p = hob::format::reader::parse(&b).unwrap();
    b[tensor(&p, "blk.1.attn_k.weight").offset as usize + 9] ^= 0x80;
    std::fs::write(&path, &b).unwrap();
    every_command_refuses(
        &path,
        &[],
        "checksum mismatch in tensor 'blk.1.attn_k.weight'",
    );
    drop(dir);
}

#[test]
fn a_fifo_a_directory_or_a_device_as_model_is_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.hob");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let cases = [
        (fifo.clone(), "is a FIFO: expected a .hob file"),
        (
            dir.path().to_path_buf(),
            "is a directory: expected a .hob file",
        ),
        (
            "/dev/null".into(),
            "is a character device: expected a .hob file",
        ),
    ];
    for (path, needle) in cases {
        let mut child = common::hob_command()
            .args(["run", "-m", path.to_str().unwrap(), "-p", "hi"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > std::time::Duration::from_secs(20) {
                child.kill().unwrap();
                panic!("`run -m {}` hangs", path.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        let expected = format!("error: {} {needle}", path.display());
        assert!(stderr.contains(&expected), "{stderr}");
    }
}

#[test]
fn gguf_as_model_says_how_to_convert() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("model.gguf");
    let mut bytes = b"GGUF\x03\0\0\0".to_vec();
    bytes.resize(1024, 0);
    std::fs::write(&gguf, bytes).unwrap();
    let (code, stderr) = exit_and_stderr(&["run", "-m", gguf.to_str().unwrap(), "-p", "hi"]);
    assert_eq!(code, Some(1), "{stderr}");
    let expected = format!(
        "error: {} is a GGUF file; hob reads .hob files: convert it first with \
         `hob convert --from FILE.gguf -o model.hob`",
        gguf.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
}

/// A profile's high/low pair that the file does not store (f16 + int4 for rtx4090-24g) gives way
/// to the file's own variants (an ap8 file's at two widths), with a note; a flag naming a
/// missing variant is still an error.
#[test]
fn a_profile_pair_the_file_lacks_falls_back_to_its_variants() {
    let (_dir, path) = convert_fixture("int8,int2");
    let p = path.to_str().unwrap();
    let args = [
        "run",
        "-m",
        p,
        "-p",
        "Hello",
        "-n",
        "2",
        "--platform",
        "rtx4090-24g",
        "--device",
        "cpu",
    ];
    let (ok, _stdout, stderr) = hob(&args);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("does not store the rtx4090-24g profile's f16 + int4; using its int8/g64 high, int2/g64 low"),
        "{stderr}"
    );
    let mut explicit = args.to_vec();
    explicit.extend(["--expert-variant", "f16"]);
    let (ok, _stdout, stderr) = hob(&explicit);
    assert!(
        !ok && stderr.contains("--expert-variant f16:")
            && stderr.contains("stores only int8/g64, int2/g64"),
        "{stderr}"
    );
    // An ap8 file runs its measured pair of widths instead of its first two views.
    let (_dir8, path8) = convert_fixture("ap8");
    let mut ap8 = args.to_vec();
    ap8[2] = path8.to_str().unwrap();
    let (ok, _stdout, stderr) = hob(&ap8);
    assert!(
        ok && stderr.contains("profile's f16 + int4; using its ap8@5 high, ap8@3 low"),
        "{stderr}"
    );
}
