//! NEON kernels (aarch64 baseline). Kept small: the same structure as the AVX2 path, four lanes
//! wide. f16 is widened with integer operations because `vcvt_f32_f16` needs the non-baseline
//! "fp16" feature.
//!
//! Every function here is `unsafe` because it loads through raw pointers: the callers in mod.rs
//! checked that the slices are as long as the matrix shape says (`Matrix::check`,
//! `Matrix::check_call`).

use std::arch::aarch64::*;
use std::ops::Range;

use super::{scalar, Matrix, WeightKind};

pub(super) unsafe fn matvec_rows(
    m: &Matrix,
    x: &[f32],
    xsums: &[f32],
    rows: Range<usize>,
    out: &mut [f32],
) {
    if m.kind == WeightKind::Mxfp4 {
        // MXFP4 has no NEON kernel: the reference, as quant::mxfp4 dispatches it here.
        return super::mxfp4::matvec_rows_scalar(m, x, rows, out);
    }
    if m.kind.is_sub_scaled() {
        // int4's or int2's kernel on its rows viewed as int4/g32 or int2/g16 (whose group sums
        // xsums already are).
        return super::subscales::with_rows(m, rows, |v, at| {
            // SAFETY: the caller's guarantees hold for v: the same codes and x, its scales and
            // mins expanded for exactly its rows.
            unsafe { matvec_rows(v, x, xsums, 0..v.rows, &mut out[at]) }
        });
    }
    let rb = m.row_bytes();
    let gpr = m.groups_per_row();
    for (o, r) in out.iter_mut().zip(rows) {
        let codes = &m.codes[r * rb..(r + 1) * rb];
        let side = r * gpr * 2..(r + 1) * gpr * 2;
        *o = match m.kind {
            WeightKind::F32 => dot_f32(codes, x),
            WeightKind::F16 => dot_f16(codes, x),
            WeightKind::Bf16 => dot_bf16(codes, x),
            WeightKind::Mxfp4 | WeightKind::Int4k | WeightKind::Int2k | WeightKind::Ap8 { .. } => {
                unreachable!("handled above")
            }
            WeightKind::Int8 => dot_int8(codes, &m.scales[side], m.group_size, x),
            WeightKind::Int4 | WeightKind::Int3 | WeightKind::Int2 => {
                let sc = &m.scales[side.clone()];
                let qx = match m.kind {
                    WeightKind::Int4 => dot_int4(codes, sc, m.group_size, x),
                    WeightKind::Int3 => dot_int3(codes, sc, m.group_size, x),
                    _ => dot_int2(codes, sc, m.group_size, x),
                };
                let mins = &m.mins[side];
                (0..gpr).fold(qx, |acc, g| acc + scalar::f16_at(mins, g) * xsums[g])
            }
        };
    }
}

/// Four f16 values to f32: move exponent and mantissa into place and rebias by multiplying with
/// 2^112 (exact, and right for subnormals too); infinities and NaNs get the all-ones exponent.
#[inline]
unsafe fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let w = vmovl_u16(h);
    let sign = vshlq_n_u32::<16>(vandq_u32(w, vdupq_n_u32(0x8000)));
    let em = vshlq_n_u32::<13>(vandq_u32(w, vdupq_n_u32(0x7fff)));
    let scaled = vmulq_f32(
        vreinterpretq_f32_u32(em),
        vdupq_n_f32(f32::from_bits(0x7780_0000)),
    );
    let special = vcgeq_u32(em, vdupq_n_u32(0x7c00 << 13));
    let bits = vbslq_u32(
        special,
        vorrq_u32(em, vdupq_n_u32(0x7f80_0000)),
        vreinterpretq_u32_f32(scaled),
    );
    vreinterpretq_f32_u32(vorrq_u32(bits, sign))
}

/// Dense dot product: `load(i)` gives the 4 weights at column i as f32, `tail(i)` one weight.
#[inline]
unsafe fn dot_dense(
    x: &[f32],
    load: impl Fn(usize) -> float32x4_t,
    tail: impl Fn(usize) -> f32,
) -> f32 {
    let n = x.len();
    let xp = x.as_ptr();
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            let j = i + 4 * k;
            *a = vfmaq_f32(*a, load(j), vld1q_f32(xp.add(j)));
        }
        i += 16;
    }
    while i + 4 <= n {
        acc[0] = vfmaq_f32(acc[0], load(i), vld1q_f32(xp.add(i)));
        i += 4;
    }
    let mut s = vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ));
    while i < n {
        s += tail(i) * x[i];
        i += 1;
    }
    s
}

unsafe fn dot_f32(w: &[u8], x: &[f32]) -> f32 {
    let wp = w.as_ptr() as *const f32;
    dot_dense(x, |i| vld1q_f32(wp.add(i)), |i| wp.add(i).read_unaligned())
}

unsafe fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    let wp = w.as_ptr() as *const u16;
    dot_dense(
        x,
        |i| f16x4_to_f32(vld1_u16(wp.add(i))),
        |i| scalar::f16_at(w, i),
    )
}

