//! Quantizers (convert time), reference dequantization and CPU dot kernels for every storage type.
//! Pure: no threads, no I/O.
//!
//! - `quantize`: per-group clip search for int8/int4/int2, round-to-nearest-even for f16/bf16.
//! - `scalar`: the plain reference kernels and dequantization.
//! - `x86` / `neon`: the SIMD fast paths (AVX2+FMA+F16C chosen at run time, AVX-512 levels
//!   where present; NEON always on aarch64).
//!
//! Every kernel computes one row at a time in a fixed order, so the result of a row does not
//! depend on which other rows are in the requested range. Asymmetric variants use
//! `sum_g(s_g * sum(q * x) + m_g * sum_g(x))`, with the group sums of `x` computed once per call.

mod gemm;
pub mod mxfp4;
mod planes;
mod quantize;
mod scalar;
mod subscales;

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;

use crate::format::{DType, MatrixView, TensorType, TensorView, VariantKind};

pub use planes::quantize_expert as quantize_ap8_expert;
pub use quantize::{measure_error, measure_view, quantize_matrix};
pub(crate) use scalar::int3_block;

/// Storage of a row-major matrix the CPU multiplies with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightKind {
    F32,
    F16,
    Bf16,
    Int8,
    Int4,
    /// int4 codes under 8-bit multiples of a row's (scale, min) pair (VariantKind::Int4k).
    Int4k,
    Int3,
    Int2,
    /// int2 codes under 4-bit multiples of a row's (scale, min) pair (VariantKind::Int2k).
    Int2k,
    Mxfp4,
    /// Matrix `part` (0 gate, 1 up, 2 down) of an ap8 expert read at `width` bits (quant::planes):
    /// `codes` is the blob's prefix for that width.
    Ap8 {
        width: u8,
        part: u8,
    },
}

impl WeightKind {
    pub fn from_variant(kind: VariantKind) -> WeightKind {
        match kind {
            VariantKind::F16 => WeightKind::F16,
            VariantKind::Bf16 => WeightKind::Bf16,
            VariantKind::Int8 => WeightKind::Int8,
            VariantKind::Int4 => WeightKind::Int4,
            VariantKind::Int4k => WeightKind::Int4k,
            VariantKind::Int3 => WeightKind::Int3,
            VariantKind::Int2 => WeightKind::Int2,
            VariantKind::Int2k => WeightKind::Int2k,
            VariantKind::Mxfp4 => WeightKind::Mxfp4,
            VariantKind::Ap8 => WeightKind::Ap8 {
                width: crate::format::ap8::MAX_WIDTH,
                part: 0,
            },
        }
    }

    pub fn from_dtype(dtype: DType) -> WeightKind {
        match dtype {
            DType::F32 => WeightKind::F32,
            DType::F16 => WeightKind::F16,
            DType::Bf16 => WeightKind::Bf16,
        }
    }

    /// Bits per stored value or code.
    pub fn bits(self) -> usize {
        match self {
            WeightKind::F32 => 32,
            WeightKind::F16 | WeightKind::Bf16 => 16,
            WeightKind::Int8 => 8,
            WeightKind::Ap8 { width, .. } => usize::from(width),
            WeightKind::Int4 | WeightKind::Int4k | WeightKind::Mxfp4 => 4,
            WeightKind::Int3 => 3,
            WeightKind::Int2 | WeightKind::Int2k => 2,
        }
    }

    pub fn is_quantized(self) -> bool {
        matches!(
            self,
            WeightKind::Int8
                | WeightKind::Int4
                | WeightKind::Int4k
                | WeightKind::Int3
                | WeightKind::Int2
                | WeightKind::Int2k
                | WeightKind::Mxfp4
                | WeightKind::Ap8 { .. }
        )
    }

    /// Bytes of one group's scale: f16, MXFP4's E8M0 byte, int4k's two bytes, int2k's one.
    pub fn scale_bytes(self) -> usize {
        if matches!(self, WeightKind::Mxfp4 | WeightKind::Int2k) {
            1
        } else {
            2
        }
    }

    pub fn has_mins(self) -> bool {
        matches!(
            self,
            WeightKind::Int4
                | WeightKind::Int4k
                | WeightKind::Int3
                | WeightKind::Int2
                | WeightKind::Int2k
        )
    }

    /// int4k and int2k (quant::subscales).
    pub fn is_sub_scaled(self) -> bool {
        matches!(self, WeightKind::Int4k | WeightKind::Int2k)
    }

