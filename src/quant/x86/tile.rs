//! Prefill products on AVX-512F: out (n, t) = W (n, k) x Xᵀ for rows W in f32 (dequantized once
//! by the caller) or f16 (converted as loaded) and t token inputs X (t, k), both read in place, R
//! rows by T tokens at a time. Each of the R x T outputs has its own 16-lane accumulator over k
//! (one FMA a column block), summed across its lanes at the end: no packing of either operand
//! (`matrixmultiply` spent as long packing as multiplying at prefill's shapes), and every
//! output's arithmetic depends on k alone, so results do not depend on the tile, the row split or
//! the token count around it.

use super::*;

/// Rows of W per tile: R x T accumulators plus R rows and one x vector fit the 32 registers.
const R: usize = 4;
/// Tokens per tile.
const T: usize = 6;

/// The rows of a prefill product as the tiles read them.
#[derive(Clone, Copy)]
pub(in crate::quant) enum TileRows<'a> {
    /// f32, row stride k.
    F32(&'a [f32]),
    /// f16 bits, row stride k (a multiple of 16).
    F16(&'a [u8]),
}

/// out[r * t + i] = dot(w row r, x_i) for n rows of w and t inputs of x (row stride k).
///
/// # Safety
/// The CPU has AVX-512F and VL; w holds n rows of k values (f16: k a multiple of 16),
/// x.len() >= t * k, out.len() >= n * t.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub(in crate::quant) unsafe fn matmul_f32_512(
    w: TileRows,
    x: &[f32],
    (n, k, t): (usize, usize, usize),
    out: &mut [f32],
) {
    debug_assert!(x.len() >= t * k && out.len() >= n * t);
    let (base, elem, f16) = match w {
        TileRows::F32(w) => {
            debug_assert!(w.len() >= n * k);
            (w.as_ptr() as *const u8, 4, false)
        }
        TileRows::F16(w) => {
            debug_assert!(w.len() >= n * k * 2 && k % 16 == 0);
            (w.as_ptr(), 2, true)
        }
    };
    for r0 in (0..n).step_by(R) {
        for i0 in (0..t).step_by(T) {
            let (rn, tn) = ((n - r0).min(R), (t - i0).min(T));
            let (wp, xp) = (base.add(r0 * k * elem), x.as_ptr().add(i0 * k));
            let op = out.as_mut_ptr().add(r0 * t + i0);
            // SAFETY (each call): rn rows of w from r0 and tn inputs from i0 lie in the slices
            // (the caller's lengths), and the outputs written, rows r0.. r0 + rn at columns
            // i0.. i0 + tn of the (n, t) out, too.
            match (f16, rn) {
                (false, 4) => tile_t::<false, 4>(wp, xp, k, tn, op, t),
                (false, 3) => tile_t::<false, 3>(wp, xp, k, tn, op, t),
                (false, 2) => tile_t::<false, 2>(wp, xp, k, tn, op, t),
                (false, _) => tile_t::<false, 1>(wp, xp, k, tn, op, t),
                (true, 4) => tile_t::<true, 4>(wp, xp, k, tn, op, t),
                (true, 3) => tile_t::<true, 3>(wp, xp, k, tn, op, t),
                (true, 2) => tile_t::<true, 2>(wp, xp, k, tn, op, t),
                (true, _) => tile_t::<true, 1>(wp, xp, k, tn, op, t),
            }
        }
    }
}

/// A tile of RN rows and `tn` (at most T) tokens.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn tile_t<const F16: bool, const RN: usize>(
    w: *const u8,
    x: *const f32,
    k: usize,
    tn: usize,
    out: *mut f32,
    t: usize,
) {
    match tn {
        6 => tile::<F16, RN, 6>(w, x, k, out, t),
        5 => tile::<F16, RN, 5>(w, x, k, out, t),
        4 => tile::<F16, RN, 4>(w, x, k, out, t),
        3 => tile::<F16, RN, 3>(w, x, k, out, t),
        2 => tile::<F16, RN, 2>(w, x, k, out, t),
        _ => tile::<F16, RN, 1>(w, x, k, out, t),
    }
}

/// Column block c of row r: 16 values (f32 masked to `mask`; f16 whole, as k is a multiple of 16).
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn load_w<const F16: bool>(w: *const u8, k: usize, r: usize, c: usize, mask: u16) -> __m512 {
    if F16 {
        _mm512_cvtph_ps(_mm256_loadu_si256(w.add((r * k + c) * 2) as *const __m256i))
    } else {
        _mm512_maskz_loadu_ps(mask, (w as *const f32).add(r * k + c))
    }
}

