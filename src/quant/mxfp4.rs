//! MXFP4 (OCP microscaling; gpt-oss ships its experts so): blocks of 32 e2m1 codes (two a byte,
//! element 2i in the low nibble) and one E8M0 exponent byte e. Every kernel computes with the
//! doubled codes, the integers [0, 1, 2, 3, 4, 6, 8, 12] and their negatives, times 2^(e - 128):
//! exact in f32, as ggml's kernels do. The f32 kernels (the reference, AVX2, AVX-512) and the GPU
//! (cuda/matvec_float.cu) multiply the same values; on AVX-512 VNNI the integer kernel of
//! x86/vnni.rs rounds x to 15-16 bits a block, as for int4, at twice the f32 kernel's speed
//! (benches/results/2026-12-03-cpu-mxfp4-vnni.md).

use std::ops::Range;

use super::Matrix;

/// Values a block.
pub const BLOCK: usize = 32;

/// Twice each e2m1 code's value (bit 3 the sign).
pub const E2M1_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// 2^(e - 128): the scale of the doubled codes of a block with exponent byte e (2^-128 and 2^-127
/// as subnormals). 255, which OCP reserves for NaN, reads as 2^127; convert refuses it.
#[inline]
pub fn half_scale(e: u8) -> f32 {
    f32::from_bits(match e {
        0 => 0x0020_0000,
        1 => 0x0040_0000,
        _ => u32::from(e - 1) << 23,
    })
}

/// The magnitudes of e2m1, doubled, and the thresholds between neighbours.
const MAG_X2: [f32; 8] = [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0];

/// The nearest doubled magnitude's index for a doubled |value| v (ties to the smaller).
fn nearest(v: f32) -> u8 {
    let mut best = 0u8;
    for (i, pair) in MAG_X2.windows(2).enumerate() {
        if v > 0.5 * (pair[0] + pair[1]) {
            best = i as u8 + 1;
        }
    }
    best
}

/// Codes of `w` (32 values) under exponent e into `codes` (16 bytes); returns the squared error.
fn encode(w: &[f32], e: u8, codes: &mut [u8]) -> f64 {
    let s = half_scale(e);
    let inv = 1.0 / s as f64;
    let mut err = 0.0f64;
    for (byte, pair) in codes.iter_mut().zip(w.chunks_exact(2)) {
        let mut b = 0u8;
        for (j, &v) in pair.iter().enumerate() {
            let m = nearest(((v.abs() as f64) * inv).min(12.0) as f32);
            let code = if v < 0.0 && m > 0 { m | 8 } else { m };
            let d = f64::from(E2M1_X2[usize::from(code)]) * s as f64 - v as f64;
            err += d * d;
            b |= code << (4 * j);
        }
        *byte = b;
    }
    err
}

/// Quantize one block of 32 values: the exponent that puts the largest magnitude at or below 6
/// (e2m1's largest), or one below it (clipping the largest, finer steps), whichever errs less.
/// Returns the exponent byte; the codes go to `codes` (16 bytes).
pub fn quantize_block(w: &[f32], codes: &mut [u8]) -> u8 {
    debug_assert_eq!((w.len(), codes.len()), (BLOCK, BLOCK / 2));
    let amax = w.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    if amax == 0.0 {
        codes.fill(0);
        return 127;
    }
    // The smallest e with 6 * 2^(e - 127) >= amax, within E8M0's finite range.
    let e_fit = ((amax as f64 / 6.0).log2().ceil() + 127.0).clamp(0.0, 254.0) as u8;
    let mut best = (f64::INFINITY, e_fit);
    let mut scratch = [0u8; BLOCK / 2];
    for e in [e_fit, e_fit.saturating_sub(1)] {
        let err = encode(w, e, &mut scratch);
        if err < best.0 {
            best = (err, e);
        }
    }
    encode(w, best.1, codes);
    best.1
}

/// Row r of an MXFP4 matrix, dequantized.
pub(super) fn row_to_f32(m: &Matrix, r: usize, out: &mut [f32]) {
    let (codes, scales) = row(m, r);
    for ((o, block), &e) in out
        .chunks_exact_mut(BLOCK)
        .zip(codes.chunks_exact(16))
        .zip(scales)
    {
        let s = half_scale(e);
        for (o2, &b) in o.chunks_exact_mut(2).zip(block) {
            o2[0] = f32::from(E2M1_X2[usize::from(b & 15)]) * s;
            o2[1] = f32::from(E2M1_X2[usize::from(b >> 4)]) * s;
        }
    }
}

fn row<'a>(m: &Matrix<'a>, r: usize) -> (&'a [u8], &'a [u8]) {
    let (rb, blocks) = (m.cols / 2, m.cols / BLOCK);
    (
        &m.codes[r * rb..(r + 1) * rb],
        &m.scales[r * blocks..(r + 1) * blocks],
    )
}

