//! Storage types of dense tensors and expert variants, and the byte layout of one stored matrix.
//! This is the part of formats/hob.md that other modules compute with; it does no I/O.

use std::fmt;
use std::ops::Range;

use super::ap8;

/// Alignment of each sub-array (codes, scales, mins) inside a stored matrix, and of each matrix
/// inside an expert blob: enough for 16-byte vector loads and 64-byte cache lines.
pub const SUBARRAY_ALIGN: usize = 64;
/// Alignment and padding of every expert blob and dense tensor in the file (one O_DIRECT read).
pub const BLOB_ALIGN: usize = 4096;

/// Round `n` up to a multiple of `align` (a power of two). None on overflow.
pub fn align_up(n: usize, align: usize) -> Option<usize> {
    debug_assert!(align.is_power_of_two());
    Some(n.checked_add(align - 1)? & !(align - 1))
}

/// Values in one int3 block: 16 bytes of a row's low bits, 8 of its high bits.
pub const INT3_BLOCK: usize = 64;

/// Where element `e` (< 64) of an int3 block keeps its high bit among the block's 8 high-bit
/// bytes (read as a little-endian u64). Element 16 w + 4 b + s has its low bits in bits 2 s of
/// low byte 4 w + b (int2's order); its high bit sits in bit s (w even) or 4 + s (w odd) of high
/// byte 4 (w / 2) + b, so a GPU word of low codes masked per byte (set s) meets its high bits with
/// one shift and mask (cuda/matvec_q_stage.cu).
pub const fn int3_hi_bit(e: usize) -> usize {
    32 * (e / 32) + 8 * ((e % 16) / 4) + 4 * ((e / 16) % 2) + e % 4
}

/// Storage type of a dense tensor. The codes are GGML's type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    Bf16,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

    pub fn code(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Bf16 => 30,
        }
    }

    pub fn from_code(code: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.code() == code)
    }

    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        }
    }

    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The encoding of an expert variant. Codes are stored in the expert table's variant list; a
/// reader refuses a code it does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VariantKind {
    F16,
    Bf16,
    /// Symmetric: w = scale * q, q in [-127, 127] stored as i8.
    Int8,
    /// Asymmetric: w = scale * q + min, q in [0, 15], two per byte (element 2i in the low nibble).
    Int4,
    /// Asymmetric: w = scale * q + min, q in [0, 3], four per byte (element 4i+j in bits 2j..2j+2).
    Int2,
    /// Asymmetric: w = scale * q + min, q in [0, 7]. A row stores its codes' low two bits as int2
    /// does (cols / 4 bytes), then their high bits (cols / 8 bytes, 8 bytes per 64 values:
    /// `int3_hi_bit`). Groups are multiples of 64.
    Int3,
    /// int4 codes in groups of 32 whose (scale, min) are 8-bit multiples of a row's pair: a
    /// group's scale is f16(d * a), its min f16(m * b), a u8 and b i8 in the group's two bytes
    /// of the scales array, d and m the row's two f16 in the mins array (k-quant-style
    /// sub-scales: 4.5 + 32 / cols bits a weight).
    Int4k,
    /// int2 codes in groups of 16 whose scale and min are 4-bit multiples of their row's f16 pair:
    /// one byte a group in the scales array, a (u4) in its low nibble and b (i4, -8..7) in its
    /// high one; s = f16(d a), m = f16(dm b) (Q2_K-style sub-scales: 2.5 + 32 / cols bits).
    Int2k,
    /// Any-precision (format::ap8): an 8-bit parent code a weight as bit planes, most
    /// significant first, read at any width 2..=8 as a prefix of the expert's blob (a view:
    /// `Variant::width`). Groups are multiples of 64.
    Ap8,
    /// OCP MXFP4 (gpt-oss's experts): 4-bit e2m1 codes two per byte (element 2i in the low
    /// nibble), times 2^(e - 127) for one E8M0 byte e per 32 values (the group size is 32).
    Mxfp4,
}

impl VariantKind {
    pub const ALL: [VariantKind; 10] = [
        VariantKind::F16,
        VariantKind::Bf16,
        VariantKind::Int8,
        VariantKind::Int4,
        VariantKind::Int4k,
        VariantKind::Int3,
        VariantKind::Int2,
        VariantKind::Int2k,
        VariantKind::Ap8,
        VariantKind::Mxfp4,
    ];

