//! The plain reference: dequantization and one sequential accumulation per row (per group for
//! quantized kinds). The SIMD kernels are tested against these.

use std::ops::Range;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::{Matrix, WeightKind};

pub(super) fn f16_at(bytes: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32()
}

fn bf16_at(bytes: &[u8], i: usize) -> f32 {
    bf16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32()
}

fn f32_at(bytes: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([
        bytes[4 * i],
        bytes[4 * i + 1],
        bytes[4 * i + 2],
        bytes[4 * i + 3],
    ])
}

/// The 64 codes of one int3 block (16 low bytes, 8 high: formats' `int3_hi_bit`), in order.
pub(crate) fn int3_block(lo: &[u8], hi: &[u8], out: &mut [u8; 64]) {
    for (l, &b) in lo[..16].iter().enumerate() {
        // Low byte 4 w + c holds elements 4 l + s; their high bits: bits 4 (w % 2) + s of high
        // byte 4 (w / 2) + c.
        let (w, c) = (l / 4, l % 4);
        let h = hi[4 * (w / 2) + c] >> (4 * (w % 2));
        for s in 0..4 {
            out[4 * l + s] = ((b >> (2 * s)) & 3) | (((h >> s) & 1) << 2);
        }
    }
}

/// Code `i` of a packed row: int8 as two's complement, int4 two per byte (element 2i in the low
/// nibble), int2 four per byte (element 4i+j in bits 2j..2j+2), int3 as int2 in the row's
/// first cols / 4 bytes and a high bit in the rest (`codes` one row).
pub(super) fn code_at(kind: WeightKind, codes: &[u8], i: usize) -> f32 {
    match kind {
        WeightKind::Int3 => {
            let hi = &codes[codes.len() / 3 * 2..];
            let hb = i / 64 * 64 + crate::format::int3_hi_bit(i % 64);
            (((codes[i / 4] >> (2 * (i % 4))) & 3) | (((hi[hb / 8] >> (hb % 8)) & 1) << 2)) as f32
        }
        WeightKind::Int8 => codes[i] as i8 as f32,
        WeightKind::Int4 | WeightKind::Int4k => ((codes[i / 2] >> (4 * (i % 2))) & 0x0f) as f32,
        WeightKind::Int2 | WeightKind::Int2k => ((codes[i / 4] >> (2 * (i % 4))) & 0x03) as f32,
        WeightKind::F32
        | WeightKind::F16
        | WeightKind::Bf16
        | WeightKind::Mxfp4
        | WeightKind::Ap8 { .. } => {
            unreachable!("not an integer code kind")
        }
    }
}

/// The value a reader sees for code `q` of a group with scale `s` and minimum `m` (0 for int8).
/// The quantizer measures its error with this same expression.
#[inline]
pub(super) fn dequant(s: f32, q: f32, m: f32) -> f32 {
    s * q + m
}

fn row_codes<'a>(m: &Matrix<'a>, r: usize) -> &'a [u8] {
    let rb = m.row_bytes();
    &m.codes[r * rb..(r + 1) * rb]
}

