//! The GGUF reader and its mapping to hob's architectures: the metadata decoder alone, the file
//! from memory (every tensor dequantized, the tokenizer built from the vocabulary keys), and the
//! file as `hob convert --from x.gguf` opens it (`GgufCheckpoint`: the architecture's keys, the
//! tensor table checked against it, every dense tensor and expert loaded, the .hob metadata made).
#![no_main]

use std::path::Path;

use hob::format::Metadata;
use hob::import::gguf::GgufFile;
use hob::import::gguf_tokenizer::tokenizer_from_gguf;
use hob::import::{ConvertSource, GgufCheckpoint};
use hob::model::ModelConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The metadata section's own decoder (.hob files carry the same encoding).
    if let Ok(m) = Metadata::decode(data) {
        let _ = m.check();
        assert_eq!(
            Metadata::decode(&m.encode()).map(|d| d.len()).ok(),
            Some(m.len())
        );
    }
    walk_file(data);
    let path = hob_fuzz::scratch_file("model.gguf", data);
    if let Ok(ckpt) = GgufCheckpoint::open(&path) {
        walk_checkpoint(&ckpt);
    }
});

fn walk_file(data: &[u8]) {
    let Ok(file) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    std::hint::black_box((file.version(), file.alignment(), file.data_start()));
    let mut sum = 0usize;
    for info in file.tensors() {
        let t = file
            .tensor(&info.name)
            .unwrap_or_else(|| panic!("tensor {} is listed but not found", info.name));
        assert_eq!(
            t.bytes().len() as u64,
            info.file_range().end - info.file_range().start
        );
        std::hint::black_box((t.dims(), t.ggml_type(), info.n_elements()));
        if let Ok(values) = t.dequantize_f32() {
            assert_eq!(values.len() as u64, info.n_elements());
            sum += values.len();
        }
    }
    std::hint::black_box(sum);
    if let Ok(Some(tok)) = tokenizer_from_gguf(Path::new("fuzz.gguf"), file.metadata(), None) {
        let mut m = Metadata::new();
        tok.write_metadata(&mut m);
    }
}

fn walk_checkpoint(ckpt: &GgufCheckpoint) {
    std::hint::black_box((ckpt.name(), ckpt.source_dtype(), ckpt.has_tokenizer()));
    std::hint::black_box((ckpt.default_experts(), ckpt.default_dense()));
    for t in ckpt.dense_tensors() {
        if let Ok(values) = ckpt.load_dense(t) {
            let n: usize = t.shape.iter().product();
            assert_eq!(values.len(), n, "dense tensor {}", t.hob_name);
        }
    }
    let s = ckpt.expert_shape();
    for l in 0..s.n_layers {
        for e in 0..s.n_experts {
            if let Ok(w) = ckpt.load_expert(l, e) {
                assert_eq!(w.gate.len(), s.hidden * s.ffn);
                assert_eq!(w.up.len(), s.hidden * s.ffn);
                assert_eq!(w.down.len(), s.hidden * s.ffn);
            }
        }
    }
    let meta = ckpt.metadata();
    let _ = meta.check();
    let _ = ModelConfig::from_metadata(&meta);
}
