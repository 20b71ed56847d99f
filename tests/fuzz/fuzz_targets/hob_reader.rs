//! The .hob reader: `parse` of the bytes with every view walked, then the same bytes as a file
//! through `HobFile::open` (what `hob inspect`, `hob run` and `hob serve` open), its inspect report,
//! its lazily checked checksums, the model config and the tokenizer its metadata carries.
#![no_main]

use hob::format::reader::parse;
use hob::format::HobFile;
use hob::model::ModelConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    walk_parsed(data);
    let path = hob_fuzz::scratch_file("model.hob", data);
    if let Ok(file) = HobFile::open(&path) {
        walk_file(&file);
    }
});

/// Every tensor, every (layer, expert, variant) view and its three matrices, every checksum.
fn walk_parsed(b: &[u8]) {
    let Ok(p) = parse(b) else { return };
    let mut sum = 0usize;
    for (i, t) in p.tensors.iter().enumerate() {
        let d = p.tensor_data(b, i);
        assert_eq!(d.len() as u64, t.size, "tensor {} size", t.name);
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

fn walk_file(file: &HobFile) {
    std::hint::black_box(hob::cli::inspect::report(file));
    let mut sum = 0usize;
    for t in file.tensors() {
        let view = file.tensor(&t.name).map(|v| v.data.len());
        assert_eq!(view, Some(t.size as usize), "tensor {} by name", t.name);
    }
    let (n_layers, n_experts) = (file.n_layers(), file.n_experts());
    for v in 0..file.variants().len() {
        let layout = file.expert_layout(v);
        for l in 0..n_layers {
            for e in 0..n_experts {
                let r = file.expert_record(l, e, v);
                let (offset, padded) = file.expert_span(l, e, v);
                assert!(offset + padded <= file.bytes().len() as u64);
                assert_eq!(file.blob_range(l, e, v, true).len(), layout.padded_size);
                assert_eq!(file.blob_range(l, e, v, false).len() as u64, r.size);
                let x = file.expert(l, e, v);
                for m in [x.gate(), x.up(), x.down()] {
                    sum += m.codes.len() + m.scales.len() + m.mins.len();
                }
                let _ = file.verify_expert(l, e, v);
            }
        }
    }
    std::hint::black_box(sum);
    let _ = file.verify_dense();
    let _ = file.verify();
    if let Ok(cfg) = ModelConfig::from_metadata(file.metadata()) {
        std::hint::black_box((cfg.moe_layers(), cfg.q_dim(), cfg.kv_dim()));
        if let Ok(tok) = hob::cli::engine::tokenizer(file, &cfg) {
            let _ = tok
                .encode("Hello, world! <s>", true)
                .map(|ids| tok.decode(&ids, false));
        }
    }
}
