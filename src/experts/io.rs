//! The slow tier: expert blobs read from the .hob file on disk into host memory, the tier below
//! host RAM (shared/DESIGN.md, "GPU and host memory").
//!
//! Blobs start on 4 KiB boundaries and are padded to 4 KiB (formats/hob.md), so a blob can be read
//! with O_DIRECT straight into page-aligned memory, skipping the page cache: on a Jetson the page
//! cache competes with the model for the same RAM. Three readers, best first:
//! - [`UringReader`]: io_uring + O_DIRECT, a read split into chunks kept in flight together;
//! - [`PreadReader`] with O_DIRECT;
//! - [`PreadReader`] buffered, through the page cache (works on any filesystem).
//!
//! [`open_reader`] takes the best one the kernel and filesystem allow and logs why it fell back.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The alignment O_DIRECT needs of file offset, length and memory address (the page size; also
/// the .hob blob alignment).
pub const DIRECT_ALIGN: usize = 4096;

/// Something expert blobs are read from.
pub trait BlobSource: Send {
    /// Read `dst.len()` bytes at file offset `offset` into `dst`. Errors name the file and offset.
    fn read_into(&mut self, offset: u64, dst: &mut [u8]) -> Result<()>;
    /// Several reads; a reader may keep them in flight together. On error, some of the
    /// destinations may have been written.
    fn read_batch(&mut self, reqs: &mut [(u64, &mut [u8])]) -> Result<()> {
        for (offset, dst) in reqs.iter_mut() {
            self.read_into(*offset, dst)?;
        }
        Ok(())
    }
    /// Which path this is, for the engine to print: "io_uring+O_DIRECT", "pread+O_DIRECT" or
    /// "pread".
    fn reader_kind(&self) -> &'static str;
    /// What offset, length and destination address must be multiples of (1: anything goes).
    fn alignment(&self) -> usize;
}

/// One page, the unit of aligned host memory.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(4096))]
struct Page([u8; DIRECT_ALIGN]);

/// Zeroed host memory whose start is [`DIRECT_ALIGN`]-aligned and whose capacity is a whole number
/// of pages: a destination O_DIRECT can read into. Allocated lazily zeroed (untouched pages cost
/// no RAM until written).
pub struct AlignedBuf {
    pages: Vec<Page>,
    len: usize,
}

impl AlignedBuf {
    /// `len` bytes, rounded up to whole pages underneath. Fails (instead of aborting) when the
    /// memory cannot be had.
    pub fn new(len: usize) -> Result<Self> {
        let pages =
            bytemuck::allocation::try_zeroed_vec(len.div_ceil(DIRECT_ALIGN)).map_err(|()| {
                Error::Invalid(format!(
                    "cannot allocate {len} bytes of aligned host memory"
                ))
            })?;
        Ok(AlignedBuf { pages, len })
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_slice(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.pages)[..self.len]
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.pages)[..self.len]
    }
}

fn read_error(path: &Path, offset: u64, len: usize, e: io::Error) -> Error {
    Error::io(
        path,
        "read",
        io::Error::new(e.kind(), format!("{len} bytes at offset {offset}: {e}")),
    )
}

/// The checks every read makes before touching the file: alignment (for O_DIRECT) and bounds.
fn check_request(path: &Path, file_len: u64, align: usize, offset: u64, dst: &[u8]) -> Result<()> {
    let (len, addr) = (dst.len(), dst.as_ptr() as usize);
    if align > 1 && (!offset.is_multiple_of(align as u64) || len % align != 0 || addr % align != 0)
    {
        return Err(Error::io(
            path,
            "read",
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "O_DIRECT needs offset, length and buffer address aligned to {align} bytes; \
                     got offset {offset}, length {len}, address {addr:#x}"
                ),
            ),
        ));
    }
    match offset.checked_add(len as u64) {
        Some(end) if end <= file_len => Ok(()),
        end => Err(Error::io(
            path,
            "read",
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{len} bytes at offset {offset} (to {}) lie past the end of the file \
                     ({file_len} bytes)",
                    end.map_or("beyond 2^64".to_string(), |e| e.to_string())
                ),
            ),
        )),
    }
}

