//! Writing a .hob file: plan the whole layout first (every size is known from the shapes),
//! then stream tensors and expert blobs into a temporary file, then write tables and header and
//! rename. STUB: the format worker fills in the bodies.

use std::path::Path;

use super::{DType, Metadata, Variant};
use crate::error::Error;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenseSpec {
    pub name: String,
    pub dtype: DType,
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

pub struct HobWriter {}

impl HobWriter {
    /// Plan the layout and create `<out>.tmp.<pid>` beside `out`, preallocated to the final size
    /// (so a full disk is reported up front).
    pub fn create(
        out: &Path,
        metadata: &Metadata,
        dense: &[DenseSpec],
        experts: ExpertShape,
        variants: &[Variant],
    ) -> Result<HobWriter, Error> {
        todo!("{} {:?} {:?} {:?} {:?}", out.display(), metadata, dense, experts, variants)
    }
    /// Write dense tensor `index` (order of `dense`); `bytes.len()` must equal its size.
    pub fn write_dense(&mut self, index: usize, bytes: &[u8]) -> Result<(), Error> {
        todo!("{index} {}", bytes.len())
    }
    /// Write one expert blob; `bytes.len()` must equal the variant's `ExpertLayout::size`.
    pub fn write_expert(
        &mut self,
        layer: usize,
        expert: usize,
        variant: usize,
        bytes: &[u8],
    ) -> Result<(), Error> {
        todo!("{layer} {expert} {variant} {}", bytes.len())
    }
    /// Check everything was written, write the tables and the header, fsync, rename to `out`.
    pub fn finish(self) -> Result<(), Error> {
        todo!()
    }
}
