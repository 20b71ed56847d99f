//! The forward pass, written once: prefill (a batch of tokens) and decode (one token) are the same
//! code with t = 1. It mirrors transformers' MixtralForCausalLM line for line:
//! embed -> per layer [RMSNorm -> q,k,v -> RoPE -> causal GQA attention -> o -> residual ->
//! RMSNorm -> router softmax, top-k, renormalize -> experts -> residual] -> RMSNorm -> lm_head.

use super::ops::{AttentionShape, Backend, ExpertExecutor, Route};
use super::weights::Weights;
use super::{ModelConfig, ModelError};
use crate::format::HobFile;

/// Which logits a forward call returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (e.g. a prompt chunk whose last position is not needed yet).
    None,
    /// The last position's: [vocab].
    Last,
    /// Every position's: [t, vocab].
    All,
}

pub struct Model<'f> {
    pub cfg: ModelConfig,
    pub file: &'f HobFile,
    w: Weights<'f>,
    /// RoPE inverse frequencies, [head_dim / 2], computed in f32 as transformers does.
    inv_freq: Vec<f32>,
}

/// Everything a sequence needs between calls: the KV cache and reusable activation buffers.
pub struct RunState {
    ctx: usize,
    pos: usize,
    /// (layer, ctx, kv_dim)
    k_cache: Vec<f32>,
    /// (layer, ctx, kv_dim)
    v_cache: Vec<f32>,
    buf: Buffers,
}

/// Activations for a batch of t tokens, grown to the largest batch seen, never per token.
#[derive(Default)]
struct Buffers {
    t: usize,
    /// (t, hidden) residual stream
    x: Vec<f32>,
    /// (t, hidden) normalized input of a block
    xn: Vec<f32>,
    /// (t, q_dim)
    q: Vec<f32>,
    /// (t, kv_dim)
    k: Vec<f32>,
    /// (t, kv_dim)
    v: Vec<f32>,
    /// (t, q_dim)
    att: Vec<f32>,
    /// (t, hidden) block output
    out: Vec<f32>,
    /// (t, n_experts)
    router: Vec<f32>,
    /// (t, top_k)
    routes: Vec<Route>,
    /// (t, vocab) or (vocab)
    logits: Vec<f32>,
}

impl RunState {
    /// Tokens in the KV cache.
    pub fn pos(&self) -> usize {
        self.pos
    }
    pub fn ctx(&self) -> usize {
        self.ctx
    }
    /// Forget the sequence (the cache is overwritten by the next tokens).
    pub fn reset(&mut self) {
        self.pos = 0;
    }
    /// Drop cached tokens past `pos` (e.g. to re-prefill from a common prefix).
    pub fn truncate(&mut self, pos: usize) {
        self.pos = self.pos.min(pos);
    }
}