    pub fn code(self) -> u32 {
        match self {
            VariantKind::F16 => 1,
            VariantKind::Bf16 => 2,
            VariantKind::Int8 => 3,
            VariantKind::Int4 => 4,
            VariantKind::Int2 => 5,
            VariantKind::Mxfp4 => 6,
            VariantKind::Int3 => 7,
            VariantKind::Int4k => 8,
            VariantKind::Int2k => 9,
            VariantKind::Ap8 => 10,
        }
    }

    pub fn from_code(code: u32) -> Option<VariantKind> {
        VariantKind::ALL.into_iter().find(|k| k.code() == code)
    }

    pub fn name(self) -> &'static str {
        match self {
            VariantKind::F16 => "f16",
            VariantKind::Bf16 => "bf16",
            VariantKind::Int8 => "int8",
            VariantKind::Int4 => "int4",
            VariantKind::Int4k => "int4k",
            VariantKind::Int3 => "int3",
            VariantKind::Int2 => "int2",
            VariantKind::Int2k => "int2k",
            VariantKind::Ap8 => "ap8",
            VariantKind::Mxfp4 => "mxfp4",
        }
    }

    /// Bits per stored code.
    pub fn bits(self) -> u32 {
        match self {
            VariantKind::F16 | VariantKind::Bf16 => 16,
            VariantKind::Int8 | VariantKind::Ap8 => 8,
            VariantKind::Int4 | VariantKind::Int4k | VariantKind::Mxfp4 => 4,
            VariantKind::Int3 => 3,
            VariantKind::Int2 | VariantKind::Int2k => 2,
        }
    }

    /// Bytes of one group's scale: an f16, or MXFP4's E8M0 exponent byte.
    pub fn scale_bytes(self) -> usize {
        if matches!(self, VariantKind::Mxfp4 | VariantKind::Int2k) {
            1
        } else {
            2
        }
    }

    /// A fixed group size (MXFP4's 32 values a block, int4k's groups of 32, int2k's of 16, ap8's
    /// parent ranges of 16), else None.
    pub fn fixed_group_size(self) -> Option<u32> {
        match self {
            VariantKind::Mxfp4 | VariantKind::Int4k => Some(32),
            VariantKind::Int2k | VariantKind::Ap8 => Some(16),
            _ => None,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, VariantKind::F16 | VariantKind::Bf16)
    }

    /// Asymmetric variants store a per-group minimum (the value of code 0) beside the scale
    /// (int4k: as a multiple of its row's).
    pub fn has_mins(self) -> bool {
        matches!(
            self,
            VariantKind::Int4
                | VariantKind::Int4k
                | VariantKind::Int3
                | VariantKind::Int2
                | VariantKind::Int2k
        )
    }

    /// int4k and int2k: group parameters as multiples of a row's pair (quant::subscales).
    pub fn is_sub_scaled(self) -> bool {
        matches!(self, VariantKind::Int4k | VariantKind::Int2k)
    }

    /// The multiple every group size must be: int3's 64-value blocks, else 16.
    pub fn group_multiple(self) -> u32 {
        if self == VariantKind::Int3 {
            64
        } else {
            16
        }
    }

    /// Group size used when `--group-size` is not given.
    pub fn default_group_size(self) -> u32 {
        if self.is_float() {
            0
        } else {
            self.fixed_group_size().unwrap_or(64)
        }
    }
}

/// An expert variant: encoding plus group size (0 for float variants), and for ap8 the width a
/// view reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Variant {
    pub kind: VariantKind,
    pub group_size: u32,
    /// Bits a code is read with: ap8's 2..=8 (8: the whole stored blob, the variant a file
    /// lists; 2..=7: the views a reader adds, each a prefix of it); 0 for every other kind.
    pub width: u8,
}

/// Where the sub-arrays of one stored matrix lie, relative to the matrix start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatrixLayout {
    pub rows: usize,
    pub cols: usize,
    /// Codes (quantized) or raw values (float variants), row-major.
    pub codes: Range<usize>,
    /// f16 scales (MXFP4: E8M0 bytes), [rows, cols / group_size] row-major; empty for float
    /// variants.
    pub scales: Range<usize>,
    /// f16 minimums, [rows, cols / group_size] row-major; empty unless `kind.has_mins()`.
    pub mins: Range<usize>,
    /// Total bytes, padded to SUBARRAY_ALIGN.
    pub size: usize,
}

