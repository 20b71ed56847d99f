//! GGUF files (llama.cpp's model format) in: the header, the key/value metadata, the tensor
//! infos and each tensor's bytes, over mmapped files, for `convert --from model.gguf`.
//!
//! A split set (`NAME-00001-of-0000N.gguf`, as llama.cpp's gguf-split and gguf-py write it) is
//! opened from its first shard: the siblings are found by that pattern, their `split.*` keys
//! checked where present, and their tensor tables merged into one.
//!
//! Everything is validated at open, so a hostile or truncated file is an error naming the file
//! and the key or tensor, never a panic: magic and version (2 or 3), every count bounded by the
//! bytes left (no count allocates more than the bytes could describe), every string length,
//! n_dims <= 4, every dimension >= 1, the element count (<= i64::MAX), a known GGML type code,
//! ne[0] a whole number of the type's blocks, `general.alignment` a power of two, each offset
//! aligned, each tensor's data inside its file, no two tensors overlapping, no name twice.
//!
//! - `parse`: one file's bytes -> its validated header, metadata and tensor table.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::ggml::{self, GgmlError, GgmlType};
use crate::format::{FormatError, Metadata};

mod parse;

pub use parse::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};

/// The split keys llama.cpp's gguf-split writes in every shard.
pub const SPLIT_NO_KEY: &str = "split.no";
pub const SPLIT_COUNT_KEY: &str = "split.count";
pub const SPLIT_TENSORS_COUNT_KEY: &str = "split.tensors.count";

/// Why a GGUF file was rejected. Every message starts with the file and names the field, key or
/// tensor, and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{}: {op}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is {kind}: expected a GGUF file", path.display())]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error("{}: not a GGUF file (magic \"{}\", expected \"GGUF\")", path.display(), found.escape_ascii())]
    BadMagic { path: PathBuf, found: Vec<u8> },
    #[error("{}: GGUF version {found} is not supported (hob reads versions 2 and 3){hint}", path.display())]
    Version {
        path: PathBuf,
        found: u32,
        hint: &'static str,
    },
    /// A field needs bytes past the end of the file (`what` names it: "header: tensor count",
    /// "tensor info #3: name", "tensor blk.0.ffn_up.weight: offset").
    #[error("{}: {what} needs bytes {start}..{end} but the file has {file_size}", path.display())]
    Truncated {
        path: PathBuf,
        what: String,
        start: u64,
        end: u128,
        file_size: u64,
    },
    /// A count from the header whose entries could not fit in the bytes left.
    #[error(
        "{}: header: {what} {count} needs at least {needed} bytes from offset {offset}, but the file has only {available} left",
        path.display()
    )]
    Count {
        path: PathBuf,
        what: &'static str,
        count: u64,
        needed: u128,
        offset: u64,
        available: u64,
    },
    #[error("{}: {what}: {detail}", path.display())]
    Invalid {
        path: PathBuf,
        what: String,
        detail: String,
    },
    /// The key/value section did not decode (the inner error names the key or entry).
    #[error("{}: {source}", path.display())]
    Metadata {
        path: PathBuf,
        #[source]
        source: FormatError,
    },
    #[error("{}: metadata key '{key}': {detail}", path.display())]
    Key {
        path: PathBuf,
        key: String,
        detail: String,
    },
    #[error("{}: tensor {name}: {detail}", path.display())]
    Tensor {
        path: PathBuf,
        name: String,
        detail: String,
    },
    #[error(
        "{}: tensor {name}: data at {start}..{end} runs past the end of the file ({file_size} bytes)",
        path.display()
    )]
    PastEnd {
        path: PathBuf,
        name: String,
        start: u128,
        end: u128,
        file_size: u64,
    },
    #[error(
        "{}: tensor {b}: data at {}..{} overlaps tensor {a} at {}..{}",
        path.display(), b_range.0, b_range.1, a_range.0, a_range.1
    )]
    Overlap {
        path: PathBuf,
        a: String,
        a_range: (u64, u64),
        b: String,
        b_range: (u64, u64),
    },
    /// Two tensor infos with one name: in one file (`first == second`) or in two shards.
    #[error("{}", duplicate_message(.name, .first, .second))]
    DuplicateTensor {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("{}: split set: {detail}", path.display())]
    Split { path: PathBuf, detail: String },
    #[error("{}: tensor {name}: {source}", path.display())]
    Dequantize {
        path: PathBuf,
        name: String,
        #[source]
        source: GgmlError,
    },
}

