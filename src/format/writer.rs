//! Writing a .hob file: plan the whole layout first (every size is known from the shapes),
//! then stream tensors and expert blobs into a temporary file, then write tables and header and
//! rename.
//!
//! A writer's temporary file is listed in a process-wide registry while it exists, so that a
//! signal handler can remove it ([`remove_temp_files_then`]); files left by processes that were
//! killed outright are found by name ([`remove_stale_temp_files`]).
//!
//! The layout is a pure function of (metadata, dense specs, expert shape, variants), and nothing
//! time- or process-dependent is written, so the same inputs give byte-identical files.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use super::header::{self, HEADER_SIZE, VERSION};
use super::reader::{expert_name, Header, EXPERT_RECORD, EXPERT_TABLE_HEADER, VARIANT_DESCRIPTOR};
use super::{align_up, ExpertLayout, FormatError, Metadata, TensorType, Variant, BLOB_ALIGN};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenseSpec {
    pub name: String,
    pub dtype: TensorType,
    /// [n] or [rows, cols].
    pub shape: Vec<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertShape {
    pub n_layers: usize,
    pub n_experts: usize,
    pub hidden: usize,
    pub ffn: usize,
}

/// Where one payload goes and what was written there.
#[derive(Clone, Debug)]
struct Slot {
    offset: u64,
    size: u64,
    crc32c: u32,
    written: bool,
}

pub struct HobWriter {
    out: PathBuf,
    tmp: PathBuf,
    file: File,
    header: Header,
    metadata: Vec<u8>,
    dense: Vec<DenseSpec>,
    shape: ExpertShape,
    variants: Vec<Variant>,
    dense_slots: Vec<Slot>,
    /// Index `(layer * n_experts + expert) * n_variants + variant`.
    expert_slots: Vec<Slot>,
    /// Set once the file has been renamed onto `out`; until then Drop removes `tmp`.
    done: bool,
}

fn invalid(msg: String) -> FormatError {
    FormatError::Request(msg)
}

fn too_large(what: &str) -> FormatError {
    invalid(format!("{what}: the .hob file would be too large"))
}

/// Bytes of a dense tensor, after checking the spec.
fn dense_size(d: &DenseSpec) -> Result<u64, FormatError> {
    let what = format!("dense tensor '{}'", d.name);
    if d.name.is_empty() {
        return Err(invalid("dense tensor with an empty name".to_string()));
    }
    if !(1..=2).contains(&d.shape.len()) || d.shape.contains(&0) {
        return Err(invalid(format!(
            "{what}: shape {:?} must have 1 or 2 non-zero dims",
            d.shape
        )));
    }
    d.dtype
        .size(&d.shape)
        .map(|n| n as u64)
        .map_err(|e| invalid(format!("{what}: {e}")))
}

impl HobWriter {
    /// Plan the layout and create `<out>.tmp-<pid>` beside `out`, preallocated to the final size
    /// (so a full disk is reported up front).
    pub fn create(
        out: &Path,
        metadata: &Metadata,
        dense: &[DenseSpec],
        experts: ExpertShape,
        variants: &[Variant],
    ) -> Result<HobWriter, FormatError> {
        metadata
            .check()
            .map_err(|e| invalid(format!("metadata: {e}")))?;
        let metadata = metadata.encode();

        let mut names = HashSet::new();
        let mut tensor_table_len = 0u64;
        let mut dense_sizes = Vec::with_capacity(dense.len());
        for d in dense {
            dense_sizes.push(dense_size(d)?);
            if !names.insert(d.name.as_str()) {
                return Err(invalid(format!("dense tensor '{}' given twice", d.name)));
            }
            // name (8 + len), dtype, ndim, dims, offset, size, crc
            tensor_table_len +=
                8 + d.name.len() as u64 + 4 + 4 + 8 * d.shape.len() as u64 + 8 + 8 + 4;
        }

        let layouts = plan_experts(experts, variants)?;
        let cells = experts.n_layers * experts.n_experts;
        let n_records = cells * variants.len();
        let experts_len = (n_records as u64)
            .checked_mul(EXPERT_RECORD)
            .and_then(|r| {
                r.checked_add(EXPERT_TABLE_HEADER + VARIANT_DESCRIPTOR * variants.len() as u64)
            })
            .ok_or_else(|| too_large("expert table"))?;

        let metadata_offset = HEADER_SIZE as u64;
        let tensors_offset = metadata_offset + metadata.len() as u64;
        let experts_offset = tensors_offset + tensor_table_len;
        let data_offset = align_up((experts_offset + experts_len) as usize, BLOB_ALIGN)
            .ok_or_else(|| too_large("tables"))? as u64;

        // Data: dense tensors in table order, then blobs in record order, each 4 KiB-aligned.
        let mut pos = data_offset;
        let mut place = |size: u64| -> Result<Slot, FormatError> {
            let padded = align_up(size as usize, BLOB_ALIGN).ok_or_else(|| too_large("data"))?;
            let slot = Slot {
                offset: pos,
                size,
                crc32c: 0,
                written: false,
            };
            pos = pos
                .checked_add(padded as u64)
                .ok_or_else(|| too_large("data"))?;
            Ok(slot)
        };
        let dense_slots = dense_sizes
            .iter()
            .map(|&s| place(s))
            .collect::<Result<Vec<_>, _>>()?;
        let mut expert_slots = Vec::with_capacity(n_records);
        for _ in 0..cells {
            for l in &layouts {
                expert_slots.push(place(l.size as u64)?);
            }
        }
        let file_size = pos;

        let header = Header {
            version: VERSION,
            file_size,
            metadata_offset,
            metadata_len: metadata.len() as u64,
            tensors_offset,
            tensors_len: tensor_table_len,
            tensor_count: dense.len() as u64,
            experts_offset,
            experts_len,
            data_offset,
            data_len: file_size - data_offset,
            metadata_crc32c: crc32c::crc32c(&metadata),
            tensors_crc32c: 0,
            experts_crc32c: 0,
        };

        let tmp = temp_path(out);
        let file = {
            // Created and listed under the lock, so a signal handler removes every file it finds.
            let mut live = live_temp_files();
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)
                .map_err(|e| FormatError::io(&tmp, "create", e))?;
            live.push(tmp.clone());
            file
        };
        let writer = HobWriter {
            out: out.to_path_buf(),
            tmp,
            file,
            header,
            metadata,
            dense: dense.to_vec(),
            shape: experts,
            variants: variants.to_vec(),
            dense_slots,
            expert_slots,
            done: false,
        };
        // From here on, an error drops `writer`, which removes the temporary file.
        writer.preallocate(file_size)?;
        Ok(writer)
    }

    /// Reserve the whole file now, so a full disk fails before hours of conversion. Untouched
    /// bytes read as zeros, which is what every padding region must hold.
    fn preallocate(&self, size: u64) -> Result<(), FormatError> {
        let len = libc::off_t::try_from(size).map_err(|_| too_large("file"))?;
        // SAFETY: posix_fallocate only reads its integer arguments; the descriptor is owned by
        // self.file and stays open for the duration of the call.
        let rc = unsafe { libc::posix_fallocate(self.file.as_raw_fd(), 0, len) };
        match rc {
            0 => Ok(()),
            libc::ENOSPC => Err(FormatError::io(
                &self.tmp,
                "preallocate",
                io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!("disk full: the .hob file needs {size} bytes"),
                ),
            )),
            // File systems without fallocate (some network and FUSE mounts).
            libc::EINVAL | libc::EOPNOTSUPP => self
                .file
                .set_len(size)
                .map_err(|e| FormatError::io(&self.tmp, "set length", e)),
            errno => Err(FormatError::io(
                &self.tmp,
                "preallocate",
                io::Error::from_raw_os_error(errno),
            )),
        }
    }

    /// Write dense tensor `index` (order of `dense`); `bytes.len()` must equal its size.
    pub fn write_dense(&mut self, index: usize, bytes: &[u8]) -> Result<(), FormatError> {
        let Some(name) = self
            .dense
            .get(index)
            .map(|d| format!("tensor '{}'", d.name))
        else {
            return Err(invalid(format!(
                "dense tensor index {index} out of range ({} tensors)",
                self.dense.len()
            )));
        };
        let slot = &mut self.dense_slots[index];
        write_slot(&self.file, &self.tmp, slot, &name, bytes)
    }

    /// Write one expert blob; `bytes.len()` must equal the variant's `ExpertLayout::size`.
    pub fn write_expert(
        &mut self,
        layer: usize,
        expert: usize,
        variant: usize,
        bytes: &[u8],
    ) -> Result<(), FormatError> {
        let s = self.shape;
        if layer >= s.n_layers || expert >= s.n_experts || variant >= self.variants.len() {
            return Err(invalid(format!(
                "expert (layer {layer}, expert {expert}, variant #{variant}) out of range \
                 ({} layers, {} experts, {} variants)",
                s.n_layers,
                s.n_experts,
                self.variants.len()
            )));
        }
        let name = expert_name(layer, expert, &self.variants[variant]);
        let i = (layer * s.n_experts + expert) * self.variants.len() + variant;
        write_slot(
            &self.file,
            &self.tmp,
            &mut self.expert_slots[i],
            &name,
            bytes,
        )
    }

    /// Check everything was written, write the tables and the header, fsync, rename to `out`.
    pub fn finish(mut self) -> Result<(), FormatError> {
        if let Some(i) = self.dense_slots.iter().position(|s| !s.written) {
            return Err(invalid(format!(
                "{}: tensor '{}' was never written",
                self.out.display(),
                self.dense[i].name
            )));
        }
        if let Some(i) = self.expert_slots.iter().position(|s| !s.written) {
            let nv = self.variants.len();
            let (le, v) = (i / nv, i % nv);
            return Err(invalid(format!(
                "{}: {} was never written",
                self.out.display(),
                expert_name(
                    le / self.shape.n_experts,
                    le % self.shape.n_experts,
                    &self.variants[v]
                )
            )));
        }
        let tensors = self.tensor_table();
        let experts = self.expert_table();
        self.header.tensors_crc32c = crc32c::crc32c(&tensors);
        self.header.experts_crc32c = crc32c::crc32c(&experts);
        let h = &self.header;
        let pieces: [(&[u8], u64); 4] = [
            (&self.metadata, h.metadata_offset),
            (&tensors, h.tensors_offset),
            (&experts, h.experts_offset),
            (&header::encode(h), 0),
        ];
        for (bytes, offset) in pieces {
            self.file
                .write_all_at(bytes, offset)
                .map_err(|e| FormatError::io(&self.tmp, "write", e))?;
        }
        self.file
            .sync_all()
            .map_err(|e| FormatError::io(&self.tmp, "fsync", e))?;
        {
            // Under the lock: a signal handler sees either the temporary file or the finished one.
            let mut live = live_temp_files();
            std::fs::rename(&self.tmp, &self.out)
                .map_err(|e| FormatError::io(&self.out, "rename", e))?;
            live.retain(|p| p != &self.tmp);
            self.done = true;
        }
        // The rename is durable only once the directory entry is.
        let dir = match self.out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| FormatError::io(dir, "fsync directory", e))
    }

    fn tensor_table(&self) -> Vec<u8> {
        let mut t = Vec::with_capacity(self.header.tensors_len as usize);
        for (d, s) in self.dense.iter().zip(&self.dense_slots) {
            t.extend_from_slice(&(d.name.len() as u64).to_le_bytes());
            t.extend_from_slice(d.name.as_bytes());
            t.extend_from_slice(&d.dtype.code().to_le_bytes());
            t.extend_from_slice(&(d.shape.len() as u32).to_le_bytes());
            for &n in &d.shape {
                t.extend_from_slice(&(n as u64).to_le_bytes());
            }
            t.extend_from_slice(&s.offset.to_le_bytes());
            t.extend_from_slice(&s.size.to_le_bytes());
            t.extend_from_slice(&s.crc32c.to_le_bytes());
        }
        t
    }

    fn expert_table(&self) -> Vec<u8> {
        let s = self.shape;
        let mut t = Vec::with_capacity(self.header.experts_len as usize);
        // plan_experts checked that every count fits in u32.
        for n in [
            s.n_layers,
            s.n_experts,
            s.hidden,
            s.ffn,
            self.variants.len(),
            0,
        ] {
            t.extend_from_slice(&(n as u32).to_le_bytes());
        }
        for v in &self.variants {
            for n in [v.kind.code(), v.group_size, 0, 0] {
                t.extend_from_slice(&n.to_le_bytes());
            }
        }
        for slot in &self.expert_slots {
            t.extend_from_slice(&slot.offset.to_le_bytes());
            t.extend_from_slice(&slot.size.to_le_bytes());
            t.extend_from_slice(&slot.crc32c.to_le_bytes());
            t.extend_from_slice(&0u32.to_le_bytes());
        }
        t
    }
}