/// RN x TN outputs: rows r of w, inputs x + i k, written to out[r * t + i].
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
#[inline(never)]
unsafe fn tile<const F16: bool, const RN: usize, const TN: usize>(
    w: *const u8,
    x: *const f32,
    k: usize,
    out: *mut f32,
    t: usize,
) {
    // 24 named accumulators, each used only where its row and token exist (the rest are dead
    // code): in an array LLVM kept part of them in memory.
    let z = _mm512_setzero_ps();
    let (mut a00, mut a01, mut a02, mut a03, mut a04, mut a05) = (z, z, z, z, z, z);
    let (mut a10, mut a11, mut a12, mut a13, mut a14, mut a15) = (z, z, z, z, z, z);
    let (mut a20, mut a21, mut a22, mut a23, mut a24, mut a25) = (z, z, z, z, z, z);
    let (mut a30, mut a31, mut a32, mut a33, mut a34, mut a35) = (z, z, z, z, z, z);
    // One column block: RN rows of w, each input once, RN x TN FMAs.
    macro_rules! step {
        ($c:expr, $mask:expr) => {{
            let w0 = if RN > 0 {
                load_w::<F16>(w, k, 0, $c, $mask)
            } else {
                z
            };
            let w1 = if RN > 1 {
                load_w::<F16>(w, k, 1, $c, $mask)
            } else {
                z
            };
            let w2 = if RN > 2 {
                load_w::<F16>(w, k, 2, $c, $mask)
            } else {
                z
            };
            let w3 = if RN > 3 {
                load_w::<F16>(w, k, 3, $c, $mask)
            } else {
                z
            };
            if TN > 0 {
                let xv = _mm512_maskz_loadu_ps($mask, x.add(0 * k + $c));
                a00 = _mm512_fmadd_ps(w0, xv, a00);
                a10 = _mm512_fmadd_ps(w1, xv, a10);
                a20 = _mm512_fmadd_ps(w2, xv, a20);
                a30 = _mm512_fmadd_ps(w3, xv, a30);
            }
            if TN > 1 {
                let xv = _mm512_maskz_loadu_ps($mask, x.add(1 * k + $c));
                a01 = _mm512_fmadd_ps(w0, xv, a01);
                a11 = _mm512_fmadd_ps(w1, xv, a11);
                a21 = _mm512_fmadd_ps(w2, xv, a21);
                a31 = _mm512_fmadd_ps(w3, xv, a31);
            }
            if TN > 2 {
                let xv = _mm512_maskz_loadu_ps($mask, x.add(2 * k + $c));
                a02 = _mm512_fmadd_ps(w0, xv, a02);
                a12 = _mm512_fmadd_ps(w1, xv, a12);
                a22 = _mm512_fmadd_ps(w2, xv, a22);
                a32 = _mm512_fmadd_ps(w3, xv, a32);
            }
            if TN > 3 {
                let xv = _mm512_maskz_loadu_ps($mask, x.add(3 * k + $c));
                a03 = _mm512_fmadd_ps(w0, xv, a03);
                a13 = _mm512_fmadd_ps(w1, xv, a13);
                a23 = _mm512_fmadd_ps(w2, xv, a23);
                a33 = _mm512_fmadd_ps(w3, xv, a33);
            }
            if TN > 4 {
                let xv = _mm512_maskz_loadu_ps($mask, x.add(4 * k + $c));
                a04 = _mm512_fmadd_ps(w0, xv, a04);
                a14 = _mm512_fmadd_ps(w1, xv, a14);
                a24 = _mm512_fmadd_ps(w2, xv, a24);
                a34 = _mm512_fmadd_ps(w3, xv, a34);
            }
            if TN > 5 {
                let xv = _mm512_maskz_loadu_ps($mask, x.add(5 * k + $c));
                a05 = _mm512_fmadd_ps(w0, xv, a05);
                a15 = _mm512_fmadd_ps(w1, xv, a15);
                a25 = _mm512_fmadd_ps(w2, xv, a25);
                a35 = _mm512_fmadd_ps(w3, xv, a35);
            }
        }};
    }
    let whole = k / 16 * 16;
    let mut c = 0;
    while c < whole {
        step!(c, !0u16);
        c += 16;
    }
    if whole < k {
        step!(whole, (1u16 << (k - whole)) - 1);
    }
    let sums = [
        [a00, a01, a02, a03, a04, a05],
        [a10, a11, a12, a13, a14, a15],
        [a20, a21, a22, a23, a24, a25],
        [a30, a31, a32, a33, a34, a35],
    ];
    for (r, row) in sums.iter().enumerate().take(RN) {
        for (i, a) in row.iter().enumerate().take(TN) {
            *out.add(r * t + i) = _mm512_reduce_add_ps(*a);
        }
    }
}

