//! ap8, the any-precision variant (formats/hob.md, "ap8"): one 8-bit parent code a weight, stored
//! as bit planes most significant first, so that reading an expert at width k (2..=8) is one
//! prefix of its blob. Width k reads `q8 >> (8 - k)` under its own (scale, min) a group, derived
//! from the parent's by `group_params`. This module is the byte layout and that arithmetic; the
//! quantizer and the CPU kernels are in quant::planes.

use half::f16;

use super::variant::{align_up, SUBARRAY_ALIGN};

/// The narrowest and widest widths a view reads.
pub const MIN_WIDTH: u8 = 2;
pub const MAX_WIDTH: u8 = 8;
/// Widths whose groups store a correction byte to the parent-derived (scale, min); the others
/// read the parent's bucket midpoints (within 3% RMS of refitted tables from width 5 up,
/// benches/results/2026-12-04-cpu-issue54-ap8.md).
pub const CORRECTED: [u8; 3] = [2, 3, 4];
/// Bytes before the first segment: the CRC-32C of each view's prefix (widths 2..=7), u32 each.
pub const HEADER: usize = 64;

/// Where one matrix (part 0 gate, 1 up, 2 down) of an ap8 expert keeps its pieces, as byte
/// offsets from the blob start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartLayout {
    /// Parent scales and mins, f16 a group.
    pub s8: usize,
    pub m8: usize,
    /// Correction bytes for widths 2, 3, 4 (`CORRECTED`), one a group.
    pub corr: [usize; 3],
    /// The top two bits of each code, packed as int2's codes.
    pub top: usize,
    /// Bit planes 5..=0 (read by widths 3..=8), one bit a code, element i in bit i % 8 of byte
    /// i / 8.
    pub planes: [usize; 6],
}

/// The segments of an ap8 expert with `n` values a matrix in groups of `g`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApLayout {
    pub parts: [PartLayout; 3],
    /// ends[k - 2]: where width k's prefix ends (64-aligned; ends[6] is the whole blob).
    pub ends: [usize; 7],
}

impl ApLayout {
    /// Errors name a shape the layout cannot hold: `n` (every matrix's rows x cols) must be a
    /// multiple of `g`, and `g` of 64.
    pub fn new(n: usize, g: usize) -> Result<ApLayout, String> {
        if g == 0 || !g.is_multiple_of(64) || !n.is_multiple_of(g) {
            return Err(format!(
                "ap8: {n} values a matrix are not whole groups of {g} (a multiple of 64)"
            ));
        }
        let groups = n / g;
        let mut at = HEADER;
        // Where the next piece of `len` bytes goes; `at` moves past it, 64-aligned.
        let take = |at: &mut usize, len: usize| -> Result<usize, String> {
            let start = *at;
            *at = start
                .checked_add(len)
                .and_then(|e| align_up(e, SUBARRAY_ALIGN))
                .ok_or_else(|| format!("ap8: an expert of 3 x {n} values is too large"))?;
            Ok(start)
        };
        let blank = PartLayout {
            s8: 0,
            m8: 0,
            corr: [0; 3],
            top: 0,
            planes: [0; 6],
        };
        let mut parts = [blank; 3];
        let mut ends = [0; 7];
        for p in parts.iter_mut() {
            p.s8 = take(&mut at, 2 * groups)?;
            p.m8 = take(&mut at, 2 * groups)?;
            p.corr[0] = take(&mut at, groups)?;
            p.top = take(&mut at, n / 4)?;
        }
        ends[0] = at;
        for k in 3..=8usize {
            for p in parts.iter_mut() {
                if k <= 4 {
                    p.corr[k - 2] = take(&mut at, groups)?;
                }
                p.planes[k - 3] = take(&mut at, n / 8)?;
            }
            ends[k - 2] = at;
        }
        Ok(ApLayout { parts, ends })
    }

    /// Bytes a view of width `k` reads.
    pub fn prefix(&self, k: u8) -> usize {
        self.ends[usize::from(k - MIN_WIDTH)]
    }
}