unsafe fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    let wp = w.as_ptr() as *const u16;
    dot_dense(
        x,
        |i| vreinterpretq_f32_u32(vshlq_n_u32::<16>(vmovl_u16(vld1_u16(wp.add(i))))),
        |i| f32::from_bits((u16::from_le_bytes([w[2 * i], w[2 * i + 1]]) as u32) << 16),
    )
}

/// sum_g s_g * sum_{i in g} q_i x_i, where `codes(i)` gives the 16 codes of columns i..i+16.
#[inline]
unsafe fn dot_grouped(
    scales: &[u8],
    gs: usize,
    x: &[f32],
    codes: impl Fn(usize) -> [float32x4_t; 4],
) -> f32 {
    let xp = x.as_ptr();
    let mut acc = vdupq_n_f32(0.0);
    let mut i = 0;
    for g in 0..x.len() / gs {
        let mut a = [vdupq_n_f32(0.0); 4];
        let end = i + gs;
        while i < end {
            let q = codes(i);
            for k in 0..4 {
                a[k] = vfmaq_f32(a[k], q[k], vld1q_f32(xp.add(i + 4 * k)));
            }
            i += 16;
        }
        let sum = vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3]));
        acc = vfmaq_n_f32(acc, sum, scalar::f16_at(scales, g));
    }
    vaddvq_f32(acc)
}

unsafe fn dot_int8(codes: &[u8], scales: &[u8], gs: usize, x: &[f32]) -> f32 {
    let cp = codes.as_ptr() as *const i8;
    dot_grouped(scales, gs, x, |i| {
        let b = vld1q_s8(cp.add(i));
        let lo = vmovl_s8(vget_low_s8(b));
        let hi = vmovl_s8(vget_high_s8(b));
        [
            vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
            vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))),
            vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
            vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))),
        ]
    })
}

/// Codes of `bits` bits packed little-endian in a u32, lanes `shifts` (negative: right shifts).
#[inline]
unsafe fn unpack(word: u32, shifts: &[i32; 4], mask: u32) -> float32x4_t {
    let v = vshlq_u32(vdupq_n_u32(word), vld1q_s32(shifts.as_ptr()));
    vcvtq_f32_u32(vandq_u32(v, vdupq_n_u32(mask)))
}

unsafe fn dot_int4(codes: &[u8], scales: &[u8], gs: usize, x: &[f32]) -> f32 {
    let cp = codes.as_ptr();
    let lo = [0, -4, -8, -12];
    let hi = [-16, -20, -24, -28];
    dot_grouped(scales, gs, x, |i| {
        let w0 = (cp.add(i / 2) as *const u32).read_unaligned().to_le();
        let w1 = (cp.add(i / 2 + 4) as *const u32).read_unaligned().to_le();
        [
            unpack(w0, &lo, 0x0f),
            unpack(w0, &hi, 0x0f),
            unpack(w1, &lo, 0x0f),
            unpack(w1, &hi, 0x0f),
        ]
    })
}

/// Right shifts of a word of 16 2-bit codes, four lanes at a time.
const INT2_SHIFTS: [[i32; 4]; 4] = [
    [0, -2, -4, -6],
    [-8, -10, -12, -14],
    [-16, -18, -20, -22],
    [-24, -26, -28, -30],
];

unsafe fn dot_int2(codes: &[u8], scales: &[u8], gs: usize, x: &[f32]) -> f32 {
    let cp = codes.as_ptr();
    dot_grouped(scales, gs, x, |i| {
        let w = (cp.add(i / 4) as *const u32).read_unaligned().to_le();
        INT2_SHIFTS.map(|s| unpack(w, &s, 0x03))
    })
}

/// The high bits of int3's codes 16 w + 4 k + s (formats' int3_hi_bit): bit 8 k + 4 (w % 2) + s of
/// its block's high word w / 2, as right shifts for [w % 2][k][s].
const INT3_HI_SHIFTS: [[[i32; 4]; 4]; 2] = {
    let mut t = [[[0i32; 4]; 4]; 2];
    let mut i = 0;
    while i < 32 {
        let (p, k, s) = (i / 16, (i / 4) % 4, i % 4);
        t[p][k][s] = -((8 * k + 4 * p + s) as i32);
        i += 1;
    }
    t
};

/// int3 rows (`codes` one row): int2's codes in the first two thirds, each code's high bit in the
/// rest, added as 4 * high (exact in f32).
unsafe fn dot_int3(codes: &[u8], scales: &[u8], gs: usize, x: &[f32]) -> f32 {
    let cp = codes.as_ptr();
    let hp = cp.add(codes.len() / 3 * 2);
    dot_grouped(scales, gs, x, |i| {
        let w = (cp.add(i / 4) as *const u32).read_unaligned().to_le();
        let wd = (i / 16) % 4;
        let h = (hp.add(i / 64 * 8 + 4 * (wd / 2)) as *const u32)
            .read_unaligned()
            .to_le();
        let t = &INT3_HI_SHIFTS[wd % 2];
        [0, 1, 2, 3].map(|k| {
            vfmaq_n_f32(
                unpack(w, &INT2_SHIFTS[k], 0x03),
                unpack(h, &t[k], 0x01),
                4.0,
            )
        })
    })
}
