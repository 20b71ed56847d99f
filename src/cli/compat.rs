//! llama.cpp's command-line habits, read before clap sees the arguments: its multi-letter
//! single-dash flags (`-ngl 99`, `-cnv`, `-sys`), which clap would split into `-n gl`; values
//! that start with '-' (`-c -1`, `-p -`); and its flags that hob has no use for, each ignored
//! with a note or refused by name. Anything else single-dash and unknown is an error naming it.

use std::ffi::OsString;

use clap::{Arg, Command};

use crate::Error;

/// What hob does with one of llama.cpp's flags that it does not define itself.
#[derive(Clone, Copy)]
enum Habit {
    /// The same meaning as this hob flag (its long name).
    Alias(&'static str),
    /// Accepted and ignored (with its value, if `takes_value`), with this reason on stderr.
    Ignored {
        why: &'static str,
        takes_value: Value,
    },
    /// Refused: the reason says what to use instead.
    Refused(&'static str),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Value {
    None,
    /// `-fa` alone or `-fa on|off|auto`.
    Optional,
    One,
}

const PLACEMENT: &str = "hob places experts itself: --gpu-mem and --expert-cache set the GPU's \
                         share, --cpu-experts lets CPU threads compute the misses";

/// llama.cpp's spellings (single-dash short forms and long forms) and what they mean here.
const HABITS: &[(&[&str], Habit)] = &[
    (&["-ngl", "--gpu-layers"], Habit::Alias("--n-gpu-layers")),
    (&["-cnv"], Habit::Alias("--conversation")),
    (&["-no-cnv"], Habit::Alias("--no-conversation")),
    (&["-sys"], Habit::Alias("--system-prompt")),
    (
        &["-fa", "--flash-attn"],
        Habit::Ignored {
            why: "hob's attention is always fused (online softmax)",
            takes_value: Value::Optional,
        },
    ),
    (
        &["--mlock"],
        Habit::Ignored {
            why: "hob page-locks the expert pages it copies from (--no-pin turns that off)",
            takes_value: Value::None,
        },
    ),
    (
        &["-b", "--batch-size", "-ub", "--ubatch-size"],
        Habit::Ignored {
            why: "hob picks its own prefill batch",
            takes_value: Value::One,
        },
    ),
    (
        &["--color", "-co", "--jinja", "--log-disable"],
        Habit::Ignored {
            why: "hob always renders the model's own chat template and writes plain text",
            takes_value: Value::None,
        },
    ),
    (
        &["--no-mmap"],
        Habit::Refused("hob always memory-maps the model file"),
    ),
    (
        &["-ctk", "--cache-type-k", "-ctv", "--cache-type-v"],
        Habit::Refused("hob's KV cache is f16 on the GPU and f32 on the CPU"),
    ),
    (
        &[
            "-mg",
            "--main-gpu",
            "-ts",
            "--tensor-split",
            "-sm",
            "--split-mode",
        ],
        Habit::Refused("hob runs on one GPU, device 0"),
    ),
    (
        &[
            "-cmoe",
            "--cpu-moe",
            "-ncmoe",
            "--n-cpu-moe",
            "-ot",
            "--override-tensor",
        ],
        Habit::Refused(PLACEMENT),
    ),
    (
        &["-np", "--parallel"],
        Habit::Ignored {
            why:
                "hob serve answers one request at a time (batch 1); --queue sets how many may wait",
            takes_value: Value::One,
        },
    ),
    (
        &["-cb", "--cont-batching", "--metrics"],
        Habit::Ignored {
            why: "hob serve has no batching to turn on, and /metrics is always served",
            takes_value: Value::None,
        },
    ),
    (
        &["--embedding", "--embeddings", "--reranking"],
        Habit::Refused("hob serve generates text: it serves no embeddings or reranking"),
    ),
    (
        &["-hf", "--hf-repo", "-mu", "--model-url"],
        Habit::Refused(
            "hob downloads nothing: convert a local Hugging Face directory with \
             `hob convert --from DIR -o model.hob`",
        ),
    ),
];

/// The arguments clap should parse, and the notes to print for ignored flags.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Normalized {
    pub args: Vec<OsString>,
    pub notes: Vec<String>,
}

fn habit(flag: &str) -> Option<Habit> {
    HABITS
        .iter()
        .find(|(names, _)| names.contains(&flag))
        .map(|&(_, h)| h)
}

/// The argument `flag` (`-x`, `--long`, without any `=value`) names in `cmd`.
fn find<'c>(cmd: &'c Command, flag: &str) -> Option<&'c Arg> {
    if let Some(long) = flag.strip_prefix("--") {
        return cmd.get_arguments().find(|a| {
            a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|all| all.contains(&long))
        });
    }
    let mut chars = flag.strip_prefix('-')?.chars();
    let (c, None) = (chars.next()?, chars.next()) else {
        return None;
    };
    cmd.get_arguments().find(|a| a.get_short() == Some(c))
}

