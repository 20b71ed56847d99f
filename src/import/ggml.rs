//! llama.cpp's GGML tensor types: their GGUF type codes, block geometry, and dequantization of the
//! block formats a GGUF's weights come in to f32 (for `convert --from model.gguf`).
//!
//! Codes, names and sizes are gguf-py's `GGMLQuantizationType` and `GGML_QUANT_SIZES`. The block
//! layouts are ggml's `block_q4_0` ... `block_q6_K` (ggml-common.h). The arithmetic follows
//! ggml's `dequantize_row_*`: f16 scales widened to f32, each product and sum rounded in f32, no
//! fused multiply-add; that makes the values equal gguf-py's numpy `quants.dequantize` bit for bit
//! (tests/import_ggml.rs holds the reference).

use half::f16;

/// Why a GGML type or row could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum GgmlError {
    #[error("GGML type code {code} is not one gguf-py knows ({})", known_codes())]
    UnknownCode { code: u32 },
    #[error(
        "GGML type {} (code {}) cannot be dequantized yet (supported: {})",
        ty.name(),
        ty.code(),
        supported_names()
    )]
    Unsupported { ty: GgmlType },
    #[error(
        "a {} row of {n_values} values is not a whole number of {}-value blocks",
        ty.name(),
        ty.block_size()
    )]
    PartialBlock { ty: GgmlType, n_values: usize },
    #[error("a {} row of {n_values} values would take more than usize::MAX bytes", ty.name())]
    RowTooLarge { ty: GgmlType, n_values: usize },
    #[error("a {} row of {n_values} values takes {expected} bytes, found {found}", ty.name())]
    RowBytes {
        ty: GgmlType,
        n_values: usize,
        expected: usize,
        found: usize,
    },
}

/// Values in a block of the legacy formats (Q4_0 ... Q8_0).
const QK: usize = 32;
/// Values in a K-quant super-block.
const QK_K: usize = 256;

// Bytes per block of each format decoded here (ggml-common.h).
const Q4_0_BYTES: usize = 2 + QK / 2;
const Q4_1_BYTES: usize = 2 + 2 + QK / 2;
const Q5_0_BYTES: usize = 2 + 4 + QK / 2;
const Q5_1_BYTES: usize = 2 + 2 + 4 + QK / 2;
const Q8_0_BYTES: usize = 2 + QK;
const Q2_K_BYTES: usize = QK_K / 16 + QK_K / 4 + 2 + 2;
const Q3_K_BYTES: usize = QK_K / 8 + QK_K / 4 + 12 + 2;
const Q4_K_BYTES: usize = 2 + 2 + 12 + QK_K / 2;
const Q5_K_BYTES: usize = 2 + 2 + 12 + QK_K / 8 + QK_K / 2;
const Q6_K_BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;

/// One enum, its code table and its geometry from a single list, so they cannot disagree.
macro_rules! ggml_types {
    ($($ty:ident = $code:literal: $block:expr, $bytes:expr;)*) => {
        /// A GGML tensor type, by its GGUF type code.
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum GgmlType {
            $($ty = $code,)*
        }

        impl GgmlType {
            /// Every type gguf-py knows, in code order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$ty,)*];

            /// The type with GGUF type code `code`.
            pub fn from_code(code: u32) -> Result<GgmlType, GgmlError> {
                match code {
                    $($code => Ok(GgmlType::$ty),)*
                    _ => Err(GgmlError::UnknownCode { code }),
                }
            }

            /// The name as gguf-py and llama.cpp spell it (`Q4_K`, `IQ2_XXS`).
            pub fn name(self) -> &'static str {
                match self {
                    $(GgmlType::$ty => stringify!($ty),)*
                }
            }

            /// Values per block.
            pub fn block_size(self) -> usize {
                match self {
                    $(GgmlType::$ty => $block,)*
                }
            }

            /// Bytes per block.
            pub fn type_size(self) -> usize {
                match self {
                    $(GgmlType::$ty => $bytes,)*
                }
            }
        }
    };
}

