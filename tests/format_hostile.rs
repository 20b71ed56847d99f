//! Damaged and hostile files: each must be refused with the specific error for its defect.
//! Mutations are resealed (header and section CRCs recomputed) unless the test targets a CRC, so
//! each reaches the check it aims at.

mod format_support;

use format_support::sample_bytes;
use hob::format::reader::{parse, reseal, Parsed};
use hob::format::FormatError;

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Header field offsets (formats/hob.md, "Header").
const FILE_SIZE: usize = 16;
const METADATA_OFFSET: usize = 24;
const METADATA_LEN: usize = 32;
const TENSORS_LEN: usize = 48;
const TENSOR_COUNT: usize = 56;
const EXPERTS_LEN: usize = 72;
const DATA_OFFSET: usize = 80;
const DATA_LEN: usize = 88;

struct Sample {
    bytes: Vec<u8>,
    p: Parsed,
}

impl Sample {
    fn new() -> Sample {
        let bytes = sample_bytes();
        let p = parse(&bytes).unwrap();
        Sample { bytes, p }
    }
    /// Absolute position of tensor `i`'s dtype field; the fields after it follow at fixed steps.
    fn tensor_entry(&self, i: usize) -> usize {
        let mut at = self.p.header.tensors_offset as usize;
        for t in &self.p.tensors[..i] {
            at += 8 + t.name.len() + 4 + 4 + 8 * t.shape.len() + 8 + 8 + 4;
        }
        at
    }
    fn tensor_dtype_at(&self, i: usize) -> usize {
        self.tensor_entry(i) + 8 + self.p.tensors[i].name.len()
    }
    fn tensor_offset_at(&self, i: usize) -> usize {
        self.tensor_dtype_at(i) + 8 + 8 * self.p.tensors[i].shape.len()
    }
    fn variant_at(&self, v: usize) -> usize {
        self.p.header.experts_offset as usize + 24 + 16 * v
    }
    /// Position of the expert record's offset field (size at +8, crc at +16).
    fn record_at(&self, l: usize, e: usize, v: usize) -> usize {
        let nv = self.p.variants.len();
        self.variant_at(nv) + 24 * ((l * self.p.n_experts + e) * nv + v)
    }
    /// Position of `needle` inside the metadata section.
    fn find_meta(&self, needle: &[u8]) -> usize {
        let m = self.p.header.metadata_offset as usize;
        m + self.bytes[m..]
            .windows(needle.len())
            .position(|w| w == needle)
            .unwrap()
    }
    fn parse_resealed(self, f: impl FnOnce(&Sample, &mut Vec<u8>)) -> FormatError {
        let mut b = self.bytes.clone();
        f(&self, &mut b);
        reseal(&mut b);
        parse(&b).expect_err("damaged file was accepted")
    }
}

fn expect_truncated(b: &[u8], what_has: &str) {
    match parse(b) {
        Err(FormatError::Truncated {
            what, file_size, ..
        }) => {
            assert!(what.contains(what_has), "{what}");
            assert_eq!(file_size, b.len() as u64);
        }
        r => panic!(
            "len {}: expected Truncated {what_has}, got {:?}",
            b.len(),
            r.err()
        ),
    }
}

#[test]
fn truncated_at_each_section_boundary_and_inside() {
    let s = Sample::new();
    let h = &s.p.header;
    for len in [0, 4, 8, 11, 12, 100, 255] {
        expect_truncated(&s.bytes[..len], "header");
    }
    let cuts = [
        256,
        h.metadata_offset + h.metadata_len / 2,
        h.tensors_offset,
        h.tensors_offset + 20,
        h.experts_offset,
        h.experts_offset + h.experts_len - 3,
        h.data_offset,
        h.data_offset + 100,
        h.data_offset + h.data_len / 2,
        h.file_size - 1,
    ];
    for len in cuts {
        expect_truncated(&s.bytes[..len as usize], "file (size from the header)");
        // The same cut with a header that agrees with the new size: the sections no longer fit.
        let mut b = s.bytes[..len as usize].to_vec();
        put_u64(&mut b, FILE_SIZE, len);
        reseal(&mut b);
        match parse(&b) {
            Err(FormatError::Truncated { what, .. }) => {
                assert!(what.contains("section") || what.contains("table"), "{what}")
            }
            r => panic!("cut at {len}: {:?}", r.err()),
        }
    }
}

