//! ap8 views on AVX-512 (quant::planes): bit-serial. Each group's codes are built as f32 lanes from
//! the bit masks of their planes (the top chunk's two bits by `pext`), one masked add a plane per
//! 16 lanes, then multiplied with x times the group's scale; the group's min times its sum of x is
//! added per group. The same contract as the other kernels of x86.rs.

use super::*;
use crate::format::ap8;
use crate::quant::planes::{geometry, part_tables, table_at, Tables};

/// Every (scale, min) of `n` groups at width `k` from their parent pairs (f16 bytes `s8`, `m8`)
/// and, for the corrected widths, their correction bytes: `ap8::group_params`, 16 groups at a
/// time with the same f32 operations in the same order, rounded to f16 as F16C rounds (to
/// nearest, ties to even), as f32 values.
///
/// # Safety
/// AVX-512F and F16C; `s8`, `m8` hold 2 n bytes, `corr` n bytes where given, `s`, `m` n values.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(in crate::quant) unsafe fn ap8_params(k: u8, tables: Tables, s: &mut [f32], m: &mut [f32]) {
    let (s8, m8, corr) = tables;
    let n = s.len();
    let h = (1u32 << (ap8::MAX_WIDTH - k.min(ap8::MAX_WIDTH))) as f32;
    let mut i = 0;
    while i + 16 <= n {
        let ps = _mm512_cvtph_ps(_mm256_loadu_si256(s8.as_ptr().add(2 * i) as *const __m256i));
        let pm = _mm512_cvtph_ps(_mm256_loadu_si256(m8.as_ptr().add(2 * i) as *const __m256i));
        let (vs, vm) = if k >= ap8::MAX_WIDTH {
            (ps, pm)
        } else {
            let sm = _mm512_mul_ps(ps, _mm512_set1_ps(h));
            let mm = _mm512_add_ps(pm, _mm512_mul_ps(ps, _mm512_set1_ps((h - 1.0) * 0.5)));
            let (sm, mm) = match corr {
                Some(c) => {
                    let v =
                        _mm512_cvtepi8_epi32(_mm_loadu_si128(c.as_ptr().add(i) as *const __m128i));
                    let a = _mm512_cvtepi32_ps(_mm512_srai_epi32::<28>(_mm512_slli_epi32::<28>(v)));
                    let b = _mm512_cvtepi32_ps(_mm512_srai_epi32::<4>(v));
                    let one = _mm512_set1_ps(1.0);
                    let t = _mm512_add_ps(one, _mm512_div_ps(a, _mm512_set1_ps(96.0)));
                    let d = _mm512_div_ps(_mm512_mul_ps(b, sm), _mm512_set1_ps(24.0));
                    (_mm512_mul_ps(sm, t), _mm512_add_ps(mm, d))
                }
                None => (sm, mm),
            };
            const RNE: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            (
                _mm512_cvtph_ps(_mm512_cvtps_ph::<RNE>(sm)),
                _mm512_cvtph_ps(_mm512_cvtps_ph::<RNE>(mm)),
            )
        };
        _mm512_storeu_ps(s.as_mut_ptr().add(i), vs);
        _mm512_storeu_ps(m.as_mut_ptr().add(i), vm);
        i += 16;
    }
    for j in i..n {
        let (a, b) = table_at(k, tables, j);
        (s[j], m[j]) = (a.to_f32(), b.to_f32());
    }
}

/// out[i] = dot(row rows.start + i, x) for an ap8 view.
///
/// # Safety
/// AVX-512F, BMI2 and F16C; the matrix is an ap8 view whose prefix holds its width's pieces
/// (`Matrix::check`), x has `cols` values and out one a row.
#[target_feature(enable = "avx512f,avx2,fma,f16c,bmi2")]
pub(in crate::quant) unsafe fn ap8_rows(
    m: &Matrix,
    x: &[f32],
    rows: Range<usize>,
    out: &mut [f32],
) {
    let (p, k) = geometry(m);
    let (cols, g) = (m.cols, m.group_size);
    let gpr = cols / g;
    let mut xsums = vec![0f32; gpr];
    group_sums(x, g, &mut xsums);
    // Every group of the rows at once: a row of ap8 often holds fewer than 16 groups.
    let (g0, ng) = (rows.start * gpr, rows.len() * gpr);
    let (s8, m8, corr) = part_tables(m.codes, &p, k);
    let (mut sv, mut mv) = (vec![0f32; ng], vec![0f32; ng]);
    let tables = (&s8[2 * g0..], &m8[2 * g0..], corr.map(|c| &c[g0..]));
    ap8_params(k, tables, &mut sv, &mut mv);
    let b = m.codes.as_ptr();
    // Lane weights of the top chunk's two bits, then of each plane read.
    let wt: Vec<__m512> = (0..k)
        .map(|j| _mm512_set1_ps((1u32 << (k - 1 - j)) as f32))
        .collect();
    for (i, (o, r)) in out.iter_mut().zip(rows).enumerate() {
        let (sv, mv) = (&sv[i * gpr..(i + 1) * gpr], &mv[i * gpr..(i + 1) * gpr]);
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut macc = 0f32;
        for gi in 0..gpr {
            let s = _mm512_set1_ps(sv[gi]);
            for blk in (0..g).step_by(64) {
                let (e, c) = (r * cols + gi * g + blk, gi * g + blk);
                let t0 = (b.add(p.top + e / 4) as *const u64).read_unaligned();
                let t1 = (b.add(p.top + e / 4 + 8) as *const u64).read_unaligned();
                const HI: u64 = 0xaaaa_aaaa_aaaa_aaaa;
                const LO: u64 = 0x5555_5555_5555_5555;
                let mut masks = [0u64; 8];
                masks[0] = _pext_u64(t0, HI) | (_pext_u64(t1, HI) << 32);
                masks[1] = _pext_u64(t0, LO) | (_pext_u64(t1, LO) << 32);
                for (t, mk) in masks[2..usize::from(k)].iter_mut().enumerate() {
                    *mk = (b.add(p.planes[t] + e / 8) as *const u64).read_unaligned();
                }
                for (ci, a) in acc.iter_mut().enumerate() {
                    let sh = 16 * ci;
                    let mut q = _mm512_maskz_mov_ps((masks[0] >> sh) as __mmask16, wt[0]);
                    for j in 1..usize::from(k) {
                        q = _mm512_mask_add_ps(q, (masks[j] >> sh) as __mmask16, q, wt[j]);
                    }
                    let xv = _mm512_mul_ps(_mm512_loadu_ps(x.as_ptr().add(c + sh)), s);
                    *a = _mm512_fmadd_ps(q, xv, *a);
                }
            }
            macc += mv[gi] * xsums[gi];
        }
        let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        *o = _mm512_reduce_add_ps(sum) + macc;
    }
}
