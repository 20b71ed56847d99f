//! GptOssForCausalLM (gpt-oss-20b, gpt-oss-120b): what its config adds to the common fields
//! (YaRN, which layers slide, the experts' clamped SwiGLU), its extra tensors (attention biases
//! and sinks, the router's bias, the experts' biases) and its experts' layout.

use serde_json::{Map, Value};

use super::arch::{DenseTensor, Lanes, MixtralSpec, TensorRole};
use super::fields::Fields;
use super::{ExpertWeights, ImportError, TensorIndex};
use crate::format::{keys, MetaValue, Metadata};
use crate::model::yarn::Yarn;

/// gpt-oss's additions to the common hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct GptOssExtras {
    pub yarn: Yarn,
    /// Per layer: whether it attends through the sliding window (`layer_types`).
    pub sliding_layers: Vec<bool>,
    pub swiglu_alpha: f32,
    pub swiglu_limit: f32,
}

/// The spec and the extras from a GptOssForCausalLM config.json.
pub fn parse(f: &Fields) -> Result<(MixtralSpec, GptOssExtras), ImportError> {
    let unsupported = |what: &str, detail: String| ImportError::Unsupported {
        path: f.path.to_path_buf(),
        what: what.to_string(),
        detail,
    };
    // transformers 5's `rope_parameters`, or the hub's `rope_scaling` beside `rope_theta`.
    let (field, rope) = match (f.get("rope_parameters"), f.get("rope_scaling")) {
        (Some(v), _) => ("rope_parameters", v),
        (None, Some(v)) => ("rope_scaling", v),
        (None, None) => return Err(f.err("rope_scaling", "YaRN's parameters", None)),
    };
    let obj = rope
        .as_object()
        .ok_or_else(|| f.err(field, "an object", Some(rope)))?;
    let r = Fields { path: f.path, obj };
    let kind = r
        .get("rope_type")
        .or(r.get("type"))
        .and_then(|v| v.as_str());
    if kind != Some("yarn") {
        let detail = format!("found {rope}; hob runs gpt-oss with YaRN");
        return Err(unsupported(&format!("'{field}'"), detail));
    }
    for key in ["mscale", "mscale_all_dim", "partial_rotary_factor"] {
        if r.get(key).is_some_and(|v| !v.is_null()) {
            let detail = "hob's YaRN takes factor, beta_fast, beta_slow, truncate and \
                          attention_factor";
            return Err(unsupported(&format!("'{field}.{key}'"), detail.into()));
        }
    }
    let mut plain: Map<String, Value> = f.obj.clone();
    plain.remove("rope_scaling");
    if let Some(theta) = r.get("rope_theta") {
        plain.insert("rope_theta".into(), theta.clone());
    }
    plain.remove("rope_parameters");
    let common = Fields {
        path: f.path,
        obj: &plain,
    };
    let spec = MixtralSpec::parse(&common, "num_local_experts", "intermediate_size")?;
    if !f.bool_or("attention_bias", true)? {
        let detail = "hob runs gpt-oss with attention biases".to_string();
        return Err(unsupported("'attention_bias'", detail));
    }
    let factor = r.f32("factor")?;
    let original_context = match r.opt_usize("original_max_position_embeddings")? {
        Some(n) => n,
        None => f.usize("original_max_position_embeddings")?,
    };
    let opt = |name: &str, default: f64| -> Result<f32, ImportError> {
        Ok(r.opt_f64(name)?.unwrap_or(default) as f32)
    };
    let yarn = Yarn {
        factor,
        original_context,
        beta_fast: opt("beta_fast", 32.0)?,
        beta_slow: opt("beta_slow", 1.0)?,
        truncate: r.bool_or("truncate", true)?,
        attention_factor: match r.opt_f64("attention_factor")? {
            Some(a) => a as f32,
            None => Yarn::default_attention_factor(factor),
        },
    };
    let extras = GptOssExtras {
        yarn,
        sliding_layers: sliding_layers(f, spec.n_layers)?,
        swiglu_alpha: f.opt_f64("swiglu_alpha")?.unwrap_or(1.702) as f32,
        swiglu_limit: f.opt_f64("swiglu_limit")?.unwrap_or(7.0) as f32,
    };
    Ok((spec, extras))
}

