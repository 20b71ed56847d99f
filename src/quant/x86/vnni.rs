//! int8, int4, int3, int2, int4k, int2k and MXFP4 on AVX-512 VNNI: x rounded to 16-bit integers
//! per group, codes and x's bytes multiplied in `vpdpbusd`
//! (benches/results/2026-11-28-h100-cpu-int4-vnni.md, 2026-12-05-cpu-int4k-int2k-vnni.md). The same
//! contract as the other kernels of x86.rs (the caller checks the CPU's features and the slices'
//! lengths).

use super::*;

/// How far ahead of the codes being multiplied the VNNI kernel prefetches, in bytes: further than
/// the f32 kernels, as it takes a byte of codes in a fraction of their instructions
/// (benches/results/2026-11-28-h100-cpu-int4-vnni.md).
const VNNI_AHEAD: usize = 3072;
/// The same for int8, which takes a byte of codes in fewer instructions still (1536 x 576 rows on
/// one Zen 5 core from memory: 17 GB/s at 3072 bytes ahead, 24 at 8192).
const VNNI_AHEAD_INT8: usize = 8192;

/// The largest |q| of a group's rounded x: 256 * 127 + 127, so that both bytes of every value are
/// signed bytes (`QuantX`).
const QX_MAX: f32 = 32639.0;

/// The least power of two at least `t` (t > 0 and finite; `t` itself where it is subnormal or
/// too large for one): x's factor, so that scaling by it is exact and values on a coarser grid
/// (integers, halves) stay exact.
fn pow2_at_least(t: f32) -> f32 {
    let (e, mant) = ((t.to_bits() >> 23) & 0xff, t.to_bits() & 0x7f_ffff);
    if e == 0 || e >= 254 {
        return t;
    }
    f32::from_bits((e + u32::from(mant != 0)) << 23)
}

/// x of one packed product as `packed_vnni_rows` takes it, for codes of `bits` (8, 4 or 2: F = 8 /
/// bits fields a byte, field j of byte p holding column F p + j of a block). Per group g, x is
/// about f[g] times an integer q of at most QX_MAX in magnitude, f[g] the least power of two at
/// least the group's largest |x| / QX_MAX (15 to 16 significant bits of that |x|), or NaN where
/// the group holds a NaN or an infinity (so the rows' results are NaN, as the f32 kernels' are),
/// or 0 where the group is below ~4e-34 throughout (its factor's inverse would overflow);
/// q = 256 hi + lo with hi and lo signed bytes. Per block of 64 F columns (64 bytes of codes),
/// 2 F planes of 64 bytes: hi of field 0 .. F - 1, then lo of each (byte p of plane j: column
/// F p + j of the block); a last block is zero past the row. `x`, `gs` and `bits`: what it was
/// made from, so a thread's later calls on the same input (the other row blocks of one product)
/// reuse it.
#[derive(Default)]
pub(super) struct QuantX {
    x: Vec<f32>,
    pub(super) gs: usize,
    bits: usize,
    pub(super) planes: Vec<i8>,
    pub(super) f: Vec<f32>,
    /// Per group, the sum of the rounded x (f[g] * sum q): the min term's sums, so that a row's
    /// error is its dequantized weights times x's rounding.
    pub(super) sums: Vec<f32>,
    /// Per load of a 16-group window, each lane's group in the window (`make_lanes`), and the
    /// (gs, bits) they are for: built once, not per call (a call is a block of rows).
    pub(super) lanes: Vec<[i32; 16]>,
    lanes_for: (usize, usize),
}

thread_local! {
    static QUANT_X: std::cell::RefCell<QuantX> = std::cell::RefCell::new(QuantX::default());
}

impl QuantX {
    /// Each lane's group, per load of a 16-group window (16 gs columns: whole loads, as gs is a
    /// multiple of 16 and a block of 64 F columns divides 16 gs).
    fn make_lanes(&mut self, gs: usize, bits: usize, block: usize) {
        if self.lanes_for == (gs, bits) {
            return;
        }
        self.lanes = (0..(16 * gs).div_ceil(block))
            .map(|j| {
                let mut l = [0i32; 16];
                for (lane, g) in l.iter_mut().enumerate() {
                    *g = ((j * block + lane * block / 16) / gs).min(15) as i32;
                }
                l
            })
            .collect();
        self.lanes_for = (gs, bits);
    }