    /// An ap8 view (quant::planes).
    pub fn is_planes(self) -> bool {
        matches!(self, WeightKind::Ap8 { .. })
    }
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
    /// f16 per-group scales (MXFP4: E8M0 bytes; int4k: a u8 and an i8 a group; int2k: a byte),
    /// [rows, cols / group_size].
    pub scales: &'a [u8],
    /// f16 per-group minimums (int4, int3, int2; int4k, int2k: the row's two f16, [rows, 2]).
    pub mins: &'a [u8],
}

impl<'a> Matrix<'a> {
    /// A dense tensor's bytes (`rows * cols * dtype.size()` of them).
    pub fn dense(dtype: DType, rows: usize, cols: usize, data: &'a [u8]) -> Matrix<'a> {
        let m = Matrix {
            kind: WeightKind::from_dtype(dtype),
            group_size: 0,
            rows,
            cols,
            codes: data,
            scales: &[],
            mins: &[],
        };
        m.check();
        m
    }

    /// A dense tensor of the file as a [rows, cols] matrix ([1, n] for a vector): float values,
    /// or a packed matrix in its variant's layout. Errors name what does not fit.
    pub fn from_tensor(t: TensorView<'a>) -> Result<Matrix<'a>, String> {
        let (rows, cols) = match t.info.shape[..] {
            [n] => (1, n),
            [r, c] => (r, c),
            _ => return Err(format!("shape {:?} is not a matrix", t.info.shape)),
        };
        match t.info.dtype {
            TensorType::Float(d) => Ok(Matrix::dense(d, rows, cols, t.data)),
            TensorType::Packed(v) if t.info.shape.len() == 2 => {
                let layout = v.matrix_layout(rows, cols)?;
                Ok(Matrix::from_view(layout.view(v, t.data)))
            }
            TensorType::Packed(v) => Err(format!("{v} stores matrices only")),
        }
    }

    pub fn from_view(view: MatrixView<'a>) -> Matrix<'a> {
        let kind = match view.variant.kind {
            VariantKind::Ap8 => WeightKind::Ap8 {
                width: view.variant.width,
                part: view.part,
            },
            k => WeightKind::from_variant(k),
        };
        let m = Matrix {
            kind,
            group_size: view.variant.group_size as usize,
            rows: view.rows,
            cols: view.cols,
            codes: view.codes,
            scales: view.scales,
            mins: view.mins,
        };
        m.check();
        m
    }

    /// Bytes of one row of codes.
    pub fn row_bytes(&self) -> usize {
        self.cols * self.kind.bits() / 8
    }

    /// Groups per row (0 for float kinds).
    pub fn groups_per_row(&self) -> usize {
        if self.kind.is_quantized() {
            self.cols / self.group_size
        } else {
            0
        }
    }

    /// The slices are at least as long as the shape needs. The reader validated the file, so a
    /// failure here is a bug in the caller; the SIMD kernels rely on it for in-bounds loads.
    fn check(&self) {
        if let WeightKind::Ap8 { width, part } = self.kind {
            assert!(
                (2..=8).contains(&width) && part < 3 && self.group_size == crate::format::ap8::SUB,
                "ap8 width {width}, part {part}, g{}",
                self.group_size
            );
            assert!(
                self.codes.len() >= planes::prefix_len(self),
                "ap8 [{}, {}] g{}: {} bytes of prefix",
                self.rows,
                self.cols,
                self.group_size,
                self.codes.len()
            );
            return;
        }
        let n = self
            .rows
            .checked_mul(self.cols)
            .expect("matrix size overflows");
        assert!(
            self.codes.len()
                >= n.checked_mul(self.kind.bits())
                    .expect("matrix size overflows")
                    / 8,
            "{:?} [{}, {}]: {} code bytes",
            self.kind,
            self.rows,
            self.cols,
            self.codes.len()
        );
        if self.kind.is_quantized() {
            assert!(
                self.group_size >= 16
                    && self.group_size.is_multiple_of(16)
                    && self.cols.is_multiple_of(self.group_size),
                "{:?} [{}, {}]: bad group size {}",
                self.kind,
                self.rows,
                self.cols,
                self.group_size
            );
            let side = self.rows * self.groups_per_row() * 2;
            let scale_side = side / 2 * self.kind.scale_bytes();
            assert!(
                self.kind != WeightKind::Mxfp4 || self.group_size == mxfp4::BLOCK,
                "mxfp4 with group size {}",
                self.group_size
            );
            assert!(
                self.kind != WeightKind::Int3 || self.group_size.is_multiple_of(64),
                "int3 with group size {}",
                self.group_size
            );
            assert!(
                self.scales.len() >= scale_side,
                "{:?}: {} scale bytes, need {scale_side}",
                self.kind,
                self.scales.len()
            );
            let side = match self.kind {
                WeightKind::Int4k | WeightKind::Int2k => self.rows * 4,
                _ => side,
            };
            assert!(
                !self.kind.is_sub_scaled() || self.group_size == subscales::group(self.kind),
                "{:?} with group size {}",
                self.kind,
                self.group_size
            );
            if self.kind.has_mins() {
                assert!(
                    self.mins.len() >= side,
                    "{:?}: {} min bytes, need {side}",
                    self.kind,
                    self.mins.len()
                );
            }
        }
    }

    /// Dequantize row `r` into `out` (`cols` values). Used for embedding lookups and tests.
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        assert_eq!(out.len(), self.cols, "output length");
        if self.kind == WeightKind::Mxfp4 {
            return mxfp4::row_to_f32(self, r, out);
        }
        if self.kind.is_sub_scaled() {
            return subscales::with_rows(self, r..r + 1, |m, _| m.row_to_f32(0, out));
        }
        if self.kind.is_planes() {
            return planes::with_rows(self, r..r + 1, |m, _| m.row_to_f32(0, out));
        }
        scalar::row_to_f32(self, r, out);
    }

    /// The whole matrix dequantized, row-major [rows, cols] (tests and tools; not a hot path).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        if self.cols > 0 {
            for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
                self.row_to_f32(r, row);
            }
        }
        out
    }

    /// out[i] = dot(row rows.start + i, x) for the rows in `rows`: the fast path (SIMD chosen at
    /// run time). Accumulation order is fixed per row, so results do not depend on how a caller
    /// splits rows among threads.
    pub fn matvec_rows(&self, x: &[f32], rows: std::ops::Range<usize>, out: &mut [f32]) {
        self.check_call(x, &rows, out);
        if self.kind == WeightKind::Mxfp4 {
            return mxfp4::matvec_rows(self, x, rows, out);
        }
        #[cfg(target_arch = "x86_64")]
        if let (true, Some(level)) = (
            self.kind.is_planes() || self.kind.is_sub_scaled(),
            x86::Level::detected(),
        ) {
            return self.matvec_rows_x86(level, x, rows, out);
        }
        if self.kind.is_sub_scaled() {
            return subscales::with_rows(self, rows, |m, at| {
                m.matvec_rows(x, 0..m.rows, &mut out[at])
            });
        }
        if self.kind.is_planes() {
            return planes::with_rows(self, rows, |m, at| {
                m.matvec_rows(x, 0..m.rows, &mut out[at])
            });
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(level) = x86::Level::detected() {
            self.matvec_rows_x86(level, x, rows, out);
            return;
        }
        let mut sums = GroupSums::new();
        let xsums = sums.compute(self, x);
        #[cfg(target_arch = "aarch64")]
        {
            // SAFETY: NEON is part of the aarch64 baseline; `check` and `check_call` established
            // that every row in `rows` lies inside the slices and x/out have the right lengths.
            unsafe { neon::matvec_rows(self, x, xsums, rows, out) };
            return;
        }
        #[allow(unreachable_code)]
        scalar::matvec_rows(self, x, xsums, rows, out);
    }

    /// `matvec_rows` on the x86 kernels of `level`: the CPU's own in use, each one up to it in
    /// tests. Panics where the CPU lacks `level`'s features.
    #[cfg(target_arch = "x86_64")]
    fn matvec_rows_x86(
        &self,
        level: x86::Level,
        x: &[f32],
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        assert!(
            x86::Level::detected().is_some_and(|top| level <= top),
            "{level:?} kernels on a CPU without them"
        );
        if self.kind == WeightKind::Mxfp4 {
            return mxfp4::matvec_rows_x86(level, self, x, rows, out);
        }
        // int4k and int2k on VNNI scale their groups' bytes in the kernel (`packed_vnni_rows`);
        // below it, blocks of rows viewed as int4/g32 (int2/g16) with expanded parameters.
        if self.kind.is_sub_scaled() && !x86::packed_vnni_takes(level, self) {
            return subscales::with_rows(self, rows, |m, at| {
                m.matvec_rows_x86(level, x, 0..m.rows, &mut out[at])
            });
        }
        if self.kind.is_planes() {
            if level >= x86::Level::Avx512Vnni {
                // SAFETY: AVX-512F, BW, VL, VNNI and F16C are present (level); `check` and
                // `check_call` established the prefix's length and x's and out's.
                return unsafe { x86::ap8_vnni_rows(self, x, rows, out) };
            }
            if level >= x86::Level::Avx512 && x86::has_bmi2() {
                // SAFETY: AVX-512F, F16C and BMI2 are present (level and the check above); `check`
                // and `check_call` established the prefix's length and x's and out's.
                return unsafe { x86::ap8_rows(self, x, rows, out) };
            }
            return planes::with_rows(self, rows, |m, at| {
                m.matvec_rows_x86(level, x, 0..m.rows, &mut out[at])
            });
        }
        let mut sums = GroupSums::new();
        // The integer kernel sums its own rounded x per group.
        let xsums = if x86::packed_vnni_takes(level, self) {
            &[]
        } else {
            sums.compute(self, x)
        };
        // SAFETY: the CPU has `level`'s features (asserted just above); the callers' `check_call`
        // and `check` established that every row in `rows` lies inside the code, scale and min
        // slices and that x and out have the lengths the kernels index.
        unsafe { x86::matvec_rows(level, self, x, xsums, rows, out) };
    }

    /// `matvec_rows` on the x86 kernels of `level` (at most `x86::Level::detected()`).
    #[cfg(all(test, target_arch = "x86_64"))]
    fn matvec_rows_at(
        &self,
        level: x86::Level,
        x: &[f32],
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) {
        self.check_call(x, &rows, out);
        self.matvec_rows_x86(level, x, rows, out);
    }

    /// Plain scalar reference for `matvec_rows`.
    pub fn matvec_rows_scalar(&self, x: &[f32], rows: std::ops::Range<usize>, out: &mut [f32]) {
        self.check_call(x, &rows, out);
        if self.kind == WeightKind::Mxfp4 {
            return mxfp4::matvec_rows_scalar(self, x, rows, out);
        }
        if self.kind.is_sub_scaled() {
            return subscales::with_rows(self, rows, |m, at| {
                m.matvec_rows_scalar(x, 0..m.rows, &mut out[at])
            });
        }
        if self.kind.is_planes() {
            return planes::with_rows(self, rows, |m, at| {
                m.matvec_rows_scalar(x, 0..m.rows, &mut out[at])
            });
        }
        let mut sums = GroupSums::new();
        let xsums = scalar::group_sums(self, x, sums.buffer(self));
        scalar::matvec_rows(self, x, xsums, rows, out);
    }

    fn check_call(&self, x: &[f32], rows: &std::ops::Range<usize>, out: &[f32]) {
        assert_eq!(x.len(), self.cols, "x length vs matrix columns");
        assert!(
            rows.start <= rows.end && rows.end <= self.rows,
            "rows {rows:?} of a matrix with {} rows",
            self.rows
        );
        assert_eq!(out.len(), rows.len(), "output length vs row range");
    }
}