impl MatrixLayout {
    /// The matrix stored in `data` (its `size` bytes, from the matrix start) as `variant`.
    /// Panics if `data` is shorter than the layout says: callers slice checked blobs.
    pub fn view<'a>(&self, variant: Variant, data: &'a [u8]) -> super::MatrixView<'a> {
        super::MatrixView {
            variant,
            rows: self.rows,
            cols: self.cols,
            codes: &data[self.codes.clone()],
            scales: &data[self.scales.clone()],
            mins: &data[self.mins.clone()],
            part: 0,
        }
    }
}

/// The three matrices of one SwiGLU expert, contiguous in one blob, in this order:
/// gate (w1, [ffn, hidden]), up (w3, [ffn, hidden]), down (w2, [hidden, ffn]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertLayout {
    pub gate_offset: usize,
    pub gate: MatrixLayout,
    pub up_offset: usize,
    pub up: MatrixLayout,
    pub down_offset: usize,
    pub down: MatrixLayout,
    /// Bytes of meaningful data (the blob's recorded size).
    pub size: usize,
    /// `size` padded to BLOB_ALIGN: the space the blob occupies in the file.
    pub padded_size: usize,
}

impl Variant {
    pub fn new(kind: VariantKind, group_size: u32) -> Result<Variant, String> {
        let width = if kind == VariantKind::Ap8 {
            ap8::MAX_WIDTH
        } else {
            0
        };
        let v = Variant {
            kind,
            group_size,
            width,
        };
        v.check()?;
        Ok(v)
    }

    /// This ap8 variant read at width `k` (2..=8).
    pub fn at_width(self, k: u8) -> Variant {
        debug_assert!(
            self.kind == VariantKind::Ap8 && (ap8::MIN_WIDTH..=ap8::MAX_WIDTH).contains(&k)
        );
        Variant { width: k, ..self }
    }

    /// A view reading part of a stored blob (ap8 at a width under 8).
    pub fn is_view(&self) -> bool {
        self.kind == VariantKind::Ap8 && self.width < ap8::MAX_WIDTH
    }