    /// # Safety
    /// The CPU has AVX-512F and BW (`Level::Avx512Vnni`).
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn make(&mut self, x: &[f32], gs: usize, bits: usize) {
        // Bitwise (a byte comparison: NaN as NaN, -0 apart from 0).
        if self.gs == gs
            && self.bits == bits
            && bytemuck::cast_slice::<f32, u8>(&self.x) == bytemuck::cast_slice::<f32, u8>(x)
        {
            return;
        }
        let fields = 8 / bits;
        let block = 64 * fields;
        self.x.clear();
        self.x.extend_from_slice(x);
        (self.gs, self.bits) = (gs, bits);
        self.f.clear();
        self.sums.clear();
        self.planes.clear();
        self.planes
            .resize(x.len().div_ceil(block) * 128 * fields, 0);
        // 16 columns at a time (a group is a multiple of 16): rounded and split on 16 lanes,
        // narrowed to bytes, and each byte sent to its field's plane by one shuffle (the 16
        // columns start a multiple of 16 into their block, so each field's share lands in
        // 16 / F consecutive bytes of its plane).
        let split = match fields {
            1 => _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            2 => _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15),
            _ => _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
        };
        let (qmax, qmin) = (
            _mm512_set1_epi32(QX_MAX as i32),
            _mm512_set1_epi32(-(QX_MAX as i32)),
        );
        let (c128, c255) = (_mm512_set1_epi32(128), _mm512_set1_epi32(255));
        let inf = _mm512_set1_ps(f32::INFINITY);
        let per = 16 / fields;
        let planes = self.planes.as_mut_ptr();
        for (g, xs) in x.chunks_exact(gs).enumerate() {
            let xp = xs.as_ptr();
            let (mut m, mut finite) = (_mm512_setzero_ps(), !0u16);
            for i in (0..gs).step_by(16) {
                let a = _mm512_abs_ps(_mm512_loadu_ps(xp.add(i)));
                finite &= _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, inf);
                m = _mm512_max_ps(m, a);
            }
            let m = _mm512_reduce_max_ps(m);
            let (f, inv) = match (finite == !0, m > 0.0) {
                (false, _) => (f32::NAN, 0.0),
                // (A group below ~4e-34 throughout, whose factor's inverse overflows: zero.)
                (true, true) => match pow2_at_least(m / QX_MAX) {
                    f if (1.0 / f).is_finite() => (f, 1.0 / f),
                    _ => (0.0, 0.0),
                },
                (true, false) => (0.0, 0.0),
            };
            let vinv = _mm512_set1_ps(inv);
            let mut sum = _mm512_setzero_si512();
            for i in (0..gs).step_by(16) {
                let v = _mm512_mul_ps(_mm512_loadu_ps(xp.add(i)), vinv);
                let q = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    v,
                );
                let q = _mm512_max_epi32(_mm512_min_epi32(q, qmax), qmin);
                sum = _mm512_add_epi32(sum, q);
                let lo = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(q, c128), c255), c128);
                let hi = _mm512_srai_epi32::<8>(_mm512_sub_epi32(q, lo));
                let c = g * gs + i;
                let (b, k) = (c / block, c % block);
                let at = planes.add(b * 128 * fields + k / fields);
                let hb = _mm_shuffle_epi8(_mm512_cvtepi32_epi8(hi), split);
                let lb = _mm_shuffle_epi8(_mm512_cvtepi32_epi8(lo), split);
                let (mut hv, mut lv) = ([0u8; 16], [0u8; 16]);
                _mm_storeu_si128(hv.as_mut_ptr() as *mut __m128i, hb);
                _mm_storeu_si128(lv.as_mut_ptr() as *mut __m128i, lb);
                for j in 0..fields {
                    std::ptr::copy_nonoverlapping(
                        hv.as_ptr().add(j * per),
                        at.add(j * 64) as *mut u8,
                        per,
                    );
                    std::ptr::copy_nonoverlapping(
                        lv.as_ptr().add(j * per),
                        at.add((fields + j) * 64) as *mut u8,
                        per,
                    );
                }
            }
            self.f.push(f);
            self.sums.push(f * _mm512_reduce_add_epi32(sum) as f32);
        }
    }
}