#[test]
fn sections_cut_short_overrun() {
    for (field, cut, section) in [
        (METADATA_LEN, 3, "metadata section"),
        (METADATA_LEN, 40, "metadata section"),
        (TENSORS_LEN, 5, "tensor table"),
        (EXPERTS_LEN, 24, "expert table"),
    ] {
        let err = Sample::new().parse_resealed(|_, b| {
            let v = get_u64(b, field);
            put_u64(b, field, v - cut);
        });
        match err {
            FormatError::Overrun {
                section: s,
                needed,
                available,
                ..
            } => {
                assert_eq!(s, section);
                assert!(needed > available);
            }
            e => panic!("{section} -{cut}: {e}"),
        }
    }
}

#[test]
fn bad_magic() {
    let mut b = Sample::new().bytes;
    b[0..8].copy_from_slice(b"GGUF\x03\0\0\0");
    match parse(&b) {
        Err(FormatError::BadMagic { found }) => assert_eq!(found, b"GGUF\x03\0\0\0"),
        r => panic!("{:?}", r.err()),
    }
    assert!(matches!(
        parse(b"PK\x03"),
        Err(FormatError::BadMagic { .. })
    ));
}

#[test]
fn unknown_version_even_byte_swapped() {
    for v in [2u32, 0, 1u32.swap_bytes()] {
        let mut b = Sample::new().bytes;
        put_u32(&mut b, 8, v);
        reseal(&mut b);
        match parse(&b) {
            Err(FormatError::UnsupportedVersion { found, supported }) => {
                assert_eq!((found, supported), (v, 1))
            }
            r => panic!("{:?}", r.err()),
        }
    }
}

#[test]
fn header_and_section_checksums() {
    let mut b = Sample::new().bytes;
    b[DATA_LEN] ^= 0x10;
    match parse(&b) {
        Err(FormatError::Checksum { what, .. }) => assert_eq!(what, "header"),
        r => panic!("{:?}", r.err()),
    }
    for (at, section) in [
        (METADATA_OFFSET, "metadata section"),
        (40, "tensor table"),
        (64, "expert table"),
    ] {
        let s = Sample::new();
        let mut b = s.bytes.clone();
        let pos = get_u64(&b, at) as usize + 9;
        b[pos] ^= 1;
        match parse(&b) {
            Err(FormatError::Checksum {
                what,
                stored,
                computed,
            }) => {
                assert_eq!(what, section);
                assert_ne!(stored, computed);
            }
            r => panic!("{:?}", r.err()),
        }
    }
}

fn expect_overrun(err: FormatError, section_is: &str, what_has: &str) {
    match err {
        FormatError::Overrun {
            section,
            what,
            needed,
            available,
            ..
        } => {
            assert_eq!(section, section_is);
            assert!(what.contains(what_has), "{what}");
            assert!(needed > available, "{needed} <= {available}");
        }
        e => panic!("expected Overrun in {what_has}, got {e}"),
    }
}

#[test]
fn counts_larger_than_the_file() {
    let err = Sample::new().parse_resealed(|_, b| put_u64(b, TENSOR_COUNT, 1 << 40));
    expect_overrun(err, "tensor table", "tensor count");
    let err = Sample::new()
        .parse_resealed(|s, b| put_u64(b, s.p.header.metadata_offset as usize, u64::MAX));
    expect_overrun(err, "metadata section", "entry count");
    let err = Sample::new()
        .parse_resealed(|s, b| put_u64(b, s.p.header.metadata_offset as usize + 8, 1 << 62));
    expect_overrun(err, "metadata section", "key of entry #0");
    let err = Sample::new().parse_resealed(|s, b| {
        let at = s.find_meta(b"t.string") + 8 + 4; // value length
        put_u64(b, at, 1 << 33);
    });
    expect_overrun(err, "metadata section", "string value of key 't.string'");
    let err = Sample::new().parse_resealed(|s, b| {
        let at = s.find_meta(b"t.array.u32") + 11 + 4 + 4; // key, type, elem type
        put_u64(b, at, u64::MAX / 2);
    });
    expect_overrun(err, "metadata section", "array count of key 't.array.u32'");
    let err = Sample::new().parse_resealed(|s, b| {
        let at = s.tensor_entry(1);
        put_u64(b, at, 1 << 50); // name length
    });
    expect_overrun(err, "tensor table", "name of tensor #1");
    let err = Sample::new()
        .parse_resealed(|s, b| put_u32(b, s.p.header.experts_offset as usize, 1 << 20));
    expect_overrun(err, "expert table", "expert record count");
    let err = Sample::new()
        .parse_resealed(|s, b| put_u32(b, s.p.header.experts_offset as usize + 16, 1 << 30));
    expect_overrun(err, "expert table", "variant count");
}

