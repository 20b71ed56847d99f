//! The GGUF reader against files written by gguf-py's own `GGUFWriter` (tests/fixtures/gguf-small,
//! made by tools/make_gguf_fixture.py): metadata, tensor table, bytes, dequantized values (bit for
//! bit against gguf-py's `quants.dequantize`), the split pair opened as one; then hostile variants
//! of the good bytes, each an error naming the file and the key or tensor, and a random-damage
//! loop that must never panic (cases: PROPTEST_CASES, default 2,000), on this file and on one
//! written by llama.cpp's own converter (tests/fixtures/gguf-convert/tiny-qwen3-moe.gguf), whose
//! tokenizer keys and checkpoint (what `hob convert --from` opens) go through it too.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hob::format::MetaValue;
use hob::import::ggml::GgmlType;
use hob::import::gguf::{GgufError, GgufFile};
use hob::import::gguf_checkpoint::GgufCheckpoint;
use hob::import::gguf_tokenizer::tokenizer_from_gguf;
use hob::import::ConvertSource;
use proptest::prelude::*;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf-small")
}

fn small_path() -> PathBuf {
    dir().join("small.gguf")
}

fn small_bytes() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| std::fs::read(small_path()).unwrap())
}

/// The f32 values gguf-py dequantized tensor `name` to.
fn reference(name: &str) -> Vec<f32> {
    std::fs::read(dir().join(format!("{name}.f32")))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

// small.gguf's tensors: name, ne, type, offset from the data section, bytes.
const SMALL_TENSORS: [(&str, &[u64], GgmlType, u64, u64); 5] = [
    ("token_embd.weight", &[8, 4], GgmlType::F32, 0, 128),
    ("blk.0.attn_q.weight", &[8, 3], GgmlType::F16, 128, 48),
    (
        "blk.0.ffn_up_exps.weight",
        &[64, 3, 2],
        GgmlType::Q8_0,
        192,
        408,
    ),
    (
        "blk.0.ffn_down_exps.weight",
        &[256, 2],
        GgmlType::Q4_K,
        640,
        288,
    ),
    ("test.ids", &[5], GgmlType::I32, 960, 20),
];
const SMALL_DATA_START: u64 = 960;
const SMALL_DATA_END: usize = 1940;

#[test]
fn small_metadata() {
    let g = GgufFile::open(&small_path()).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_start(), SMALL_DATA_START);
    assert_eq!(g.shard_paths(), vec![small_path().as_path()]);
    let m = g.metadata();
    assert_eq!(m.len(), 18);
    let expect = [
        ("general.architecture", MetaValue::String("hobtest".into())),
        ("general.alignment", MetaValue::U32(64)),
        ("general.name", MetaValue::String("hob gguf fixture".into())),
        ("test.u8", MetaValue::U8(200)),
        ("test.i8", MetaValue::I8(-100)),
        ("test.u16", MetaValue::U16(60000)),
        ("test.i16", MetaValue::I16(-30000)),
        ("test.u32", MetaValue::U32(4_000_000_000)),
        ("test.i32", MetaValue::I32(-2_000_000_000)),
        ("test.f32", MetaValue::F32(0.25)),
        ("test.u64", MetaValue::U64(1 << 40)),
        ("test.i64", MetaValue::I64(-(1 << 40))),
        ("test.f64", MetaValue::F64(-1.5)),
        ("test.bool", MetaValue::Bool(true)),
        ("test.string", MetaValue::String("héllo, GGUF".into())),
        (
            "test.array_i32",
            MetaValue::Array {
                elem_type: 5,
                items: vec![MetaValue::I32(1), MetaValue::I32(-2), MetaValue::I32(3)],
            },
        ),
        (
            "test.array_f32",
            MetaValue::Array {
                elem_type: 6,
                items: vec![MetaValue::F32(0.5), MetaValue::F32(-0.25)],
            },
        ),
        (
            "test.array_str",
            MetaValue::Array {
                elem_type: 8,
                items: ["<s>", "</s>", "▁the"]
                    .map(|s| MetaValue::String(s.into()))
                    .to_vec(),
            },
        ),
    ];
    let keys: Vec<&str> = m.iter().map(|(k, _)| k).collect();
    assert_eq!(keys, expect.iter().map(|(k, _)| *k).collect::<Vec<_>>());
    for (key, value) in &expect {
        assert_eq!(m.get(key), Some(value), "{key}");
    }
}