/// `f` on x rounded for codes of `bits` as `packed_vnni_rows` takes it, with each load's lanes:
/// for ap8's kernel (x86/planes.rs), which builds codes in int2's field order itself.
///
/// # Safety
/// The CPU has AVX-512F and BW.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn with_rounded_x<T>(
    x: &[f32],
    gs: usize,
    bits: usize,
    f: impl FnOnce(&QuantX) -> T,
) -> T {
    QUANT_X.with(|cell| {
        let mut q = cell.borrow_mut();
        q.make(x, gs, bits);
        q.make_lanes(gs, bits, 512 / bits);
        f(&q)
    })
}

/// int8, int4 and int2 by integer dot products (AVX-512 VNNI), for matrices `packed_vnni_takes`. x is
/// rounded to 16-bit integers per group (`QuantX`: at most 2^-15 of the group's largest |x| off,
/// as the GPU's dp4a kernels round it to their grid; the min term takes the rounded x's sums,
/// so a row's error is its dequantized weights times x's rounding). A 64-byte load of codes is
/// masked into its fields (int4: low and high nibbles; int2: four 2-bit fields; int8: the signed
/// byte plus 128, the unsigned operand, whose excess 128 times x's sums is taken off), and each meets
/// x's hi and lo planes in `vpdpbusd` (64 products of an unsigned and a signed byte summed into
/// sixteen 32-bit lanes, exact): 4 of them for 128 int4 weights, where the f32 kernel takes 8
/// table lookups and 8 FMAs. Each lane's integer sum (4 F columns of one group) becomes one f32
/// times the group's scale times f[g], summed per lane over the row and across the lanes at its
/// end. Two rows at a time, each row's arithmetic the same as alone.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(in crate::quant) unsafe fn packed_vnni_rows(
    m: &Matrix,
    x: &[f32],
    rows: Range<usize>,
    out: &mut [f32],
) {
    // int3: its low fields as int2's, on x's int2 planes (`dot_packed_vnni`'s I3).
    let i3 = m.kind == WeightKind::Int3;
    let (gs, bits) = (m.group_size, if i3 { 2 } else { m.kind.bits() });
    let block = 512 / bits;
    QUANT_X.with(|cell| {
        let mut q = cell.borrow_mut();
        q.make(x, gs, bits);
        q.make_lanes(gs, bits, block);
        let q = &*q;
        let idx = q.lanes.as_slice();
        let (rb, gpr, sb) = (m.row_bytes(), m.groups_per_row(), m.kind.scale_bytes());
        let codes = |r: usize| m.codes[r * rb..(r + 1) * rb].as_ptr();
        let side = |v: &[u8], r: usize| v[r * gpr * sb..(r + 1) * gpr * sb].as_ptr();
        let scales = |r: usize| side(m.scales, r);
        // int8 and MXFP4 have no mins: their offset terms take the scales (`dot_packed_vnni`).
        // int4k and int2k: the row's f16 pair (d, dm), which the kernel scales their bytes by.
        let sub = m.kind.is_sub_scaled();
        let mins = |r: usize| match (bits, m.kind) {
            (8, _) | (_, WeightKind::Mxfp4) => scales(r),
            _ if sub => m.mins[4 * r..4 * r + 4].as_ptr(),
            _ => side(m.mins, r),
        };
        let mx = m.kind == WeightKind::Mxfp4;
        let dot2 = |r: usize| {
            let rows = (
                [codes(r), codes(r + 1)],
                [scales(r), scales(r + 1)],
                [mins(r), mins(r + 1)],
            );
            dot_kind(rows, q, idx, (bits, mx, i3, sub))
        };
        let dot1 = |r: usize| {
            let row = ([codes(r)], [scales(r)], [mins(r)]);
            dot_kind(row, q, idx, (bits, mx, i3, sub))
        };
        let start = rows.start;
        let mut pairs = out.chunks_exact_mut(2);
        for (p, o) in pairs.by_ref().enumerate() {
            o.copy_from_slice(&dot2(start + 2 * p));
        }
        if let [o] = pairs.into_remainder() {
            *o = dot1(rows.end - 1)[0];
        }
    });
}

