//! Opening a model file: only a regular file is opened (and mapped); a directory, a FIFO (whose
//! open would wait for a writer) or a device is refused by name, saying what was expected.

use std::fs::File;
use std::path::Path;

use super::FormatError;

/// The first bytes of a GGUF file.
pub(crate) const GGUF_MAGIC: &[u8] = b"GGUF";

/// What `path` is when it is not a regular file ("a directory", "a FIFO", ...).
fn file_kind(meta: &std::fs::Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        return None;
    }
    if t.is_dir() {
        return Some("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return Some("a FIFO");
        }
        if t.is_char_device() {
            return Some("a character device");
        }
        if t.is_block_device() {
            return Some("a block device");
        }
        if t.is_socket() {
            return Some("a socket");
        }
    }
    Some("not a regular file")
}

/// Open `path` for reading when it is a regular file. A FIFO is opened without blocking (so
/// that a FIFO is refused, not waited on), and the type is checked on the open file.
pub(crate) fn open_regular(path: &Path) -> Result<File, FormatError> {
    open_regular_with(
        path,
        |kind| FormatError::NotHob {
            path: path.to_path_buf(),
            what: format!("{kind}: expected a .hob file"),
        },
        |op, e| FormatError::io(path, op, e),
    )
}

/// `open_regular` for any reader's errors: `refuse` names what `path` is instead ("a
/// directory", "a FIFO", ...), `io` wraps a failed open or stat (the operation and the error).
pub(crate) fn open_regular_with<E>(
    path: &Path,
    refuse: impl Fn(&'static str) -> E,
    io: impl Fn(&'static str, std::io::Error) -> E,
) -> Result<File, E> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = match options.open(path) {
        Ok(f) => f,
        // A directory cannot be opened on some systems: say what it is.
        Err(e) => {
            return Err(
                match std::fs::metadata(path).ok().as_ref().and_then(file_kind) {
                    Some(kind) => refuse(kind),
                    None => io("open", e),
                },
            )
        }
    };
    let meta = file.metadata().map_err(|e| io("stat", e))?;
    match file_kind(&meta) {
        Some(kind) => Err(refuse(kind)),
        None => Ok(file),
    }
}
