//! int4k and int2k (VariantKind::Int4k, Int2k): int4 codes in groups of 32 (int2: of 16) whose
//! scale and min are 8-bit (4-bit) multiples of their row's f16 pair. Each group's (scale, min)
//! is the f16 value the format defines, f16(d a) and f16(dm b): the products are exact in f32, so
//! every reader rounds the same value once. On AVX-512 VNNI the integer kernel makes them from the
//! bytes as it goes (x86/vnni.rs `sub_scales`); the other kernels are int4's and int2's, a block
//! of rows at a time viewed as int4/g32 (int2/g16) with the parameters expanded first (`with_rows`).

use std::ops::Range;

use half::f16;

use super::scalar::f16_at;
use super::{Matrix, WeightKind};

/// Values a group: int4k's 32, int2k's 16.
pub(super) fn group(kind: WeightKind) -> usize {
    match kind {
        WeightKind::Int2k => 16,
        _ => 32,
    }
}

/// Rows expanded per block: 64 rows of 4096 columns are 32 KB of f16 scales and mins (int4k).
const BLOCK_ROWS: usize = 64;

/// A group's (a, b): int4k's two bytes (u8, i8), int2k's byte (low nibble u4, high nibble i4).
#[inline]
pub(super) fn group_ab(kind: WeightKind, scales: &[u8], g: usize) -> (f32, f32) {
    match kind {
        WeightKind::Int2k => {
            let v = scales[g];
            (f32::from(v & 15), f32::from((v as i8) >> 4))
        }
        _ => (f32::from(scales[2 * g]), f32::from(scales[2 * g + 1] as i8)),
    }
}

/// Row `r`'s group parameters as f16 bits: f16(d a) into `s`, f16(dm b) into `m`.
fn expand_row(m: &Matrix, r: usize, s: &mut [u16], mn: &mut [u16]) {
    let gpr = m.groups_per_row();
    let sb = m.kind.scale_bytes();
    let ab = &m.scales[sb * r * gpr..sb * (r + 1) * gpr];
    let pair = (f16_at(m.mins, 2 * r), f16_at(m.mins, 2 * r + 1));
    #[cfg(target_arch = "x86_64")]
    if super::x86::available() {
        // SAFETY: AVX2, FMA and F16C are present (checked); s and mn hold gpr values each and
        // ab the row's gpr groups' bytes (sliced above).
        return unsafe { super::x86::subscales_expand(m.kind, ab, pair, s, mn) };
    }
    expand_scalar(m.kind, ab, pair, s, mn);
}

/// `expand_row`'s arithmetic, a group at a time (the reference for the SIMD forms).
pub(super) fn expand_scalar(
    kind: WeightKind,
    ab: &[u8],
    (d, dm): (f32, f32),
    s: &mut [u16],
    mn: &mut [u16],
) {
    for (g, (s, mn)) in s.iter_mut().zip(mn.iter_mut()).enumerate() {
        let (a, b) = group_ab(kind, ab, g);
        *s = f16::from_f32(d * a).to_bits();
        *mn = f16::from_f32(dm * b).to_bits();
    }
}

/// `f(view, at)` for each block of `rows`: `view` the block's rows as an int4/g32 (int2/g16)
/// matrix (its row 0 is the block's first), `at` the block's place in a per-row output of `rows`.
pub(super) fn with_rows(m: &Matrix, rows: Range<usize>, mut f: impl FnMut(&Matrix, Range<usize>)) {
    debug_assert!(m.kind.is_sub_scaled());
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
            kind: match m.kind {
                WeightKind::Int2k => WeightKind::Int2,
                _ => WeightKind::Int4,
            },
            group_size: group(m.kind),
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

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The F16C expansion rounds as `half` does: every byte (pair) under pairs whose products
    /// are normal, subnormal (d = 2^-24: f16's smallest step), ties and beyond f16's range.
    #[test]
    fn simd_expansion_is_the_scalar_one() {
        if !super::super::x86::available() {
            return;
        }
        let pairs = [
            (1.0 / 255.0, -0.01),
            (2f32.powi(-24), 2f32.powi(-20)),
            (0.1, 3.3),
            (1000.0, -600.0),
            (70000.0, -5000.0),
        ];
        for kind in [WeightKind::Int4k, WeightKind::Int2k] {
            let ab: Vec<u8> = match kind {
                WeightKind::Int2k => (0..=255u8).collect(),
                _ => (0..=255u8).flat_map(|a| [a, a.wrapping_mul(37)]).collect(),
            };
            let n = ab.len() / kind.scale_bytes();
            for pair in pairs {
                let pair = (
                    f16::from_f32(pair.0).to_f32(),
                    f16::from_f32(pair.1).to_f32(),
                );
                let (mut s0, mut m0) = (vec![0; n], vec![0; n]);
                let (mut s1, mut m1) = (vec![0; n], vec![0; n]);
                expand_scalar(kind, &ab, pair, &mut s0, &mut m0);
                // SAFETY: AVX2, FMA and F16C are present (checked above); every slice holds n.
                unsafe { super::super::x86::subscales_expand(kind, &ab, pair, &mut s1, &mut m1) };
                assert_eq!((s0, m0), (s1, m1), "{kind:?} pair {pair:?}");
            }
        }
    }
}
