//! Bounds-checked little-endian reads over one section of a .hob file. Every read that would run
//! past the section end becomes `FormatError::Overrun` naming the section and the field, so a
//! hostile count or length never reaches an allocation or a slice index.

use super::FormatError;

pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    section: &'static str,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8], section: &'static str) -> Self {
        Cursor {
            bytes,
            pos: 0,
            section,
        }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The error for a field of `needed` bytes (or a count implying them) that does not fit.
    pub(crate) fn overrun(&self, what: impl Into<String>, needed: u64) -> FormatError {
        FormatError::Overrun {
            section: self.section,
            what: what.into(),
            offset: self.pos as u64,
            needed,
            available: self.remaining() as u64,
        }
    }

    /// Refuse `count` items of at least `min_size` bytes each before anything is allocated.
    pub(crate) fn check_count(
        &self,
        what: &str,
        count: u64,
        min_size: u64,
    ) -> Result<usize, FormatError> {
        let needed = count.saturating_mul(min_size);
        if needed > self.remaining() as u64 {
            return Err(self.overrun(format!("{what} ({count})"), needed));
        }
        // needed <= remaining <= usize::MAX, and min_size >= 1, so count fits in usize.
        Ok(count as usize)
    }

    pub(crate) fn take(
        &mut self,
        n: u64,
        what: impl FnOnce() -> String,
    ) -> Result<&'a [u8], FormatError> {
        if n > self.remaining() as u64 {
            return Err(self.overrun(what(), n));
        }
        let n = n as usize;
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], FormatError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, what: impl FnOnce() -> String) -> Result<u8, FormatError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn u16(&mut self, what: impl FnOnce() -> String) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A u64-length-prefixed UTF-8 string (GGUF's string encoding).
    pub(crate) fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, FormatError> {
        let len = self.u64(|| format!("{} length", what()))?;
        let bytes = self.take(len, || format!("{} ({len} bytes)", what()))?;
        String::from_utf8(bytes.to_vec()).map_err(|_| FormatError::Invalid {
            what: what(),
            detail: "not valid UTF-8".to_string(),
        })
    }
}