pub(super) fn row_to_f32(m: &Matrix, r: usize, out: &mut [f32]) {
    let codes = row_codes(m, r);
    match m.kind {
        WeightKind::F32 => out
            .iter_mut()
            .enumerate()
            .for_each(|(i, o)| *o = f32_at(codes, i)),
        // Whole-row conversions vectorize (F16C on x86) when the row is 2-byte aligned, which
        // the layouts guarantee; the per-element path is the fallback for odd slices.
        WeightKind::F16 => match bytemuck::try_cast_slice::<u8, f16>(codes) {
            Ok(h) => h.convert_to_f32_slice(out),
            Err(_) => out
                .iter_mut()
                .enumerate()
                .for_each(|(i, o)| *o = f16_at(codes, i)),
        },
        WeightKind::Bf16 => match bytemuck::try_cast_slice::<u8, bf16>(codes) {
            Ok(h) => h.convert_to_f32_slice(out),
            Err(_) => out
                .iter_mut()
                .enumerate()
                .for_each(|(i, o)| *o = bf16_at(codes, i)),
        },
        WeightKind::Mxfp4 => unreachable!("mxfp4 rows: quant::mxfp4"),
        WeightKind::Int4k | WeightKind::Int2k => unreachable!("sub-scaled rows: quant::subscales"),
        WeightKind::Ap8 { .. } => unreachable!("ap8 rows: quant::planes"),
        WeightKind::Int3 => {
            let gpr = m.groups_per_row();
            let mut q = [0u8; 64];
            let (lo, hi) = codes.split_at(m.cols / 4);
            let blocks = lo.chunks_exact(16).zip(hi.chunks_exact(8));
            for (bi, (o64, (l, h))) in out.chunks_exact_mut(64).zip(blocks).enumerate() {
                let g = r * gpr + bi * 64 / m.group_size;
                let (s, mn) = (f16_at(m.scales, g), f16_at(m.mins, g));
                int3_block(l, h, &mut q);
                for (o, &c) in o64.iter_mut().zip(&q) {
                    *o = dequant(s, c as f32, mn);
                }
            }
        }
        WeightKind::Int8 | WeightKind::Int4 | WeightKind::Int2 => {
            // Group by group, a byte's codes at a time (the same values as `code_at`, in loops
            // the compiler vectorizes: prefill dequantizes every row it multiplies).
            let (gpr, gs) = (m.groups_per_row(), m.group_size);
            let bits = m.kind.bits();
            let per = 8 / bits;
            let mask = ((1u16 << bits) - 1) as u8;
            for (gi, (chunk, bytes)) in out.chunks_mut(gs).zip(codes.chunks(gs / per)).enumerate() {
                let g = r * gpr + gi;
                let s = f16_at(m.scales, g);
                if m.kind == WeightKind::Int8 {
                    for (o, &c) in chunk.iter_mut().zip(bytes) {
                        *o = dequant(s, c as i8 as f32, 0.0);
                    }
                    continue;
                }
                let mn = f16_at(m.mins, g);
                // 16 columns at a time (a group is a multiple of 16): codes unpacked to bytes,
                // then converted.
                for (o16, b) in chunk.chunks_exact_mut(16).zip(bytes.chunks_exact(16 / per)) {
                    let mut q = [0u8; 16];
                    for (i, v) in q.iter_mut().enumerate() {
                        *v = (b[i / per] >> (bits * (i % per))) & mask;
                    }
                    for (o, &c) in o16.iter_mut().zip(&q) {
                        *o = dequant(s, c as f32, mn);
                    }
                }
            }
        }
    }
}

/// Sum of x over each group (asymmetric kinds only; empty otherwise).
pub(super) fn group_sums<'b>(m: &Matrix, x: &[f32], buf: &'b mut [f32]) -> &'b [f32] {
    if m.kind.has_mins() {
        for (s, xg) in buf.iter_mut().zip(x.chunks_exact(m.group_size)) {
            *s = xg.iter().sum();
        }
    }
    buf
}

pub(super) fn matvec_rows(
    m: &Matrix,
    x: &[f32],
    xsums: &[f32],
    rows: Range<usize>,
    out: &mut [f32],
) {
    for (o, r) in out.iter_mut().zip(rows) {
        *o = dot_row(m, r, x, xsums);
    }
}

fn dot_row(m: &Matrix, r: usize, x: &[f32], xsums: &[f32]) -> f32 {
    let codes = row_codes(m, r);
    let dense = |at: fn(&[u8], usize) -> f32| {
        x.iter()
            .enumerate()
            .fold(0.0f32, |acc, (i, &xi)| acc + at(codes, i) * xi)
    };
    match m.kind {
        WeightKind::F32 => dense(f32_at),
        WeightKind::F16 => dense(f16_at),
        WeightKind::Bf16 => dense(bf16_at),
        WeightKind::Mxfp4 => unreachable!("mxfp4 rows: quant::mxfp4"),
        WeightKind::Int4k | WeightKind::Int2k => unreachable!("sub-scaled rows: quant::subscales"),
        WeightKind::Ap8 { .. } => unreachable!("ap8 rows: quant::planes"),
        WeightKind::Int8 | WeightKind::Int4 | WeightKind::Int3 | WeightKind::Int2 => {
            let gs = m.group_size;
            let gpr = m.groups_per_row();
            let mut acc = 0.0f32;
            for (g, xg) in x.chunks_exact(gs).enumerate() {
                let qx = xg.iter().enumerate().fold(0.0f32, |a, (j, &xi)| {
                    a + code_at(m.kind, codes, g * gs + j) * xi
                });
                let s = f16_at(m.scales, r * gpr + g);
                acc += s * qx;
                if m.kind.has_mins() {
                    acc += f16_at(m.mins, r * gpr + g) * xsums[g];
                }
            }
            acc
        }
    }
}
