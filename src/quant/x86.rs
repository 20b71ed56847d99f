//! AVX2 + FMA + F16C kernels, and AVX-512 ones (int4/int2, f16) where the CPU has it. Loads are
//! unaligned: only the 64-byte alignment of each sub-array is guaranteed, not that of a row inside
//! it.
//!
//! The integer kernels take two rows at a time (independent accumulators hide the FMA latency) and
//! widen one byte of codes per 32-bit lane; for int4/int2 the input is reordered once per call to
//! match (`with_reordered_x`), so a byte's nibbles or 2-bit fields need one shift and mask each
//! (on AVX-512, one shift and a 16-entry table lookup, `vpermps`, that also converts to f32).
//! Scales are converted 16 groups at a time, and codes are prefetched ahead of the products
//! (benches/results/2026-11-23-h100-cpu-int-kernels.md, 2026-11-23-h100-coop-waits.md).
//!
//! int8, int4, int2 and MXFP4 on AVX-512 VNNI (`packed_vnni_rows`) round x to 16-bit integers per
//! group and multiply codes and x bytes in `vpdpbusd`: fewer instructions per byte of codes than
//! the f32 table kernel (benches/results/2026-11-28-h100-cpu-int4-vnni.md).
//!
//! f16 on AVX-512F (`f16_rows_512`) takes four rows at a time, x loaded once for the four
//! (benches/results/2026-11-28-h200-cpu-f16-avx512.md).
//!
//! Every function here is `unsafe` for two reasons, checked by the callers in mod.rs: the CPU must
//! have AVX2, FMA and F16C (detected at run time; for `matvec_rows`, the features of the `Level`
//! it is given), and the slices must be as long as the matrix shape says (`Matrix::check`,
//! `Matrix::check_call`).

use std::arch::x86_64::*;
use std::ops::Range;
use std::sync::OnceLock;

use super::{scalar, Matrix, WeightKind};

mod planes;
mod tile;
mod vnni;

#[cfg(test)]
pub(super) use planes::ap8_params;
pub(super) use planes::{ap8_dequant_rows_512, ap8_rows, ap8_vnni_rows};
pub(super) use tile::{dequant_rows_512, matmul_f32_512, TileRows};
pub(super) use vnni::packed_vnni_rows;

pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// BMI2 (`pext`: the ap8 kernel's top bits), present on every AVX-512 CPU but checked all the same.
pub(super) fn has_bmi2() -> bool {
    is_x86_feature_detected!("bmi2")
}

/// The kernels `matvec_rows` may take, each level adding CPU features to the one before: the
/// dispatch takes the CPU's own (`Level::detected`), tests each one up to it, so that every kernel
/// is checked against the scalar one on a CPU that has them all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Level {
    /// AVX2, FMA and F16C.
    Avx2,
    /// Adds AVX-512F and VL: int4 and int2 through a 16-entry table (`packed_rows_512`), f16 four rows
    /// at a time (`f16_rows_512`).
    Avx512,
    /// Adds AVX-512BW and VNNI: int8, int4 and int2 through the integer dot product (`packed_vnni_rows`).
    Avx512Vnni,
}

impl Level {
    #[cfg(test)]
    pub(super) const ALL: [Level; 3] = [Level::Avx2, Level::Avx512, Level::Avx512Vnni];

    /// The highest level this CPU has (detected once), None without AVX2, FMA or F16C.
    pub(super) fn detected() -> Option<Level> {
        static LEVEL: OnceLock<Option<Level>> = OnceLock::new();
        *LEVEL.get_or_init(|| {
            if !available() {
                return None;
            }
            // (VL: every AVX-512 CPU but Xeon Phi; it lets 256- and 128-bit operations reach
            // registers 16-31, which the prefill tiles' accumulators need.)
            let f = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl");
            Some(
                if f && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vnni")
                {
                    Level::Avx512Vnni
                } else if f {
                    Level::Avx512
                } else {
                    Level::Avx2
                },
            )
        })
    }
}

