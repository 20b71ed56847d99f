//! GptOssForCausalLM (gpt-oss-20b, gpt-oss-120b): what its config adds to the common fields
//! (YaRN, which layers slide, the experts' clamped SwiGLU), its extra tensors (attention biases
//! and sinks, the router's bias, the experts' biases) and its experts' layout.

use super::arch::{DenseTensor, Lanes, MixtralSpec, TensorRole};
use super::fields::Fields;
use super::mxfp4::Mxfp4Matrix;
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
    let scaling = f.rope_scaling("yarn", "gpt-oss")?;
    let (field, plain) = (scaling.field, scaling.common);
    let r = Fields {
        path: f.path,
        obj: scaling.obj,
    };
    for key in ["mscale", "mscale_all_dim", "partial_rotary_factor"] {
        if r.get(key).is_some_and(|v| !v.is_null()) {
            let detail = "hob's YaRN takes factor, beta_fast, beta_slow, truncate and \
                          attention_factor";
            return Err(unsupported(&format!("'{field}.{key}'"), detail.into()));
        }
    }
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

/// Check the experts' tensors, and say whether they are MXFP4: either `gate_up_proj` [E, hidden,
/// 2 * ffn] (gate and up columns interleaved) and `down_proj` [E, ffn, hidden], both transposed
/// from nn.Linear's layout; or, as the hub stores gpt-oss, their MXFP4 form in nn.Linear's
/// layout: `gate_up_proj_blocks` [E, 2 * ffn, hidden / 32, 16] and `_scales` [E, 2 * ffn,
/// hidden / 32] (gate and up rows interleaved), `down_proj_blocks` [E, hidden, ffn / 32, 16].
pub fn check_experts(s: &MixtralSpec, index: &TensorIndex) -> Result<bool, ImportError> {
    let (ne, h, f) = (s.n_experts, s.hidden, s.ffn);
    let mxfp4 = index.contains(&experts_name(0, "gate_up_proj_blocks"));
    for l in 0..s.n_layers {
        if !mxfp4 {
            index.check(&experts_name(l, "gate_up_proj"), &[ne, h, 2 * f])?;
            index.check(&experts_name(l, "down_proj"), &[ne, f, h])?;
            continue;
        }
        if h % 32 != 0 || f % 32 != 0 {
            return Err(ImportError::Unsupported {
                path: index.searched().into(),
                what: "MXFP4 experts".into(),
                detail: format!("hidden {h} and ffn {f} must be multiples of 32"),
            });
        }
        for (w, rows, cols) in [("gate_up_proj", 2 * f, h), ("down_proj", h, f)] {
            let name = experts_name(l, w);
            index.check_u8(&format!("{name}_blocks"), &[ne, rows, cols / 32, 16])?;
            index.check_u8(&format!("{name}_scales"), &[ne, rows, cols / 32])?;
        }
    }
    Ok(mxfp4)
}

/// OCP MXFP4's e2m1 values, by 4-bit code.
const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Expert `expert`'s [rows, cols] matrix from MXFP4 tensor `name`: each 32 values of a row
/// e2m1 codes (low nibble first) times 2^(scale - 127), as transformers dequantizes them.
fn mxfp4_matrix(
    index: &TensorIndex,
    name: &str,
    expert: usize,
    (rows, cols): (usize, usize),
) -> Result<(Vec<f32>, Mxfp4Matrix), ImportError> {
    let (g, n) = (cols / 32, rows * cols);
    let blocks = index.load_u8(
        &format!("{name}_blocks"),
        expert * n / 2..(expert + 1) * n / 2,
    )?;
    let scales = index.load_u8(
        &format!("{name}_scales"),
        expert * rows * g..(expert + 1) * rows * g,
    )?;
    let mut out = Vec::with_capacity(n);
    for (block, &s) in blocks.chunks_exact(16).zip(&scales) {
        let scale = (2.0f64).powi(i32::from(s) - 127) as f32;
        for &b in block {
            out.push(E2M1[usize::from(b & 15)] * scale);
            out.push(E2M1[usize::from(b >> 4)] * scale);
        }
    }
    if let Some(first) = out.iter().position(|v| !v.is_finite()) {
        return Err(ImportError::NonFinite {
            name: format!("{name}_scales"),
            file: index.searched().into(),
            count: out.iter().filter(|v| !v.is_finite()).count(),
            first: expert * n + first,
        });
    }
    Ok((out, Mxfp4Matrix::from_hf(&blocks, &scales)))
}

/// One MXFP4 expert in nn.Linear's layout: gate from the even rows of `gate_up_proj`, up from
/// the odd ones, down as stored.
pub fn load_mxfp4_expert(
    index: &TensorIndex,
    (hidden, ffn): (usize, usize),
    layer: usize,
    expert: usize,
) -> Result<ExpertWeights, ImportError> {
    let (h, f) = (hidden, ffn);
    let (gu, gu_raw) = mxfp4_matrix(
        index,
        &experts_name(layer, "gate_up_proj"),
        expert,
        (2 * f, h),
    )?;
    let (down, down_raw) = mxfp4_matrix(index, &experts_name(layer, "down_proj"), expert, (h, f))?;
    let (mut gate, mut up) = (Vec::with_capacity(f * h), Vec::with_capacity(f * h));
    for (r, row) in gu.chunks_exact(h).enumerate() {
        if r % 2 == 0 {
            gate.extend_from_slice(row);
        } else {
            up.extend_from_slice(row);
        }
    }
    // The stored codes and exponents, split the same way (a row: h / 2 bytes, h / 32 exponents).
    let rows_of = |parity: usize| {
        let pick = |v: &[u8], w: usize| -> Vec<u8> {
            v.chunks_exact(w)
                .skip(parity)
                .step_by(2)
                .flatten()
                .copied()
                .collect()
        };
        Mxfp4Matrix {
            codes: pick(&gu_raw.codes, h / 2),
            scales: pick(&gu_raw.scales, h / 32),
        }
    };
    Ok(ExpertWeights {
        gate,
        up,
        down,
        mxfp4: Some(Box::new([rows_of(0), rows_of(1), down_raw])),
    })
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
        mxfp4: None,
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
