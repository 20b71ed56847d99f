//! DeepseekV2ForCausalLM (DeepSeek-V2-Lite, DeepSeek-V2): multi-head latent attention, leading
//! dense layers, ungated shared experts and softmax routing (greedy or group-limited), scaled.
//! Glm4MoeLiteForCausalLM (GLM-4.7-Flash) is the same design with GLM-4.5's router: sigmoid
//! scores with the score-correction bias, group-limited, renormalized where `norm_topk_prob`.
//!
//! Tensors: q_proj (or q_a_proj, q_a_layernorm, q_b_proj), kv_a_proj_with_mqa (the latent and
//! one RoPE key), kv_a_layernorm, kv_b_proj and o_proj, named as llama.cpp's deepseek2 names
//! them. kv_b_proj splits into each head's q_nope -> latent map (`attn_k_b`, transposed) and
//! latent -> value map (`attn_v_b`): the absorbed form hob runs (`config::Mla`). The RoPE parts
//! of q and of the key are stored interleaved (pairs 2i, 2i + 1, as transformers' complex
//! rotation reads them); convert puts them in hob's rotate-half order.

use super::arch::{DenseTensor, Lanes, MixtralSpec, TensorRole};
use super::fields::Fields;
use super::glm4moe::GlmExtras;
use super::ImportError;
use crate::format::{keys, MetaValue, Metadata};
use crate::model::yarn::Yarn;

/// DeepSeek-V2's additions to the common hyper-parameters: GLM-4.5's dense layers, shared
/// experts and grouped routing (softmax here), and MLA's shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct DeepseekExtras {
    pub moe: GlmExtras,
    pub mla: crate::model::Mla,
    /// YaRN and llama.cpp's log multiplier of its softmax scale, where the config has it.
    pub yarn: Option<(Yarn, f32)>,
    /// GLM-4.7-Flash's router: sigmoid scores and the score-correction bias (else softmax).
    pub sigmoid: bool,
    /// The checkpoint's RoPE rows in interleaved pairs (DeepSeek's; GLM-4.7-Flash's
    /// `rope_interleave`), put in rotate-half order at convert.
    pub interleaved: bool,
}

/// The spec and the extras from a DeepseekV2ForCausalLM config.json, or (`glm`) a
/// Glm4MoeLiteForCausalLM one.
pub fn parse(f: &Fields, glm: bool) -> Result<(MixtralSpec, DeepseekExtras), ImportError> {
    for field in ["attention_bias", "mlp_bias"] {
        if f.bool_or(field, false)? {
            return Err(f.unsupported(field, "hob runs DeepSeek-V2 without biases"));
        }
    }
    let n_heads = f.usize("num_attention_heads")?;
    let mla = crate::model::Mla {
        q_lora: f.opt_usize("q_lora_rank")?.unwrap_or(0),
        kv_lora: f.usize("kv_lora_rank")?,
        nope: f.usize("qk_nope_head_dim")?,
        rope: f.usize("qk_rope_head_dim")?,
        v: f.usize("v_head_dim")?,
        softmax_scale: 1.0,
    };
    if !mla.rope.is_multiple_of(2) {
        return Err(f.err(
            "qk_rope_head_dim",
            "an even size",
            f.get("qk_rope_head_dim"),
        ));
    }
    let (yarn, plain) = yarn(f)?;
    let plain = Fields {
        path: f.path,
        obj: &plain,
    };
    let mut spec = MixtralSpec::parse(&plain, "n_routed_experts", "moe_intermediate_size")?;
    // The attention as hob runs it: heads of the latent and the RoPE key over one KV head.
    (spec.n_heads, spec.n_kv_heads, spec.head_dim) = (n_heads, 1, mla.kv_lora + mla.rope);
    let dense_layers = match glm {
        true => leading_dense(f, spec.n_layers)?,
        false => f.opt_usize("first_k_dense_replace")?.unwrap_or(0),
    };
    if dense_layers >= spec.n_layers {
        let expected = format!("fewer than num_hidden_layers ({})", spec.n_layers);
        return Err(f.err(
            "first_k_dense_replace",
            &expected,
            f.get("first_k_dense_replace"),
        ));
    }
    let (groups, topk_groups) = match (glm, f.get("topk_method").and_then(|v| v.as_str())) {
        (true, _) => (
            f.opt_usize("n_group")?.unwrap_or(1),
            f.opt_usize("topk_group")?.unwrap_or(1),
        ),
        (false, None | Some("greedy")) => (1, 1),
        (false, Some("group_limited_greedy")) => (f.usize("n_group")?, f.usize("topk_group")?),
        (false, Some(_)) => {
            let detail = "hob runs greedy and group_limited_greedy";
            return Err(f.unsupported("topk_method", detail));
        }
    };
    if groups == 0 || !spec.n_experts.is_multiple_of(groups) || topk_groups > groups {
        let expected = format!(
            "a divisor of the {} experts, at least topk_group",
            spec.n_experts
        );
        return Err(f.err("n_group", &expected, f.get("n_group")));
    }
    let moe = GlmExtras {
        dense_layers,
        dense_ffn: match dense_layers {
            0 => 0,
            _ => f.usize("intermediate_size")?,
        },
        shared_ffn: f.opt_usize("n_shared_experts")?.unwrap_or(1) * spec.ffn,
        rope_dim: mla.rope,
        groups,
        topk_groups,
        // transformers' DeepSeek-V2 router never renormalizes (whatever norm_topk_prob says).
        renormalize: glm && f.bool_or("norm_topk_prob", true)?,
        scale: f.opt_f64("routed_scaling_factor")?.unwrap_or(1.0) as f32,
        qk_norm: false,
    };
    let extras = DeepseekExtras {
        moe,
        mla,
        yarn,
        sigmoid: glm,
        interleaved: !glm || f.bool_or("rope_interleave", true)?,
    };
    Ok((spec, extras))
}

