//! `hob convert --synthetic`: the generator at small shapes through the library (the presets are
//! gigabytes), and the command line's error paths through the binary.

mod common;

use std::path::Path;
use std::process::Output;

use hob::backend::cpu::CpuBackend;
use hob::experts::DirectExperts;
use hob::format::{keys, DType, HobFile, MatrixView, Variant};
use hob::import::synthetic::{self, SyntheticModel};
use hob::import::MixtralSpec;
use hob::model::{Logits, Model};
use hob::quant::Matrix;

/// The binary, started through cargo's runner where there is one (qemu for aarch64).
fn hob(args: &[&str]) -> Output {
    common::hob_command().args(args).output().unwrap()
}

/// Qwen3-like small shapes: head_dim 48 with 4 heads, so q_dim 192 != hidden 128.
fn small() -> SyntheticModel {
    SyntheticModel {
        name: "small-test".into(),
        total_layers: 3,
        spec: MixtralSpec {
            hidden: 128,
            ffn: 192,
            n_layers: 3,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 48,
            rope_theta: 1e6,
            rms_eps: 1e-6,
            vocab: 300,
            context_length: 256,
            n_experts: 4,
            n_experts_used: 2,
            tie_word_embeddings: false,
            sliding_window: None,
            bos_token_id: None,
            eos_token_id: None,
        },
        tokenizer: None,
    }
}

const ALL: &str = "f16,bf16,int8,int4,int2/g32";

fn variants(list: &str) -> Vec<Variant> {
    hob::cli::convert::parse_variants(list, None).unwrap()
}

fn write(model: &SyntheticModel, list: &str, dense: DType, seed: u64, out: &Path) {
    let mut written = 0u64;
    let dense = &hob::import::DensePlan::uniform(dense.into());
    synthetic::write(model, &variants(list), dense, seed, out, &mut |_, n| {
        written += n
    })
    .unwrap();
    assert_eq!(
        written,
        synthetic::payload_bytes(model, &variants(list), dense)
    );
}

fn matrix_f32(view: MatrixView<'_>) -> Vec<f32> {
    Matrix::from_view(view).to_f32()
}

fn dense_f32(file: &HobFile, name: &str) -> Vec<f32> {
    Matrix::from_tensor(file.tensor(name).unwrap())
        .unwrap()
        .to_f32()
}

