//! The tensors of a checkpoint: one `model.safetensors`, or the shards named by
//! `model.safetensors.index.json`'s weight_map. Headers are parsed up front; data stays in the
//! mmaps until a tensor is loaded.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use super::{dtype, read_json, ImportError};
use crate::format::DType;

const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";

struct Shard {
    /// File name inside the checkpoint directory (what errors name).
    name: String,
    mmap: Mmap,
}

struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range inside the shard's mmap.
    bytes: Range<usize>,
}

pub struct TensorIndex {
    shards: Vec<Shard>,
    entries: HashMap<String, Entry>,
    /// What a lookup searched, for "not found" errors.
    searched: String,
}

fn map_shard(
    dir: &Path,
    name: &str,
) -> Result<(Shard, safetensors::tensor::Metadata, usize), ImportError> {
    let path = dir.join(name);
    let file = File::open(&path).map_err(|e| ImportError::io(&path, "open", e))?;
    // SAFETY: the mapping is read-only and lives as long as the index. Like every reader of
    // safetensors checkpoints, we rely on no one truncating or rewriting the file during the
    // conversion (that would fault or change the values read, not break memory safety of
    // anything but this read-only view).
    let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ImportError::io(&path, "mmap", e))?;
    let (header_len, metadata) =
        SafeTensors::read_metadata(&mmap).map_err(|e| ImportError::Safetensors {
            path: path.clone(),
            detail: e.to_string(),
        })?;
    let data_start = 8 + header_len;
    Ok((
        Shard {
            name: name.to_string(),
            mmap,
        },
        metadata,
        data_start,
    ))
}

impl TensorIndex {
    pub fn open(dir: &Path) -> Result<TensorIndex, ImportError> {
        let index_path = dir.join(INDEX_FILE);
        if index_path.exists() {
            Self::open_sharded(dir, &index_path)
        } else if dir.join(SINGLE_FILE).exists() {
            let (shard, metadata, data_start) = map_shard(dir, SINGLE_FILE)?;
            let mut entries = HashMap::new();
            for (name, info) in metadata.tensors() {
                entries.insert(name, entry(0, info, data_start));
            }
            Ok(TensorIndex {
                shards: vec![shard],
                entries,
                searched: dir.join(SINGLE_FILE).display().to_string(),
            })
        } else {
            Err(ImportError::NoWeights {
                dir: dir.to_path_buf(),
            })
        }
    }

