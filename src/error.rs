//! The one error type of hob. Each module has its own error enum with the context of its
//! failures (file, field, expected vs found); this type wraps them so `main` prints one line.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation on a named file failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A .hob file could not be read, failed validation, or could not be written.
    #[error(transparent)]
    Format(#[from] crate::format::FormatError),
    /// A Hugging Face checkpoint could not be read or converted.
    #[error(transparent)]
    Import(#[from] crate::import::ImportError),
    /// Tokenizer, chat template or sampling problem.
    #[error(transparent)]
    Generate(#[from] crate::generate::GenerateError),
    /// A model in a .hob file cannot be run as described.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// Bad command-line usage or a request that cannot be met (named in the message).
    #[error("{0}")]
    Invalid(String),
    /// A queued expert load was dropped before it started: its prefetch was cancelled, or the
    /// loader shut down. Expected in normal operation; match it with [`Error::is_cancelled`].
    #[error("expert load cancelled: {0}")]
    Cancelled(&'static str),
    /// The expert loader thread is gone (its worker panicked, or it was shut down) and cannot
    /// finish or accept work.
    #[error("expert loader: {0}")]
    Loader(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wrap an io::Error with the file and the operation that failed.
    pub fn io(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            op,
            source: explain_io(source),
        }
    }

    /// True for a load that was cancelled before it started (not a failure).
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Error::Cancelled(_))
    }
}

/// An io::Error whose OS text would puzzle a user, said plainly: EFBIG ("File too large") is a
/// write past the file-size limit (`ulimit -f`, which hob meets as a full disk) or past what
/// the file system holds in one file.
/// `bytes` for a message, in the unit that keeps a small model's sizes from printing as 0.00 GiB.
pub fn size(bytes: usize) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

pub fn explain_io(e: std::io::Error) -> std::io::Error {
    // Also an OS error wrapped with more words (tempfile adds the path).
    let efbig = format!("(os error {})", libc::EFBIG);
    if e.raw_os_error() == Some(libc::EFBIG) || e.to_string().contains(&efbig) {
        return std::io::Error::new(
            e.kind(),
            "file too large: over the file-size limit (`ulimit -f`) or the file system's \
             largest file (EFBIG)",
        );
    }
    e
}
