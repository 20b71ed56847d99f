//! The safetensors side of `hob convert`: `TensorIndex::open` on a checkpoint directory holding
//! one `model.safetensors`, or a `model.safetensors.index.json` and the shards its weight_map
//! names; then every tensor named anywhere looked up, checked and loaded.
//!
//! Input: the bytes of model.safetensors; or, when it holds the separator, the index JSON, then
//! the shards a.safetensors and b.safetensors, separated by it.
#![no_main]

use hob::import::TensorIndex;
use hob_fuzz::{scratch_dir, scratch_file, scratch_remove};
use libfuzzer_sys::fuzz_target;

/// Between the index and the shards: 0xff never occurs in JSON text.
const SEP: &[u8] = b"\xff\xfeSHARD\xfe\xff";
const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";
const SHARDS: [&str; 2] = ["a.safetensors", "b.safetensors"];

fuzz_target!(|data: &[u8]| {
    for name in [INDEX, SINGLE, SHARDS[0], SHARDS[1]] {
        scratch_remove(name);
    }
    let parts = split(data);
    let mut names = Vec::new();
    if parts.len() == 1 {
        scratch_file(SINGLE, data);
        names.extend(header_names(data));
    } else {
        scratch_file(INDEX, parts[0]);
        names.extend(index_names(parts[0]));
        for (file, bytes) in SHARDS.iter().zip(&parts[1..]) {
            scratch_file(file, bytes);
            names.extend(header_names(bytes));
        }
    }
    let Ok(index) = TensorIndex::open(scratch_dir()) else {
        return;
    };
    std::hint::black_box(index.searched());
    names.push("model.embed_tokens.weight".into());
    for name in &names {
        walk_tensor(&index, name);
    }
});

fn split(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some(at) = rest.windows(SEP.len()).position(|w| w == SEP) {
        out.push(&rest[..at]);
        rest = &rest[at + SEP.len()..];
    }
    out.push(rest);
    out
}

/// The tensor names in a safetensors header (the harness's own reading, to know what to ask).
fn header_names(bytes: &[u8]) -> Vec<String> {
    let Some(len) = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    else {
        return Vec::new();
    };
    let header = usize::try_from(len)
        .ok()
        .and_then(|n| bytes.get(8..8usize.checked_add(n)?));
    match header.and_then(|h| serde_json::from_slice::<serde_json::Value>(h).ok()) {
        Some(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

fn index_names(json: &[u8]) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_slice(json).unwrap_or_default();
    match v.get("weight_map") {
        Some(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

fn walk_tensor(index: &TensorIndex, name: &str) {
    if !index.contains(name) {
        assert!(index.shape(name).is_err());
        return;
    }
    let Ok(shape) = index.shape(name).map(<[usize]>::to_vec) else {
        panic!("{name} is in the index but has no shape");
    };
    let _ = index.dtype(name);
    let _ = index.check(name, &shape);
    if let Ok(values) = index.load_f32(name) {
        assert_eq!(values.len(), shape.iter().product::<usize>());
    }
    let mut out = Vec::new();
    let _ = index.load_range_into(name, 1..3, &mut out);
    if index.check_u8(name, &shape).is_ok() {
        let n: usize = shape.iter().product();
        assert_eq!(index.load_u8(name, 0..n).map(|b| b.len()).ok(), Some(n));
        let _ = index.load_u8(name, n / 2..n + 1);
    }
}
