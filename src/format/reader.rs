//! Reading a .hob file: mmap, validate everything, then hand out zero-copy views.
//! STUB: the format worker fills in the bodies.

use std::path::{Path, PathBuf};

use super::{DType, ExpertLayout, FormatError, Metadata, Variant};
use crate::error::Error;

/// The fixed header (formats/hob.md, "Header").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub file_size: u64,
    pub metadata_offset: u64,
    pub metadata_len: u64,
    pub tensors_offset: u64,
    pub tensors_len: u64,
    pub tensor_count: u64,
    pub experts_offset: u64,
    pub experts_len: u64,
    pub data_offset: u64,
    pub data_len: u64,
}

/// One dense tensor table entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    /// [n] or [rows, cols].
    pub shape: Vec<usize>,
    /// Absolute file offset.
    pub offset: u64,
    pub size: u64,
    pub crc32c: u32,
}

/// One expert table record, for (layer, expert, variant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertRecord {
    pub offset: u64,
    pub size: u64,
    pub crc32c: u32,
}

pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

/// One stored matrix of an expert: the sub-arrays of `MatrixLayout`, sliced.
#[derive(Clone, Copy, Debug)]
pub struct MatrixView<'a> {
    pub variant: Variant,
    pub rows: usize,
    pub cols: usize,
    pub codes: &'a [u8],
    pub scales: &'a [u8],
    pub mins: &'a [u8],
}

#[derive(Clone, Copy, Debug)]
pub struct ExpertView<'a> {
    pub variant: Variant,
    pub layout: &'a ExpertLayout,
    /// The blob's `size` bytes (padding excluded), 4 KiB-aligned in the mmap.
    pub data: &'a [u8],
}

impl<'a> ExpertView<'a> {
    pub fn gate(&self) -> MatrixView<'a> {
        todo!()
    }
    pub fn up(&self) -> MatrixView<'a> {
        todo!()
    }
    pub fn down(&self) -> MatrixView<'a> {
        todo!()
    }
}

pub struct HobFile {
    path: PathBuf,
}

impl HobFile {
    /// mmap and validate. Errors name the file and the field.
    pub fn open(path: &Path) -> Result<HobFile, Error> {
        todo!("{}", path.display())
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn header(&self) -> &Header {
        todo!()
    }
    pub fn metadata(&self) -> &Metadata {
        todo!()
    }
    pub fn tensors(&self) -> &[TensorInfo] {
        todo!()
    }
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        todo!("{name}")
    }
    pub fn n_layers(&self) -> usize {
        todo!()
    }
    pub fn n_experts(&self) -> usize {
        todo!()
    }
    /// Expert dims (hidden, ffn) from the expert table header.
    pub fn expert_dims(&self) -> (usize, usize) {
        todo!()
    }
    pub fn variants(&self) -> &[Variant] {
        todo!()
    }
    /// Layout shared by every expert of variant index `v`.
    pub fn expert_layout(&self, v: usize) -> &ExpertLayout {
        todo!("{v}")
    }
    pub fn expert_record(&self, layer: usize, expert: usize, v: usize) -> ExpertRecord {
        todo!("{layer} {expert} {v}")
    }
    /// Zero-copy view of one expert blob. Panics on out-of-range indices (callers index by
    /// counts this file reported).
    pub fn expert(&self, layer: usize, expert: usize, v: usize) -> ExpertView<'_> {
        todo!("{layer} {expert} {v}")
    }
    /// Check every checksum; the error names the first bad tensor or (layer, expert, variant).
    pub fn verify(&self) -> Result<(), FormatError> {
        todo!()
    }
}
