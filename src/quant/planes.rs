//! ap8, the any-precision variant (format::ap8): its quantizer, and the CPU's reading of a view.
//!
//! The CPU multiplies with a view of width k by expanding a block of rows into a matrix its
//! kernels take, with each 16's (scale, min) from `ap8::group_params`: int2/g16 (width 2: the top
//! chunk's bytes are int2 codes as they are), int4/g16 (widths 3 and 4: nibbles from the top
//! chunk and the planes) or f32 values (the other widths). Decode on AVX-512 reads the planes directly
//! instead (x86/planes.rs, benches/results/2026-12-04-cpu-issue54-ap8.md).

use std::ops::Range;

use half::f16;
use rayon::prelude::*;

use super::quantize::{weigh, Scratch};
use super::{Matrix, WeightKind};
use crate::format::ap8::{self, ApLayout, PartLayout, CORR_GROUP, SUB};

/// Rows expanded per block (64 rows of 4096 f32 values: 1 MiB).
const BLOCK_ROWS: usize = 64;

/// The expert layout an ap8 view's matrix belongs to (part 2, down, is [hidden, ffn]).
fn layout_of(m: &Matrix, part: u8) -> Result<ApLayout, String> {
    match part {
        2 => ApLayout::new(m.rows, m.cols),
        _ => ApLayout::new(m.cols, m.rows),
    }
}

/// The layout and part of an ap8 view's matrix, and its width.
pub(super) fn geometry(m: &Matrix) -> (PartLayout, u8) {
    let WeightKind::Ap8 { width, part } = m.kind else {
        unreachable!("planes::geometry on {:?}", m.kind)
    };
    let layout = layout_of(m, part).expect("checked by the reader");
    (layout.parts[usize::from(part)], width)
}

/// Bytes an ap8 view's `codes` must hold (its prefix).
pub(super) fn prefix_len(m: &Matrix) -> usize {
    let WeightKind::Ap8 { width, part } = m.kind else {
        return 0;
    };
    layout_of(m, part).map_or(usize::MAX, |l| l.prefix(width))
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

/// A part's tables at one width: the blob (its prefix), the part's layout, and where the
/// width's correction bytes start (the corrected widths).
#[derive(Clone, Copy)]
pub(super) struct Tables<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) p: PartLayout,
    pub(super) corr: Option<usize>,
}

/// Sub-range `j`'s (scale, min) at width `k` (j counts the part's 16s in row order).
pub(super) fn table_at(k: u8, t: Tables, j: usize) -> (f16, f16) {
    let (s8, m8) = t.p.parent(t.bytes, j);
    let c = t.corr.map_or(0, |c| t.bytes[c + j * SUB / CORR_GROUP]);
    ap8::group_params(k, s8, m8, c)
}