#[test]
fn offsets_past_the_end() {
    let err = Sample::new()
        .parse_resealed(|s, b| put_u64(b, s.tensor_offset_at(0), s.p.header.file_size + 4096));
    match err {
        FormatError::Truncated { what, .. } => assert_eq!(what, "tensor 'token_embd.weight'"),
        e => panic!("{e}"),
    }
    let err =
        Sample::new().parse_resealed(|s, b| put_u64(b, s.record_at(1, 2, 3), u64::MAX - 4095));
    match err {
        FormatError::Invalid { what, detail } => {
            assert_eq!(what, "expert (layer 1, expert 2, variant int2/g32)");
            assert!(detail.contains("overflows"), "{detail}");
        }
        e => panic!("{e}"),
    }
    let err = Sample::new().parse_resealed(|s, b| put_u64(b, s.record_at(0, 1, 0), 1 << 40));
    match err {
        FormatError::Truncated { what, start, .. } => {
            assert_eq!(what, "expert (layer 0, expert 1, variant f16)");
            assert_eq!(start, 1 << 40);
        }
        e => panic!("{e}"),
    }
    // Inside the file but in the tables, not the data section.
    let err = Sample::new().parse_resealed(|s, b| put_u64(b, s.tensor_offset_at(2), 0));
    match err {
        FormatError::Invalid { what, detail } => {
            assert_eq!(what, "tensor 'output_norm.weight'");
            assert!(detail.contains("outside the data section"), "{detail}");
        }
        e => panic!("{e}"),
    }
    let err = Sample::new().parse_resealed(|s, b| {
        let at = s.p.header.metadata_offset as usize;
        put_u64(b, DATA_LEN, s.p.header.data_len - 4096);
        put_u64(b, METADATA_OFFSET, at as u64);
    });
    assert!(
        matches!(err, FormatError::Invalid { ref detail, .. } if detail.contains("outside the data section")),
        "{err}"
    );
}

fn expect_overlap(err: FormatError, names: [&str; 2]) {
    match err {
        FormatError::Overlap { a, b } => {
            let mut got = [a, b];
            got.sort();
            let mut want = names.map(String::from);
            want.sort();
            assert_eq!(got, want);
        }
        e => panic!("expected Overlap, got {e}"),
    }
}

#[test]
fn overlapping_tensors_and_blobs() {
    let err = Sample::new().parse_resealed(|s, b| {
        let off = s.p.tensors[0].offset;
        put_u64(b, s.tensor_offset_at(1), off + 4096); // inside tensor 0's two pages
    });
    expect_overlap(
        err,
        ["tensor 'token_embd.weight'", "tensor 'blk.0.attn_q.weight'"],
    );
    let err = Sample::new().parse_resealed(|s, b| {
        let off = s.p.records[0].offset;
        put_u64(b, s.record_at(1, 2, 1), off);
    });
    expect_overlap(
        err,
        [
            "expert (layer 0, expert 0, variant f16)",
            "expert (layer 1, expert 2, variant int8/g64)",
        ],
    );
    let err = Sample::new().parse_resealed(|s, b| {
        let off = s.p.tensors[1].offset;
        put_u64(b, s.record_at(1, 2, 2), off);
    });
    expect_overlap(
        err,
        [
            "expert (layer 1, expert 2, variant int4/g64)",
            "tensor 'blk.0.attn_q.weight'",
        ],
    );
    // Sections overlapping each other or the header.
    let err = Sample::new().parse_resealed(|_, b| put_u64(b, METADATA_OFFSET, 128));
    assert!(
        matches!(err, FormatError::Overlap { ref a, ref b } if a.starts_with("metadata") && b.starts_with("header")),
        "{err}"
    );
}

#[test]
fn misaligned_blob_and_data_section() {
    let err = Sample::new().parse_resealed(|s, b| {
        let off = s.p.records[5].offset;
        put_u64(b, s.record_at(0, 1, 1), off + 64);
    });
    match err {
        FormatError::Misaligned {
            what,
            offset,
            align,
        } => {
            assert_eq!(what, "expert (layer 0, expert 1, variant int8/g64)");
            assert_eq!((offset % 4096, align), (64, 4096));
        }
        e => panic!("{e}"),
    }
    let err = Sample::new().parse_resealed(|s, b| {
        put_u64(b, DATA_OFFSET, s.p.header.data_offset + 8);
        put_u64(b, DATA_LEN, s.p.header.data_len - 8);
    });
    assert!(
        matches!(err, FormatError::Misaligned { ref what, .. } if what == "data section"),
        "{err}"
    );
}

