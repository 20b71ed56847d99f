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

/// Group `g` of row `r`'s (scale, min) as f32 (f16 values).
pub(super) fn group_params(m: &Matrix, r: usize, g: usize) -> (f32, f32) {
    let gpr = m.groups_per_row();
    let (a, b) = (
        m.scales[2 * (r * gpr + g)],
        m.scales[2 * (r * gpr + g) + 1] as i8,
    );
    let (d, mn) = (f16_at(m.mins, 2 * r), f16_at(m.mins, 2 * r + 1));
    (
        f16::from_f32(d * f32::from(a)).to_f32(),
        f16::from_f32(mn * f32::from(b)).to_f32(),
    )
}

/// `f(view, at)` for each block of `rows`: `view` the block's rows as an int4/g32 matrix (its
/// row 0 is the block's first), `at` the block's place in a per-row output of `rows`.
pub(super) fn with_rows(m: &Matrix, rows: Range<usize>, mut f: impl FnMut(&Matrix, Range<usize>)) {
    debug_assert_eq!(m.kind, WeightKind::Int4k);
    let (gpr, rb) = (m.groups_per_row(), m.row_bytes());
    let mut scales = Vec::with_capacity(BLOCK_ROWS.min(rows.len()) * gpr * 2);
    let mut mins = Vec::with_capacity(scales.capacity());
    let mut start = rows.start;
    while start < rows.end {
        let end = (start + BLOCK_ROWS).min(rows.end);
        scales.clear();
        mins.clear();
        for r in start..end {
            for g in 0..gpr {
                let (s, mn) = group_params(m, r, g);
                scales.extend_from_slice(&f16::from_f32(s).to_le_bytes());
                mins.extend_from_slice(&f16::from_f32(mn).to_le_bytes());
            }
        }
        let view = Matrix {
            kind: WeightKind::Int4,
            group_size: GROUP,
            rows: end - start,
            cols: m.cols,
            codes: &m.codes[start * rb..end * rb],
            scales: &scales,
            mins: &mins,
        };
        f(&view, start - rows.start..end - rows.start);
        start = end;
    }
}