ggml_types! {
    F32 = 0: 1, 4;
    F16 = 1: 1, 2;
    Q4_0 = 2: QK, Q4_0_BYTES;
    Q4_1 = 3: QK, Q4_1_BYTES;
    Q5_0 = 6: QK, Q5_0_BYTES;
    Q5_1 = 7: QK, Q5_1_BYTES;
    Q8_0 = 8: QK, Q8_0_BYTES;
    Q8_1 = 9: QK, 2 + 2 + QK;
    Q2_K = 10: QK_K, Q2_K_BYTES;
    Q3_K = 11: QK_K, Q3_K_BYTES;
    Q4_K = 12: QK_K, Q4_K_BYTES;
    Q5_K = 13: QK_K, Q5_K_BYTES;
    Q6_K = 14: QK_K, Q6_K_BYTES;
    Q8_K = 15: QK_K, 4 + QK_K + QK_K / 8;
    IQ2_XXS = 16: QK_K, 2 + QK_K / 4;
    IQ2_XS = 17: QK_K, 2 + QK_K / 4 + QK_K / 32;
    IQ3_XXS = 18: QK_K, 2 + QK_K / 4 + QK_K / 8;
    IQ1_S = 19: QK_K, 2 + QK_K / 8 + QK_K / 16;
    IQ4_NL = 20: QK, 2 + QK / 2;
    IQ3_S = 21: QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4;
    IQ2_S = 22: QK_K, 2 + QK_K / 4 + QK_K / 16;
    IQ4_XS = 23: QK_K, 2 + 2 + QK_K / 2 + QK_K / 64;
    I8 = 24: 1, 1;
    I16 = 25: 1, 2;
    I32 = 26: 1, 4;
    I64 = 27: 1, 8;
    F64 = 28: 1, 8;
    IQ1_M = 29: QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32;
    BF16 = 30: 1, 2;
    TQ1_0 = 34: QK_K, 2 + 4 * 13;
    TQ2_0 = 35: QK_K, 2 + 64;
    MXFP4 = 39: 32, 1 + 16;
    NVFP4 = 40: 64, 4 + 32;
    Q1_0 = 41: 128, 2 + 16;
    Q2_0 = 42: 64, 2 + 16;
}

/// The types [`dequantize_row`] decodes.
pub const SUPPORTED: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::MXFP4,
];

fn supported_names() -> String {
    let names: Vec<_> = SUPPORTED.iter().map(|t| t.name()).collect();
    names.join(", ")
}

fn known_codes() -> String {
    let codes: Vec<_> = GgmlType::ALL
        .iter()
        .map(|t| format!("{}={}", t.name(), t.code()))
        .collect();
    codes.join(", ")
}

impl GgmlType {
    /// The GGUF type code.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Whether [`dequantize_row`] decodes this type.
    pub fn is_supported(self) -> bool {
        SUPPORTED.contains(&self)
    }