    fn open_sharded(dir: &Path, index_path: &Path) -> Result<TensorIndex, ImportError> {
        let index = read_json(index_path)?;
        let weight_map = index
            .get("weight_map")
            .and_then(|w| w.as_object())
            .ok_or_else(|| ImportError::Field {
                path: index_path.to_path_buf(),
                field: "weight_map".into(),
                expected: "an object of tensor name -> file name".into(),
                found: index
                    .get("weight_map")
                    .map_or("nothing".into(), |v| v.to_string()),
            })?;
        let mut files = BTreeSet::new();
        for (name, file) in weight_map {
            let file = file.as_str().ok_or_else(|| ImportError::Field {
                path: index_path.to_path_buf(),
                field: format!("weight_map.{name}"),
                expected: "a file name".into(),
                found: file.to_string(),
            })?;
            // A shard must be a plain file beside the index, never a path elsewhere.
            if Path::new(file).file_name() != Some(std::ffi::OsStr::new(file)) {
                return Err(ImportError::Field {
                    path: index_path.to_path_buf(),
                    field: format!("weight_map.{name}"),
                    expected: "a file name in the checkpoint directory".into(),
                    found: file.to_string(),
                });
            }
            files.insert(file);
        }
        let mut shards = Vec::new();
        let mut shard_meta = HashMap::new();
        for (i, file) in files.iter().enumerate() {
            let (shard, metadata, data_start) = map_shard(dir, file)?;
            shards.push(shard);
            shard_meta.insert(*file, (i, metadata, data_start));
        }
        let mut entries = HashMap::new();
        for (name, file) in weight_map {
            let file = file.as_str().unwrap_or_default();
            let (i, metadata, data_start) = &shard_meta[file];
            let info = metadata
                .info(name)
                .ok_or_else(|| ImportError::MissingTensor {
                    name: name.clone(),
                    searched: format!(
                        "{} (named there by {})",
                        dir.join(file).display(),
                        index_path.display()
                    ),
                })?;
            entries.insert(name.clone(), entry(*i, info, *data_start));
        }
        Ok(TensorIndex {
            shards,
            entries,
            searched: format!("the weight_map of {}", index_path.display()),
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The files a lookup searches (for messages).
    pub fn searched(&self) -> &str {
        &self.searched
    }

    fn get(&self, name: &str) -> Result<&Entry, ImportError> {
        self.entries
            .get(name)
            .ok_or_else(|| ImportError::MissingTensor {
                name: name.to_string(),
                searched: self.searched.clone(),
            })
    }

    fn file_of(&self, e: &Entry) -> String {
        self.shards[e.shard].name.clone()
    }

    /// The tensor's shape (as stored).
    pub fn shape(&self, name: &str) -> Result<&[usize], ImportError> {
        Ok(&self.get(name)?.shape)
    }

    /// The tensor's dtype, if it is one hob converts from.
    pub fn dtype(&self, name: &str) -> Result<DType, ImportError> {
        let e = self.get(name)?;
        match e.dtype {
            Dtype::F32 => Ok(DType::F32),
            Dtype::F16 => Ok(DType::F16),
            Dtype::BF16 => Ok(DType::Bf16),
            other => Err(ImportError::UnsupportedDtype {
                name: name.to_string(),
                file: self.file_of(e),
                found: other.to_string(),
            }),
        }
    }

    /// Check a tensor exists with `shape` and a supported dtype.
    pub fn check(&self, name: &str, shape: &[usize]) -> Result<DType, ImportError> {
        self.check_shape(name, shape)?;
        self.dtype(name)
    }

    fn check_shape(&self, name: &str, shape: &[usize]) -> Result<(), ImportError> {
        let e = self.get(name)?;
        if e.shape != shape {
            return Err(ImportError::ShapeMismatch {
                name: name.to_string(),
                file: self.file_of(e),
                expected: shape.to_vec(),
                found: e.shape.clone(),
            });
        }
        Ok(())
    }

    /// Decode elements `elems` of a tensor (row-major) into `out`, checking they are finite.
    pub fn load_range_into(
        &self,
        name: &str,
        elems: Range<usize>,
        out: &mut Vec<f32>,
    ) -> Result<(), ImportError> {
        let e = self.get(name)?;
        let dt = self.dtype(name)?;
        let size = dt.size();
        let bytes = &self.shards[e.shard].mmap[e.bytes.clone()];
        let src = bytes
            .get(elems.start * size..elems.end * size)
            .ok_or_else(|| ImportError::Safetensors {
                path: PathBuf::from(self.file_of(e)),
                detail: format!("tensor '{name}': elements {elems:?} out of range"),
            })?;
        dtype::decode_into(dt, src, out);
        self.release(e.shard, e.bytes.start + elems.start * size, src.len());
        if let Some((count, first)) = dtype::non_finite(out) {
            return Err(ImportError::NonFinite {
                name: name.to_string(),
                file: self.file_of(e),
                count,
                first: elems.start + first,
            });
        }
        Ok(())
    }

    /// Drop the pages of bytes already decoded from this process's resident set, so a
    /// conversion's memory stays near one tensor or expert rather than growing to the whole
    /// checkpoint. The page cache keeps them; a later read faults them back in.
    fn release(&self, shard: usize, offset: usize, len: usize) {
        let mmap = &self.shards[shard].mmap;
        // SAFETY: the mapping is read-only and file-backed (not MAP_PRIVATE-written), so
        // MADV_DONTNEED only unmaps pages that the next access re-reads unchanged from the file;
        // no Rust reference into the range is live (`src` was consumed above), and the range lies
        // inside the map. A failure only means the pages stay resident, so it is ignored.
        let _ =
            unsafe { mmap.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) };
    }

    /// Check a tensor of bytes (U8: MXFP4 blocks and scales) exists with `shape`.
    pub fn check_u8(&self, name: &str, shape: &[usize]) -> Result<(), ImportError> {
        let e = self.get(name)?;
        if e.dtype != Dtype::U8 {
            return Err(ImportError::Safetensors {
                path: PathBuf::from(self.file_of(e)),
                detail: format!(
                    "tensor '{name}': dtype {}, expected U8 (packed bytes)",
                    e.dtype
                ),
            });
        }
        self.check_shape(name, shape)
    }

    /// Bytes `range` of a U8 tensor (checked by `check_u8`), copied out.
    pub fn load_u8(&self, name: &str, range: Range<usize>) -> Result<Vec<u8>, ImportError> {
        let e = self.get(name)?;
        let bytes = &self.shards[e.shard].mmap[e.bytes.clone()];
        let src = bytes
            .get(range.clone())
            .ok_or_else(|| ImportError::Safetensors {
                path: PathBuf::from(self.file_of(e)),
                detail: format!("tensor '{name}': bytes {range:?} out of range"),
            })?
            .to_vec();
        self.release(e.shard, e.bytes.start + range.start, src.len());
        Ok(src)
    }

    /// Load a whole tensor as f32, checking it is finite.
    pub fn load_f32(&self, name: &str) -> Result<Vec<f32>, ImportError> {
        let n = self.shape(name)?.iter().product();
        let mut out = Vec::new();
        self.load_range_into(name, 0..n, &mut out)?;
        Ok(out)
    }
}

fn entry(shard: usize, info: &safetensors::tensor::TensorInfo, data_start: usize) -> Entry {
    let (s, e) = info.data_offsets;
    Entry {
        shard,
        dtype: info.dtype,
        shape: info.shape.clone(),
        bytes: data_start + s..data_start + e,
    }
}
