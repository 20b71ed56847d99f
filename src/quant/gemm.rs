//! Batched products for prefill: dequantize a block of weight rows to f32 once, then one f32
//! product against every token's input: register tiles on AVX-512 (x86/tile.rs), elsewhere the
//! `matrixmultiply` crate's cache-blocked GEMM. Decode (one token) uses the fused `matvec_rows`
//! kernels instead.

use std::ops::Range;

use super::Matrix;

impl Matrix<'_> {
    /// out[(r - rows.start) * t + i] = dot(row r, x_i) for the rows in `rows` and the `t` inputs
    /// x_i = x[i * cols..(i + 1) * cols]: out is (rows.len(), t), row-major. `scratch` holds the
    /// dequantized rows between calls. The sum over columns runs in an order fixed by `cols`
    /// alone, so results do not depend on how a caller splits the rows.
    pub fn matmul_rows(
        &self,
        x: &[f32],
        t: usize,
        rows: Range<usize>,
        out: &mut [f32],
        scratch: &mut Vec<f32>,
    ) {
        let (n, k) = (rows.len(), self.cols);
        assert_eq!(x.len(), t * k, "matmul_rows: input length vs t x cols");
        assert!(
            rows.end <= self.rows,
            "matmul_rows: rows {rows:?} of {}",
            self.rows
        );
        assert_eq!(out.len(), n * t, "matmul_rows: output length");
        if self.kind.is_sub_scaled() {
            // Blocks of rows as int4/g32 or int2/g16 (quant::subscales): their dequantization, one row's sums
            // as the whole call's.
            return super::subscales::with_rows(self, rows, |v, at| {
                v.matmul_rows(x, t, 0..v.rows, &mut out[at.start * t..at.end * t], scratch)
            });
        }
        #[cfg(target_arch = "x86_64")]
        if self.kind.is_planes()
            && super::x86::Level::detected().is_some_and(|l| l >= super::x86::Level::Avx512)
        {
            scratch.resize(n * k, 0.0);
            // SAFETY: AVX-512F and F16C (detected); an ap8 view whose rows in `rows` lie in its
            // prefix (asserted above and by `check`), scratch n * k.
            unsafe { super::x86::ap8_dequant_rows_512(self, rows, scratch) };
            // SAFETY: as below: w is n rows of k values, x is t * k and out n * t.
            unsafe {
                super::x86::matmul_f32_512(super::x86::TileRows::F32(scratch), x, (n, k, t), out)
            };
            return;
        }
        if self.kind.is_planes() {
            return super::planes::with_rows(self, rows, |v, at| {
                v.matmul_rows(x, t, 0..v.rows, &mut out[at.start * t..at.end * t], scratch)
            });
        }
        #[cfg(target_arch = "x86_64")]
        if super::x86::Level::detected().is_some_and(|l| l >= super::x86::Level::Avx512) {
            use super::x86::TileRows;
            let w = if self.kind == super::WeightKind::F16 && k.is_multiple_of(16) {
                let rb = self.row_bytes();
                TileRows::F16(&self.codes[rows.start * rb..rows.end * rb])
            } else if matches!(
                self.kind,
                super::WeightKind::Int8
                    | super::WeightKind::Int4
                    | super::WeightKind::Int3
                    | super::WeightKind::Int2
                    | super::WeightKind::Mxfp4
            ) {
                scratch.resize(n * k, 0.0);
                // SAFETY: AVX-512F and VL (detected); an int8, int4, int3, int2 or MXFP4 matrix whose rows in
                // `rows` lie in its slices (asserted above), scratch n * k.
                unsafe { super::x86::dequant_rows_512(self, rows.clone(), scratch) };
                TileRows::F32(scratch)
            } else {
                self.rows_to_f32(rows.clone(), scratch);
                TileRows::F32(scratch)
            };
            // SAFETY: the CPU has AVX-512F and VL (detected); w is n rows of k values (f16 only
            // where k is a multiple of 16), x is t * k and out is n * t (asserted above).
            unsafe { super::x86::matmul_f32_512(w, x, (n, k, t), out) };
            return;
        }
        self.rows_to_f32(rows, scratch);
        // C (n, t) = A (n, k) x B (k, t), with B = xᵀ read in place (x is (t, k) row-major).
        // SAFETY: every pointer covers exactly the extent described by its dimensions and
        // strides: A is scratch (n * k, row stride k), B is x (t * k, element (kk, i) at
        // i * k + kk), C is out (n * t, row stride t); the lengths were asserted above, and out
        // does not alias the inputs (it is a distinct &mut).
        unsafe {
            matrixmultiply::sgemm(
                n,
                k,
                t,
                1.0,
                scratch.as_ptr(),
                k as isize,
                1,
                x.as_ptr(),
                1,
                k as isize,
                0.0,
                out.as_mut_ptr(),
                t as isize,
                1,
            );
        }
    }

    /// The rows in `rows`, dequantized to f32 into `scratch` (resized to hold them).
    fn rows_to_f32(&self, rows: Range<usize>, scratch: &mut Vec<f32>) {
        let k = self.cols;
        scratch.resize(rows.len() * k, 0.0);
        for (r, w) in rows.zip(scratch.chunks_exact_mut(k)) {
            self.row_to_f32(r, w);
        }
    }
}