/// Rows `rows` of an int8, int4, int3, int2 or MXFP4 matrix dequantized into `out` (cols values
/// a row), 16 columns at a time: the values of `row_to_f32` (s * q + m, rounded twice as there;
/// MXFP4 its doubled e2m1 value times half its scale).
///
/// # Safety
/// The CPU has AVX-512F and VL; m is one of those kinds with whole rows in its slices, and
/// out.len() == rows.len() * m.cols.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
pub(in crate::quant) unsafe fn dequant_rows_512(m: &Matrix, rows: Range<usize>, out: &mut [f32]) {
    let (rb, gpr, gs) = (m.row_bytes(), m.groups_per_row(), m.group_size);
    let low = _mm_set1_epi8(0x0f);
    // int2 (and int3's low bits): 16 columns are a 32-bit word, column i in bits 2i (byte i / 4,
    // field i % 4).
    let fields = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    // int3's high bits: column i of a 16-column quarter w of a 64-column block in bit
    // 8 (i / 4) + i % 4 + 4 (w % 2) of its 32-bit word (formats' `int3_hi_bit`).
    let hi_bits = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    let (one, three) = (_mm512_set1_epi32(1), _mm512_set1_epi32(3));
    let mx = {
        let mut t = [0f32; 16];
        for (v, &c) in t.iter_mut().zip(crate::quant::mxfp4::E2M1_X2.iter()) {
            *v = f32::from(c);
        }
        _mm512_loadu_ps(t.as_ptr())
    };
    for (r, row) in rows.zip(out.chunks_exact_mut(m.cols)) {
        let codes = m.codes[r * rb..(r + 1) * rb].as_ptr();
        for (gi, group) in row.chunks_exact_mut(gs).enumerate() {
            let g = r * gpr + gi;
            let s = _mm512_set1_ps(match m.kind {
                WeightKind::Mxfp4 => crate::quant::mxfp4::half_scale(m.scales[g]),
                _ => scalar::f16_at(m.scales, g),
            });
            let mn = _mm512_set1_ps(if m.kind.has_mins() {
                scalar::f16_at(m.mins, g)
            } else {
                0.0
            });
            for (j, o) in group.chunks_exact_mut(16).enumerate() {
                let c = gi * gs + 16 * j;
                let nibbles = || {
                    // Column 2k in the low nibble of byte k: nibbles interleaved back in order.
                    let b = _mm_loadl_epi64(codes.add(c / 2) as *const __m128i);
                    let lo = _mm_and_si128(b, low);
                    let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), low);
                    _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi))
                };
                let fields2 = || {
                    let w = (codes.add(c / 4) as *const i32).read_unaligned();
                    _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(w), fields), three)
                };
                let q = match m.kind {
                    WeightKind::Mxfp4 => None,
                    WeightKind::Int4 => Some(nibbles()),
                    WeightKind::Int2 => Some(fields2()),
                    WeightKind::Int3 => {
                        let (b, w) = (c / 64, (c % 64) / 16);
                        let hp = codes.add(m.cols / 4 + 8 * b + 4 * (w / 2)) as *const i32;
                        let shift =
                            _mm512_add_epi32(hi_bits, _mm512_set1_epi32(4 * (w as i32 % 2)));
                        let h = _mm512_and_si512(
                            _mm512_srlv_epi32(_mm512_set1_epi32(hp.read_unaligned()), shift),
                            one,
                        );
                        Some(_mm512_or_si512(fields2(), _mm512_slli_epi32::<2>(h)))
                    }
                    _ => Some(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                        codes.add(c) as *const __m128i
                    ))),
                };
                let v = match q {
                    Some(q) => _mm512_add_ps(_mm512_mul_ps(s, _mm512_cvtepi32_ps(q)), mn),
                    // MXFP4: the doubled e2m1 value times half the scale (no min).
                    None => _mm512_mul_ps(_mm512_permutexvar_ps(nibbles(), mx), s),
                };
                _mm512_storeu_ps(o.as_mut_ptr(), v);
            }
        }
    }
}
