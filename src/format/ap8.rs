//! ap8, the any-precision variant (formats/hob.md, "ap8"): one 8-bit parent code a weight, stored
//! as bit planes most significant first, so that reading an expert at width k (2..=8) is one
//! prefix of its blob. The parent's range is its own for every 16 values (`SUB`): a byte of two
//! 4-bit multiples of its row's f16 pair (`sub_pair`), as int2k's groups are. Width k reads
//! `q8 >> (8 - k)` under its own (scale, min) a 16, derived from the parent's by `group_params`
//! with a correction byte a 64 values (`CORR_GROUP`) for the narrow widths. This module is the
//! byte layout and that arithmetic; the quantizer and the CPU kernels are in quant::planes.

use half::f16;

use super::variant::{align_up, SUBARRAY_ALIGN};

/// The narrowest and widest widths a view reads.
pub const MIN_WIDTH: u8 = 2;
pub const MAX_WIDTH: u8 = 8;
/// Values under one parent range (the variant's group size).
pub const SUB: usize = 16;
/// Values under one correction byte (of each corrected width).
pub const CORR_GROUP: usize = 64;
/// Widths whose 64s store a correction byte to the parent-derived (scale, min); the others
/// read the parent's bucket midpoints (within 3% RMS of refitted tables from width 5 up,
/// benches/results/2026-12-04-cpu-issue54-ap8.md).
pub const CORRECTED: [u8; 3] = [2, 3, 4];
/// Bytes before the first segment: the CRC-32C of each view's prefix (widths 2..=7), u32 each.
pub const HEADER: usize = 64;

/// Where one matrix (part 0 gate, 1 up, 2 down) of an ap8 expert keeps its pieces, as byte
/// offsets from the blob start, and its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartLayout {
    pub rows: usize,
    pub cols: usize,
    /// Each row's pair (d, dm): two f16 a row.
    pub pairs: usize,
    /// One byte a 16 values (`sub_pair`).
    pub subs: usize,
    /// Correction bytes for widths 2, 3, 4 (`CORRECTED`), one a 64 values.
    pub corr: [usize; 3],
    /// The top two bits of each code, packed as int2's codes.
    pub top: usize,
    /// Bit planes 5..=0 (read by widths 3..=8), one bit a code, element i in bit i % 8 of byte
    /// i / 8.
    pub planes: [usize; 6],
}

impl PartLayout {
    /// Sub-range `j`'s parent pair (`sub_pair`) from the blob's bytes.
    pub fn parent(&self, bytes: &[u8], j: usize) -> (f16, f16) {
        let r = j * SUB / self.cols;
        let f = |at: usize| f16::from_le_bytes([bytes[at], bytes[at + 1]]);
        sub_pair(
            f(self.pairs + 4 * r),
            f(self.pairs + 4 * r + 2),
            bytes[self.subs + j],
        )
    }
}

/// The segments of an ap8 expert of `hidden` x `ffn` (gate and up [ffn, hidden], down [hidden,
/// ffn]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApLayout {
    pub parts: [PartLayout; 3],
    /// ends[k - 2]: where width k's prefix ends (64-aligned; ends[6] is the whole blob).
    pub ends: [usize; 7],
}

