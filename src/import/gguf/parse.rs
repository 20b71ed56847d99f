//! One GGUF file's bytes -> its validated header, metadata and tensor table. Pure: no I/O.
//!
//! Layout (little-endian): magic "GGUF", version u32 (2 or 3), tensor count u64, key/value count
//! u64, the key/values (hob's `Metadata` decoder), the tensor infos (name: u64 length + UTF-8,
//! n_dims u32, ne u64 x n_dims, type u32, offset u64 from the data section), padding to
//! `general.alignment` (default 32), the data section. Every count and length is checked against
//! the bytes left before anything is allocated or sliced.

use std::path::Path;

use super::{GgufError, GgufTensorInfo};
use crate::format::Metadata;
use crate::import::ggml::GgmlType;

/// The first four bytes of a GGUF file.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// The data section's alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// GGML_MAX_DIMS: a tensor has at most this many dimensions.
pub const MAX_DIMS: usize = 4;
/// The metadata key that sets the data section's alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Magic, version, tensor count, key/value count.
const HEADER_BYTES: u64 = 4 + 4 + 8 + 8;
/// Smallest key/value: an empty key (8), the type (4), a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest tensor info: an empty name (8), n_dims (4), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;
/// ggml counts elements in int64_t.
const MAX_ELEMENTS: u64 = i64::MAX as u64;

/// One file, parsed and validated.
pub(super) struct Parsed {
    pub version: u32,
    pub metadata: Metadata,
    pub alignment: u64,
    /// Offset in the file of the data section.
    pub data_start: u64,
    pub tensors: Vec<GgufTensorInfo>,
}

/// Bounds-checked little-endian reads; a read past the end names the field and the range.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        let start = self.pos as u64;
        let end = u128::from(start) + u128::from(n);
        let slice = usize::try_from(n)
            .ok()
            .and_then(|n| self.bytes.get(self.pos..self.pos.checked_add(n)?));
        match slice {
            Some(s) => {
                self.pos += s.len();
                Ok(s)
            }
            None => Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: what(),
                start,
                end,
                file_size: self.bytes.len() as u64,
            }),
        }
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(|| format!("{} length", what()))?;
        let bytes = self.take(len, || format!("{} ({len} bytes)", what()))?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::Invalid {
            path: self.path.to_path_buf(),
            what: what(),
            detail: "not valid UTF-8".to_string(),
        })
    }

    fn left(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }
}

/// Parse and validate one file (`path` names it in errors; `shard` goes into its tensor infos).
pub(super) fn parse(path: &Path, bytes: &[u8], shard: usize) -> Result<Parsed, GgufError> {
    let mut r = Reader {
        bytes,
        pos: 0,
        path,
    };
    let (version, tensor_count, kv_count) = header(&mut r)?;
    let (metadata, end) =
        Metadata::decode_entries(bytes, r.pos, kv_count).map_err(|source| GgufError::Metadata {
            path: path.to_path_buf(),
            source,
        })?;
    r.pos = end;
    let alignment = alignment(path, &metadata)?;
    check_count(&r, "tensor count", tensor_count, MIN_TENSOR_INFO_BYTES)?;
    // Bounded above, but a table grows only as entries are read.
    let mut tensors = Vec::with_capacity(tensor_count.min(4096) as usize);
    for i in 0..tensor_count {
        tensors.push(tensor_info(&mut r, i, alignment, shard)?);
    }
    let data_start = (r.pos as u64)
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| GgufError::Invalid {
            path: path.to_path_buf(),
            what: "data section".to_string(),
            detail: "its aligned start overflows".to_string(),
        })?;
    place(path, bytes.len() as u64, data_start, &mut tensors)?;
    Ok(Parsed {
        version,
        metadata,
        alignment,
        data_start,
        tensors,
    })
}

/// Magic, version and the two counts, each count bounded by the bytes after the header.
fn header(r: &mut Reader<'_>) -> Result<(u32, u64, u64), GgufError> {
    if r.bytes.get(..4) != Some(GGUF_MAGIC.as_slice()) {
        return Err(GgufError::BadMagic {
            path: r.path.to_path_buf(),
            found: r.bytes.iter().take(4).copied().collect(),
        });
    }
    r.pos = 4;
    let version = r.u32(|| "header: version".to_string())?;
    if version != 2 && version != 3 {
        return Err(GgufError::Version {
            path: r.path.to_path_buf(),
            found: version,
            hint: if matches!(version.swap_bytes(), 2 | 3) {
                " (a big-endian GGUF: hob reads little-endian ones)"
            } else {
                ""
            },
        });
    }
    let tensor_count = r.u64(|| "header: tensor count".to_string())?;
    let kv_count = r.u64(|| "header: key/value count".to_string())?;
    debug_assert_eq!(r.pos as u64, HEADER_BYTES);
    check_count(r, "key/value count", kv_count, MIN_KV_BYTES)?;
    check_count(r, "tensor count", tensor_count, MIN_TENSOR_INFO_BYTES)?;
    Ok((version, tensor_count, kv_count))
}