/// Whether the fast int8, int4, int2 and MXFP4 kernels round x (per group, to 16-bit integers:
/// the integer dot-product kernel, AVX-512 VNNI) rather than multiplying in f32.
pub fn packed_rounds_x() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86::Level::detected() == Some(x86::Level::Avx512Vnni)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
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

/// Per-group sums of x: on the stack for the usual shapes (up to 1024 groups), else on the heap.
struct GroupSums {
    stack: [f32; 1024],
    heap: Vec<f32>,
}

impl GroupSums {
    fn new() -> GroupSums {
        GroupSums {
            stack: [0.0; 1024],
            heap: Vec::new(),
        }
    }

    fn buffer(&mut self, m: &Matrix) -> &mut [f32] {
        let n = if m.kind.has_mins() {
            m.groups_per_row()
        } else {
            0
        };
        if n <= self.stack.len() {
            &mut self.stack[..n]
        } else {
            self.heap.resize(n, 0.0);
            &mut self.heap
        }
    }

    fn compute(&mut self, m: &Matrix, x: &[f32]) -> &[f32] {
        let buf = self.buffer(m);
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            // SAFETY: AVX2/FMA/F16C detected at run time; x has `cols` values and `buf` one slot
            // per group, which is what the kernel indexes.
            unsafe { x86::group_sums(x, m.group_size, buf) };
            return buf;
        }
        scalar::group_sums(m, x, buf)
    }
}
