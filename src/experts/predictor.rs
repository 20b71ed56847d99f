//! Layer-level expert prediction with stacked gates (HOBBIT §3.3).
//!
//! At layer l, the next `depth` layers' router matrices, stacked into one
//! [depth * n_experts, hidden] matrix, are applied to layer l's gate input in one product; a
//! softmax + top-k per stacked block predicts each of those layers' experts. Hidden states change
//! slowly across layers, so the prediction is good a few layers ahead (HOBBIT: 96% next-layer
//! top-1 on Mixtral). The device computes the product ([`Predictor::stacked`] gives the matrix);
//! this module turns logits into predictions and scores them against the routes that follow.

use crate::format::DType;
use crate::model::forward::route_softmax_topk;
use crate::model::ops::Route;
use crate::quant::{Matrix, WeightKind};

/// Prediction quality at one distance (d layers ahead).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Accuracy {
    /// Predicted experts compared against the routes that followed.
    pub predicted: u64,
    /// Of those, experts the layer really routed to.
    pub correct: u64,
    /// Tokens whose top-1 expert was predicted correctly, out of `tokens`.
    pub top1_correct: u64,
    pub tokens: u64,
}

pub struct Predictor {
    depth: usize,
    n_layers: usize,
    n_experts: usize,
    hidden: usize,
    top_k: usize,
    /// Per layer: f32 bytes of the next layers' routers, stacked (empty for the last layer).
    stacked: Vec<Vec<u8>>,
    /// pending[target][d - 1]: the routes predicted for layer `target` d layers earlier.
    pending: Vec<Vec<Option<Vec<Route>>>>,
    accuracy: Vec<Accuracy>,
}

impl Predictor {
    /// `routers[l]`: layer l's router, [n_experts, hidden] f32 (the reader checks the dtype).
    pub fn new(routers: &[Matrix<'_>], depth: usize, top_k: usize) -> crate::Result<Predictor> {
        let n_layers = routers.len();
        let (n_experts, hidden) = routers.first().map_or((0, 0), |r| (r.rows, r.cols));
        if routers
            .iter()
            .any(|r| r.kind != WeightKind::F32 || r.rows != n_experts || r.cols != hidden)
        {
            return Err(crate::Error::Invalid(
                "stacked-gate prediction needs f32 routers of one shape in every layer".into(),
            ));
        }
        let stacked = (0..n_layers)
            .map(|l| {
                routers[(l + 1).min(n_layers)..(l + 1 + depth).min(n_layers)]
                    .iter()
                    .flat_map(|r| r.codes.iter().copied())
                    .collect()
            })
            .collect();
        Ok(Predictor {
            depth,
            n_layers,
            n_experts,
            hidden,
            top_k,
            stacked,
            pending: vec![vec![None; depth]; n_layers],
            accuracy: vec![Accuracy::default(); depth],
        })
    }

    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Layers predicted from `layer`: layer + 1 ..= layer + depth, within the model.
    pub fn targets(&self, layer: usize) -> std::ops::Range<usize> {
        (layer + 1).min(self.n_layers)..(layer + 1 + self.depth).min(self.n_layers)
    }

    /// The stacked gate matrix applied at `layer` ([targets * n_experts, hidden]); None at the
    /// last layer.
    pub fn stacked(&self, layer: usize) -> Option<Matrix<'_>> {
        let n = self.targets(layer).len();
        (n > 0).then(|| {
            Matrix::dense(
                DType::F32,
                n * self.n_experts,
                self.hidden,
                &self.stacked[layer],
            )
        })
    }

    /// The stacked product's logits (targets * n_experts values) at `layer` as predicted routes
    /// per target layer: (target layer, routes) in layer order.
    fn routes(&self, layer: usize, logits: &[f32]) -> Vec<(usize, Vec<Route>)> {
        self.targets(layer)
            .enumerate()
            .map(|(i, target)| {
                let mut routes = vec![
                    Route {
                        expert: 0,
                        weight: 0.0
                    };
                    self.top_k
                ];
                route_softmax_topk(
                    &logits[i * self.n_experts..(i + 1) * self.n_experts],
                    &mut routes,
                );
                (target, routes)
            })
            .collect()
    }

    /// Turn the stacked product's logits (targets * n_experts values) at `layer` into predicted
    /// routes per target layer, remembered for scoring. Returns (target layer, routes) in layer
    /// order.
    pub fn predict(&mut self, layer: usize, logits: &[f32]) -> Vec<(usize, Vec<Route>)> {
        let out = self.routes(layer, logits);
        self.given(layer, out)
    }

