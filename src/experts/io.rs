//! The slow tier: expert blobs read from the .hob file on disk into host memory, and the host-RAM
//! expert cache between the SSD and the GPU (shared/DESIGN.md, "GPU and host memory").
//!
//! Blobs start on 4 KiB boundaries and are padded to 4 KiB (formats/hob.md), so a blob can be read
//! with O_DIRECT straight into page-aligned memory, skipping the page cache: on a Jetson the page
//! cache competes with the model for the same RAM. Three readers, best first:
//! - [`UringReader`]: io_uring + O_DIRECT, a read split into chunks kept in flight together;
//! - [`PreadReader`] with O_DIRECT;
//! - [`PreadReader`] buffered, through the page cache (works on any filesystem).
//!
//! [`open_reader`] takes the best one the kernel and filesystem allow and logs why it fell back.

use std::collections::{BTreeMap, HashMap};
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

/// A cached blob: (layer, expert, variant index).
pub type BlobKey = (usize, usize, usize);

/// Host-RAM expert cache between the SSD and the GPU: fixed-size slots carved from one aligned
/// allocation, keyed by (layer, expert, variant), least recently used evicted first. Every slot
/// starts on a 4 KiB boundary and is a whole number of pages, so an O_DIRECT read can land in it
/// directly (and the allocation can be pinned for uploads as one region).
pub struct HostCache {
    buf: AlignedBuf,
    slot_bytes: usize,
    /// Per slot: its key and last-use tick, or None when free.
    slots: Vec<Option<(BlobKey, u64)>>,
    index: HashMap<BlobKey, usize>,
    /// Tick of last use -> slot; the first entry is the least recently used.
    recency: BTreeMap<u64, usize>,
    free: Vec<usize>,
    tick: u64,
    hits: u64,
    misses: u64,
}

impl HostCache {
    /// As many slots of `entry_bytes` (rounded up to whole pages) as fit in `budget_bytes`. The
    /// memory is taken at once (lazily zeroed). Errs if not one slot fits.
    pub fn new(budget_bytes: usize, entry_bytes: usize) -> Result<Self> {
        let slot_bytes = entry_bytes
            .checked_next_multiple_of(DIRECT_ALIGN)
            .filter(|&s| s > 0)
            .ok_or_else(|| {
                Error::Invalid(format!("host cache entry size {entry_bytes} is unusable"))
            })?;
        let n = budget_bytes / slot_bytes;
        if n == 0 {
            return Err(Error::Invalid(format!(
                "host cache budget {budget_bytes} bytes holds no {slot_bytes}-byte entry"
            )));
        }
        Ok(HostCache {
            buf: AlignedBuf::new(n * slot_bytes)?,
            slot_bytes,
            slots: vec![None; n],
            index: HashMap::with_capacity(n),
            recency: BTreeMap::new(),
            free: (0..n).rev().collect(),
            tick: 0,
            hits: 0,
            misses: 0,
        })
    }

    /// Bytes per slot (a multiple of 4096): what `get` and `fill` hand out.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }
    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
    /// Number of cached blobs.
    pub fn len(&self) -> usize {
        self.index.len()
    }
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
    /// The memory held, never more than the budget.
    pub fn allocated_bytes(&self) -> usize {
        self.buf.len()
    }
    pub fn hits(&self) -> u64 {
        self.hits
    }
    pub fn misses(&self) -> u64 {
        self.misses
    }
    /// Present, without counting a hit or refreshing its recency.
    pub fn contains(&self, key: BlobKey) -> bool {
        self.index.contains_key(&key)
    }
    /// Cached keys, least recently used first.
    pub fn keys_by_recency(&self) -> Vec<BlobKey> {
        self.recency
            .values()
            .filter_map(|&s| self.slots[s].map(|(k, _)| k))
            .collect()
    }

