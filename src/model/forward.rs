//! The forward pass, written once: prefill (a batch of tokens) and decode (one token) are the same
//! code with t = 1. It mirrors transformers' MixtralForCausalLM line for line:
//! embed -> per layer [RMSNorm -> q,k,v -> RoPE -> causal GQA attention -> o -> residual ->
//! RMSNorm -> router softmax, top-k, renormalize -> experts -> residual] -> RMSNorm -> lm_head.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use super::buffers::{Buffers, MlpRoom};
use super::experts::{Batch, ExpertExecutor, ExpertFfn, MoeBlock, OnDevice};
use super::ops::MlaInputs;
use super::ops::{
    AttentionShape, AttnPrep, Backend, DecodeStep, QkvStep, Route, RouteOut, RouteReads,
};
pub use super::routing::{route_softmax_top, route_softmax_topk};
use super::weights::{LayerWeights, MlaWeights, Mlp, Weights};
use super::{ModelConfig, ModelError};
use crate::format::HobFile;
use crate::quant::Matrix;

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
    /// LongRoPE's inverse frequencies with its long factors, where the model has them.
    long_inv_freq: Option<Vec<f32>>,
}

/// Everything a sequence needs between calls: the KV cache and reusable activation buffers,
/// in the backend's memory.
pub struct RunState<B: Backend> {
    ctx: usize,
    pos: usize,
    kv: B::Kv,
    buf: Option<Buffers<B>>,
    /// Host copies: router logits (t, n_experts), routes (t, top_k), logits (t, vocab), the
    /// embedded tokens (t, hidden).
    router: Vec<f32>,
    routes: Vec<Route>,
    logits: Option<B::Host>,
    embed: Vec<f32>,
    /// Names this state's device buffers (KV cache and activations) for decode-step replay: new
    /// whenever they are allocated.
    epoch: u64,
    /// Refuse non-finite output logits (on unless a caller discards them: see `check_logits`).
    check_logits: bool,
}

/// Epochs of run states, unique in the process.
static EPOCH: AtomicU64 = AtomicU64::new(1);

fn next_epoch() -> u64 {
    EPOCH.fetch_add(1, Ordering::Relaxed)
}

/// One forward call's tokens: `t` at positions start.., and the rows whose logits it returns.
struct Pass {
    start: usize,
    t: usize,
    rows: Option<Range<usize>>,
    /// LongRoPE's long factors apply (the context is longer than the model's original one).
    long_rope: bool,
}

/// Where `Model::moe_block` is: the layer (weights, index, MoE index), its router, the norm
/// after it and the pass's tokens.
struct MoeAt<'a> {
    layer: (&'a LayerWeights<'a>, usize, usize),
    router: &'a Matrix<'a>,
    next: Option<&'a [f32]>,
    t: usize,
}

impl<B: Backend> RunState<B> {
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
    /// Whether forward refuses non-finite output logits (on by default). Off only for a caller
    /// that discards them: the scan reads memory the device just wrote, ~15 us a token at 32k
    /// vocabulary (benches/results/2026-12-01-h200-issue49.md), which a sampler pays anyway.
    pub fn check_logits(&mut self, on: bool) {
        self.check_logits = on;
    }
}