    /// Bytes of a row of `n_values` values; an error unless `n_values` fills whole blocks.
    pub fn row_bytes(self, n_values: usize) -> Result<usize, GgmlError> {
        if !n_values.is_multiple_of(self.block_size()) {
            return Err(GgmlError::PartialBlock { ty: self, n_values });
        }
        (n_values / self.block_size())
            .checked_mul(self.type_size())
            .ok_or(GgmlError::RowTooLarge { ty: self, n_values })
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Decode one row of `ty` (`bytes`, exactly `ty.row_bytes(out.len())` of them) into `out`.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), GgmlError> {
    if !ty.is_supported() {
        return Err(GgmlError::Unsupported { ty });
    }
    let expected = ty.row_bytes(out.len())?;
    if bytes.len() != expected {
        return Err(GgmlError::RowBytes {
            ty,
            n_values: out.len(),
            expected,
            found: bytes.len(),
        });
    }
    match ty {
        GgmlType::F32 => blocks::<4, 1>(bytes, out, |b, v| v[0] = f32::from_le_bytes(*b)),
        GgmlType::F16 => blocks::<2, 1>(bytes, out, |b, v| v[0] = f16_at(b, 0)),
        // bf16 is the top half of an f32.
        GgmlType::BF16 => blocks::<2, 1>(bytes, out, |b, v| {
            v[0] = f32::from_bits(u32::from(u16::from_le_bytes(*b)) << 16)
        }),
        GgmlType::Q4_0 => blocks(bytes, out, q4_0),
        GgmlType::Q4_1 => blocks(bytes, out, q4_1),
        GgmlType::Q5_0 => blocks(bytes, out, q5_0),
        GgmlType::Q5_1 => blocks(bytes, out, q5_1),
        GgmlType::Q8_0 => blocks(bytes, out, q8_0),
        GgmlType::Q2_K => blocks(bytes, out, q2_k),
        GgmlType::Q3_K => blocks(bytes, out, q3_k),
        GgmlType::Q4_K => blocks(bytes, out, q4_k),
        GgmlType::Q5_K => blocks(bytes, out, q5_k),
        GgmlType::Q6_K => blocks(bytes, out, q6_k),
        GgmlType::MXFP4 => blocks(bytes, out, mxfp4),
        _ => return Err(GgmlError::Unsupported { ty }),
    }
    Ok(())
}

/// Run `decode` on each block of `bytes` (`T` bytes a block) and its `B` values in `out`; the
/// caller has checked that both hold the same whole number of blocks.
fn blocks<const T: usize, const B: usize>(
    bytes: &[u8],
    out: &mut [f32],
    decode: impl Fn(&[u8; T], &mut [f32; B]),
) {
    let (blocks, _) = bytes.as_chunks::<T>();
    let (values, _) = out.as_chunks_mut::<B>();
    for (block, values) in blocks.iter().zip(values) {
        decode(block, values);
    }
}

/// The little-endian f16 at byte `at`, widened (exactly) to f32.
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

// Legacy formats: 32 values a block, one f16 scale `d` (and an f16 offset `m` in the _1 kinds).
// Byte j's low nibble is value j, its high nibble value j + 16; Q5's fifth bits are the u32 `qh`,
// bit i for value i.

/// Q4_0 { d: f16, qs: [u8; 16] }: x = d * (q - 8).
fn q4_0(b: &[u8; Q4_0_BYTES], out: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..].iter().enumerate() {
        out[j] = d * (i32::from(q & 0x0F) - 8) as f32;
        out[j + 16] = d * (i32::from(q >> 4) - 8) as f32;
    }
}

/// Q4_1 { d: f16, m: f16, qs: [u8; 16] }: x = d * q + m.
fn q4_1(b: &[u8; Q4_1_BYTES], out: &mut [f32; QK]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, &q) in b[4..].iter().enumerate() {
        out[j] = d * f32::from(q & 0x0F) + m;
        out[j + 16] = d * f32::from(q >> 4) + m;
    }
}

/// The two 5-bit quants of byte `j` of a Q5 block: values j and j + 16.
fn q5_pair(qh: u32, q: u8, j: usize) -> (u8, u8) {
    let fifth = |i: usize| (((qh >> i) & 1) as u8) << 4;
    ((q & 0x0F) | fifth(j), (q >> 4) | fifth(j + 16))
}

/// Q5_0 { d: f16, qh: [u8; 4], qs: [u8; 16] }: x = d * (q - 16).
fn q5_0(b: &[u8; Q5_0_BYTES], out: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for (j, &q) in b[6..].iter().enumerate() {
        let (lo, hi) = q5_pair(qh, q, j);
        out[j] = d * (i32::from(lo) - 16) as f32;
        out[j + 16] = d * (i32::from(hi) - 16) as f32;
    }
}

/// Q5_1 { d: f16, m: f16, qh: [u8; 4], qs: [u8; 16] }: x = d * q + m.
fn q5_1(b: &[u8; Q5_1_BYTES], out: &mut [f32; QK]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for (j, &q) in b[8..].iter().enumerate() {
        let (lo, hi) = q5_pair(qh, q, j);
        out[j] = d * f32::from(lo) + m;
        out[j + 16] = d * f32::from(hi) + m;
    }
}

/// Q8_0 { d: f16, qs: [i8; 32] }: x = d * q.
fn q8_0(b: &[u8; Q8_0_BYTES], out: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for (x, &q) in out.iter_mut().zip(&b[2..]) {
        *x = d * f32::from(q as i8);
    }
}

