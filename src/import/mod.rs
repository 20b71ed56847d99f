//! Hugging Face checkpoints (config.json + safetensors + tokenizer files) -> what convert writes.
//! STUB: the import/convert worker fills in the bodies.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{0}")]
    Todo(String),
}

/// A checkpoint directory, opened (config parsed, safetensors headers indexed, nothing loaded).
pub struct Checkpoint {
    pub dir: PathBuf,
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Checkpoint, ImportError> {
        todo!("{}", dir.display())
    }
}
