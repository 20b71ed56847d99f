//! A llama.cpp user's habits and a new user's first session, end to end on the tiny fixture
//! (issue 49): llama.cpp's multi-letter flags, negative values, prompts from files and stdin,
//! empty and over-long prompts, and the interactive chat's commands and keys.

mod common;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::{convert_fixture, fixture_dir, hob, hob_command};

fn run(model: &Path, extra: &[&str]) -> (bool, String, String) {
    let mut args = vec![
        "run",
        "-m",
        model.to_str().unwrap(),
        "--device",
        "cpu",
        "--temp",
        "0",
    ];
    args.extend_from_slice(extra);
    hob(&args)
}

/// `hob run` with `input` on stdin: (success, stdout, stderr).
fn run_with_stdin(model: &Path, extra: &[&str], input: &[u8]) -> (bool, String, String) {
    let mut child = hob_command()
        .args(["run", "-m", model.to_str().unwrap(), "--device", "cpu"])
        .args(["--temp", "0"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn prompt_tokens(stderr: &str) -> Vec<usize> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("prompt: "))
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn ngl_99_is_not_read_as_n_gl() {
    let (_dir, path) = convert_fixture("f16");
    let (ok, _, stderr) = run(&path, &["-ngl", "99", "-p", "hi", "-n", "3"]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("generation: 3 tokens"), "{stderr}");
    // -ngl 0 is the CPU, and says nothing about a GPU.
    let (ok, _, stderr) = hob(&[
        "run",
        "-m",
        path.to_str().unwrap(),
        "-ngl",
        "0",
        "-p",
        "hi",
        "-n",
        "2",
    ]);
    assert!(ok && stderr.contains("cpu:"), "{stderr}");
}

#[test]
fn cnv_and_sys_are_llama_cpp_s_chat_flags() {
    let (_dir, path) = convert_fixture("f16");
    let (ok, _, stderr) = run_with_stdin(
        &path,
        &["-cnv", "-sys", "Be brief.", "-n", "2", "--no-chat"],
        b"hello\n",
    );
    assert!(ok, "{stderr}");
    assert_eq!(
        stderr.matches("generation: 2 tokens").count(),
        1,
        "{stderr}"
    );
    let (ok, _, stderr) = run(&path, &["-fa", "-p", "hi", "-n", "1", "--mlock"]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("note: -fa (llama.cpp's flag) is ignored"),
        "{stderr}"
    );
}

#[test]
fn unknown_multi_letter_flag_is_named() {
    let (_dir, path) = convert_fixture("f16");
    for (flag, said) in [
        ("-ngx", "unknown flag -ngx for `hob run`"),
        ("--no-mmap", "--no-mmap (llama.cpp's flag) is not supported"),
        ("-ot", "-ot (llama.cpp's flag) is not supported"),
    ] {
        let (ok, _, stderr) = run(&path, &[flag, "x", "-p", "hi"]);
        assert!(!ok && stderr.contains(said), "{flag}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn negative_values_follow_llama_cpp_or_are_refused_by_name() {
    let (_dir, path) = convert_fixture("f16");
    for (flag, value) in [
        ("-c", "-1"),
        ("-n", "-5"),
        ("-s", "-5"),
        ("--repeat-last-n", "-2"),
    ] {
        let (ok, _, stderr) = run(&path, &[flag, value, "-p", "hi"]);
        assert!(!ok, "{flag} {value} accepted");
        assert!(
            stderr.contains(&format!("invalid value '{value}' for '-")),
            "{flag} {value}: {stderr}"
        );
    }
    // llama.cpp's -1s: no top-k, a seed from the clock, the whole context, no limit.
    let (ok, _, stderr) = run(
        &path,
        &[
            "--top-k",
            "-1",
            "-s",
            "-1",
            "--repeat-last-n",
            "-1",
            "-n",
            "-1",
            "-p",
            "hi",
        ],
    );
    assert!(ok, "{stderr}");
}

#[test]
fn prompt_from_a_file_or_stdin() {
    let (dir, path) = convert_fixture("f16");
    let text = "The capital of France is";
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, format!("{text}\n")).unwrap();
    let (ok, expected, stderr) = run(&path, &["-p", text, "-n", "4", "--no-chat"]);
    assert!(ok, "{stderr}");
    let (ok, from_file, stderr) = run(
        &path,
        &["-f", file.to_str().unwrap(), "-n", "4", "--no-chat"],
    );
    assert!(ok, "{stderr}");
    assert_eq!(from_file, expected);
    for flag in ["-p", "-f"] {
        let input = format!("{text}\n");
        let (ok, stdout, stderr) = run_with_stdin(
            &path,
            &[flag, "-", "-n", "4", "--no-chat"],
            input.as_bytes(),
        );
        assert!(ok, "{flag} -: {stderr}");
        assert_eq!(stdout, expected, "{flag} -");
    }
}

#[test]
fn prompt_longer_than_a_command_line_is_read_and_measured() {
    let (dir, path) = convert_fixture("f16");
    // Beyond Linux's 128 KiB limit on one argument.
    let file = dir.path().join("long.txt");
    std::fs::write(&file, "word ".repeat(40_000)).unwrap();
    let (ok, _, stderr) = run(&path, &["-f", file.to_str().unwrap(), "--no-chat"]);
    assert!(!ok);
    // -c is already the model's whole context: "raise -c" would be wrong advice.
    assert!(
        stderr.contains("the context holds 256: that is the model's whole context"),
        "{stderr}"
    );
    let (ok, _, stderr) = run(&path, &["-f", file.to_str().unwrap(), "-c", "64"]);
    assert!(
        !ok && stderr.contains("raise -c/--ctx-size (at most 256"),
        "{stderr}"
    );
}

/// The fixture converted with its tokenizer_config.json and config.json changed by `tok` and
/// `cfg`.
fn convert_changed(
    dir: &Path,
    tok: impl FnOnce(&mut serde_json::Value),
    cfg: impl FnOnce(&mut serde_json::Value),
) -> PathBuf {
    let src = dir.join("src");
    common::copy_checkpoint(&fixture_dir(), &src);
    for (name, change) in [
        (
            "tokenizer_config.json",
            Box::new(tok) as Box<dyn FnOnce(&mut _)>,
        ),
        ("config.json", Box::new(cfg)),
    ] {
        let path = src.join(name);
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        change(&mut json);
        std::fs::write(&path, json.to_string()).unwrap();
    }
    let out = dir.join("changed.hob");
    let (ok, _, stderr) = hob(&[
        "convert",
        "--from",
        src.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--experts",
        "f16",
        "--no-progress",
    ]);
    assert!(ok, "{stderr}");
    out
}

/// The fixture converted without a BOS token and with `template` as its chat template.
fn convert_without_bos(dir: &Path, template: &str) -> PathBuf {
    let tok = |cfg: &mut serde_json::Value| {
        cfg["add_bos_token"] = false.into();
        cfg["chat_template"] = template.into();
    };
    convert_changed(dir, tok, |_| {})
}

#[test]
fn empty_prompt_without_bos_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = convert_without_bos(dir.path(), "{% for m in messages %}{% endfor %}");
    // A raw empty prompt, and a template that renders nothing.
    for extra in [&["--no-chat", "-p", ""][..], &["-p", "hello"][..]] {
        let (ok, _, stderr) = run(&path, extra);
        assert!(!ok, "{extra:?}");
        assert!(
            stderr.contains(&format!(
                "error: {}: the prompt is empty and the model adds no BOS token",
                path.display()
            )),
            "{extra:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn chat_refuses_a_too_long_message_and_goes_on() {
    let (_dir, path) = convert_fixture("f16");
    let long = "word ".repeat(400);
    let input = format!("hello\n{long}\nagain\n");
    let (ok, _, stderr) = run_with_stdin(&path, &["-i", "-n", "2"], input.as_bytes());
    assert!(ok, "{stderr}");
    assert!(stderr.contains("[not sent: the prompt is"), "{stderr}");
    assert_eq!(
        stderr.matches("generation: 2 tokens").count(),
        2,
        "{stderr}"
    );
}

#[test]
fn chat_says_how_to_quit_and_clear_starts_over() {
    let (_dir, path) = convert_fixture("f16");
    let (ok, _, stderr) = run_with_stdin(
        &path,
        &["-i", "-n", "2"],
        b"hello\n/clear\nhello\nline one \\\nline two\n",
    );
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("Ctrl-D, /exit or Ctrl-C at the prompt quits"),
        "{stderr}"
    );
    let prompts = prompt_tokens(&stderr);
    assert_eq!(prompts.len(), 3, "{stderr}");
    // After /clear the same message is the whole prompt again; the continued line is one message.
    assert_eq!(prompts[0], prompts[1], "{stderr}");
    assert!(prompts[2] < prompts[1] + 16, "{stderr}");
}

/// A chat on a pseudo-terminal: hob reads it through the line editor, in raw mode, where Ctrl-C
/// is a key (not a signal) at the prompt.
struct PtyChat {
    child: std::process::Child,
    master: std::fs::File,
    seen: Vec<u8>,
}

impl PtyChat {
    fn start(model: &Path, extra: &[&str]) -> PtyChat {
        use std::os::fd::{FromRawFd, OwnedFd};
        let (master, slave) = {
            let (mut m, mut s) = (0, 0);
            // SAFETY: openpty writes two new descriptors into m and s; the null pointers ask
            // for no name and default terminal settings.
            let rc = unsafe {
                libc::openpty(
                    &mut m,
                    &mut s,
                    std::ptr::null_mut(),
                    std::ptr::null(),
                    std::ptr::null(),
                )
            };
            assert_eq!(rc, 0, "openpty");
            // SAFETY: both descriptors were just opened and are owned by nobody else.
            unsafe { (std::fs::File::from_raw_fd(m), OwnedFd::from_raw_fd(s)) }
        };
        let child = hob_command()
            .args([
                "run",
                "-m",
                model.to_str().unwrap(),
                "--device",
                "cpu",
                "-i",
            ])
            .args(["--temp", "0"])
            .args(extra)
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave))
            .spawn()
            .unwrap();
        PtyChat {
            child,
            master,
            seen: Vec::new(),
        }
    }

    /// Reads until `needle` appears after byte `from` of what the chat wrote; where it ends.
    fn wait_for(&mut self, needle: &str, from: usize) -> usize {
        let mut buf = [0u8; 4096];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let text = String::from_utf8_lossy(&self.seen[from.min(self.seen.len())..]);
            if let Some(at) = text.find(needle) {
                return from + at + needle.len();
            }
            let all = String::from_utf8_lossy(&self.seen).into_owned();
            assert!(
                std::time::Instant::now() < deadline,
                "no {needle:?} in {all:?}"
            );
            // Read only what is there: a chat that says nothing more fails at the deadline.
            let mut fds = [libc::pollfd {
                fd: self.master.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            // SAFETY: one valid pollfd, for a descriptor we own, for 100 ms.
            if unsafe { libc::poll(fds.as_mut_ptr(), 1, 100) } == 1 {
                let n = self.master.read(&mut buf).unwrap_or(0);
                self.seen.extend_from_slice(&buf[..n]);
            }
        }
    }

    /// Keys, all in one write (as a paste or a fast typist sends them).
    fn keys(&mut self, keys: &[u8]) {
        self.master.write_all(keys).unwrap();
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen).into_owned()
    }
}

impl Drop for PtyChat {
    /// A failed test leaves no chat running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "pseudo-terminal modes under qemu-user: run natively"
)]
fn ctrl_c_at_the_chat_prompt_quits() {
    let (_dir, path) = convert_fixture("f16");
    let mut chat = PtyChat::start(&path, &["-n", "2"]);
    let at = chat.wait_for("> ", 0);
    chat.keys(b"hello\r");
    let at = chat.wait_for("generation: 2 tokens", at);
    chat.wait_for("> ", at);
    chat.keys(b"\x03");
    let status = chat.child.wait().unwrap();
    assert!(status.success(), "the chat did not end cleanly on Ctrl-C");
}

