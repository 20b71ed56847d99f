//! ap8, the any-precision variant (format::ap8): its quantizer, and the CPU's reading of a view.
//!
//! The CPU multiplies with a view of width k by expanding a block of rows into a matrix its
//! kernels take, with each group's (scale, min) from `ap8::group_params`: int2 (width 2: the top
//! chunk's bytes are int2 codes as they are), int4 (widths 3 and 4: nibbles from the top chunk
//! and the planes) or f32 values (the other widths). Decode on AVX-512 reads the planes directly
//! instead (x86/planes.rs, benches/results/2026-12-04-cpu-issue54-ap8.md).

use std::ops::Range;

use half::f16;
use rayon::prelude::*;

use super::quantize::{refit, weigh, Scratch};
use super::{Matrix, WeightKind};
use crate::format::ap8::{self, ApLayout, PartLayout};

/// Rows expanded per block (64 rows of 4096 f32 values: 1 MiB).
const BLOCK_ROWS: usize = 64;

/// The layout and part of an ap8 view's matrix, and its width.
pub(super) fn geometry(m: &Matrix) -> (PartLayout, u8) {
    let WeightKind::Ap8 { width, part } = m.kind else {
        unreachable!("planes::geometry on {:?}", m.kind)
    };
    let layout = ApLayout::new(m.rows * m.cols, m.group_size).expect("checked by the reader");
    (layout.parts[usize::from(part)], width)
}

/// Bytes an ap8 view's `codes` must hold (its prefix).
pub(super) fn prefix_len(m: &Matrix) -> usize {
    let WeightKind::Ap8 { width, .. } = m.kind else {
        return 0;
    };
    ApLayout::new(m.rows * m.cols, m.group_size).map_or(usize::MAX, |l| l.prefix(width))
}

/// Bit i of a byte as byte i of a u64 (0 or 1).
const SPREAD1: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut i = 0;
        while i < 8 {
            t[b] |= (((b >> i) & 1) as u64) << (8 * i);
            i += 1;
        }
        b += 1;
    }
    t
};

/// The four 2-bit codes of a byte (int2's order) as bytes 0..4 of a u64.
const SPREAD2: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut i = 0;
        while i < 4 {
            t[b] |= (((b >> (2 * i)) & 3) as u64) << (8 * i);
            i += 1;
        }
        b += 1;
    }
    t
};

/// Codes `i..i + 8` of a part at width `k` (i a multiple of 8), one a byte of the result: the
/// top two bits, then planes 5, 4, ... as lower bits (no carries cross bytes: every code < 256).
#[inline]
fn codes8(bytes: &[u8], p: &PartLayout, k: u8, i: usize) -> u64 {
    let top = &bytes[p.top + i / 4..p.top + i / 4 + 2];
    let mut q = SPREAD2[usize::from(top[0])] | (SPREAD2[usize::from(top[1])] << 32);
    for &at in &p.planes[..usize::from(k) - 2] {
        q = (q << 1) | SPREAD1[usize::from(bytes[at + i / 8])];
    }
    q
}

/// The parent pairs (f16 bytes) and, for the corrected widths, the correction bytes of a run of
/// groups, each slice starting at its first group.
pub(super) type Tables<'a> = (&'a [u8], &'a [u8], Option<&'a [u8]>);

/// Group `j` of `t`'s (scale, min) at width `k`.
pub(super) fn table_at(k: u8, (s8, m8, corr): Tables, j: usize) -> (f16, f16) {
    let f = |b: &[u8]| f16::from_le_bytes([b[2 * j], b[2 * j + 1]]);
    ap8::group_params(k, f(s8), f(m8), corr.map_or(0, |c| c[j]))
}

/// A part's tables at width `k` (its corrections where `k` has them).
pub(super) fn part_tables<'a>(bytes: &'a [u8], p: &PartLayout, k: u8) -> Tables<'a> {
    let corr = match k {
        2..=4 => Some(&bytes[p.corr[usize::from(k) - 2]..]),
        _ => None,
    };
    (&bytes[p.s8..], &bytes[p.m8..], corr)
}

