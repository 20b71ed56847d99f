//! Dense weights as views into the mmap of a .hob file. Norms are copied to f32 (they are tiny).

use super::config::{Architecture, QkNorm};
use super::{ModelConfig, ModelError};
use crate::format::keys::{self, blk};
use crate::format::{HobFile, TensorType};
use crate::quant::Matrix;

pub struct LayerWeights<'f> {
    pub attn_norm: Vec<f32>,
    /// (n_heads * head_dim, hidden)
    pub wq: Matrix<'f>,
    /// (n_kv_heads * head_dim, hidden)
    pub wk: Matrix<'f>,
    /// (n_kv_heads * head_dim, hidden)
    pub wv: Matrix<'f>,
    /// (hidden, n_heads * head_dim)
    pub wo: Matrix<'f>,
    pub ffn_norm: Vec<f32>,
    /// (n_experts, hidden); None in a dense layer.
    pub router: Option<Matrix<'f>>,
    /// A dense layer's MLP (GLM-4.5's leading layers), in place of the experts.
    pub mlp: Option<Mlp<'f>>,
    /// QK-norm weights of q and k ([head_dim] each, or [q_dim] and [kv_dim]), where the
    /// architecture has them.
    pub qk_norm: Option<[Vec<f32>; 2]>,
    /// Biases of q, k and v, where the architecture has them.
    pub qkv_bias: Option<[Vec<f32>; 3]>,
    /// The shared expert, where the architecture has one.
    pub shared: Option<SharedExpert<'f>>,
    /// LayerNorm biases of attn_norm and ffn_norm (Phi-3.5-MoE).
    pub norm_biases: Option<[Vec<f32>; 2]>,
    /// The attention output's bias (Phi-3.5-MoE, gpt-oss).
    pub o_bias: Option<Vec<f32>>,
    /// Each head's attention sink logit ([n_heads], gpt-oss).
    pub sinks: Option<Vec<f32>>,
    /// The router's bias ([n_experts], gpt-oss).
    pub router_bias: Option<Vec<f32>>,
    /// The routed experts' biases (gpt-oss).
    pub expert_biases: Option<std::sync::Arc<ExpertBiases>>,
    /// The score-correction bias the router picks experts by ([n_experts], GLM-4.5).
    pub score_bias: Option<Vec<f32>>,
    /// Multi-head latent attention's weights beyond wq (q, or q_b after `q_a`), wk = wv (the
    /// latent and RoPE key, kv_a_mqa) and wo (DeepSeek-V2).
    pub mla: Option<MlaWeights<'f>>,
}

/// MLA's per-layer weights besides wq, wk and wo (`config::Mla` has the shapes).
pub struct MlaWeights<'f> {
    /// q's bottleneck (q_lora, hidden) and its RMSNorm, where q has one.
    pub q_a: Option<(Matrix<'f>, Vec<f32>)>,
    /// The latent's RMSNorm ([kv_lora]).
    pub kv_a_norm: Vec<f32>,
    /// Each head's q_nope -> latent map: (heads * kv_lora, nope).
    pub k_b: Matrix<'f>,
    /// Each head's latent -> value map: (heads * v, kv_lora).
    pub v_b: Matrix<'f>,
}

/// Biases of every routed expert of a layer, kept with the dense weights (they are small):
/// gate and up [n_experts, ffn], down [n_experts, hidden].
pub struct ExpertBiases {
    pub n_experts: usize,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

/// A SwiGLU MLP: down(silu(gate · x) * (up · x)).
pub struct Mlp<'f> {
    /// (ffn, hidden)
    pub gate: Matrix<'f>,
    /// (ffn, hidden)
    pub up: Matrix<'f>,
    /// (hidden, ffn)
    pub down: Matrix<'f>,
}

/// An MLP every token runs beside its routed experts, scaled by sigmoid(gate_inp · x) where it
/// has that gate (Qwen2-MoE's; GLM-4.5's has none).
pub struct SharedExpert<'f> {
    pub mlp: Mlp<'f>,
    /// (1, hidden)
    pub gate_inp: Option<Matrix<'f>>,
}

