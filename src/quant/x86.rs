//! AVX2 + FMA + F16C kernels. Loads are unaligned: only the 64-byte alignment of each sub-array is
//! guaranteed, not that of a row inside it.
//!
//! Every function here is `unsafe` for two reasons, checked by the callers in mod.rs: the CPU must
//! have AVX2, FMA and F16C (detected at run time), and the slices must be as long as the matrix
//! shape says (`Matrix::check`, `Matrix::check_call`).

use std::arch::x86_64::*;
use std::ops::Range;

use super::{scalar, Matrix, WeightKind};

pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn matvec_rows(
    m: &Matrix,
    x: &[f32],
    xsums: &[f32],
    rows: Range<usize>,
    out: &mut [f32],
) {
    let rb = m.row_bytes();
    let gpr = m.groups_per_row();
    for (o, r) in out.iter_mut().zip(rows) {
        let codes = &m.codes[r * rb..(r + 1) * rb];
        let side = r * gpr * 2..(r + 1) * gpr * 2;
        *o = match m.kind {
            WeightKind::F32 => dot_f32(codes, x),
            WeightKind::F16 => dot_f16(codes, x),
            WeightKind::Bf16 => dot_bf16(codes, x),
            WeightKind::Int8 => dot_int8(codes, &m.scales[side], m.group_size, x),
            WeightKind::Int4 | WeightKind::Int2 => {
                let qx = if m.kind == WeightKind::Int4 {
                    dot_int4(codes, &m.scales[side.clone()], m.group_size, x)
                } else {
                    dot_int2(codes, &m.scales[side.clone()], m.group_size, x)
                };
                qx + dot_f16(&m.mins[side], &xsums[..gpr])
            }
        };
    }
}

/// Sum of x over each group of `gs` (a multiple of 16) columns, one slot of `out` per group.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn group_sums(x: &[f32], gs: usize, out: &mut [f32]) {
    debug_assert!(x.len() >= out.len() * gs);
    let xp = x.as_ptr();
    for (g, o) in out.iter_mut().enumerate() {
        let mut a0 = _mm256_setzero_ps();
        let mut a1 = _mm256_setzero_ps();
        let mut i = g * gs;
        while i < (g + 1) * gs {
            a0 = _mm256_add_ps(a0, _mm256_loadu_ps(xp.add(i)));
            a1 = _mm256_add_ps(a1, _mm256_loadu_ps(xp.add(i + 8)));
            i += 16;
        }
        *o = hsum(_mm256_add_ps(a0, a1));
    }
}

/// How far ahead of the weights being multiplied the 16-bit kernels prefetch. Measured on the
/// device machine's 16-core Xeon (benches/cpu_stream.rs): the hardware prefetchers alone leave
/// one thread at ~70% of what a plain read streams.
const PREFETCH_AHEAD: usize = 1024;

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Dense dot product: `load(i)` gives the 8 weights at column i as f32, `tail(i)` one weight.
/// Four independent accumulators keep the FMA pipes busy; the tail is scalar.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_dense(
    x: &[f32],
    load: impl Fn(usize) -> __m256,
    tail: impl Fn(usize) -> f32,
    ahead: impl Fn(usize),
) -> f32 {
    let n = x.len();
    let xp = x.as_ptr();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        ahead(i);
        for (k, a) in acc.iter_mut().enumerate() {
            let j = i + 8 * k;
            *a = _mm256_fmadd_ps(load(j), _mm256_loadu_ps(xp.add(j)), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(load(i), _mm256_loadu_ps(xp.add(i)), acc[0]);
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        s += tail(i) * x[i];
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32(w: &[u8], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), 4 * x.len());
    let wp = w.as_ptr() as *const f32;
    // Loads stay inside the row: the closures get column indices below x.len() = w.len() / 4.
    dot_dense(
        x,
        |i| _mm256_loadu_ps(wp.add(i)),
        |i| wp.add(i).read_unaligned(),
        |_| {},
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), 2 * x.len());
    let wp = w.as_ptr();
    dot_dense(
        x,
        |i| _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * i) as *const __m128i)),
        |i| scalar::f16_at(w, i),
        // One 64-byte line per step: ask for the line PREFETCH_AHEAD bytes on (the next row's
        // start past the end: rows are contiguous, and a prefetch never faults).
        |i| _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(2 * i + PREFETCH_AHEAD) as *const i8),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), 2 * x.len());
    let wp = w.as_ptr();
    dot_dense(
        x,
        |i| {
            let h = _mm_loadu_si128(wp.add(2 * i) as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        },
        |i| f32::from_bits((u16::from_le_bytes([w[2 * i], w[2 * i + 1]]) as u32) << 16),
        |i| _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(2 * i + PREFETCH_AHEAD) as *const i8),
    )
}