fn duplicate_message(name: &str, first: &Path, second: &Path) -> String {
    if first == second {
        format!("{}: tensor {name} is listed twice", first.display())
    } else {
        format!(
            "{}: tensor {name} is also in {}",
            second.display(),
            first.display()
        )
    }
}

impl GgufError {
    fn io(path: &Path, op: &'static str, source: std::io::Error) -> Self {
        GgufError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    }
}

/// One tensor's record from its shard's tensor info (validated at open).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// GGML's `ne`, `dims[0]` varying fastest: a row-major `[rows, cols]` matrix is
    /// `[cols, rows]`. At most 4 entries, each at least 1; none for a scalar.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// The shard holding the data: 0 for the file opened, i for its `-{i+1:05}-of-` sibling.
    pub shard: usize,
    /// Where the data starts, from its shard's data section (as stored).
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
    /// Where the data starts in its shard's file.
    start: usize,
}

impl GgufTensorInfo {
    /// Values in the tensor (the product of `dims`).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |n, &d| n.saturating_mul(d))
    }
    /// Where the data starts and ends in its shard's file.
    pub fn file_range(&self) -> std::ops::Range<u64> {
        self.start as u64..self.end() as u64
    }
    fn end(&self) -> usize {
        self.start.saturating_add(self.n_bytes as usize)
    }
}

/// A file's bytes: mapped, or (for [`GgufFile::from_bytes`]) owned.
enum Data {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl Data {
    fn bytes(&self) -> &[u8] {
        match self {
            Data::Map(m) => m,
            Data::Owned(v) => v,
        }
    }
}

struct Shard {
    path: PathBuf,
    data: Data,
    version: u32,
    metadata: Metadata,
    alignment: u64,
    data_start: u64,
}

/// A GGUF model: one file or a split set, validated, with its tensors by name. Nothing is
/// copied: tensor bytes are views of the mapped files.
pub struct GgufFile {
    /// The file opened (shard 0).
    first: Shard,
    /// A split set's other shards, in order.
    rest: Vec<Shard>,
    tensors: Vec<GgufTensorInfo>,
    by_name: HashMap<String, usize>,
}

/// One tensor of a [`GgufFile`]: its record and its bytes.
#[derive(Clone, Copy)]
pub struct GgufTensor<'a> {
    info: &'a GgufTensorInfo,
    bytes: &'a [u8],
    path: &'a Path,
}

