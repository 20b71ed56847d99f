//! Checkpoint::open on synthetic checkpoints and on the transformers fixture: config forms,
//! sharding, dtypes, tensor names and every error that must name its cause.

mod import_fixture;

use std::path::Path;

use hob::format::{keys, DType, MetaValue};
use hob::import::{Checkpoint, TensorRole};
use import_fixture as fx;
use safetensors::Dtype;
use serde_json::json;

fn open_err(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("{} opened but should not", dir.display()),
        Err(e) => e.to_string(),
    }
}

type ConfigEdit = Box<dyn Fn(&mut serde_json::Map<String, serde_json::Value>)>;

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let mut c = fx::read_config(dir);
    edit(c.as_object_mut().unwrap());
    fx::write_json(&dir.join("config.json"), &c);
}

#[test]
fn synthetic_checkpoint_opens_with_metadata_and_tensor_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fx::write_synthetic(tmp.path(), Dtype::F16, false);
    let ck = Checkpoint::open(tmp.path()).unwrap();
    assert_eq!(ck.source_dtype, DType::F16);

    let m = ck.metadata();
    let name = tmp
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(
        m.get(keys::ARCHITECTURE),
        Some(&MetaValue::String("mixtral".into()))
    );
    assert_eq!(m.get(keys::NAME), Some(&MetaValue::String(name)));
    let u = |k: &str| m.get(&keys::arch_key("mixtral", k)).cloned();
    assert_eq!(u(keys::EMBEDDING_LENGTH), Some(MetaValue::U32(64)));
    assert_eq!(u(keys::FEED_FORWARD_LENGTH), Some(MetaValue::U32(128)));
    assert_eq!(u(keys::BLOCK_COUNT), Some(MetaValue::U32(2)));
    assert_eq!(u(keys::HEAD_COUNT), Some(MetaValue::U32(4)));
    assert_eq!(u(keys::HEAD_COUNT_KV), Some(MetaValue::U32(2)));
    assert_eq!(u(keys::KEY_LENGTH), Some(MetaValue::U32(16)));
    assert_eq!(u(keys::VALUE_LENGTH), Some(MetaValue::U32(16)));
    assert_eq!(u(keys::VOCAB_SIZE), Some(MetaValue::U32(32)));
    assert_eq!(u(keys::CONTEXT_LENGTH), Some(MetaValue::U32(128)));
    assert_eq!(u(keys::EXPERT_COUNT), Some(MetaValue::U32(4)));
    assert_eq!(u(keys::EXPERT_USED_COUNT), Some(MetaValue::U32(2)));
    assert_eq!(u(keys::RMS_EPS), Some(MetaValue::F32(1e-5)));
    assert_eq!(u(keys::ROPE_FREQ_BASE), Some(MetaValue::F32(1e6)));
    assert_eq!(u(keys::SLIDING_WINDOW), None);
    assert_eq!(
        m.get(keys::TOKENIZER_HF_JSON),
        Some(&MetaValue::String(fx::tokenizer_json()))
    );
    assert_eq!(
        m.get(keys::CHAT_TEMPLATE),
        Some(&MetaValue::String("{{ bos_token }}".into()))
    );
    assert_eq!(m.get(keys::BOS_TOKEN_ID), Some(&MetaValue::U32(1)));
    assert_eq!(m.get(keys::EOS_TOKEN_ID), Some(&MetaValue::U32(2)));
    assert_eq!(m.get(keys::ADD_BOS_TOKEN), Some(&MetaValue::Bool(true)));
    assert_eq!(
        m.get(keys::TIE_WORD_EMBEDDINGS),
        Some(&MetaValue::Bool(false))
    );
    assert_eq!(
        m.get(keys::SOURCE_DTYPE),
        Some(&MetaValue::String("f16".into()))
    );

    let dense = ck.dense_tensors();
    assert_eq!(dense.len(), 1 + 7 * fx::LAYERS + 2);
    assert_eq!(dense[0].hob_name, "token_embd.weight");
    assert_eq!(dense[0].hf_name, "model.embed_tokens.weight");
    let router = dense
        .iter()
        .find(|t| t.hob_name == "blk.1.ffn_gate_inp.weight")
        .unwrap();
    assert_eq!(
        router.hf_name,
        "model.layers.1.block_sparse_moe.gate.weight"
    );
    assert_eq!(
        (router.shape.clone(), router.role),
        (vec![4, 64], TensorRole::Router)
    );
    let o = dense
        .iter()
        .find(|t| t.hob_name == "blk.0.attn_output.weight")
        .unwrap();
    assert_eq!(o.hf_name, "model.layers.0.self_attn.o_proj.weight");
    assert_eq!(dense.last().unwrap().hob_name, "output.weight");
    let specs = ck.dense_specs(&hob::import::DensePlan::uniform(DType::Bf16.into()));
    for (t, s) in dense.iter().zip(&specs) {
        let want = if t.role == TensorRole::Matrix {
            DType::Bf16
        } else {
            DType::F32
        };
        assert_eq!(
            (s.dtype, &s.shape, &s.name),
            (want.into(), &t.shape, &t.hob_name)
        );
    }

    // Loaded values equal the source exactly (f16 widens exactly to f32).
    for t in dense {
        assert_eq!(
            ck.load_dense(t).unwrap(),
            src[&t.hf_name].values,
            "{}",
            t.hf_name
        );
    }
    let w = ck.load_expert(1, 3).unwrap();
    let p = "model.layers.1.block_sparse_moe.experts.3";
    assert_eq!(w.gate, src[&format!("{p}.w1.weight")].values);
    assert_eq!(w.up, src[&format!("{p}.w3.weight")].values);
    assert_eq!(w.down, src[&format!("{p}.w2.weight")].values);
}