pub struct Weights<'f> {
    /// (vocab, hidden)
    pub token_embd: Matrix<'f>,
    pub layers: Vec<LayerWeights<'f>>,
    pub output_norm: Vec<f32>,
    /// (vocab, hidden); the embedding itself when tied.
    pub output: Matrix<'f>,
    /// The output norm's LayerNorm bias and the output head's bias (Phi-3.5-MoE).
    pub output_biases: Option<[Vec<f32>; 2]>,
}

impl<'f> Weights<'f> {
    pub fn load(file: &'f HobFile, cfg: &ModelConfig) -> Result<Weights<'f>, ModelError> {
        let mat = |name: &str, rows: usize, cols: usize| matrix(file, name, rows, cols);
        let norm = |name: &str| vector(file, name, cfg.hidden);
        let h = cfg.hidden;
        let layers = (0..cfg.n_layers)
            .map(|l| layer(file, cfg, l))
            .collect::<Result<Vec<_>, ModelError>>()?;
        let token_embd = mat(keys::TOKEN_EMBD, cfg.vocab, h)?;
        let output = if cfg.tie_embeddings {
            token_embd
        } else {
            mat(keys::OUTPUT, cfg.vocab, h)?
        };
        Ok(Weights {
            token_embd,
            layers,
            output_norm: norm(keys::OUTPUT_NORM)?,
            output,
            output_biases: match cfg.arch.layer_norm_and_output_biases() {
                false => None,
                true => Some([
                    norm(keys::OUTPUT_NORM_BIAS)?,
                    vector(file, keys::OUTPUT_BIAS, cfg.vocab)?,
                ]),
            },
        })
    }

    /// Every dense matrix (all but the routed experts), in load order: what a backend keeps
    /// resident. The embedding appears twice where the output head is tied to it.
    pub fn matrices(&self) -> Vec<&Matrix<'f>> {
        let mut m = vec![&self.token_embd, &self.output];
        for l in &self.layers {
            m.extend([&l.wq, &l.wk, &l.wv, &l.wo]);
            if let Some(a) = &l.mla {
                m.extend(a.q_a.iter().map(|(q, _)| q));
                m.extend([&a.k_b, &a.v_b]);
            }
            m.extend(&l.router);
            let mlps = l.mlp.iter().chain(l.shared.iter().map(|sh| &sh.mlp));
            m.extend(mlps.flat_map(|p| [&p.gate, &p.up, &p.down]));
            m.extend(l.shared.iter().flat_map(|sh| &sh.gate_inp));
        }
        m
    }

    /// MLA's per-head maps (k_b, v_b of every layer), also in `matrices`.
    pub fn mla_maps(&self) -> Vec<&Matrix<'f>> {
        let maps = self.layers.iter().flat_map(|l| &l.mla);
        maps.flat_map(|a| [&a.k_b, &a.v_b]).collect()
    }

    /// Every f32 vector: norms, QK-norms and biases.
    pub fn vectors(&self) -> Vec<&[f32]> {
        let mut v = vec![&self.output_norm[..]];
        v.extend(self.output_biases.iter().flatten().map(|b| &b[..]));
        for l in &self.layers {
            v.extend([&l.attn_norm[..], &l.ffn_norm[..]]);
            let extra = [
                &l.qk_norm.as_ref().map(|a| &a[..]),
                &l.qkv_bias.as_ref().map(|a| &a[..]),
            ];
            v.extend(
                extra
                    .into_iter()
                    .flatten()
                    .flat_map(|a| a.iter().map(|b| &b[..])),
            );
            v.extend(l.norm_biases.iter().flatten().map(|b| &b[..]));
            v.extend(
                [&l.o_bias, &l.sinks, &l.router_bias, &l.score_bias]
                    .into_iter()
                    .flatten()
                    .map(|b| &b[..]),
            );
            if let Some(e) = &l.expert_biases {
                v.extend([&e.gate[..], &e.up[..], &e.down[..]]);
            }
            if let Some(a) = &l.mla {
                v.push(&a.kv_a_norm[..]);
                v.extend(a.q_a.iter().map(|(_, n)| &n[..]));
            }
        }
        v
    }
}