/// GLM-4.7-Flash's leading dense layers: `mlp_layer_types` ("dense" layers, then "sparse"
/// ones), else `first_k_dense_replace`.
fn leading_dense(f: &Fields, n_layers: usize) -> Result<usize, ImportError> {
    let Some(types) = f.get("mlp_layer_types") else {
        return Ok(f.opt_usize("first_k_dense_replace")?.unwrap_or(1));
    };
    let names: Option<Vec<&str>> = types
        .as_array()
        .and_then(|a| a.iter().map(|v| v.as_str()).collect());
    let names = names.unwrap_or_default();
    let dense = names.iter().take_while(|t| **t == "dense").count();
    if names.len() != n_layers || names[dense..].iter().any(|t| *t != "sparse") {
        let expected = format!("{n_layers} entries: \"dense\" layers, then \"sparse\" ones");
        return Err(f.err("mlp_layer_types", &expected, Some(types)));
    }
    Ok(dense)
}

type JsonMap = serde_json::Map<String, serde_json::Value>;

/// DeepSeek's YaRN where the config has it: the frequencies, and llama.cpp's log multiplier
/// of the softmax scale (0.1 * mscale_all_dim); with the config's other fields (rope_theta
/// hoisted) for the common parse. Its cos/sin scale (mscale over mscale_all_dim) must be 1:
/// hob folds that scale into q, which MLA's latent part must not get.
fn yarn(f: &Fields) -> Result<(Option<(Yarn, f32)>, JsonMap), ImportError> {
    let kind = ["rope_parameters", "rope_scaling"].iter().find_map(|k| {
        f.get(k)?
            .get("rope_type")
            .or(f.get(k)?.get("type"))?
            .as_str()
    });
    if kind.is_none_or(|k| k == "default") {
        let mut plain = f.obj.clone();
        plain.remove("rope_scaling");
        if let Some(theta) = f.get("rope_parameters").and_then(|p| p.get("rope_theta")) {
            plain.insert("rope_theta".into(), theta.clone());
        }
        plain.remove("rope_parameters");
        return Ok((None, plain));
    }
    let scaling = f.rope_scaling("yarn", "DeepSeek-V2")?;
    let r = Fields {
        path: f.path,
        obj: scaling.obj,
    };
    let factor = r.f32("factor")?;
    let mscale = |k: &str| -> Result<f32, ImportError> {
        let m = r.opt_f64(k)?.unwrap_or(0.0) as f32;
        Ok(if factor <= 1.0 || m == 0.0 {
            1.0
        } else {
            0.1 * m * factor.ln() + 1.0
        })
    };
    let (m, all) = (mscale("mscale")?, mscale("mscale_all_dim")?);
    if (m / all - 1.0).abs() > 1e-6 || r.get("attention_factor").is_some() {
        let detail = "hob runs DeepSeek's YaRN with mscale equal to mscale_all_dim";
        return Err(f.unsupported(&format!("{}.mscale", scaling.field), detail));
    }
    let y = Yarn {
        factor,
        original_context: r.usize("original_max_position_embeddings")?,
        beta_fast: r.opt_f64("beta_fast")?.unwrap_or(32.0) as f32,
        beta_slow: r.opt_f64("beta_slow")?.unwrap_or(1.0) as f32,
        truncate: r.bool_or("truncate", true)?,
        attention_factor: 1.0,
    };
    let log_mul = 0.1 * r.opt_f64("mscale_all_dim")?.unwrap_or(0.0) as f32;
    Ok((Some((y, log_mul)), scaling.common))
}

