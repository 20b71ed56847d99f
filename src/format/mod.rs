//! The .hob file: byte-exact spec in formats/hob.md. Pure: no compute, no threads, no CUDA.
//!
//! - `variant`: dense dtypes, expert variants and the byte layout of a stored matrix.
//! - `keys`: the metadata keys hob writes and reads.
//! - `gguf`: the metadata section, in GGUF's key/value encoding.
//! - `reader`: mmap + full validation (`HobFile::open`), zero-copy views.
//! - `writer`: streaming, atomic writer (`HobWriter`).

pub mod gguf;
pub mod keys;
pub mod reader;
pub mod variant;
pub mod writer;

pub use gguf::{MetaValue, Metadata};
pub use reader::{ExpertRecord, ExpertView, Header, HobFile, MatrixView, TensorInfo, TensorView};
pub use variant::{align_up, DType, ExpertLayout, MatrixLayout, Variant, VariantKind, BLOB_ALIGN};
pub use writer::{DenseSpec, ExpertShape, HobWriter};

/// Why a .hob file was rejected. Each variant names the field or record and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("not a .hob file: bad magic {found:02x?}")]
    BadMagic { found: Vec<u8> },
    #[error("unsupported .hob version {found} (this build reads version {supported})")]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error("truncated: {what} needs bytes {start}..{end} but the file has {file_size}")]
    Truncated {
        what: String,
        start: u64,
        end: u64,
        file_size: u64,
    },
    #[error("{what}: {detail}")]
    Invalid { what: String, detail: String },
    #[error("{what} at offset {offset} is not aligned to {align} bytes")]
    Misaligned { what: String, offset: u64, align: u64 },
    #[error("{a} overlaps {b}")]
    Overlap { a: String, b: String },
    #[error("checksum mismatch in {what}: stored {stored:08x}, computed {computed:08x}")]
    Checksum {
        what: String,
        stored: u32,
        computed: u32,
    },
    #[error("unknown expert variant code {code} in {what} (known: f16, bf16, int8, int4, int2); written by a newer hob?")]
    UnknownVariant { code: u32, what: String },
    #[error("metadata key '{key}': {detail}")]
    Metadata { key: String, detail: String },
}
