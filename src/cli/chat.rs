//! `hob run -i`: the interactive chat. Lines come from a line editor (history, pastes of any
//! length, a trailing `\` to go on to the next line; Ctrl-C and Ctrl-D handled), or plainly from
//! stdin when it is not a terminal.

use rustyline::error::ReadlineError;
use rustyline::validate::{ValidationContext, ValidationResult, Validator};
use rustyline::{Completer, Config, Editor, Helper, Highlighter, Hinter};

use super::run::Chat;
use crate::generate::{Message, Stop};
use crate::Error;

const HELP: &str = "chat: Enter sends; end a line with \\ to go on; /clear starts over; \
                    Ctrl-C stops an answer; Ctrl-D, /exit or Ctrl-C at the prompt quits";

/// The editor's one rule: a line that ends with `\` continues on the next.
#[derive(Completer, Helper, Highlighter, Hinter)]
struct Continuation;

impl Validator for Continuation {
    fn validate(&self, ctx: &mut ValidationContext<'_>) -> rustyline::Result<ValidationResult> {
        Ok(if ctx.input().ends_with('\\') {
            ValidationResult::Incomplete
        } else {
            ValidationResult::Valid(None)
        })
    }
}

/// What the user typed at the prompt.
enum Input {
    Message(String),
    Clear,
    Help,
    Quit,
}

fn read(
    editor: &mut Editor<Continuation, rustyline::history::DefaultHistory>,
) -> crate::Result<Input> {
    let line = match editor.readline("> ") {
        Ok(line) => line,
        Err(ReadlineError::Eof | ReadlineError::Interrupted) => return Ok(Input::Quit),
        Err(e) => return Err(Error::Invalid(format!("reading the chat input: {e}"))),
    };
    let text = line.replace("\\\n", "\n");
    Ok(match text.trim() {
        "/exit" | "/quit" | "/bye" => Input::Quit,
        "/clear" => Input::Clear,
        "/help" | "/?" => Input::Help,
        _ => {
            if !text.trim().is_empty() {
                editor.add_history_entry(line.as_str()).ok();
            }
            Input::Message(text)
        }
    })
}

/// Turns until the user quits: each message is refused (and the conversation goes on) when it
/// cannot fit the context; an answer stopped by Ctrl-C stays in the conversation as far as it got.
pub(super) fn converse(
    chat: &mut Chat<'_>,
    mut messages: Vec<Message>,
    first: Option<String>,
) -> crate::Result<()> {
    let config = Config::builder().auto_add_history(false).build();
    let mut editor = Editor::with_config(config)
        .map_err(|e| Error::Invalid(format!("cannot start the line editor: {e}")))?;
    editor.set_helper(Some(Continuation));
    eprintln!("{HELP}");
    let system = messages.len();
    // Without a template the conversation is the running transcript.
    let mut transcript = String::new();
    let mut pending = first;
    loop {
        let text = match pending.take() {
            Some(p) => p,
            None => match read(&mut editor)? {
                Input::Quit => return Ok(()),
                Input::Help => {
                    eprintln!("{HELP}");
                    continue;
                }
                Input::Clear => {
                    messages.truncate(system);
                    transcript.clear();
                    chat.gen.reset();
                    eprintln!("[the conversation starts over]");
                    continue;
                }
                Input::Message(text) if text.trim().is_empty() => continue,
                Input::Message(text) => text,
            },
        };
        messages.push(Message::user(&text));
        let raw = format!("{transcript}{text}");
        let ids = chat.encode(&messages, &raw)?;
        if let Err(e) = chat.gen.check_fits(ids.len()) {
            messages.pop();
            eprintln!("[not sent: {e}; /clear starts over]");
            continue;
        }
        let (answer, stop) = chat.answer(&ids)?;
        if stop == Stop::Interrupted && answer.is_empty() {
            messages.pop();
            continue;
        }
        transcript = raw + &answer;
        messages.push(Message::assistant(&answer));
    }
}