impl<'f> Model<'f> {
    pub fn load(file: &'f HobFile) -> Result<Model<'f>, ModelError> {
        let cfg = ModelConfig::from_metadata(file.metadata())?;
        let (hidden, ffn) = file.expert_dims();
        if file.n_layers() != cfg.n_layers
            || file.n_experts() != cfg.n_experts
            || hidden != cfg.hidden
            || ffn != cfg.ffn
        {
            return Err(ModelError::Experts(format!(
                "table holds {} layers x {} experts of [{hidden}, {ffn}], the metadata says {} x {} of [{}, {}]",
                file.n_layers(),
                file.n_experts(),
                cfg.n_layers,
                cfg.n_experts,
                cfg.hidden,
                cfg.ffn
            )));
        }
        if file.variants().is_empty() {
            return Err(ModelError::Experts(
                "the file stores no expert variant".into(),
            ));
        }
        let w = Weights::load(file, &cfg)?;
        let d = cfg.head_dim;
        // transformers: 1 / base ** (arange(0, d, 2).float() / d), all in f32.
        let inv_freq = (0..d / 2)
            .map(|i| 1.0 / cfg.rope_theta.powf((2 * i) as f32 / d as f32))
            .collect();
        Ok(Model {
            cfg,
            file,
            w,
            inv_freq,
        })
    }

    /// A run state with a KV cache of `ctx` positions.
    pub fn new_state(&self, ctx: usize) -> Result<RunState, ModelError> {
        if ctx == 0 || ctx > self.cfg.context_length {
            return Err(ModelError::ContextFull {
                needed: ctx,
                ctx: self.cfg.context_length,
                max: self.cfg.context_length,
            });
        }
        let n = self.cfg.n_layers * ctx * self.cfg.kv_dim();
        Ok(RunState {
            ctx,
            pos: 0,
            k_cache: vec![0.0; n],
            v_cache: vec![0.0; n],
            buf: Buffers::default(),
        })
    }

    /// Run `tokens` at positions `st.pos()..`, append them to the KV cache and return the logits
    /// asked for (empty for `Logits::None`).
    pub fn forward<'s>(
        &self,
        st: &'s mut RunState,
        tokens: &[u32],
        backend: &dyn Backend,
        experts: &mut dyn ExpertExecutor,
        want: Logits,
    ) -> crate::Result<&'s [f32]> {
        let cfg = &self.cfg;
        let t = tokens.len();
        let start = st.pos;
        if start + t > st.ctx {
            return Err(ModelError::ContextFull {
                needed: start + t,
                ctx: st.ctx,
                max: cfg.context_length,
            }
            .into());
        }
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= cfg.vocab) {
            return Err(ModelError::TokenOutOfRange {
                token: bad,
                vocab: cfg.vocab,
            }
            .into());
        }
        if t == 0 {
            return Ok(&[]);
        }
        st.buf.ensure(cfg, t);
        let (h, qd, kvd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim());
        let b = &mut st.buf;

        for (i, &id) in tokens.iter().enumerate() {
            self.w
                .token_embd
                .row_to_f32(id as usize, &mut b.x[i * h..(i + 1) * h]);
        }

        for (l, lw) in self.w.layers.iter().enumerate() {
            // Attention block.
            rms_norm(
                &b.x[..t * h],
                &lw.attn_norm,
                cfg.rms_eps,
                &mut b.xn[..t * h],
            );
            backend.matmul(&lw.wq, &b.xn[..t * h], t, &mut b.q[..t * qd]);
            backend.matmul(&lw.wk, &b.xn[..t * h], t, &mut b.k[..t * kvd]);
            backend.matmul(&lw.wv, &b.xn[..t * h], t, &mut b.v[..t * kvd]);
            for i in 0..t {
                let pos = start + i;
                self.rope(&mut b.q[i * qd..(i + 1) * qd], pos);
                self.rope(&mut b.k[i * kvd..(i + 1) * kvd], pos);
            }
            let layer_cache = l * st.ctx * kvd;
            let new = layer_cache + start * kvd..layer_cache + (start + t) * kvd;
            st.k_cache[new.clone()].copy_from_slice(&b.k[..t * kvd]);
            st.v_cache[new].copy_from_slice(&b.v[..t * kvd]);
            let seen = layer_cache..layer_cache + (start + t) * kvd;
            backend.attention(
                AttentionShape {
                    n_heads: cfg.n_heads,
                    n_kv_heads: cfg.n_kv_heads,
                    head_dim: cfg.head_dim,
                    start_pos: start,
                    t,
                    window: cfg.sliding_window,
                },
                &b.q[..t * qd],
                &st.k_cache[seen.clone()],
                &st.v_cache[seen],
                &mut b.att[..t * qd],
            );
            backend.matmul(&lw.wo, &b.att[..t * qd], t, &mut b.out[..t * h]);
            add_assign(&mut b.x[..t * h], &b.out[..t * h]);

            // Mixture-of-experts block.
            rms_norm(&b.x[..t * h], &lw.ffn_norm, cfg.rms_eps, &mut b.xn[..t * h]);
            let ne = cfg.n_experts;
            backend.matmul(&lw.router, &b.xn[..t * h], t, &mut b.router[..t * ne]);
            for i in 0..t {
                route_softmax_topk(
                    &b.router[i * ne..(i + 1) * ne],
                    &mut b.routes[i * cfg.top_k..(i + 1) * cfg.top_k],
                );
            }
            experts.forward(
                l,
                &b.xn[..t * h],
                &b.routes[..t * cfg.top_k],
                &mut b.out[..t * h],
            )?;
            add_assign(&mut b.x[..t * h], &b.out[..t * h]);
        }
        st.pos += t;

        let v = cfg.vocab;
        let rows = match want {
            Logits::None => return Ok(&[]),
            Logits::Last => t - 1..t,
            Logits::All => 0..t,
        };
        let n = rows.len();
        rms_norm(
            &b.x[rows.start * h..rows.end * h],
            &self.w.output_norm,
            cfg.rms_eps,
            &mut b.xn[..n * h],
        );
        backend.matmul(&self.w.output, &b.xn[..n * h], n, &mut b.logits[..n * v]);
        Ok(&b.logits[..n * v])
    }

    /// Rotate-half RoPE (transformers' `apply_rotary_pos_emb`) on every head of `x` in place.
    fn rope(&self, x: &mut [f32], pos: usize) {
        let d = self.cfg.head_dim;
        let half = d / 2;
        for head in x.chunks_exact_mut(d) {
            for (i, &f) in self.inv_freq.iter().enumerate() {
                let angle = pos as f32 * f;
                let (sin, cos) = angle.sin_cos();
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos - b * sin;
                head[i + half] = b * cos + a * sin;
            }
        }
    }
}

