//! The fixed 256-byte header at offset 0 (formats/hob.md, "Header") and the section checksums it
//! carries.

#[cfg(target_endian = "big")]
compile_error!("hob reads and writes .hob files by reinterpreting little-endian bytes; big-endian targets are not supported");

use super::reader::Header;
use super::FormatError;

pub(crate) const MAGIC: [u8; 8] = *b"HOBFILE\0";
pub(crate) const VERSION: u32 = 1;
pub(crate) const HEADER_SIZE: usize = 256;
/// The header CRC covers bytes 0..HEADER_CRC_AT and is stored at HEADER_CRC_AT.
const HEADER_CRC_AT: usize = HEADER_SIZE - 4;
/// Bytes 112..HEADER_CRC_AT are reserved (zero) for later versions.
const RESERVED_AT: usize = 112;

const fn field(at: usize) -> std::ops::Range<usize> {
    at..at + 8
}

/// Serialize `h` (CRC fields included) and seal it with the header CRC.
pub(crate) fn encode(h: &Header) -> [u8; HEADER_SIZE] {
    let mut b = [0u8; HEADER_SIZE];
    b[0..8].copy_from_slice(&MAGIC);
    b[8..12].copy_from_slice(&h.version.to_le_bytes());
    b[12..16].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
    let u64s = [
        h.file_size,
        h.metadata_offset,
        h.metadata_len,
        h.tensors_offset,
        h.tensors_len,
        h.tensor_count,
        h.experts_offset,
        h.experts_len,
        h.data_offset,
        h.data_len,
    ];
    for (i, v) in u64s.iter().enumerate() {
        b[field(16 + 8 * i)].copy_from_slice(&v.to_le_bytes());
    }
    b[96..100].copy_from_slice(&h.metadata_crc32c.to_le_bytes());
    b[100..104].copy_from_slice(&h.tensors_crc32c.to_le_bytes());
    b[104..108].copy_from_slice(&h.experts_crc32c.to_le_bytes());
    let crc = crc32c::crc32c(&b[..HEADER_CRC_AT]);
    b[HEADER_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    b
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[field(at)].try_into().expect("8 bytes"))
}

/// Check magic, version, size and CRC of the header at the start of `bytes`, then read it.
/// Section bounds are checked by the caller, which knows the file size.
pub(crate) fn decode(bytes: &[u8]) -> Result<Header, FormatError> {
    let file_size = bytes.len() as u64;
    let n = bytes.len().min(MAGIC.len());
    if bytes[..n] != MAGIC[..n] {
        return Err(FormatError::BadMagic {
            found: bytes[..n].to_vec(),
        });
    }
    let truncated = || FormatError::Truncated {
        what: "header".to_string(),
        start: 0,
        end: HEADER_SIZE as u64,
        file_size,
    };
    if bytes.len() < 12 {
        return Err(truncated());
    }
    // Checked before the header's length and CRC: another version may have another header.
    let version = u32_at(bytes, 8);
    if version != VERSION {
        return Err(FormatError::UnsupportedVersion {
            found: version,
            supported: VERSION,
        });
    }
    if bytes.len() < HEADER_SIZE {
        return Err(truncated());
    }
    let b = &bytes[..HEADER_SIZE];
    let stored = u32_at(b, HEADER_CRC_AT);
    let computed = crc32c::crc32c(&b[..HEADER_CRC_AT]);
    if stored != computed {
        return Err(FormatError::Checksum {
            what: "header".to_string(),
            stored,
            computed,
        });
    }
    let header_size = u32_at(b, 12);
    if header_size as usize != HEADER_SIZE {
        return Err(FormatError::Invalid {
            what: "header.header_size".to_string(),
            detail: format!("expected {HEADER_SIZE}, found {header_size}"),
        });
    }
    if u32_at(b, 108) != 0 || b[RESERVED_AT..HEADER_CRC_AT].iter().any(|&x| x != 0) {
        return Err(FormatError::Invalid {
            what: "header bytes 108..252".to_string(),
            detail: "reserved, must be zero in version 1".to_string(),
        });
    }
    Ok(Header {
        version,
        file_size: u64_at(b, 16),
        metadata_offset: u64_at(b, 24),
        metadata_len: u64_at(b, 32),
        tensors_offset: u64_at(b, 40),
        tensors_len: u64_at(b, 48),
        tensor_count: u64_at(b, 56),
        experts_offset: u64_at(b, 64),
        experts_len: u64_at(b, 72),
        data_offset: u64_at(b, 80),
        data_len: u64_at(b, 88),
        metadata_crc32c: u32_at(b, 96),
        tensors_crc32c: u32_at(b, 100),
        experts_crc32c: u32_at(b, 104),
    })
}

/// Recompute the three section CRCs and the header CRC of `bytes` in place, leaving every other
/// byte as it is. A tool for tests and fuzzing: after a deliberate mutation, resealing lets the
/// damaged file get past the checksums to the check it targets. Sections whose bounds lie
/// outside `bytes` keep their stored CRC. Never panics; does nothing to a buffer shorter than
/// the header.
pub fn reseal(bytes: &mut [u8]) {
    if bytes.len() < HEADER_SIZE {
        return;
    }
    let sections = [(24, 32, 96), (40, 48, 100), (64, 72, 104)];
    for (off_at, len_at, crc_at) in sections {
        let (off, len) = (u64_at(bytes, off_at), u64_at(bytes, len_at));
        let range = usize::try_from(off)
            .ok()
            .zip(usize::try_from(len).ok())
            .and_then(|(o, l)| Some(o..o.checked_add(l)?))
            .filter(|r| r.end <= bytes.len());
        if let Some(r) = range {
            let crc = crc32c::crc32c(&bytes[r]);
            bytes[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let crc = crc32c::crc32c(&bytes[..HEADER_CRC_AT]);
    bytes[HEADER_CRC_AT..HEADER_SIZE].copy_from_slice(&crc.to_le_bytes());
}
