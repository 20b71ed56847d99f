//! ap8 views on AVX-512 (quant::planes). With VNNI (`ap8_vnni_rows`): codes built as bytes in
//! int2's field order and multiplied with x rounded to 16-bit integers, as the int2 kernel does.
//! Without (`ap8_rows`): bit-serial, each group's codes built as f32 lanes from the bit masks of
//! their planes (the top chunk's two bits by `pext`), one masked add a plane per 16 lanes, then
//! multiplied with x times the group's scale; the group's min times its sum of x is added per
//! group. The same contract as the other kernels of x86.rs
//! (benches/results/2026-12-04-cpu-issue54-ap8.md).

use super::*;
use crate::format::ap8;
use crate::quant::planes::{geometry, part_tables, Tables};
use half::f16;

/// The constants of `params16` at width `k`.
#[derive(Clone, Copy)]
struct ParamK {
    k: u8,
    /// 2^(8 - k) and (h - 1) / 2: a parent's step and bucket midpoint at this width.
    h: __m512,
    mid: __m512,
    /// A nibble's correction factors: `1 + a / 96` and `b / 24` for a, b read as i4.
    fa: __m512,
    fb: __m512,
}

impl ParamK {
    #[target_feature(enable = "avx512f")]
    unsafe fn new(k: u8) -> Self {
        let h = (1u32 << (ap8::MAX_WIDTH - k.min(ap8::MAX_WIDTH))) as f32;
        // A nibble read as i4 (index 8..15 is -8..-1).
        let i4 = _mm512_sub_ps(iota(), _mm512_maskz_mov_ps(0xff00, _mm512_set1_ps(16.0)));
        ParamK {
            k,
            h: _mm512_set1_ps(h),
            mid: _mm512_set1_ps((h - 1.0) * 0.5),
            fa: _mm512_add_ps(_mm512_set1_ps(1.0), _mm512_div_ps(i4, _mm512_set1_ps(96.0))),
            fb: _mm512_div_ps(i4, _mm512_set1_ps(24.0)),
        }
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn iota() -> __m512 {
    _mm512_setr_ps(
        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
    )
}

/// f32 lanes rounded to f16 and back (round to nearest even).
#[target_feature(enable = "avx512f,f16c")]
unsafe fn round16(v: __m512) -> __m512 {
    const RNE: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    _mm512_cvtph_ps(_mm512_cvtps_ph::<RNE>(v))
}

/// Row `r`'s 16 possible parent scales `f16(d a)` and mins `f16(-(dm b))`, a and b in 0..16.
#[target_feature(enable = "avx512f,f16c")]
unsafe fn row_luts(t: &Tables, r: usize) -> (__m512, __m512) {
    let at = t.p.pairs + 4 * r;
    let f = |o: usize| f16::from_le_bytes([t.bytes[at + o], t.bytes[at + o + 1]]).to_f32();
    let s = round16(_mm512_mul_ps(_mm512_set1_ps(f(0)), iota()));
    // -(dm b) as (-dm) b: the same product, negated exactly.
    let m = _mm512_mul_ps(_mm512_set1_ps(-f(2)), iota());
    (s, round16(m))
}

/// Up to 16 of a row's (scale, min) from their parent bytes `v` (a 16's byte a lane), their
/// row's `luts` and, at the corrected widths, their correction bytes `c` (a 64's byte a lane
/// per four lanes): `ap8::group_params` of `ap8::sub_pair`, bit for bit.
#[target_feature(enable = "avx512f,f16c")]
#[inline]
unsafe fn params16(
    pk: &ParamK,
    (lut_s, lut_m): (__m512, __m512),
    v: __m512i,
    c: Option<__m512i>,
) -> (__m512, __m512) {
    let fifteen = _mm512_set1_epi32(15);
    let ps = _mm512_permutexvar_ps(_mm512_and_si512(v, fifteen), lut_s);
    let pm = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v), lut_m);
    if pk.k >= ap8::MAX_WIDTH {
        return (ps, pm);
    }
    let sm = _mm512_mul_ps(ps, pk.h);
    let mm = _mm512_add_ps(pm, _mm512_mul_ps(ps, pk.mid));
    let (sm, mm) = match c {
        Some(cv) => {
            let a = _mm512_permutexvar_ps(_mm512_and_si512(cv, fifteen), pk.fa);
            let b = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(cv), pk.fb);
            (
                _mm512_mul_ps(sm, a),
                _mm512_add_ps(mm, _mm512_mul_ps(sm, b)),
            )
        }
        None => (sm, mm),
    };
    (round16(sm), round16(mm))
}

