//! Damaged copies of the tiny fixture for the tests of bad models (issue 49's fuzzing): the damage
//! is done, then the checksums in front of it recomputed, so the file reaches the check behind them.

/// The fixture converted with `experts`, then `damage`d and resealed: the CRCs of the header, the
/// sections and every dense tensor recomputed (`damage` may change data or metadata), so that the
/// file reaches the check behind them. Returns the directory and the file.
pub fn damaged_fixture(
    experts: &str,
    damage: impl FnOnce(&hob::format::reader::Parsed, &mut Vec<u8>),
) -> (tempfile::TempDir, std::path::PathBuf) {
    use hob::format::reader::{parse, reseal};
    let (dir, path) = super::convert_fixture(experts);
    let mut b = std::fs::read(&path).unwrap();
    let p = parse(&b).unwrap();
    damage(&p, &mut b);
    // Each tensor entry: name (u64 length + bytes), dtype, ndim, dims, offset, size, crc.
    let mut at = p.header.tensors_offset as usize;
    for t in &p.tensors {
        let crc_at = at + 8 + t.name.len() + 8 + 8 * t.shape.len() + 16;
        let data = &b[t.offset as usize..(t.offset + t.size) as usize];
        let crc = crc32c::crc32c(data);
        b[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
        at = crc_at + 4;
    }
    reseal(&mut b);
    std::fs::write(&path, &b).unwrap();
    (dir, path)
}

pub fn tensor<'p>(p: &'p hob::format::reader::Parsed, name: &str) -> &'p hob::format::TensorInfo {
    p.tensors.iter().find(|t| t.name == name).unwrap()
}
