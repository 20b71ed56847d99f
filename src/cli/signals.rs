//! Process-wide signal dispositions for faults that would otherwise kill hob without a word.
//!
//! - SIGBUS: hob maps its model files. If one is truncated or rewritten in place while mapped,
//!   the next read of a lost page raises SIGBUS, whose default action kills the process with no
//!   message. [`guard_mapped`] names the file a handler then reports before exiting with status 1,
//!   like any other error. Nothing can be resumed: the weights the read wanted are gone. A file
//!   replaced by renaming a new one over its name is safe (the mapping keeps the old inode); one
//!   rewritten in place with the same length shows its new bytes, which the checksums catch only
//!   on a first read (formats/hob.md).
//! - SIGXFSZ: a write past the file-size limit (`ulimit -f`) raises it and kills the process by
//!   default; ignored, the write fails with EFBIG instead and the error path (which names the
//!   file, and removes a half-written .hob) runs as for a full disk.

use std::path::Path;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Once;

/// The message the SIGBUS handler writes: a leaked buffer, never freed (the handler may be
/// reading an older one while a newer one is stored).
static MESSAGE: AtomicPtr<Box<[u8]>> = AtomicPtr::new(std::ptr::null_mut());
static INSTALL: Once = Once::new();

/// Ignore SIGXFSZ, so that a write over the file-size limit is an error hob reports.
pub fn ignore_file_size_signal() {
    // SAFETY: setting a signal's disposition to SIG_IGN runs no code of ours in a handler.
    let previous = unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    if previous == libc::SIG_ERR {
        log::warn!(
            "cannot ignore SIGXFSZ: a write past `ulimit -f` will stop hob without a message"
        );
    }
}

/// From now on a SIGBUS is reported as `path` changing under hob (the file hob maps last).
pub fn guard_mapped(path: &Path) {
    let text = format!(
        "error: {} changed on disk while hob had it mapped (truncated or rewritten in place): \
         reading its weights failed (SIGBUS). To replace a model file in use, write the new file \
         elsewhere and rename it over the old name.\n",
        path.display()
    );
    let message = Box::into_raw(Box::new(text.into_bytes().into_boxed_slice()));
    // The previous message is leaked on purpose (see MESSAGE).
    MESSAGE.store(message, Ordering::SeqCst);
    INSTALL.call_once(|| {
        // SAFETY: `on_sigbus` is async-signal-safe: it loads an atomic pointer to a buffer that
        // is never freed, and calls write(2) and _exit(2).
        if let Err(e) = unsafe { signal_hook::low_level::register(libc::SIGBUS, on_sigbus) } {
            log::warn!("cannot install the SIGBUS handler: {e}");
        }
    });
}

fn on_sigbus() {
    let message = MESSAGE.load(Ordering::SeqCst);
    if !message.is_null() {
        // SAFETY: a non-null MESSAGE points to a leaked, never freed, never mutated buffer.
        let bytes: &[u8] = unsafe { &*message };
        // SAFETY: write(2) on stderr from a valid buffer of `bytes.len()` bytes. Its result is
        // ignored: there is nothing left to do if stderr is gone.
        let _ = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
    }
    // SAFETY: _exit(2) is async-signal-safe; returning would re-run the faulting read.
    unsafe { libc::_exit(1) }
}
