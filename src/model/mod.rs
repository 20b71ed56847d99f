//! Model configuration (an enum of architectures), weight views into the mmap and the forward
//! pass, written once for every backend.
//!
//! - `config`: hyper-parameters read from the .hob metadata.
//! - `weights`: dense weights as views into the mmap.
//! - `forward`: the forward pass (prefill and decode share it), the KV cache and run state;
//!   `buffers`: its activations.
//! - `ops`: what a backend provides to the forward pass (the `Backend` trait).
//! - `experts`: the interface a layer's experts are computed through (`ExpertExecutor`).
//! - `device`: what the offload engine asks of a device (`ExpertDevice`).

mod buffers;
pub mod config;
mod config_keys;
pub mod device;
pub mod experts;
pub mod forward;
pub mod ops;
pub mod routing;
pub mod weights;
pub mod yarn;

pub use config::{Architecture, ExpertAct, Mla, ModelConfig};
pub use device::{ArenaBase, ChunkCopier, CopierSetup, DeviceEvent, ExpertDevice, SlotExpert};
pub use experts::{Batch, BeforeExperts, ExpertExecutor, MoeBlock, OnDevice};
pub use forward::{Logits, Model, RunState};
pub use ops::{Backend, DecodeStep, KernelTime, QkvStep, Route, RouteOut, RouteReads, Telemetry};

use crate::format::FormatError;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("unsupported architecture '{found}' (supported: {supported})")]
    UnsupportedArchitecture { found: String, supported: String },
    #[error("model metadata: {0}")]
    Metadata(#[from] FormatError),
    /// The file's data failed a check (a checksum): the error names the file and the tensor.
    #[error(transparent)]
    Data(FormatError),
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
    #[error("tensor '{name}': stored as {found}: {problem}")]
    TensorType {
        name: String,
        found: String,
        problem: String,
    },
    #[error("expert table: {0}")]
    Experts(String),
    #[error("token id {token} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { token: u32, vocab: usize },
    /// A NaN or infinity on the hidden-state path, found where the host sees it (router logits
    /// and gate weights, output logits): `site` says where ("at layer 3 (router logits)").
    #[error("{}: non-finite activation {site}: the model's weights or hyper-parameters are broken", path.display())]
    NonFinite {
        path: std::path::PathBuf,
        site: String,
    },
    /// An error about the model in `path`.
    #[error("{}: {source}", path.display())]
    InFile {
        path: std::path::PathBuf,
        #[source]
        source: Box<ModelError>,
    },
    #[error("context full: {needed} tokens needed, the context holds {ctx} (raise -c/--ctx-size, at most {max})")]
    ContextFull {
        needed: usize,
        ctx: usize,
        max: usize,
    },
}

impl ModelError {
    /// This error, about the model in `path` (unless it names a file already).
    pub fn in_file(self, path: &std::path::Path) -> ModelError {
        match self {
            ModelError::Metadata(FormatError::File { .. } | FormatError::Io { .. })
            | ModelError::Data(_)
            | ModelError::NonFinite { .. }
            | ModelError::InFile { .. } => self,
            e => ModelError::InFile {
                path: path.to_path_buf(),
                source: Box::new(e),
            },
        }
    }

    /// A non-finite activation of the model in `path`, in `what` ("router logits") at `layer`,
    /// or in the output logits (None).
    pub fn non_finite(path: &std::path::Path, layer: Option<usize>, what: &str) -> ModelError {
        ModelError::NonFinite {
            path: path.to_path_buf(),
            site: match layer {
                Some(l) => format!("at layer {l} ({what})"),
                None => format!("in the {what}"),
            },
        }
    }
}