impl<'f> Model<'f> {
    /// The model in `file`: its hyper-parameters checked, its dense weights viewed and their
    /// checksums checked. Errors name the file.
    pub fn load(file: &'f HobFile) -> Result<Model<'f>, ModelError> {
        Self::load_checked(file).map_err(|e| e.in_file(file.path()))
    }

    fn load_checked(file: &'f HobFile) -> Result<Model<'f>, ModelError> {
        let cfg = ModelConfig::from_metadata(file.metadata())?;
        let (hidden, ffn) = file.expert_dims();
        if file.n_layers() != cfg.moe_layers()
            || file.n_experts() != cfg.n_experts
            || hidden != cfg.hidden
            || ffn != cfg.ffn
        {
            return Err(ModelError::Experts(format!(
                "table holds {} layers x {} experts of [{hidden}, {ffn}], the metadata says {} x {} of [{}, {}]",
                file.n_layers(),
                file.n_experts(),
                cfg.moe_layers(),
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
        file.verify_dense_with(crate::format::crc_parallel)
            .map_err(ModelError::Data)?;
        let (d, rd) = (cfg.head_dim, cfg.rope_dim);
        // transformers: 1 / (factor * base ** (arange(0, d, 2).float() / d)), all in f32; the
        // factors are LongRoPE's (short, and long in long_inv_freq) or 1. With partial rotary,
        // d is the rotated part's and the other pairs turn by 0 (ModelConfig::rope_dim).
        let freqs = |factors: Option<&[f32]>| -> Vec<f32> {
            (0..d / 2)
                .map(|i| match i < rd / 2 {
                    true => {
                        let f = factors.map_or(1.0, |f| f[i]);
                        1.0 / (f * cfg.rope_theta.powf((2 * i) as f32 / rd as f32))
                    }
                    false => 0.0,
                })
                .collect()
        };
        let inv_freq = match &cfg.yarn {
            // Over the rotated part (MLA's RoPE key), turning the rest by 0.
            Some(y) => {
                let mut f = y.inv_freq(cfg.rope_theta, rd);
                f.resize(d / 2, 0.0);
                f
            }
            None => freqs(cfg.long_rope.as_ref().map(|r| &r.short_factor[..])),
        };
        let long_inv_freq = cfg.long_rope.as_ref().map(|r| freqs(Some(&r.long_factor)));
        Ok(Model {
            cfg,
            file,
            w,
            inv_freq,
            long_inv_freq,
        })
    }

    /// The dense weights (for a device backend to make resident).
    pub fn weights(&self) -> &Weights<'f> {
        &self.w
    }

    /// RoPE's inverse frequencies: the one table, and LongRoPE's long one where it has one.
    pub fn rope_tables(&self) -> Vec<&[f32]> {
        std::iter::once(&self.inv_freq[..])
            .chain(self.long_inv_freq.as_deref())
            .collect()
    }

    /// RoPE inverse frequencies, [head_dim / 2].
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// A run state with a KV cache of `ctx` positions in `backend`'s memory.
    pub fn new_state<B: Backend>(&self, backend: &B, ctx: usize) -> crate::Result<RunState<B>> {
        if ctx == 0 || ctx > self.cfg.context_length {
            return Err(ModelError::ContextFull {
                needed: ctx,
                ctx: self.cfg.context_length,
                max: self.cfg.context_length,
            }
            .in_file(self.file.path())
            .into());
        }
        Ok(RunState {
            ctx,
            pos: 0,
            kv: backend.alloc_kv(
                self.cfg.n_layers,
                ctx,
                self.cfg.kv_dim(),
                self.cfg.values_are_keys(),
            )?,
            buf: None,
            router: Vec::new(),
            routes: Vec::new(),
            logits: None,
            embed: Vec::new(),
            epoch: next_epoch(),
            check_logits: true,
        })
    }

    /// Run `tokens` at positions `st.pos()..`, append them to the KV cache and return the logits
    /// asked for (empty for `Logits::None`).
    pub fn forward<'s, B: Backend>(
        &self,
        st: &'s mut RunState<B>,
        tokens: &[u32],
        backend: &B,
        experts: &mut dyn ExpertExecutor<B>,
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
            .in_file(self.file.path())
            .into());
        }
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= cfg.vocab) {
            return Err(ModelError::TokenOutOfRange {
                token: bad,
                vocab: cfg.vocab,
            }
            .in_file(self.file.path())
            .into());
        }
        if t == 0 {
            return Ok(&[]);
        }
        if st.buf.as_ref().is_none_or(|b| b.t < t) {
            st.buf = Some(Buffers::new(backend, cfg, t)?);
            st.epoch = next_epoch();
        }
        let (ne, k) = (cfg.n_experts, cfg.top_k);
        let Some(b) = st.buf.as_mut() else {
            unreachable!("buffers are allocated above")
        };

        // A decode token may be embedded by the step's launches (so that a recorded step replays
        // with each token's own row).
        let staged = t == 1 && backend.stage_token(&self.w.token_embd, tokens[0], start)?;
        if !staged {
            backend.embed(&self.w.token_embd, tokens, &mut b.x, &mut st.embed)?;
        }
        st.router.resize(t * ne, 0.0);
        st.routes.resize(
            t * k,
            Route {
                expert: 0,
                weight: 0.0,
            },
        );

        let rows = match want {
            Logits::None => None,
            Logits::Last => Some(t - 1..t),
            Logits::All => Some(0..t),
        };
        // A decode token that never leaves the device may be recorded once and replayed.
        let key = st.epoch * 2 + u64::from(rows.is_some());
        let step = if t == 1 && experts.decode_on_device(backend)? {
            backend.decode_step(key, start)?
        } else {
            DecodeStep::Direct
        };
        let mut run = |now: bool| {
            experts.launches_run_now(now);
            if staged {
                backend.embed_staged(&self.w.token_embd, &mut b.x)?;
            }
            let pass = Pass {
                start,
                t,
                rows: rows.clone(),
                long_rope: cfg
                    .long_rope
                    .as_ref()
                    .is_some_and(|r| st.ctx > r.original_context),
            };
            let host = (&mut st.routes[..], &mut st.router);
            self.layers_and_head(b, &mut st.kv, host, &pass, (backend, &mut *experts))
        };
        match step {
            DecodeStep::Replayed => {}
            DecodeStep::Direct => run(true)?,
            DecodeStep::Recording => {
                // Nothing recorded has run yet: where the recording is refused, run directly.
                let recorded = run(false);
                if !backend.record_end(key, recorded)? {
                    run(true)?;
                }
            }
        }
        st.pos += t;
        experts.end_forward(backend)?;
        let Some(rows) = rows else {
            experts.after_forward(backend)?;
            return Ok(&[]);
        };
        let n = rows.len() * cfg.vocab;
        if st.logits.as_ref().is_none_or(|h| h.len() < n) {
            st.logits = None;
            st.logits = Some(backend.alloc_host(n)?);
        }
        let Some(host) = st.logits.as_mut() else {
            unreachable!("allocated above")
        };
        backend.download_host(&b.logits, host, n)?;
        let finite = !st.check_logits || all_finite(&host[..n]);
        // Routes read back here first: a layer's non-finite router logits name that layer.
        experts.after_forward(backend)?;
        if !finite {
            return Err(ModelError::non_finite(self.file.path(), None, "output logits").into());
        }
        Ok(&host[..n])
    }

    /// Routes as the backend computed them from layer `layer`'s router logits: a non-finite
    /// logit leaves a NaN gate weight (route_softmax_topk, the device's routing read back),
    /// which is an error naming the layer, not an expert index out of range later.
    fn check_routes(&self, layer: usize, routes: &[Route]) -> crate::Result<()> {
        let ne = self.cfg.n_experts;
        if routes.iter().all(|r| r.expert < ne && r.weight.is_finite()) {
            return Ok(());
        }
        let what = "router logits";
        Err(ModelError::non_finite(self.file.path(), Some(layer), what).into())
    }

    /// x += an MLP of the normalized input xn: down(silu(gate · xn) * (up · xn)), scaled by
    /// sigmoid(g · xn) where the MLP has a gate g (Qwen2-MoE's shared expert). A shared expert
    /// beside the routed ones, or a dense layer's MLP.
    fn mlp<B: Backend>(
        &self,
        (mlp, g): (&Mlp<'_>, Option<&Matrix<'_>>),
        (xn, x): (&B::Buf, &mut B::Buf),
        room: &mut MlpRoom<'_, B>,
        t: usize,
        backend: &B,
    ) -> crate::Result<()> {
        let gate = match g {
            Some(g) => {
                backend.matmul(g, xn, t, room.logit)?;
                Some(&*room.logit)
            }
            None => None,
        };
        let hidden = [&mut *room.gate, &mut *room.up];
        backend.mlp_hidden([&mlp.gate, &mlp.up], xn, t, hidden, gate)?;
        backend.matmul_add(&mlp.down, room.gate, t, room.out, x)
    }

    /// MLA's attention inputs (q ends in b.att: true): q straight from b.xn or through its
    /// bottleneck, the latent and RoPE key (kv_a), then `Backend::mla_inputs`.
    fn mla_inputs<B: Backend>(
        &self,
        b: &mut Buffers<B>,
        lw: &LayerWeights<'_>,
        m: &MlaWeights<'_>,
        (step, q_scale): (&QkvStep<'_>, f32),
        kv: &mut B::Kv,
        backend: &B,
    ) -> crate::Result<bool> {
        let (t, cfg) = (step.t, &self.cfg);
        let shape = cfg
            .mla
            .ok_or_else(|| crate::Error::Invalid("MLA weights without MLA shapes".into()))?;
        // kv_a first: its few rows' blocks start before the larger product's.
        match &m.q_a {
            Some((q_a, norm)) => {
                let out = [&mut b.v, &mut b.mla_q];
                backend.matmul_pair([&lw.wk, q_a], &b.xn, t, out)?;
                backend.rms_norm(&b.mla_q, 0..t, norm, cfg.rms_eps, &mut b.mla_qn)?;
                backend.matmul(&lw.wq, &b.mla_qn, t, &mut b.q)?;
            }
            None => backend.matmul_pair([&lw.wk, &lw.wq], &b.xn, t, [&mut b.v, &mut b.q])?,
        }
        let w = MlaInputs {
            shape,
            heads: cfg.n_heads,
            kv_norm: &m.kv_a_norm,
            eps: cfg.rms_eps,
            k_b: &m.k_b,
            q_scale,
        };
        backend.mla_inputs((&b.q, &b.v), &w, step, (&mut b.k, &mut b.att), kv)?;
        Ok(true)
    }

    /// The attention block's q, k and v from b.xn (biases added where the architecture has
    /// them), RoPE applied and k, v in the cache. With QK-norm (an RMSNorm over q and k before
    /// RoPE) q ends in b.att: true.
    fn attention_inputs<B: Backend>(
        &self,
        b: &mut Buffers<B>,
        lw: &LayerWeights<'_>,
        (step, q_scale): (&QkvStep<'_>, f32),
        kv: &mut B::Kv,
        backend: &B,
    ) -> crate::Result<bool> {
        if let Some(m) = &lw.mla {
            return self.mla_inputs(b, lw, m, (step, q_scale), kv, backend);
        }
        let w = [&lw.wq, &lw.wk, &lw.wv];
        if lw.qk_norm.is_none() && lw.qkv_bias.is_none() {
            backend.qkv_rope_kv(w, &b.xn, [&mut b.q, &mut b.k, &mut b.v], step, kv)?;
            return Ok(false);
        }
        let (t, cfg) = (step.t, &self.cfg);
        backend.matmul_qkv(w, &b.xn, t, [&mut b.q, &mut b.k, &mut b.v])?;
        let Some([qn, kn]) = &lw.qk_norm else {
            let qkv = [&mut b.q, &mut b.k, &mut b.v];
            match &lw.qkv_bias {
                Some(bias) => backend.bias_rope_kv_write(qkv, bias, step, kv)?,
                None => backend.rope_kv_write(qkv, step, kv)?,
            }
            return Ok(false);
        };
        if let Some([bq, bk, bv]) = &lw.qkv_bias {
            backend.add_rows(&mut b.q, t, bq)?;
            backend.add_rows(&mut b.k, t, bk)?;
            backend.add_rows(&mut b.v, t, bv)?;
        }
        let out = [&mut b.att, &mut b.kn, &mut b.v];
        let norms = (&qn[..], &kn[..], cfg.rms_eps);
        backend.qk_norm_rope_kv((&b.q, &b.k), out, norms, step, kv)?;
        Ok(true)
    }

    /// Every layer of tokens start..start + t (embedded in b.x), then the output head of `rows`
    /// into b.logits (none for None).
    fn layers_and_head<B: Backend>(
        &self,
        b: &mut Buffers<B>,
        kv: &mut B::Kv,
        (routes, router): (&mut [Route], &mut Vec<f32>),
        pass: &Pass,
        (backend, experts): (&B, &mut dyn ExpertExecutor<B>),
    ) -> crate::Result<()> {
        let (t, rows) = (pass.t, pass.rows.clone());
        let cfg = &self.cfg;
        // b.xn already holds the RMSNorm that comes next (folded into the last MoE step).
        let mut normed = false;
        for (l, lw) in self.w.layers.iter().enumerate() {
            // Attention block.
            if !std::mem::take(&mut normed) {
                let bias = lw.norm_biases.as_ref().map(|[attn, _]| &attn[..]);
                self.norm(backend, (&b.x, 0..t), (&lw.attn_norm, bias), &mut b.xn)?;
            }
            self.attention_block(b, (lw, l), kv, pass, backend)?;
            // A dense layer: its MLP in place of the experts.
            let (Some(router_w), Some(m)) = (&lw.router, cfg.moe_index(l)) else {
                let Some(mlp) = &lw.mlp else {
                    let name = crate::format::keys::blk(l, crate::format::keys::FFN_GATE);
                    return Err(ModelError::MissingTensor { name }.into());
                };
                self.norm(backend, (&b.x, 0..t), (&lw.ffn_norm, None), &mut b.xn)?;
                let (xn, x, mut room, _) = b.split();
                self.mlp((mlp, None), (xn, x), &mut room, t, backend)?;
                continue;
            };
            // The norm after the block: the next layer's, or the output head's for a head over
            // the one token.
            let next = match self.w.layers.get(l + 1) {
                Some(nl) => Some(&nl.attn_norm[..]),
                None => (rows == Some(0..1)).then_some(&self.w.output_norm[..]),
            };
            let at = MoeAt {
                layer: (lw, l, m),
                router: router_w,
                next,
                t,
            };
            normed = self.moe_block(b, at, (routes, router), (backend, experts))?;
        }
        if let Some(rows) = rows {
            let n = rows.len();
            let biases = self.w.output_biases.as_ref();
            if !normed {
                let norm = (&self.w.output_norm[..], biases.map(|[nb, _]| &nb[..]));
                self.norm(backend, (&b.x, rows), norm, &mut b.xn)?;
            }
            backend.matmul(&self.w.output, &b.xn, n, &mut b.logits)?;
            if let Some([_, head]) = biases {
                backend.add_rows(&mut b.logits, n, head)?;
            }
        }
        Ok(())
    }

    /// Layer `l`'s mixture-of-experts block: x += its shared expert's MLP (where it has one),
    /// then its routed experts'. A decode token whose experts are all resident may be routed
    /// and computed without leaving the device; otherwise routing comes to the host (the
    /// expert engine decides loads there). Both paths add in the same order: the same bits.
    /// Returns whether b.xn holds the `next` norm (folded into the block's last step).
    fn moe_block<B: Backend>(
        &self,
        b: &mut Buffers<B>,
        at: MoeAt<'_>,
        (routes, router): (&mut [Route], &mut Vec<f32>),
        (backend, experts): (&B, &mut dyn ExpertExecutor<B>),
    ) -> crate::Result<bool> {
        let (cfg, (lw, l, m), t) = (&self.cfg, at.layer, at.t);
        let (h, k) = (cfg.hidden, cfg.top_k);
        let ffn = ExpertFfn {
            act: cfg.expert_act,
            biases: lw.expert_biases.clone(),
        };
        let block = MoeBlock {
            norm: &lw.ffn_norm,
            router: at.router,
            next: at.next,
            eps: cfg.rms_eps,
            routing: cfg.routing().with_bias(lw.score_bias.as_deref()),
            norm_bias: lw.norm_biases.as_ref().map(|[_, ffn]| &ffn[..]),
            router_bias: lw.router_bias.as_deref(),
            ffn: &ffn,
        };
        let (xn, x, mut room, logits) = b.split();
        let mut shared = |xn: &B::Buf, x: &mut B::Buf| match &lw.shared {
            Some(sh) => self.mlp(
                (&sh.mlp, sh.gate_inp.as_ref()),
                (xn, x),
                &mut room,
                t,
                backend,
            ),
            None => Ok(()),
        };
        if t == 1 {
            match experts.forward_on_device(backend, m, &block, xn, x, &mut shared)? {
                OnDevice::No => {}
                OnDevice::Done => return Ok(false),
                OnDevice::DoneNormed => return Ok(true),
            }
        }
        let out = RouteOut {
            xn: &mut *xn,
            logits,
            routes: &mut routes[..t * k],
            host: router,
            reads: match t {
                1 => experts.route_reads(l),
                _ => RouteReads::NONE,
            },
        };
        backend.norm_route(x, t, &block, out)?;
        self.check_routes(l, &routes[..t * k])?;
        shared(xn, x)?;
        let batch = Batch {
            xs: xn,
            t,
            hidden: h,
            routes: &routes[..t * k],
            ffn: ffn.clone(),
        };
        experts.forward_add(backend, m, &batch, room.out, x)?;
        Ok(false)
    }

    /// The attention block of layer `l` over b.xn (normalized): q, k and v, RoPE and the cache,
    /// attention, the output projection added to b.x.
    fn attention_block<B: Backend>(
        &self,
        b: &mut Buffers<B>,
        (lw, l): (&LayerWeights<'_>, usize),
        kv: &mut B::Kv,
        pass: &Pass,
        backend: &B,
    ) -> crate::Result<()> {
        let (start, t, cfg) = (pass.start, pass.t, &self.cfg);
        let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
        let (inv_freq, q_scale) = self.rope(pass.long_rope);
        // MLA attends over the latent (head_dim wide) with a head's q·k scale (nope + rope).
        let q_scale = match cfg.mla {
            Some(m) => {
                let wide = (cfg.head_dim as f32 / (m.nope + m.rope) as f32).sqrt();
                q_scale * wide * m.softmax_scale
            }
            None => q_scale,
        };
        let step = QkvStep {
            t,
            q_width: qd,
            kv_width: kvd,
            start,
            layer: l,
            inv_freq,
        };
        let shape = AttentionShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
            start_pos: start,
            t,
            window: cfg.window(l),
            sinks: lw.sinks.as_deref(),
        };
        let prep = AttnPrep {
            bias: lw.qkv_bias.as_ref(),
            norms: lw
                .qk_norm
                .as_ref()
                .map(|[qn, kn]| (&qn[..], &kn[..], cfg.rms_eps)),
            q_scale,
        };
        let w = [&lw.wq, &lw.wk, &lw.wv];
        // Where q ends: b.att, or b.q where the QK-norm wrote q' into b.att.
        let q_in_att = if lw.mla.is_none() && backend.fuses_attention(w, &prep, &step, &shape) {
            backend.matmul_qkv(w, &b.xn, t, [&mut b.q, &mut b.k, &mut b.v])?;
            backend.fused_attention([&b.q, &b.k, &b.v], &prep, &step, shape, kv, &mut b.att)?;
            false
        } else {
            let q_in_att = self.attention_inputs(b, lw, (&step, q_scale), kv, backend)?;
            // MLA's inputs come scaled.
            if q_scale != 1.0 && lw.mla.is_none() {
                backend.scale(
                    if q_in_att { &mut b.att } else { &mut b.q },
                    t * qd,
                    q_scale,
                )?;
            }
            let (q, att) = match q_in_att {
                true => (&b.att, &mut b.q),
                false => (&b.q, &mut b.att),
            };
            backend.attention(shape, q, kv, l, att)?;
            q_in_att
        };
        let att = if q_in_att { &b.q } else { &b.att };
        match &lw.mla {
            // MLA: each head's value out of the latent (b.q held the attention), into b.att.
            Some(m) => {
                let shape = cfg.mla.ok_or_else(|| {
                    crate::Error::Invalid("MLA weights without MLA shapes".into())
                })?;
                let heads = (t, cfg.n_heads);
                backend.mla_values(&b.q, (&m.v_b, &shape), heads, &mut b.att)?;
                let io = (&mut b.out, &mut b.x);
                backend.matmul_add_bias(&lw.wo, &b.att, t, io, lw.o_bias.as_deref())?;
            }
            None => {
                let io = (&mut b.out, &mut b.x);
                backend.matmul_add_bias(&lw.wo, att, t, io, lw.o_bias.as_deref())?;
            }
        }
        Ok(())
    }

    /// The architecture's norm of x's `rows` into out: RMSNorm, or LayerNorm where it has a bias.
    fn norm<B: Backend>(
        &self,
        backend: &B,
        (x, rows): (&B::Buf, Range<usize>),
        (w, bias): (&[f32], Option<&[f32]>),
        out: &mut B::Buf,
    ) -> crate::Result<()> {
        let eps = self.cfg.rms_eps;
        match bias {
            Some(b) => backend.layer_norm(x, rows, (w, b), eps, out),
            None => backend.rms_norm(x, rows, w, eps, out),
        }
    }

    /// RoPE's inverse frequencies and the factor q is scaled by (LongRoPE's or YaRN's cos/sin
    /// scale, squared: it scales q and k alike), with LongRoPE's long factors or not.
    fn rope(&self, long: bool) -> (&[f32], f32) {
        match (&self.cfg.long_rope, &self.long_inv_freq, &self.cfg.yarn) {
            (Some(r), Some(f), _) if long => (f, r.long_mscale * r.long_mscale),
            (Some(r), _, _) => (&self.inv_freq, r.short_mscale * r.short_mscale),
            (None, _, Some(y)) => (&self.inv_freq, y.attention_factor * y.attention_factor),
            _ => (&self.inv_freq, 1.0),
        }
    }
}

/// Rotate-half RoPE (transformers' `apply_rotary_pos_emb`) on every head of one row in place:
/// heads of `2 * inv_freq.len()` values, angles `pos * inv_freq[i]` in f32.
pub fn rope_row(x: &mut [f32], pos: usize, inv_freq: &[f32]) {
    let half = inv_freq.len();
    for head in x.chunks_exact_mut(2 * half) {
        for (i, &f) in inv_freq.iter().enumerate() {
            let angle = pos as f32 * f;
            let (sin, cos) = angle.sin_cos();
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * cos - b * sin;
            head[i + half] = b * cos + a * sin;
        }
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

pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Whether every value is finite (vectorizes: no early exit inside a block).
pub fn all_finite(x: &[f32]) -> bool {
    x.chunks(256)
        .all(|c| c.iter().fold(true, |ok, v| ok & v.is_finite()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