/// The reference product of one row: each block's doubled codes times x in order, then times
/// its scale, added in block order.
fn dot_row_scalar(m: &Matrix, r: usize, x: &[f32]) -> f32 {
    let (codes, scales) = row(m, r);
    let mut acc = 0.0f32;
    for ((block, &e), xb) in codes
        .chunks_exact(16)
        .zip(scales)
        .zip(x.chunks_exact(BLOCK))
    {
        let mut s = 0.0f32;
        for (&b, x2) in block.iter().zip(xb.chunks_exact(2)) {
            s += f32::from(E2M1_X2[usize::from(b & 15)]) * x2[0];
            s += f32::from(E2M1_X2[usize::from(b >> 4)]) * x2[1];
        }
        acc += half_scale(e) * s;
    }
    acc
}

pub(super) fn matvec_rows_scalar(m: &Matrix, x: &[f32], rows: Range<usize>, out: &mut [f32]) {
    for (o, r) in out.iter_mut().zip(rows) {
        *o = dot_row_scalar(m, r, x);
    }
}

/// The fast path: AVX-512 VNNI, AVX-512 or AVX2 where the CPU has it, else the reference.
pub(super) fn matvec_rows(m: &Matrix, x: &[f32], rows: Range<usize>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(level) = super::x86::Level::detected() {
        return matvec_rows_x86(level, m, x, rows, out);
    }
    matvec_rows_scalar(m, x, rows, out);
}