impl GgufFile {
    /// Open, mmap and validate a GGUF file; when its name is `NAME-00001-of-0000N.gguf`, open
    /// and validate its N - 1 siblings too and merge their tensor tables. Errors name the file
    /// and the key or tensor.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let (first, table) = open_shard(path, 0)?;
        let mut rest = Vec::new();
        let mut tables = vec![table];
        let Some((no, count)) = split_name(path) else {
            check_single(&first)?;
            return GgufFile::build(first, rest, tables);
        };
        let split_error = |detail: String| GgufError::Split {
            path: path.to_path_buf(),
            detail,
        };
        if no == 0 || no > count {
            return Err(split_error(format!(
                "the file name says shard {no} of {count}"
            )));
        }
        if no != 1 {
            let first = sibling(path, 1, count).unwrap_or_default();
            return Err(split_error(format!(
                "this is shard {no} of {count}: open the first shard, {}",
                first.display()
            )));
        }
        check_split_keys(&first, 0, count)?;
        for i in 1..count {
            let next = sibling(path, i + 1, count)
                .ok_or_else(|| split_error(format!("no name for shard {}", i + 1)))?;
            let (shard, table) = open_shard(&next, i as usize)?;
            check_split_keys(&shard, i, count)?;
            rest.push(shard);
            tables.push(table);
        }
        GgufFile::build(first, rest, tables)
    }

    /// Validate one GGUF file already in memory (`path` names it in messages; no siblings are
    /// looked for, and `split.count` must be absent or 1).
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let (shard, table) = shard_from(path.into(), Data::Owned(bytes), 0)?;
        check_single(&shard)?;
        GgufFile::build(shard, Vec::new(), vec![table])
    }

    /// Merge the shards' tables: no tensor name twice; `split.tensors.count` where present.
    fn build(
        first: Shard,
        rest: Vec<Shard>,
        tables: Vec<Vec<GgufTensorInfo>>,
    ) -> Result<GgufFile, GgufError> {
        let mut file = GgufFile {
            first,
            rest,
            tensors: Vec::new(),
            by_name: HashMap::new(),
        };
        let shard_path = |file: &GgufFile, i| file.shard(i).map(|s| s.path.clone());
        for t in tables.into_iter().flatten() {
            if let Some(&i) = file.by_name.get(&t.name) {
                let earlier = file.tensors.get(i).map_or(0, |e| e.shard);
                return Err(GgufError::DuplicateTensor {
                    first: shard_path(&file, earlier).unwrap_or_default(),
                    second: shard_path(&file, t.shard).unwrap_or_default(),
                    name: t.name,
                });
            }
            file.by_name.insert(t.name.clone(), file.tensors.len());
            file.tensors.push(t);
        }
        if let Some(n) = split_key(&file.first, SPLIT_TENSORS_COUNT_KEY)? {
            if n as usize != file.tensors.len() {
                return Err(GgufError::Key {
                    path: file.first.path.clone(),
                    key: SPLIT_TENSORS_COUNT_KEY.to_string(),
                    detail: format!(
                        "is {n}, but the {} shard(s) hold {} tensors",
                        1 + file.rest.len(),
                        file.tensors.len()
                    ),
                });
            }
        }
        Ok(file)
    }

    /// Shard `i` (0 = the file opened).
    fn shard(&self, i: usize) -> Option<&Shard> {
        match i {
            0 => Some(&self.first),
            _ => self.rest.get(i - 1),
        }
    }

    /// The file opened (the first shard of a split set).
    pub fn path(&self) -> &Path {
        &self.first.path
    }
    /// Every shard's path, in order (one for a single file).
    pub fn shard_paths(&self) -> Vec<&Path> {
        std::iter::once(&self.first)
            .chain(&self.rest)
            .map(|s| s.path.as_path())
            .collect()
    }
    /// The GGUF version of the file opened (2 or 3).
    pub fn version(&self) -> u32 {
        self.first.version
    }
    /// The data section alignment of the file opened (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.first.alignment
    }
    /// Where the data section starts in the file opened.
    pub fn data_start(&self) -> u64 {
        self.first.data_start
    }
    /// The metadata of the file opened (llama.cpp keeps a split set's metadata in shard 1).
    pub fn metadata(&self) -> &Metadata {
        &self.first.metadata
    }
    /// Every tensor, shard by shard, each in its file's order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }
    /// The tensor named `name`, with its bytes.
    pub fn tensor(&self, name: &str) -> Option<GgufTensor<'_>> {
        let info = self.tensors.get(*self.by_name.get(name)?)?;
        let shard = self.shard(info.shard)?;
        let bytes = shard.data.bytes().get(info.start..info.end())?;
        Some(GgufTensor {
            info,
            bytes,
            path: &shard.path,
        })
    }
}

