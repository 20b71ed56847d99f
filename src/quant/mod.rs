//! Quantizers (convert time), reference dequantization and CPU dot kernels for every storage type.
//! Pure: no threads, no I/O. STUB: the quant worker fills in the bodies.

use crate::format::{DType, MatrixLayout, MatrixView, Variant, VariantKind};

/// Storage of a row-major matrix the CPU multiplies with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightKind {
    F32,
    F16,
    Bf16,
    Int8,
    Int4,
    Int2,
}

/// A borrowed row-major [rows, cols] matrix: a dense tensor or one matrix of an expert variant.
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    pub kind: WeightKind,
    /// 0 for float kinds.
    pub group_size: usize,
    pub rows: usize,
    pub cols: usize,
    /// Raw values (float kinds) or packed codes.
    pub codes: &'a [u8],
    /// f16 per-group scales, [rows, cols / group_size].
    pub scales: &'a [u8],
    /// f16 per-group minimums (int4, int2).
    pub mins: &'a [u8],
}

impl<'a> Matrix<'a> {
    /// A dense tensor's bytes (`rows * cols * dtype.size()` of them).
    pub fn dense(dtype: DType, rows: usize, cols: usize, data: &'a [u8]) -> Matrix<'a> {
        todo!("{dtype} {rows} {cols} {}", data.len())
    }
    pub fn from_view(view: MatrixView<'a>) -> Matrix<'a> {
        todo!("{view:?}")
    }
    /// Dequantize row `r` into `out` (`cols` values). Used for embedding lookups and tests.
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        todo!("{r} {}", out.len())
    }
    /// out[i] = dot(row rows.start + i, x) for the rows in `rows`: the fast path (SIMD chosen at
    /// run time). Accumulation order is fixed per row, so results do not depend on how a caller
    /// splits rows among threads.
    pub fn matvec_rows(&self, x: &[f32], rows: std::ops::Range<usize>, out: &mut [f32]) {
        todo!("{} {rows:?} {}", x.len(), out.len())
    }
    /// Plain scalar reference for `matvec_rows`.
    pub fn matvec_rows_scalar(&self, x: &[f32], rows: std::ops::Range<usize>, out: &mut [f32]) {
        todo!("{} {rows:?} {}", x.len(), out.len())
    }
}

/// Quantize (or convert) a row-major f32 [rows, cols] matrix into `variant`'s stored bytes,
/// laid out as `layout` says (length `layout.size`, padding zeroed). Deterministic.
pub fn quantize_matrix(variant: Variant, layout: &MatrixLayout, src: &[f32]) -> Vec<u8> {
    todo!("{variant} {layout:?} {}", src.len())
}

/// Quantization error statistics, accumulated over matrices.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ErrorStats {
    /// Sum of squared errors.
    pub sse: f64,
    /// Sum of squared source values.
    pub ss: f64,
    pub count: u64,
}

impl ErrorStats {
    /// sqrt(sse / ss): relative RMS error.
    pub fn relative_rms(&self) -> f64 {
        if self.ss > 0.0 {
            (self.sse / self.ss).sqrt()
        } else {
            0.0
        }
    }
    pub fn add(&mut self, other: &ErrorStats) {
        self.sse += other.sse;
        self.ss += other.ss;
        self.count += other.count;
    }
}

/// Measure the error of stored bytes against the f32 source.
pub fn measure_error(variant: Variant, layout: &MatrixLayout, stored: &[u8], src: &[f32]) -> ErrorStats {
    todo!("{variant} {layout:?} {} {}", stored.len(), src.len())
}

#[allow(dead_code)]
fn _kinds(k: VariantKind) -> WeightKind {
    match k {
        VariantKind::F16 => WeightKind::F16,
        VariantKind::Bf16 => WeightKind::Bf16,
        VariantKind::Int8 => WeightKind::Int8,
        VariantKind::Int4 => WeightKind::Int4,
        VariantKind::Int2 => WeightKind::Int2,
    }
}
