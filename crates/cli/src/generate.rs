//! `cubellm generate` and `cubellm make-demo-model`.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
use cubecl::prelude::*;
use model::{demo, ChatMessage, GenerateOptions, Generator, Prompt};

use crate::load::{self, ModelArgs, ModelFiles, SamplingArgs};

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The prompt.
    #[arg(long, short)]
    pub prompt: String,
    /// Render the prompt as a user message with the model's chat template (default when the
    /// model has one).
    #[arg(long, conflicts_with = "raw")]
    pub chat: bool,
    /// Feed the prompt to the model as it is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// A system message (chat mode only).
    #[arg(long)]
    pub system: Option<String>,
    /// Maximum number of tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Stop when the text contains this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

#[derive(Args, Debug)]
pub struct MakeDemoArgs {
    /// Directory to write the demo model into (created if needed).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn make_demo_model(args: &MakeDemoArgs) -> anyhow::Result<()> {
    demo::write_demo_model(&args.out)?;
    eprintln!(
        "wrote the demo model ({}) to {}",
        demo::DEMO_VERSION,
        args.out.display()
    );
    Ok(())
}

pub fn generate<R: Runtime>(client: &ComputeClient<R>, args: &GenerateArgs) -> anyhow::Result<()> {
    // Host-side files first: a broken tokenizer or bad sampling flags fail before the upload.
    let files = ModelFiles::read(&args.model)?;
    let params = args.sampling.params(&files.generation)?;
    let chat = if args.raw {
        false
    } else if args.chat {
        if !files.tokenizer.has_chat_template() {
            bail!("--chat: this model has no chat template; use --raw");
        }
        true
    } else {
        files.tokenizer.has_chat_template()
    };
    if args.system.is_some() && !chat {
        bail!("--system needs chat mode (the model has a chat template and --raw is not given)");
    }
    let prompt = if chat {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage::system(s.clone()));
        }
        messages.push(ChatMessage::user(args.prompt.clone()));
        Prompt::Chat(messages)
    } else {
        Prompt::Text(args.prompt.clone())
    };

    let session = load::load_session(client, &args.model, &files)?;
    eprintln!("sampling: {}", load::describe_sampling(&params));
    let mut generator = Generator::new(session, files.tokenizer);
    let options = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        sampling: params,
        stop_strings: args.stop.clone(),
        eos_token_ids: None,
    };
    let output = load::generate_to_stdout(&mut generator, &prompt, &options)?;
    eprintln!("{}", output.stats.summary());
    Ok(())
}