/// # Safety
/// The CPU has the features of `level` (at most `Level::detected()`), and the slices are as long
/// as the matrix shape says.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn matvec_rows(
    level: Level,
    m: &Matrix,
    x: &[f32],
    xsums: &[f32],
    rows: Range<usize>,
    out: &mut [f32],
) {
    let rb = m.row_bytes();
    let gs = m.group_size;
    // SAFETY (the AVX-512 calls): the caller guarantees `level`'s features (AVX-512F, and BW and
    // VNNI for `packed_vnni_rows`) and the slices' lengths.
    if packed_vnni_takes(level, m) {
        packed_vnni_rows(m, x, rows, out);
        return;
    }
    let avx512 = level >= Level::Avx512;
    if avx512 && m.kind.has_mins() && packed_rows_512(m, x, xsums, rows.clone(), out) {
        return;
    }
    if avx512 && m.kind == WeightKind::F16 {
        f16_rows_512(m, x, rows, out);
        return;
    }
    match m.kind {
        WeightKind::Int8 => grouped_rows(m, x, xsums, rows, out, |p, i| {
            let lo = _mm_loadl_epi64(p.add(i) as *const __m128i);
            let hi = _mm_loadl_epi64(p.add(i + 8) as *const __m128i);
            [
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
            ]
        }),
        WeightKind::Int4 => with_reordered_x(x, 16, 8, |xr| {
            let mask = _mm256_set1_epi32(0x0f);
            grouped_rows(m, xr, xsums, rows, out, |p, i| {
                // Eight bytes hold columns i..i+16, column 2k in the low nibble of byte k: one
                // byte per 32-bit lane, its nibbles are columns 2k and 2k+1 (x is reordered to
                // match: the 8 even columns, then the 8 odd ones).
                let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(i / 2) as *const __m128i));
                [
                    _mm256_cvtepi32_ps(_mm256_and_si256(b, mask)),
                    _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(b)),
                ]
            })
        }),
        WeightKind::Int2 if gs.is_multiple_of(32) => with_reordered_x(x, 32, 8, |xr| {
            let mask = _mm256_set1_epi32(0x03);
            grouped_rows(m, xr, xsums, rows, out, |p, i| {
                // Eight bytes hold columns i..i+32, column 4k+j in bits 2j of byte k: one byte
                // per lane, x reordered to columns 4k+0 (k = 0..8), then 4k+1, 4k+2, 4k+3.
                let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(i / 4) as *const __m128i));
                [
                    _mm256_cvtepi32_ps(_mm256_and_si256(b, mask)),
                    _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32::<2>(b), mask)),
                    _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32::<4>(b), mask)),
                    _mm256_cvtepi32_ps(_mm256_srli_epi32::<6>(b)),
                ]
            })
        }),
        WeightKind::Int3 => with_reordered_x(x, 32, 8, |xr| {
            let (mask, four) = (_mm256_set1_epi32(0x03), _mm256_set1_epi32(0x04));
            // Lane k (low byte k of 32 columns) takes high byte k % 4 of its 4, nibble k / 4.
            let nib = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
            let lo_bytes = m.cols / 4;
            grouped_rows(m, xr, xsums, rows, out, |p, i| {
                // As int2 (x reordered alike), each code's high bit (formats' int3_hi_bit) put
                // in at bit 2: a high byte's nibble holds four codes of a low byte.
                let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(i / 4) as *const __m128i));
                let h4 = (p.add(lo_bytes + i / 8) as *const i32).read_unaligned();
                let h = _mm256_cvtepu8_epi32(_mm_set1_epi32(h4));
                let h = _mm256_srlv_epi32(h, nib);
                let f = |lo: __m256i, hb: __m256i| {
                    _mm256_cvtepi32_ps(_mm256_or_si256(
                        _mm256_and_si256(lo, mask),
                        _mm256_and_si256(hb, four),
                    ))
                };
                [
                    f(b, _mm256_slli_epi32::<2>(h)),
                    f(_mm256_srli_epi32::<2>(b), _mm256_slli_epi32::<1>(h)),
                    f(_mm256_srli_epi32::<4>(b), h),
                    f(_mm256_srli_epi32::<6>(b), _mm256_srli_epi32::<1>(h)),
                ]
            })
        }),
        _ => {
            let gpr = m.groups_per_row();
            for (o, r) in out.iter_mut().zip(rows) {
                let codes = &m.codes[r * rb..(r + 1) * rb];
                let side = r * gpr * 2..(r + 1) * gpr * 2;
                *o = match m.kind {
                    WeightKind::F32 => dot_f32(codes, x),
                    WeightKind::F16 => dot_f16(codes, x),
                    WeightKind::Bf16 => dot_bf16(codes, x),
                    // int2 in groups that are not a multiple of 32 columns.
                    _ => {
                        dot_int2(codes, &m.scales[side.clone()], gs, x)
                            + dot_f16(&m.mins[side], &xsums[..gpr])
                    }
                };
            }
        }
    }
}

