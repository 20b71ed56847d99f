//! Hugging Face checkpoints (config.json + safetensors + tokenizer files) -> what convert writes.
//!
//! - `arch`: config.json -> `Architecture` (hyper-parameters, tensor names, .hob metadata).
//! - `safetensors`: the tensor index over mmapped shards; nothing is loaded until asked.
//! - `tokenizer`: tokenizer.json, tokenizer_config.json, chat_template.jinja.
//! - `dtype`: f32/f16/bf16 decoding and encoding.
//! - `ggml`: llama.cpp's GGML tensor types (GGUF codes, block sizes) and their dequantization.
//! - `gguf`: GGUF files (one or a split set) read and validated: metadata, tensor table, bytes.
//! - `gguf_checkpoint`: a GGUF file as a convert source (`convert --from model.gguf`), beside
//!   `Checkpoint`; both serve convert through `ConvertSource`.
//! - `synthetic`: random weights in a real model's shapes (`convert --synthetic`), no checkpoint.

use std::path::{Path, PathBuf};

use crate::format::{keys, DType, DenseSpec, ExpertShape, MetaValue, Metadata};

pub mod arch;
mod deepseek;
pub mod dense_plan;
mod dense_tensor;
pub mod dtype;
mod fields;
pub mod ggml;
pub mod gguf;
pub mod gguf_checkpoint;
mod gguf_defaults;
mod gguf_families;
mod gguf_spec;
pub mod gguf_tokenizer;
mod glm4moe;
mod gptoss;
pub mod mxfp4;
mod phimoe;
mod presets;
mod qwen2moe;
pub mod safetensors;
pub mod synthetic;
pub mod tokenizer;

pub use arch::{Architecture, DenseTensor, ExpertSource, MixtralSpec, TensorRole};
pub use dense_plan::{DenseClass, DensePlan};
pub use gguf_checkpoint::GgufCheckpoint;
pub use safetensors::TensorIndex;
pub use tokenizer::TokenizerFiles;

/// Why a checkpoint could not be read. Each variant names the file, field or tensor and what was
/// expected.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{}: {op}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: architecture '{found}' is not supported (supported: {supported})", path.display())]
    UnsupportedArchitecture {
        path: PathBuf,
        found: String,
        supported: String,
    },
    #[error("{}: field '{field}': expected {expected}, found {found}", path.display())]
    Field {
        path: PathBuf,
        field: String,
        expected: String,
        found: String,
    },
    #[error("{}: {what} is not supported: {detail}", path.display())]
    Unsupported {
        path: PathBuf,
        what: String,
        detail: String,
    },
    #[error("{}: no model.safetensors or model.safetensors.index.json", dir.display())]
    NoWeights { dir: PathBuf },
    #[error("{}: not a valid safetensors file: {detail}", path.display())]
    Safetensors { path: PathBuf, detail: String },
    #[error("tensor '{name}' not found (searched {searched})")]
    MissingTensor { name: String, searched: String },
    #[error("tensor '{name}' in {file}: expected shape {expected:?}, found {found:?}")]
    ShapeMismatch {
        name: String,
        file: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error(
        "tensor '{name}' in {file}: dtype {found} is not supported (supported: F32, F16, BF16)"
    )]
    UnsupportedDtype {
        name: String,
        file: String,
        found: String,
    },
    #[error("tensor '{name}' in {file}: {count} non-finite values (first at element {first})")]
    NonFinite {
        name: String,
        file: String,
        count: usize,
        first: usize,
    },
    #[error("{}: {detail}", path.display())]
    Tokenizer { path: PathBuf, detail: String },
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
}

impl ImportError {
    pub(crate) fn io(path: &Path, op: &'static str, source: std::io::Error) -> Self {
        ImportError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    }
}

/// Read a whole text file, naming it on failure.
pub(crate) fn read_text(path: &Path) -> Result<String, ImportError> {
    std::fs::read_to_string(path).map_err(|e| ImportError::io(path, "read", e))
}

