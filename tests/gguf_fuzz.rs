//! Random damage to a GGUF written by llama.cpp's own converter (tests/fixtures/gguf-convert/
//! tiny-qwen3-moe.gguf): the reader, every tensor's dequantization, the tokenizer rebuilt from its
//! keys and the checkpoint `hob convert` opens either refuse it with an error or accept it; none
//! panics (issue 51, item 5: "fuzzed like the .hob reader"). Cases: PROPTEST_CASES (default 2,000;
//! an eighth of them through a file on disk for the checkpoint).

mod common;

use std::sync::OnceLock;

use hob::import::gguf::GgufFile;
use hob::import::gguf_checkpoint::GgufCheckpoint;
use hob::import::gguf_tokenizer::tokenizer_from_gguf;
use proptest::prelude::*;

fn valid() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let p = common::paths::repo_root().join("tests/fixtures/gguf-convert/tiny-qwen3-moe.gguf");
        std::fs::read(p).unwrap()
    })
}

/// Where the header, metadata and tensor infos end (the data starts).
fn tables_end() -> usize {
    GgufFile::from_bytes("x.gguf", valid().to_vec())
        .unwrap()
        .data_start() as usize
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip {
        at: usize,
        mask: u8,
    },
    /// A random u64 in the tables, where counts, lengths, dims and offsets live.
    Word {
        at: usize,
        value: u64,
    },
    /// A small change to a u64 there: off-by-one lengths, off-by-an-alignment offsets.
    Nudge {
        at: usize,
        delta: i64,
    },
    Truncate {
        len: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let (len, end) = (valid().len(), tables_end());
    prop_oneof![
        (0..len, 1..=255u8).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        (0..end, 1..=255u8).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        (0..end - 8, any::<u64>()).prop_map(|(at, value)| Mutation::Word { at, value }),
        (
            0..end - 8,
            prop_oneof![Just(1i64), Just(-1), Just(32), Just(-32), Just(4096)]
        )
            .prop_map(|(at, delta)| Mutation::Nudge { at, delta }),
        (0..len).prop_map(|len| Mutation::Truncate { len }),
    ]
}

fn damaged(muts: &[Mutation]) -> Vec<u8> {
    let mut b = valid().to_vec();
    for m in muts {
        match *m {
            Mutation::Flip { at, mask } => {
                if at < b.len() {
                    b[at] ^= mask
                }
            }
            Mutation::Word { at, value } => {
                if at + 8 <= b.len() {
                    b[at..at + 8].copy_from_slice(&value.to_le_bytes())
                }
            }
            Mutation::Nudge { at, delta } => {
                if at + 8 <= b.len() {
                    let v = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
                    b[at..at + 8].copy_from_slice(&v.wrapping_add_signed(delta).to_le_bytes())
                }
            }
            Mutation::Truncate { len } => b.truncate(len),
        }
    }
    b
}

/// Everything a conversion reads from an accepted file: each tensor dequantized, the tokenizer.
fn walk(b: Vec<u8>) {
    let path = std::path::PathBuf::from("damaged.gguf");
    let Ok(file) = GgufFile::from_bytes(&path, b) else {
        return;
    };
    for t in file.tensors() {
        if let Some(view) = file.tensor(&t.name) {
            let _ = std::hint::black_box(view.dequantize_f32());
        }
    }
    if let Ok(Some(tok)) = tokenizer_from_gguf(&path, file.metadata(), None) {
        let _ = std::hint::black_box(tok.json.parse::<tokenizers::Tokenizer>());
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
    fn damaged_ggufs_never_panic(muts in prop::collection::vec(mutation(), 1..4)) {
        walk(damaged(&muts));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases().div_ceil(8), ..ProptestConfig::default() })]

    /// The checkpoint `hob convert --from` opens (architecture keys, shapes, the tensor set), and
    /// the metadata it writes, from a file on disk.
    #[test]
    fn damaged_gguf_checkpoints_never_panic(muts in prop::collection::vec(mutation(), 1..4)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("damaged.gguf");
        std::fs::write(&path, damaged(&muts)).unwrap();
        if let Ok(c) = GgufCheckpoint::open(&path) {
            use hob::import::ConvertSource;
            let _ = std::hint::black_box(c.metadata());
        }
    }
}

#[test]
fn the_undamaged_file_walks() {
    walk(valid().to_vec());
    assert!(GgufCheckpoint::open(
        &common::paths::repo_root().join("tests/fixtures/gguf-convert/tiny-qwen3-moe.gguf")
    )
    .is_ok());
}
