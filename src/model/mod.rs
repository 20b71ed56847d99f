//! Model configuration (an enum of architectures), weight views into the mmap and the forward
//! pass, written once for every backend.
//!
//! - `config`: hyper-parameters read from the .hob metadata.
//! - `weights`: dense weights as views into the mmap.
//! - `forward`: the forward pass (prefill and decode share it), the KV cache and run state.
//! - `ops`: what a backend provides to the forward pass (a small trait), and the expert
//!   execution interface the offload engine plugs into.

pub mod config;
pub mod forward;
pub mod ops;
pub mod session;
pub mod weights;

pub use config::{Architecture, ModelConfig};
pub use forward::{Logits, Model, RunState};
pub use ops::{Backend, DecodeStep, ExpertExecutor, KernelTime, Route};
pub use session::{Bound, ExpertReport, ExpertStats, Experts, Session, VariantStats};

use crate::format::FormatError;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("unsupported architecture '{found}' (supported: {supported})")]
    UnsupportedArchitecture { found: String, supported: String },
    #[error("model metadata: {0}")]
    Metadata(#[from] FormatError),
    #[error("model metadata: {key} = {value}: {problem}")]
    BadHyperParameter {
        key: String,
        value: String,
        problem: String,
    },
    #[error("tensor '{name}' is missing from the file")]
    MissingTensor { name: String },
    #[error("tensor '{name}': expected shape {expected:?}, found {found:?}")]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("expert table: {0}")]
    Experts(String),
    #[error("token id {token} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("context full: {needed} tokens needed, the context holds {ctx} (raise -c/--ctx-size, at most {max})")]
    ContextFull {
        needed: usize,
        ctx: usize,
        max: usize,
    },
}