/// The kernel of `level` (at most the detected one): integer dot products of x rounded to 16
/// bits per block on VNNI (as the int4 kernel), else f32 table lookups.
#[cfg(target_arch = "x86_64")]
pub(super) fn matvec_rows_x86(
    level: super::x86::Level,
    m: &Matrix,
    x: &[f32],
    rows: Range<usize>,
    out: &mut [f32],
) {
    use super::x86::Level;
    if level == Level::Avx512Vnni {
        // SAFETY: the caller's level is at most the detected one (AVX-512 F, BW, VL and VNNI);
        // the callers' checks as below.
        unsafe { super::x86::packed_vnni_rows(m, x, rows, out) };
        return;
    }
    if level >= Level::Avx512 {
        // SAFETY: AVX-512F detected at run time; the callers' checks as below.
        unsafe { x86::matvec_rows_512(m, x, rows, out) };
        return;
    }
    if super::x86::available() {
        // SAFETY: AVX2 and FMA detected at run time; the caller's `check` and `check_call`
        // established that every row in `rows` lies inside codes and scales and that x has
        // `cols` values, which is all the kernel reads.
        unsafe { x86::matvec_rows(m, x, rows, out) };
        return;
    }
    matvec_rows_scalar(m, x, rows, out);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{half_scale, row, Matrix, BLOCK};

    /// x with each `run` columns reordered to their even ones, then their odd ones: the order in
    /// which a byte per 32-bit lane gives its low nibbles, then its high ones.
    fn reordered(x: &[f32], run: usize) -> Vec<f32> {
        let mut xr = Vec::with_capacity(x.len());
        for c in x.chunks_exact(run) {
            xr.extend(c.iter().step_by(2));
            xr.extend(c.iter().skip(1).step_by(2));
        }
        xr
    }

    /// Eight codes (one per 32-bit lane, 4 bits) as their doubled e2m1 values: the magnitude by
    /// `vpermps` (which reads the low 3 bits), the sign from bit 3.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn values(q: __m256i, mag: __m256) -> __m256 {
        let sign = _mm256_slli_epi32::<28>(_mm256_and_si256(q, _mm256_set1_epi32(8)));
        _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, q), _mm256_castsi256_ps(sign))
    }

    /// One block's doubled values times its 32 (reordered) x values, in 16 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn block_512(codes: *const u8, xb: *const f32, table: __m512) -> __m512 {
        let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(codes as *const __m128i));
        let lo = _mm512_permutexvar_ps(_mm512_and_si512(q, _mm512_set1_epi32(0x0f)), table);
        let hi = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(q), table);
        _mm512_fmadd_ps(
            hi,
            _mm512_loadu_ps(xb.add(16)),
            _mm512_mul_ps(lo, _mm512_loadu_ps(xb)),
        )
    }

    /// The same products on AVX-512: a block's 16 bytes one per 32-bit lane, their low and high
    /// nibbles looked up in the 16-entry table of doubled values (`vpermps` reads 4 bits).
    ///
    /// # Safety
    /// AVX-512F is present; the rest as for `matvec_rows`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn matvec_rows_512(
        m: &Matrix,
        x: &[f32],
        rows: Range<usize>,
        out: &mut [f32],
    ) {
        let mut t = [0f32; 16];
        for (v, &c) in t.iter_mut().zip(super::E2M1_X2.iter()) {
            *v = f32::from(c);
        }
        let table = _mm512_loadu_ps(t.as_ptr());
        let xr = reordered(x, 32);
        let xp = xr.as_ptr();
        let mut sf = vec![0f32; m.cols / BLOCK];
        for (o, r) in out.iter_mut().zip(rows) {
            let (codes, scales) = row(m, r);
            for (f, &e) in sf.iter_mut().zip(scales) {
                *f = half_scale(e);
            }
            let cp = codes.as_ptr();
            let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            // Two blocks a step, each into its own accumulator.
            let n = scales.len();
            let mut b = 0;
            while b + 1 < n {
                let s0 = block_512(cp.add(16 * b), xp.add(BLOCK * b), table);
                let s1 = block_512(cp.add(16 * b + 16), xp.add(BLOCK * b + BLOCK), table);
                acc0 = _mm512_fmadd_ps(s0, _mm512_set1_ps(sf[b]), acc0);
                acc1 = _mm512_fmadd_ps(s1, _mm512_set1_ps(sf[b + 1]), acc1);
                b += 2;
            }
            if b < n {
                let s0 = block_512(cp.add(16 * b), xp.add(BLOCK * b), table);
                acc0 = _mm512_fmadd_ps(s0, _mm512_set1_ps(sf[b]), acc0);
            }
            *o = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
        }
    }

    /// # Safety
    /// AVX2 and FMA are present; every row in `rows` lies inside `m`'s codes and scales and x has
    /// `m.cols` values (a multiple of 32).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn matvec_rows(m: &Matrix, x: &[f32], rows: Range<usize>, out: &mut [f32]) {
        let mag = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0);
        let low = _mm256_set1_epi32(0x0f);
        let xr = reordered(x, 16);
        let xp = xr.as_ptr();
        for (o, r) in out.iter_mut().zip(rows) {
            let (codes, scales) = row(m, r);
            let cp = codes.as_ptr();
            let mut acc = _mm256_setzero_ps();
            for (b, &e) in scales.iter().enumerate() {
                // Two runs of 16 columns: 8 bytes each, a byte per lane.
                let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                for h in 0..2 {
                    let at = BLOCK * b + 16 * h;
                    let q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(cp.add(at / 2) as *const __m128i));
                    let lo = values(_mm256_and_si256(q, low), mag);
                    let hi = values(_mm256_srli_epi32::<4>(q), mag);
                    s0 = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xp.add(at)), s0);
                    s1 = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xp.add(at + 8)), s1);
                }
                acc = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), _mm256_set1_ps(half_scale(e)), acc);
            }
            let h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
            let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            let h = _mm_add_ss(h, _mm_shuffle_ps::<1>(h, h));
            *o = _mm_cvtss_f32(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Variant;

    #[test]
    fn scales_are_powers_of_two() {
        assert_eq!(half_scale(128), 1.0);
        assert_eq!(half_scale(130), 4.0);
        assert_eq!(half_scale(1), 2f32.powi(-127));
        assert_eq!(half_scale(0), 2f32.powi(-128));
        assert_eq!(half_scale(254), 2f32.powi(126));
    }

    #[test]
    fn representable_blocks_round_trip_exactly() {
        // Every e2m1 value at one scale: quantizing gives them back exactly.
        let w: Vec<f32> = (0..BLOCK)
            .map(|i| f32::from(E2M1_X2[i % 16]) * 0.5 * 2f32.powi(-5))
            .collect();
        let mut codes = [0u8; 16];
        let e = quantize_block(&w, &mut codes);
        let back: Vec<f32> = (0..BLOCK)
            .map(|i| {
                let c = (codes[i / 2] >> (4 * (i % 2))) & 15;
                f32::from(E2M1_X2[usize::from(c)]) * half_scale(e)
            })
            .collect();
        assert_eq!(back, w);
    }

    #[test]
    fn the_fast_product_matches_the_reference() {
        let (rows, cols) = (5, 96);
        let src: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1.0 + (i % 13) as f32))
            .collect();
        let v = Variant::parse("mxfp4", None).unwrap();
        let layout = v.matrix_layout(rows, cols).unwrap();
        let stored = crate::quant::quantize_matrix(v, &layout, &src);
        let m = Matrix::from_view(layout.view(v, &stored));
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let (mut fast, mut slow) = (vec![0.0; rows], vec![0.0; rows]);
        m.matvec_rows(&x, 0..rows, &mut fast);
        m.matvec_rows_scalar(&x, 0..rows, &mut slow);
        let deq = m.to_f32();
        for r in 0..rows {
            let terms = (0..cols).map(|c| deq[r * cols + c] as f64 * x[c] as f64);
            let (exact, mag) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
            // Relative to sum |w x|: the VNNI kernel rounds x to 15-16 bits per block.
            assert!(
                (fast[r] as f64 - exact).abs() < 1e-4 * mag,
                "{} {exact}",
                fast[r]
            );
            assert!((slow[r] as f64 - exact).abs() < 1e-6 * mag);
        }
        // The AVX2 kernel too where the dispatch takes the AVX-512 one.
        #[cfg(target_arch = "x86_64")]
        if crate::quant::x86::available() {
            let mut avx2 = vec![0.0; rows];
            // SAFETY: AVX2 and FMA detected; m is checked and x has m.cols values.
            unsafe { x86::matvec_rows(&m, &x, 0..rows, &mut avx2) };
            for (a, b) in avx2.iter().zip(&slow) {
                assert!((a - b).abs() < 1e-4 * (1.0 + b.abs()));
            }
        }
        let err = crate::quant::measure_error(v, &layout, &stored, &src);
        assert!(err.relative_rms() < 0.12, "{}", err.relative_rms());
    }
}