/// Every dense tensor, in the order convert writes them.
pub fn dense_tensors(s: &MixtralSpec, e: &DeepseekExtras) -> Vec<DenseTensor> {
    let h = s.hidden;
    let t =
        |hob: String, hf: String, shape: Vec<usize>, role| DenseTensor::new(hob, hf, shape, role);
    let (mat, vec) = (TensorRole::Matrix, TensorRole::Norm);
    let mut out = vec![t(
        keys::TOKEN_EMBD.into(),
        "model.embed_tokens.weight".into(),
        vec![s.vocab, h],
        mat,
    )];
    for l in 0..s.n_layers {
        let b = |k: &str| keys::blk(l, k);
        let hf = |n: &str| format!("model.layers.{l}.{n}");
        out.push(t(
            b(keys::ATTN_NORM),
            hf("input_layernorm.weight"),
            vec![h],
            vec,
        ));
        attention_tensors(l, s, e, &mut out);
        out.push(t(
            b(keys::FFN_NORM),
            hf("post_attention_layernorm.weight"),
            vec![h],
            vec,
        ));
        ffn_tensors(l, s, e, &mut out);
    }
    out.push(t(
        keys::OUTPUT_NORM.into(),
        "model.norm.weight".into(),
        vec![h],
        vec,
    ));
    if !s.tie_word_embeddings {
        out.push(t(
            keys::OUTPUT.into(),
            "lm_head.weight".into(),
            vec![s.vocab, h],
            mat,
        ));
    }
    out
}

/// Layer `l`'s multi-head latent attention tensors (after its input norm), into `out`.
fn attention_tensors(l: usize, s: &MixtralSpec, e: &DeepseekExtras, out: &mut Vec<DenseTensor>) {
    let (h, heads, m) = (s.hidden, s.n_heads, e.mla);
    let t =
        |hob: String, hf: String, shape: Vec<usize>, role| DenseTensor::new(hob, hf, shape, role);
    let (mat, vec) = (TensorRole::Matrix, TensorRole::Norm);
    let qw = m.nope + m.rope;
    let b = |k: &str| keys::blk(l, k);
    let hf = |n: &str| format!("model.layers.{l}.{n}");
    let q_rope = Lanes::Interleaved {
        block: qw,
        offset: m.nope,
        len: m.rope,
    };
    if m.q_lora > 0 {
        out.push(t(
            b(keys::ATTN_Q_A),
            hf("self_attn.q_a_proj.weight"),
            vec![m.q_lora, h],
            mat,
        ));
        out.push(t(
            b(keys::ATTN_Q_A_NORM),
            hf("self_attn.q_a_layernorm.weight"),
            vec![m.q_lora],
            vec,
        ));
        let mut q = t(
            b(keys::ATTN_Q_B),
            hf("self_attn.q_b_proj.weight"),
            vec![heads * qw, m.q_lora],
            mat,
        );
        if e.interleaved {
            q.lanes = q_rope;
        }
        out.push(q);
    } else {
        let mut q = t(
            b(keys::ATTN_Q),
            hf("self_attn.q_proj.weight"),
            vec![heads * qw, h],
            mat,
        );
        if e.interleaved {
            q.lanes = q_rope;
        }
        out.push(q);
    }
    let kw = m.kv_lora + m.rope;
    let mut kv_a = t(
        b(keys::ATTN_KV_A_MQA),
        hf("self_attn.kv_a_proj_with_mqa.weight"),
        vec![kw, h],
        mat,
    );
    if e.interleaved {
        kv_a.lanes = Lanes::Interleaved {
            block: kw,
            offset: m.kv_lora,
            len: m.rope,
        };
    }
    out.push(kv_a);
    out.push(t(
        b(keys::ATTN_KV_A_NORM),
        hf("self_attn.kv_a_layernorm.weight"),
        vec![m.kv_lora],
        vec,
    ));
    for (name, values, shape) in [
        (keys::ATTN_K_B, false, vec![heads * m.kv_lora, m.nope]),
        (keys::ATTN_V_B, true, vec![heads * m.v, m.kv_lora]),
    ] {
        let mut kv_b = t(b(name), hf("self_attn.kv_b_proj.weight"), shape, mat);
        kv_b.lanes = Lanes::KvB {
            heads,
            nope: m.nope,
            v: m.v,
            rank: m.kv_lora,
            values,
        };
        out.push(kv_b);
    }
    out.push(t(
        b(keys::ATTN_OUTPUT),
        hf("self_attn.o_proj.weight"),
        vec![h, heads * m.v],
        mat,
    ));
}