#[test]
fn small_tensors_and_bytes() {
    let g = GgufFile::open(&small_path()).unwrap();
    let names: Vec<&str> = g.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, SMALL_TENSORS.map(|t| t.0));
    let file = small_bytes();
    for (name, dims, ty, offset, n_bytes) in SMALL_TENSORS {
        let t = g.tensor(name).unwrap();
        assert_eq!(t.name(), name);
        assert_eq!(t.dims(), dims, "{name}");
        assert_eq!(t.ggml_type(), ty, "{name}");
        assert_eq!(t.info().shard, 0);
        assert_eq!(t.info().offset, offset, "{name}");
        assert_eq!(t.info().n_bytes, n_bytes, "{name}");
        assert_eq!(t.info().n_elements(), dims.iter().product::<u64>());
        let start = (SMALL_DATA_START + offset) as usize;
        assert_eq!(
            t.info().file_range(),
            start as u64..(start as u64 + n_bytes)
        );
        assert_eq!(t.bytes(), &file[start..start + n_bytes as usize], "{name}");
    }
    assert!(g.tensor("missing.weight").is_none());
    let ids: Vec<i32> = g
        .tensor("test.ids")
        .unwrap()
        .bytes()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(ids, [-2, -1, 0, 1, 2]);
}

#[test]
fn dequantized_values_equal_gguf_py() {
    let g = GgufFile::open(&small_path()).unwrap();
    for (name, ..) in &SMALL_TENSORS[..4] {
        let ours = g.tensor(name).unwrap().dequantize_f32().unwrap();
        let theirs = reference(name);
        assert_eq!(ours.len(), theirs.len(), "{name}");
        for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{name}[{i}]: hob {a:e}, gguf-py {b:e}"
            );
        }
    }
    let e = g.tensor("test.ids").unwrap().dequantize_f32().unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("small.gguf: tensor test.ids: GGML type I32"),
        "{msg}"
    );
    assert!(msg.contains("cannot be dequantized"), "{msg}");
}

#[test]
fn split_pair_opens_as_one() {
    let g = GgufFile::open(&dir().join("tiny-00001-of-00002.gguf")).unwrap();
    let shards: Vec<String> = g
        .shard_paths()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        shards,
        ["tiny-00001-of-00002.gguf", "tiny-00002-of-00002.gguf"]
    );
    assert_eq!(
        g.metadata().get_str("general.name").unwrap(),
        "hob gguf split fixture"
    );
    assert_eq!(g.metadata().get_u32("split.count").unwrap(), 2);
    assert_eq!(g.metadata().get_u32("hobtest.block_count").unwrap(), 1);
    let table: Vec<(&str, &[u64], GgmlType, usize)> = g
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.dims.as_slice(), t.ggml_type, t.shard))
        .collect();
    assert_eq!(
        table,
        [
            ("token_embd.weight", &[4u64, 2][..], GgmlType::F32, 0),
            ("blk.0.attn_norm.weight", &[4][..], GgmlType::F32, 0),
            ("output.weight", &[4, 2][..], GgmlType::F16, 1),
        ]
    );
    let norm = g.tensor("blk.0.attn_norm.weight").unwrap();
    assert_eq!(norm.dequantize_f32().unwrap(), [1.0; 4]);
    let out = g.tensor("output.weight").unwrap();
    assert!(out.path().ends_with("tiny-00002-of-00002.gguf"));
    assert_eq!(out.bytes().len(), 16);
    assert_eq!(out.dequantize_f32().unwrap().len(), 8);
}

#[test]
fn a_later_shard_points_at_the_first() {
    let e = GgufFile::open(&dir().join("tiny-00002-of-00002.gguf"))
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains(
            "tiny-00002-of-00002.gguf: split set: this is shard 2 of 2: open the first shard"
        ),
        "{msg}"
    );
    assert!(msg.contains("tiny-00001-of-00002.gguf"), "{msg}");
}

// ---- hostile variants ----

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not in the file", needle.escape_ascii().to_string()))
}

/// Where key `key`'s value starts (after its name and u32 type).
fn value_at(b: &[u8], key: &str) -> usize {
    let mut pattern = (key.len() as u64).to_le_bytes().to_vec();
    pattern.extend_from_slice(key.as_bytes());
    find(b, &pattern) + pattern.len() + 4
}