/// True when `arg` must be followed by exactly one value.
fn takes_one_value(arg: &Arg) -> bool {
    arg.get_action().takes_values() && arg.get_num_args().is_none_or(|n| n.min_values() == 1)
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.parse::<f64>().is_ok()
}

/// Rewrite `args` (the program name first, then a subcommand) for clap. Errors name the flag.
pub fn normalize(cli: &Command, args: Vec<OsString>) -> crate::Result<Normalized> {
    let mut out = Normalized::default();
    let mut it = args.into_iter();
    out.args.extend(it.next());
    let Some(sub) = it.next() else {
        return Ok(out);
    };
    let cmd = sub.to_str().and_then(|s| cli.find_subcommand(s)).cloned();
    out.args.push(sub);
    let Some(cmd) = cmd else {
        // Not a subcommand (`--help`, `--version`, a typo): clap says what is wrong.
        out.args.extend(it);
        return Ok(out);
    };
    let mut rest: std::collections::VecDeque<OsString> = it.collect();
    while let Some(token) = rest.pop_front() {
        let Some(text) = token.to_str().map(str::to_owned) else {
            out.args.push(token);
            continue;
        };
        if text == "--" {
            out.args.push(token);
            out.args.extend(rest.drain(..));
            break;
        }
        if !text.starts_with('-') || text == "-" || is_number(&text) || text.contains('=') {
            out.args.push(token);
            continue;
        }
        let habit = habit(&text);
        let alias = match habit {
            Some(Habit::Alias(long)) => find(&cmd, long).map(|arg| (long.to_string(), arg)),
            _ => None,
        };
        let (flag, arg) = match (find(&cmd, &text), alias) {
            (Some(arg), _) => (text, arg),
            (None, Some(alias)) => alias,
            (None, None) => match habit {
                Some(Habit::Alias(_)) | None => {
                    check_unknown(&cmd, &text)?;
                    out.args.push(token);
                    continue;
                }
                Some(Habit::Refused(why)) => {
                    return Err(Error::Invalid(format!(
                        "{text} (llama.cpp's flag) is not supported: {why}"
                    )))
                }
                Some(Habit::Ignored { why, takes_value }) => {
                    let value = match takes_value {
                        Value::None => None,
                        Value::Optional => {
                            let word = rest.front().and_then(|v| v.to_str()).unwrap_or("");
                            let words = ["on", "off", "auto", "1", "0", "true", "false"];
                            if words.contains(&word) {
                                rest.pop_front()
                            } else {
                                None
                            }
                        }
                        Value::One => rest.pop_front(),
                    };
                    let shown = match &value {
                        Some(v) => format!("{text} {}", v.to_string_lossy()),
                        None => text,
                    };
                    out.notes.push(format!(
                        "note: {shown} (llama.cpp's flag) is ignored: {why}"
                    ));
                    continue;
                }
            },
        };
        // A value that starts with '-' (`-c -1`, `-p -`, `-p "-x"`) goes with its flag, as
        // llama.cpp reads it; clap would take it for a flag.
        let hyphen_value = rest
            .front()
            .and_then(|v| v.to_str())
            .is_some_and(|v| v.starts_with('-'));
        let joined = match arg.get_long() {
            Some(long) if takes_one_value(arg) && hyphen_value => rest.pop_front().map(|value| {
                let mut joined = OsString::from(format!("--{long}="));
                joined.push(value);
                joined
            }),
            _ => None,
        };
        out.args.push(joined.unwrap_or_else(|| flag.into()));
    }
    Ok(out)
}