/// Layer `l`'s weights: attention, then a dense MLP or the MoE block's router, shared expert
/// and biases.
fn layer<'f>(
    file: &'f HobFile,
    cfg: &ModelConfig,
    l: usize,
) -> Result<LayerWeights<'f>, ModelError> {
    let mat = |name: &str, rows: usize, cols: usize| matrix(file, &blk(l, name), rows, cols);
    let vec_of = |name: &str, n: usize| vector(file, &blk(l, name), n);
    let (h, q, kv, ne) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.n_experts);
    let mlp = |(g, u, d): (&str, &str, &str), f: usize| -> Result<Mlp<'f>, ModelError> {
        Ok(Mlp {
            gate: mat(g, f, h)?,
            up: mat(u, f, h)?,
            down: mat(d, h, f)?,
        })
    };
    let moe = cfg.moe_index(l).is_some();
    let [(q_name, q_shape), (k_name, k_shape), (v_name, _), (_, o_shape)] = attention_matrices(cfg);
    let gpt_oss = cfg.arch.sinks_and_expert_biases() && moe;
    let per_moe = |name: &str, n: usize| moe.then(|| vec_of(name, n)).transpose();
    Ok(LayerWeights {
        attn_norm: vec_of(keys::ATTN_NORM, h)?,
        wq: mat(q_name, q_shape.0, q_shape.1)?,
        wk: mat(k_name, k_shape.0, k_shape.1)?,
        wv: mat(v_name, k_shape.0, k_shape.1)?,
        wo: mat(keys::ATTN_OUTPUT, o_shape.0, o_shape.1)?,
        ffn_norm: vec_of(keys::FFN_NORM, h)?,
        router: moe.then(|| mat(keys::FFN_GATE_INP, ne, h)).transpose()?,
        mlp: match moe {
            true => None,
            false => Some(mlp(
                (keys::FFN_GATE, keys::FFN_UP, keys::FFN_DOWN),
                cfg.dense_ffn,
            )?),
        },
        qk_norm: match cfg.qk_norm {
            None => None,
            Some(QkNorm::PerHead) => Some([
                vec_of(keys::ATTN_Q_NORM, cfg.head_dim)?,
                vec_of(keys::ATTN_K_NORM, cfg.head_dim)?,
            ]),
            Some(QkNorm::Whole) => Some([
                vec_of(keys::ATTN_Q_NORM, q)?,
                vec_of(keys::ATTN_K_NORM, kv)?,
            ]),
        },
        qkv_bias: match cfg.arch.attention_bias() {
            false => None,
            true => Some([
                vec_of(keys::ATTN_Q_BIAS, q)?,
                vec_of(keys::ATTN_K_BIAS, kv)?,
                vec_of(keys::ATTN_V_BIAS, kv)?,
            ]),
        },
        shared: match (cfg.shared_ffn, moe) {
            (Some(f), true) => Some(SharedExpert {
                mlp: mlp(
                    (
                        keys::FFN_GATE_SHEXP,
                        keys::FFN_UP_SHEXP,
                        keys::FFN_DOWN_SHEXP,
                    ),
                    f,
                )?,
                gate_inp: cfg
                    .arch
                    .shared_expert_gate()
                    .then(|| mat(keys::FFN_GATE_INP_SHEXP, 1, h))
                    .transpose()?,
            }),
            _ => None,
        },
        norm_biases: match cfg.arch.layer_norm_and_output_biases() {
            false => None,
            true => Some([
                vec_of(keys::ATTN_NORM_BIAS, h)?,
                vec_of(keys::FFN_NORM_BIAS, h)?,
            ]),
        },
        o_bias: match cfg.arch.layer_norm_and_output_biases() || cfg.arch.output_proj_bias() {
            false => None,
            true => Some(vec_of(keys::ATTN_OUTPUT_BIAS, h)?),
        },
        sinks: cfg
            .arch
            .sinks_and_expert_biases()
            .then(|| vec_of(keys::ATTN_SINKS, cfg.n_heads))
            .transpose()?,
        router_bias: match gpt_oss {
            true => per_moe(keys::FFN_GATE_INP_BIAS, ne)?,
            false => None,
        },
        expert_biases: match gpt_oss {
            false => None,
            true => Some(std::sync::Arc::new(ExpertBiases {
                n_experts: ne,
                gate: table(file, &blk(l, keys::FFN_GATE_EXPS_BIAS), ne, cfg.ffn)?,
                up: table(file, &blk(l, keys::FFN_UP_EXPS_BIAS), ne, cfg.ffn)?,
                down: table(file, &blk(l, keys::FFN_DOWN_EXPS_BIAS), ne, h)?,
            })),
        },
        score_bias: match (cfg.grouped, cfg.arch) {
            (Some(_), Architecture::Glm4Moe) => per_moe(keys::FFN_EXP_PROBS_B, ne)?,
            (Some(g), Architecture::DeepseekV2) if !g.softmax => {
                per_moe(keys::FFN_EXP_PROBS_B, ne)?
            }
            _ => None,
        },
        mla: cfg.mla.map(|m| mla_weights(file, cfg, l, m)).transpose()?,
    })
}

