//! `cubellm chat`: an interactive conversation with the model's chat template, answers streamed
//! as they are generated.
//!
//! Lines are read on their own thread so that Ctrl-C is seen while waiting for input: at the
//! prompt it ends the program, during an answer it stops that answer (what was written stays in
//! the history) and the conversation goes on.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use cubecl::prelude::*;
use model::{ChatMessage, GenerateOptions, Generator, ModelError, Prompt, Session, StopReason};

use crate::interrupt;
use crate::load::{self, ModelArgs, ModelFiles, SamplingArgs};

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// The system message to start with (`/system` changes it).
    #[arg(long)]
    pub system: Option<String>,
    /// Maximum number of tokens per answer.
    #[arg(long, default_value_t = 1024)]
    pub max_new_tokens: usize,
    /// Stop an answer when its text contains this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

const HELP: &str = "type a message and press Enter; /system TEXT sets the system message \
                    (empty: none), /reset clears the conversation, /exit quits; Ctrl-C stops \
                    an answer, and at the prompt quits";

/// What a line of input asks for.
#[derive(Debug, PartialEq)]
enum Input {
    Message(String),
    System(Option<String>),
    Reset,
    Exit,
    Help,
    Unknown(String),
    Empty,
}

fn parse(line: &str) -> Input {
    let line = line.trim_end_matches(['\r', '\n']);
    let Some(command) = line.strip_prefix('/') else {
        return if line.trim().is_empty() {
            Input::Empty
        } else {
            Input::Message(line.to_string())
        };
    };
    let (name, rest) = command.split_once(' ').unwrap_or((command, ""));
    match name {
        "system" => Input::System(Some(rest.trim().to_string()).filter(|s| !s.is_empty())),
        "reset" | "clear" => Input::Reset,
        "exit" | "quit" => Input::Exit,
        "help" | "?" => Input::Help,
        _ => Input::Unknown(name.to_string()),
    }
}

/// The conversation so far, with the system message kept apart so that `/reset` keeps it.
struct Conversation {
    system: Option<String>,
    turns: Vec<ChatMessage>,
}

impl Conversation {
    fn messages(&self) -> Vec<ChatMessage> {
        self.system
            .iter()
            .map(|s| ChatMessage::system(s.clone()))
            .chain(self.turns.iter().cloned())
            .collect()
    }
}

pub fn chat<R: Runtime>(client: &ComputeClient<R>, args: &ChatArgs) -> anyhow::Result<()> {
    let files = ModelFiles::read(&args.model)?;
    if !files.tokenizer.has_chat_template() {
        bail!("this model has no chat template; use `generate --raw`");
    }
    let params = args.sampling.params(&files.generation)?;
    let session = load::load_session(client, &args.model, &files)?;
    eprintln!("sampling: {}", load::describe_sampling(&params));
    let mut generator = Generator::new(session, files.tokenizer);
    // Each turn's prompt starts with the previous turn's prompt and answer: prefill only the
    // new message.
    generator.set_prefix_reuse(true);
    let options = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        sampling: params,
        stop_strings: args.stop.clone(),
        eos_token_ids: None,
    };

    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("{HELP}");
    }
    let lines = spawn_reader();
    let mut conversation = Conversation {
        system: args.system.clone(),
        turns: Vec::new(),
    };
    loop {
        if interactive {
            eprint!("> ");
            let _ = std::io::stderr().flush();
        }
        let line = loop {
            match lines.recv_timeout(Duration::from_millis(50)) {
                Ok(line) => break Some(line),
                Err(RecvTimeoutError::Disconnected) => break None,
                Err(RecvTimeoutError::Timeout) if interrupt::requested() => break None,
                Err(RecvTimeoutError::Timeout) => {}
            }
        };
        let Some(line) = line else {
            // End of input, or Ctrl-C at the prompt.
            if interactive {
                eprintln!();
            }
            interrupt::clear();
            return Ok(());
        };
        match parse(&line?) {
            Input::Empty => {}
            Input::Exit => return Ok(()),
            Input::Help => eprintln!("{HELP}"),
            Input::Unknown(name) => eprintln!("unknown command /{name}; {HELP}"),
            Input::Reset => {
                conversation.turns.clear();
                // A new conversation starts from an empty cache, as `generate` does.
                generator.forget_prefix();
                eprintln!("(conversation cleared)");
            }
            Input::System(system) => {
                eprintln!(
                    "(system message {})",
                    if system.is_some() { "set" } else { "cleared" }
                );
                conversation.system = system;
            }
            Input::Message(text) => {
                conversation.turns.push(ChatMessage::user(text));
                match answer(&mut generator, &conversation, &options) {
                    Ok(reply) => conversation.turns.push(ChatMessage::assistant(reply)),
                    Err(e) => {
                        // The question stays unanswered: take it back out of the history.
                        conversation.turns.pop();
                        let context_full = matches!(
                            e.downcast_ref::<ModelError>(),
                            Some(ModelError::ContextOverflow { .. })
                        );
                        eprintln!(
                            "error: {}{}",
                            format!("{e:#}").replace('\n', " "),
                            if context_full {
                                " (/reset starts a new conversation)"
                            } else {
                                ""
                            }
                        );
                    }
                }
            }
        }
    }
}

/// Generates the answer to the conversation, streaming it to stdout; returns its text.
fn answer<R: Runtime>(
    generator: &mut Generator<Session<R>>,
    conversation: &Conversation,
    options: &GenerateOptions,
) -> anyhow::Result<String> {
    let output =
        load::generate_to_stdout(generator, &Prompt::Chat(conversation.messages()), options)?;
    if output.stats.stop_reason == StopReason::Cancelled {
        // Ctrl-C stopped this answer only.
        interrupt::clear();
        eprintln!("(stopped)");
    }
    eprintln!("{}", output.stats.summary());
    Ok(output.text)
}

/// Reads stdin line by line on its own thread (a blocking read cannot watch for Ctrl-C).
fn spawn_reader() -> mpsc::Receiver<std::io::Result<String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut lock = stdin.lock();
        loop {
            let mut line = String::new();
            match lock.read_line(&mut line) {
                Ok(0) => return,
                Ok(_) => {
                    if tx.send(Ok(line)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_into_commands_and_messages() {
        assert_eq!(parse("hello\n"), Input::Message("hello".into()));
        assert_eq!(parse("  \n"), Input::Empty);
        assert_eq!(parse("/reset\n"), Input::Reset);
        assert_eq!(parse("/exit"), Input::Exit);
        assert_eq!(
            parse("/system be brief\n"),
            Input::System(Some("be brief".into()))
        );
        assert_eq!(parse("/system\n"), Input::System(None));
        assert_eq!(parse("/frobnicate x"), Input::Unknown("frobnicate".into()));
    }
}