#[test]
fn sharded_and_single_file_sources_in_every_dtype_load_the_same_values() {
    for (dtype, want) in [
        (Dtype::F32, DType::F32),
        (Dtype::F16, DType::F16),
        (Dtype::BF16, DType::Bf16),
    ] {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let src = fx::write_synthetic(a.path(), dtype, false);
        fx::write_synthetic(b.path(), dtype, true);
        assert!(b.path().join("model.safetensors.index.json").exists());
        let (ca, cb) = (
            Checkpoint::open(a.path()).unwrap(),
            Checkpoint::open(b.path()).unwrap(),
        );
        assert_eq!((ca.source_dtype, cb.source_dtype), (want, want));
        for t in ca.dense_tensors() {
            let va = ca.load_dense(t).unwrap();
            assert_eq!(va, src[&t.hf_name].values);
            assert_eq!(va, cb.load_dense(t).unwrap());
        }
        for (l, e) in [(0, 0), (1, 2)] {
            let (x, y) = (ca.load_expert(l, e).unwrap(), cb.load_expert(l, e).unwrap());
            assert_eq!((x.gate, x.up, x.down), (y.gate, y.up, y.down));
        }
    }
}

#[test]
fn transformers_fixture_opens() {
    let ck = Checkpoint::open(&fx::fixture_dir()).unwrap();
    let m = ck.metadata();
    let u = |k: &str| m.get(&keys::arch_key("mixtral", k)).cloned();
    assert_eq!(u(keys::ROPE_FREQ_BASE), Some(MetaValue::F32(1e6)));
    assert_eq!(u(keys::KEY_LENGTH), Some(MetaValue::U32(16)));
    assert_eq!(u(keys::VOCAB_SIZE), Some(MetaValue::U32(512)));
    assert_eq!(m.get(keys::BOS_TOKEN_ID), Some(&MetaValue::U32(1)));
    assert_eq!(m.get(keys::EOS_TOKEN_ID), Some(&MetaValue::U32(2)));
    assert_eq!(
        m.get(keys::NAME),
        Some(&MetaValue::String("tiny-mixtral".into()))
    );
    assert!(
        matches!(m.get(keys::CHAT_TEMPLATE), Some(MetaValue::String(t)) if t.contains("[INST]"))
    );
    assert_eq!(ck.source_dtype, DType::F16);
    let src = fx::read_tensors(&fx::fixture_dir());
    let w = ck.load_expert(1, 2).unwrap();
    assert_eq!(
        w.down,
        src["model.layers.1.block_sparse_moe.experts.2.w2.weight"].values
    );
}

