//! MXFP4 experts kept as MXFP4: a checkpoint's (Hugging Face `*_blocks` / `*_scales`) or a GGUF's
//! (ggml `block_mxfp4`) codes and exponents carried into hob's `mxfp4` variant as they are, never
//! dequantized and quantized again (formats/hob.md, variant kind 6).

use std::path::Path;

use super::gguf::GgufError;
use super::ImportError;
use crate::format::MatrixLayout;

/// One [rows, cols] matrix in hob's mxfp4 layout: codes row-major, two a byte (element 2i in the
/// low nibble), and one E8M0 byte per 32 values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mxfp4Matrix {
    pub codes: Vec<u8>,
    pub scales: Vec<u8>,
}

/// An expert's gate, up and down as stored MXFP4.
pub type Mxfp4Expert = [Mxfp4Matrix; 3];

impl Mxfp4Matrix {
    /// From a Hugging Face checkpoint's rows of blocks (16 bytes: 32 codes, element 2i in the
    /// low nibble, hob's order) and their exponents, rows taken as given.
    pub fn from_hf(blocks: &[u8], scales: &[u8]) -> Mxfp4Matrix {
        Mxfp4Matrix {
            codes: blocks.to_vec(),
            scales: scales.to_vec(),
        }
    }

    /// From ggml's `block_mxfp4` rows (17 bytes a block: the exponent, then 16 bytes holding
    /// element j in the low nibble and element j + 16 in the high one), repacked to hob's order.
    pub fn from_ggml(bytes: &[u8]) -> Mxfp4Matrix {
        let n = bytes.len() / 17;
        let (mut codes, mut scales) = (Vec::with_capacity(16 * n), Vec::with_capacity(n));
        for b in bytes.chunks_exact(17) {
            scales.push(b[0]);
            let q = &b[1..];
            let nib = |i: usize| if i < 16 { q[i] & 15 } else { q[i - 16] >> 4 };
            codes.extend((0..16).map(|i| nib(2 * i) | (nib(2 * i + 1) << 4)));
        }
        Mxfp4Matrix { codes, scales }
    }

    /// The first exponent byte that is 255 (NaN in OCP's E8M0), whose block hob cannot store.
    pub fn nan_block(&self) -> Option<usize> {
        self.scales.iter().position(|&e| e == 255)
    }

    /// An error naming tensor `name` of `path` and the expert where a block's exponent is NaN.
    pub fn check_finite(&self, path: &Path, name: &str, expert: usize) -> Result<(), ImportError> {
        match self.nan_block() {
            Some(b) => Err(ImportError::from(GgufError::Tensor {
                path: path.to_path_buf(),
                name: name.to_string(),
                detail: format!("expert {expert}: block {b}'s exponent is 255 (NaN in E8M0)"),
            })),
            None => Ok(()),
        }
    }

    /// Write into `matrix` (the matrix's `layout.size` bytes of a blob) where `layout` puts codes
    /// and scales; None where the sizes disagree with the layout.
    pub fn store(&self, layout: &MatrixLayout, matrix: &mut [u8]) -> Option<()> {
        if self.codes.len() != layout.codes.len() || self.scales.len() != layout.scales.len() {
            return None;
        }
        matrix
            .get_mut(layout.codes.clone())?
            .copy_from_slice(&self.codes);
        matrix
            .get_mut(layout.scales.clone())?
            .copy_from_slice(&self.scales);
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_blocks_repack_to_hob_order() {
        // Element i holds code i % 16: ggml puts elements j and j + 16 in byte j.
        let mut block = vec![130u8];
        block.extend((0..16u8).map(|j| j | (j << 4)));
        let m = Mxfp4Matrix::from_ggml(&block);
        assert_eq!(m.scales, vec![130]);
        let codes: Vec<u8> = (0..32)
            .map(|i| (m.codes[i / 2] >> (4 * (i % 2))) & 15)
            .collect();
        let want: Vec<u8> = (0..32).map(|i| (i % 16) as u8).collect();
        assert_eq!(codes, want);
        assert_eq!(m.nan_block(), None);
    }
}