/// The f16 (scale, min) a group is read with at width `k` from its parent pair (`s8`, `m8`) and,
/// for the `CORRECTED` widths, its correction byte `c` (low nibble a, high nibble b, each i4):
/// with `h = 2^(8 - k)`, `s = s8 h` and `m = m8 + s8 (h - 1) / 2` (the bucket midpoint), the
/// result is `(f16(s (1 + a / 96)), f16(m + b s / 24))`; widths 5..=7 round (s, m) to f16; width
/// 8 is the parent itself. Every step is an f32 operation in this order.
pub fn group_params(k: u8, s8: f16, m8: f16, c: u8) -> (f16, f16) {
    if k >= MAX_WIDTH {
        return (s8, m8);
    }
    let h = (1u32 << (MAX_WIDTH - k)) as f32;
    let (s8, m8) = (s8.to_f32(), m8.to_f32());
    let s = s8 * h;
    let m = m8 + s8 * ((h - 1.0) * 0.5);
    if !CORRECTED.contains(&k) {
        return (f16::from_f32(s), f16::from_f32(m));
    }
    let (a, b) = correction(c);
    (
        f16::from_f32(s * (1.0 + a / 96.0)),
        f16::from_f32(m + b * s / 24.0),
    )
}

/// A correction byte's (a, b): its low and high nibbles as i4 (-8..=7).
pub fn correction(c: u8) -> (f32, f32) {
    (f32::from(((c << 4) as i8) >> 4), f32::from((c as i8) >> 4))
}

/// The correction byte of (a, b), each in -8..=7.
pub fn correction_byte(a: i8, b: i8) -> u8 {
    debug_assert!((-8..=7).contains(&a) && (-8..=7).contains(&b));
    (a as u8 & 15) | ((b as u8) << 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_nest_and_align() {
        // Mixtral-like numbers scaled down: 3 matrices of 128 x 64 in groups of 64.
        let l = ApLayout::new(128 * 64, 64).unwrap();
        let g = 128;
        assert_eq!(l.parts[0].s8, HEADER);
        assert_eq!(l.parts[0].m8, HEADER + 2 * g);
        assert_eq!(l.parts[1].s8 - l.parts[0].s8, l.parts[2].s8 - l.parts[1].s8);
        assert!(l.ends.windows(2).all(|w| w[0] < w[1]));
        assert!(l.ends.iter().all(|e| e % 64 == 0));
        // Width 2 reads tables and the top chunks; width 3 one plane and one byte a group more.
        assert_eq!(l.ends[0], HEADER + 3 * (2 * g + 2 * g + g + 128 * 64 / 4));
        assert_eq!(l.ends[1] - l.ends[0], 3 * (g + 128 * 64 / 8));
        assert_eq!(l.ends[6] - l.ends[5], 3 * (128 * 64 / 8));
        assert!(l.parts[2].planes[5] + 128 * 64 / 8 <= l.ends[6]);
        assert!(ApLayout::new(100 * 64, 32).is_err());
        assert!(ApLayout::new(100, 64).is_err());
    }

    #[test]
    fn corrections_round_trip_and_width_8_is_the_parent() {
        for a in -8..=7i8 {
            for b in -8..=7i8 {
                let (fa, fb) = correction(correction_byte(a, b));
                assert_eq!((fa, fb), (f32::from(a), f32::from(b)));
            }
        }
        let (s8, m8) = (f16::from_f32(0.01), f16::from_f32(-0.5));
        assert_eq!(group_params(8, s8, m8, 0x7f), (s8, m8));
        // Width 4 with no correction: the midpoint of each 16-code bucket.
        let (s, m) = group_params(4, s8, m8, 0);
        assert_eq!(s, f16::from_f32(s8.to_f32() * 16.0));
        assert_eq!(m, f16::from_f32(m8.to_f32() + s8.to_f32() * 7.5));
    }
}