/// Read and parse a JSON file, naming it on failure.
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value, ImportError> {
    serde_json::from_str(&read_text(path)?).map_err(|source| ImportError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// The keys a converted file starts with: the architecture, the model's name and its
/// hyper-parameters (`{arch}.*`).
pub(crate) fn model_metadata(arch: &Architecture, name: String) -> Metadata {
    let mut m = Metadata::new();
    m.set(
        keys::ARCHITECTURE,
        MetaValue::String(arch.hob_name().to_string()),
    );
    m.set(keys::NAME, MetaValue::String(name));
    arch.write_metadata(&mut m);
    m
}

/// The tied-embeddings flag and the source's storage dtype.
pub(crate) fn set_tie_and_source(m: &mut Metadata, arch: &Architecture, dtype: DType) {
    m.set(
        keys::TIE_WORD_EMBEDDINGS,
        MetaValue::Bool(arch.tie_word_embeddings()),
    );
    m.set(
        keys::SOURCE_DTYPE,
        MetaValue::String(dtype.name().to_string()),
    );
}

/// The three matrices of one expert as f32, row-major: gate (w1) and up (w3) [ffn, hidden],
/// down (w2) [hidden, ffn].
pub struct ExpertWeights {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
    /// The same matrices as the source stores them where that is MXFP4: the `mxfp4` variant
    /// takes them as they are.
    pub mxfp4: Option<Box<mxfp4::Mxfp4Expert>>,
}

/// What `hob convert` reads weights from: a Hugging Face directory (`Checkpoint`) or a GGUF
/// file (`GgufCheckpoint`).
pub trait ConvertSource: Sync {
    /// Dense tensors in the order convert writes them.
    fn dense_tensors(&self) -> &[DenseTensor];
    fn expert_shape(&self) -> ExpertShape;
    /// The dtype dense matrices are written in unless `--dense` says otherwise.
    fn source_dtype(&self) -> DType;
    /// Whether the file written carries a tokenizer (else `hob run` needs token ids).
    fn has_tokenizer(&self) -> bool;
    /// One dense tensor as f32 (checked finite), in Hugging Face's layout.
    fn load_dense(&self, t: &DenseTensor) -> Result<Vec<f32>, ImportError>;
    /// The gate, up and down matrices of one expert as f32 (checked finite).
    fn load_expert(&self, layer: usize, expert: usize) -> Result<ExpertWeights, ImportError>;
    /// The .hob metadata.
    fn metadata(&self) -> Metadata;
    /// The expert variants stored when `--experts` names none.
    fn default_experts(&self) -> &'static str {
        "f16,int4"
    }
    /// `--dense` when none is given (None: matrices in the source dtype).
    fn default_dense(&self) -> Option<&'static str> {
        None
    }
    /// The dense matrices (hob names) that the default stores in int4/g32 instead of
    /// `default_dense`'s type: a GGUF's matrices in 4-bit blocks.
    fn default_dense_int4(&self) -> Vec<String> {
        Vec::new()
    }

    /// The .hob dense table: matrices as `plan` says (else in the source dtype), norms and
    /// routers in f32.
    fn dense_specs(&self, plan: &DensePlan) -> Vec<DenseSpec> {
        plan.specs(self.dense_tensors(), self.source_dtype())
    }
}

impl ConvertSource for Checkpoint {
    fn dense_tensors(&self) -> &[DenseTensor] {
        Checkpoint::dense_tensors(self)
    }
    fn expert_shape(&self) -> ExpertShape {
        Checkpoint::expert_shape(self)
    }
    fn source_dtype(&self) -> DType {
        self.source_dtype
    }
    fn has_tokenizer(&self) -> bool {
        true
    }
    /// MXFP4 experts (gpt-oss as released) are kept as they are, int2 below them; else f16 +
    /// int4.
    fn default_experts(&self) -> &'static str {
        match self.experts {
            ExpertSource::GptOss { mxfp4: true, .. } => "mxfp4,int2",
            _ => "f16,int4",
        }
    }
    fn load_dense(&self, t: &DenseTensor) -> Result<Vec<f32>, ImportError> {
        Checkpoint::load_dense(self, t)
    }
    fn load_expert(&self, layer: usize, expert: usize) -> Result<ExpertWeights, ImportError> {
        Checkpoint::load_expert(self, layer, expert)
    }
    fn metadata(&self) -> Metadata {
        Checkpoint::metadata(self)
    }
}