#[test]
fn blob_size_not_matching_the_layout() {
    let err = Sample::new().parse_resealed(|s, b| {
        let at = s.record_at(1, 0, 2) + 8;
        let v = get_u64(b, at);
        put_u64(b, at, v - 64);
    });
    match err {
        FormatError::Invalid { what, detail } => {
            assert_eq!(what, "expert (layer 1, expert 0, variant int4/g64) size");
            assert!(detail.contains("needs"), "{detail}");
        }
        e => panic!("{e}"),
    }
    let err = Sample::new().parse_resealed(|s, b| {
        let at = s.tensor_offset_at(1) + 8;
        put_u64(b, at, 130);
    });
    assert!(
        matches!(err, FormatError::Invalid { ref what, .. } if what == "tensor 'blk.0.attn_q.weight' size"),
        "{err}"
    );
}

#[test]
fn unknown_variant_code_is_refused_not_misread() {
    let err = Sample::new().parse_resealed(|s, b| put_u32(b, s.variant_at(2), 99));
    match err {
        FormatError::UnknownVariant { code, what } => {
            assert_eq!(code, 99);
            assert_eq!(what, "expert table variant #2");
        }
        e => panic!("{e}"),
    }
    let err = Sample::new().parse_resealed(|s, b| put_u32(b, s.variant_at(1) + 4, 48 + 1));
    assert!(
        matches!(err, FormatError::Invalid { ref what, .. } if what == "expert table variant #1"),
        "{err}"
    );
    // int8/g64 -> int4/g64
    let err = Sample::new().parse_resealed(|s, b| put_u32(b, s.variant_at(1), 4));
    assert!(
        matches!(err, FormatError::Invalid { ref detail, .. } if detail.contains("listed twice")),
        "{err}"
    );
    let err =
        Sample::new().parse_resealed(|s, b| put_u32(b, s.p.header.experts_offset as usize + 16, 0));
    assert!(
        matches!(err, FormatError::Invalid { ref detail, .. } if detail.contains("no variants")),
        "{err}"
    );
}

#[test]
fn unknown_dtype_and_bad_tensor_entries() {
    let err = Sample::new().parse_resealed(|s, b| put_u32(b, s.tensor_dtype_at(0), 2));
    match err {
        FormatError::Invalid { what, detail } => {
            assert_eq!(what, "tensor 'token_embd.weight' dtype");
            assert!(detail.contains("unknown dtype code 2"), "{detail}");
        }
        e => panic!("{e}"),
    }
    let err = Sample::new().parse_resealed(|s, b| put_u32(b, s.tensor_dtype_at(1) + 4, 3));
    assert!(
        matches!(err, FormatError::Invalid { ref what, .. } if what == "tensor 'blk.0.attn_q.weight' ndim"),
        "{err}"
    );
    let err = Sample::new().parse_resealed(|s, b| put_u64(b, s.tensor_dtype_at(2) + 8, 0));
    assert!(
        matches!(err, FormatError::Invalid { ref what, .. } if what == "tensor 'output_norm.weight' dim 0"),
        "{err}"
    );
}

#[test]
fn duplicate_metadata_key_and_bad_values() {
    let err = Sample::new().parse_resealed(|s, b| {
        let at = s.find_meta(b"t.u16");
        b[at..at + 5].copy_from_slice(b"t.i16");
    });
    match err {
        FormatError::Metadata { key, detail } => {
            assert_eq!(key, "t.i16");
            assert_eq!(detail, "duplicate key");
        }
        e => panic!("{e}"),
    }
    let err = Sample::new().parse_resealed(|s, b| {
        let at = s.find_meta(b"t.bool") + 6 + 4;
        b[at] = 2;
    });
    assert!(
        matches!(err, FormatError::Metadata { ref key, ref detail } if key == "t.bool" && detail.contains("bool")),
        "{err}"
    );
    let err = Sample::new().parse_resealed(|s, b| {
        let at = s.find_meta(b"t.f64") + 5;
        put_u32(b, at, 13);
    });
    assert!(
        matches!(err, FormatError::Metadata { ref key, ref detail } if key == "t.f64" && detail.contains("unknown value type 13")),
        "{err}"
    );
    let err = Sample::new().parse_resealed(|s, b| {
        let at = s.find_meta(b"t.u8");
        b[at + 1] = 0xff;
    });
    assert!(
        matches!(err, FormatError::Invalid { ref what, ref detail } if what == "key of entry #1" && detail.contains("UTF-8")),
        "{err}"
    );
}