/// Check the expert shape and variants against the rules a reader applies; the layouts, one
/// per variant.
fn plan_experts(s: ExpertShape, variants: &[Variant]) -> Result<Vec<ExpertLayout>, FormatError> {
    for (what, n) in [
        ("n_layers", s.n_layers),
        ("n_experts", s.n_experts),
        ("hidden", s.hidden),
        ("ffn", s.ffn),
        ("variant count", variants.len()),
    ] {
        if u32::try_from(n).is_err() {
            return Err(invalid(format!("expert {what} {n} does not fit in a u32")));
        }
    }
    let cells = s
        .n_layers
        .checked_mul(s.n_experts)
        .and_then(|c| c.checked_mul(variants.len().max(1)))
        .ok_or_else(|| too_large("expert table"))?;
    if cells > 0 && variants.is_empty() {
        return Err(invalid(format!(
            "{} layers x {} experts need at least one variant",
            s.n_layers, s.n_experts
        )));
    }
    if !variants.is_empty() && (s.hidden == 0 || s.ffn == 0) {
        return Err(invalid(format!(
            "expert dims hidden {}, ffn {} must be non-zero",
            s.hidden, s.ffn
        )));
    }
    let mut layouts = Vec::with_capacity(variants.len());
    for (i, v) in variants.iter().enumerate() {
        v.check()
            .map_err(|e| invalid(format!("variant {v}: {e}")))?;
        if variants[..i].contains(v) {
            return Err(invalid(format!("variant {v} given twice")));
        }
        layouts.push(
            v.expert_layout(s.hidden, s.ffn)
                .map_err(|e| invalid(format!("variant {v}: {e}")))?,
        );
    }
    Ok(layouts)
}

