//! The .hob file: byte-exact spec in formats/hob.md. Pure: no compute, no threads, no CUDA.
//!
//! - `variant`: dense dtypes, expert variants and the byte layout of a stored matrix.
//! - `keys`: the metadata keys hob writes and reads.
//! - `gguf`: the metadata section, in GGUF's key/value encoding.
//! - `reader`: mmap + full validation (`HobFile::open`), zero-copy views.
//! - `checked`: the data section's checksums, each checked on first read.
//! - `open`: a model file is a regular file (a directory, a FIFO, a device refused by name).
//! - `writer`: streaming, atomic writer (`HobWriter`).

pub mod ap8;
mod checked;
mod cursor;
pub mod gguf;
mod header;
pub mod keys;
mod open;
pub mod reader;
mod tensor_type;
pub mod variant;
pub mod writer;

pub use checked::{crc32c_pieces, crc_parallel, BlobChecks};
pub use gguf::{MetaValue, Metadata};
pub(crate) use open::open_regular_with;
pub use reader::{ExpertRecord, ExpertView, Header, HobFile, MatrixView, TensorInfo, TensorView};
pub use tensor_type::TensorType;
pub use variant::{
    align_up, int3_hi_bit, DType, ExpertLayout, MatrixLayout, Variant, VariantKind, BLOB_ALIGN,
    INT3_BLOCK,
};
pub use writer::{DenseSpec, ExpertShape, HobWriter};

/// Why a .hob file was rejected. Each variant names the field or record and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("not a .hob file (magic \"{}\", expected \"HOBFILE\\0\")", found.escape_ascii())]
    BadMagic { found: Vec<u8> },
    /// The path names something other than a .hob file: a directory, a FIFO, a device, a GGUF
    /// file (`what` says which, and what was expected).
    #[error("{} is {what}", path.display())]
    NotHob {
        path: std::path::PathBuf,
        what: String,
    },
    #[error("unsupported .hob version {found} (this build reads version {supported})")]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error("truncated: {what} needs bytes {start}..{end} but the file has {file_size}")]
    Truncated {
        what: String,
        start: u64,
        end: u64,
        file_size: u64,
    },
    /// A field, or a count or length read from the file, needs more bytes than its section has
    /// left (`offset` is relative to the section start).
    #[error(
        "{section}: {what} needs {needed} bytes at offset {offset} but only {available} are left"
    )]
    Overrun {
        section: &'static str,
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error("{what}: {detail}")]
    Invalid { what: String, detail: String },
    #[error("{what} at offset {offset} is not aligned to {align} bytes")]
    Misaligned {
        what: String,
        offset: u64,
        align: u64,
    },
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
    /// An I/O operation on a named file failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A file failed validation (the inner error names the field).
    #[error("{}: {source}", path.display())]
    File {
        path: std::path::PathBuf,
        #[source]
        source: Box<FormatError>,
    },
    /// The writer was asked for something it cannot write (named in the message).
    #[error("{0}")]
    Request(String),
}

impl FormatError {
    /// Wrap an io::Error with the file and the operation that failed.
    pub fn io(
        path: impl Into<std::path::PathBuf>,
        op: &'static str,
        source: std::io::Error,
    ) -> Self {
        FormatError::Io {
            path: path.into(),
            op,
            source: crate::error::explain_io(source),
        }
    }

    /// This error, found in `path`.
    pub fn in_file(self, path: impl Into<std::path::PathBuf>) -> Self {
        FormatError::File {
            path: path.into(),
            source: Box::new(self),
        }
    }
}
