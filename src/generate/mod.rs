//! Tokenizer, chat template, sampler, streaming detokenization, the decode loop.
//! STUB: the generate worker fills in the bodies.

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("{0}")]
    Todo(String),
}
