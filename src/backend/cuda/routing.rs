//! Routing on the device for the forward pass (Backend::route, Backend::norm_route): the routes
//! computed by the routing kernels and copied to the host.

use super::*;
use crate::model::routing::Routing;

impl CudaBackend {
    /// Routing on the device (Gpu::route, into the prefill tile's scratch), the routes copied
    /// to the host: the same routes as the engine's device-routed decode.
    pub(super) fn route_dev(
        &self,
        logits: &CudaSlice<f32>,
        (t, n_experts, routing): (usize, usize, Routing),
        routes: &mut [Route],
        host: &mut Vec<f32>,
    ) -> crate::Result<()> {
        let k = routes.len() / t.max(1);
        check_len("route input", logits.len(), t * n_experts)?;
        if let Routing::Grouped { rule, bias } = routing {
            if super::matvec::grouped_on_device(n_experts, rule) {
                check_len("route scratch", self.scratch_len, 2 * t * k)?;
                let scratch = self.p(&self.scratch);
                let b = self.bias_ptr(bias, n_experts, "score-correction bias")?;
                self.gpu
                    .route_grouped(self.p(logits), (t, n_experts, b), (k, rule), scratch)?;
                return self.routes_back(scratch, t, n_experts, routes, host);
            }
            // No kernel for it: the logits come to the host (few bytes beside the layer).
            host.resize(t * n_experts, 0.0);
            self.download(logits, host)?;
            for (l, r) in host.chunks_exact(n_experts).zip(routes.chunks_exact_mut(k)) {
                routing.route(l, r);
            }
            return Ok(());
        }
        check_len("route scratch", self.scratch_len, 2 * t * k)?;
        let scratch = self.p(&self.scratch);
        self.gpu
            .route(self.p(logits), t, n_experts, (k, routing), scratch)?;
        self.routes_back(scratch, t, n_experts, routes, host)
    }

    /// Backend::norm_route on the device: for one token the norm, router and routing rule in one
    /// launch where moe_route_norm takes them.
    pub(super) fn norm_route_dev(
        &self,
        x: &CudaSlice<f32>,
        t: usize,
        block: &MoeBlock<'_>,
        out: RouteOut<'_, CudaBackend>,
    ) -> crate::Result<()> {
        let (norm, eps, router) = (block.norm, block.eps, block.router);
        let (n, ne, k) = (router.cols, router.rows, out.routes.len());
        // A grouped rule's bias picks experts: none beside it adds to the logits in that kernel.
        let grouped_biased =
            matches!(block.routing, Routing::Grouped { .. }) && block.router_bias.is_some();
        if t == 1 && block.norm_bias.is_none() && !grouped_biased && k <= self.scratch_len / 2 {
            // One token: RMSNorm, the router (and its bias) and top-k in one launch (the same
            // results as the separate launches: moe_route_norm).
            check_len("norm_route input", x.len(), n)?;
            check_len("norm_route output", out.xn.len(), n)?;
            check_len("norm_route weights", norm.len(), n)?;
            let bias = match block.routing {
                Routing::Grouped { bias, .. } => {
                    self.bias_ptr(bias, ne, "score-correction bias")?
                }
                _ => self.bias_ptr(block.router_bias, ne, "router bias")?,
            };
            let scratch = self.p(&self.scratch);
            let rw = *self.mat(router)?;
            let g = (self.vector(norm)?, eps);
            let (xp, xnp) = (self.p(x), self.p(out.xn));
            if self
                .gpu
                .moe_route_norm(&rw, (xp, xnp), g, (k, block.routing), (bias, scratch))?
            {
                let reads = (out.reads, &*out.xn);
                return self.routes_back_with(scratch, ne, (out.routes, out.host), reads);
            }
        }
        match block.norm_bias {
            Some(bias) => self.layer_norm(x, 0..t, (norm, bias), eps, out.xn)?,
            None => self.rms_norm(x, 0..t, norm, eps, out.xn)?,
        }
        self.matmul(router, out.xn, t, out.logits)?;
        if let Some(b) = block.router_bias {
            self.add_rows(out.logits, t, b)?;
        }
        self.route(out.logits, (t, ne, block.routing), out.routes, out.host)?;
        out.reads.read_each(self, out.xn)
    }
}