/// Every (scale, min) of the 16s `j0..j0 + s.len()` of a part at width `k` (`j0` a multiple of
/// 4: rows start on whole 64s), by `params16`, up to 16 of a row's 16s at a time.
///
/// # Safety
/// AVX-512F and F16C; `t.bytes` holds the part's tables at width `k` for those 16s.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(in crate::quant) unsafe fn ap8_params(
    k: u8,
    t: Tables,
    j0: usize,
    s: &mut [f32],
    m: &mut [f32],
) {
    let n = s.len();
    let spr = t.p.cols / ap8::SUB;
    let pk = ParamK::new(k);
    let spread = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let (mut row, mut luts) = (usize::MAX, (iota(), iota()));
    let mut i = 0;
    while i < n {
        let j = j0 + i;
        let r = j / spr;
        let cnt = (n - i).min(16).min((r + 1) * spr - j);
        if r != row {
            luts = row_luts(&t, r);
            row = r;
        }
        let mut sb = [0u8; 16];
        sb[..cnt].copy_from_slice(&t.bytes[t.p.subs + j..t.p.subs + j + cnt]);
        let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(sb.as_ptr() as *const __m128i));
        let c = t.corr.map(|c| {
            let (c0, nb) = (c + j * ap8::SUB / ap8::CORR_GROUP, cnt.div_ceil(4));
            let mut cb = [0u8; 4];
            cb[..nb].copy_from_slice(&t.bytes[c0..c0 + nb]);
            let four = _mm_shuffle_epi8(_mm_cvtsi32_si128(i32::from_le_bytes(cb)), spread);
            _mm512_cvtepu8_epi32(four)
        });
        let (vs, vm) = params16(&pk, luts, v, c);
        let keep = ((1u32 << cnt) - 1) as __mmask16;
        _mm512_mask_storeu_ps(s.as_mut_ptr().add(i), keep, vs);
        _mm512_mask_storeu_ps(m.as_mut_ptr().add(i), keep, vm);
        i += cnt;
    }
}

/// Every (scale, min) of `rows` at width `k` (`ap8_params`): all of the rows' 16s at once. Into
/// `sv`, `mv` (resized).
///
/// # Safety
/// AVX-512F and F16C; `m` is an ap8 view of part `p` whose prefix holds its width's tables.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn rows_params(
    m: &Matrix,
    (p, k): (&crate::format::ap8::PartLayout, u8),
    rows: &Range<usize>,
    (sv, mv): (&mut Vec<f32>, &mut Vec<f32>),
) {
    let gpr = m.cols / m.group_size;
    let (g0, ng) = (rows.start * gpr, rows.len() * gpr);
    sv.resize(ng, 0.0);
    mv.resize(ng, 0.0);
    ap8_params(k, part_tables(m.codes, p, k), g0, sv, mv);
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
    let (rows_start, rows_end) = (rows.start, rows.end);
    let mut xsums = vec![0f32; gpr];
    group_sums(x, g, &mut xsums);
    let (mut sv, mut mv) = (Vec::new(), Vec::new());
    let b = m.codes.as_ptr();
    // Lane weights of the top chunk's two bits, then of each plane read.
    let wt: Vec<__m512> = (0..k)
        .map(|j| _mm512_set1_ps((1u32 << (k - 1 - j)) as f32))
        .collect();
    for (o, r) in out.iter_mut().zip(rows) {
        // The tables of the next PARAM_ROWS rows, made together (they stay in L1).
        let i = (r - rows_start) % PARAM_ROWS;
        if i == 0 {
            let end = (r + PARAM_ROWS).min(rows_end);
            rows_params(m, (&p, k), &(r..end), (&mut sv, &mut mv));
        }
        let (sv, mv) = (&sv[i * gpr..(i + 1) * gpr], &mv[i * gpr..(i + 1) * gpr]);
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut macc = 0f32;
        // Blocks of 64 columns (rows are whole 64s), each 16 under its own group's scale.
        for c in (0..cols).step_by(64) {
            let e = r * cols + c;
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
                let s = _mm512_set1_ps(sv[(c + sh) / g]);
                let mut q = _mm512_maskz_mov_ps((masks[0] >> sh) as __mmask16, wt[0]);
                for j in 1..usize::from(k) {
                    q = _mm512_mask_add_ps(q, (masks[j] >> sh) as __mmask16, q, wt[j]);
                }
                let xv = _mm512_mul_ps(_mm512_loadu_ps(x.as_ptr().add(c + sh)), s);
                *a = _mm512_fmadd_ps(q, xv, *a);
            }
        }
        for gi in 0..gpr {
            macc += mv[gi] * xsums[gi];
        }
        let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        *o = _mm512_reduce_add_ps(sum) + macc;
    }
}

