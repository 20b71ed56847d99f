//! int4k (VariantKind::Int4k): int4 codes in groups of 32 whose scale and min are 8-bit
//! multiples of their row's f16 pair. The CPU kernels are int4's: a block of rows at a time is
//! viewed as int4/g32 with each group's (scale, min) expanded to the f16 values the format
//! defines (f16(d * a), f16(m * b): the products are exact in f32, so every reader rounds
//! the same value once).

use std::ops::Range;

use half::f16;

use super::scalar::f16_at;
use super::{Matrix, WeightKind};

/// Values a group: int4k's groups are fixed.
pub(super) const GROUP: usize = 32;

/// Rows expanded per block: 64 rows of 4096 columns are 32 KB of f16 scales and mins.
const BLOCK_ROWS: usize = 64;

/// Row `r`'s group parameters as f16 bits: f16(d a) into `s`, f16(dm b) into `m`.
fn expand_row(m: &Matrix, r: usize, s: &mut [u16], mn: &mut [u16]) {
    let gpr = m.groups_per_row();
    let ab = &m.scales[2 * r * gpr..2 * (r + 1) * gpr];
    let pair = (f16_at(m.mins, 2 * r), f16_at(m.mins, 2 * r + 1));
    #[cfg(target_arch = "x86_64")]
    if super::x86::available() {
        // SAFETY: AVX2, FMA and F16C are present (checked); s and mn hold gpr values each and
        // ab 2 gpr bytes (the row's, sliced above).
        return unsafe { super::x86::int4k_expand(ab, pair, s, mn) };
    }
    expand_scalar(ab, pair, s, mn);
}

/// `expand_row`'s arithmetic, a group at a time (the reference for the SIMD forms).
fn expand_scalar(ab: &[u8], (d, dm): (f32, f32), s: &mut [u16], mn: &mut [u16]) {
    for ((s, mn), ab) in s.iter_mut().zip(mn.iter_mut()).zip(ab.chunks_exact(2)) {
        *s = f16::from_f32(d * f32::from(ab[0])).to_bits();
        *mn = f16::from_f32(dm * f32::from(ab[1] as i8)).to_bits();
    }
}

/// `f(view, at)` for each block of `rows`: `view` the block's rows as an int4/g32 matrix (its
/// row 0 is the block's first), `at` the block's place in a per-row output of `rows`.
pub(super) fn with_rows(m: &Matrix, rows: Range<usize>, mut f: impl FnMut(&Matrix, Range<usize>)) {
    debug_assert_eq!(m.kind, WeightKind::Int4k);
    let (gpr, rb) = (m.groups_per_row(), m.row_bytes());
    let n = BLOCK_ROWS.min(rows.len()) * gpr;
    let (mut scales, mut mins) = (vec![0u16; n], vec![0u16; n]);
    let mut start = rows.start;
    while start < rows.end {
        let end = (start + BLOCK_ROWS).min(rows.end);
        let k = (end - start) * gpr;
        for (j, (s, mn)) in scales[..k]
            .chunks_exact_mut(gpr)
            .zip(mins[..k].chunks_exact_mut(gpr))
            .enumerate()
        {
            expand_row(m, start + j, s, mn);
        }
        let view = Matrix {
            kind: WeightKind::Int4,
            group_size: GROUP,
            rows: end - start,
            cols: m.cols,
            codes: &m.codes[start * rb..end * rb],
            scales: bytemuck::cast_slice(&scales[..k]),
            mins: bytemuck::cast_slice(&mins[..k]),
        };
        f(&view, start - rows.start..end - rows.start);
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The F16C expansion rounds as `half` does: every byte pair under pairs whose products are
    /// normal, subnormal (d = 2^-24: f16's smallest step), ties and beyond f16's range.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_expansion_is_the_scalar_one() {
        if !super::super::x86::available() {
            return;
        }
        let ab: Vec<u8> = (0..=255u8).flat_map(|a| [a, a.wrapping_mul(37)]).collect();
        let n = ab.len() / 2;
        for pair in [
            (1.0 / 255.0, -0.01),
            (2f32.powi(-24), 2f32.powi(-20)),
            (0.1, 3.3),
            (1000.0, -600.0),
        ] {
            let pair = (
                f16::from_f32(pair.0).to_f32(),
                f16::from_f32(pair.1).to_f32(),
            );
            let (mut s0, mut m0, mut s1, mut m1) = (vec![0; n], vec![0; n], vec![0; n], vec![0; n]);
            expand_scalar(&ab, pair, &mut s0, &mut m0);
            // SAFETY: AVX2, FMA and F16C are present (checked above); every slice holds n.
            unsafe { super::super::x86::int4k_expand(&ab, pair, &mut s1, &mut m1) };
            assert_eq!((s0, m0), (s1, m1), "pair {pair:?}");
        }
    }
}