thread_local! {
    /// The reordered input of the 4-bit and 2-bit kernels, kept per thread between calls.
    static REORDERED_X: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on x reordered for the packed kernels, whose vectors take one byte of codes per
/// 32-bit lane: in each `block` columns (x.len() is a multiple of it; `lanes` bytes of codes),
/// the columns at the same position of their byte come together: s = block / lanes runs of
/// `lanes`, run j holding columns j, j + s, j + 2s, ...
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn with_reordered_x(x: &[f32], block: usize, lanes: usize, f: impl FnOnce(&[f32])) {
    debug_assert_eq!(x.len() % block, 0);
    let per_byte = block / lanes;
    REORDERED_X.with(|cell| {
        let mut xr = cell.borrow_mut();
        xr.resize(x.len(), 0.0);
        for (src, dst) in x.chunks_exact(block).zip(xr.chunks_exact_mut(block)) {
            for (k, byte) in src.chunks_exact(per_byte).enumerate() {
                for (j, &v) in byte.iter().enumerate() {
                    dst[lanes * j + k] = v;
                }
            }
        }
        f(&xr);
    });
}

/// The grouped kernels of one vector width: `$rows` (the rows of a quantized matrix, two at a
/// time: independent accumulators hide the FMA latency, and each row's arithmetic is the same as
/// alone, so results do not depend on the pairing; plus the min term for int4/int2) over `$dot`
/// (sum_g s_g * sum_{i in g} q_i x_i for R rows at once). `decode(codes, i)` gives a row's codes
/// of columns i..i + N * lanes as N vectors of f32 in the order of x (which the caller may have
/// reordered to match); group sizes are multiples of N * lanes. N accumulators per row and group,
/// summed pairwise. The callers checked that every row has x.len() columns of codes and
/// x.len() / gs scales.
macro_rules! grouped_kernels {
    ($rows:ident, $dot:ident, $feature:literal, $v:ty, $lanes:literal, $zero:ident, $fmadd:ident,
     $add:ident, $load:ident, $set1:ident, $hsum:path) => {
        #[target_feature(enable = $feature)]
        #[inline]
        unsafe fn $rows<const N: usize>(
            m: &Matrix,
            x: &[f32],
            xsums: &[f32],
            rows: Range<usize>,
            out: &mut [f32],
            decode: impl Fn(*const u8, usize) -> [$v; N],
        ) {
            let (rb, gpr, gs) = (m.row_bytes(), m.groups_per_row(), m.group_size);
            let gb = gs * m.kind.bits() / 8;
            let codes = |r: usize| m.codes[r * rb..(r + 1) * rb].as_ptr();
            let scales = |r: usize| m.scales[r * gpr * 2..(r + 1) * gpr * 2].as_ptr() as *const u16;
            let mins = |r: usize, v: f32| {
                if m.kind.has_mins() {
                    v + dot_f16(&m.mins[r * gpr * 2..(r + 1) * gpr * 2], &xsums[..gpr])
                } else {
                    v
                }
            };
            let start = rows.start;
            let mut pairs = out.chunks_exact_mut(2);
            for (p, o) in pairs.by_ref().enumerate() {
                let r = start + 2 * p;
                let v = $dot::<2, N>(
                    [codes(r), codes(r + 1)],
                    [scales(r), scales(r + 1)],
                    (gs, gb),
                    x,
                    &decode,
                );
                o[0] = mins(r, v[0]);
                o[1] = mins(r + 1, v[1]);
            }
            if let [o] = pairs.into_remainder() {
                let r = rows.end - 1;
                *o = mins(
                    r,
                    $dot::<1, N>([codes(r)], [scales(r)], (gs, gb), x, &decode)[0],
                );
            }
        }

        #[target_feature(enable = $feature)]
        #[inline]
        unsafe fn $dot<const R: usize, const N: usize>(
            codes: [*const u8; R],
            scales: [*const u16; R],
            (gs, gb): (usize, usize),
            x: &[f32],
            decode: &impl Fn(*const u8, usize) -> [$v; N],
        ) -> [f32; R] {
            let xp = x.as_ptr();
            let mut acc = [$zero(); R];
            let mut i = 0;
            let groups = x.len() / gs;
            // Each row's scales as f32, 16 groups at a time (one conversion per 8), so a group's
            // scale is a broadcast from memory, not a conversion and a shuffle per group.
            let mut sf = [[0.0f32; 16]; R];
            for g in 0..groups {
                if g % 16 == 0 {
                    for r in 0..R {
                        scales_f32(scales[r].add(g), (groups - g).min(16), &mut sf[r]);
                    }
                }
                // Each row's codes PREFETCH_AHEAD bytes on, once per group (gb bytes of codes;
                // past a row's end it is the next row's start, and a prefetch never faults).
                for c in codes {
                    _mm_prefetch::<_MM_HINT_T0>(
                        c.wrapping_add(g * gb + PREFETCH_AHEAD) as *const i8
                    );
                }
                let mut a = [[$zero(); N]; R];
                let end = i + gs;
                while i < end {
                    for r in 0..R {
                        let q = decode(codes[r], i);
                        for n in 0..N {
                            a[r][n] = $fmadd(q[n], $load(xp.add(i + $lanes * n)), a[r][n]);
                        }
                    }
                    i += $lanes * N;
                }
                for r in 0..R {
                    let s = $set1(sf[r][g % 16]);
                    let mut width = N;
                    while width > 1 {
                        width /= 2;
                        for n in 0..width {
                            a[r][n] = $add(a[r][n], a[r][n + width]);
                        }
                    }
                    acc[r] = $fmadd(s, a[r][0], acc[r]);
                }
            }
            acc.map(|v| $hsum(v))
        }
    };
}

grouped_kernels!(
    grouped_rows,
    dot_grouped,
    "avx2,fma,f16c",
    __m256,
    8,
    _mm256_setzero_ps,
    _mm256_fmadd_ps,
    _mm256_add_ps,
    _mm256_loadu_ps,
    _mm256_set1_ps,
    hsum
);
grouped_kernels!(
    grouped_rows_512,
    dot_grouped_512,
    "avx512f,avx2,fma,f16c",
    __m512,
    16,
    _mm512_setzero_ps,
    _mm512_fmadd_ps,
    _mm512_add_ps,
    _mm512_loadu_ps,
    _mm512_set1_ps,
    _mm512_reduce_add_ps
);

/// `n` (at most 16) f16 scales from `src` as f32 into `dst`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scales_f32(src: *const u16, n: usize, dst: &mut [f32; 16]) {
    let mut k = 0;
    while k + 8 <= n {
        let v = _mm256_cvtph_ps(_mm_loadu_si128(src.add(k) as *const __m128i));
        _mm256_storeu_ps(dst.as_mut_ptr().add(k), v);
        k += 8;
    }
    while k < n {
        let bits = src.add(k).read_unaligned() as i32;
        dst[k] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)));
        k += 1;
    }
}