#[test]
fn transformers5_config_forms_are_accepted() {
    let tmp = tempfile::tempdir().unwrap();
    fx::write_synthetic(tmp.path(), Dtype::F16, false);
    edit_config(tmp.path(), |c| {
        c.remove("rope_theta");
        c.insert(
            "rope_parameters".into(),
            json!({"rope_theta": 10000.0, "rope_type": "default"}),
        );
        c.insert("head_dim".into(), json!(null));
        c.insert("sliding_window".into(), json!(4096));
        c.insert("rope_scaling".into(), json!(null));
    });
    fx::write_json(
        &tmp.path().join("tokenizer_config.json"),
        &json!({"bos_token": {"content": "<s>"}, "eos_token": "w5", "add_bos_token": false}),
    );
    std::fs::write(
        tmp.path().join("chat_template.jinja"),
        "{% for m in messages %}{% endfor %}",
    )
    .unwrap();
    let m = Checkpoint::open(tmp.path()).unwrap().metadata();
    let u = |k: &str| m.get(&keys::arch_key("mixtral", k)).cloned();
    assert_eq!(u(keys::ROPE_FREQ_BASE), Some(MetaValue::F32(10000.0)));
    assert_eq!(u(keys::KEY_LENGTH), Some(MetaValue::U32(16)));
    assert_eq!(u(keys::SLIDING_WINDOW), Some(MetaValue::U32(4096)));
    assert_eq!(m.get(keys::EOS_TOKEN_ID), Some(&MetaValue::U32(5)));
    assert_eq!(m.get(keys::ADD_BOS_TOKEN), Some(&MetaValue::Bool(false)));
    assert_eq!(
        m.get(keys::CHAT_TEMPLATE),
        Some(&MetaValue::String(
            "{% for m in messages %}{% endfor %}".into()
        ))
    );

    // Without tokenizer_config.json: ids from config.json, BOS added by default, no template.
    std::fs::remove_file(tmp.path().join("tokenizer_config.json")).unwrap();
    std::fs::remove_file(tmp.path().join("chat_template.jinja")).unwrap();
    let m = Checkpoint::open(tmp.path()).unwrap().metadata();
    assert_eq!(m.get(keys::BOS_TOKEN_ID), Some(&MetaValue::U32(1)));
    assert_eq!(m.get(keys::ADD_BOS_TOKEN), Some(&MetaValue::Bool(true)));
    assert_eq!(m.get(keys::CHAT_TEMPLATE), None);
}

#[test]
fn tied_embeddings_need_no_lm_head() {
    let tmp = tempfile::tempdir().unwrap();
    let mut t = fx::synthetic_tensors(Dtype::F16, 7);
    t.remove("lm_head.weight");
    fx::write_synthetic(tmp.path(), Dtype::F16, false);
    fx::write_tensors(tmp.path(), &t, false);
    edit_config(tmp.path(), |c| {
        c.insert("tie_word_embeddings".into(), json!(true));
    });
    let ck = Checkpoint::open(tmp.path()).unwrap();
    assert!(ck
        .dense_tensors()
        .iter()
        .all(|t| t.hob_name != "output.weight"));
    assert_eq!(
        ck.metadata().get(keys::TIE_WORD_EMBEDDINGS),
        Some(&MetaValue::Bool(true))
    );
}

