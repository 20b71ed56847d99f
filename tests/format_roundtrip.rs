//! Write a synthetic file, read it back: every byte, every metadata value, every checksum.

mod format_support;

use format_support::{sample, sample_bytes, write};
use hob::format::reader::parse;
use hob::format::{HobFile, MetaValue, Metadata, BLOB_ALIGN};

#[test]
fn round_trip_every_tensor_blob_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.hob");
    let s = sample(1);
    write(&s, &path).unwrap();
    let f = HobFile::open(&path).unwrap();

    assert_eq!(f.metadata(), &s.metadata);
    assert_eq!(f.metadata().len(), 17);
    assert_eq!(f.tensors().len(), s.dense.len());
    for (d, bytes) in s.dense.iter().zip(&s.dense_bytes) {
        let t = f.tensor(&d.name).unwrap();
        assert_eq!((t.info.dtype, &t.info.shape), (d.dtype, &d.shape));
        assert_eq!(t.data, &bytes[..], "tensor {}", d.name);
        assert_eq!(t.info.offset % BLOB_ALIGN as u64, 0);
    }
    assert!(f.tensor("missing").is_none());

    assert_eq!(
        (f.n_layers(), f.n_experts(), f.expert_dims()),
        (2, 3, (64, 128))
    );
    assert_eq!(f.variants(), &s.variants[..]);
    let nv = s.variants.len();
    for l in 0..2 {
        for e in 0..3 {
            for v in 0..nv {
                let blob = &s.blobs[(l * 3 + e) * nv + v];
                let x = f.expert(l, e, v);
                assert_eq!(x.data, &blob[..]);
                assert_eq!(
                    x.data.as_ptr() as usize % BLOB_ALIGN,
                    0,
                    "mmap blob alignment"
                );
                let lay = f.expert_layout(v);
                let (g, u, d) = (x.gate(), x.up(), x.down());
                assert_eq!((g.rows, g.cols, d.rows, d.cols), (128, 64, 64, 128));
                assert_eq!(g.codes, &blob[lay.gate.codes.clone()]);
                let up_scales =
                    lay.up_offset + lay.up.scales.start..lay.up_offset + lay.up.scales.end;
                assert_eq!(u.scales, &blob[up_scales]);
                let down_mins =
                    lay.down_offset + lay.down.mins.start..lay.down_offset + lay.down.mins.end;
                assert_eq!(d.mins, &blob[down_mins]);
                assert_eq!(f.expert_record(l, e, v).crc32c, crc32c::crc32c(blob));
            }
        }
    }
    f.verify().unwrap();
}

#[test]
fn same_inputs_give_identical_files() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.hob"), dir.path().join("b.hob"));
    write(&sample(3), &a).unwrap();
    write(&sample(3), &b).unwrap();
    let (a, b) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    assert_eq!(a.len() % BLOB_ALIGN, 0);
    assert!(a == b, "two writes of the same inputs differ");
    assert_eq!(a, sample_bytes_for(3));
}

fn sample_bytes_for(seed: u64) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.hob");
    write(&sample(seed), &p).unwrap();
    std::fs::read(p).unwrap()
}

#[test]
fn padding_is_zero_and_data_follows_the_tables() {
    let bytes = sample_bytes();
    let p = parse(&bytes).unwrap();
    let h = &p.header;
    assert_eq!(h.metadata_offset, 256);
    assert_eq!(h.tensors_offset, h.metadata_offset + h.metadata_len);
    assert_eq!(h.experts_offset, h.tensors_offset + h.tensors_len);
    assert_eq!(h.data_offset % 4096, 0);
    assert_eq!(h.data_offset + h.data_len, bytes.len() as u64);
    // Dense first in table order, then blobs in record order, each padded with zeros.
    let mut pos = h.data_offset;
    let extents = p
        .tensors
        .iter()
        .map(|t| (t.offset, t.size))
        .chain(p.records.iter().map(|r| (r.offset, r.size)));
    for (off, size) in extents {
        assert_eq!(off, pos);
        let end = off + size;
        pos = end.div_ceil(4096) * 4096;
        assert!(bytes[end as usize..pos as usize].iter().all(|&b| b == 0));
    }
    assert_eq!(pos, bytes.len() as u64);
}

#[test]
fn metadata_getters_convert_and_name_the_key() {
    let m = format_support::all_types_metadata();
    assert_eq!(m.get_u32("t.u8").unwrap(), 200);
    assert_eq!(m.get_u32("t.u32").unwrap(), 4_000_000_000);
    let mut m2 = Metadata::new();
    m2.set("n", MetaValue::I64(7));
    m2.set("big", MetaValue::U64(1 << 40));
    m2.set("f", MetaValue::F64(0.25));
    assert_eq!(m2.get_u32("n").unwrap(), 7);
    assert_eq!(m2.get_f32("f").unwrap(), 0.25);
    assert_eq!(m.get_f32("t.f32").unwrap(), 1.0e-5);
    assert_eq!(m.get_str("t.string").unwrap(), "héllo {{ messages }}\n");
    assert!(m.get_bool("t.bool").unwrap());
    for (r, key, detail) in [
        (m2.get_u32("big").map(|_| ()), "big", "does not fit"),
        (m.get_u32("t.i8").map(|_| ()), "t.i8", "does not fit"),
        (
            m.get_u32("t.f32").map(|_| ()),
            "t.f32",
            "expected an integer, found f32",
        ),
        (m.get_str("nope").map(|_| ()), "nope", "missing"),
        (
            m.get_bool("t.u8").map(|_| ()),
            "t.u8",
            "expected a bool, found u8",
        ),
        (
            m.get_f32("t.string").map(|_| ()),
            "t.string",
            "expected a float, found string",
        ),
    ] {
        match r.unwrap_err() {
            hob::format::FormatError::Metadata { key: k, detail: d } => {
                assert_eq!(k, key);
                assert!(d.contains(detail), "{d}");
            }
            e => panic!("{e}"),
        }
    }
    let bytes = m.encode();
    assert_eq!(Metadata::decode(&bytes).unwrap(), m);
    // GGUF's encoding, byte for byte, for one entry.
    let mut one = Metadata::new();
    one.set("ab", MetaValue::U16(0x0102));
    assert_eq!(
        one.encode(),
        [1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, b'a', b'b', 2, 0, 0, 0, 2, 1]
    );
}