    /// Parse "f16", "bf16", "int8", "int4", "int4k", "int3", "int2", "ap8", optionally with a
    /// group size: "int4/g32"; an ap8 view names its width: "ap8@4".
    /// `default_group` (from --group-size) replaces the kind's default when given.
    pub fn parse(s: &str, default_group: Option<u32>) -> Result<Variant, String> {
        let (s_kind, width) = match s.split_once('@') {
            Some((n, w)) => {
                let w: u8 = w
                    .parse()
                    .ok()
                    .filter(|w| (ap8::MIN_WIDTH..=ap8::MAX_WIDTH).contains(w))
                    .ok_or_else(|| format!("variant '{s}': a width is 2..=8 bits"))?;
                (n, Some(w))
            }
            None => (s, None),
        };
        let (name, group) = match s_kind.split_once("/g") {
            Some((n, g)) => {
                let g: u32 = g
                    .parse()
                    .map_err(|_| format!("bad group size in variant '{s}'"))?;
                (n, Some(g))
            }
            None => (s_kind, None),
        };
        let known: Vec<&str> = VariantKind::ALL.iter().map(|k| k.name()).collect();
        let kind = VariantKind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                format!(
                    "unknown variant '{s}' (known: {}; a group size may follow, e.g. int4/g32)",
                    known.join(", ")
                )
            })?;
        if kind.is_float() && group.is_some() {
            return Err(format!("variant '{s}': float variants take no group size"));
        }
        if let (Some(fixed), Some(g)) = (kind.fixed_group_size(), group) {
            if g != fixed {
                return Err(format!(
                    "variant '{s}': {} has blocks of {fixed} values, not {g}",
                    kind.name()
                ));
            }
        }
        let group_size = if kind.is_float() {
            0
        } else if let Some(fixed) = kind.fixed_group_size() {
            // --group-size applies to the int variants; MXFP4's blocks are fixed.
            fixed
        } else {
            group.or(default_group).unwrap_or(kind.default_group_size())
        };
        let v = Variant::new(kind, group_size)?;
        match width {
            Some(w) if kind == VariantKind::Ap8 => Ok(v.at_width(w)),
            Some(_) => Err(format!("variant '{s}': only ap8 is read at a width")),
            None => Ok(v),
        }
    }

    /// Validate the group size: quantized variants need a multiple of 16 in 16..=4096.
    pub fn check(&self) -> Result<(), String> {
        if self.kind.is_float() {
            if self.group_size != 0 {
                return Err(format!(
                    "{}: float variants have group size 0, found {}",
                    self.kind.name(),
                    self.group_size
                ));
            }
        } else if let Some(fixed) = self
            .kind
            .fixed_group_size()
            .filter(|&f| f != self.group_size)
        {
            // ap8 had one parent range a 64 values until 2026-12-05 (formats/hob.md).
            let hint = match self.kind {
                VariantKind::Ap8 => " (an ap8 file from before 2026-12-05: convert it again)",
                _ => "",
            };
            return Err(format!(
                "{}: blocks of {fixed} values, found group size {}{hint}",
                self.kind.name(),
                self.group_size
            ));
        } else {
            let m = self.kind.group_multiple();
            if self.group_size < m || self.group_size > 4096 || !self.group_size.is_multiple_of(m) {
                return Err(format!(
                    "{}: group size must be a multiple of {m} in {m}..=4096, found {}",
                    self.kind.name(),
                    self.group_size
                ));
            }
        }
        Ok(())
    }

    /// "f16", "int4/g64"; ap8: "ap8", "ap8@4".
    pub fn name(&self) -> String {
        if self.kind == VariantKind::Ap8 {
            match self.is_view() {
                true => format!("ap8@{}", self.width),
                false => "ap8".to_string(),
            }
        } else if self.kind.is_float() || self.kind.fixed_group_size().is_some() {
            self.kind.name().to_string()
        } else {
            format!("{}/g{}", self.kind.name(), self.group_size)
        }
    }

    /// Layout of a [rows, cols] matrix in this variant. Errors when cols is not a multiple of the
    /// group size or the sizes overflow.
    pub fn matrix_layout(&self, rows: usize, cols: usize) -> Result<MatrixLayout, String> {
        let overflow = || format!("matrix [{rows}, {cols}] is too large");
        let n = rows.checked_mul(cols).ok_or_else(overflow)?;
        if self.kind == VariantKind::Ap8 {
            return Err(
                "ap8 stores whole experts (bit planes across their three matrices), \
                        not single matrices"
                    .into(),
            );
        }
        if self.kind.is_float() {
            let len = n.checked_mul(2).ok_or_else(overflow)?;
            let size = align_up(len, SUBARRAY_ALIGN).ok_or_else(overflow)?;
            return Ok(MatrixLayout {
                rows,
                cols,
                codes: 0..len,
                scales: len..len,
                mins: len..len,
                size,
            });
        }
        let g = self.group_size as usize;
        if g == 0 || !cols.is_multiple_of(g) {
            return Err(format!(
                "{}: {cols} columns are not a multiple of the group size {g} (try --group-size)",
                self.name()
            ));
        }
        let codes_len = n
            .checked_mul(self.kind.bits() as usize)
            .ok_or_else(overflow)?
            / 8;
        let groups = rows.checked_mul(cols / g).ok_or_else(overflow)?;
        let side_len = groups
            .checked_mul(self.kind.scale_bytes())
            .ok_or_else(overflow)?;
        let scales_start = align_up(codes_len, SUBARRAY_ALIGN).ok_or_else(overflow)?;
        let scales_end = scales_start.checked_add(side_len).ok_or_else(overflow)?;
        // int4k's mins array holds each row's two f16 (d, m).
        let mins_len = match self.kind {
            VariantKind::Int4k | VariantKind::Int2k => rows.checked_mul(4).ok_or_else(overflow)?,
            _ => side_len,
        };
        let (mins, end) = if self.kind.has_mins() {
            let s = align_up(scales_end, SUBARRAY_ALIGN).ok_or_else(overflow)?;
            let e = s.checked_add(mins_len).ok_or_else(overflow)?;
            (s..e, e)
        } else {
            (scales_end..scales_end, scales_end)
        };
        Ok(MatrixLayout {
            rows,
            cols,
            codes: 0..codes_len,
            scales: scales_start..scales_end,
            mins,
            size: align_up(end, SUBARRAY_ALIGN).ok_or_else(overflow)?,
        })
    }

    /// Layout of one expert (gate, up, down) with model dims `hidden` and expert FFN `ffn`.
    pub fn expert_layout(&self, hidden: usize, ffn: usize) -> Result<ExpertLayout, String> {
        if self.kind == VariantKind::Ap8 {
            return self.ap8_expert_layout(hidden, ffn);
        }
        let gate = self.matrix_layout(ffn, hidden)?;
        let up = self.matrix_layout(ffn, hidden)?;
        let down = self.matrix_layout(hidden, ffn)?;
        let overflow = || format!("expert [{hidden}, {ffn}] is too large");
        let up_offset = gate.size;
        let down_offset = up_offset.checked_add(up.size).ok_or_else(overflow)?;
        let size = down_offset.checked_add(down.size).ok_or_else(overflow)?;
        let padded_size = align_up(size, BLOB_ALIGN).ok_or_else(overflow)?;
        Ok(ExpertLayout {
            gate_offset: 0,
            gate,
            up_offset,
            up,
            down_offset,
            down,
            size,
            padded_size,
        })
    }

    /// An ap8 view's expert: every matrix reads the whole prefix (its `codes`), from the blob
    /// start; which of the three it is comes with the view (`MatrixView::part`).
    fn ap8_expert_layout(&self, hidden: usize, ffn: usize) -> Result<ExpertLayout, String> {
        let ap = ap8::ApLayout::new(hidden, ffn)?;
        let size = ap.prefix(self.width);
        let m = |rows, cols| MatrixLayout {
            rows,
            cols,
            codes: 0..size,
            scales: size..size,
            mins: size..size,
            size,
        };
        Ok(ExpertLayout {
            gate_offset: 0,
            gate: m(ffn, hidden),
            up_offset: 0,
            up: m(ffn, hidden),
            down_offset: 0,
            down: m(hidden, ffn),
            size,
            padded_size: align_up(size, BLOB_ALIGN).ok_or("ap8 expert too large")?,
        })
    }

    /// Stored bits per weight of a [rows, cols] matrix, scales and mins included (padding not);
    /// an ap8 view: the bits it reads.
    pub fn bits_per_weight(&self, rows: usize, cols: usize) -> f64 {
        if self.kind == VariantKind::Ap8 {
            // A byte a 16, a correction byte a 64 for each corrected width read, a pair a row.
            let tables = ap8::CORRECTED.iter().filter(|&&c| c <= self.width).count();
            let pair = if cols == 0 { 0.0 } else { 32.0 / cols as f64 };
            return self.width as f64 + 0.5 + (8 * tables) as f64 / 64.0 + pair;
        }
        let bits = self.kind.bits() as f64;
        if self.kind.is_float() || rows == 0 || cols == 0 {
            return bits;
        }
        let side = if self.kind.is_sub_scaled() {
            return bits + 8.0 / 16.0 + 32.0 / cols as f64;
        } else if self.kind.has_mins() {
            32.0
        } else {
            8.0 * self.kind.scale_bytes() as f64
        };
        bits + side / self.group_size as f64
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names_and_groups() {
        assert_eq!(
            Variant::parse("int4", None).unwrap(),
            Variant {
                kind: VariantKind::Int4,
                group_size: 64,
                width: 0
            }
        );
        assert_eq!(
            Variant::parse("int2/g32", Some(128)).unwrap().group_size,
            32
        );
        assert_eq!(Variant::parse("int8", Some(128)).unwrap().group_size, 128);
        assert_eq!(Variant::parse("f16", Some(128)).unwrap().group_size, 0);
        let mx = Variant::parse("mxfp4", Some(128)).unwrap();
        assert_eq!((mx.group_size, mx.name()), (32, "mxfp4".to_string()));
        assert!(Variant::parse("mxfp4/g64", None).is_err());
        assert!(Variant::new(VariantKind::Mxfp4, 64).is_err());
        let l = mx.matrix_layout(2, 64).unwrap();
        assert_eq!(
            (l.codes.clone(), l.scales.clone(), l.mins.len()),
            (0..64, 64..68, 0)
        );
        assert_eq!(mx.bits_per_weight(2880, 2880), 4.25);
        assert!(Variant::parse("int5", None)
            .unwrap_err()
            .contains("unknown variant 'int5'"));
        let i3 = Variant::parse("int3", None).unwrap();
        assert_eq!(i3.group_size, 64);
        assert!(Variant::parse("int3/g32", None)
            .unwrap_err()
            .contains("multiple of 64"));
        let l = i3.matrix_layout(2, 128).unwrap();
        assert_eq!((l.codes.clone(), l.scales.clone()), (0..96, 128..136));
        assert_eq!(i3.bits_per_weight(2048, 768), 3.5);
        let mut seen = [false; 64];
        for e in 0..INT3_BLOCK {
            seen[int3_hi_bit(e)] = true;
        }
        assert!(seen.iter().all(|&b| b), "int3_hi_bit is a permutation");
        let k = Variant::parse("int4k", Some(64)).unwrap();
        assert_eq!((k.group_size, k.name()), (32, "int4k".to_string()));
        assert!(Variant::parse("int4k/g64", None).is_err());
        let l = k.matrix_layout(3, 64).unwrap();
        assert_eq!(
            (l.codes.clone(), l.scales.clone(), l.mins.clone()),
            (0..96, 128..140, 192..204)
        );
        assert_eq!(k.bits_per_weight(768, 2048), 4.515625);
        let k2 = Variant::parse("int2k", None).unwrap();
        assert_eq!(k2.group_size, 16);
        let l = k2.matrix_layout(3, 64).unwrap();
        assert_eq!(
            (l.codes.clone(), l.scales.clone(), l.mins.clone()),
            (0..48, 64..76, 128..140)
        );
        assert_eq!(k2.bits_per_weight(768, 2048), 2.515625);
        let ap = Variant::parse("ap8", None).unwrap();
        assert_eq!((ap.group_size, ap.width, ap.name()), (16, 8, "ap8".into()));
        let v4 = Variant::parse("ap8@4", None).unwrap();
        assert_eq!(
            (v4.width, v4.name(), v4.is_view()),
            (4, "ap8@4".into(), true)
        );
        assert_eq!(Variant::parse("ap8/g16@2", None).unwrap().name(), "ap8@2");
        assert!(Variant::parse("ap8/g64", None).is_err());
        // A file of the earlier layout (a parent range a 64) says to convert it again.
        let old = Variant {
            kind: VariantKind::Ap8,
            group_size: 64,
            width: 8,
        };
        assert!(old.check().unwrap_err().contains("convert it again"));
        assert!(Variant::parse("ap8@9", None).unwrap_err().contains("2..=8"));
        assert!(Variant::parse("int4@2", None)
            .unwrap_err()
            .contains("only ap8"));
        assert!(ap.matrix_layout(64, 64).is_err());
        assert!(ap.expert_layout(64, 96).unwrap_err().contains("multiples"));
        let (full, two) = (ap.expert_layout(64, 128).unwrap(), ap.at_width(2));
        let part = two.expert_layout(64, 128).unwrap();
        assert!(part.size < full.size && full.gate.codes == (0..full.size));
        assert_eq!(ap.bits_per_weight(128, 2048), 8.890625);
        assert_eq!(two.bits_per_weight(128, 2048), 2.640625);
        assert!(Variant::parse("int4/g10", None).is_err());
        assert!(Variant::parse("f16/g64", None).is_err());
    }

    #[test]
    fn layouts_are_aligned_and_sized() {
        let v = Variant::parse("int4", None).unwrap();
        let l = v.matrix_layout(3, 128).unwrap();
        assert_eq!(l.codes, 0..192);
        assert_eq!(l.scales, 192..204);
        assert_eq!(l.mins, 256..268);
        assert_eq!(l.size, 320);
        let e = v.expert_layout(64, 128).unwrap();
        assert_eq!(e.padded_size % BLOB_ALIGN, 0);
        assert_eq!(e.down_offset, e.gate.size + e.up.size);
        assert!(v.matrix_layout(3, 96).is_err());
        assert_eq!(v.bits_per_weight(4096, 14336), 4.5);
        let f = Variant::parse("f16", None)
            .unwrap()
            .matrix_layout(2, 3)
            .unwrap();
        assert_eq!((f.codes.len(), f.size), (12, 64));
    }
}