#[cfg(target_os = "linux")]
const O_DIRECT: i32 = libc::O_DIRECT;
#[cfg(not(target_os = "linux"))]
const O_DIRECT: i32 = 0;

/// Open read-only, with O_DIRECT if asked; returns the file and its length.
fn open_file(path: &Path, direct: bool) -> Result<(File, u64)> {
    let mut opts = OpenOptions::new();
    opts.read(true);
    if direct {
        if cfg!(not(target_os = "linux")) {
            return Err(Error::io(
                path,
                "open with O_DIRECT",
                io::Error::new(io::ErrorKind::Unsupported, "O_DIRECT is Linux only here"),
            ));
        }
        opts.custom_flags(O_DIRECT);
    }
    let op = if direct { "open with O_DIRECT" } else { "open" };
    let file = opts.open(path).map_err(|e| Error::io(path, op, e))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    Ok((file, len))
}

/// Some filesystems accept an O_DIRECT open but refuse the reads: read the first page to know.
fn probe_direct(reader: &mut dyn BlobSource, file_len: u64) -> Result<()> {
    if file_len >= DIRECT_ALIGN as u64 {
        let mut page = AlignedBuf::new(DIRECT_ALIGN)?;
        reader.read_into(0, page.as_mut_slice())?;
    }
    Ok(())
}

/// pread(2), optionally with O_DIRECT: the fallback reader.
pub struct PreadReader {
    file: File,
    path: PathBuf,
    len: u64,
    direct: bool,
}

impl PreadReader {
    /// Open `path`; with `direct`, open with O_DIRECT and check that a read works.
    pub fn open(path: &Path, direct: bool) -> Result<Self> {
        let (file, len) = open_file(path, direct)?;
        let mut r = PreadReader {
            file,
            path: path.to_path_buf(),
            len,
            direct,
        };
        if direct {
            probe_direct(&mut r, len)?;
        }
        Ok(r)
    }
}

impl BlobSource for PreadReader {
    fn read_into(&mut self, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_request(&self.path, self.len, self.alignment(), offset, dst)?;
        let mut done = 0;
        while done < dst.len() {
            let at = offset + done as u64;
            match self.file.read_at(&mut dst[done..], at) {
                Ok(0) => {
                    let e = io::Error::new(io::ErrorKind::UnexpectedEof, "the file ended early");
                    return Err(read_error(&self.path, at, dst.len() - done, e));
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(read_error(&self.path, at, dst.len() - done, e)),
            }
        }
        Ok(())
    }
    fn reader_kind(&self) -> &'static str {
        if self.direct {
            "pread+O_DIRECT"
        } else {
            "pread"
        }
    }
    fn alignment(&self) -> usize {
        if self.direct {
            DIRECT_ALIGN
        } else {
            1
        }
    }
}

/// Settings of [`UringReader`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UringOptions {
    /// Reads kept in flight together (the ring's submission queue size). Default 8.
    pub depth: u32,
    /// A read is split into requests of at most this many bytes (a multiple of 4096). Default
    /// 1 MiB.
    pub chunk_bytes: usize,
}

impl Default for UringOptions {
    fn default() -> Self {
        UringOptions {
            depth: 8,
            chunk_bytes: 1 << 20,
        }
    }
}

#[cfg(target_os = "linux")]
pub use uring::UringReader;

#[cfg(target_os = "linux")]
mod uring {
    use super::*;
    use io_uring::{opcode, types, IoUring};
    use std::os::fd::AsRawFd;

    /// io_uring + O_DIRECT. Offset, length and destination address must be 4 KiB-aligned.
    pub struct UringReader {
        file: File,
        path: PathBuf,
        len: u64,
        ring: IoUring,
        opts: UringOptions,
    }

    /// One request: a part of a destination, and how much of it has arrived.
    struct Piece {
        ptr: *mut u8,
        len: usize,
        offset: u64,
        done: usize,
    }

    impl UringReader {
        pub fn open(path: &Path) -> Result<Self> {
            Self::with_options(path, UringOptions::default())
        }

