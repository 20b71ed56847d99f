//! The metadata section, in GGUF's key/value encoding (13 value types, u64-length-prefixed
//! UTF-8 strings, typed arrays). Decoding is bounded: no count or length read from a file
//! allocates more than the bytes it claims to describe.

use std::collections::HashSet;

use super::cursor::Cursor;
use super::FormatError;

/// One metadata value. Arrays carry their element type code so an empty array round-trips.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array {
        elem_type: u32,
        items: Vec<MetaValue>,
    },
    U64(u64),
    I64(i64),
    F64(f64),
}

/// Ordered key/value metadata; keys are unique.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, MetaValue)>,
}

impl Metadata {
    pub fn new() -> Self {
        Self::default()
    }
    /// Insert or replace.
    pub fn set(&mut self, key: &str, value: MetaValue) {
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some(e) => e.1 = value,
            None => self.entries.push((key.to_string(), value)),
        }
    }
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Required unsigned integer (any unsigned or non-negative signed integer type that fits).
    pub fn get_u32(&self, key: &str) -> Result<u32, FormatError> {
        let v = self.require(key)?;
        let wide: Option<i128> = match *v {
            MetaValue::U8(x) => Some(x.into()),
            MetaValue::I8(x) => Some(x.into()),
            MetaValue::U16(x) => Some(x.into()),
            MetaValue::I16(x) => Some(x.into()),
            MetaValue::U32(x) => Some(x.into()),
            MetaValue::I32(x) => Some(x.into()),
            MetaValue::U64(x) => Some(x.into()),
            MetaValue::I64(x) => Some(x.into()),
            _ => None,
        };
        match wide {
            Some(x) => u32::try_from(x).map_err(|_| FormatError::Metadata {
                key: key.to_string(),
                detail: format!("value {x} does not fit in an unsigned 32-bit integer"),
            }),
            None => Err(wrong_type(key, "an integer", v)),
        }
    }
    /// Required float (f32 or f64).
    pub fn get_f32(&self, key: &str) -> Result<f32, FormatError> {
        match *self.require(key)? {
            MetaValue::F32(x) => Ok(x),
            MetaValue::F64(x) => Ok(x as f32),
            ref v => Err(wrong_type(key, "a float", v)),
        }
    }
    pub fn get_str(&self, key: &str) -> Result<&str, FormatError> {
        match self.require(key)? {
            MetaValue::String(s) => Ok(s),
            v => Err(wrong_type(key, "a string", v)),
        }
    }
    pub fn get_bool(&self, key: &str) -> Result<bool, FormatError> {
        match *self.require(key)? {
            MetaValue::Bool(b) => Ok(b),
            ref v => Err(wrong_type(key, "a bool", v)),
        }
    }

    fn require(&self, key: &str) -> Result<&MetaValue, FormatError> {
        self.get(key).ok_or_else(|| FormatError::Metadata {
            key: key.to_string(),
            detail: "missing".to_string(),
        })
    }

    /// Check what `encode` cannot: every array item has its array's element type, and element
    /// types are known codes. The writer calls this before planning a file.
    pub fn check(&self) -> Result<(), FormatError> {
        fn check_value(key: &str, v: &MetaValue) -> Result<(), FormatError> {
            if let MetaValue::Array { elem_type, items } = v {
                if type_name(*elem_type).is_none() {
                    return Err(FormatError::Metadata {
                        key: key.to_string(),
                        detail: format!("unknown array element type {elem_type}"),
                    });
                }
                for item in items {
                    if item.type_code() != *elem_type {
                        return Err(FormatError::Metadata {
                            key: key.to_string(),
                            detail: format!(
                                "array of {} holds a {}",
                                type_name(*elem_type).unwrap_or("?"),
                                item.type_name()
                            ),
                        });
                    }
                    check_value(key, item)?;
                }
            }
            Ok(())
        }
        self.entries.iter().try_for_each(|(k, v)| check_value(k, v))
    }

    /// Encode in GGUF's encoding: u64 count, then (key, u32 type, value) per entry.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for (k, v) in &self.entries {
            put_str(&mut out, k);
            out.extend_from_slice(&v.type_code().to_le_bytes());
            put_value(&mut out, v);
        }
        out
    }

    /// Decode and validate (bounded counts and lengths, UTF-8, no duplicate keys, known types).
    /// The whole of `bytes` must be consumed.
    pub fn decode(bytes: &[u8]) -> Result<Metadata, FormatError> {
        let mut c = Cursor::new(bytes, "metadata section");
        let count = c.u64(|| "entry count".to_string())?;
        let metadata = read_entries(&mut c, count)?;
        if c.remaining() != 0 {
            return Err(FormatError::Invalid {
                what: "metadata section".to_string(),
                detail: format!("{} bytes left after the last entry", c.remaining()),
            });
        }
        Ok(metadata)
    }

    /// Decode `count` entries starting at byte `start` of `bytes`, as a GGUF file stores them
    /// (the count is in the file header, and the tensor infos follow the last entry). Returns the
    /// metadata and the offset just past the last entry. Bounded and validated as `decode`;
    /// offsets in errors are from the start of `bytes`.
    pub fn decode_entries(
        bytes: &[u8],
        start: usize,
        count: u64,
    ) -> Result<(Metadata, usize), FormatError> {
        let mut c = Cursor::new(bytes, "GGUF key/values");
        c.take(start as u64, || "file header".to_string())?;
        let metadata = read_entries(&mut c, count)?;
        Ok((metadata, bytes.len() - c.remaining()))
    }
}

