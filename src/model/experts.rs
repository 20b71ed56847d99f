//! The interface the forward pass computes a layer's experts through: where the offload engine
//! (experts::engine) and the experts computed straight from the mapped file (experts::direct)
//! plug in.

use super::config::ExpertAct;
use super::ops::{Backend, Route, RouteReads};
use super::routing::Routing;
use super::weights::ExpertBiases;
use crate::quant::Matrix;
use std::sync::Arc;

/// One MoE layer's batch: t tokens' normalized inputs ([t, hidden]) and routes ([t, top_k],
/// token-major), and what its experts compute beyond their three products.
pub struct Batch<'a, Buf> {
    pub xs: &'a Buf,
    pub t: usize,
    pub hidden: usize,
    pub routes: &'a [Route],
    pub ffn: ExpertFfn,
}

/// A layer's routed experts beyond their gate, up and down products: the activation between
/// them, and each expert's biases where the family has them (gpt-oss):
/// down(act(gate x + bg, up x + bu)) + bd.
#[derive(Clone)]
pub struct ExpertFfn {
    pub act: ExpertAct,
    pub biases: Option<Arc<ExpertBiases>>,
}

impl ExpertFfn {
    /// SwiGLU without biases (every family but gpt-oss).
    pub const PLAIN: ExpertFfn = ExpertFfn {
        act: ExpertAct::SiluGlu,
        biases: None,
    };

    /// Whether this is `PLAIN`: the fused kernels that compute SwiGLU in place apply.
    pub fn is_plain(&self) -> bool {
        self.act == ExpertAct::SiluGlu && self.biases.is_none()
    }

    /// gate[i] = act(gate[i] + bg, up[i] + bu) over rows of `ffn` values, each row's biases
    /// those of expert `expert_of(row)`.
    pub fn activate(
        &self,
        gate: &mut [f32],
        up: &[f32],
        ffn: usize,
        expert_of: impl Fn(usize) -> usize,
    ) {
        let rows = gate.chunks_exact_mut(ffn).zip(up.chunks_exact(ffn));
        for (r, (g, u)) in rows.enumerate() {
            match &self.biases {
                Some(b) => {
                    let e = expert_of(r);
                    let (bg, bu) = (&b.gate[e * ffn..][..ffn], &b.up[e * ffn..][..ffn]);
                    for (((g, &u), &bg), &bu) in g.iter_mut().zip(u).zip(bg).zip(bu) {
                        *g = self.act.apply(*g + bg, u + bu);
                    }
                }
                None => g
                    .iter_mut()
                    .zip(u)
                    .for_each(|(g, &u)| *g = self.act.apply(*g, u)),
            }
        }
    }

    /// Expert `expert`'s down bias ([hidden]), where it has one.
    pub fn down_bias(&self, expert: usize, hidden: usize) -> Option<&[f32]> {
        self.biases
            .as_ref()
            .map(|b| &b.down[expert * hidden..][..hidden])
    }

    /// Expert `expert`'s gate, up and down biases, where it has them.
    pub fn expert_biases(&self, expert: usize) -> Option<[&[f32]; 3]> {
        let b = self.biases.as_ref()?;
        let (f, h) = (b.gate.len() / b.n_experts, b.down.len() / b.n_experts);
        Some([
            &b.gate[expert * f..][..f],
            &b.up[expert * f..][..f],
            &b.down[expert * h..][..h],
        ])
    }
}

/// A decode layer's MoE block as the device routes it: the RMSNorm before it, the router, and
/// the RMSNorm after it (the next layer's attention norm, or the output norm) where it may be
/// folded into the block's last step.
pub struct MoeBlock<'a> {
    pub norm: &'a [f32],
    pub router: &'a Matrix<'a>,
    pub next: Option<&'a [f32]>,
    pub eps: f32,
    /// How the router's logits become routes (`Architecture::routing`).
    pub routing: Routing<'a>,
    /// The norm's bias where it is a LayerNorm (Phi-3.5-MoE), None for an RMSNorm.
    pub norm_bias: Option<&'a [f32]>,
    /// The router's bias (gpt-oss), added to its logits.
    pub router_bias: Option<&'a [f32]>,
    /// What the routed experts compute beyond their products (Batch::ffn).
    pub ffn: &'a ExpertFfn,
}

/// What `ExpertExecutor::forward_on_device` did with a decode layer's MoE block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDevice {
    /// Nothing: the caller normalizes, routes on the host and calls `forward`.
    No,
    /// The block is done.
    Done,
    /// The block is done, and xs holds the `next` RMSNorm of x.
    DoneNormed,
}

