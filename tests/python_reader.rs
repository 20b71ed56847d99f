//! formats/hob.py against the Rust writer: the JSON listing field by field, and dequantized
//! values of every variant against the spec's formulas computed here.

mod format_support;
#[path = "common/paths.rs"]
mod paths;

use std::process::Command;

use format_support::{all_types_metadata, Rng};
use half::{bf16, f16};
use hob::format::{
    DType, DenseSpec, ExpertShape, HobFile, HobWriter, MatrixLayout, MetaValue, Variant,
    VariantKind,
};
use serde_json::{json, Value};

/// python3, which the tests need (a missing one fails them: a skipped check must not pass).
fn python() -> &'static str {
    match Command::new("python3").arg("--version").output() {
        Ok(o) if o.status.success() => "python3",
        _ => panic!("python3 not found: the Python reader tests need it"),
    }
}

/// The Python reader of the checkout the tests run in.
fn hob_py() -> std::path::PathBuf {
    paths::repo_root().join("formats/hob.py")
}

/// The value hob.py lists for a metadata value.
fn meta_json(v: &MetaValue) -> Value {
    match v {
        MetaValue::U8(x) => json!(x),
        MetaValue::I8(x) => json!(x),
        MetaValue::U16(x) => json!(x),
        MetaValue::I16(x) => json!(x),
        MetaValue::U32(x) => json!(x),
        MetaValue::I32(x) => json!(x),
        MetaValue::F32(x) => json!(*x as f64),
        MetaValue::Bool(x) => json!(x),
        MetaValue::String(x) => json!(x),
        MetaValue::Array { elem_type, items } => json!({
            "elem_type": hob::format::gguf::type_name(*elem_type).unwrap(),
            "items": items.iter().map(meta_json).collect::<Vec<_>>(),
        }),
        MetaValue::U64(x) => json!(x),
        MetaValue::I64(x) => json!(x),
        MetaValue::F64(x) => json!(x),
    }
}