/// Names and shapes of wq, wk, wv and wo: plain GQA's, or MLA's q (or q_b), kv_a (as wk and
/// wv) and output.
fn attention_matrices(cfg: &ModelConfig) -> [(&'static str, (usize, usize)); 4] {
    let (h, q, kv) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim());
    let Some(m) = cfg.mla else {
        return [
            (keys::ATTN_Q, (q, h)),
            (keys::ATTN_K, (kv, h)),
            (keys::ATTN_V, (kv, h)),
            (keys::ATTN_OUTPUT, (h, q)),
        ];
    };
    let (q_name, q_in) = match m.q_lora {
        0 => (keys::ATTN_Q, h),
        r => (keys::ATTN_Q_B, r),
    };
    let latent = (keys::ATTN_KV_A_MQA, (m.kv_lora + m.rope, h));
    [
        (q_name, (cfg.n_heads * (m.nope + m.rope), q_in)),
        latent,
        latent,
        (keys::ATTN_OUTPUT, (h, cfg.n_heads * m.v)),
    ]
}

/// Layer `l`'s MLA weights beyond wq, wk, wv and wo.
fn mla_weights<'f>(
    file: &'f HobFile,
    cfg: &ModelConfig,
    l: usize,
    m: super::config::Mla,
) -> Result<MlaWeights<'f>, ModelError> {
    let mat = |name: &str, rows: usize, cols: usize| matrix(file, &blk(l, name), rows, cols);
    let vec_of = |name: &str, n: usize| vector(file, &blk(l, name), n);
    Ok(MlaWeights {
        q_a: match m.q_lora {
            0 => None,
            r => Some((
                mat(keys::ATTN_Q_A, r, cfg.hidden)?,
                vec_of(keys::ATTN_Q_A_NORM, r)?,
            )),
        },
        kv_a_norm: vec_of(keys::ATTN_KV_A_NORM, m.kv_lora)?,
        k_b: mat(keys::ATTN_K_B, cfg.n_heads * m.kv_lora, m.nope)?,
        v_b: mat(keys::ATTN_V_B, cfg.n_heads * m.v, m.kv_lora)?,
    })
}

fn matrix<'f>(
    file: &'f HobFile,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Matrix<'f>, ModelError> {
    let t = file
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor { name: name.into() })?;
    if t.info.shape != [rows, cols] {
        return Err(ModelError::TensorShape {
            name: name.into(),
            expected: vec![rows, cols],
            found: t.info.shape.clone(),
        });
    }
    let found = t.info.dtype.name();
    Matrix::from_tensor(t).map_err(|problem| ModelError::TensorType {
        name: name.into(),
        found,
        problem,
    })
}

fn vector(file: &HobFile, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
    floats(file, name, &[n])
}

/// A [rows, cols] float tensor as f32, row-major (the experts' biases).
fn table(file: &HobFile, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>, ModelError> {
    floats(file, name, &[rows, cols])
}

fn floats(file: &HobFile, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
    let t = file
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor { name: name.into() })?;
    if t.info.shape != shape {
        return Err(ModelError::TensorShape {
            name: name.into(),
            expected: shape.to_vec(),
            found: t.info.shape.clone(),
        });
    }
    let n = shape.iter().product();
    let TensorType::Float(d) = t.info.dtype else {
        return Err(ModelError::TensorType {
            name: name.into(),
            found: t.info.dtype.name(),
            problem: "a vector must be float".into(),
        });
    };
    let mut out = vec![0.0; n];
    Matrix::dense(d, 1, n, t.data).row_to_f32(0, &mut out);
    Ok(out)
}
