//! Issue 55, item 2: faults injected where they happen, seen from the command line: a full disk
//! or a file-size limit under convert, `--record-trace` and the logits file, and a model file
//! truncated while hob has it mapped. Each test checks what the user sees (the message and the
//! exit status) and what is left on disk. The fault table is benches/results/2026-12-03-cpu-issue55-faults.md.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{convert_fixture, fixture_dir, hob_command};

/// The files left in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Run hob with `args` under a file-size limit of `limit` bytes (`ulimit -f`: a write past it
/// fails as a full disk would, and raises SIGXFSZ, which hob ignores).
fn hob_with_file_limit(args: &[&str], limit: u64) -> Output {
    let mut cmd = hob_command();
    cmd.args(args);
    // SAFETY: setrlimit is async-signal-safe and touches no memory of this process but the
    // struct on the child's stack.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().expect("the hob binary runs")
}

/// A disk that fills during convert: the output's reservation fails up front, the error names
/// the file and the limit, the exit status is 1, and nothing is left.
#[test]
fn convert_onto_a_full_disk_names_the_file_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.hob");
    let o = hob_with_file_limit(
        &[
            "convert",
            "--from",
            fixture_dir().to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--experts",
            "f16,int4",
            "--no-progress",
        ],
        64 << 10,
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}: {err}", o.status);
    assert!(
        err.contains("m.hob.tmp-") && err.contains("file-size limit"),
        "{err}"
    );
    assert!(
        names_in(dir.path()).is_empty(),
        "{:?}",
        names_in(dir.path())
    );
}

/// `--record-trace` onto a full disk (/dev/full: every write is ENOSPC): a clear error naming the
/// trace file, exit status 1.
#[test]
fn a_trace_onto_a_full_disk_is_an_error_naming_it() {
    let (_dir, model) = convert_fixture("f16");
    let o = hob_command()
        .args([
            "run",
            "-m",
            model.to_str().unwrap(),
            "-p",
            "hello",
            "-n",
            "4",
            "--device",
            "cpu",
            "--record-trace",
            "/dev/full",
        ])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}: {err}", o.status);
    assert!(
        err.contains("error: /dev/full: write: No space left on device") && !err.contains("WARN"),
        "{err}"
    );
}

/// The same under a file-size limit: the error names the trace file and the limit.
#[test]
#[cfg_attr(
    target_arch = "aarch64",
    ignore = "qemu-user lets the host's SIGXFSZ kill the emulator although hob ignores it: run natively"
)]
fn a_trace_over_the_file_size_limit_is_an_error_naming_it() {
    let (dir, model) = convert_fixture("f16");
    let trace = dir.path().join("t.trace");
    let o = hob_with_file_limit(
        &[
            "run",
            "-m",
            model.to_str().unwrap(),
            "-p",
            "hello there, a prompt of several tokens",
            "-n",
            "16",
            "--device",
            "cpu",
            "--record-trace",
            trace.to_str().unwrap(),
        ],
        // The model file is only read; the trace is the one file written.
        512,
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}: {err}", o.status);
    assert!(
        err.contains("t.trace: write: file too large: over the file-size limit")
            && err.contains("the unfinished trace was removed")
            && !err.contains("WARN"),
        "{err}"
    );
    assert!(!trace.exists());
}

/// The logits file of `hob perplexity --kl-divergence-base` over the file-size limit: an error
/// naming it, and neither the file nor its temporary is left. A device given as the file (which
/// the final rename would replace) is refused by name.
#[test]
fn a_logits_file_that_cannot_be_written_is_an_error_and_leaves_nothing() {
    let (dir, model) = convert_fixture("f16");
    let corpus = dir.path().join("text.txt");
    std::fs::write(
        &corpus,
        "the quick brown fox jumps over the lazy dog. ".repeat(40),
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();
    let logits = out.path().join("base.kld");
    let args = |file: &str| {
        [
            "perplexity",
            "-m",
            model.to_str().unwrap(),
            "-f",
            corpus.to_str().unwrap(),
            "-c",
            "32",
            "--device",
            "cpu",
            "--kl-divergence-base",
            file,
        ]
        .map(str::to_string)
    };
    let a = args(logits.to_str().unwrap());
    let o = hob_with_file_limit(&a.iter().map(String::as_str).collect::<Vec<_>>(), 4096);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}: {err}", o.status);
    assert!(
        err.contains("base.kld") && err.contains("file-size limit"),
        "{err}"
    );
    assert!(
        names_in(out.path()).is_empty(),
        "{:?}",
        names_in(out.path())
    );

    let o = hob_command().args(args("/dev/full")).output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}: {err}", o.status);
    assert!(
        err.contains("logits file /dev/full: exists and is not a regular file"),
        "{err}"
    );
    let kind = std::fs::metadata("/dev/full").unwrap().file_type();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(&kind));
}

/// A model file truncated while `hob run` has it mapped: the next read of a lost page raises
/// SIGBUS; hob says which file changed and exits with status 1 instead of dying silently.
#[test]
#[cfg_attr(
    target_arch = "aarch64",
    ignore = "qemu-user's own SIGBUS handling for mapped files: run natively"
)]
fn a_model_truncated_while_mapped_is_named_not_a_silent_death() {
    let (_dir, model) = convert_fixture("f16");
    let mut child = hob_command()
        .args([
            "run",
            "-m",
            model.to_str().unwrap(),
            "-i",
            "-n",
            "8",
            "--device",
            "cpu",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the chat is up (the model loaded and mapped), reading stderr on a thread.
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap_or_default();
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the chat did not start");
        if line.contains("/exit") || line.contains("Ctrl-D") || line.contains("quit") {
            break;
        }
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"tell me a story\n").unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let err = reader.join().unwrap();
    assert_eq!(status.code(), Some(1), "{status}: {err}");
    assert!(
        err.contains(&format!(
            "error: {} changed on disk while hob had it mapped",
            model.display()
        )),
        "{err}"
    );
}