    fn slot(&self, s: usize) -> &[u8] {
        &self.buf.as_slice()[s * self.slot_bytes..(s + 1) * self.slot_bytes]
    }

    fn touch(&mut self, s: usize, key: BlobKey) {
        if let Some((_, t)) = self.slots[s] {
            self.recency.remove(&t);
        }
        self.tick += 1;
        self.slots[s] = Some((key, self.tick));
        self.recency.insert(self.tick, s);
    }

    /// Empty slot `s`.
    fn clear(&mut self, s: usize) {
        if let Some((k, t)) = self.slots[s].take() {
            self.recency.remove(&t);
            self.index.remove(&k);
        }
    }

    /// The cached slot of `key` (counts a hit and makes it most recent), or None (a miss).
    pub fn get(&mut self, key: BlobKey) -> Option<&[u8]> {
        match self.index.get(&key) {
            Some(&s) => {
                self.hits += 1;
                self.touch(s, key);
                Some(self.slot(s))
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Store `key`: `with` writes the whole slot (`slot_bytes`, page-aligned, e.g. an O_DIRECT
    /// read of the padded blob). Takes a free slot, else evicts the least recently used; an
    /// existing entry of `key` is overwritten in place. If `with` fails, `key` is not cached
    /// (and the evicted entry stays evicted). Counts neither a hit nor a miss.
    pub fn fill(
        &mut self,
        key: BlobKey,
        with: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<&[u8]> {
        let s = match self.index.get(&key) {
            Some(&s) => s,
            None => match self.free.pop() {
                Some(s) => s,
                None => match self.recency.first_key_value() {
                    Some((_, &s)) => s,
                    // Unreachable: no free slot means every slot is in `recency`, and new()
                    // made at least one.
                    None => {
                        return Err(Error::Invalid("host cache has no slots".into()));
                    }
                },
            },
        };
        self.clear(s);
        let range = s * self.slot_bytes..(s + 1) * self.slot_bytes;
        match with(&mut self.buf.as_mut_slice()[range]) {
            Ok(()) => {
                self.index.insert(key, s);
                self.touch(s, key);
                Ok(self.slot(s))
            }
            Err(e) => {
                self.free.push(s);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Mutex, OnceLock};

    const FILE_LEN: usize = 3 * (1 << 20) + 5 * DIRECT_ALIGN;

    fn byte_at(i: usize) -> u8 {
        ((i as u64).wrapping_mul(2_654_435_761) >> 11) as u8
    }

    /// Directories to test in: the system temp dir (may be tmpfs) and one under the checkout's
    /// target/ (a real filesystem as a rule); the checkout is the current directory when it is
    /// one (cargo's, or the device's after tools/stage_gpu.sh), else the one built from.
    fn test_dirs() -> Vec<PathBuf> {
        let is_checkout = |dir: &Path| {
            std::fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|toml| toml.lines().any(|l| l.trim() == r#"name = "hob""#))
        };
        let root = std::env::current_dir()
            .ok()
            .filter(|dir| is_checkout(dir))
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
        let target = root.join("target/io-test-tmp");
        let mut dirs = vec![std::env::temp_dir()];
        if std::fs::create_dir_all(&target).is_ok() {
            dirs.push(target);
        }
        dirs
    }

    fn known_file(dir: &Path) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new_in(dir).unwrap();
        let bytes: Vec<u8> = (0..FILE_LEN).map(byte_at).collect();
        f.write_all(&bytes).unwrap();
        f.flush().unwrap();
        f
    }

    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// Random aligned (offset, len) inside the file.
    fn aligned_range(rng: &mut Rng) -> (u64, usize) {
        let pages = (FILE_LEN / DIRECT_ALIGN) as u64;
        let first = rng.below(pages);
        let n = 1 + rng.below((pages - first).min(600));
        (first * DIRECT_ALIGN as u64, n as usize * DIRECT_ALIGN)
    }

    fn assert_bytes(got: &[u8], offset: u64, what: &str) {
        for (k, &b) in got.iter().enumerate() {
            let i = offset as usize + k;
            assert_eq!(b, byte_at(i), "{what}: byte {i}");
        }
    }

    /// Every reader this machine allows on `path`, with the reason for each one it refused.
    fn readers(path: &Path) -> (Vec<Box<dyn BlobSource>>, Vec<String>) {
        let mut ok: Vec<Box<dyn BlobSource>> = Vec::new();
        let mut refused = Vec::new();
        let mut keep = |r: Result<Box<dyn BlobSource>>, what: &str| match r {
            Ok(r) => ok.push(r),
            Err(e) => refused.push(format!("{what}: {e}")),
        };
        #[cfg(target_os = "linux")]
        {
            keep(
                UringReader::open(path).map(|r| Box::new(r) as _),
                "io_uring default",
            );
            let small = UringOptions {
                depth: 4,
                chunk_bytes: 2 * DIRECT_ALIGN,
            };
            keep(
                UringReader::with_options(path, small).map(|r| Box::new(r) as _),
                "io_uring depth 4, 8 KiB requests",
            );
        }
        keep(
            PreadReader::open(path, true).map(|r| Box::new(r) as _),
            "pread O_DIRECT",
        );
        keep(
            PreadReader::open(path, false).map(|r| Box::new(r) as _),
            "pread",
        );
        keep(open_reader(path, true), "open_reader(direct)");
        keep(open_reader(path, false), "open_reader(buffered)");
        (ok, refused)
    }

    #[test]
    fn every_reader_returns_the_file_bytes() {
        for dir in test_dirs() {
            let f = known_file(&dir);
            let (rs, refused) = readers(f.path());
            eprintln!(
                "{}: readers {:?}; refused {refused:?}",
                dir.display(),
                rs.iter().map(|r| r.reader_kind()).collect::<Vec<_>>()
            );
            // Buffered pread works everywhere, and open_reader always gives a reader.
            assert!(rs.len() >= 3, "{refused:?}");
            for refusal in &refused {
                // Only the direct paths may be refused, and only by the kernel or filesystem.
                assert!(
                    refusal.contains("O_DIRECT") || refusal.contains("io_uring"),
                    "{refusal}"
                );
            }
            for mut r in rs {
                let kind = r.reader_kind();
                let mut rng = Rng(0x2545_f491_4f6c_dd1d);
                for _ in 0..25 {
                    let (offset, len) = aligned_range(&mut rng);
                    let mut buf = AlignedBuf::new(len).unwrap();
                    r.read_into(offset, buf.as_mut_slice()).unwrap();
                    assert_bytes(buf.as_slice(), offset, kind);
                }
                // A batch of several ranges, kept in flight together by io_uring.
                let ranges: Vec<_> = (0..6).map(|_| aligned_range(&mut rng)).collect();
                let mut bufs: Vec<_> = ranges
                    .iter()
                    .map(|&(_, len)| AlignedBuf::new(len).unwrap())
                    .collect();
                let mut reqs: Vec<(u64, &mut [u8])> = ranges
                    .iter()
                    .zip(bufs.iter_mut())
                    .map(|(&(o, _), b)| (o, b.as_mut_slice()))
                    .collect();
                r.read_batch(&mut reqs).unwrap();
                for ((o, _), b) in ranges.iter().zip(&bufs) {
                    assert_bytes(b.as_slice(), *o, kind);
                }
                // The whole file in one read.
                let mut all = AlignedBuf::new(FILE_LEN).unwrap();
                r.read_into(0, all.as_mut_slice()).unwrap();
                assert_bytes(all.as_slice(), 0, kind);
            }
        }
    }

    #[test]
    fn misaligned_direct_reads_are_refused_with_a_clear_error() {
        for dir in test_dirs() {
            let f = known_file(&dir);
            let (rs, _) = readers(f.path());
            for mut r in rs {
                let kind = r.reader_kind();
                let mut buf = AlignedBuf::new(4 * DIRECT_ALIGN).unwrap();
                let cases: [(u64, std::ops::Range<usize>); 3] = [
                    (100, 0..DIRECT_ALIGN),
                    (4096, 0..1000),
                    (8192, 512..512 + DIRECT_ALIGN),
                ];
                for (offset, range) in cases {
                    let dst = &mut buf.as_mut_slice()[range.clone()];
                    let res = r.read_into(offset, dst);
                    if r.alignment() == 1 {
                        res.unwrap();
                        assert_bytes(&buf.as_slice()[range], offset, kind);
                        continue;
                    }
                    let e = res.unwrap_err().to_string();
                    assert!(
                        e.contains("aligned to 4096")
                            && e.contains(&format!("offset {offset}"))
                            && e.contains(&f.path().display().to_string()),
                        "{kind}: {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn reads_past_the_end_name_the_offset() {
        let dir = &test_dirs()[0];
        let f = known_file(dir);
        let (rs, _) = readers(f.path());
        for mut r in rs {
            let offset = (FILE_LEN - DIRECT_ALIGN) as u64;
            let mut buf = AlignedBuf::new(2 * DIRECT_ALIGN).unwrap();
            let e = r.read_into(offset, buf.as_mut_slice()).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("offset {offset}")) && msg.contains("past the end"),
                "{}: {msg}",
                r.reader_kind()
            );
            let mut one = AlignedBuf::new(DIRECT_ALIGN).unwrap();
            assert!(r.read_into(FILE_LEN as u64, one.as_mut_slice()).is_err());
            assert!(r.read_into(u64::MAX - 4095, one.as_mut_slice()).is_err());
            // The reader still works afterwards.
            r.read_into(offset, one.as_mut_slice()).unwrap();
            assert_bytes(one.as_slice(), offset, r.reader_kind());
        }
    }

    #[test]
    fn fallbacks_are_taken_in_order_and_say_why() {
        let dir = test_dirs().pop().unwrap();
        let f = known_file(&dir);
        let mut warnings = Vec::new();
        let mut warn = |m: &str| warnings.push(m.to_string());
        let direct_ok = PreadReader::open(f.path(), true).is_ok();

        let r = open_reader_with(
            f.path(),
            true,
            Refuse {
                uring: true,
                direct: false,
            },
            &mut warn,
        )
        .unwrap();
        if direct_ok {
            assert_eq!(r.reader_kind(), "pread+O_DIRECT");
        }
        let r = open_reader_with(
            f.path(),
            true,
            Refuse {
                uring: true,
                direct: true,
            },
            &mut warn,
        )
        .unwrap();
        assert_eq!(r.reader_kind(), "pread");
        assert_eq!(r.alignment(), 1);
        let w = warnings.clone();
        assert!(w.len() >= 3, "{w:?}");
        assert!(
            w[0].contains("io_uring") && w[0].contains("refused"),
            "{w:?}"
        );
        let last = &w[w.len() - 1];
        assert!(
            last.contains("O_DIRECT refused") && last.contains("buffered pread"),
            "{w:?}"
        );
        assert!(w
            .iter()
            .all(|m| m.contains(&f.path().display().to_string())));

        // No direct I/O asked: buffered at once, nothing to warn about.
        warnings.clear();
        let r = open_reader_with(f.path(), false, Refuse::default(), &mut |m: &str| {
            warnings.push(m.to_string())
        })
        .unwrap();
        assert_eq!(r.reader_kind(), "pread");
        assert!(warnings.is_empty());
        // A missing file is an error, not a fallback.
        let e = open_reader(&dir.join("no-such-file.hob"), true)
            .err()
            .unwrap();
        assert!(e.to_string().contains("no-such-file.hob"), "{e}");
    }

    /// Captures log lines for the test below.
    struct Capture(Mutex<Vec<String>>);
    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata) -> bool {
            true
        }
        fn log(&self, record: &log::Record) {
            if let Ok(mut v) = self.0.lock() {
                v.push(format!("{} {}", record.level(), record.args()));
            }
        }
        fn flush(&self) {}
    }

    fn capture() -> Option<&'static Capture> {
        static CAPTURE: OnceLock<Option<&'static Capture>> = OnceLock::new();
        *CAPTURE.get_or_init(|| {
            let c: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
            log::set_logger(c).ok()?;
            log::set_max_level(log::LevelFilter::Warn);
            Some(c)
        })
    }

    /// tmpfs: older kernels refuse O_DIRECT there (EINVAL), Linux 6.6+ accepts it. Either way
    /// open_reader gives a working reader, and a fallback is logged.
    #[test]
    fn tmpfs_gets_a_working_reader_and_any_fallback_is_logged() {
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            eprintln!("skipped: no /dev/shm");
            return;
        }
        let Some(logs) = capture() else {
            eprintln!("skipped: another logger is installed");
            return;
        };
        let f = known_file(shm);
        let direct_ok = PreadReader::open(f.path(), true).is_ok();
        let mut r = open_reader(f.path(), true).unwrap();
        let name = f.path().display().to_string();
        let mine: Vec<String> = logs
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(&name))
            .cloned()
            .collect();
        eprintln!(
            "tmpfs: O_DIRECT accepted: {direct_ok}; reader {}; log {mine:?}",
            r.reader_kind()
        );
        if direct_ok {
            assert_ne!(r.reader_kind(), "pread");
        } else {
            assert_eq!(r.reader_kind(), "pread");
            assert!(
                mine.iter()
                    .any(|l| l.starts_with("WARN") && l.contains("falling back to buffered")),
                "{mine:?}"
            );
        }
        if r.reader_kind() != "io_uring+O_DIRECT" {
            assert!(mine.iter().any(|l| l.contains("io_uring")), "{mine:?}");
        }
        let mut buf = AlignedBuf::new(64 * DIRECT_ALIGN).unwrap();
        r.read_into(8 * DIRECT_ALIGN as u64, buf.as_mut_slice())
            .unwrap();
        assert_bytes(buf.as_slice(), 8 * DIRECT_ALIGN as u64, r.reader_kind());
    }

    #[test]
    fn aligned_buffers_are_page_aligned() {
        for len in [0, 1, 4095, 4096, 4097, 3 << 20] {
            let mut b = AlignedBuf::new(len).unwrap();
            assert_eq!(b.len(), len);
            assert_eq!(b.as_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice().fill(7);
            assert!(b.as_slice().iter().all(|&x| x == 7));
        }
    }

    fn fill_with(v: u8) -> impl FnOnce(&mut [u8]) -> Result<()> {
        move |s: &mut [u8]| {
            s.fill(v);
            Ok(())
        }
    }

    #[test]
    fn host_cache_evicts_least_recently_used() {
        // 3 slots of 2 pages; the budget's spare bytes are not used.
        let mut c = HostCache::new(3 * 8192 + 5000, 6000).unwrap();
        assert_eq!((c.capacity(), c.slot_bytes()), (3, 8192));
        assert_eq!(c.allocated_bytes(), 3 * 8192);
        let (a, b, d, e) = ((0, 0, 0), (0, 1, 0), (1, 0, 1), (1, 1, 0));
        assert!(c.get(a).is_none());
        c.fill(a, fill_with(1)).unwrap();
        c.fill(b, fill_with(2)).unwrap();
        c.fill(d, fill_with(3)).unwrap();
        assert_eq!(c.keys_by_recency(), vec![a, b, d]);
        assert!(c.get(a).unwrap().iter().all(|&x| x == 1));
        assert_eq!(c.keys_by_recency(), vec![b, d, a]);
        // Full: e evicts b, the least recently used.
        let got = c.fill(e, fill_with(4)).unwrap();
        assert_eq!(got.len(), 8192);
        assert!(got.iter().all(|&x| x == 4));
        assert_eq!(c.keys_by_recency(), vec![d, a, e]);
        assert!(!c.contains(b) && c.get(b).is_none());
        // Slots keep their own bytes.
        assert!(c.get(d).unwrap().iter().all(|&x| x == 3));
        assert!(c.get(a).unwrap().iter().all(|&x| x == 1));
        assert_eq!((c.hits(), c.misses()), (3, 2));
        assert_eq!(c.keys_by_recency(), vec![e, d, a]);
        // Refilling a cached key overwrites it in place and makes it recent.
        c.fill(e, fill_with(9)).unwrap();
        assert_eq!(c.keys_by_recency(), vec![d, a, e]);
        assert!(c.get(e).unwrap().iter().all(|&x| x == 9));
        assert_eq!(c.len(), 3);
        // A failed fill evicts the victim and caches nothing.
        let err = c
            .fill(b, |_| Err(Error::Invalid("injected".into())))
            .unwrap_err();
        assert!(err.to_string().contains("injected"));
        assert!(!c.contains(b) && !c.contains(d));
        assert_eq!(c.keys_by_recency(), vec![a, e]);
        // ... and the freed slot is used next, without evicting.
        c.fill(b, fill_with(5)).unwrap();
        assert_eq!(c.keys_by_recency(), vec![a, e, b]);
    }

    #[test]
    fn host_cache_never_exceeds_its_budget_and_slots_are_aligned() {
        let budget = 10 * DIRECT_ALIGN * 3 + 123;
        let mut c = HostCache::new(budget, 3 * DIRECT_ALIGN - 7).unwrap();
        assert!(c.allocated_bytes() <= budget);
        assert_eq!(c.capacity(), 10);
        let mut rng = Rng(77);
        let mut model: Vec<BlobKey> = Vec::new(); // LRU order, oldest first
        for step in 0..2000 {
            let key = (rng.below(4) as usize, rng.below(8) as usize, 0);
            if rng.below(2) == 0 {
                let hit = c.get(key).map(|s| (s.as_ptr() as usize, s[0]));
                assert_eq!(hit.is_some(), model.contains(&key), "step {step}");
                if let Some((addr, first)) = hit {
                    assert_eq!(addr % DIRECT_ALIGN, 0);
                    assert_eq!(first, (key.0 * 8 + key.1) as u8);
                    model.retain(|&k| k != key);
                    model.push(key);
                }
            } else {
                let v = (key.0 * 8 + key.1) as u8;
                let s = c.fill(key, fill_with(v)).unwrap();
                assert_eq!(s.as_ptr() as usize % DIRECT_ALIGN, 0);
                model.retain(|&k| k != key);
                if model.len() == 10 {
                    model.remove(0);
                }
                model.push(key);
            }
            assert_eq!(c.keys_by_recency(), model, "step {step}");
            assert!(c.len() * c.slot_bytes() <= budget);
        }
        assert!(c.hits() > 0 && c.misses() > 0);
        assert!(HostCache::new(4095, 4096).is_err());
        assert!(HostCache::new(1 << 20, 0).is_err());
    }

    #[test]
    fn host_cache_slots_take_direct_reads() {
        let dir = test_dirs().pop().unwrap();
        let f = known_file(&dir);
        let mut r = open_reader(f.path(), true).unwrap();
        let mut c = HostCache::new(4 << 20, 256 << 10).unwrap();
        for k in 0..20usize {
            let offset = (k * 37 % 12) as u64 * (256 << 10);
            let key = (k % 12, 0, 0);
            let s = c.fill(key, |slot| r.read_into(offset, slot)).unwrap();
            assert_bytes(s, offset, r.reader_kind());
        }
    }
}