/// `count` entries (key, u32 type, value) from `c`; no duplicate keys.
fn read_entries(c: &mut Cursor<'_>, count: u64) -> Result<Metadata, FormatError> {
    // Smallest entry: empty key (8) + type (4) + a one-byte value.
    let count = c.check_count("entry count", count, 13)?;
    let mut entries = Vec::with_capacity(count);
    let mut seen = HashSet::with_capacity(count);
    for i in 0..count {
        let key = c.string(&|| format!("key of entry #{i}"))?;
        let ty = c.u32(|| format!("value type of key '{key}'"))?;
        let value = read_value(c, &key, ty, 0)?;
        if !seen.insert(key.clone()) {
            return Err(FormatError::Metadata {
                key,
                detail: "duplicate key".to_string(),
            });
        }
        entries.push((key, value));
    }
    Ok(Metadata { entries })
}

/// Arrays nested deeper than this are refused: a hostile file could otherwise nest enough
/// arrays to overflow the decoder's stack.
pub const MAX_ARRAY_DEPTH: usize = 16;

/// GGUF's value type codes, in code order.
const TYPE_NAMES: [&str; 13] = [
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
];

/// The name of GGUF value type `code` ("u32", "array", ...), None when unknown.
pub fn type_name(code: u32) -> Option<&'static str> {
    TYPE_NAMES.get(code as usize).copied()
}

/// Fewest bytes a value of a known type takes; bounds hostile array counts.
fn min_size(code: u32) -> u64 {
    match code {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10 | 11 | 12 => 8,
        _ => 12, // array: elem type + count
    }
}

impl MetaValue {
    /// GGUF value type code.
    pub fn type_code(&self) -> u32 {
        match self {
            MetaValue::U8(_) => 0,
            MetaValue::I8(_) => 1,
            MetaValue::U16(_) => 2,
            MetaValue::I16(_) => 3,
            MetaValue::U32(_) => 4,
            MetaValue::I32(_) => 5,
            MetaValue::F32(_) => 6,
            MetaValue::Bool(_) => 7,
            MetaValue::String(_) => 8,
            MetaValue::Array { .. } => 9,
            MetaValue::U64(_) => 10,
            MetaValue::I64(_) => 11,
            MetaValue::F64(_) => 12,
        }
    }

    pub fn type_name(&self) -> &'static str {
        TYPE_NAMES[self.type_code() as usize]
    }
}

fn wrong_type(key: &str, expected: &str, found: &MetaValue) -> FormatError {
    FormatError::Metadata {
        key: key.to_string(),
        detail: format!("expected {expected}, found {}", found.type_name()),
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::Array { elem_type, items } => {
            out.extend_from_slice(&elem_type.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn read_value(
    c: &mut Cursor<'_>,
    key: &str,
    ty: u32,
    depth: usize,
) -> Result<MetaValue, FormatError> {
    let what = || format!("value of key '{key}'");
    Ok(match ty {
        0 => MetaValue::U8(c.u8(what)?),
        1 => MetaValue::I8(c.u8(what)? as i8),
        2 => MetaValue::U16(c.u16(what)?),
        3 => MetaValue::I16(c.u16(what)? as i16),
        4 => MetaValue::U32(c.u32(what)?),
        5 => MetaValue::I32(c.u32(what)? as i32),
        6 => MetaValue::F32(f32::from_bits(c.u32(what)?)),
        7 => match c.u8(what)? {
            0 => MetaValue::Bool(false),
            1 => MetaValue::Bool(true),
            b => {
                return Err(FormatError::Metadata {
                    key: key.to_string(),
                    detail: format!("bool stored as {b} (expected 0 or 1)"),
                })
            }
        },
        8 => MetaValue::String(c.string(&|| format!("string value of key '{key}'"))?),
        9 => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(FormatError::Metadata {
                    key: key.to_string(),
                    detail: format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
                });
            }
            let elem_type = c.u32(|| format!("array element type of key '{key}'"))?;
            if type_name(elem_type).is_none() {
                return Err(unknown_type(key, elem_type));
            }
            let count = c.u64(|| format!("array count of key '{key}'"))?;
            let count = c.check_count(
                &format!("array count of key '{key}'"),
                count,
                min_size(elem_type),
            )?;
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                items.push(read_value(c, key, elem_type, depth + 1)?);
            }
            MetaValue::Array { elem_type, items }
        }
        10 => MetaValue::U64(c.u64(what)?),
        11 => MetaValue::I64(c.u64(what)? as i64),
        12 => MetaValue::F64(f64::from_bits(c.u64(what)?)),
        _ => return Err(unknown_type(key, ty)),
    })
}

fn unknown_type(key: &str, ty: u32) -> FormatError {
    FormatError::Metadata {
        key: key.to_string(),
        detail: format!("unknown value type {ty} (known: 0..=12)"),
    }
}