/// Rows `rows` of an ap8 view dequantized into `out` (cols values a row), 16 columns at a time:
/// each code from its top bits and planes (`codes8`'s order), times its group's scale plus its
/// min, rounded as `row_to_f32` rounds (a product, then a sum), for prefill's tiles.
///
/// # Safety
/// AVX-512F and F16C; the matrix is an ap8 view whose prefix holds its width's pieces
/// (`Matrix::check`), out.len() == rows.len() * m.cols.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(in crate::quant) unsafe fn ap8_dequant_rows_512(
    m: &Matrix,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let (p, k) = geometry(m);
    let (cols, g) = (m.cols, m.group_size);
    let gpr = cols / g;
    let b = m.codes.as_ptr();
    let fields = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let bits = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let (one, three) = (_mm512_set1_epi32(1), _mm512_set1_epi32(3));
    let planes = usize::from(k) - 2;
    let (mut sv, mut mv) = (Vec::new(), Vec::new());
    for (blk, out) in out.chunks_mut(PARAM_ROWS * cols).enumerate() {
        let start = rows.start + blk * PARAM_ROWS;
        let n = out.len() / cols;
        rows_params(m, (&p, k), &(start..start + n), (&mut sv, &mut mv));
        for (i, row) in out.chunks_exact_mut(cols).enumerate() {
            let e0 = (start + i) * cols;
            for (gi, group) in row.chunks_exact_mut(g).enumerate() {
                let s = _mm512_set1_ps(sv[i * gpr + gi]);
                let mn = _mm512_set1_ps(mv[i * gpr + gi]);
                for (j, o) in group.chunks_exact_mut(16).enumerate() {
                    let e = e0 + gi * g + 16 * j;
                    let top = (b.add(p.top + e / 4) as *const i32).read_unaligned();
                    let mut q =
                        _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(top), fields), three);
                    for &at in &p.planes[..planes] {
                        let w = (b.add(at + e / 8) as *const u16).read_unaligned();
                        let bit = _mm512_srlv_epi32(_mm512_set1_epi32(i32::from(w)), bits);
                        q = _mm512_or_si512(_mm512_slli_epi32::<1>(q), _mm512_and_si512(bit, one));
                    }
                    let v = _mm512_add_ps(_mm512_mul_ps(s, _mm512_cvtepi32_ps(q)), mn);
                    _mm512_storeu_ps(o.as_mut_ptr(), v);
                }
            }
        }
    }
}

/// `v` shifted by `n` bits in each 16-bit lane: right where n > 0, left where n < 0 (n in -7..=7;
/// a constant wherever the caller's width is one, so the match folds away).
macro_rules! shift16 {
    ($v:expr, $n:expr) => {
        match $n {
            0 => $v,
            1 => _mm512_srli_epi16::<1>($v),
            2 => _mm512_srli_epi16::<2>($v),
            3 => _mm512_srli_epi16::<3>($v),
            4 => _mm512_srli_epi16::<4>($v),
            5 => _mm512_srli_epi16::<5>($v),
            6 => _mm512_srli_epi16::<6>($v),
            7 => _mm512_srli_epi16::<7>($v),
            -1 => _mm512_slli_epi16::<1>($v),
            -2 => _mm512_slli_epi16::<2>($v),
            -3 => _mm512_slli_epi16::<3>($v),
            -4 => _mm512_slli_epi16::<4>($v),
            -5 => _mm512_slli_epi16::<5>($v),
            -6 => _mm512_slli_epi16::<6>($v),
            _ => _mm512_slli_epi16::<7>($v),
        }
    };
}