/// (sd around zero, largest magnitude); asserts every value is finite.
fn stats(what: &str, v: &[f32]) -> (f64, f32) {
    assert!(v.iter().all(|x| x.is_finite()), "{what}: non-finite values");
    let sd = (v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    (sd, max)
}

#[test]
fn generated_file_opens_verifies_and_has_the_intended_magnitudes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.hob");
    write(&small(), ALL, DType::F16, 7, &path);
    let file = HobFile::open(&path).unwrap();
    file.verify().unwrap();

    let md = file.metadata();
    assert_eq!(md.get_str(keys::ARCHITECTURE).unwrap(), "mixtral");
    assert_eq!(md.get_str(keys::NAME).unwrap(), "synthetic small-test");
    assert_eq!(md.get_u32("mixtral.attention.key_length").unwrap(), 48);
    assert!(md.get(keys::TOKENIZER_HF_JSON).is_none());
    assert!(file.tensor(keys::OUTPUT).is_some(), "untied output");

    assert_eq!((file.n_layers(), file.n_experts()), (3, 4));
    assert_eq!(file.expert_dims(), (128, 192));
    for (vi, v) in file.variants().iter().enumerate() {
        for layer in 0..3 {
            for expert in 0..4 {
                let e = file.expert(layer, expert, vi);
                for (name, m) in [("gate", e.gate()), ("up", e.up()), ("down", e.down())] {
                    let what = format!("{v} layer {layer} expert {expert} {name}");
                    let (sd, max) = stats(&what, &matrix_f32(m));
                    assert!((0.014..0.026).contains(&sd), "{what}: sd {sd}");
                    assert!(max < 0.15, "{what}: max {max}");
                }
            }
        }
    }
    for t in file.tensors() {
        let v = dense_f32(&file, &t.name);
        if t.name.ends_with("norm.weight") {
            assert_eq!(t.dtype, DType::F32);
            assert!(v.iter().all(|&x| x == 1.0), "{}", t.name);
        } else {
            let want = if t.name.contains("ffn_gate_inp") {
                DType::F32
            } else {
                DType::F16
            };
            assert_eq!(t.dtype, want, "{}", t.name);
            let (sd, max) = stats(&t.name, &v);
            assert!((0.015..0.025).contains(&sd), "{}: sd {sd}", t.name);
            assert!(max < 0.15, "{}: max {max}", t.name);
        }
    }

    let o = hob(&["inspect", "--verify", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn generated_file_runs_with_head_dim_apart_from_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.hob");
    write(&small(), "f16,int4", DType::Bf16, 1, &path);
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    assert_eq!((model.cfg.q_dim(), model.cfg.hidden), (192, 128));
    let backend = CpuBackend::new(2).unwrap();
    for vi in 0..2 {
        let mut experts = DirectExperts::new(&file, vi).unwrap();
        let mut st = model.new_state(&backend, 16).unwrap();
        let logits = model
            .forward(
                &mut st,
                &[1, 17, 299, 42],
                &backend,
                &mut experts,
                Logits::All,
            )
            .unwrap();
        assert_eq!(logits.len(), 4 * 300);
        assert!(logits.iter().all(|x| x.is_finite()));
        let next = model
            .forward(&mut st, &[5], &backend, &mut experts, Logits::Last)
            .unwrap();
        assert!(next.iter().all(|x| x.is_finite()));
    }
}

/// The glm-4.5-air preset's architecture at small shapes: a dense first layer (an MLP, no
/// experts in the table), shared experts, grouped routing, partial rotary.
#[test]
fn a_glm_shaped_file_runs_with_its_dense_first_layer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("glm.hob");
    let glm = SyntheticModel {
        name: "glm-4.5-air".into(),
        ..small()
    };
    write(&glm, "f16,int4", DType::F16, 1, &path);
    let file = HobFile::open(&path).unwrap();
    let model = Model::load(&file).unwrap();
    assert_eq!((model.cfg.dense_layers, file.n_layers()), (1, 2));
    assert_eq!(model.cfg.rope_dim, 24);
    let backend = CpuBackend::new(2).unwrap();
    let mut experts = DirectExperts::new(&file, 1).unwrap();
    let mut st = model.new_state(&backend, 16).unwrap();
    let logits = model
        .forward(&mut st, &[1, 17, 299], &backend, &mut experts, Logits::All)
        .unwrap();
    assert!(logits.len() == 3 * 300 && logits.iter().all(|x| x.is_finite()));
}

/// With a real tokenizer embedded the synthetic file runs on text, chat template included; a
/// tokenizer larger than the model's vocabulary is refused.
#[test]
fn a_synthetic_file_with_a_tokenizer_runs_on_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.hob");
    let tokenizer = common::family_dir("qwen3-moe");
    let too_small = small().with_tokenizer(&tokenizer).unwrap_err().to_string();
    assert!(too_small.contains("512 tokens, more than"), "{too_small}");
    let mut model = small();
    model.spec.vocab = 512;
    let model = model.with_tokenizer(&tokenizer).unwrap();
    write(&model, "f16", DType::F16, 1, &path);
    let out = hob(&[
        "run",
        "-m",
        path.to_str().unwrap(),
        "-p",
        "Hello",
        "-n",
        "4",
        "--temp",
        "0",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("no chat template"), "{stderr}");
    assert!(stderr.contains("generation: "), "{stderr}");
}

#[test]
fn same_seed_same_bytes_and_layers_do_not_change_earlier_ones() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    write(&small(), "f16,int4", DType::F16, 3, &p("a.hob"));
    write(&small(), "f16,int4", DType::F16, 3, &p("b.hob"));
    write(&small(), "f16,int4", DType::F16, 4, &p("c.hob"));
    let cut = small().with_layers(1).unwrap();
    write(&cut, "int4", DType::F16, 3, &p("d.hob"));
    let read = |n: &str| std::fs::read(p(n)).unwrap();
    assert_eq!(read("a.hob"), read("b.hob"));
    assert_ne!(read("a.hob"), read("c.hob"));

    // Layer 0 of a one-layer file equals layer 0 of the full file, variant by variant.
    let (full, one) = (
        HobFile::open(&p("a.hob")).unwrap(),
        HobFile::open(&p("d.hob")).unwrap(),
    );
    assert_eq!(one.n_layers(), 1);
    assert_eq!(
        one.metadata().get_str(keys::NAME).unwrap(),
        "synthetic small-test (1 of 3 layers)"
    );
    for e in 0..4 {
        assert_eq!(
            one.expert(0, e, 0).data,
            full.expert(0, e, 1).data,
            "expert {e}"
        );
    }
    for name in [
        keys::TOKEN_EMBD,
        "blk.0.attn_q.weight",
        "blk.0.ffn_gate_inp.weight",
    ] {
        assert_eq!(
            one.tensor(name).unwrap().data,
            full.tensor(name).unwrap().data,
            "{name}"
        );
    }
}

/// A convert that must fail: non-zero exit, no panic, each of `want` in stderr, nothing written.
fn fails(args: &[&str], want: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.hob");
    let mut all = vec!["convert", "-o", out.to_str().unwrap(), "--no-progress"];
    all.extend_from_slice(args);
    let o = hob(&all);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} succeeded");
    assert!(!err.contains("panicked"), "{err}");
    for w in want {
        assert!(err.contains(w), "expected '{w}' in: {err}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn command_line_errors() {
    fails(
        &["--synthetic", "llama-70b"],
        &["llama-70b", "mixtral-8x7b", "phi-3.5-moe", "qwen3-30b-a3b"],
    );
    fails(
        &["--synthetic", "qwen3-30b-a3b", "--layers", "0"],
        &["--layers 0", "48 layers", "1..=48"],
    );
    fails(
        &["--synthetic", "mixtral-8x7b", "--layers", "99"],
        &["--layers 99", "32 layers", "1..=32"],
    );
    fails(
        &["--synthetic", "mixtral-8x7b", "--from", "some/dir"],
        &["--synthetic", "--from", "cannot be used with"],
    );
    fails(&[], &["--from", "--synthetic"]);
    fails(
        &["--from", "some/dir", "--layers", "2"],
        &["--layers", "--synthetic"],
    );
    fails(
        &["--from", "some/dir", "--seed", "2"],
        &["--seed", "--synthetic"],
    );
    fails(
        &["--synthetic", "phi-3.5-moe", "--experts", "int5"],
        &["int5", "known: f16, bf16, int8, int4, int4k, int3, int2"],
    );
    // phi's ffn 6400 is not a multiple of 512: the layout error, before anything is written.
    fails(
        &["--synthetic", "phi-3.5-moe", "--experts", "int4/g512"],
        &["6400", "group size 512"],
    );
    fails(
        &["--synthetic", "phi-3.5-moe", "--dense", "f8"],
        &["f8", "f32, f16, bf16, int8, int4"],
    );
}