/// `layer_types` ("sliding_attention" / "full_attention" per layer); absent, transformers'
/// default: sliding and full alternating, sliding first.
fn sliding_layers(f: &Fields, n_layers: usize) -> Result<Vec<bool>, ImportError> {
    let Some(v) = f.get("layer_types") else {
        return Ok((0..n_layers).map(|l| l % 2 == 0).collect());
    };
    let expected = format!("a list of {n_layers} \"sliding_attention\" or \"full_attention\"");
    let list = v
        .as_array()
        .filter(|a| a.len() == n_layers)
        .ok_or_else(|| f.err("layer_types", &expected, Some(v)))?;
    list.iter()
        .map(|t| match t.as_str() {
            Some("sliding_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            _ => Err(f.err("layer_types", &expected, Some(v))),
        })
        .collect()
}

/// Attention biases and sinks, the router's bias and the experts' biases (gate and up taken
/// from the interleaved `gate_up_proj_bias`), after the common tensors.
pub fn add_tensors(s: &MixtralSpec, out: &mut Vec<DenseTensor>) {
    let (h, q, kv) = (s.hidden, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let (ne, f) = (s.n_experts, s.ffn);
    for l in 0..s.n_layers {
        let hf = |name: &str| format!("model.layers.{l}.{name}");
        for (hob, name, shape) in [
            (keys::ATTN_Q_BIAS, "self_attn.q_proj.bias", vec![q]),
            (keys::ATTN_K_BIAS, "self_attn.k_proj.bias", vec![kv]),
            (keys::ATTN_V_BIAS, "self_attn.v_proj.bias", vec![kv]),
            (keys::ATTN_OUTPUT_BIAS, "self_attn.o_proj.bias", vec![h]),
            (keys::ATTN_SINKS, "self_attn.sinks", vec![s.n_heads]),
            (keys::FFN_GATE_INP_BIAS, "mlp.router.bias", vec![ne]),
            (
                keys::FFN_DOWN_EXPS_BIAS,
                "mlp.experts.down_proj_bias",
                vec![ne, h],
            ),
        ] {
            out.push(DenseTensor::new(
                keys::blk(l, hob),
                hf(name),
                shape,
                TensorRole::Norm,
            ));
        }
        for (hob, lanes) in [
            (keys::FFN_GATE_EXPS_BIAS, Lanes::Even),
            (keys::FFN_UP_EXPS_BIAS, Lanes::Odd),
        ] {
            let mut t = DenseTensor::new(
                keys::blk(l, hob),
                hf("mlp.experts.gate_up_proj_bias"),
                vec![ne, f],
                TensorRole::Norm,
            );
            t.lanes = lanes;
            out.push(t);
        }
    }
}

/// The `gpt-oss.*` keys beyond the common ones.
pub fn write_metadata(e: &GptOssExtras, arch: &str, m: &mut Metadata) {
    let k = |key: &str| keys::arch_key(arch, key);
    e.yarn.write_metadata(arch, m);
    let layers = e
        .sliding_layers
        .iter()
        .map(|&s| MetaValue::U32(u32::from(s)))
        .collect();
    m.set(
        &k(keys::SLIDING_WINDOW_LAYERS),
        MetaValue::Array {
            elem_type: 4, // GGUF's uint32
            items: layers,
        },
    );
    m.set(
        &k(keys::EXPERT_SWIGLU_ALPHA),
        MetaValue::F32(e.swiglu_alpha),
    );
    m.set(
        &k(keys::EXPERT_SWIGLU_LIMIT),
        MetaValue::F32(e.swiglu_limit),
    );
}

fn experts_name(layer: usize, w: &str) -> String {
    format!("model.layers.{layer}.mlp.experts.{w}")
}

/// Check the experts' tensors: `gate_up_proj` [E, hidden, 2 * ffn] (gate and up columns
/// interleaved) and `down_proj` [E, ffn, hidden], both transposed from nn.Linear's layout.
pub fn check_experts(s: &MixtralSpec, index: &TensorIndex) -> Result<(), ImportError> {
    let (ne, h, f) = (s.n_experts, s.hidden, s.ffn);
    for l in 0..s.n_layers {
        if index.contains(&experts_name(l, "gate_up_proj_blocks")) {
            return Err(ImportError::Unsupported {
                path: index.searched().into(),
                what: "MXFP4 experts (gate_up_proj_blocks)".into(),
                detail: "hob reads gpt-oss checkpoints with dequantized experts (bf16 or f16) \
                         for now"
                    .into(),
            });
        }
        index.check(&experts_name(l, "gate_up_proj"), &[ne, h, 2 * f])?;
        index.check(&experts_name(l, "down_proj"), &[ne, f, h])?;
    }
    Ok(())
}

/// One expert's matrices in nn.Linear's layout: gate[i][j] = gate_up_proj[e][j][2i], up from
/// the odd columns, down[i][j] = down_proj[e][j][i].
pub fn load_expert(
    index: &TensorIndex,
    (hidden, ffn): (usize, usize),
    layer: usize,
    expert: usize,
) -> Result<ExpertWeights, ImportError> {
    let (h, f) = (hidden, ffn);
    let (mut gu, mut dn) = (Vec::new(), Vec::new());
    let m = h * 2 * f;
    index.load_range_into(
        &experts_name(layer, "gate_up_proj"),
        expert * m..(expert + 1) * m,
        &mut gu,
    )?;
    index.load_range_into(
        &experts_name(layer, "down_proj"),
        expert * f * h..(expert + 1) * f * h,
        &mut dn,
    )?;
    let mut w = ExpertWeights {
        gate: vec![0.0; f * h],
        up: vec![0.0; f * h],
        down: vec![0.0; h * f],
    };
    for (j, row) in gu.chunks_exact(2 * f).enumerate() {
        for i in 0..f {
            w.gate[i * h + j] = row[2 * i];
            w.up[i * h + j] = row[2 * i + 1];
        }
    }
    for (j, row) in dn.chunks_exact(h).enumerate() {
        for (i, &v) in row.iter().enumerate() {
            w.down[i * f + j] = v;
        }
    }
    Ok(w)
}