/// Layer `l`'s feed-forward tensors (after its post-attention norm): a dense MLP in the first
/// layers, else the router, the shared experts and the score-correction bias, into `out`.
fn ffn_tensors(l: usize, s: &MixtralSpec, e: &DeepseekExtras, out: &mut Vec<DenseTensor>) {
    let h = s.hidden;
    let t =
        |hob: String, hf: String, shape: Vec<usize>, role| DenseTensor::new(hob, hf, shape, role);
    let (mat, vec) = (TensorRole::Matrix, TensorRole::Norm);
    let b = |k: &str| keys::blk(l, k);
    let hf = |n: &str| format!("model.layers.{l}.{n}");
    let mlp = |prefix: &str, f: usize| {
        let names = [
            (keys::FFN_GATE, "gate_proj"),
            (keys::FFN_UP, "up_proj"),
            (keys::FFN_DOWN, "down_proj"),
        ];
        names.map(|(k, n)| {
            let hob = match prefix {
                "mlp" => b(k),
                _ => b(&k.replace(".weight", "_shexp.weight")),
            };
            let shape = if n == "down_proj" {
                vec![h, f]
            } else {
                vec![f, h]
            };
            t(hob, hf(&format!("{prefix}.{n}.weight")), shape, mat)
        })
    };
    if l < e.moe.dense_layers {
        out.extend(mlp("mlp", e.moe.dense_ffn));
    } else {
        out.push(t(
            b(keys::FFN_GATE_INP),
            hf("mlp.gate.weight"),
            vec![s.n_experts, h],
            TensorRole::Router,
        ));
        out.extend(mlp("mlp.shared_experts", e.moe.shared_ffn));
        if e.sigmoid {
            out.push(t(
                b(keys::FFN_EXP_PROBS_B),
                hf("mlp.gate.e_score_correction_bias"),
                vec![s.n_experts],
                vec,
            ));
        }
    }
}

/// The `{arch}.*` keys DeepSeek-V2 adds (and its value length: the latent's).
pub fn write_metadata(e: &DeepseekExtras, arch: &str, m: &mut Metadata) {
    super::glm4moe::write_metadata(&e.moe, arch, m);
    let k = |key: &str| keys::arch_key(arch, key);
    let u = |n: usize| MetaValue::U32(u32::try_from(n).unwrap_or(u32::MAX));
    let x = e.mla;
    m.set(&k(keys::VALUE_LENGTH), u(x.kv_lora));
    m.set(&k(keys::KV_LORA_RANK), u(x.kv_lora));
    if x.q_lora > 0 {
        m.set(&k(keys::Q_LORA_RANK), u(x.q_lora));
    }
    m.set(&k(keys::KEY_LENGTH_MLA), u(x.nope + x.rope));
    m.set(&k(keys::VALUE_LENGTH_MLA), u(x.v));
    m.set(
        &k(keys::EXPERT_GATING_FUNC),
        u(if e.sigmoid { 2 } else { 1 }),
    );
    if let Some((y, log_mul)) = &e.yarn {
        y.write_metadata(arch, m);
        m.set(&k(keys::ROPE_YARN_LOG_MUL), MetaValue::F32(*log_mul));
    }
}

/// Where row j of an interleaved RoPE part of `len` rows comes from: hob's halves (i, i +
/// len / 2) are the checkpoint's pairs (2i, 2i + 1).
pub fn deinterleave_source(j: usize, len: usize) -> usize {
    match j < len / 2 {
        true => 2 * j,
        false => 2 * (j - len / 2) + 1,
    }
}