#[test]
fn deeply_nested_arrays_are_refused_without_recursing_forever() {
    let mut m = Vec::new();
    m.extend_from_slice(&1u64.to_le_bytes());
    m.extend_from_slice(&1u64.to_le_bytes());
    m.push(b'k');
    m.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..100_000 {
        m.extend_from_slice(&9u32.to_le_bytes());
        m.extend_from_slice(&1u64.to_le_bytes());
    }
    match hob::format::Metadata::decode(&m) {
        Err(FormatError::Metadata { key, detail }) => {
            assert_eq!(key, "k");
            assert!(detail.contains("nested deeper"), "{detail}");
        }
        r => panic!("{r:?}"),
    }
}

#[test]
fn file_longer_than_the_header_says() {
    let mut b = Sample::new().bytes;
    b.extend_from_slice(&[0; 4096]);
    assert!(
        matches!(parse(&b), Err(FormatError::Invalid { ref what, .. }) if what == "header.file_size")
    );
    let mut b = Sample::new().bytes;
    b[200] = 1;
    reseal(&mut b);
    assert!(
        matches!(parse(&b), Err(FormatError::Invalid { ref detail, .. }) if detail.contains("reserved"))
    );
}

#[test]
fn verify_names_the_first_bad_tensor_or_blob() {
    let s = Sample::new();
    let mut b = s.bytes.clone();
    b[s.p.tensors[2].offset as usize + 3] ^= 0x40;
    let p = parse(&b).unwrap();
    match p.verify(&b) {
        Err(FormatError::Checksum {
            what,
            stored,
            computed,
        }) => {
            assert_eq!(what, "tensor 'output_norm.weight'");
            assert_eq!(stored, s.p.tensors[2].crc32c);
            assert_ne!(stored, computed);
        }
        r => panic!("{r:?}"),
    }
    let mut b = s.bytes.clone();
    let r = s.p.records[(5 * 4) + 2]; // layer 1, expert 2, int4/g64
    b[(r.offset + r.size - 1) as usize] ^= 1;
    match parse(&b).unwrap().verify(&b) {
        Err(FormatError::Checksum { what, .. }) => {
            assert_eq!(what, "expert (layer 1, expert 2, variant int4/g64)")
        }
        r => panic!("{r:?}"),
    }
    // Padding is not covered.
    let mut b = s.bytes.clone();
    b[(r.offset + r.size) as usize] = 7;
    parse(&b).unwrap().verify(&b).unwrap();
}

#[test]
fn open_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.hob");
    let mut b = Sample::new().bytes;
    b.truncate(5000);
    std::fs::write(&path, &b).unwrap();
    let err = hob::format::HobFile::open(&path).err().unwrap();
    assert!(
        matches!(
            err,
            FormatError::File { ref source, .. } if matches!(**source, FormatError::Truncated { .. })
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.starts_with(&path.display().to_string()) && msg.contains("truncated"),
        "{msg}"
    );
    let err = hob::format::HobFile::open(&dir.path().join("missing.hob"))
        .err()
        .unwrap();
    assert!(matches!(err, FormatError::Io { op: "open", .. }), "{err}");
}

