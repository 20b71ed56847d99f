//! Random damage to a valid file: parse() never panics, and whatever it accepts has every view
//! in bounds. Cases: PROPTEST_CASES (default 2,000).

mod format_support;

use std::sync::OnceLock;

use hob::format::reader::{parse, reseal};
use proptest::prelude::*;

fn valid() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(format_support::sample_bytes)
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip {
        at: usize,
        mask: u8,
    },
    /// A random u64 somewhere in the header and tables, where counts and offsets live.
    Word {
        at: usize,
        value: u64,
    },
    /// A small change to a u64 field: off-by-a-page offsets and sizes.
    Nudge {
        at: usize,
        delta: i64,
    },
    Truncate {
        len: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let len = valid().len();
    let tables_end = parse(valid()).unwrap().header.data_offset as usize;
    prop_oneof![
        (0..len, 1..=255u8).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        (0..tables_end, 1..=255u8).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        (0..tables_end - 8, any::<u64>()).prop_map(|(at, value)| Mutation::Word { at, value }),
        (
            0..tables_end - 8,
            prop_oneof![Just(4096i64), Just(-4096), Just(1), Just(-1), Just(64)]
        )
            .prop_map(|(at, delta)| Mutation::Nudge { at, delta }),
        (0..len).prop_map(|len| Mutation::Truncate { len }),
    ]
}

fn apply(b: &mut Vec<u8>, m: &Mutation) {
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

/// Touch every view a caller could take from an accepted file.
fn walk_views(b: &[u8]) {
    let Ok(p) = parse(b) else { return };
    let mut sum = 0usize;
    for (i, t) in p.tensors.iter().enumerate() {
        let d = p.tensor_data(b, i);
        assert_eq!(d.len() as u64, t.size);
        sum += d.first().copied().unwrap_or(0) as usize;
    }
    for l in 0..p.n_layers {
        for e in 0..p.n_experts {
            for v in 0..p.variants.len() {
                let x = p.expert_view(b, l, e, v);
                assert_eq!(x.data.len(), x.layout.size);
                for m in [x.gate(), x.up(), x.down()] {
                    sum += m.codes.len() + m.scales.len() + m.mins.len();
                }
            }
        }
    }
    std::hint::black_box(sum);
    let _ = p.verify(b);
}

/// PROPTEST_CASES when set (a long run), else a count that keeps `cargo test` fast.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn damaged_files_never_panic(muts in prop::collection::vec(mutation(), 1..4), sealed in any::<bool>()) {
        let mut b = valid().to_vec();
        for m in &muts {
            apply(&mut b, m);
        }
        if sealed {
            reseal(&mut b);
        }
        walk_views(&b);
    }
}

#[test]
fn the_undamaged_file_walks() {
    walk_views(valid());
    assert!(parse(valid()).is_ok());
}