/// Ctrl-C during an answer did nothing: the line editor's own SIGINT handler, installed for the
/// whole session, displaced hob's. And a message sent in one write (a paste ending in Enter)
/// waited for another key before it was read (rustyline before 19).
#[test]
#[cfg_attr(
    not(target_arch = "x86_64"),
    ignore = "pseudo-terminal modes under qemu-user: run natively"
)]
fn ctrl_c_during_an_answer_stops_it_and_the_chat_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    // A long context, so that an answer that is not stopped runs for seconds.
    let path = convert_changed(
        dir.path(),
        |_| {},
        |cfg| {
            cfg["max_position_embeddings"] = 32768.into();
        },
    );
    let mut chat = PtyChat::start(&path, &["-c", "32768", "-n", "-1", "--ignore-eos"]);
    let at = chat.wait_for("> ", 0);
    chat.keys(b"tell me a long story\r");
    let at = chat.wait_for("story", at);
    // Some of the answer, then what the terminal sends for Ctrl-C during it.
    chat.wait_for(" ", at + 8);
    let pid = libc::pid_t::try_from(chat.child.id()).unwrap();
    // SAFETY: kill takes integers only; `pid` is our child, running (not reaped).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let at = chat.wait_for("[stopped]", at);
    let at = chat.wait_for("> ", at);
    assert!(!chat.text().contains("[context full"), "{}", chat.text());
    chat.keys(b"/exit\r");
    let status = chat.child.wait().unwrap();
    assert!(
        status.success(),
        "after the stopped answer: {}",
        &chat.text()[at..]
    );
}

/// `hob inspect M | head -1` and `hob perplexity ... | head` panicked on the broken pipe: every
/// command ends quietly (exit 0) when its reader goes away.
#[test]
fn commands_writing_into_a_closed_pipe_do_not_panic() {
    let (dir, path) = convert_fixture("f16");
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "a b c d e f g h ".repeat(64)).unwrap();
    let (m, t) = (path.to_str().unwrap(), text.to_str().unwrap());
    let commands: [&[&str]; 4] = [
        &["inspect", m],
        &[
            "perplexity",
            "-m",
            m,
            "-f",
            t,
            "-c",
            "32",
            "--device",
            "cpu",
        ],
        &["run", "-m", m, "-p", "hi", "-n", "8", "--device", "cpu"],
        &[
            "bench", "-m", m, "-p", "8", "-n", "4", "-r", "1", "--device", "cpu",
        ],
    ];
    for args in commands {
        let mut child = hob_command()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The reader goes away before the command writes its first line.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    }
}