/// Where tensor `name`'s info continues after its name (at n_dims).
fn info_at(b: &[u8], name: &str) -> usize {
    let mut pattern = (name.len() as u64).to_le_bytes().to_vec();
    pattern.extend_from_slice(name.as_bytes());
    find(b, &pattern) + pattern.len()
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Tensor `name`'s fields: (n_dims at, ne[0] at, type at, offset at).
fn fields(b: &[u8], name: &str) -> (usize, usize, usize, usize) {
    let at = info_at(b, name);
    let n_dims = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    let ty = at + 4 + 8 * n_dims;
    (at, at + 4, ty, ty + 4)
}

/// The message `bytes` is rejected with, opened as small.gguf from memory.
fn reject(bytes: Vec<u8>) -> String {
    match GgufFile::from_bytes("small.gguf", bytes) {
        Ok(_) => panic!("a hostile file was accepted"),
        Err(e) => e.to_string(),
    }
}

fn damaged(f: impl FnOnce(&mut Vec<u8>)) -> String {
    let mut b = small_bytes().to_vec();
    f(&mut b);
    reject(b)
}

fn assert_says(msg: &str, parts: &[&str]) {
    assert!(msg.starts_with("small.gguf"), "{msg}");
    for p in parts {
        assert!(msg.contains(p), "{msg:?} does not say {p:?}");
    }
}

#[test]
fn header_damage() {
    let msg = damaged(|b| b[3] = b'G');
    assert_says(&msg, &["not a GGUF file", "GGUG"]);
    for v in [1, 4] {
        let msg = damaged(|b| put_u32(b, 4, v));
        assert_says(&msg, &[&format!("GGUF version {v} is not supported")]);
    }
    let msg = damaged(|b| put_u32(b, 4, 3u32.swap_bytes()));
    assert_says(&msg, &["big-endian"]);
    let msg = damaged(|b| put_u64(b, 8, u64::MAX));
    assert_says(&msg, &["header: tensor count 18446744073709551615"]);
    let msg = damaged(|b| put_u64(b, 16, 1 << 40));
    assert_says(&msg, &["header: key/value count 1099511627776"]);
    // One more tensor than there are: the tensor infos run into the data.
    let msg = damaged(|b| put_u64(b, 8, 6));
    assert_says(&msg, &["tensor"]);
    assert_eq!(
        reject(Vec::new()),
        "small.gguf: not a GGUF file (magic \"\", expected \"GGUF\")"
    );
}

#[test]
fn metadata_damage() {
    let msg = damaged(|b| {
        let at = value_at(b, "general.name");
        put_u64(b, at, 1 << 50);
    });
    assert_says(&msg, &["string value of key 'general.name'"]);
    let msg = damaged(|b| {
        let at = value_at(b, "test.array_str");
        put_u64(b, at + 4, u64::MAX / 2);
    });
    assert_says(&msg, &["array count of key 'test.array_str'"]);
    let msg = damaged(|b| {
        let at = value_at(b, "test.bool");
        b[at] = 2;
    });
    assert_says(&msg, &["key 'test.bool'", "bool stored as 2"]);
    let msg = damaged(|b| {
        let at = value_at(b, "test.f64");
        put_u32(b, at - 4, 13);
    });
    assert_says(&msg, &["key 'test.f64'", "unknown value type 13"]);
    let msg = damaged(|b| {
        let at = find(b, b"test.u16");
        b[at + 6..at + 8].copy_from_slice(b"32");
    });
    assert_says(&msg, &["key 'test.u32'", "duplicate key"]);
    for bad in [0, 48] {
        let msg = damaged(|b| {
            let at = value_at(b, "general.alignment");
            put_u32(b, at, bad);
        });
        assert_says(
            &msg,
            &["metadata key 'general.alignment'", "not a power of two"],
        );
    }
    let msg = damaged(|b| {
        let at = value_at(b, "general.alignment");
        put_u32(b, at - 4, 6); // now an f32
    });
    assert_says(&msg, &["general.alignment", "expected an integer"]);
}

#[test]
fn tensor_info_damage() {
    let name = "blk.0.ffn_up_exps.weight";
    let msg = damaged(|b| {
        let at = info_at(b, "token_embd.weight") - 17 - 8;
        put_u64(b, at, 1 << 50);
    });
    assert_says(
        &msg,
        &["tensor info #0: name (1125899906842624 bytes) needs"],
    );
    let msg = damaged(|b| {
        let at = fields(b, name).0;
        put_u32(b, at, 5)
    });
    assert_says(&msg, &[&format!("tensor {name}: n_dims is 5")]);
    let msg = damaged(|b| {
        let ne = fields(b, "blk.0.attn_q.weight").1;
        put_u64(b, ne + 8, 0);
    });
    assert_says(&msg, &["tensor blk.0.attn_q.weight: ne[1] is 0"]);
    let msg = damaged(|b| {
        let ne = fields(b, name).1;
        put_u64(b, ne + 8, 1 << 40);
        put_u64(b, ne + 16, 1 << 40);
    });
    assert_says(
        &msg,
        &[&format!(
            "tensor {name}: ne [64, 1099511627776, 1099511627776]: the element count overflows"
        )],
    );
    let msg = damaged(|b| {
        let at = fields(b, "blk.0.ffn_down_exps.weight").2;
        put_u32(b, at, 99)
    });
    assert_says(
        &msg,
        &["tensor blk.0.ffn_down_exps.weight: GGML type code 99"],
    );
    let msg = damaged(|b| {
        let at = fields(b, name).1;
        put_u64(b, at, 48)
    });
    assert_says(
        &msg,
        &[&format!(
            "tensor {name}: ne[0] = 48 is not a multiple of Q8_0's block size 32"
        )],
    );
    let msg = damaged(|b| {
        let at = fields(b, "blk.0.attn_q.weight").3;
        put_u64(b, at, 160)
    });
    assert_says(
        &msg,
        &["tensor blk.0.attn_q.weight: data offset 160 is not a multiple of the alignment 64"],
    );
}

#[test]
fn tensor_data_damage() {
    let msg = damaged(|b| {
        let at = fields(b, "test.ids").3;
        put_u64(b, at, 6400)
    });
    assert_eq!(msg, "small.gguf: tensor test.ids: data at 7360..7380 runs past the end of the file (1984 bytes)");
    let msg = damaged(|b| {
        let at = fields(b, "test.ids").3;
        put_u64(b, at, u64::MAX - 63)
    });
    assert_says(&msg, &["tensor test.ids: data at", "runs past the end"]);
    let msg = damaged(|b| {
        let at = fields(b, "blk.0.attn_q.weight").3;
        put_u64(b, at, 0)
    });
    assert_says(&msg, &["tensor blk.0.attn_q.weight: data at 960..1008 overlaps tensor token_embd.weight at 960..1088"]);
    let msg = damaged(|b| {
        let at = fields(b, "blk.0.ffn_down_exps.weight").3;
        put_u64(b, at, 384)
    });
    assert_says(
        &msg,
        &[
            "overlaps",
            "blk.0.ffn_down_exps.weight",
            "blk.0.ffn_up_exps.weight",
        ],
    );
    // The whole data section cut off.
    let msg = reject(small_bytes()[..SMALL_DATA_START as usize].to_vec());
    assert_says(
        &msg,
        &["tensor token_embd.weight: data at 960..1088 runs past the end of the file (960 bytes)"],
    );
}

#[test]
fn a_tensor_named_twice() {
    // Rename test.ids (8 bytes) to blk.0.attn_q.weight (19): the infos still end before 960.
    let msg = damaged(|b| {
        let at = info_at(b, "test.ids") - 8 - 8;
        let mut new = 19u64.to_le_bytes().to_vec();
        new.extend_from_slice(b"blk.0.attn_q.weight");
        b.splice(at..at + 16, new);
        b.drain(SMALL_DATA_START as usize..SMALL_DATA_START as usize + 11);
    });
    assert_eq!(
        msg,
        "small.gguf: tensor blk.0.attn_q.weight is listed twice"
    );
}

#[test]
fn every_97th_truncation_is_an_error() {
    let b = small_bytes();
    for len in (0..b.len()).step_by(97) {
        let result = GgufFile::from_bytes("small.gguf", b[..len].to_vec());
        if len >= SMALL_DATA_END {
            // Only the final padding is gone.
            assert!(result.is_ok(), "{len}");
            continue;
        }
        let msg = result.err().unwrap().to_string();
        assert!(msg.starts_with("small.gguf: "), "{len}: {msg}");
        let names = ["magic", "header", "key", "entry", "tensor"];
        assert!(names.iter().any(|n| msg.contains(n)), "{len}: {msg}");
        if len >= SMALL_DATA_START as usize {
            assert!(
                msg.contains("runs past the end of the file"),
                "{len}: {msg}"
            );
        }
    }
}

#[test]
fn damaged_files_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("model.gguf");
    let mut b = small_bytes().to_vec();
    let at = fields(&b, "test.ids").2;
    put_u32(&mut b, at, 99);
    std::fs::write(&path, &b).unwrap();
    let msg = GgufFile::open(&path).err().unwrap().to_string();
    assert!(msg.starts_with(&path.display().to_string()), "{msg}");
    assert!(msg.contains("tensor test.ids: GGML type code 99"), "{msg}");
    for len in [0, 3, 23, 500, 1000] {
        std::fs::write(&path, &small_bytes()[..len]).unwrap();
        let msg = GgufFile::open(&path).err().unwrap().to_string();
        assert!(msg.contains("model.gguf: "), "{len}: {msg}");
    }
    let msg = GgufFile::open(tmp.path()).err().unwrap().to_string();
    assert!(
        msg.contains("is a directory: expected a GGUF file"),
        "{msg}"
    );
    let e = GgufFile::open(&tmp.path().join("absent.gguf"))
        .err()
        .unwrap();
    assert!(matches!(e, GgufError::Io { .. }), "{e}");
}

