//! Little-endian f32/f16/bf16 bytes <-> f32 values. Narrowing rounds to nearest, ties to even
//! (what torch's `.half()` and `.bfloat16()` do), via `half`.

use half::{bf16, f16};

use crate::format::DType;

/// Decode `bytes` (whole elements of `dtype`) into `out`, replacing its contents.
pub fn decode_into(dtype: DType, bytes: &[u8], out: &mut Vec<f32>) {
    out.clear();
    match dtype {
        DType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        DType::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()),
        ),
        DType::Bf16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()),
        ),
    }
}

/// Encode f32 values as `dtype` little-endian bytes.
pub fn encode(dtype: DType, values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    match dtype {
        DType::F32 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::F16 => values
            .iter()
            .for_each(|&v| out.extend_from_slice(&f16::from_f32(v).to_bits().to_le_bytes())),
        DType::Bf16 => values
            .iter()
            .for_each(|&v| out.extend_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes())),
    }
    out
}

/// (count, index of the first) non-finite values, or None when all are finite.
pub fn non_finite(values: &[f32]) -> Option<(usize, usize)> {
    let first = values.iter().position(|v| !v.is_finite())?;
    let count = values[first..].iter().filter(|v| !v.is_finite()).count();
    Some((count, first))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(dtype: DType, v: f32) -> f32 {
        let mut out = Vec::new();
        decode_into(dtype, &encode(dtype, &[v]), &mut out);
        out[0]
    }

    #[test]
    fn narrowing_rounds_ties_to_even() {
        // bf16 has 7 fraction bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
        assert_eq!(round_trip(DType::Bf16, 1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(
            round_trip(DType::Bf16, 1.0 + 3.0 * 2f32.powi(-8)),
            1.0 + 2f32.powi(-6)
        );
        // f16 has 10 fraction bits.
        assert_eq!(round_trip(DType::F16, 1.0 + 2f32.powi(-11)), 1.0);
        assert_eq!(
            round_trip(DType::F16, 1.0 + 3.0 * 2f32.powi(-11)),
            1.0 + 2f32.powi(-9)
        );
        assert_eq!(round_trip(DType::F16, 70000.0), f32::INFINITY);
    }

    #[test]
    fn widening_is_exact_and_f32_round_trips() {
        let vals = [0.0f32, -0.5, 1.5, 65504.0, -3.0e-5];
        for v in vals {
            assert_eq!(round_trip(DType::F16, v), f16::from_f32(v).to_f32());
            assert_eq!(round_trip(DType::F32, v).to_bits(), v.to_bits());
        }
        let mut out = Vec::new();
        decode_into(DType::Bf16, &[0x80, 0x3f, 0x00, 0xc0], &mut out);
        assert_eq!(out, [1.0, -2.0]);
    }

    #[test]
    fn finds_non_finite_values() {
        assert_eq!(non_finite(&[1.0, 2.0]), None);
        assert_eq!(
            non_finite(&[1.0, f32::NAN, 3.0, f32::NEG_INFINITY]),
            Some((2, 1))
        );
    }
}