        /// Open `path` with O_DIRECT, set up a ring of `opts.depth` entries and check (with a
        /// one-page read) that reads through it work.
        pub fn with_options(path: &Path, opts: UringOptions) -> Result<Self> {
            if !(1..=4096).contains(&opts.depth) {
                return Err(Error::Invalid(format!(
                    "io_uring queue depth {} is outside 1..=4096",
                    opts.depth
                )));
            }
            if opts.chunk_bytes == 0
                || !opts.chunk_bytes.is_multiple_of(DIRECT_ALIGN)
                || opts.chunk_bytes > 1 << 30
            {
                return Err(Error::Invalid(format!(
                    "io_uring request size {} is not a multiple of {DIRECT_ALIGN} in \
                     {DIRECT_ALIGN}..=1 GiB",
                    opts.chunk_bytes
                )));
            }
            let (file, len) = open_file(path, true)?;
            let ring =
                IoUring::new(opts.depth).map_err(|e| Error::io(path, "io_uring setup", e))?;
            let mut probe = io_uring::Probe::new();
            ring.submitter()
                .register_probe(&mut probe)
                .map_err(|e| Error::io(path, "io_uring probe", e))?;
            if !probe.is_supported(opcode::Read::CODE) {
                return Err(Error::io(
                    path,
                    "io_uring probe",
                    io::Error::new(
                        io::ErrorKind::Unsupported,
                        "the kernel lacks IORING_OP_READ (Linux 5.6+)",
                    ),
                ));
            }
            let mut r = UringReader {
                file,
                path: path.to_path_buf(),
                len,
                ring,
                opts,
            };
            probe_direct(&mut r, len)?;
            Ok(r)
        }

        pub fn options(&self) -> UringOptions {
            self.opts
        }

        /// Split every request into pieces, keep up to `depth` of them in flight, resubmit the
        /// rest of a short or interrupted read. Returns only once nothing is in flight: the
        /// kernel never writes into a destination after this returns.
        fn run(&mut self, reqs: &mut [(u64, &mut [u8])]) -> Result<()> {
            for (offset, dst) in reqs.iter() {
                check_request(&self.path, self.len, DIRECT_ALIGN, *offset, dst)?;
            }
            let chunk = self.opts.chunk_bytes;
            let mut pieces = Vec::new();
            for (offset, dst) in reqs.iter_mut() {
                for (k, part) in dst.chunks_mut(chunk).enumerate() {
                    pieces.push(Piece {
                        ptr: part.as_mut_ptr(),
                        len: part.len(),
                        offset: *offset + (k * chunk) as u64,
                        done: 0,
                    });
                }
            }
            let fd = types::Fd(self.file.as_raw_fd());
            let depth = self.opts.depth as usize;
            let (mut next, mut in_flight) = (0, 0);
            let mut again: Vec<usize> = Vec::new();
            let mut first_err: Option<Error> = None;
            loop {
                while first_err.is_none() && in_flight < depth {
                    let i = match again.pop() {
                        Some(i) => i,
                        None if next < pieces.len() => {
                            next += 1;
                            next - 1
                        }
                        None => break,
                    };
                    let p = &pieces[i];
                    // At most chunk_bytes <= 1 GiB, so it fits a u32.
                    let left = (p.len - p.done) as u32;
                    let entry = opcode::Read::new(fd, p.ptr.wrapping_add(p.done), left)
                        .offset(p.offset + p.done as u64)
                        .build()
                        .user_data(i as u64);
                    // SAFETY: the entry points at `left` bytes inside `reqs[..].1`, a buffer this
                    // call borrows mutably, so it stays valid and unaliased until we return; and
                    // we return only when `in_flight` is 0, i.e. every submitted read has
                    // completed (the abort below covers the one way that could fail). `fd` is
                    // our open file, alive as long as `self`.
                    let pushed = unsafe { self.ring.submission().push(&entry) };
                    if pushed.is_err() {
                        // Queue full (cannot happen: in_flight < depth = its size); retry later.
                        again.push(i);
                        break;
                    }
                    in_flight += 1;
                }
                if in_flight == 0 {
                    break;
                }
                if let Err(e) = self.ring.submit_and_wait(1) {
                    match e.raw_os_error() {
                        // Interrupted, or completions must be reaped first: reap, then go again.
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY) => {}
                        _ => {
                            // Reads into the caller's buffers are in flight and the ring cannot
                            // tell us when they end. Returning would let the kernel write into
                            // memory the caller may have freed; stopping the process is the only
                            // sound way out. A ring set up by io_uring::new with queue entries
                            // from its own API has no other documented failure here.
                            log::error!(
                                "{}: io_uring_enter failed with {in_flight} reads in flight: \
                                 {e}; aborting",
                                self.path.display()
                            );
                            std::process::abort();
                        }
                    }
                }
                for cqe in self.ring.completion() {
                    in_flight -= 1;
                    let i = cqe.user_data() as usize;
                    let p = &mut pieces[i];
                    let res = cqe.result();
                    let at = p.offset + p.done as u64;
                    if res < 0 {
                        if matches!(-res, libc::EINTR | libc::EAGAIN) {
                            again.push(i);
                        } else {
                            let e = io::Error::from_raw_os_error(-res);
                            first_err.get_or_insert(read_error(&self.path, at, p.len - p.done, e));
                        }
                    } else if res == 0 {
                        let e =
                            io::Error::new(io::ErrorKind::UnexpectedEof, "the file ended early");
                        first_err.get_or_insert(read_error(&self.path, at, p.len - p.done, e));
                    } else {
                        p.done += res as usize;
                        if p.done < p.len {
                            // A short read: ask for the rest.
                            again.push(i);
                        }
                    }
                }
            }
            first_err.map_or(Ok(()), Err)
        }
    }

    impl BlobSource for UringReader {
        fn read_into(&mut self, offset: u64, dst: &mut [u8]) -> Result<()> {
            self.run(&mut [(offset, dst)])
        }
        fn read_batch(&mut self, reqs: &mut [(u64, &mut [u8])]) -> Result<()> {
            self.run(reqs)
        }
        fn reader_kind(&self) -> &'static str {
            "io_uring+O_DIRECT"
        }
        fn alignment(&self) -> usize {
            DIRECT_ALIGN
        }
    }
}