/// Copy the split pair into a scratch folder, let `f` change it, and open shard 1.
fn open_damaged_split(f: impl FnOnce(&Path)) -> String {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["tiny-00001-of-00002.gguf", "tiny-00002-of-00002.gguf"] {
        std::fs::copy(dir().join(name), tmp.path().join(name)).unwrap();
    }
    f(tmp.path());
    match GgufFile::open(&tmp.path().join("tiny-00001-of-00002.gguf")) {
        Ok(_) => panic!("a damaged split set was accepted"),
        Err(e) => e.to_string(),
    }
}

fn edit(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut b = std::fs::read(path).unwrap();
    f(&mut b);
    std::fs::write(path, b).unwrap();
}

#[test]
fn damaged_split_sets() {
    let msg =
        open_damaged_split(|d| std::fs::remove_file(d.join("tiny-00002-of-00002.gguf")).unwrap());
    assert!(msg.contains("tiny-00002-of-00002.gguf: open:"), "{msg}");
    // Shard 2 replaced by a copy of shard 1 that says it is shard 2: every tensor twice.
    let msg = open_damaged_split(|d| {
        let second = d.join("tiny-00002-of-00002.gguf");
        std::fs::copy(d.join("tiny-00001-of-00002.gguf"), &second).unwrap();
        edit(&second, |b| {
            let at = value_at(b, "split.no");
            b[at] = 1;
        });
    });
    assert!(
        msg.contains("tiny-00002-of-00002.gguf: tensor token_embd.weight is also in"),
        "{msg}"
    );
    assert!(msg.ends_with("tiny-00001-of-00002.gguf"), "{msg}");
    let msg = open_damaged_split(|d| {
        edit(&d.join("tiny-00002-of-00002.gguf"), |b| {
            let at = value_at(b, "split.count");
            b[at] = 3;
        })
    });
    assert!(
        msg.contains("tiny-00002-of-00002.gguf: metadata key 'split.count': is 3, but the file names say 2 shards"),
        "{msg}"
    );
    let msg = open_damaged_split(|d| {
        edit(&d.join("tiny-00002-of-00002.gguf"), |b| {
            let at = value_at(b, "split.no");
            b[at] = 0;
        })
    });
    assert!(msg.contains("metadata key 'split.no': is 0"), "{msg}");
    let msg = open_damaged_split(|d| {
        edit(&d.join("tiny-00001-of-00002.gguf"), |b| {
            let at = value_at(b, "split.tensors.count");
            b[at] = 4;
        })
    });
    assert!(
        msg.contains("tiny-00001-of-00002.gguf: metadata key 'split.tensors.count': is 4, but the 2 shard(s) hold 3 tensors"),
        "{msg}"
    );
    // A shard renamed out of its set: its split keys say it is not a whole model.
    let tmp = tempfile::tempdir().unwrap();
    let lone = tmp.path().join("tiny.gguf");
    std::fs::copy(dir().join("tiny-00001-of-00002.gguf"), &lone).unwrap();
    let msg = GgufFile::open(&lone).err().unwrap().to_string();
    assert!(
        msg.contains("tiny.gguf: metadata key 'split.count': is 2"),
        "{msg}"
    );
}