impl<'a> GgufTensor<'a> {
    pub fn info(&self) -> &'a GgufTensorInfo {
        self.info
    }
    pub fn name(&self) -> &'a str {
        &self.info.name
    }
    /// GGML's `ne` (`dims[0]` varies fastest).
    pub fn dims(&self) -> &'a [u64] {
        &self.info.dims
    }
    pub fn ggml_type(&self) -> GgmlType {
        self.info.ggml_type
    }
    /// The file holding the data.
    pub fn path(&self) -> &'a Path {
        self.path
    }
    /// The data, exactly `info().n_bytes` bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Every value as f32, in file order (`dims[0]` fastest), decoded row by row with
    /// [`ggml::dequantize_row`]. An error names the tensor when its type is not one hob
    /// dequantizes (see [`ggml::SUPPORTED`]).
    pub fn dequantize_f32(&self) -> Result<Vec<f32>, GgufError> {
        let ty = self.info.ggml_type;
        let fail = |source| GgufError::Dequantize {
            path: self.path.to_path_buf(),
            name: self.info.name.clone(),
            source,
        };
        if !ty.is_supported() {
            return Err(fail(GgmlError::Unsupported { ty }));
        }
        let too_large = || GgufError::Tensor {
            path: self.path.to_path_buf(),
            name: self.info.name.clone(),
            detail: format!("ne {:?} is too large for this platform", self.info.dims),
        };
        let row_len = usize::try_from(self.info.dims.first().copied().unwrap_or(1))
            .map_err(|_| too_large())?;
        let n = usize::try_from(self.info.n_elements()).map_err(|_| too_large())?;
        let row_bytes = ty.row_bytes(row_len).map_err(fail)?;
        let rows = n / row_len.max(1);
        if row_bytes == 0 || rows.checked_mul(row_bytes) != Some(self.bytes.len()) {
            return Err(fail(GgmlError::RowBytes {
                ty,
                n_values: n,
                expected: rows.saturating_mul(row_bytes),
                found: self.bytes.len(),
            }));
        }
        let mut out = vec![0f32; n];
        for (src, dst) in self
            .bytes
            .chunks_exact(row_bytes)
            .zip(out.chunks_exact_mut(row_len))
        {
            ggml::dequantize_row(ty, src, dst).map_err(fail)?;
        }
        Ok(out)
    }
}

/// Open, map and parse one shard.
fn open_shard(path: &Path, index: usize) -> Result<(Shard, Vec<GgufTensorInfo>), GgufError> {
    let file = open_regular(path)?;
    let len = file
        .metadata()
        .map_err(|e| GgufError::io(path, "stat", e))?
        .len();
    if len == 0 {
        // Nothing to map (mapping 0 bytes fails on some systems): "not a GGUF file".
        return shard_from(path.to_path_buf(), Data::Owned(Vec::new()), index);
    }
    // SAFETY: the map is read-only and private to this process, but its pages follow the file:
    // if another process truncates the file while it is mapped, reading the lost pages raises
    // SIGBUS, and writes by others show through. hob never writes GGUF files, and like every
    // reader of mmapped checkpoints it relies on no one truncating or rewriting its input during
    // a conversion (that would fault or change the values read through this read-only view).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| GgufError::io(path, "mmap", e))?;
    shard_from(path.to_path_buf(), Data::Map(map), index)
}

fn shard_from(
    path: PathBuf,
    data: Data,
    index: usize,
) -> Result<(Shard, Vec<GgufTensorInfo>), GgufError> {
    let parsed = parse::parse(&path, data.bytes(), index)?;
    let shard = Shard {
        path,
        data,
        version: parsed.version,
        metadata: parsed.metadata,
        alignment: parsed.alignment,
        data_start: parsed.data_start,
    };
    Ok((shard, parsed.tensors))
}

/// Open `path` for reading when it is a regular file: a directory, a FIFO (whose open would
/// wait for a writer) or a device is refused by name (format::open's rule).
fn open_regular(path: &Path) -> Result<File, GgufError> {
    crate::format::open_regular_with(
        path,
        |kind| GgufError::NotAFile {
            path: path.to_path_buf(),
            kind,
        },
        |op, e| GgufError::io(path, op, e),
    )
}

/// `(no, count)` when the file name is `PREFIX-NNNNN-of-MMMMM.gguf` (five digits each, as
/// llama.cpp's `llama_split_path` writes them).
fn split_name(path: &Path) -> Option<(u32, u32)> {
    let stem = path.file_name()?.to_str()?.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (_, no) = rest.rsplit_once('-')?;
    let five = |s: &str| {
        (s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u32>().ok())
            .flatten()
    };
    Some((five(no)?, five(count)?))
}

/// The path of shard `no` of `count` beside `path` (a split name).
fn sibling(path: &Path, no: u32, count: u32) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    // "-NNNNN-of-MMMMM.gguf" is 20 bytes, all ASCII.
    let prefix = name.get(..name.len().checked_sub(20)?)?;
    Some(path.with_file_name(format!("{prefix}-{no:05}-of-{count:05}.gguf")))
}

