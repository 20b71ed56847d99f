//! How a dense tensor is stored: float values (GGML's type ids), or a matrix packed in an integer
//! variant's planar layout (codes, scales, mins, as one matrix of an expert blob), which
//! `hob convert --dense int8|int4` writes for embeddings, projections and the output head.

use std::fmt;

use super::{DType, Variant, VariantKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorType {
    Float(DType),
    /// A 2-D matrix in an integer variant's layout (`Variant::matrix_layout`).
    Packed(Variant),
}

/// Packed codes: the variant kind's code in the upper 16 bits, the group size in the lower 16
/// (int8/g64 = 0x30040); GGML's ids, which float codes are, stay below 0x10000.
const PACKED_SHIFT: u32 = 16;

impl TensorType {
    pub fn code(self) -> u32 {
        match self {
            TensorType::Float(d) => d.code(),
            TensorType::Packed(v) => (v.kind.code() << PACKED_SHIFT) | v.group_size,
        }
    }

    /// The type of a code, or a message naming what is wrong with it.
    pub fn from_code(code: u32) -> Result<TensorType, String> {
        if let Some(d) = DType::from_code(code) {
            return Ok(TensorType::Float(d));
        }
        let known = "known: 0 f32, 1 f16, 30 bf16, or kind << 16 | group size for int8 (3), \
                     int4 (4), int2 (5)";
        let kind = VariantKind::from_code(code >> PACKED_SHIFT)
            .filter(|k| {
                !k.is_float()
                    && !matches!(
                        k,
                        VariantKind::Mxfp4
                            | VariantKind::Int3
                            | VariantKind::Int4k
                            | VariantKind::Int2k
                            | VariantKind::Ap8
                    )
            })
            .ok_or_else(|| format!("unknown dtype code {code} ({known})"))?;
        let v = Variant::new(kind, code & 0xffff).map_err(|e| format!("dtype code {code}: {e}"))?;
        Ok(TensorType::Packed(v))
    }

    /// Bytes of a tensor of this type and shape; packed types need a 2-D shape whose columns are
    /// a multiple of the group size.
    pub fn size(self, shape: &[usize]) -> Result<usize, String> {
        let overflow = || format!("shape {shape:?} is too large");
        match self {
            TensorType::Float(d) => shape
                .iter()
                .try_fold(d.size(), |acc, &n| acc.checked_mul(n))
                .ok_or_else(overflow),
            TensorType::Packed(v) => match shape {
                [rows, cols] => Ok(v.matrix_layout(*rows, *cols)?.size),
                _ => Err(format!(
                    "{v} stores matrices only, not a tensor of shape {shape:?}"
                )),
            },
        }
    }

    /// "f16", "int8/g64".
    pub fn name(self) -> String {
        match self {
            TensorType::Float(d) => d.name().to_string(),
            TensorType::Packed(v) => v.name(),
        }
    }

    /// "f32", "f16", "bf16", "int8", "int4" (a group size may follow: "int4/g32"; else
    /// `default_group`, else the kind's).
    pub fn parse(s: &str, default_group: Option<u32>) -> Result<TensorType, String> {
        if let Some(d) = DType::parse(s) {
            return Ok(TensorType::Float(d));
        }
        let v = Variant::parse(s, default_group).map_err(|_| {
            format!("unknown type '{s}' (known: f32, f16, bf16, int8, int4, int2; e.g. int4/g32)")
        })?;
        Ok(match v.kind {
            VariantKind::Mxfp4
            | VariantKind::Int3
            | VariantKind::Int4k
            | VariantKind::Int2k
            | VariantKind::Ap8 => {
                return Err(format!(
                    "'{s}': {} is an expert variant, not a dense type (known: f32, f16, bf16, \
                     int8, int4, int2)",
                    v.kind.name()
                ))
            }
            VariantKind::F16 => TensorType::Float(DType::F16),
            VariantKind::Bf16 => TensorType::Float(DType::Bf16),
            _ => TensorType::Packed(v),
        })
    }
}

impl From<DType> for TensorType {
    fn from(d: DType) -> TensorType {
        TensorType::Float(d)
    }
}

impl PartialEq<DType> for TensorType {
    fn eq(&self, d: &DType) -> bool {
        *self == TensorType::Float(*d)
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_bad_ones_are_named() {
        for s in ["f32", "f16", "bf16", "int8/g64", "int4/g32", "int2/g128"] {
            let t = TensorType::parse(s, None).unwrap();
            assert_eq!(t.name(), s);
            assert_eq!(TensorType::from_code(t.code()).unwrap(), t);
        }
        assert_eq!(TensorType::parse("int8", None).unwrap().code(), 0x30040);
        assert!(TensorType::from_code(2)
            .unwrap_err()
            .contains("unknown dtype code 2"));
        assert!(TensorType::from_code(0x30000 | 17)
            .unwrap_err()
            .contains("multiple of 16"));
        assert!(
            TensorType::from_code(0x10000).is_err(),
            "f16 as a packed kind"
        );
        assert!(TensorType::parse("q4_k", None).is_err());
        // Expert-only kinds are no dense dtype, neither from a flag nor from a file.
        for (name, code) in [("mxfp4", 0x60020u32), ("int3", 0x70040)] {
            let e = TensorType::parse(name, None).unwrap_err();
            assert!(e.contains("expert variant, not a dense type"), "{e}");
            let e = TensorType::from_code(code).unwrap_err();
            assert!(e.contains(&format!("unknown dtype code {code}")), "{e}");
        }
    }

    #[test]
    fn packed_sizes_are_the_matrix_layout() {
        let t = TensorType::parse("int4/g64", None).unwrap();
        assert_eq!(t.size(&[3, 128]).unwrap(), 320);
        assert!(t.size(&[128]).unwrap_err().contains("matrices only"));
        assert!(t
            .size(&[3, 100])
            .unwrap_err()
            .contains("multiple of the group size"));
        assert_eq!(TensorType::Float(DType::F16).size(&[3, 5]).unwrap(), 30);
    }
}