#[test]
fn fused_transformers5_expert_layout_loads_like_per_expert() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fx::write_synthetic(tmp.path(), Dtype::F16, false);
    let mut fused = fx::synthetic_tensors(Dtype::F16, 42);
    for l in 0..fx::LAYERS {
        let p = format!("model.layers.{l}");
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        for e in 0..fx::EXPERTS {
            let x = format!("{p}.block_sparse_moe.experts.{e}");
            gate_up.extend(fused.remove(&format!("{x}.w1.weight")).unwrap().values);
            gate_up.extend(fused.remove(&format!("{x}.w3.weight")).unwrap().values);
            down.extend(fused.remove(&format!("{x}.w2.weight")).unwrap().values);
        }
        let router = fused
            .remove(&format!("{p}.block_sparse_moe.gate.weight"))
            .unwrap();
        fused.insert(format!("{p}.mlp.gate.weight"), router);
        let t = |shape, values| fx::Tensor {
            dtype: Dtype::F16,
            shape,
            values,
        };
        fused.insert(
            format!("{p}.mlp.experts.gate_up_proj"),
            t(vec![fx::EXPERTS, 2 * fx::FFN, fx::HIDDEN], gate_up),
        );
        fused.insert(
            format!("{p}.mlp.experts.down_proj"),
            t(vec![fx::EXPERTS, fx::HIDDEN, fx::FFN], down),
        );
    }
    fx::write_tensors(tmp.path(), &fused, false);
    let ck = Checkpoint::open(tmp.path()).unwrap();
    let router = ck
        .dense_tensors()
        .iter()
        .find(|t| t.hob_name == "blk.1.ffn_gate_inp.weight")
        .unwrap();
    assert_eq!(router.hf_name, "model.layers.1.mlp.gate.weight");
    assert_eq!(
        ck.load_dense(router).unwrap(),
        src["model.layers.1.block_sparse_moe.gate.weight"].values
    );
    let w = ck.load_expert(1, 2).unwrap();
    let x = "model.layers.1.block_sparse_moe.experts.2";
    assert_eq!(w.gate, src[&format!("{x}.w1.weight")].values);
    assert_eq!(w.up, src[&format!("{x}.w3.weight")].values);
    assert_eq!(w.down, src[&format!("{x}.w2.weight")].values);
}

#[test]
fn missing_directory_and_files_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-model");
    let e = open_err(&missing);
    assert!(e.contains("no-such-model"), "{e}");

    fx::write_synthetic(tmp.path(), Dtype::F16, false);
    std::fs::remove_file(tmp.path().join("tokenizer.json")).unwrap();
    let e = open_err(tmp.path());
    assert!(e.contains("tokenizer.json"), "{e}");

    std::fs::write(tmp.path().join("tokenizer.json"), fx::tokenizer_json()).unwrap();
    std::fs::remove_file(tmp.path().join("model.safetensors")).unwrap();
    let e = open_err(tmp.path());
    assert!(
        e.contains("no model.safetensors or model.safetensors.index.json"),
        "{e}"
    );

    fx::write_synthetic(tmp.path(), Dtype::F16, true);
    std::fs::remove_file(tmp.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = open_err(tmp.path());
    assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
}

#[test]
fn config_errors_name_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    fx::write_synthetic(tmp.path(), Dtype::F16, false);
    let cases: Vec<(ConfigEdit, &str)> = vec![
        (
            Box::new(|c| {
                c.insert("architectures".into(), json!(["LlamaForCausalLM"]));
            }),
            "config.json: architecture 'LlamaForCausalLM' is not supported (supported: MixtralForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, Qwen2MoeForCausalLM, PhimoeForCausalLM, GptOssForCausalLM, Glm4MoeForCausalLM, DeepseekV2ForCausalLM, Glm4MoeLiteForCausalLM)",
        ),
        (Box::new(|c| { c.remove("hidden_size"); }), "field 'hidden_size': expected a positive integer, found nothing"),
        (Box::new(|c| { c.insert("num_local_experts".into(), json!("8")); }), "field 'num_local_experts': expected a positive integer, found \"8\""),
        (Box::new(|c| { c.remove("rope_theta"); }), "field 'rope_theta'"),
        (Box::new(|c| { c.insert("rope_scaling".into(), json!({"type": "linear", "factor": 2.0})); }), "'rope_scaling' is not supported"),
        (
            Box::new(|c| {
                c.remove("rope_theta");
                c.insert("rope_parameters".into(), json!({"rope_theta": 1e6, "rope_type": "yarn"}));
            }),
            "rope_parameters.rope_type is not supported: found \"yarn\"",
        ),
        (Box::new(|c| { c.insert("num_key_value_heads".into(), json!(3)); }), "field 'num_key_value_heads'"),
        (Box::new(|c| { c.insert("tie_word_embeddings".into(), json!("no")); }), "field 'tie_word_embeddings': expected true or false"),
    ];
    let original = fx::read_config(tmp.path());
    for (edit, want) in cases {
        fx::write_json(&tmp.path().join("config.json"), &original);
        edit_config(tmp.path(), edit);
        let e = open_err(tmp.path());
        assert!(e.contains(want), "expected '{want}' in: {e}");
        assert!(e.contains("config.json"), "{e}");
    }
    std::fs::write(tmp.path().join("config.json"), "{ not json").unwrap();
    assert!(open_err(tmp.path()).contains("config.json: invalid JSON"));
}