/// Refuse a count whose smallest encoding needs more bytes than are left.
fn check_count(
    r: &Reader<'_>,
    what: &'static str,
    count: u64,
    min_bytes: u64,
) -> Result<(), GgufError> {
    let needed = u128::from(count) * u128::from(min_bytes);
    if needed > u128::from(r.left()) {
        return Err(GgufError::Count {
            path: r.path.to_path_buf(),
            what,
            count,
            needed,
            offset: r.pos as u64,
            available: r.left(),
        });
    }
    Ok(())
}

/// `general.alignment`: an unsigned 32-bit power of two; 32 when absent.
fn alignment(path: &Path, metadata: &Metadata) -> Result<u64, GgufError> {
    if metadata.get(ALIGNMENT_KEY).is_none() {
        return Ok(DEFAULT_ALIGNMENT);
    }
    let a = metadata
        .get_u32(ALIGNMENT_KEY)
        .map_err(|source| GgufError::Metadata {
            path: path.to_path_buf(),
            source,
        })?;
    if !a.is_power_of_two() {
        return Err(GgufError::Key {
            path: path.to_path_buf(),
            key: ALIGNMENT_KEY.to_string(),
            detail: format!("{a} is not a power of two"),
        });
    }
    Ok(u64::from(a))
}

/// Tensor info #`i`: read its fields, then check its shape, type and offset.
fn tensor_info(
    r: &mut Reader<'_>,
    i: u64,
    alignment: u64,
    shard: usize,
) -> Result<GgufTensorInfo, GgufError> {
    let path = r.path;
    let name = r.string(&|| format!("tensor info #{i}: name"))?;
    if name.is_empty() {
        return Err(GgufError::Invalid {
            path: path.to_path_buf(),
            what: format!("tensor info #{i}"),
            detail: "the name is empty".to_string(),
        });
    }
    let bad = |detail: String| GgufError::Tensor {
        path: path.to_path_buf(),
        name: name.clone(),
        detail,
    };
    let n_dims = r.u32(|| format!("tensor {name}: n_dims"))?;
    if n_dims as usize > MAX_DIMS {
        return Err(bad(format!(
            "n_dims is {n_dims}, more than GGML's {MAX_DIMS}"
        )));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for j in 0..n_dims {
        dims.push(r.u64(|| format!("tensor {name}: ne[{j}]"))?);
    }
    let code = r.u32(|| format!("tensor {name}: type"))?;
    let offset = r.u64(|| format!("tensor {name}: offset"))?;
    if let Some(j) = dims.iter().position(|&d| d == 0) {
        return Err(bad(format!(
            "ne[{j}] is 0 in ne {dims:?} (every dimension is at least 1)"
        )));
    }
    let n_elements = dims
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| bad(format!("ne {dims:?}: the element count overflows")))?;
    let ggml_type = GgmlType::from_code(code).map_err(|e| bad(e.to_string()))?;
    let block = ggml_type.block_size() as u64;
    let ne0 = dims.first().copied().unwrap_or(1);
    if ne0 % block != 0 {
        return Err(bad(format!(
            "ne[0] = {ne0} is not a multiple of {ggml_type}'s block size {block}"
        )));
    }
    let n_bytes = (n_elements / block)
        .checked_mul(ggml_type.type_size() as u64)
        .ok_or_else(|| bad(format!("{ggml_type} ne {dims:?}: the byte size overflows")))?;
    if offset % alignment != 0 {
        return Err(bad(format!(
            "data offset {offset} is not a multiple of the alignment {alignment} ({ALIGNMENT_KEY})"
        )));
    }
    Ok(GgufTensorInfo {
        name,
        dims,
        ggml_type,
        shard,
        offset,
        n_bytes,
        start: 0,
    })
}

/// Place each tensor in the file: its data inside the file, no two overlapping.
fn place(
    path: &Path,
    file_size: u64,
    data_start: u64,
    tensors: &mut [GgufTensorInfo],
) -> Result<(), GgufError> {
    for t in tensors.iter_mut() {
        let start = u128::from(data_start) + u128::from(t.offset);
        let end = start + u128::from(t.n_bytes);
        if end > u128::from(file_size) {
            return Err(GgufError::PastEnd {
                path: path.to_path_buf(),
                name: t.name.clone(),
                start,
                end,
                file_size,
            });
        }
        // end <= file_size, the length of a slice in memory.
        t.start = start as usize;
    }
    let mut order: Vec<&GgufTensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.start);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.start < a.end() {
            return Err(GgufError::Overlap {
                path: path.to_path_buf(),
                a: a.name.clone(),
                a_range: (a.start as u64, a.end() as u64),
                b: b.name.clone(),
                b_range: (b.start as u64, b.end() as u64),
            });
        }
    }
    Ok(())
}
