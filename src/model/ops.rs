//! What the forward pass asks of a backend, and the interface the expert engine plugs into.

use crate::quant::Matrix;

/// One routed expert of one token: which expert and its (renormalized) gate weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Route {
    pub expert: usize,
    pub weight: f32,
}

/// Shape of one attention call: `t` new tokens at positions `start_pos..start_pos + t`, attending
/// causally to every cached position up to their own.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub start_pos: usize,
    pub t: usize,
    /// Sliding-window attention: a query at position p sees positions p + 1 - w ..= p.
    pub window: Option<usize>,
}

/// The dense compute a backend provides. Results must not depend on the thread count.
pub trait Backend: Sync {
    /// out[t, w.rows] = x[t, w.cols] · wᵀ.
    fn matmul(&self, w: &Matrix<'_>, x: &[f32], t: usize, out: &mut [f32]);

    /// Causal grouped-query attention. q: [t, n_heads * head_dim]; k_cache, v_cache:
    /// [start_pos + t, n_kv_heads * head_dim] (the new tokens already written);
    /// out: [t, n_heads * head_dim].
    fn attention(
        &self,
        shape: AttentionShape,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        out: &mut [f32],
    );
}

/// Computes a layer's experts for a batch of tokens: where the offload engine (cache, loader,
/// precision scorer) plugs in. The executor chooses the variant each expert runs in.
pub trait ExpertExecutor {
    /// xs: [t, hidden] (post-norm hidden states); routes: [t, top_k], token-major;
    /// out: [t, hidden], overwritten with sum_k weight_k * expert_k(x).
    fn forward(
        &mut self,
        layer: usize,
        xs: &[f32],
        routes: &[Route],
        out: &mut [f32],
    ) -> crate::Result<()>;
}