/// What a decode layer adds to x between its routing and its routed experts, from xs (the
/// block's norm) and x: its shared expert's output (a no-op where it has none).
pub type BeforeExperts<'h, B> =
    &'h mut dyn FnMut(&<B as Backend>::Buf, &mut <B as Backend>::Buf) -> crate::Result<()>;

/// Computes a layer's experts for a batch of tokens. The executor chooses the variant each
/// expert runs in.
pub trait ExpertExecutor<B: Backend> {
    /// A new sequence starts (position 0): per-sequence counters reset (HOBBIT's cache policy).
    fn begin_sequence(&mut self) -> crate::Result<()> {
        Ok(())
    }

    /// out ([t, hidden]) = sum_k weight_k * expert_k(x) per token, experts summed in ascending
    /// index order for every token (so prefill and decode agree).
    fn forward(
        &mut self,
        backend: &B,
        layer: usize,
        batch: &Batch<'_, B::Buf>,
        out: &mut B::Buf,
    ) -> crate::Result<()>;

    /// `forward` into `out`, then the residual add x[t, hidden] += out. An executor may add into
    /// x itself, with the same sums, and leave `out` undefined.
    fn forward_add(
        &mut self,
        backend: &B,
        layer: usize,
        batch: &Batch<'_, B::Buf>,
        out: &mut B::Buf,
        x: &mut B::Buf,
    ) -> crate::Result<()> {
        self.forward(backend, layer, batch, out)?;
        backend.add_assign(x, out, batch.t * batch.hidden)
    }

    /// A replayed routing (`--replay-trace`) hands over, before each decode layer's forward,
    /// what the traced model's stacked gates predicted at that layer for the layers after it:
    /// (model layer, routes), possibly none. An executor that prefetches uses these instead of
    /// its own stacked gates (which predict the model's router, not the replayed one).
    fn replayed_predictions(&mut self, _layer: usize, _predicted: Vec<(usize, Vec<Route>)>) {}

    /// A host-routed decode layer is about to be routed: what the executor wants read back with
    /// its routes (its input to the next call, `forward_add`).
    fn route_reads(&mut self, _layer: usize) -> RouteReads<'_, B> {
        RouteReads::NONE
    }

    /// Whether this decode token's every layer will take `forward_on_device` (asked once,
    /// before the first layer, so that the backend may record or replay the token's launches;
    /// a replayed token's layers are not called).
    fn decode_on_device(&mut self, _backend: &B) -> crate::Result<bool> {
        Ok(false)
    }

    /// `decode_on_device` for a token whose routes are given (`routes`: [layers][k], replayed
    /// from a trace): true where the executor routes it on the device with these in place of
    /// the router's (its layers are then not called for their routes); false: nothing taken,
    /// the token routes on the host.
    fn decode_replayed(&mut self, _backend: &B, _routes: &[Route]) -> crate::Result<bool> {
        Ok(false)
    }

    /// Whether this call's launches run as they are made (true) or are recorded to run later
    /// (false: a CUDA graph's capture, launched once recorded). Called before each run of a
    /// call's layers.
    fn launches_run_now(&mut self, _now: bool) {}

    /// Everything of one `Model::forward` call up to its logits is launched, and the logits are
    /// about to be read back: an executor may account the batch here.
    fn end_forward(&mut self, _backend: &B) -> crate::Result<()> {
        Ok(())
    }

    /// The `Model::forward` call's logits are read back (the backend waited for its work; for
    /// a call without logits, nothing waited): what end_forward queued may be counted now.
    fn after_forward(&mut self, _backend: &B) -> crate::Result<()> {
        Ok(())
    }

    /// Decode one token's layer with its routing left on the device: xs ([hidden]) = the
    /// block's RMSNorm of the residual stream x, as the backend's `rms_norm` computes it; route
    /// from xs (as the backend's `route` would), call `before` once (xs, x), then add the
    /// experts' output (as `forward` sums it) into x. The executor may fold `block.next` into
    /// its last step (xs = RMSNorm(x): OnDevice::DoneNormed). OnDevice::No, nothing computed and
    /// `before` not called, when it cannot now; the caller then normalizes, routes on the host,
    /// calls `before` and `forward`.
    fn forward_on_device(
        &mut self,
        _backend: &B,
        _layer: usize,
        _block: &MoeBlock<'_>,
        _xs: &mut B::Buf,
        _x: &mut B::Buf,
        _before: BeforeExperts<'_, B>,
    ) -> crate::Result<OnDevice> {
        Ok(OnDevice::No)
    }
}