// ---- random damage ----

#[derive(Clone, Debug)]
enum Mutation {
    Flip {
        at: usize,
        mask: u8,
    },
    /// A random u64 where counts, lengths, dims and offsets live.
    Word {
        at: usize,
        value: u64,
    },
    /// A small u32 (n_dims, a type code, a value type) anywhere in the header and tables.
    Small {
        at: usize,
        value: u32,
    },
    Nudge {
        at: usize,
        delta: i64,
    },
    Truncate {
        len: usize,
    },
}

/// Damage to `bytes`, whose header and tables end at `tables`.
fn mutation(bytes: &'static [u8], tables: usize) -> impl Strategy<Value = Mutation> {
    let len = bytes.len();
    prop_oneof![
        (0..len, 1..=255u8).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        (0..tables, 1..=255u8).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        (0..tables - 8, any::<u64>()).prop_map(|(at, value)| Mutation::Word { at, value }),
        (0..tables - 4, 0..64u32).prop_map(|(at, value)| Mutation::Small { at, value }),
        (
            0..tables - 8,
            prop_oneof![Just(64i64), Just(-64), Just(1), Just(-1), Just(32)]
        )
            .prop_map(|(at, delta)| Mutation::Nudge { at, delta }),
        (0..len).prop_map(|len| Mutation::Truncate { len }),
    ]
}

