//! Text in and out of the model, and the one generation driver.
//!
//! A prompt is rendered by [`ChatTemplate`] (or taken raw) and encoded by [`Tokenizer`]; a
//! [`Session`] (a model bound to a backend and an expert executor, [`open_session`]) runs it;
//! the [`Generator`] prefills it and decodes, each step's logits through [`Sampler`], and the
//! sampled ids are printed through [`StreamDecoder`].

mod chat;
mod constraint;
mod driver;
mod sampler;
mod session;
mod stream;
mod tokenizer;

pub mod harmony;
pub use chat::{
    ChatTemplate, Conversation, Message, RenderDelta, TEMPLATE_FUEL, TEMPLATE_MAX_OUTPUT,
};
pub use constraint::{bound_whitespace, Constraint, Grammars};
pub use driver::{Generator, Limits, Stop, Timing, PREFILL_BATCH};
pub use sampler::{Sampler, SamplerConfig};
pub use session::{open_session, Bound, Device, Session, SessionConfig};
pub use stream::StreamDecoder;
pub use tokenizer::{parse_hf_json, Tokenizer};

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// A tokenizer.json could not be loaded (invalid JSON, or not what the tokenizers crate
    /// reads). The caller names where the text came from (a file, a metadata key).
    #[error("not a Hugging Face tokenizer: {reason}")]
    TokenizerLoad { reason: String },
    /// A special token id given by the model's metadata is outside the tokenizer's vocabulary.
    #[error("tokenizer: {field} = {id} is outside the vocabulary (size {vocab_size})")]
    SpecialIdOutOfRange {
        field: &'static str,
        id: u32,
        vocab_size: usize,
    },
    /// A token the caller needs (a stop token, a chat marker) is not in the vocabulary.
    #[error("tokenizer: token {token:?} is not in the vocabulary")]
    UnknownToken { token: String },
    /// The tokenizer failed on a given text.
    #[error("tokenizer: cannot encode the text: {reason}")]
    Encode { reason: String },
    /// The tokenizer failed on given ids (for instance an id beyond the vocabulary).
    #[error("tokenizer: cannot decode ids: {reason}")]
    Decode { reason: String },
    /// The chat template does not parse.
    #[error("chat template: syntax error: {reason}")]
    TemplateSyntax { reason: String },
    /// The chat template refused the conversation (raise_exception) or failed while rendering.
    #[error("chat template: cannot render the conversation: {reason}")]
    TemplateRender { reason: String },
    /// The chat template ran past its budget of steps (a loop too long to be a prompt).
    #[error("chat template: too much work (more than {steps} steps): {reason}")]
    TemplateTooMuchWork { steps: u64, reason: String },
    /// The chat template's output ran past the longest prompt allowed.
    #[error("chat template: the prompt would be longer than {limit} bytes")]
    TemplateTooLong { limit: usize },
    /// A structured-output grammar (a JSON schema) did not compile, or failed mid-answer.
    #[error("structured output: {reason}")]
    Grammar { reason: String },
    /// A sampling parameter is out of its range.
    #[error("sampler: {field} must be {expected}, found {found}")]
    InvalidSampler {
        field: &'static str,
        expected: &'static str,
        found: String,
    },
}
