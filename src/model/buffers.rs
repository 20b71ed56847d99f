//! A forward call's activations (`Buffers`), grown to the largest batch seen, and the MLP
//! scratch borrowed apart from them (`MlpRoom`).

use super::ops::Backend;
use super::ModelConfig;

/// An MLP's scratch: Buffers' sh_gate, sh_up, sh_logit and out.
pub(super) struct MlpRoom<'b, B: Backend> {
    pub(super) gate: &'b mut B::Buf,
    pub(super) up: &'b mut B::Buf,
    pub(super) logit: &'b mut B::Buf,
    pub(super) out: &'b mut B::Buf,
}

/// Activations for a batch of t tokens, grown to the largest batch seen, never per token.
pub(super) struct Buffers<B: Backend> {
    pub(super) t: usize,
    /// (t, hidden) residual stream
    pub(super) x: B::Buf,
    /// (t, hidden) normalized input of a block
    pub(super) xn: B::Buf,
    /// (t, q_dim)
    pub(super) q: B::Buf,
    /// (t, kv_dim)
    pub(super) k: B::Buf,
    /// (t, kv_dim)
    pub(super) v: B::Buf,
    /// (t, kv_dim): k after QK-norm (one value where the architecture has none)
    pub(super) kn: B::Buf,
    /// The shared expert's (t, ffn) gate and up products and (t, 1) gate logits (one value
    /// each where the architecture has no shared expert)
    pub(super) sh_gate: B::Buf,
    pub(super) sh_up: B::Buf,
    pub(super) sh_logit: B::Buf,
    /// (t, q_dim)
    pub(super) att: B::Buf,
    /// (t, hidden) block output
    pub(super) out: B::Buf,
    /// (t, n_experts)
    pub(super) router: B::Buf,
    /// (t, vocab)
    pub(super) logits: B::Buf,
    /// (t, q_lora): MLA's q bottleneck and its norm (one value each where there is none)
    pub(super) mla_q: B::Buf,
    pub(super) mla_qn: B::Buf,
}

impl<B: Backend> Buffers<B> {
    /// xn, x, an MLP's scratch and the router's logits, borrowed apart.
    pub(super) fn split(&mut self) -> (&mut B::Buf, &mut B::Buf, MlpRoom<'_, B>, &mut B::Buf) {
        let Buffers {
            xn,
            x,
            sh_gate,
            sh_up,
            sh_logit,
            out,
            router,
            ..
        } = self;
        let room = MlpRoom {
            gate: sh_gate,
            up: sh_up,
            logit: sh_logit,
            out,
        };
        (xn, x, room, router)
    }

    pub(super) fn new(backend: &B, cfg: &ModelConfig, t: usize) -> crate::Result<Buffers<B>> {
        let (h, qd, kvd) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim());
        // The shared expert's and the dense layers' MLPs share these.
        let mlp_width = cfg.shared_ffn.unwrap_or(0).max(cfg.dense_ffn);
        Ok(Buffers {
            t,
            x: backend.alloc(t * h)?,
            xn: backend.alloc(t * h)?,
            q: backend.alloc(t * qd)?,
            k: backend.alloc(t * kvd)?,
            v: backend.alloc(t * kvd)?,
            kn: backend.alloc(if cfg.qk_norm.is_some() { t * kvd } else { 1 })?,
            sh_gate: backend.alloc(t * mlp_width + 1)?,
            sh_up: backend.alloc(t * mlp_width + 1)?,
            sh_logit: backend.alloc(t + 1)?,
            att: backend.alloc(t * qd)?,
            mla_q: backend.alloc(t * cfg.mla.map_or(0, |m| m.q_lora) + 1)?,
            mla_qn: backend.alloc(t * cfg.mla.map_or(0, |m| m.q_lora) + 1)?,
            out: backend.alloc(t * h)?,
            router: backend.alloc(t * cfg.n_experts)?,
            logits: backend.alloc(t * cfg.vocab)?,
        })
    }
}