/// sum_g s_g * sum_{i in g} q_i x_i, where `codes(i)` gives the 8 codes of columns i..i+8 as f32.
/// Group sizes are multiples of 16: two accumulators per group, 16 columns a step.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_grouped(
    scales: &[u8],
    gs: usize,
    x: &[f32],
    codes: impl Fn(usize) -> (__m256, __m256),
) -> f32 {
    let xp = x.as_ptr();
    let sp = scales.as_ptr() as *const u16;
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    for g in 0..x.len() / gs {
        let mut a0 = _mm256_setzero_ps();
        let mut a1 = _mm256_setzero_ps();
        let end = i + gs;
        while i < end {
            let (q0, q1) = codes(i);
            a0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(xp.add(i)), a0);
            a1 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xp.add(i + 8)), a1);
            i += 16;
        }
        let s = _mm256_cvtph_ps(_mm_set1_epi16(sp.add(g).read_unaligned() as i16));
        acc = _mm256_fmadd_ps(s, _mm256_add_ps(a0, a1), acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_int8(codes: &[u8], scales: &[u8], gs: usize, x: &[f32]) -> f32 {
    debug_assert_eq!(codes.len(), x.len());
    let cp = codes.as_ptr();
    dot_grouped(scales, gs, x, |i| {
        let lo = _mm_loadl_epi64(cp.add(i) as *const __m128i);
        let hi = _mm_loadl_epi64(cp.add(i + 8) as *const __m128i);
        (
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
        )
    })
}

/// Widen 16 unsigned byte codes to two vectors of eight f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn u8x16_to_f32(v: __m128i) -> (__m256, __m256) {
    (
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(v, v))),
    )
}

/// Byte and 16-bit lane shuffles only: the variable shifts (vpsrlvd) are slow on some AMD cores.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_int4(codes: &[u8], scales: &[u8], gs: usize, x: &[f32]) -> f32 {
    debug_assert_eq!(codes.len() * 2, x.len());
    let cp = codes.as_ptr();
    let mask = _mm_set1_epi8(0x0f);
    dot_grouped(scales, gs, x, |i| {
        // Eight bytes hold columns i..i+16, column 2k in the low nibble of byte k: split the
        // nibbles and interleave them back into column order.
        let b = _mm_loadl_epi64(cp.add(i / 2) as *const __m128i);
        let lo = _mm_and_si128(b, mask);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), mask);
        u8x16_to_f32(_mm_unpacklo_epi8(lo, hi))
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_int2(codes: &[u8], scales: &[u8], gs: usize, x: &[f32]) -> f32 {
    debug_assert_eq!(codes.len() * 4, x.len());
    let cp = codes.as_ptr();
    let mask = _mm_set1_epi8(0x03);
    dot_grouped(scales, gs, x, |i| {
        // Four bytes hold columns i..i+16, column 4k+j in bits 2j of byte k. Shifting 16-bit
        // lanes lets bits of the next byte in above bit 1, which the mask removes; two rounds of
        // interleaving put (byte k >> 2j) at position 4k+j.
        let b = _mm_cvtsi32_si128((cp.add(i / 4) as *const i32).read_unaligned());
        let s01 = _mm_unpacklo_epi8(b, _mm_srli_epi16::<2>(b));
        let s23 = _mm_unpacklo_epi8(_mm_srli_epi16::<4>(b), _mm_srli_epi16::<6>(b));
        u8x16_to_f32(_mm_and_si128(_mm_unpacklo_epi16(s01, s23), mask))
    })
}
