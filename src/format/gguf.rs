//! The metadata section, in GGUF's key/value encoding (13 value types, u64-length-prefixed
//! UTF-8 strings, typed arrays). STUB: the format worker fills in the bodies.

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
    Array { elem_type: u32, items: Vec<MetaValue> },
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
        todo!("{key}")
    }
    /// Required float (f32 or f64).
    pub fn get_f32(&self, key: &str) -> Result<f32, FormatError> {
        todo!("{key}")
    }
    pub fn get_str(&self, key: &str) -> Result<&str, FormatError> {
        todo!("{key}")
    }
    pub fn get_bool(&self, key: &str) -> Result<bool, FormatError> {
        todo!("{key}")
    }
    /// Encode in GGUF's encoding: u64 count, then (key, u32 type, value) per entry.
    pub fn encode(&self) -> Vec<u8> {
        todo!()
    }
    /// Decode and validate (bounded counts and lengths, UTF-8, no duplicate keys, known types).
    pub fn decode(bytes: &[u8]) -> Result<Metadata, FormatError> {
        todo!("{}", bytes.len())
    }
}