/// f16 rows on AVX-512. Rows of a narrow x (at most `NARROW_X` columns, which stay in L1) go one
/// at a time, each line prefetched `STREAM_AHEAD` bytes on: one sequential stream per thread,
/// which a 2-core Zen 5 reads ~1.5x faster than four interleaved row streams
/// (benches/results/2026-12-02-cpu-issue56-cpu-path.md). A wide x goes four rows at a time, so
/// each 32 columns of x are loaded once for the four (the one-row kernel loads 8 bytes of x per
/// 2 bytes of weights, from L2 for a 14336-wide x). A row's sum (two 16-lane accumulators, columns
/// 32 j .. 32 j + 15 and the 16 after, added lane by lane and reduced, then the tail columns in
/// order) has the same bits in either form, so splitting rows between threads changes nothing.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn f16_rows_512(m: &Matrix, x: &[f32], rows: Range<usize>, out: &mut [f32]) {
    let mut r = rows.start;
    if x.len() > NARROW_X {
        while r + 4 <= rows.end {
            f16_block_512::<4>(m, x, r, PREFETCH_AHEAD, &mut out[r - rows.start..]);
            r += 4;
        }
    }
    while r < rows.end {
        f16_block_512::<1>(m, x, r, STREAM_AHEAD, &mut out[r - rows.start..]);
        r += 1;
    }
}

/// Columns of an x that the f16 kernel streams one row at a time (16 KB of f32).
const NARROW_X: usize = 4096;

/// How far ahead the one-row f16 kernel prefetches its stream, bytes.
const STREAM_AHEAD: usize = 8192;