/// `dot_packed_vnni` in the form for codes of `bits` (MXFP4's where `mx`, int3's where `i3`,
/// int4k's and int2k's where `sub`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_kind<const R: usize>(
    rows: ([*const u8; R], [*const u8; R], [*const u8; R]),
    q: &QuantX,
    idx: &[[i32; 16]],
    (bits, mx, i3, sub): (usize, bool, bool, bool),
) -> [f32; R] {
    match (bits, mx, i3, sub) {
        (8, ..) => dot_packed_vnni::<R, 1, false, false, false>(rows, q, idx),
        (4, true, ..) => dot_packed_vnni::<R, 2, true, false, false>(rows, q, idx),
        (4, _, _, false) => dot_packed_vnni::<R, 2, false, false, false>(rows, q, idx),
        (4, ..) => dot_packed_vnni::<R, 2, false, false, true>(rows, q, idx),
        (_, _, true, _) => dot_packed_vnni::<R, 4, false, true, false>(rows, q, idx),
        (_, _, _, false) => dot_packed_vnni::<R, 4, false, false, false>(rows, q, idx),
        _ => dot_packed_vnni::<R, 4, false, false, true>(rows, q, idx),
    }
}

const RNE: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

/// v rounded to f16 and back: the format's f16(d a), f16(dm b) (the products are exact in f32,
/// and `vcvtps2ph` rounds to nearest even as `half` does).
#[target_feature(enable = "avx512f,avx512vl,f16c")]
#[inline]
unsafe fn round_f16(v: __m512) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtps_ph::<RNE>(v))
}

/// A row's group parameters before its windows (quant::subscales), from its f16 pair (d, dm) at
/// `pair`. int4k (F = 2): d and dm, broadcast. int2k (F = 4): its 16 possible scales f16(d a),
/// a = 0..15, and 16 mins f16(dm b) by b's nibble (b = -8..7), looked up per group.
#[target_feature(enable = "avx512f,avx512vl,f16c")]
#[inline]
unsafe fn sub_row<const F: usize>(pair: *const u8) -> [__m512; 2] {
    let p = pair as *const i16;
    let d = _mm512_cvtph_ps(_mm256_set1_epi16(p.read_unaligned()));
    let dm = _mm512_cvtph_ps(_mm256_set1_epi16(p.add(1).read_unaligned()));
    if F == 2 {
        return [d, dm];
    }
    let a = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    let b = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1);
    [
        round_f16(_mm512_mul_ps(_mm512_cvtepi32_ps(a), d)),
        round_f16(_mm512_mul_ps(_mm512_cvtepi32_ps(b), dm)),
    ]
}

/// A window's group parameters of an int4k (F = 2) or int2k (F = 4) row: each group's (a, b)
/// bytes in `lanes`, with the row's `sub_row`, as the format defines them (f16(d a), f16(dm b)).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn sub_scales<const F: usize>(ab: *const u8, row: [__m512; 2], lanes: u16) -> [__m512; 2] {
    if F == 4 {
        // A byte a group: a in the low nibble, b's in the high one; both looked up.
        let v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(lanes, ab as *const i8));
        let a = _mm512_and_si512(v, _mm512_set1_epi32(15));
        return [
            _mm512_permutexvar_ps(a, row[0]),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v), row[1]),
        ];
    }
    // Two bytes a group: a (u8), then b (i8).
    let v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, ab as *const i16));
    let a = _mm512_and_si512(v, _mm512_set1_epi32(0xff));
    let b = _mm512_srai_epi32::<24>(_mm512_slli_epi32::<16>(v));
    [
        round_f16(_mm512_mul_ps(_mm512_cvtepi32_ps(a), row[0])),
        round_f16(_mm512_mul_ps(_mm512_cvtepi32_ps(b), row[1])),
    ]
}