/// `f(view, at)` for each block of `rows`: `view` the block as an int2 (width 2), int4 (3 and 4)
/// or f32 matrix (its row 0 the block's first), `at` the block's place in a per-row output of
/// `rows`.
pub(super) fn with_rows(m: &Matrix, rows: Range<usize>, mut f: impl FnMut(&Matrix, Range<usize>)) {
    let (p, k) = geometry(m);
    let (cols, g) = (m.cols, m.group_size);
    let gpr = cols / g;
    let n = BLOCK_ROWS.min(rows.len());
    let (mut scales, mut mins) = (vec![0u16; n * gpr], vec![0u16; n * gpr]);
    let mut codes = vec![0u8; if k == 3 || k == 4 { n * cols / 2 } else { 0 }];
    let mut values = vec![0f32; if k <= 4 { 0 } else { n * cols }];
    let tables = part_tables(m.codes, &p, k);
    let mut start = rows.start;
    while start < rows.end {
        let end = (start + BLOCK_ROWS).min(rows.end);
        let nr = end - start;
        for (j, r) in (start..end).enumerate() {
            for c in 0..gpr {
                let (s, mn) = table_at(k, tables, r * gpr + c);
                scales[j * gpr + c] = s.to_bits();
                mins[j * gpr + c] = mn.to_bits();
            }
        }
        let view = match k {
            2 => Matrix {
                kind: WeightKind::Int2,
                group_size: g,
                rows: nr,
                cols,
                codes: &m.codes[p.top + start * cols / 4..p.top + end * cols / 4],
                scales: bytemuck::cast_slice(&scales[..nr * gpr]),
                mins: bytemuck::cast_slice(&mins[..nr * gpr]),
            },
            3 | 4 => {
                let base = start * cols;
                for (b, out) in codes[..nr * cols / 2].chunks_exact_mut(4).enumerate() {
                    // Eight codes, a byte each, to four bytes of nibble pairs (width 3's below 8).
                    let q = codes8(m.codes, &p, k, base + 8 * b);
                    let pairs = (q | (q >> 4)) & 0x00ff_00ff_00ff_00ff;
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = (pairs >> (16 * j)) as u8;
                    }
                }
                Matrix {
                    kind: WeightKind::Int4,
                    group_size: g,
                    rows: nr,
                    cols,
                    codes: &codes[..nr * cols / 2],
                    scales: bytemuck::cast_slice(&scales[..nr * gpr]),
                    mins: bytemuck::cast_slice(&mins[..nr * gpr]),
                }
            }
            _ => {
                let base = start * cols;
                for (gi, vg) in values[..nr * cols].chunks_exact_mut(g).enumerate() {
                    let s = f16::from_bits(scales[gi]).to_f32();
                    let mn = f16::from_bits(mins[gi]).to_f32();
                    for (j, v8) in vg.chunks_exact_mut(8).enumerate() {
                        let q = codes8(m.codes, &p, k, base + gi * g + 8 * j).to_le_bytes();
                        for (v, &q) in v8.iter_mut().zip(&q) {
                            *v = s * f32::from(q) + mn;
                        }
                    }
                }
                Matrix::dense(
                    crate::format::DType::F32,
                    nr,
                    cols,
                    bytemuck::cast_slice(&values[..nr * cols]),
                )
            }
        };
        f(&view, start - rows.start..end - rows.start);
        start = end;
    }
}