/// Rows r .. r + R of an f16 matrix into out[..R] (`f16_rows_512`).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn f16_block_512<const R: usize>(
    m: &Matrix,
    x: &[f32],
    r: usize,
    ahead: usize,
    out: &mut [f32],
) {
    let rb = m.row_bytes();
    let full = x.len() / 32 * 32;
    let xp = x.as_ptr();
    let wp: [*const u8; R] = std::array::from_fn(|k| m.codes.as_ptr().add((r + k) * rb));
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let mut i = 0;
    while i < full {
        for p in &wp {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(2 * i + ahead) as *const i8);
        }
        let x0 = _mm512_loadu_ps(xp.add(i));
        let x1 = _mm512_loadu_ps(xp.add(i + 16));
        for (a, p) in acc.iter_mut().zip(&wp) {
            let w0 = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i) as *const __m256i));
            let w1 = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i + 32) as *const __m256i));
            a[0] = _mm512_fmadd_ps(w0, x0, a[0]);
            a[1] = _mm512_fmadd_ps(w1, x1, a[1]);
        }
        i += 32;
    }
    for (k, a) in acc.iter().enumerate() {
        let codes = &m.codes[(r + k) * rb..(r + k + 1) * rb];
        let mut v = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]));
        for (j, xj) in x.iter().enumerate().skip(full) {
            v += scalar::f16_at(codes, j) * xj;
        }
        out[k] = v;
    }
}

/// int4 and int2 on AVX-512 (16 bytes of codes per step: 32 or 64 columns; the group size a
/// multiple of it). Returns false, doing nothing, where that does not apply.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn packed_rows_512(
    m: &Matrix,
    x: &[f32],
    xsums: &[f32],
    rows: Range<usize>,
    out: &mut [f32],
) -> bool {
    let load = |p: *const u8| _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
    match m.kind {
        // A code becomes its f32 value through a 16-entry table (vpermps reads only the low 4
        // bits of each lane's index): one permute instead of a mask and a conversion, which
        // shared the FMA's port; the values are the same integers, so the results are too.
        WeightKind::Int4 if m.group_size.is_multiple_of(32) => with_reordered_x(x, 32, 16, |xr| {
            let lut = _mm512_setr_ps(
                0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                15.0,
            );
            grouped_rows_512(m, xr, xsums, rows, out, |p, i| {
                let b = load(p.add(i / 2));
                [
                    _mm512_permutexvar_ps(b, lut),
                    _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(b), lut),
                ]
            })
        }),
        // For 2-bit fields the table repeats 0, 1, 2, 3: index bits 2-3 (the next field) are
        // ignored.
        WeightKind::Int2 if m.group_size.is_multiple_of(64) => with_reordered_x(x, 64, 16, |xr| {
            let lut = _mm512_setr_ps(
                0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0,
            );
            grouped_rows_512(m, xr, xsums, rows, out, |p, i| {
                let b = load(p.add(i / 4));
                [
                    _mm512_permutexvar_ps(b, lut),
                    _mm512_permutexvar_ps(_mm512_srli_epi32::<2>(b), lut),
                    _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(b), lut),
                    _mm512_permutexvar_ps(_mm512_srli_epi32::<6>(b), lut),
                ]
            })
        }),
        WeightKind::Int3 => with_reordered_x(x, 64, 16, |xr| {
            let lut = _mm512_setr_ps(
                0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0,
            );
            // Lane l (low byte l of a block) takes high byte 4 (l / 8) + l % 4, nibble (l / 4) % 2.
            let pick = _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7);
            let nib = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
            let lo_bytes = m.cols / 4;
            grouped_rows_512(m, xr, xsums, rows, out, |p, i| {
                let b = load(p.add(i / 4));
                let h8 = _mm_loadl_epi64(p.add(lo_bytes + i / 8) as *const __m128i);
                let h = _mm512_srlv_epi32(
                    _mm512_permutexvar_epi32(pick, _mm512_cvtepu8_epi32(h8)),
                    nib,
                );
                // The table index: bits 0-1 from the low field, bit 2 the code's high bit (bit
                // 3 and up are ignored: the table repeats every 8).
                let code = |lo: __m512i, hb: __m512i| {
                    _mm512_permutexvar_ps(
                        _mm512_ternarylogic_epi32::<0xE4>(lo, hb, _mm512_set1_epi32(3)),
                        lut,
                    )
                };
                [
                    code(b, _mm512_slli_epi32::<2>(h)),
                    code(_mm512_srli_epi32::<2>(b), _mm512_slli_epi32::<1>(h)),
                    code(_mm512_srli_epi32::<4>(b), h),
                    code(_mm512_srli_epi32::<6>(b), _mm512_srli_epi32::<1>(h)),
                ]
            })
        }),
        _ => return false,
    }
    true
}