/// MXFP4's scales 2^(e - 128) from exponent bytes e, built as f32 bits: (e - 1) << 23 from
/// e = 2, the subnormals 2^-127 and 2^-128 below; 0 outside `lanes`. (vscalefps gave the same
/// values, but the window's unused lanes (e = 0) came out subnormal, and on Intel cores each
/// subnormal result or operand takes a microcode assist: 2x the decode time of rows whose groups
/// do not fill their last window, 2026-12-05-cpu-int4k-int2k-vnni.md.)
#[target_feature(enable = "avx512f,avx512vl")]
#[inline]
unsafe fn mx_scales(e: __m512i, lanes: u16) -> __m512 {
    let one = _mm512_set1_epi32(1);
    let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, one));
    let tiny = _mm512_sllv_epi32(_mm512_set1_epi32(1 << 21), e);
    let big = _mm512_cmpgt_epu32_mask(e, one);
    _mm512_maskz_mov_ps(
        lanes,
        _mm512_castsi512_ps(_mm512_mask_blend_epi32(big, tiny, normal)),
    )
}

/// MXFP4's doubled e2m1 values plus 12, by code: unsigned bytes for `vpdpbusd` (the excess 12
/// times x's sums is taken off), repeated in each 128-bit lane for `vpshufb`.
const MX_PLUS_12: [i8; 16] = {
    let mut t = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = crate::quant::mxfp4::E2M1_X2[i] + 12;
        i += 1;
    }
    t
};

/// R rows' sums of scale * codes * x for codes of F fields a byte (`packed_vnni_rows`), plus the
/// rows' other term per group g with x's rounded sums: int4 and int2, min_g * sums_g; int8 (F = 1,
/// `mins` its scales), -128 * scale_g * sums_g, the excess of its codes taken as w + 128; MXFP4
/// (`MX`: F = 2, scales 2^(e - 128) from exponent bytes), -12 * scale_g * sums_g, its codes looked
/// up as their doubled values + 12. Both vectorized per window of 16 groups, into the same
/// accumulator. `scales` and `mins` point at f16 values (at exponent bytes for MXFP4). `I3` (F = 4):
/// int3 rows, whose first cols / 4 bytes are int2's fields and the rest each code's high bit
/// (formats' `int3_hi_bit`), put in at bit 2 of its field's byte. `SUB`: int4k (F = 2) and int2k
/// (F = 4) rows, `scales` at each group's (a, b) bytes and `mins` at the row's pair (`sub_scales`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_packed_vnni<
    const R: usize,
    const F: usize,
    const MX: bool,
    const I3: bool,
    const SUB: bool,
