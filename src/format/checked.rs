//! Checksums checked on first read. `HobFile::open` checks the header and the three section
//! checksums; the data section's (one CRC per dense tensor and per expert blob) would cost a
//! read of the whole file, so each blob is checked the first time it is used instead: the dense
//! tensors when a model loads them, an expert (layer, expert, variant) the first time an executor
//! reads it or a loader copies it. A bit per blob remembers the check, once per process.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::Mmap;

use super::reader::{expert_name, ExpertRecord, Parsed};
use super::{ap8, FormatError, Variant, BLOB_ALIGN};

/// The expert blobs of one mapped file and which of them have passed their checksum. Shared
/// (an `Arc`) with threads that copy blobs out of the map (the expert loader).
pub struct BlobChecks {
    path: PathBuf,
    map: Arc<Mmap>,
    n_experts: usize,
    variants: Vec<Variant>,
    /// Index `(layer * n_experts + expert) * n_variants + variant`, as `Parsed::records`.
    records: Vec<ExpertRecord>,
    /// (offset, record index), sorted by offset: which blob a file offset falls in.
    by_offset: Vec<(u64, usize)>,
    /// One bit per record: its checksum matched.
    verified: Vec<AtomicU64>,
}

impl BlobChecks {
    pub(crate) fn new(path: &Path, map: Arc<Mmap>, p: &Parsed) -> BlobChecks {
        // A view shares its stored blob's offset: a range is checked as the whole blob.
        let nv = p.variants.len().max(1);
        let mut by_offset: Vec<(u64, usize)> = p
            .records
            .iter()
            .enumerate()
            .filter(|(i, _)| i % nv < p.n_stored)
            .map(|(i, r)| (r.offset, i))
            .collect();
        by_offset.sort_unstable();
        BlobChecks {
            path: path.to_path_buf(),
            map,
            n_experts: p.n_experts,
            variants: p.variants.clone(),
            records: p.records.clone(),
            by_offset,
            verified: (0..p.records.len().div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    /// The file these blobs are in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The record index of blob (layer, expert, variant `v`); None when out of range.
    pub fn index(&self, layer: usize, expert: usize, v: usize) -> Option<usize> {
        let nv = self.variants.len();
        if expert >= self.n_experts || v >= nv {
            return None;
        }
        let i = (layer.checked_mul(self.n_experts)? + expert).checked_mul(nv)? + v;
        (i < self.records.len()).then_some(i)
    }

    /// Whether record `i`'s checksum has matched already.
    pub fn is_verified(&self, i: usize) -> bool {
        self.verified
            .get(i / 64)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (i % 64)) != 0)
    }

    /// Check blob (layer, expert, variant `v`) unless it was checked already. The error names
    /// the file and the blob.
    pub fn expert(&self, layer: usize, expert: usize, v: usize) -> Result<(), FormatError> {
        let i = self.index(layer, expert, v).ok_or_else(|| {
            FormatError::Invalid {
                what: format!("expert (layer {layer}, expert {expert}, variant #{v})"),
                detail: format!(
                    "out of range: the file stores {} x {} experts in {} variants",
                    self.records.len() / (self.n_experts * self.variants.len()).max(1),
                    self.n_experts,
                    self.variants.len()
                ),
            }
            .in_file(&self.path)
        })?;
        self.check(i, crc_parallel)
    }

    /// Check the blob whose bytes (padding included) hold the start of `range`, unless it was
    /// checked already or no blob does (a range of dense tensors): what a loader copying that
    /// range calls. `crc` computes the CRC-32C of the blob's bytes (e.g. on several threads).
    pub fn range(
        &self,
        range: Range<usize>,
        crc: impl FnOnce(&[u8]) -> u32,
    ) -> Result<(), FormatError> {
        let at = range.start as u64;
        let k = self.by_offset.partition_point(|&(off, _)| off <= at);
        let Some(&(offset, i)) = k.checked_sub(1).and_then(|k| self.by_offset.get(k)) else {
            return Ok(());
        };
        let padded = self.records[i].size.next_multiple_of(BLOB_ALIGN as u64);
        if at >= offset + padded {
            return Ok(());
        }
        self.check(i, crc)
    }

    /// Check record `i` (in range) unless its bit is set; set it when the checksum matches.
    fn check(&self, i: usize, crc: impl FnOnce(&[u8]) -> u32) -> Result<(), FormatError> {
        if self.is_verified(i) {
            return Ok(());
        }
        let r = self.records[i];
        let nv = self.variants.len();
        let variant = self.variants[i % nv];
        // parse() proved every record in bounds of the map.
        let data = &self.map[r.offset as usize..(r.offset + r.size) as usize];
        // An ap8 view's checksum is in its blob's header and covers what follows the header.
        let (stored, computed) = match variant.is_view() {
            true => {
                let at = 4 * usize::from(variant.width - ap8::MIN_WIDTH);
                let stored = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"));
                (stored, crc(&data[ap8::HEADER..]))
            }
            false => (r.crc32c, crc(data)),
        };
        if computed != stored {
            let le = i / nv;
            let name = expert_name(le / self.n_experts, le % self.n_experts, &variant);
            return Err(FormatError::Checksum {
                what: name,
                stored,
                computed,
            }
            .in_file(&self.path));
        }
        self.verified[i / 64].fetch_or(1 << (i % 64), Ordering::AcqRel);
        Ok(())
    }
}

/// CRC-32C of `data` in 4 MiB pieces on rayon's global pool (~10 GB/s per core: a first use
/// of a large expert checks it in a few milliseconds).
pub fn crc_parallel(data: &[u8]) -> u32 {
    use rayon::prelude::*;
    crc32c_pieces(data, 4 << 20, |pieces| {
        pieces.par_iter().map(|p| crc32c::crc32c(p)).collect()
    })
}

/// CRC-32C of `data` computed in pieces of `piece` bytes by `map` (which may run them on several
/// threads) and combined: the same value as `crc32c::crc32c(data)`.
pub fn crc32c_pieces(data: &[u8], piece: usize, map: impl FnOnce(&[&[u8]]) -> Vec<u32>) -> u32 {
    let pieces: Vec<&[u8]> = data.chunks(piece.max(1)).collect();
    let crcs = map(&pieces);
    pieces
        .iter()
        .zip(crcs)
        .fold(0, |acc, (p, c)| crc32c::crc32c_combine(acc, c, p.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_combine_to_the_whole_crc() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for piece in [1, 7, 4096, 65536, 1 << 20] {
            let c = crc32c_pieces(&data, piece, |ps| {
                ps.iter().map(|p| crc32c::crc32c(p)).collect()
            });
            assert_eq!(c, crc32c::crc32c(&data), "piece {piece}");
        }
        assert_eq!(crc32c_pieces(&[], 8, |_| Vec::new()), crc32c::crc32c(&[]));
    }
}