/// Whether `packed_vnni_rows` computes `m` at `level` (which then needs no group sums of x from
/// the caller).
pub(super) fn packed_vnni_takes(level: Level, m: &Matrix) -> bool {
    level == Level::Avx512Vnni && m.kind.is_quantized() && m.group_size <= 512
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

/// How far ahead of the weights being multiplied the 16-bit kernels prefetch: the hardware
/// prefetchers alone leave a thread short of what a plain read streams
/// (benches/results/2026-11-22-h100-host-cpu-stream.md).
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

/// Widen 16 unsigned byte codes to two vectors of eight f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn u8x16_to_f32(v: __m128i) -> [__m256; 2] {
    [
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(v, v))),
    ]
}

/// int2 in groups that are not a multiple of 32 columns (16 columns a step, x in column order).
/// Byte and 16-bit lane shuffles only: the variable shifts (vpsrlvd) are slow on some AMD cores.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_int2(codes: &[u8], scales: &[u8], gs: usize, x: &[f32]) -> f32 {
    debug_assert_eq!(codes.len() * 4, x.len());
    debug_assert_eq!(scales.len() * gs, 2 * x.len());
    let mask = _mm_set1_epi8(0x03);
    let decode = |p: *const u8, i: usize| {
        // Four bytes hold columns i..i+16, column 4k+j in bits 2j of byte k. Shifting 16-bit
        // lanes lets bits of the next byte in above bit 1, which the mask removes; two rounds of
        // interleaving put (byte k >> 2j) at position 4k+j.
        let b = _mm_cvtsi32_si128((p.add(i / 4) as *const i32).read_unaligned());
        let s01 = _mm_unpacklo_epi8(b, _mm_srli_epi16::<2>(b));
        let s23 = _mm_unpacklo_epi8(_mm_srli_epi16::<4>(b), _mm_srli_epi16::<6>(b));
        u8x16_to_f32(_mm_and_si128(_mm_unpacklo_epi16(s01, s23), mask))
    };
    dot_grouped::<1, 2>(
        [codes.as_ptr()],
        [scales.as_ptr() as *const u16],
        (gs, gs / 4),
        x,
        &decode,
    )[0]
}

/// int4k's and int2k's group parameters as f16 bits (quant::subscales): for each group's (a, b)
/// in `ab`, f16(d a) into `s` and f16(dm b) into `m`, eight groups a step (F16C's rounding:
/// nearest, ties to even, as `half`'s).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn subscales_expand(
    kind: WeightKind,
    ab: &[u8],
    (d, dm): (f32, f32),
    s: &mut [u16],
    m: &mut [u16],
) {
    let n = ab.len() / kind.scale_bytes();
    debug_assert!(s.len() >= n && m.len() >= n);
    let (dv, mv) = (_mm256_set1_ps(d), _mm256_set1_ps(dm));
    let mut g = 0;
    while g + 8 <= n {
        let (a, b) = if kind == WeightKind::Int2k {
            // Eight bytes: a in the low nibble, b (signed) in the high one.
            let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(ab.as_ptr().add(g) as *const __m128i));
            let a = _mm256_and_si256(v, _mm256_set1_epi32(15));
            (a, _mm256_srai_epi32::<28>(_mm256_slli_epi32::<24>(v)))
        } else {
            // Eight (u8, i8) pairs as 16-bit lanes.
            let v = _mm_loadu_si128(ab.as_ptr().add(2 * g) as *const __m128i);
            let a = _mm256_cvtepu16_epi32(_mm_and_si128(v, _mm_set1_epi16(0xff)));
            (a, _mm256_cvtepi16_epi32(_mm_srai_epi16::<8>(v)))
        };
        let a = _mm256_mul_ps(_mm256_cvtepi32_ps(a), dv);
        let b = _mm256_mul_ps(_mm256_cvtepi32_ps(b), mv);
        let hs = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(a);
        let hm = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(b);
        _mm_storeu_si128(s.as_mut_ptr().add(g) as *mut __m128i, hs);
        _mm_storeu_si128(m.as_mut_ptr().add(g) as *mut __m128i, hm);
        g += 8;
    }
    if g < n {
        let sb = kind.scale_bytes();
        super::subscales::expand_scalar(kind, &ab[sb * g..], (d, dm), &mut s[g..n], &mut m[g..n]);
    }
}