/// out[i] = dot(row rows.start + i, x) for an ap8 view on AVX-512 VNNI: x rounded to 16-bit
/// integers per group as for int2 (`vnni::QuantX`: four field planes a block of 256 columns), a
/// block's codes built as bytes in int2's field order (byte p of field f: column 4 p + f) from
/// the top bits (int2's packing, so a field is a shift and a mask) and each plane (a byte of 8
/// columns spread over the two bytes of 4 columns it covers, then a bit a field), and multiplied
/// with x's hi and lo planes in `vpdpbusd`, as `packed_vnni_rows` does for int2.
///
/// # Safety
/// AVX-512F, BW, VL and VNNI, and F16C; the matrix is an ap8 view whose prefix holds its width's
/// pieces (`Matrix::check`), x has `cols` values and out one a row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in crate::quant) unsafe fn ap8_vnni_rows(
    m: &Matrix,
    x: &[f32],
    rows: Range<usize>,
    out: &mut [f32],
) {
    let (p, k) = geometry(m);
    let t = part_tables(m.codes, &p, k);
    super::vnni::with_rounded_x(x, m.group_size, 2, |q| {
        // Two rows at a time (x's planes loaded once for both), each row's sums as alone; each
        // 16's (scale, min) made where its codes are multiplied.
        let mut pairs = out.chunks_exact_mut(2);
        for (i, o) in pairs.by_ref().enumerate() {
            let r = rows.start + 2 * i;
            o.copy_from_slice(&ap8_vnni_dispatch(k, RowsAt::new(m, &t, [r, r + 1]), q));
        }
        if let [o] = pairs.into_remainder() {
            *o = ap8_vnni_dispatch(k, RowsAt::new(m, &t, [rows.end - 1]), q)[0];
        }
    });
}

/// Rows whose tables `ap8_rows` and `ap8_dequant_rows_512` make at once.
const PARAM_ROWS: usize = 16;

/// How far ahead of the top bits being multiplied `ap8_vnni_row` prefetches, in bytes (each
/// plane half as far: a plane holds a bit a code where the top holds two).
const AP8_AHEAD: usize = 4096;

/// R rows of an ap8 view for `ap8_vnni_row`: each row's first byte of top bits, of each plane,
/// of its 16s' parent bytes and of its 64s' correction bytes, and its parent candidates.
struct RowsAt<const R: usize> {
    top: [*const u8; R],
    planes: [[*const u8; 6]; R],
    subs: [*const u8; R],
    corr: Option<[*const u8; R]>,
    luts: [(__m512, __m512); R],
}

impl<const R: usize> RowsAt<R> {
    /// Rows `at` of the view `m` whose tables are `t`.
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn new(m: &Matrix, t: &Tables, at: [usize; R]) -> Self {
        let b = m.codes.as_ptr();
        let e0 = at.map(|r| r * m.cols);
        let spr = m.cols / ap8::SUB;
        RowsAt {
            top: e0.map(|e| b.wrapping_add(t.p.top + e / 4)),
            // (The planes past the width lie past the view: their pointers are never read.)
            planes: e0.map(|e| t.p.planes.map(|pl| b.wrapping_add(pl + e / 8))),
            subs: at.map(|r| b.wrapping_add(t.p.subs + r * spr)),
            corr: t.corr.map(|c| at.map(|r| b.wrapping_add(c + r * spr / 4))),
            luts: at.map(|r| row_luts(t, r)),
        }
    }
}

/// `ap8_vnni_row` at the view's width.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn ap8_vnni_dispatch<const R: usize>(
    k: u8,
    rr: RowsAt<R>,
    q: &super::vnni::QuantX,
) -> [f32; R] {
    match k {
        2 => ap8_vnni_row::<R, 2>(rr, q),
        3 => ap8_vnni_row::<R, 3>(rr, q),
        4 => ap8_vnni_row::<R, 4>(rr, q),
        5 => ap8_vnni_row::<R, 5>(rr, q),
        6 => ap8_vnni_row::<R, 6>(rr, q),
        7 => ap8_vnni_row::<R, 7>(rr, q),
        _ => ap8_vnni_row::<R, 8>(rr, q),
    }
}