fn write_slot(
    file: &File,
    tmp: &Path,
    slot: &mut Slot,
    name: &str,
    bytes: &[u8],
) -> Result<(), FormatError> {
    if slot.written {
        return Err(invalid(format!("{name} written twice")));
    }
    if bytes.len() as u64 != slot.size {
        return Err(invalid(format!(
            "{name}: expected {} bytes, got {}",
            slot.size,
            bytes.len()
        )));
    }
    file.write_all_at(bytes, slot.offset)
        .map_err(|e| FormatError::io(tmp, "write", e))?;
    slot.crc32c = crc32c::crc32c(bytes);
    slot.written = true;
    Ok(())
}

/// `<out>.tmp-<pid>` in the same directory, so the final rename never crosses file systems.
fn temp_path(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(format!(".tmp-{}", std::process::id()));
    PathBuf::from(name)
}

/// The temporary files of this process's writers that exist now.
static LIVE_TEMP_FILES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn live_temp_files() -> MutexGuard<'static, Vec<PathBuf>> {
    // The list stays consistent even if a holder panicked: every update is one push or retain.
    LIVE_TEMP_FILES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// For a signal handler: remove the temporary file of every writer still open, then call `then`
/// with their paths while holding the registry, so no writer creates or renames a file meanwhile
/// (`then` is expected to exit the process). A writer's later writes go to the removed inode.
pub fn remove_temp_files_then<R>(then: impl FnOnce(&[PathBuf]) -> R) -> R {
    let mut live = live_temp_files();
    let removed: Vec<PathBuf> = live
        .drain(..)
        .filter(|p| std::fs::remove_file(p).is_ok())
        .collect();
    then(&removed)
}

