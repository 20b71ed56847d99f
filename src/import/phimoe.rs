//! PhimoeForCausalLM (Phi-3.5-MoE): what its config adds to Mixtral's (sparsemixer's margin,
//! LongRoPE), and its extra tensors (LayerNorm, attention and output-head biases).

use super::arch::{DenseTensor, MixtralSpec, TensorRole};
use super::fields::Fields;
use super::ImportError;
use crate::format::{keys, MetaValue, Metadata};

/// Phi-3.5-MoE's additions to the common hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct PhiExtras {
    /// Sparsemixer's relative margin (`router_jitter_noise`).
    pub jitter_eps: f32,
    /// LongRoPE: the original context and the short and long factors and scales.
    pub original_context: usize,
    pub short_factor: Vec<f32>,
    pub long_factor: Vec<f32>,
    pub short_mscale: f32,
    pub long_mscale: f32,
}

/// The spec and the extras from a PhimoeForCausalLM config.json.
pub fn parse(f: &Fields) -> Result<(MixtralSpec, PhiExtras), ImportError> {
    let unsupported = |what: &str, detail: String| ImportError::Unsupported {
        path: f.path.to_path_buf(),
        what: what.to_string(),
        detail,
    };
    let scaling = f.rope_scaling("longrope", "Phi-3.5-MoE")?;
    let (field, plain) = (scaling.field, scaling.common);
    let r = Fields {
        path: f.path,
        obj: scaling.obj,
    };
    let spec = MixtralSpec::parse(
        &Fields {
            path: f.path,
            obj: &plain,
        },
        "num_local_experts",
        "intermediate_size",
    )?;
    if spec.n_experts_used != 2 {
        let detail = format!("found {}; sparsemixer picks 2", spec.n_experts_used);
        return Err(unsupported("'num_experts_per_tok'", detail));
    }
    for field in ["attention_bias", "lm_head_bias"] {
        if !f.bool_or(field, false)? {
            let detail = format!("hob runs Phi-3.5-MoE with {field} true");
            return Err(unsupported(&format!("'{field}'"), detail));
        }
    }
    let factors = |name: &str| -> Result<Vec<f32>, ImportError> {
        let expected = format!("a list of {} positive numbers", spec.head_dim / 2);
        let v = r.get(name);
        let list = v
            .and_then(|v| v.as_array())
            .ok_or_else(|| f.err(&format!("{field}.{name}"), &expected, v))?;
        let values: Vec<f32> = list
            .iter()
            .filter_map(|x| x.as_f64().filter(|x| x.is_finite() && *x > 0.0))
            .map(|x| x as f32)
            .collect();
        if values.len() != list.len() || values.len() != spec.head_dim / 2 {
            return Err(f.err(&format!("{field}.{name}"), &expected, v));
        }
        Ok(values)
    };
    let original_context = match r.opt_usize("original_max_position_embeddings")? {
        Some(n) => n,
        None => f.usize("original_max_position_embeddings")?,
    };
    let extras = PhiExtras {
        jitter_eps: f.opt_f64("router_jitter_noise")?.unwrap_or(0.01) as f32,
        original_context,
        short_factor: factors("short_factor")?,
        long_factor: factors("long_factor")?,
        short_mscale: r.f32("short_mscale")?,
        long_mscale: r.f32("long_mscale")?,
    };
    Ok((spec, extras))
}

/// LayerNorm, attention and output-head biases, after the common tensors.
pub fn add_tensors(s: &MixtralSpec, out: &mut Vec<DenseTensor>) {
    let (h, q, kv) = (s.hidden, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let t =
        |hob: String, hf: String, n: usize| DenseTensor::new(hob, hf, vec![n], TensorRole::Norm);
    for l in 0..s.n_layers {
        let hf = |name: &str| format!("model.layers.{l}.{name}");
        for (hob, name, n) in [
            (keys::ATTN_NORM_BIAS, "input_layernorm.bias", h),
            (keys::ATTN_Q_BIAS, "self_attn.q_proj.bias", q),
            (keys::ATTN_K_BIAS, "self_attn.k_proj.bias", kv),
            (keys::ATTN_V_BIAS, "self_attn.v_proj.bias", kv),
            (keys::ATTN_OUTPUT_BIAS, "self_attn.o_proj.bias", h),
            (keys::FFN_NORM_BIAS, "post_attention_layernorm.bias", h),
        ] {
            out.push(t(keys::blk(l, hob), hf(name), n));
        }
    }
    out.push(t(
        keys::OUTPUT_NORM_BIAS.into(),
        "model.norm.bias".into(),
        h,
    ));
    out.push(t(keys::OUTPUT_BIAS.into(), "lm_head.bias".into(), s.vocab));
}

/// The `phimoe.*` keys beyond the common ones.
pub fn write_metadata(e: &PhiExtras, arch: &str, m: &mut Metadata) {
    let k = |key: &str| keys::arch_key(arch, key);
    let list = |v: &[f32]| MetaValue::Array {
        elem_type: 6, // GGUF's float32
        items: v.iter().map(|&x| MetaValue::F32(x)).collect(),
    };
    m.set(&k(keys::EXPERT_ROUTER_JITTER), MetaValue::F32(e.jitter_eps));
    let ctx = u32::try_from(e.original_context).unwrap_or(u32::MAX);
    m.set(&k(keys::ROPE_SCALING_ORIG_CTX), MetaValue::U32(ctx));
    m.set(&k(keys::ROPE_SHORT_FACTOR), list(&e.short_factor));
    m.set(&k(keys::ROPE_LONG_FACTOR), list(&e.long_factor));
    m.set(&k(keys::ROPE_SHORT_MSCALE), MetaValue::F32(e.short_mscale));
    m.set(&k(keys::ROPE_LONG_MSCALE), MetaValue::F32(e.long_mscale));
}