/// R rows of `ap8_vnni_rows` at width K.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn ap8_vnni_row<const R: usize, const K: i32>(
    rr: RowsAt<R>,
    q: &super::vnni::QuantX,
) -> [f32; R] {
    let (gs, groups) = (q.gs, q.f.len());
    let cols = groups * gs;
    let xplanes = q.planes.as_ptr();
    let zero = _mm512_setzero_si512();
    let nib = _mm512_set1_epi16(0x0f0f);
    // Field f's top bits at bits K - 2 and K - 1 of its byte; plane t's at bit K - 3 - t.
    let top_mask = _mm512_set1_epi8((3 << (K - 2)) as i8);
    let mut bit = [zero; 6];
    for (t, bt) in bit.iter_mut().enumerate().take(K as usize - 2) {
        *bt = _mm512_set1_epi8((1i32 << (K - 3 - t as i32)) as i8);
    }
    let pk = ParamK::new(K as u8);
    let spread = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    let mut acc = [_mm512_setzero_ps(); R];
    let (mut g0, mut b0) = (0, 0);
    while g0 < groups {
        let n = (groups - g0).min(16);
        let lanes: u16 = if n == 16 { !0 } else { (1 << n) - 1 };
        let fx = _mm512_maskz_loadu_ps(lanes, q.f.as_ptr().add(g0));
        let sums = _mm512_maskz_loadu_ps(lanes, q.sums.as_ptr().add(g0));
        let cmask = (1u16 << n.div_ceil(4)) - 1;
        let mut sfx = [_mm512_setzero_ps(); R];
        for r in 0..R {
            let v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(lanes, rr.subs[r].add(g0) as _));
            // A 64's correction byte to each of its four 16s.
            let c = rr.corr.map(|c| {
                let four = _mm_maskz_loadu_epi8(cmask, c[r].add(g0 / 4) as _);
                _mm512_cvtepu8_epi32(_mm_shuffle_epi8(four, spread))
            });
            let (s, mn) = params16(&pk, rr.luts[r], v, c);
            sfx[r] = _mm512_mul_ps(s, fx);
            acc[r] = _mm512_fmadd_ps(mn, sums, acc[r]);
        }
        let loads = (n * gs).div_ceil(256);
        for (j, idx) in q.lanes.iter().enumerate().take(loads) {
            let bl = b0 + j;
            let xp = xplanes.add(bl * 512);
            let (mut xhi, mut xlo) = ([zero; 4], [zero; 4]);
            for f in 0..4 {
                xhi[f] = _mm512_loadu_si512(xp.add(64 * f) as *const _);
                xlo[f] = _mm512_loadu_si512(xp.add(64 * (4 + f)) as *const _);
            }
            let lanes = _mm512_loadu_si512(idx.as_ptr() as *const _);
            // A last part of a block: only its columns' bytes (rows are whole groups of 64).
            let c = (cols - bl * 256).min(256);
            let (keep, pkeep) = if c == 256 {
                (!0u64, !0u32)
            } else {
                ((1u64 << (c / 4)) - 1, (1u32 << (c / 8)) - 1)
            };
            for r in 0..R {
                // Each stream a few KB ahead, as the integer kernels do (`vnni::VNNI_AHEAD`): the
                // hardware prefetchers alone leave a thread short of the read rate.
                let top = rr.top[r].add(bl * 64);
                _mm_prefetch::<_MM_HINT_T0>(top.wrapping_add(AP8_AHEAD) as *const i8);
                for pl in rr.planes[r].iter().take(K as usize - 2) {
                    let at = pl.wrapping_add(bl * 32 + AP8_AHEAD / 2);
                    _mm_prefetch::<_MM_HINT_T0>(at as *const i8);
                }
                let v = _mm512_maskz_loadu_epi8(keep, top as *const i8);
                // Each plane's byte of 8 columns to the two bytes of 4 (low nibble: field f at
                // bit f).
                let mut h = [zero; 6];
                for (t, ht) in h.iter_mut().enumerate().take(K as usize - 2) {
                    let pl = rr.planes[r][t].add(bl * 32) as *const i8;
                    let w = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(pkeep, pl));
                    *ht = _mm512_ternarylogic_epi32::<0xA8>(w, _mm512_slli_epi16::<4>(w), nib);
                }
                let (mut ah, mut al) = (zero, zero);
                for f in 0..4i32 {
                    let mut cf = _mm512_and_si512(shift16!(v, 2 * f - (K - 2)), top_mask);
                    for (t, ht) in h.iter().enumerate().take(K as usize - 2) {
                        let sh = shift16!(*ht, f - (K - 3 - t as i32));
                        cf = _mm512_ternarylogic_epi32::<0xF8>(cf, sh, bit[t]);
                    }
                    ah = _mm512_dpbusd_epi32(ah, cf, xhi[f as usize]);
                    al = _mm512_dpbusd_epi32(al, cf, xlo[f as usize]);
                }
                let t = _mm512_add_epi32(_mm512_slli_epi32::<8>(ah), al);
                let sf = _mm512_permutexvar_ps(lanes, sfx[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), sf, acc[r]);
            }
        }
        b0 += loads;
        g0 += n;
    }
    acc.map(|a| _mm512_reduce_add_ps(a))
}
