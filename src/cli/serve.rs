//! `hob serve`: the OpenAI-compatible server (src/serve) with llama-server's flag names.

use clap::Args;

use super::engine::{tokenizer, ModelArgs};
use super::run::{
    chat_template, context_size, ctx_size, json_object, n_predict, started, SamplingArgs,
};
use crate::generate::harmony::Channels;
use crate::model::{Architecture, Model};
use crate::serve::{Loaded, ServerConfig};
use crate::Error;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (loopback unless told otherwise; 0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1", help_heading = "Server")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080, help_heading = "Server")]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every request but /health and the chat page.
    #[arg(long = "api-key", value_name = "KEY", help_heading = "Server")]
    pub api_key: Option<String>,
    /// The model's name in /v1/models and requests (default: the file's name without .hob).
    #[arg(
        short = 'a',
        long = "alias",
        value_name = "NAME",
        help_heading = "Server"
    )]
    pub alias: Option<String>,
    /// Requests that may wait while one generates; one more gets 429 with Retry-After.
    #[arg(long = "queue", value_name = "N", default_value_t = 32, value_parser = queue, help_heading = "Server")]
    pub queue: usize,
    /// The largest request body in MiB (413 beyond).
    #[arg(
        long = "max-body",
        value_name = "MIB",
        default_value_t = 16,
        help_heading = "Server"
    )]
    pub max_body: usize,
    /// Context size in tokens, shared by the queue's requests one at a time (0: the model's,
    /// capped at 4096).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0, value_parser = ctx_size,
          help_heading = "Server")]
    pub ctx: usize,
    /// Answer length when a request gives no max_tokens (-1: until the end or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, value_parser = n_predict,
          help_heading = "Server")]
    pub n_predict: i64,
    /// Default variables for the chat template, a JSON object (a request's
    /// chat_template_kwargs add to them), e.g. '{"enable_thinking": false}'.
    #[arg(long = "chat-template-kwargs", value_name = "JSON", value_parser = json_object,
          help_heading = "Server")]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Sampling defaults for what a request leaves out (llama-server's).
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

fn queue(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=100_000).contains(&n) => Ok(n),
        _ => Err("a number of requests from 1 to 100000".into()),
    }
}

pub fn run(args: &ServeArgs) -> crate::Result<()> {
    let stem = args
        .model
        .model
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned());
    let cfg = ServerConfig {
        host: args.host.clone(),
        port: args.port,
        api_key: args.api_key.clone(),
        model_name: args.alias.clone().or(stem).unwrap_or_else(|| "hob".into()),
        queue: args.queue,
        max_body: args.max_body.saturating_mul(1 << 20),
    };
    crate::serve::run(
        cfg,
        Box::new(|serve: &mut dyn FnMut(Loaded<'_>)| load(args, serve)),
    )
}

/// Open the model as `hob run` does and hand it to the server.
fn load(args: &ServeArgs, serve: &mut dyn FnMut(Loaded<'_>)) -> crate::Result<()> {
    let file = args.model.open()?;
    let model = Model::load(&file)?;
    let tok = tokenizer(&file, &model.cfg)?;
    let ctx = context_size(&file, &model, args.ctx)?;
    let template = chat_template(&file, &model, &tok, args.chat_template_kwargs.as_ref())?;
    if template.is_none() {
        eprintln!("note: the file has no chat template: /v1/chat/completions is refused, /v1/completions works");
    }
    // The tokenizer and the template initialize lazily: pay that here, not in the first request.
    tok.encode("warm up", false)?;
    if let Some(t) = &template {
        t.render(&[crate::generate::Message::user("warm up")], true)
            .map_err(|e| {
                Error::Invalid(format!("the chat template cannot render a message: {e}"))
            })?;
    }
    let defaults = args.sampling.config(ctx);
    crate::generate::Sampler::new(defaults.clone())?;
    let grammars = structured_output(&file, &model);
    let harmony = match (model.cfg.arch, &template) {
        (Architecture::GptOss, Some(_)) => Channels::new(&tok),
        _ => None,
    };
    let gen = args.model.generator(&file, &model, ctx)?;
    eprintln!("{}", started(&file, &model, &format!("ctx {ctx}"), &gen));
    serve(Loaded {
        gen,
        tok,
        template,
        defaults,
        n_predict: usize::try_from(args.n_predict).ok(),
        grammars,
        harmony,
    });
    Ok(())
}

/// The vocabulary compiled for response_format, or None (with a note) when it cannot be.
fn structured_output(
    file: &crate::format::HobFile,
    model: &Model<'_>,
) -> Option<crate::generate::Grammars> {
    use crate::format::keys;
    let json = file.metadata().get_str(keys::TOKENIZER_HF_JSON).ok()?;
    let eos = model.cfg.eos?;
    match crate::generate::Grammars::new(json, model.cfg.vocab, eos) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("note: no structured output (response_format) for this model: {e}");
            None
        }
    }
}