/// MXFP4 (OCP microscaling, gpt-oss's experts): an E8M0 exponent e, then 32 e2m1 codes two a
/// byte, value j in byte j's low nibble and value j + 16 in its high one; each is
/// e2m1(code) * 2^(e - 127), as ggml's `dequantize_row_mxfp4` (exactly: powers of two).
fn mxfp4(b: &[u8; 17], out: &mut [f32; 32]) {
    // Code 8 (e2m1's -0) is +0, as ggml's integer table has it.
    const E2M1: [f32; 16] = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];
    // 2^(e - 127) for every e, denormals included (e = 0 is 2^-127).
    let scale = f32::from_bits(match b[0] {
        0 => 0x0040_0000,
        e => u32::from(e) << 23,
    });
    for (j, &q) in b[1..].iter().enumerate() {
        out[j] = E2M1[usize::from(q & 0x0F)] * scale;
        out[j + 16] = E2M1[usize::from(q >> 4)] * scale;
    }
}

// K-quants: 256-value super-blocks of 16 sub-blocks of 16 (Q2_K, Q3_K, Q6_K) or 8 of 32 (Q4_K,
// Q5_K), each sub-block with its own small integer scale (and min) times the f16 super-scales.
// The 2-bit planes of Q2_K/Q3_K and Q6_K's high bits are packed 4 to a byte: value
// 128 h + 32 s + l (s in 0..4) is bits 2s..2s+2 of byte 32 h + l.

/// The 2 bits of value `i` of a 256-value super-block from its 64-byte plane.
fn crumb(plane: &[u8], i: usize) -> u8 {
    let (h, s, l) = (i / 128, i % 128 / 32, i % 32);
    (plane[32 * h + l] >> (2 * s)) & 3
}

/// Q2_K { scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16 }: sub-block s has scale
/// d * (scales[s] & 15) and min dmin * (scales[s] >> 4); x = scale * q - min.
fn q2_k(b: &[u8; Q2_K_BYTES], out: &mut [f32; QK_K]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (s, sub) in out.chunks_exact_mut(16).enumerate() {
        let scale = d * f32::from(scales[s] & 0x0F);
        let min = dmin * f32::from(scales[s] >> 4);
        for (k, x) in sub.iter_mut().enumerate() {
            *x = scale * f32::from(crumb(qs, 16 * s + k)) - min;
        }
    }
}

/// Q3_K's 6-bit signed scale of sub-block `s` (0..16) from its 12 packed bytes: the low 4 bits
/// are nibbles of bytes 0..8 (low nibbles for s < 8), the high 2 bits come from bytes 8..12.
fn q3_k_scale(packed: &[u8], s: usize) -> i32 {
    let low = if s < 8 {
        packed[s] & 0x0F
    } else {
        packed[s - 8] >> 4
    };
    let high = (packed[8 + s % 4] >> (2 * (s / 4))) & 3;
    i32::from(low | (high << 4)) - 32
}

/// Q3_K { hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16 }: value i's third bit is bit
/// i / 32 of hmask[i % 32], set meaning no offset; x = d * scale * (q - 4 * !bit).
fn q3_k(b: &[u8; Q3_K_BYTES], out: &mut [f32; QK_K]) {
    let (hmask, qs, scales) = (&b[..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    for (s, sub) in out.chunks_exact_mut(16).enumerate() {
        let scale = d * q3_k_scale(scales, s) as f32;
        for (k, x) in sub.iter_mut().enumerate() {
            let i = 16 * s + k;
            let offset = if (hmask[i % 32] >> (i / 32)) & 1 == 0 {
                4
            } else {
                0
            };
            *x = scale * (i32::from(crumb(qs, i)) - offset) as f32;
        }
    }
}

/// Q4_K/Q5_K's 6-bit (scale, min) of sub-block `s` (0..8) from their 12 packed bytes: bytes 0..4
/// hold scales 0..4 and bytes 4..8 mins 0..4 in their low 6 bits; sub-blocks 4..8 take their low
/// 4 bits from the nibbles of bytes 8..12 and their high 2 bits from the top of bytes 0..8.
fn k4_scale_min(packed: &[u8], s: usize) -> (u8, u8) {
    if s < 4 {
        (packed[s] & 0x3F, packed[s + 4] & 0x3F)
    } else {
        let scale = (packed[s + 4] & 0x0F) | ((packed[s - 4] >> 6) << 4);
        let min = (packed[s + 4] >> 4) | ((packed[s] >> 6) << 4);
        (scale, min)
    }
}

/// Q4_K { d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128] }: sub-block s (32 values) is the
/// low (even s) or high (odd s) nibbles of qs[32 (s / 2)..][..32]; x = d * sc * q - dmin * m.
fn q4_k(b: &[u8; Q4_K_BYTES], out: &mut [f32; QK_K]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..]);
    for (s, sub) in out.chunks_exact_mut(32).enumerate() {
        let (sc, m) = k4_scale_min(scales, s);
        let (scale, min) = (d * f32::from(sc), dmin * f32::from(m));
        let shift = 4 * (s % 2);
        for (x, &q) in sub.iter_mut().zip(&qs[32 * (s / 2)..]) {
            *x = scale * f32::from((q >> shift) & 0x0F) - min;
        }
    }
}