/// `bytes` written to `name` in a new temporary directory: (the directory, the file).
fn write_temp(bytes: &[u8], name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

#[test]
fn flipped_expert_byte_fails_its_checksum_on_first_read() {
    let s = Sample::new();
    let mut b = s.bytes.clone();
    // Layer 1, expert 2, int4/g64 (variant 2 of 4).
    let r = s.p.records[(5 * 4) + 2];
    b[(r.offset + 100) as usize] ^= 0x10;
    let (_dir, path) = write_temp(&b, "flipped.hob");
    // The header and the sections are intact: the file opens; the blob fails when first read.
    let f = hob::format::HobFile::open(&path).unwrap();
    let err = f.verify_expert(1, 2, 2).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with(&path.display().to_string())
            && msg.contains("checksum mismatch in expert (layer 1, expert 2, variant int4/g64)"),
        "{msg}"
    );
    // Every read fails, not only the first; the other blobs pass, and once checked stay checked.
    assert!(f.verify_expert(1, 2, 2).is_err());
    let checks = f.blob_checks();
    let i = checks.index(1, 1, 2).unwrap();
    assert!(!checks.is_verified(i));
    f.verify_expert(1, 1, 2).unwrap();
    assert!(checks.is_verified(i));
    assert!(!checks.is_verified(checks.index(1, 2, 2).unwrap()));
    // A loader copying any part of the blob (here: from its second page) checks the whole blob.
    let at = r.offset as usize + 4096;
    let err = checks.range(at..at + 100, crc32c::crc32c).unwrap_err();
    assert!(
        err.to_string().contains("expert (layer 1, expert 2"),
        "{err}"
    );
    // A range outside every blob (a dense tensor) is nobody's to check.
    let t = s.p.tensors[0].offset as usize;
    checks.range(t..t + 8, crc32c::crc32c).unwrap();
    // Out-of-range indices are an error, not a panic.
    assert!(f.verify_expert(2, 0, 0).is_err() && f.verify_expert(0, 3, 0).is_err());
    assert!(f.verify_expert(0, 0, 4).is_err());
}

#[test]
fn flipped_dense_byte_fails_its_checksum_when_the_weights_load() {
    let s = Sample::new();
    let mut b = s.bytes.clone();
    b[s.p.tensors[1].offset as usize + 7] ^= 0x01;
    let (_dir, path) = write_temp(&b, "flipped.hob");
    let f = hob::format::HobFile::open(&path).unwrap();
    let msg = f.verify_dense().unwrap_err().to_string();
    assert!(
        msg.starts_with(&path.display().to_string())
            && msg.contains("checksum mismatch in tensor 'blk.0.attn_q.weight'"),
        "{msg}"
    );
    // In pieces (as a model's load computes it on several threads): the same verdict.
    let pieces = |d: &[u8]| {
        hob::format::crc32c_pieces(d, 64, |ps| ps.iter().map(|p| crc32c::crc32c(p)).collect())
    };
    assert!(f.verify_dense_with(pieces).is_err());
    let (_dir, good) = write_temp(&s.bytes, "good.hob");
    let f = hob::format::HobFile::open(&good).unwrap();
    f.verify_dense_with(pieces).unwrap();
    f.verify_dense().unwrap();
}

/// `HobFile::open(path)`'s error message, failing the test if it takes over 10 s (a FIFO once
/// blocked the open until a writer came).
fn open_error(path: &std::path::Path) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        let r = hob::format::HobFile::open(&p).err().map(|e| e.to_string());
        let _ = tx.send(r);
    });
    match rx.recv_timeout(std::time::Duration::from_secs(10)) {
        Ok(Some(msg)) => msg,
        Ok(None) => panic!("{} opened", path.display()),
        Err(_) => panic!("opening {} hangs", path.display()),
    }
}

#[test]
fn a_directory_a_fifo_or_a_device_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let msg = open_error(dir.path());
    assert_eq!(
        msg,
        format!(
            "{} is a directory: expected a .hob file",
            dir.path().display()
        )
    );
    #[cfg(unix)]
    {
        let msg = open_error(std::path::Path::new("/dev/null"));
        assert_eq!(msg, "/dev/null is a character device: expected a .hob file");
        let fifo = dir.path().join("model.hob");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let msg = open_error(&fifo);
        assert_eq!(
            msg,
            format!("{} is a FIFO: expected a .hob file", fifo.display())
        );
    }
}

#[test]
fn gguf_empty_and_foreign_files_say_what_they_are() {
    let mut gguf = b"GGUF\x03\0\0\0".to_vec();
    gguf.resize(4096, 0);
    let (_d1, path) = write_temp(&gguf, "model.gguf");
    let msg = open_error(&path);
    assert!(
        msg.starts_with(&format!(
            "{} is a GGUF file; hob reads .hob files",
            path.display()
        )) && msg.contains("hob convert --from FILE.gguf -o model.hob"),
        "{msg}"
    );
    let (_d2, path) = write_temp(&[], "empty.hob");
    assert_eq!(
        open_error(&path),
        format!(
            "{} is empty (0 bytes): expected a .hob file",
            path.display()
        )
    );
    let (_d3, path) = write_temp(b"\x7fELF\x02\x01\x01\0 and more bytes", "hob");
    assert_eq!(
        open_error(&path),
        format!(
            "{}: not a .hob file (magic \"\\x7fELF\\x02\\x01\\x01\\x00\", expected \"HOBFILE\\0\")",
            path.display()
        )
    );
}