    /// Predictions made elsewhere (a replayed trace's, made by the traced model's stacked gates)
    /// for layers after `layer`, remembered for scoring as [`predict`](Self::predict)'s are;
    /// targets outside [`targets`](Self::targets) are dropped. Returns those kept.
    pub fn given(
        &mut self,
        layer: usize,
        predicted: Vec<(usize, Vec<Route>)>,
    ) -> Vec<(usize, Vec<Route>)> {
        let targets = self.targets(layer);
        let kept: Vec<(usize, Vec<Route>)> = predicted
            .into_iter()
            .filter(|(t, _)| targets.contains(t))
            .collect();
        for (target, routes) in &kept {
            self.pending[*target][target - layer - 1] = Some(routes.clone());
        }
        kept
    }

    /// The prediction at `layer` from its gate input `x` (hidden values), computed on the host
    /// and not remembered: what `--record-trace` writes beside the routes.
    pub fn predict_host(&self, layer: usize, x: &[f32]) -> Vec<(usize, Vec<Route>)> {
        let Some(m) = self.stacked(layer) else {
            return Vec::new();
        };
        let mut logits = vec![0.0f32; m.rows];
        m.matvec_rows(x, 0..m.rows, &mut logits);
        self.routes(layer, &logits)
    }

    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Score the predictions made for `layer` against the routes it really took (one token),
    /// and forget them.
    pub fn observe(&mut self, layer: usize, routes: &[Route]) {
        for d in 0..self.depth {
            let Some(pred) = self.pending[layer][d].take() else {
                continue;
            };
            let acc = &mut self.accuracy[d];
            acc.predicted += pred.len() as u64;
            acc.correct += pred
                .iter()
                .filter(|p| routes.iter().any(|r| r.expert == p.expert))
                .count() as u64;
            acc.tokens += 1;
            if pred.first().map(|p| p.expert) == routes.first().map(|r| r.expert) {
                acc.top1_correct += 1;
            }
        }
    }

    /// Accuracy per distance (index 0: one layer ahead).
    pub fn accuracy(&self) -> &[Accuracy] {
        &self.accuracy
    }

    pub fn reset_stats(&mut self) {
        self.accuracy.fill(Accuracy::default());
    }

    /// Drop predictions not yet scored (a new sequence, or a batch that is not scored).
    pub fn forget(&mut self) {
        for p in self.pending.iter_mut().flatten() {
            *p = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(rows: &[[f32; 3]]) -> Vec<u8> {
        rows.iter()
            .flatten()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    #[test]
    fn stacked_gates_predict_the_next_layers() {
        // 4 layers, 4 experts, hidden 3; layer l's router prefers expert l on x = [1, 0, 0].
        let bytes: Vec<Vec<u8>> = (0..4)
            .map(|l| {
                let mut rows = [[0.0f32; 3]; 4];
                rows[l][0] = 3.0;
                rows[(l + 1) % 4][0] = 2.0;
                rows[(l + 2) % 4][1] = 5.0;
                router(&rows)
            })
            .collect();
        let routers: Vec<Matrix> = bytes
            .iter()
            .map(|b| Matrix::dense(DType::F32, 4, 3, b))
            .collect();
        let mut p = Predictor::new(&routers, 2, 2).unwrap();
        assert_eq!(p.targets(0), 1..3);
        assert_eq!(p.targets(2), 3..4);
        assert!(p.stacked(3).is_none());
        let m = p.stacked(0).unwrap();
        assert_eq!((m.rows, m.cols), (8, 3));
        // The product on the host, as a device would compute it.
        let x = [1.0f32, 0.0, 0.0];
        let mut logits = vec![0.0; m.rows];
        m.matvec_rows(&x, 0..m.rows, &mut logits);
        let pred = p.predict(0, &logits);
        assert_eq!(pred.len(), 2);
        assert_eq!(pred[0].0, 1);
        assert_eq!((pred[0].1[0].expert, pred[0].1[1].expert), (1, 2));
        assert_eq!((pred[1].1[0].expert, pred[1].1[1].expert), (2, 3));
        // Layer 1 really routes to 1 and 0: one of two right, top-1 right.
        let r = |expert, weight| Route { expert, weight };
        p.observe(1, &[r(1, 0.6), r(0, 0.4)]);
        // Layer 2 routes to 3 then 2: both right, top-1 wrong.
        p.observe(2, &[r(3, 0.7), r(2, 0.3)]);
        let a = p.accuracy();
        assert_eq!(
            a[0],
            Accuracy {
                predicted: 2,
                correct: 1,
                top1_correct: 1,
                tokens: 1
            }
        );
        assert_eq!(
            a[1],
            Accuracy {
                predicted: 2,
                correct: 2,
                top1_correct: 0,
                tokens: 1
            }
        );
        // Scored once: observing again changes nothing.
        p.observe(2, &[r(0, 1.0), r(1, 0.0)]);
        assert_eq!(p.accuracy()[1].predicted, 2);
    }
}