fn llama_cpp_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf-convert/tiny-qwen3-moe.gguf")
}

fn llama_cpp_bytes() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| std::fs::read(llama_cpp_path()).unwrap())
}

fn llama_cpp_tables() -> usize {
    GgufFile::from_bytes("x.gguf", llama_cpp_bytes().to_vec())
        .unwrap()
        .data_start() as usize
}

fn mutated(bytes: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for m in muts {
        apply(&mut b, m);
    }
    b
}

fn apply(b: &mut Vec<u8>, m: &Mutation) {
    match *m {
        Mutation::Flip { at, mask } if at < b.len() => b[at] ^= mask,
        Mutation::Word { at, value } if at + 8 <= b.len() => put_u64(b, at, value),
        Mutation::Small { at, value } if at + 4 <= b.len() => put_u32(b, at, value),
        Mutation::Nudge { at, delta } if at + 8 <= b.len() => {
            let v = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
            put_u64(b, at, v.wrapping_add_signed(delta));
        }
        Mutation::Truncate { len } => b.truncate(len),
        _ => {}
    }
}

/// Open from memory; when accepted, touch every tensor's bytes and dequantize it.
fn walk(b: Vec<u8>) {
    let len = b.len() as u64;
    match GgufFile::from_bytes("fuzz.gguf", b) {
        Err(e) => assert!(e.to_string().starts_with("fuzz.gguf"), "{e}"),
        Ok(g) => {
            let _ = g.metadata().len();
            for info in g.tensors() {
                let t = g.tensor(&info.name).unwrap();
                assert_eq!(t.bytes().len() as u64, info.n_bytes);
                assert!(info.file_range().end <= len);
                if let Ok(v) = t.dequantize_f32() {
                    assert_eq!(v.len() as u64, info.n_elements());
                }
            }
        }
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn damaged_files_never_panic(
        muts in prop::collection::vec(mutation(small_bytes(), SMALL_DATA_START as usize), 1..4)
    ) {
        walk(mutated(small_bytes(), &muts));
    }

    /// The llama.cpp file: reader and dequantization, then the tokenizer rebuilt from its keys.
    #[test]
    fn damaged_llama_cpp_files_never_panic(
        muts in prop::collection::vec(mutation(llama_cpp_bytes(), llama_cpp_tables()), 1..4)
    ) {
        let b = mutated(llama_cpp_bytes(), &muts);
        if let Ok(g) = GgufFile::from_bytes("fuzz.gguf", b.clone()) {
            let path = Path::new("fuzz.gguf");
            if let Ok(Some(tok)) = tokenizer_from_gguf(path, g.metadata(), None) {
                let _ = std::hint::black_box(tok.json.parse::<tokenizers::Tokenizer>());
            }
        }
        walk(b);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases().div_ceil(8), ..ProptestConfig::default() })]

    /// The checkpoint `hob convert --from` opens (architecture keys, shapes, the tensor set) and
    /// the metadata it writes, from a damaged llama.cpp file on disk.
    #[test]
    fn damaged_llama_cpp_checkpoints_never_panic(
        muts in prop::collection::vec(mutation(llama_cpp_bytes(), llama_cpp_tables()), 1..4)
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("damaged.gguf");
        std::fs::write(&path, mutated(llama_cpp_bytes(), &muts)).unwrap();
        if let Ok(c) = GgufCheckpoint::open(&path) {
            let _ = std::hint::black_box(c.metadata());
        }
    }
}

#[test]
fn the_undamaged_files_walk() {
    walk(small_bytes().to_vec());
    walk(llama_cpp_bytes().to_vec());
    assert!(GgufCheckpoint::open(&llama_cpp_path()).is_ok());
}
