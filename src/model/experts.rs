//! The interface the forward pass computes a layer's experts through: where the offload engine
//! (experts::engine) and the experts computed straight from the mapped file (experts::direct)
//! plug in.

use super::ops::{Backend, Route};
use super::routing::Routing;
use crate::quant::Matrix;

/// One MoE layer's batch: t tokens' normalized inputs ([t, hidden]) and routes ([t, top_k],
/// token-major).
pub struct Batch<'a, Buf> {
    pub xs: &'a Buf,
    pub t: usize,
    pub hidden: usize,
    pub routes: &'a [Route],
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
    pub routing: Routing,
    /// The norm's bias where it is a LayerNorm (Phi-3.5-MoE), None for an RMSNorm.
    pub norm_bias: Option<&'a [f32]>,
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

    /// Whether this decode token's every layer will take `forward_on_device` (asked once,
    /// before the first layer, so that the backend may record or replay the token's launches;
    /// a replayed token's layers are not called).
    fn decode_on_device(&mut self, _backend: &B) -> crate::Result<bool> {
        Ok(false)
    }

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
    /// from xs (as the backend's `route` would) and add the experts' output (as `forward` sums
    /// it) into x. The executor may fold `block.next` into its last step (xs = RMSNorm(x):
    /// OnDevice::DoneNormed). OnDevice::No, nothing computed, when it cannot now; the caller
    /// then normalizes, routes on the host and calls `forward`.
    fn forward_on_device(
        &mut self,
        _backend: &B,
        _layer: usize,
        _block: &MoeBlock<'_>,
        _xs: &mut B::Buf,
        _x: &mut B::Buf,
    ) -> crate::Result<OnDevice> {
        Ok(OnDevice::No)
    }
}