/// A single-dash token clap would misread (`-ngx` as `-n gx`): an error naming it, unless it is
/// a short flag with its number attached (`-n128`, `-c2048`).
fn check_unknown(cmd: &Command, text: &str) -> crate::Result<()> {
    if text.starts_with("--") || text.chars().count() <= 2 {
        return Ok(()); // clap's own error names an unknown long or one-letter flag.
    }
    let first: String = text.chars().take(2).collect();
    let number: String = text.chars().skip(2).collect();
    let attached_number = find(cmd, &first).is_some_and(takes_one_value) && is_number(&number);
    if attached_number {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "unknown flag {text} for `hob {}` (`hob {} --help` lists its flags)",
        cmd.get_name(),
        cmd.get_name()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn norm(line: &str) -> crate::Result<Normalized> {
        let args = std::iter::once("hob")
            .chain(line.split(' '))
            .map(OsString::from)
            .collect();
        normalize(&crate::cli::Cli::command(), args)
    }

    fn joined(n: &Normalized) -> String {
        let v: Vec<String> = n.args[1..]
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        v.join(" ")
    }

    #[test]
    fn ngl_is_not_read_as_n_gl() {
        let n = norm("run -m x.hob -ngl 99 -p hi").unwrap();
        assert_eq!(joined(&n), "run -m x.hob --n-gpu-layers 99 -p hi");
        let n = norm("bench -m x.hob -ngl 0").unwrap();
        assert_eq!(joined(&n), "bench -m x.hob --n-gpu-layers 0");
    }

    #[test]
    fn cnv_and_sys_are_llama_cpp_s_conversation_and_system_prompt() {
        let n = norm("run -m x.hob -cnv -sys be-brief").unwrap();
        assert_eq!(
            joined(&n),
            "run -m x.hob --conversation --system-prompt be-brief"
        );
        let n = norm("run -m x.hob -no-cnv -p hi").unwrap();
        assert_eq!(joined(&n), "run -m x.hob --no-conversation -p hi");
    }

    #[test]
    fn negative_and_dash_values_stay_with_their_flag() {
        let n = norm("run -m x.hob -c -1 --top-k -1 -p -").unwrap();
        assert_eq!(
            joined(&n),
            "run -m x.hob --ctx-size=-1 --top-k=-1 --prompt=-"
        );
        // A number attached to its short flag is clap's syntax and passes.
        let n = norm("run -m x.hob -n128 -p hi").unwrap();
        assert_eq!(joined(&n), "run -m x.hob -n128 -p hi");
    }

    #[test]
    fn ignored_flags_are_noted_and_dropped_with_their_value() {
        let n = norm("run -m x.hob -fa on --mlock -ub 512 -p hi").unwrap();
        assert_eq!(joined(&n), "run -m x.hob -p hi");
        assert_eq!(n.notes.len(), 3);
        assert!(n.notes[0].contains("-fa on"), "{:?}", n.notes);
        // perplexity has its own -b: it is not llama.cpp's then.
        let n = norm("perplexity -m x.hob -f t.txt -b 64").unwrap();
        assert_eq!(joined(&n), "perplexity -m x.hob -f t.txt -b 64");
    }

    #[test]
    fn unknown_and_refused_flags_are_named() {
        let e = norm("run -m x.hob -ngx 3").unwrap_err().to_string();
        assert!(e.contains("unknown flag -ngx for `hob run`"), "{e}");
        let e = norm("run -m x.hob --no-mmap").unwrap_err().to_string();
        assert!(e.contains("--no-mmap") && e.contains("memory-maps"), "{e}");
        let e = norm("run -m x.hob -ot exps=CPU").unwrap_err().to_string();
        assert!(e.contains("-ot") && e.contains("--cpu-experts"), "{e}");
        // `-cnv` means nothing to bench.
        let e = norm("bench -m x.hob -cnv").unwrap_err().to_string();
        assert!(e.contains("unknown flag -cnv for `hob bench`"), "{e}");
    }
}