#[test]
fn tensor_errors_name_the_tensor_and_expected_vs_found() {
    let tmp = tempfile::tempdir().unwrap();
    fx::write_synthetic(tmp.path(), Dtype::F16, true);
    let name = "model.layers.1.self_attn.k_proj.weight";

    let mut t = fx::synthetic_tensors(Dtype::F16, 42);
    t.remove(name);
    fx::write_tensors(tmp.path(), &t, true);
    let e = open_err(tmp.path());
    assert!(
        e.contains(name) && e.contains("model.safetensors.index.json"),
        "{e}"
    );

    let mut t = fx::synthetic_tensors(Dtype::F16, 42);
    t.get_mut(name).unwrap().shape = vec![16, 128];
    fx::write_tensors(tmp.path(), &t, false);
    std::fs::remove_file(tmp.path().join("model.safetensors.index.json")).unwrap();
    let e = open_err(tmp.path());
    assert!(
        e.contains(name) && e.contains("expected shape [32, 64], found [16, 128]"),
        "{e}"
    );

    let mut t = fx::synthetic_tensors(Dtype::F16, 42);
    t.get_mut(name).unwrap().dtype = Dtype::F64;
    fx::write_tensors(tmp.path(), &t, false);
    let e = open_err(tmp.path());
    assert!(
        e.contains(name) && e.contains("dtype F64 is not supported (supported: F32, F16, BF16)"),
        "{e}"
    );

    let expert = "model.layers.0.block_sparse_moe.experts.1.w3.weight";
    let mut t = fx::synthetic_tensors(Dtype::F16, 42);
    let v = &mut t.get_mut(expert).unwrap().values;
    v[5] = f32::NAN;
    v[9] = f32::INFINITY;
    fx::write_tensors(tmp.path(), &t, false);
    let ck = Checkpoint::open(tmp.path()).unwrap();
    let e = ck.load_expert(0, 1).err().unwrap().to_string();
    assert!(
        e.contains(expert) && e.contains("2 non-finite values (first at element 5)"),
        "{e}"
    );
    assert!(ck.load_expert(0, 0).is_ok());

    std::fs::write(
        tmp.path().join("model.safetensors"),
        b"\x10\0\0\0\0\0\0\0{garbage",
    )
    .unwrap();
    let e = open_err(tmp.path());
    assert!(
        e.contains("model.safetensors: not a valid safetensors file"),
        "{e}"
    );
}

#[test]
fn tokenizer_errors_name_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    fx::write_synthetic(tmp.path(), Dtype::F16, false);
    fx::write_json(
        &tmp.path().join("tokenizer_config.json"),
        &json!({"bos_token": "<bos>"}),
    );
    let e = open_err(tmp.path());
    assert!(
        e.contains("tokenizer_config.json") && e.contains("'bos_token'") && e.contains("<bos>"),
        "{e}"
    );
    fx::write_json(
        &tmp.path().join("tokenizer_config.json"),
        &json!({"add_bos_token": "yes"}),
    );
    assert!(open_err(tmp.path()).contains("field 'add_bos_token'"));
    std::fs::write(tmp.path().join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let e = open_err(tmp.path());
    assert!(
        e.contains("tokenizer.json: not a Hugging Face tokenizer"),
        "{e}"
    );
}