/// A part's tables at width `k` (its corrections where `k` has them).
pub(super) fn part_tables<'a>(bytes: &'a [u8], p: &PartLayout, k: u8) -> Tables<'a> {
    let corr = match k {
        2..=4 => Some(p.corr[usize::from(k) - 2]),
        _ => None,
    };
    Tables { bytes, p: *p, corr }
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
/// [hidden, ffn]): each row's pair and each 16's parent range over its [min, max] rounded
/// outward (`sub_ranges`), codes round((w - m8) / s8), for each 64 and width 2..=4 the
/// correction byte nearest to a weighted least-squares fit and then the best of its neighbours
/// within 1, and the header's prefix checksums.
pub fn quantize_expert(hidden: usize, ffn: usize, parts: [&[f32]; 3]) -> Vec<u8> {
    let layout = ApLayout::new(hidden, ffn).expect("the writer checked the shape");
    let mut blob = vec![0u8; layout.prefix(ap8::MAX_WIDTH)];
    for (p, src) in layout.parts.iter().zip(parts) {
        assert_eq!(src.len(), p.rows * p.cols, "ap8 part length");
        let rows: Vec<Row> = src
            .par_chunks(p.cols)
            .map_init(|| Scratch::new(CORR_GROUP), |sc, w| quantize_row(w, sc))
            .collect();
        for (r, row) in rows.iter().enumerate() {
            blob[p.pairs + 4 * r..p.pairs + 4 * r + 2].copy_from_slice(&row.d.to_le_bytes());
            blob[p.pairs + 4 * r + 2..p.pairs + 4 * r + 4].copy_from_slice(&row.dm.to_le_bytes());
            let (j0, c0) = (r * p.cols / SUB, r * p.cols / CORR_GROUP);
            blob[p.subs + j0..p.subs + j0 + row.subs.len()].copy_from_slice(&row.subs);
            for (t, corr) in row.corr.iter().enumerate() {
                blob[p.corr[t] + c0..p.corr[t] + c0 + corr.len()].copy_from_slice(corr);
            }
            for (e, &q) in row.q.iter().enumerate() {
                let i = r * p.cols + e;
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

/// One row's share of a blob: its pair, a byte a 16, correction bytes a 64 for widths 2..=4
/// and its 8-bit codes.
struct Row {
    d: f16,
    dm: f16,
    subs: Vec<u8>,
    corr: [Vec<u8>; 3],
    q: Vec<u8>,
}

/// The smallest f16 at least `v` (v >= 0, finite).
fn f16_up(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if h.to_f32() >= v {
        h
    } else {
        f16::from_bits(h.to_bits() + 1)
    }
}

/// A row's pair and each 16's byte: mins as -dm b (b in 0..=15, dm from the row's most
/// negative min), then steps as d a (a in 1..=15) reaching each 16's max from its min, both
/// rounded outward so that the 256 levels cover the 16's values up to f16 rounding.
fn sub_ranges(w: &[f32]) -> (f16, f16, Vec<u8>) {
    let ranges: Vec<(f32, f32)> = w
        .chunks_exact(SUB)
        .map(|c| {
            let lo = c.iter().fold(f32::INFINITY, |a, &v| a.min(v));
            let hi = c.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            (lo, hi)
        })
        .collect();
    let deepest = ranges.iter().fold(0f32, |a, &(lo, _)| a.max(-lo));
    let dm = f16_up(deepest / 15.0);
    let bs: Vec<u8> = ranges
        .iter()
        .map(|&(lo, _)| match dm.to_f32() > 0.0 {
            true => (-lo / dm.to_f32()).ceil().clamp(0.0, 15.0) as u8,
            false => 0,
        })
        .collect();
    let step = |(_, hi): (f32, f32), b: u8| {
        let (_, m8) = ap8::sub_pair(f16::ONE, dm, b << 4);
        (hi - m8.to_f32()).max(0.0) / 255.0
    };
    let need: Vec<f32> = ranges.iter().zip(&bs).map(|(&r, &b)| step(r, b)).collect();
    let d = f16_up(need.iter().fold(0f32, |a, &v| a.max(v)) / 15.0);
    let subs = need
        .iter()
        .zip(&bs)
        .map(|(&v, &b)| {
            let a = match d.to_f32() > 0.0 {
                true => (v / d.to_f32()).ceil().clamp(1.0, 15.0) as u8,
                false => 1,
            };
            a | b << 4
        })
        .collect();
    (d, dm, subs)
}

/// One row: its sub-ranges, codes and correction bytes.
fn quantize_row(w: &[f32], sc: &mut Scratch) -> Row {
    let (d, dm, subs) = sub_ranges(w);
    let parents: Vec<(f16, f16)> = subs.iter().map(|&b| ap8::sub_pair(d, dm, b)).collect();
    let mut q = vec![0u8; w.len()];
    for ((c, qc), &(s8, m8)) in w
        .chunks_exact(SUB)
        .zip(q.chunks_exact_mut(SUB))
        .zip(&parents)
    {
        let (s, m) = (s8.to_f32(), m8.to_f32());
        let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
        for (o, &v) in qc.iter_mut().zip(c) {
            *o = ((v - m) * inv).round_ties_even().clamp(0.0, 255.0) as u8;
        }
    }
    let per = CORR_GROUP / SUB;
    let corr = [2u8, 3, 4].map(|k| {
        w.chunks_exact(CORR_GROUP)
            .zip(q.chunks_exact(CORR_GROUP))
            .zip(parents.chunks_exact(per))
            .map(|((w, q), pp)| correction_for(w, q, pp, k, sc))
            .collect()
    });
    Row {
        d,
        dm,
        subs,
        corr,
        q,
    }
}

/// The correction byte of width `k` with the least weighted error for a 64's codes, its four
/// 16s under their own parents (`pp`): a weighted least-squares (a, b) to start, then its
/// neighbours within 1.
fn correction_for(w: &[f32], q8: &[u8], pp: &[(f16, f16)], k: u8, sc: &mut Scratch) -> u8 {
    let shift = ap8::MAX_WIDTH - k;
    for (q, &c) in sc.q.iter_mut().zip(q8) {
        *q = f32::from(c >> shift);
    }
    weigh(w, k >= 4, sc);
    // Residual from each 16's bucket midpoints, fitted as s (alpha q + beta) with s its width-k
    // step: a = 96 alpha, b = 24 beta.
    let params = |c: u8| -> Vec<(f32, f32)> {
        pp.iter()
            .map(|&(s8, m8)| {
                let (s, m) = ap8::group_params(k, s8, m8, c);
                (s.to_f32(), m.to_f32())
            })
            .collect()
    };
    let mid = params(0);
    let (mut s11, mut s12, mut s22, mut r1, mut r2) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for (i, (&v, (&q, &wt))) in w.iter().zip(sc.q.iter().zip(&sc.wt)).enumerate() {
        let (s, m) = mid[i / SUB];
        let (s, m) = (f64::from(s), f64::from(m));
        let (t1, t2, r) = (s * f64::from(q), s, f64::from(v) - m - s * f64::from(q));
        let wt = f64::from(wt);
        s11 += wt * t1 * t1;
        s12 += wt * t1 * t2;
        s22 += wt * t2 * t2;
        r1 += wt * t1 * r;
        r2 += wt * t2 * r;
    }
    let det = s11 * s22 - s12 * s12;
    let (a0, b0) = match det > 0.0 {
        true => (
            ((r1 * s22 - r2 * s12) / det * 96.0).round() as i32,
            ((s11 * r2 - s12 * r1) / det * 24.0).round() as i32,
        ),
        false => (0, 0),
    };
    let err = |c: u8| -> f32 {
        let sm = params(c);
        let mut e = 0f32;
        for (i, (&v, (&q, &wt))) in w.iter().zip(sc.q.iter().zip(&sc.wt)).enumerate() {
            let (s, m) = sm[i / SUB];
            let r = s * q + m - v;
            e += wt * r * r;
        }
        e
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