>(
    (codes, scales, mins): ([*const u8; R], [*const u8; R], [*const u8; R]),
    q: &QuantX,
    idx: &[[i32; 16]],
) -> [f32; R] {
    let zero = _mm512_setzero_si512();
    let (gs, groups) = (q.gs, q.f.len());
    let (cols, block) = (groups * gs, 64 * F);
    let planes = q.planes.as_ptr();
    let ahead = if F == 1 { VNNI_AHEAD_INT8 } else { VNNI_AHEAD };
    let mut acc = [_mm512_setzero_ps(); R];
    // SUB: each row's parameters, made once.
    let sub = mins.map(|p| {
        if SUB {
            sub_row::<F>(p)
        } else {
            [_mm512_setzero_ps(); 2]
        }
    });
    let (mut g0, mut b0) = (0, 0);
    while g0 < groups {
        let n = (groups - g0).min(16);
        // Masked loads straight into registers (an array written lane by lane and read back
        // whole stalled on store forwarding, once per window: rows of 576 columns are 9 loads).
        let lanes: u16 = if n == 16 { !0 } else { (1 << n) - 1 };
        let fx = _mm512_maskz_loadu_ps(lanes, q.f.as_ptr().add(g0));
        let sums = _mm512_maskz_loadu_ps(lanes, q.sums.as_ptr().add(g0));
        let mut sfx = [_mm512_setzero_ps(); R];
        for r in 0..R {
            let row = (scales[r], mins[r], sub[r]);
            sfx[r] = window_row::<F, MX, SUB>(row, (g0, lanes), (fx, sums), &mut acc[r]);
        }
        let loads = (n * gs).div_ceil(block);
        for (j, lanes) in idx.iter().enumerate().take(loads) {
            let lanes = _mm512_loadu_si512(lanes.as_ptr() as *const _);
            let b = b0 + j;
            let xp = planes.add(b * 128 * F);
            let mut hi = [zero; F];
            let mut lo = [zero; F];
            for k in 0..F {
                hi[k] = _mm512_loadu_si512(xp.add(64 * k) as *const _);
                lo[k] = _mm512_loadu_si512(xp.add(64 * (F + k)) as *const _);
            }
            // A last part of a block: its bytes of codes only (the row's end; whole lanes, as
            // rows are whole groups of a multiple of 16 columns).
            let keep: u64 = if (b + 1) * block > cols {
                (1u64 << ((cols - b * block) / F)) - 1
            } else {
                !0
            };
            for r in 0..R {
                let p = codes[r].add(b * 64);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead) as *const i8);
                let v = _mm512_maskz_loadu_epi8(keep, p as *const i8);
                let h = if I3 {
                    int3_high(codes[r].add(cols / 4 + b * 32), keep, cols - b * block)
                } else {
                    zero
                };
                let t = block_dot::<F, MX, I3>(v, h, (&hi, &lo));
                // (int2k: a lane's 16 columns are its group, lane g of the window.)
                let f = if SUB && F == 4 {
                    sfx[r]
                } else {
                    _mm512_permutexvar_ps(lanes, sfx[r])
                };
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), f, acc[r]);
            }
        }
        b0 += loads;
        g0 += n;
    }
    acc.map(|a| _mm512_reduce_add_ps(a))
}

/// One row's part of a window of `lanes` groups from g0 (`dot_packed_vnni`): its scales times x's
/// factors `fx`, one lane a group (returned), and its other term with x's `sums` added to `acc`.
/// `row`: the row's scales, its mins and its `sub_row` (SUB).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn window_row<const F: usize, const MX: bool, const SUB: bool>(
    (scales, mins, sub): (*const u8, *const u8, [__m512; 2]),
    (g0, lanes): (usize, u16),
    (fx, sums): (__m512, __m512),
    acc: &mut __m512,
) -> __m512 {
    if SUB {
        let [sf, mf] = sub_scales::<F>(scales.add(g0 * (4 / F)), sub, lanes);
        *acc = _mm512_fmadd_ps(mf, sums, *acc);
        return _mm512_mul_ps(sf, fx);
    }
    let sf = if MX {
        let e = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(lanes, scales.add(g0) as *const i8));
        mx_scales(e, lanes)
    } else {
        _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
            lanes,
            scales.cast::<i16>().add(g0),
        ))
    };
    *acc = if F == 1 {
        _mm512_fnmadd_ps(_mm512_mul_ps(sf, _mm512_set1_ps(128.0)), sums, *acc)
    } else if MX {
        _mm512_fnmadd_ps(_mm512_mul_ps(sf, _mm512_set1_ps(12.0)), sums, *acc)
    } else {
        let mf = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, mins.cast::<i16>().add(g0)));
        _mm512_fmadd_ps(mf, sums, *acc)
    };
    _mm512_mul_ps(sf, fx)
}