/// An unsigned split key of `shard`, None when absent.
fn split_key(shard: &Shard, key: &str) -> Result<Option<u32>, GgufError> {
    if shard.metadata.get(key).is_none() {
        return Ok(None);
    }
    shard
        .metadata
        .get_u32(key)
        .map(Some)
        .map_err(|source| GgufError::Metadata {
            path: shard.path.clone(),
            source,
        })
}

/// Shard `index` (0-based) of a set of `count` files: its split keys, where present, agree.
fn check_split_keys(shard: &Shard, index: u32, count: u32) -> Result<(), GgufError> {
    let key_error = |key: &str, detail: String| GgufError::Key {
        path: shard.path.clone(),
        key: key.to_string(),
        detail,
    };
    if count == 0 || index >= count {
        return Err(GgufError::Split {
            path: shard.path.clone(),
            detail: format!("the file name says shard {} of {count}", index + 1),
        });
    }
    if let Some(no) = split_key(shard, SPLIT_NO_KEY)? {
        if no != index {
            return Err(key_error(
                SPLIT_NO_KEY,
                format!(
                    "is {no}, but the file name says shard {} of {count} (split.no {index})",
                    index + 1
                ),
            ));
        }
    }
    if let Some(c) = split_key(shard, SPLIT_COUNT_KEY)? {
        if c != count {
            return Err(key_error(
                SPLIT_COUNT_KEY,
                format!("is {c}, but the file names say {count} shards"),
            ));
        }
    }
    Ok(())
}

/// A file whose name is not a shard's: its split keys, where present, must say "one file".
fn check_single(shard: &Shard) -> Result<(), GgufError> {
    if let Some(c) = split_key(shard, SPLIT_COUNT_KEY)? {
        if c > 1 {
            return Err(GgufError::Key {
                path: shard.path.clone(),
                key: SPLIT_COUNT_KEY.to_string(),
                detail: format!(
                    "is {c}, but the file name is not a shard's (NAME-00001-of-{c:05}.gguf): \
                     hob finds a split set's shards by that pattern"
                ),
            });
        }
    }
    if let Some(no) = split_key(shard, SPLIT_NO_KEY)? {
        if no != 0 {
            return Err(GgufError::Key {
                path: shard.path.clone(),
                key: SPLIT_NO_KEY.to_string(),
                detail: format!("is {no}: this is not the first shard of a split set"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        let p = Path::new("/m/Qwen3-30B-Q4_K_M-00001-of-00003.gguf");
        assert_eq!(split_name(p), Some((1, 3)));
        assert_eq!(
            sibling(p, 2, 3).unwrap(),
            Path::new("/m/Qwen3-30B-Q4_K_M-00002-of-00003.gguf")
        );
        assert_eq!(split_name(Path::new("model.gguf")), None);
        assert_eq!(split_name(Path::new("m-1-of-3.gguf")), None);
        assert_eq!(split_name(Path::new("m-00001-of-00003.bin")), None);
        assert_eq!(split_name(Path::new("m-0000x-of-00003.gguf")), None);
        assert_eq!(split_name(Path::new("-00002-of-00002.gguf")), Some((2, 2)));
    }

    /// A hand-made minimal file: no key/values, one F32 tensor of 8 values.
    fn minimal() -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(b'w');
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&8u64.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.resize(64, 0);
        for i in 0..8 {
            b.extend_from_slice(&(i as f32).to_le_bytes());
        }
        b
    }

    #[test]
    fn minimal_file() {
        let g = GgufFile::from_bytes("m.gguf", minimal()).unwrap();
        assert_eq!(g.version(), 3);
        assert_eq!(g.data_start(), 64);
        let t = g.tensor("w").unwrap();
        assert_eq!(t.dims(), &[8]);
        assert_eq!(t.info().file_range(), 64..96);
        let v = t.dequantize_f32().unwrap();
        assert_eq!(v, (0..8).map(|i| i as f32).collect::<Vec<_>>());
    }

    #[test]
    fn every_truncation_is_an_error() {
        let b = minimal();
        for len in 0..b.len() {
            let e = GgufFile::from_bytes("m.gguf", b[..len].to_vec())
                .err()
                .unwrap();
            assert!(e.to_string().starts_with("m.gguf"), "{len}: {e}");
        }
    }
}