/// Pretend a path is refused, to test the fallbacks on machines that allow everything.
#[derive(Clone, Copy, Default)]
struct Refuse {
    uring: bool,
    direct: bool,
}

/// The best reader for `path`: io_uring + O_DIRECT, else pread + O_DIRECT, else buffered pread;
/// each fallback logs a warning saying why (tmpfs and some network filesystems refuse O_DIRECT
/// with EINVAL; seccomp or `kernel.io_uring_disabled` refuse io_uring with EPERM or ENOSYS).
/// Without `prefer_direct`, buffered pread at once. A file that cannot be opened at all is an
/// error, not a fallback.
pub fn open_reader(path: &Path, prefer_direct: bool) -> Result<Box<dyn BlobSource>> {
    open_reader_with(path, prefer_direct, Refuse::default(), &mut |m| {
        log::warn!("{m}")
    })
}

fn open_reader_with(
    path: &Path,
    prefer_direct: bool,
    refuse: Refuse,
    warn: &mut dyn FnMut(&str),
) -> Result<Box<dyn BlobSource>> {
    File::open(path).map_err(|e| Error::io(path, "open", e))?;
    let refused = |what: &str| {
        Error::io(
            path,
            "open",
            io::Error::new(io::ErrorKind::PermissionDenied, format!("{what} refused")),
        )
    };
    if prefer_direct {
        #[cfg(target_os = "linux")]
        {
            let r = if refuse.uring {
                Err(refused("io_uring"))
            } else {
                UringReader::open(path)
            };
            match r {
                Ok(r) => return Ok(Box::new(r)),
                Err(e) => warn(&format!(
                    "io_uring + O_DIRECT unavailable ({e}); falling back to pread with O_DIRECT"
                )),
            }
        }
        let r = if refuse.direct {
            Err(refused("O_DIRECT"))
        } else {
            PreadReader::open(path, true)
        };
        match r {
            Ok(r) => return Ok(Box::new(r)),
            Err(e) => warn(&format!(
                "O_DIRECT unavailable ({e}); falling back to buffered pread through the page cache"
            )),
        }
    }
    Ok(Box::new(PreadReader::open(path, false)?))
}

#[cfg(test)]
mod tests;
