//! A small synthetic .hob file shared by the format tests: every metadata value type, dense
//! tensors of each dtype, 2 layers x 3 experts x 4 variants of random bytes.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::path::{Path, PathBuf};

use hob::format::{DType, DenseSpec, ExpertShape, HobWriter, MetaValue, Metadata, Variant};

/// splitmix64: deterministic bytes without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

pub struct Sample {
    pub metadata: Metadata,
    pub dense: Vec<DenseSpec>,
    pub dense_bytes: Vec<Vec<u8>>,
    pub shape: ExpertShape,
    pub variants: Vec<Variant>,
    /// Index `(layer * n_experts + expert) * n_variants + variant`.
    pub blobs: Vec<Vec<u8>>,
}

pub fn all_types_metadata() -> Metadata {
    let mut m = Metadata::new();
    m.set("general.architecture", MetaValue::String("mixtral".into()));
    m.set("t.u8", MetaValue::U8(200));
    m.set("t.i8", MetaValue::I8(-100));
    m.set("t.u16", MetaValue::U16(60000));
    m.set("t.i16", MetaValue::I16(-30000));
    m.set("t.u32", MetaValue::U32(4_000_000_000));
    m.set("t.i32", MetaValue::I32(-2_000_000_000));
    m.set("t.f32", MetaValue::F32(1.0e-5));
    m.set("t.bool", MetaValue::Bool(true));
    m.set(
        "t.string",
        MetaValue::String("héllo {{ messages }}\n".into()),
    );
    m.set("t.u64", MetaValue::U64(u64::MAX - 1));
    m.set("t.i64", MetaValue::I64(i64::MIN + 1));
    m.set("t.f64", MetaValue::F64(-1234.5678e100));
    m.set(
        "t.array.u32",
        MetaValue::Array {
            elem_type: 4,
            items: vec![MetaValue::U32(1), MetaValue::U32(2)],
        },
    );
    m.set(
        "t.array.empty",
        MetaValue::Array {
            elem_type: 6,
            items: vec![],
        },
    );
    m.set(
        "t.array.strings",
        MetaValue::Array {
            elem_type: 8,
            items: vec![
                MetaValue::String("a".into()),
                MetaValue::String(String::new()),
            ],
        },
    );
    m.set(
        "t.array.nested",
        MetaValue::Array {
            elem_type: 9,
            items: vec![
                MetaValue::Array {
                    elem_type: 7,
                    items: vec![MetaValue::Bool(false)],
                },
                MetaValue::Array {
                    elem_type: 9,
                    items: vec![MetaValue::Array {
                        elem_type: 12,
                        items: vec![MetaValue::F64(0.5)],
                    }],
                },
            ],
        },
    );
    m
}

pub fn sample(seed: u64) -> Sample {
    let mut rng = Rng(seed);
    let dense = vec![
        DenseSpec {
            name: "token_embd.weight".into(),
            dtype: DType::F32.into(),
            shape: vec![33, 40],
        },
        DenseSpec {
            name: "blk.0.attn_q.weight".into(),
            dtype: DType::F16.into(),
            shape: vec![8, 8],
        },
        DenseSpec {
            name: "output_norm.weight".into(),
            dtype: DType::Bf16.into(),
            shape: vec![8],
        },
    ];
    let dense_bytes = dense
        .iter()
        .map(|d| rng.bytes(d.dtype.size(&d.shape).unwrap()))
        .collect();
    let shape = ExpertShape {
        n_layers: 2,
        n_experts: 3,
        hidden: 64,
        ffn: 128,
    };
    let variants: Vec<Variant> = ["f16", "int8/g64", "int4/g64", "int2/g32"]
        .iter()
        .map(|s| Variant::parse(s, None).unwrap())
        .collect();
    let mut blobs = Vec::new();
    for _ in 0..shape.n_layers * shape.n_experts {
        for v in &variants {
            blobs.push(rng.bytes(v.expert_layout(shape.hidden, shape.ffn).unwrap().size));
        }
    }
    Sample {
        metadata: all_types_metadata(),
        dense,
        dense_bytes,
        shape,
        variants,
        blobs,
    }
}

pub fn write(s: &Sample, out: &Path) -> hob::Result<()> {
    let mut w = HobWriter::create(out, &s.metadata, &s.dense, s.shape, &s.variants)?;
    // Out of order on purpose: every payload goes to its planned offset.
    for (i, b) in s.dense_bytes.iter().enumerate().rev() {
        w.write_dense(i, b)?;
    }
    let nv = s.variants.len();
    for (i, b) in s.blobs.iter().enumerate() {
        let (le, v) = (i / nv, i % nv);
        w.write_expert(le / s.shape.n_experts, le % s.shape.n_experts, v, b)?;
    }
    Ok(w.finish()?)
}

/// The sample file's bytes.
pub fn sample_bytes() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("sample.hob");
    write(&sample(7), &path).unwrap();
    std::fs::read(&path).unwrap()
}