/// Q5_K { d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }: Q4_K plus a fifth
/// bit, bit s of qh[l] for value l of sub-block s.
fn q5_k(b: &[u8; Q5_K_BYTES], out: &mut [f32; QK_K]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..]);
    for (s, sub) in out.chunks_exact_mut(32).enumerate() {
        let (sc, m) = k4_scale_min(scales, s);
        let (scale, min) = (d * f32::from(sc), dmin * f32::from(m));
        let shift = 4 * (s % 2);
        for (l, x) in sub.iter_mut().enumerate() {
            let low = (qs[32 * (s / 2) + l] >> shift) & 0x0F;
            let fifth = ((qh[l] >> s) & 1) << 4;
            *x = scale * f32::from(low | fifth) - min;
        }
    }
}

/// Q6_K { ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16 }: in each 128-value half h,
/// value r's low 4 bits are the low (r < 64) or high nibble of ql[64 h + r % 64], its high 2 bits
/// the crumb of qh; x = d * scales[s] * (q - 32).
fn q6_k(b: &[u8; Q6_K_BYTES], out: &mut [f32; QK_K]) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for (s, sub) in out.chunks_exact_mut(16).enumerate() {
        let scale = d * f32::from(scales[s] as i8);
        for (k, x) in sub.iter_mut().enumerate() {
            let i = 16 * s + k;
            let (h, r) = (i / 128, i % 128);
            let low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
            let q = low | (crumb(qh, i) << 4);
            *x = scale * (i32::from(q) - 32) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_matches_ggml_structs() {
        // sizeof(block_*) in ggml-common.h.
        let sizes = [
            (GgmlType::Q4_0, 18),
            (GgmlType::Q4_1, 20),
            (GgmlType::Q5_0, 22),
            (GgmlType::Q5_1, 24),
            (GgmlType::Q8_0, 34),
            (GgmlType::Q2_K, 84),
            (GgmlType::Q3_K, 110),
            (GgmlType::Q4_K, 144),
            (GgmlType::Q5_K, 176),
            (GgmlType::Q6_K, 210),
            (GgmlType::Q8_K, 292),
        ];
        for (ty, bytes) in sizes {
            assert_eq!(ty.type_size(), bytes, "{ty}");
        }
        for &ty in GgmlType::ALL {
            assert_eq!(GgmlType::from_code(ty.code()).unwrap(), ty);
        }
    }

    #[test]
    fn f32_rows_copy_and_q8_0_scales() {
        let mut out = [0.0f32; 2];
        let bytes: Vec<u8> = [1.5f32, -0.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        dequantize_row(GgmlType::F32, &bytes, &mut out).unwrap();
        assert_eq!(out[0], 1.5);
        assert!(out[1] == 0.0 && out[1].is_sign_negative());

        let mut block = vec![0u8; Q8_0_BYTES];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        block[2] = (-3i8) as u8;
        block[33] = 127;
        let mut out = [0.0f32; QK];
        dequantize_row(GgmlType::Q8_0, &block, &mut out).unwrap();
        assert_eq!((out[0], out[1], out[31]), (-1.5, 0.0, 63.5));
    }

    #[test]
    fn q4_0_nibble_order() {
        // Byte j: low nibble -> value j, high nibble -> value j + 16.
        let mut block = [0u8; Q4_0_BYTES];
        block[..2].copy_from_slice(&f16::ONE.to_bits().to_le_bytes());
        block[2] = 0xF0;
        let mut out = [0.0f32; QK];
        dequantize_row(GgmlType::Q4_0, &block, &mut out).unwrap();
        assert_eq!((out[0], out[16], out[1]), (-8.0, 7.0, -8.0));
    }
}