/// Remove the temporary files `<out>.tmp-<pid>` left beside `out` by processes that no longer
/// exist (killed with SIGKILL, or a crash); returns `(path, pid)` of each one removed. Files of
/// live processes, this one included, are left alone.
pub fn remove_stale_temp_files(out: &Path) -> Result<Vec<(PathBuf, i32)>, FormatError> {
    let Some(name) = out.file_name() else {
        return Ok(Vec::new());
    };
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let prefix = [name.as_bytes(), b".tmp-"].concat();
    let entries = std::fs::read_dir(dir).map_err(|e| FormatError::io(dir, "list directory", e))?;
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| FormatError::io(dir, "list directory", e))?;
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .as_bytes()
            .strip_prefix(prefix.as_slice())
            .and_then(parse_pid)
        else {
            continue;
        };
        let path = entry.path();
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if !is_file || pid as u32 == std::process::id() || !process_is_gone(pid) {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push((path, pid)),
            // Another process cleaned it up first.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(FormatError::io(&path, "remove stale temporary file", e)),
        }
    }
    removed.sort();
    Ok(removed)
}

/// A process id written by `temp_path`: decimal digits only, positive.
fn parse_pid(digits: &[u8]) -> Option<i32> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits)
        .ok()?
        .parse::<i32>()
        .ok()
        .filter(|&p| p > 0)
}

/// Whether no process `pid` exists (EPERM means one does, owned by someone else).
fn process_is_gone(pid: i32) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only checks whether `pid` exists. It takes
    // integers and touches no memory of this process.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == -1 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

impl Drop for HobWriter {
    fn drop(&mut self) {
        if !self.done {
            let mut live = live_temp_files();
            // Nothing half-written is left behind; a failure here leaves only a .tmp file, which
            // never has the output's name (and the next convert removes it).
            let _ = std::fs::remove_file(&self.tmp);
            live.retain(|p| p != &self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_file_pids_parse_strictly() {
        assert_eq!(parse_pid(b"4242"), Some(4242));
        for bad in [&b""[..], b"0", b"-3", b"12a", b"+5", b"99999999999"] {
            assert_eq!(parse_pid(bad), None, "{:?}", std::str::from_utf8(bad));
        }
    }

    #[test]
    fn this_process_is_not_gone() {
        assert!(!process_is_gone(std::process::id() as i32));
    }
}