/// One ap8 expert blob from its three matrices' values (gate and up [ffn, hidden], down
/// [hidden, ffn]): each group's parent over its [min, max], codes round((w - m8) / s8), the
/// correction byte of widths 2..=4 nearest to a weighted least-squares refit of that width's
/// codes and then the best of its neighbours within 1, and the header's prefix checksums.
pub fn quantize_expert(group: usize, n: usize, parts: [&[f32]; 3]) -> Vec<u8> {
    let layout = ApLayout::new(n, group).expect("the writer checked the shape");
    let mut blob = vec![0u8; layout.prefix(ap8::MAX_WIDTH)];
    for (p, src) in layout.parts.iter().zip(parts) {
        assert_eq!(src.len(), n, "ap8 part length");
        // Per group: s8, m8, three correction bytes, 64 codes per 64 values.
        let groups: Vec<(f16, f16, [u8; 3], Vec<u8>)> = src
            .par_chunks(group)
            .map_init(|| Scratch::new(group), |sc, w| quantize_group(w, sc))
            .collect();
        for (gi, (s8, m8, corr, q)) in groups.iter().enumerate() {
            blob[p.s8 + 2 * gi..p.s8 + 2 * gi + 2].copy_from_slice(&s8.to_le_bytes());
            blob[p.m8 + 2 * gi..p.m8 + 2 * gi + 2].copy_from_slice(&m8.to_le_bytes());
            for (t, &c) in corr.iter().enumerate() {
                blob[p.corr[t] + gi] = c;
            }
            for (e, &q) in q.iter().enumerate() {
                let i = gi * group + e;
                blob[p.top + i / 4] |= (q >> 6) << (2 * (i % 4));
                for (t, &at) in p.planes.iter().enumerate() {
                    blob[at + i / 8] |= ((q >> (5 - t)) & 1) << (i % 8);
                }
            }
        }
    }
    for k in ap8::MIN_WIDTH..ap8::MAX_WIDTH {
        let crc = crc32c::crc32c(&blob[ap8::HEADER..layout.prefix(k)]);
        let at = 4 * usize::from(k - ap8::MIN_WIDTH);
        blob[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
    blob
}

/// One group: its parent pair, correction bytes for widths 2..=4 and 8-bit codes.
fn quantize_group(w: &[f32], sc: &mut Scratch) -> (f16, f16, [u8; 3], Vec<u8>) {
    let lo = w.iter().fold(f32::INFINITY, |a, &v| a.min(v));
    let hi = w.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    let s8 = f16::from_f32((hi - lo) / 255.0);
    let m8 = f16::from_f32(lo);
    let (s, m) = (s8.to_f32(), m8.to_f32());
    let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
    let q: Vec<u8> = w
        .iter()
        .map(|&v| ((v - m) * inv).round_ties_even().clamp(0.0, 255.0) as u8)
        .collect();
    let mut corr = [0u8; 3];
    for (t, &k) in ap8::CORRECTED.iter().enumerate() {
        corr[t] = correction_for(w, &q, s8, m8, k, sc);
    }
    (s8, m8, corr, q)
}

/// The correction byte of width `k` with the least weighted error for the group's codes.
fn correction_for(w: &[f32], q8: &[u8], s8: f16, m8: f16, k: u8, sc: &mut Scratch) -> u8 {
    let shift = ap8::MAX_WIDTH - k;
    for (q, &c) in sc.q.iter_mut().zip(q8) {
        *q = f32::from(c >> shift);
    }
    weigh(w, k >= 4, sc);
    let (mid_s, mid_m) = ap8::group_params(k, s8, m8, 0);
    let (mid_s, mid_m) = (mid_s.to_f32(), mid_m.to_f32());
    let sk: f32 = sc.wt.iter().sum();
    let skw: f32 = sc.wt.iter().zip(w).map(|(k, v)| k * v).sum();
    // The refit as a starting point; midpoint (a, b) = (0, 0) when the codes do not fix one.
    let (a0, b0) = match (mid_s > 0.0, refit(w, sk, skw, sc)) {
        (true, Some(p)) => (
            ((p.scale / mid_s - 1.0) * 96.0).round() as i32,
            ((p.min - mid_m) / mid_s * 24.0).round() as i32,
        ),
        _ => (0, 0),
    };
    let err = |c: u8| -> f32 {
        let (s, m) = ap8::group_params(k, s8, m8, c);
        let (s, m) = (s.to_f32(), m.to_f32());
        w.iter()
            .zip(&sc.q)
            .zip(&sc.wt)
            .map(|((&v, &q), &wt)| wt * (s * q + m - v) * (s * q + m - v))
            .sum()
    };
    let mut best = (err(0), 0u8);
    for a in (a0 - 1).clamp(-8, 7)..=(a0 + 1).clamp(-8, 7) {
        for b in (b0 - 1).clamp(-8, 7)..=(b0 + 1).clamp(-8, 7) {
            let c = ap8::correction_byte(a as i8, b as i8);
            let e = err(c);
            if e < best.0 {
                best = (e, c);
            }
        }
    }
    best.1
}
