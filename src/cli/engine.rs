//! What `run` and `perplexity` share: open a .hob file, build the model, the CPU backend, the
//! expert executor and the tokenizer from the flags every model command takes.

use std::path::PathBuf;

use clap::Args;

use crate::backend::cpu::CpuBackend;
use crate::format::{keys, HobFile};
use crate::generate::Tokenizer;
use crate::model::ModelConfig;
use crate::Error;

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// The .hob model file.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// CPU threads (0: one per core).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: usize,
    /// Expert variant to compute with: f16, bf16, int8, int4 or int2 (default: the file's first,
    /// normally its highest precision).
    #[arg(long = "expert-variant")]
    pub expert_variant: Option<String>,
}

impl ModelArgs {
    pub fn open(&self) -> crate::Result<HobFile> {
        if !self.model.exists() {
            return Err(Error::Invalid(format!(
                "model file {} does not exist",
                self.model.display()
            )));
        }
        HobFile::open(&self.model)
    }

    pub fn backend(&self) -> crate::Result<CpuBackend> {
        CpuBackend::new(self.threads)
    }

    /// Index into `file.variants()` of the requested variant.
    pub fn variant_index(&self, file: &HobFile) -> crate::Result<usize> {
        let Some(want) = &self.expert_variant else {
            return Ok(0);
        };
        let names: Vec<String> = file.variants().iter().map(|v| v.name()).collect();
        file.variants()
            .iter()
            .position(|v| v.kind.name() == want || v.name() == *want)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "--expert-variant {want}: {} stores only {}",
                    self.model.display(),
                    names.join(", ")
                ))
            })
    }
}

/// The tokenizer embedded in the file, with BOS/EOS from the metadata.
pub fn tokenizer(file: &HobFile, cfg: &ModelConfig) -> crate::Result<Tokenizer> {
    let json = file
        .metadata()
        .get_str(keys::TOKENIZER_HF_JSON)
        .map_err(|e| Error::Format {
            path: file.path().to_path_buf(),
            source: e,
        })?;
    let missing = |what: &str| {
        Error::Invalid(format!(
            "{}: the metadata has no {what}",
            file.path().display()
        ))
    };
    let bos = cfg.bos.ok_or_else(|| missing(keys::BOS_TOKEN_ID))?;
    let eos = cfg.eos.ok_or_else(|| missing(keys::EOS_TOKEN_ID))?;
    Ok(Tokenizer::from_json(json, bos, eos, cfg.add_bos)?)
}