impl ApLayout {
    /// Errors name a shape the layout cannot hold: `hidden` and `ffn` must be multiples of 64.
    pub fn new(hidden: usize, ffn: usize) -> Result<ApLayout, String> {
        if hidden == 0
            || ffn == 0
            || !hidden.is_multiple_of(CORR_GROUP)
            || !ffn.is_multiple_of(CORR_GROUP)
        {
            return Err(format!(
                "ap8: an expert of hidden {hidden} and ffn {ffn} (both must be multiples of {CORR_GROUP})"
            ));
        }
        let n = hidden
            .checked_mul(ffn)
            .ok_or_else(|| format!("ap8: an expert of 3 x {hidden} x {ffn} values is too large"))?;
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
        let shape = |part: usize| {
            if part == 2 {
                (hidden, ffn)
            } else {
                (ffn, hidden)
            }
        };
        let mut parts = [0, 1, 2].map(|p| PartLayout {
            rows: shape(p).0,
            cols: shape(p).1,
            pairs: 0,
            subs: 0,
            corr: [0; 3],
            top: 0,
            planes: [0; 6],
        });
        let mut ends = [0; 7];
        for p in parts.iter_mut() {
            p.pairs = take(&mut at, 4 * p.rows)?;
            p.subs = take(&mut at, n / SUB)?;
            p.corr[0] = take(&mut at, n / CORR_GROUP)?;
            p.top = take(&mut at, n / 4)?;
        }
        ends[0] = at;
        for k in 3..=8usize {
            for p in parts.iter_mut() {
                if k <= 4 {
                    p.corr[k - 2] = take(&mut at, n / CORR_GROUP)?;
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

/// A 16's parent pair from its row's `(d, dm)` and its byte (a = the low nibble, b = the high
/// one, each u4): `s8 = f16(d a)`, `m8 = f16(-(dm b))`, f32 products.
pub fn sub_pair(d: f16, dm: f16, byte: u8) -> (f16, f16) {
    let (a, b) = (f32::from(byte & 15), f32::from(byte >> 4));
    (
        f16::from_f32(d.to_f32() * a),
        f16::from_f32(-(dm.to_f32() * b)),
    )
}

/// The f16 (scale, min) a 16 is read with at width `k` from its parent pair (`s8`, `m8`) and,
/// for the `CORRECTED` widths, its 64's correction byte `c` (low nibble a, high nibble b, each
/// i4): with `h = 2^(8 - k)`, `s = s8 h` and `m = m8 + s8 (h - 1) / 2` (the bucket midpoint),
/// the result is `(f16(s (1 + a / 96)), f16(m + s (b / 24)))`; widths 5..=7 round (s, m) to f16;
/// width 8 is the parent itself. Every step is an f32 operation in this order.
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
        f16::from_f32(m + s * (b / 24.0)),
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
        // 3 matrices of 128 x 64 (hidden 64, ffn 128).
        let l = ApLayout::new(64, 128).unwrap();
        let n = 128 * 64;
        let (g16, g64) = (n / 16, n / 64);
        assert_eq!(l.parts[0].pairs, HEADER);
        assert_eq!((l.parts[0].rows, l.parts[2].rows), (128, 64));
        assert_eq!(l.parts[0].subs, HEADER + 4 * 128);
        assert!(l.ends.windows(2).all(|w| w[0] < w[1]));
        assert!(l.ends.iter().all(|e| e % 64 == 0));
        // Width 2 reads the pairs, sub-range bytes, its corrections and the top chunks; width 3
        // one plane and one byte a 64 more.
        let seg2 = |rows: usize| 4 * rows + g16 + g64 + n / 4;
        assert_eq!(l.ends[0], HEADER + 2 * seg2(128) + seg2(64));
        assert_eq!(l.ends[1] - l.ends[0], 3 * (g64 + n / 8));
        assert_eq!(l.ends[6] - l.ends[5], 3 * (n / 8));
        assert!(l.parts[2].planes[5] + n / 8 <= l.ends[6]);
        assert!(ApLayout::new(100, 64).is_err());
        assert!(ApLayout::new(64, 0).is_err());
    }

    #[test]
    fn a_sub_range_reads_its_row_pair() {
        let l = ApLayout::new(64, 128).unwrap();
        let p = &l.parts[2];
        let mut b = vec![0u8; l.prefix(8)];
        // Row 1 of the down part (128 columns: sub-ranges 8..16), a = 3, b = 5.
        b[p.pairs + 4..p.pairs + 6].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b[p.pairs + 6..p.pairs + 8].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        b[p.subs + 9] = 3 | 5 << 4;
        assert_eq!(p.parent(&b, 9), (f16::from_f32(1.5), f16::from_f32(-1.25)));
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