/// An int3 row's high bits for one 64-byte load of its low codes (256 columns), from `hp`, its
/// block's 32 high bytes; `left` columns remain in the row. A 16-byte lane of codes (64 columns)
/// takes its block's 8 high bytes twice, then byte q of the lane the high byte 4 (q / 8) + q % 4,
/// nibble (q / 4) % 2 (a lane's four fields).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn int3_high(hp: *const u8, keep: u64, left: usize) -> __m512i {
    // (A last part of a block: its high bytes only, half its low ones.)
    let hkeep = if keep == !0 {
        !0u32
    } else {
        (1u32 << (left / 8)) - 1
    };
    let hi_qwords = _mm512_setr_epi64(0, 0, 1, 1, 2, 2, 3, 3);
    let hi_pick = _mm512_broadcast_i32x4(_mm_setr_epi8(
        0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7,
    ));
    let h = _mm256_maskz_loadu_epi8(hkeep, hp as *const i8);
    let h = _mm512_permutexvar_epi64(hi_qwords, _mm512_castsi256_si512(h));
    let h = _mm512_shuffle_epi8(h, hi_pick);
    _mm512_mask_blend_epi8(0xF0F0_F0F0_F0F0_F0F0, h, _mm512_srli_epi16::<4>(h))
}

/// One 64-byte load of codes `v` against x's F hi and lo planes: each field k's codes as
/// unsigned bytes (int8's plus 128, MXFP4's looked up, int3's high bits `h` put in) through
/// `vpdpbusd`, the integer sums 256 hi + lo per 32-bit lane (4 F columns of one group).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn block_dot<const F: usize, const MX: bool, const I3: bool>(
    v: __m512i,
    h: __m512i,
    (hi, lo): (&[__m512i; F], &[__m512i; F]),
) -> __m512i {
    let mask = _mm512_set1_epi8(match F {
        1 => 0x80u8 as i8,
        2 => 0x0f,
        _ => 0x03,
    });
    let (mut ah, mut al) = (_mm512_setzero_si512(), _mm512_setzero_si512());
    for k in 0..F {
        // Field k of every byte (shifting 16-bit lanes brings in the next byte's bits above
        // the field, which the mask removes).
        let c = match (k, F) {
            // int8: the signed byte w as the unsigned w + 128.
            (0, 1) => _mm512_xor_si512(v, mask),
            (0, _) => _mm512_and_si512(v, mask),
            (1, 2) => _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask),
            (1, _) => _mm512_and_si512(_mm512_srli_epi16::<2>(v), mask),
            (2, _) => _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask),
            _ => _mm512_and_si512(_mm512_srli_epi16::<6>(v), mask),
        };
        let c = if MX {
            let table = _mm_loadu_si128(MX_PLUS_12.as_ptr() as *const __m128i);
            _mm512_shuffle_epi8(_mm512_broadcast_i32x4(table), c)
        } else if I3 {
            // The high bit j of each byte's nibble to bit 2, or'ed in.
            let hb = match k {
                0 => _mm512_slli_epi16::<2>(h),
                1 => _mm512_slli_epi16::<1>(h),
                2 => h,
                _ => _mm512_srli_epi16::<1>(h),
            };
            _mm512_or_si512(c, _mm512_and_si512(hb, _mm512_set1_epi8(4)))
        } else {
            c
        };
        ah = _mm512_dpbusd_epi32(ah, c, hi[k]);
        al = _mm512_dpbusd_epi32(al, c, lo[k]);
    }
    _mm512_add_epi32(_mm512_slli_epi32::<8>(ah), al)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every exponent byte gives 2^(e - 128) exactly (the subnormals at e = 0 and 1 included),
    /// and lanes outside the mask give 0.
    #[test]
    fn mx_scales_are_the_powers_of_two() {
        if Level::detected() != Some(Level::Avx512Vnni) {
            return;
        }
        for base in (0..256).step_by(16) {
            let e: Vec<i32> = (base..base + 16).collect();
            for lanes in [!0u16, 0x00ff, 0x8001] {
                let mut got = [0f32; 16];
                // SAFETY: AVX-512F and VL are present (Avx512Vnni detected); e holds 16 values.
                unsafe {
                    let v = _mm512_loadu_si512(e.as_ptr() as *const _);
                    _mm512_storeu_ps(got.as_mut_ptr(), mx_scales(v, lanes));
                }
                for (i, (&g, &e)) in got.iter().zip(&e).enumerate() {
                    let want = if lanes >> i & 1 == 1 {
                        2f64.powi(e - 128) as f32
                    } else {
                        0.0
                    };
                    assert_eq!(g.to_bits(), want.to_bits(), "e = {e}, lane {i}");
                }
            }
        }
    }
}