/// A checkpoint directory, opened (config parsed, safetensors headers indexed, nothing loaded).
/// Every tensor convert will need has been found with the right shape and a supported dtype.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub arch: Architecture,
    pub tokenizer: TokenizerFiles,
    /// The dtype of the token embedding: the checkpoint's storage type.
    pub source_dtype: DType,
    tensors: TensorIndex,
    dense: Vec<DenseTensor>,
    experts: ExpertSource,
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Checkpoint, ImportError> {
        let meta = std::fs::metadata(dir)
            .map_err(|e| ImportError::io(dir, "open checkpoint directory", e))?;
        if !meta.is_dir() {
            return Err(ImportError::io(
                dir,
                "open checkpoint directory",
                std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    "a file that is not GGUF (no GGUF magic): give a Hugging Face checkpoint \
                     directory or a .gguf file",
                ),
            ));
        }
        let config_path = dir.join("config.json");
        let arch = Architecture::from_config(&config_path, &read_json(&config_path)?)?;
        let tokenizer = TokenizerFiles::open(dir, arch.special_token_ids())?;
        let tensors = TensorIndex::open(dir)?;
        let experts = arch.expert_source(&tensors)?;
        let dense = arch.dense_tensors(&experts);
        for t in &dense {
            tensors.check(&t.hf_name, &t.source_shape())?;
        }
        let source_dtype = tensors.dtype(&dense[0].hf_name)?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            arch,
            tokenizer,
            source_dtype,
            tensors,
            dense,
            experts,
        })
    }

    /// Dense tensors in the order convert writes them.
    pub fn dense_tensors(&self) -> &[DenseTensor] {
        &self.dense
    }

    /// The .hob dense table: matrices as `plan` says (else in the source dtype), norms and
    /// routers in f32.
    pub fn dense_specs(&self, plan: &DensePlan) -> Vec<DenseSpec> {
        plan.specs(&self.dense, self.source_dtype)
    }

    pub fn expert_shape(&self) -> ExpertShape {
        self.arch.expert_shape()
    }

    /// Load one dense tensor as f32 (checked finite).
    pub fn load_dense(&self, t: &DenseTensor) -> Result<Vec<f32>, ImportError> {
        Ok(t.take_lanes(self.tensors.load_f32(&t.hf_name)?))
    }

    /// Load the gate, up and down matrices of one expert as f32 (checked finite).
    /// Expert `expert` of the expert table's layer `layer` (after any dense layers).
    pub fn load_expert(&self, layer: usize, expert: usize) -> Result<ExpertWeights, ImportError> {
        let layer = layer + self.arch.first_moe_layer();
        self.experts.load(&self.tensors, layer, expert)
    }

    /// The .hob metadata: architecture, hyper-parameters, tokenizer and hob's own keys.
    pub fn metadata(&self) -> Metadata {
        let mut m = model_metadata(&self.arch, self.name());
        self.tokenizer.write_metadata(&mut m);
        if matches!(self.arch, Architecture::GptOss(..)) && m.get(keys::CHAT_TEMPLATE).is_none() {
            // gpt-oss's tokenizer ships without a template: its format is harmony.
            let t = crate::generate::harmony::HARMONY_TEMPLATE;
            m.set(keys::CHAT_TEMPLATE, MetaValue::String(t.into()));
        }
        set_tie_and_source(&mut m, &self.arch, self.source_dtype);
        let source = format!(
            "Hugging Face directory {}, safetensors in {}",
            self.name(),
            self.source_dtype.name()
        );
        m.set(keys::SOURCE, MetaValue::String(source));
        m
    }

    /// The model's name: the checkpoint directory's name.
    pub fn name(&self) -> String {
        let dir = self.dir.canonicalize().unwrap_or_else(|_| self.dir.clone());
        dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".to_string())
    }
}