/// Equal, floats to within an ulp: serde_json's default float parser (no `float_roundtrip`) may
/// land one ulp off Python's shortest repr.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x - y).abs() <= 2.0 * f64::EPSILON * y.abs()
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_eq(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// One matrix with known codes, scales and mins, written byte by byte as formats/hob.md says,
/// and its values by the spec's formulas.
fn build_matrix(rng: &mut Rng, v: Variant, m: &MatrixLayout, out: &mut [u8]) -> Vec<f32> {
    let n = m.rows * m.cols;
    let mut w = vec![0f32; n];
    let small = |rng: &mut Rng| (rng.next() % 2001) as f32 / 1000.0 - 1.0;
    match v.kind {
        VariantKind::F16 | VariantKind::Bf16 => {
            for (i, w) in w.iter_mut().enumerate() {
                let x = small(rng);
                let bits = if v.kind == VariantKind::F16 {
                    f16::from_f32(x).to_bits()
                } else {
                    bf16::from_f32(x).to_bits()
                };
                out[2 * i..2 * i + 2].copy_from_slice(&bits.to_le_bytes());
                *w = if v.kind == VariantKind::F16 {
                    f16::from_bits(bits).to_f32()
                } else {
                    bf16::from_bits(bits).to_f32()
                };
            }
        }
        _ => {
            let g = v.group_size as usize;
            let groups = n / g;
            let mut scales = vec![0f32; groups];
            let mut mins = vec![0f32; groups];
            for k in 0..groups {
                let s = f16::from_f32(small(rng) / 8.0);
                let mn = f16::from_f32(small(rng));
                scales[k] = s.to_f32();
                mins[k] = mn.to_f32();
                let at = m.scales.start + 2 * k;
                out[at..at + 2].copy_from_slice(&s.to_bits().to_le_bytes());
                if v.kind.has_mins() {
                    let at = m.mins.start + 2 * k;
                    out[at..at + 2].copy_from_slice(&mn.to_bits().to_le_bytes());
                }
            }
            for (i, w) in w.iter_mut().enumerate() {
                // Row r's groups are consecutive: group index = (r * cols + c) / g.
                let k = i / g;
                let r = rng.next();
                let q = match v.kind {
                    VariantKind::Int8 => {
                        let q = (r % 255) as i32 - 127;
                        out[i] = q as i8 as u8;
                        q
                    }
                    VariantKind::Int4 => {
                        let q = (r % 16) as u8;
                        out[i / 2] |= q << (4 * (i % 2));
                        q as i32
                    }
                    _ => {
                        let q = (r % 4) as u8;
                        out[i / 4] |= q << (2 * (i % 4));
                        q as i32
                    }
                };
                *w = if v.kind.has_mins() {
                    scales[k] * q as f32 + mins[k]
                } else {
                    scales[k] * q as f32
                };
            }
        }
    }
    w
}

#[test]
fn python_reader_lists_and_dequantizes_what_rust_wrote() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("py.hob");
    let mut rng = Rng(11);
    let metadata = all_types_metadata();
    let dense = vec![
        DenseSpec {
            name: "token_embd.weight".into(),
            dtype: DType::Bf16.into(),
            shape: vec![16, 64],
        },
        DenseSpec {
            name: "output_norm.weight".into(),
            dtype: DType::F32.into(),
            shape: vec![64],
        },
    ];
    let shape = ExpertShape {
        n_layers: 2,
        n_experts: 2,
        hidden: 64,
        ffn: 32,
    };
    let variants: Vec<Variant> = ["int4/g32", "int2/g16", "int8/g32", "f16", "bf16"]
        .iter()
        .map(|s| Variant::parse(s, None).unwrap())
        .collect();
    let mut w = HobWriter::create(&path, &metadata, &dense, shape, &variants).unwrap();
    for (i, d) in dense.iter().enumerate() {
        w.write_dense(i, &rng.bytes(d.dtype.size(&d.shape).unwrap()))
            .unwrap();
    }
    // expected[(layer, expert, v)] = [gate, up, down] values
    let mut expected = std::collections::HashMap::new();
    for l in 0..2 {
        for e in 0..2 {
            for (vi, v) in variants.iter().enumerate() {
                let lay = v.expert_layout(shape.hidden, shape.ffn).unwrap();
                let mut blob = vec![0u8; lay.size];
                let mats = [
                    (lay.gate_offset, &lay.gate),
                    (lay.up_offset, &lay.up),
                    (lay.down_offset, &lay.down),
                ];
                let vals: Vec<Vec<f32>> = mats
                    .iter()
                    .map(|(o, m)| build_matrix(&mut rng, *v, m, &mut blob[*o..*o + m.size]))
                    .collect();
                expected.insert((l, e, vi), vals);
                w.write_expert(l, e, vi, &blob).unwrap();
            }
        }
    }
    w.finish().unwrap();
    let f = HobFile::open(&path).unwrap();
    f.verify().unwrap();

    let out = Command::new(py)
        .arg(hob_py())
        .arg(&path)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();

    let h = f.header();
    let jh = &j["header"];
    for (k, v) in [
        ("version", h.version as u64),
        ("file_size", h.file_size),
        ("metadata_offset", h.metadata_offset),
        ("metadata_len", h.metadata_len),
        ("tensors_offset", h.tensors_offset),
        ("tensors_len", h.tensors_len),
        ("tensor_count", h.tensor_count),
        ("experts_offset", h.experts_offset),
        ("experts_len", h.experts_len),
        ("data_offset", h.data_offset),
        ("data_len", h.data_len),
        ("metadata_crc32c", h.metadata_crc32c as u64),
        ("tensors_crc32c", h.tensors_crc32c as u64),
        ("experts_crc32c", h.experts_crc32c as u64),
        ("header_size", 256),
    ] {
        assert_eq!(jh[k], json!(v), "header.{k}");
    }
    let jm = j["metadata"].as_array().unwrap();
    assert_eq!(jm.len(), metadata.len());
    for (e, (k, v)) in jm.iter().zip(metadata.iter()) {
        assert_eq!(e["key"], json!(k));
        assert_eq!(e["type"], json!(v.type_name()), "{k}");
        assert!(
            json_eq(&e["value"], &meta_json(v)),
            "{k}: {} vs {:?}",
            e["value"],
            v
        );
    }
    let jt = j["tensors"].as_array().unwrap();
    assert_eq!(jt.len(), f.tensors().len());
    for (a, t) in jt.iter().zip(f.tensors()) {
        let want = json!({"name": t.name, "dtype": t.dtype.name(), "shape": t.shape, "offset": t.offset,
                          "size": t.size, "crc32c": t.crc32c});
        assert_eq!(a, &want);
    }
    let je = &j["experts"];
    assert_eq!(
        (&je["n_layers"], &je["n_experts"], &je["hidden"], &je["ffn"]),
        (&json!(2), &json!(2), &json!(64), &json!(32))
    );
    for (i, v) in variants.iter().enumerate() {
        let lay = f.expert_layout(i);
        let want = json!({"kind": v.kind.name(), "code": v.kind.code(), "group_size": v.group_size, "name": v.name(),
                          "size": lay.size, "padded_size": lay.padded_size});
        assert_eq!(je["variants"][i], want);
    }
    let recs = je["records"].as_array().unwrap();
    assert_eq!(recs.len(), 2 * 2 * variants.len());
    let mut i = 0;
    for l in 0..2 {
        for e in 0..2 {
            for v in 0..variants.len() {
                let r = f.expert_record(l, e, v);
                let want = json!({"layer": l, "expert": e, "variant": v, "offset": r.offset, "size": r.size,
                                  "crc32c": r.crc32c});
                assert_eq!(recs[i], want);
                i += 1;
            }
        }
    }

    // Dequantize one matrix of every variant (and each of gate/up/down once).
    let mut checked = 0;
    for (vi, which) in [
        (0, "gate"),
        (1, "down"),
        (2, "up"),
        (3, "down"),
        (4, "gate"),
        (0, "down"),
        (1, "up"),
    ] {
        let (l, e) = (vi % 2, 1 - vi % 2);
        let dq = dir.path().join("dq.json");
        let out = Command::new(py)
            .arg(hob_py())
            .arg(&path)
            .args([
                "--dequant",
                &l.to_string(),
                &e.to_string(),
                &vi.to_string(),
                which,
                "--out",
            ])
            .arg(&dq)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows: Vec<Vec<f64>> = serde_json::from_slice(&std::fs::read(&dq).unwrap()).unwrap();
        let m = ["gate", "up", "down"]
            .iter()
            .position(|w| *w == which)
            .unwrap();
        let want = &expected[&(l, e, vi)][m];
        let cols = rows[0].len();
        assert_eq!(rows.len() * cols, want.len());
        for (i, &w) in want.iter().enumerate() {
            let got = rows[i / cols][i % cols];
            // Python evaluates s * q + m in f64; the spec's f32 result differs by an f32 rounding.
            assert!(
                (got - w as f64).abs() <= 1e-6 * (1.0 + w.abs() as f64),
                "{} {which} [{i}]: {got} vs {w}",
                variants[vi]
            );
        }
        checked += want.len();
    }
    assert!(checked > 10_000);
}

#[test]
fn python_reader_refuses_an_unknown_variant() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.hob");
    let s = format_support::sample(5);
    format_support::write(&s, &path).unwrap();
    let mut b = std::fs::read(&path).unwrap();
    let experts = u64::from_le_bytes(b[64..72].try_into().unwrap()) as usize;
    b[experts + 24..experts + 28].copy_from_slice(&77u32.to_le_bytes());
    hob::format::reader::reseal(&mut b);
    std::fs::write(&path, &b).unwrap();
    let out = Command::new(py).arg(hob_py()).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown variant code 77"));
}
