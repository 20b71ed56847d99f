//! What the fuzz targets share: a scratch directory for the readers that open paths, and the
//! splitting of one input into parts.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A directory private to this process, removed at exit (libFuzzer ends with `exit()`, which runs
/// no Rust destructors, so an `atexit` hook removes it; a crash leaves it behind).
pub fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    extern "C" fn remove() {
        if let Some(dir) = DIR.get() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    DIR.get_or_init(|| {
        let dir = match tempfile::Builder::new().prefix("hob-fuzz-").tempdir() {
            Ok(d) => d.keep(),
            Err(e) => panic!("fuzz harness: cannot make a scratch directory: {e}"),
        };
        // SAFETY: `remove` is an `extern "C" fn()` that does not unwind (errors are ignored).
        unsafe { libc::atexit(remove) };
        dir
    })
}

/// Write `bytes` to `name` in the scratch directory and return its path.
pub fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = scratch_dir().join(name);
    if let Err(e) = std::fs::write(&path, bytes) {
        panic!("fuzz harness: cannot write {}: {e}", path.display());
    }
    path
}

/// Remove `name` from the scratch directory if it is there.
pub fn scratch_remove(name: &str) {
    let _ = std::fs::remove_file(scratch_dir().join(name));
}

/// The input's parts between NUL bytes (seeds join their files with a NUL; no text file of a
/// model holds one).
pub fn parts(data: &[u8]) -> Vec<&[u8]> {
    data.split(|&b| b == 0).collect()
}

/// Split `text` into pieces of the lengths `sizes` says (each 1..=16 bytes, cut back to a char
/// boundary), the way a streamed answer arrives token by token.
pub fn pieces<'a>(text: &'a str, sizes: &[u8]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = text;
    let mut i = 0;
    while !rest.is_empty() {
        let want = sizes
            .get(i % sizes.len().max(1))
            .map_or(3, |&s| 1 + (s as usize % 16));
        let mut cut = want.min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        out.push(&rest[..cut]);
        rest = &rest[cut..];
        i += 1;
    }
    out
}