impl Buffers {
    fn ensure(&mut self, cfg: &ModelConfig, t: usize) {
        if t <= self.t {
            return;
        }
        self.t = t;
        let (h, qd, kvd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim());
        self.x = vec![0.0; t * h];
        self.xn = vec![0.0; t * h];
        self.q = vec![0.0; t * qd];
        self.k = vec![0.0; t * kvd];
        self.v = vec![0.0; t * kvd];
        self.att = vec![0.0; t * qd];
        self.out = vec![0.0; t * h];
        self.router = vec![0.0; t * cfg.n_experts];
        self.routes = vec![
            Route {
                expert: 0,
                weight: 0.0
            };
            t * cfg.top_k
        ];
        self.logits = vec![0.0; t * cfg.vocab];
    }
}

/// RMSNorm per row of `x` ([t, n]): w * x / sqrt(mean(x^2) + eps), in f32 as transformers does.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (row, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, &v), &g) in o.iter_mut().zip(row).zip(w) {
            *o = g * (v * inv);
        }
    }
}

fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Mixtral routing: softmax over all router logits, keep the top-k (ties: lower index first),
/// renormalize their weights to sum to 1. `routes.len()` is k.
pub fn route_softmax_topk(logits: &[f32], routes: &mut [Route]) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    for r in routes.iter_mut() {
        *r = Route {
            expert: usize::MAX,
            weight: f32::NEG_INFINITY,
        };
    }
    for (e, &l) in logits.iter().enumerate() {
        let p = (l - max).exp() / sum;
        // Insertion into the sorted top-k; strict > keeps the lower index first on ties.
        if let Some(slot) = routes.iter().position(|r| p > r.weight) {
            routes[slot..].rotate_right(1);
            routes[slot] = Route {
                expert: e,
                weight: p,
            };
        }
    }
    let total: f32 = routes.iter().map(|r| r.weight).sum();
    for r in routes.iter_mut() {
        r.weight /= total;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_picks_top_k_and_renormalizes() {
        let mut routes = vec![
            Route {
                expert: 0,
                weight: 0.0
            };
            2
        ];
        route_softmax_topk(&[0.1, 2.0, -1.0, 1.0], &mut routes);
        assert_eq!(routes[0].expert, 1);
        assert_eq!(routes[1].expert, 3);
        let (a, b) = (2.0f32.exp(), 1.0f32.exp());
        assert!((routes[0].weight - a / (a + b)).abs() < 1e-6);
        assert!((routes[0].weight + routes[1].weight - 1.0).abs() < 1e-6);
        route_softmax_topk(&[1.0, 1.0, 1.0, 1.0], &mut routes);
        assert_eq!((routes[0].expert, routes[1].expert), (0, 1));
    }

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [1.0f32, 0.5, 2.0, 1.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &w, 1e-5, &mut out);
        let ms = (1.0 + 4.0 + 9.0 + 0.25) / 4.0;
        for i in 0..4 {
            let expect = w[i] * x[i] / (ms + 1e-5f32).sqrt();
            assert!((out[i] - expect).abs() < 1e-6);
        }
    }
}
