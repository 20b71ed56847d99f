//! `--replay-trace`: run a model with another run's routing. Every MoE layer's experts and gate
//! weights come from a trace written by `--record-trace` (formats/trace.md) instead of the
//! model's own router, token by token.
//!
//! What it is for: speed studies of a model with random weights (`hob convert --synthetic`) at
//! real scale, routed the way a trained router routes. Random routers spread tokens nearly
//! uniformly and forget them between tokens; a trained router reuses experts across neighbouring
//! tokens and favours some over others, which is what an expert cache and the precision scorer
//! feed on. The text such a run prints is meaningless; its speed is the point.
//!
//! Mapping: model layer `l` takes the trace's layer `l % trace layers` (a trace from a shallower
//! model repeats its layers' routing; each model layer still has its own experts in the cache).
//! Tokens are taken in trace order; every new sequence (position 0) starts at the beginning of
//! the trace's next sequence, and a sequence longer than the trace's runs on into the one after
//! it, wrapping at the end of the trace. The precision decisions stored in the trace are not
//! used: the run's own scorer decides from the replayed gate weights and its own T1/T2.
//!
//! Predictions: where the trace records the traced model's stacked-gate predictions
//! (`pred_depth` > 0), a decode layer also gets them ([`ExpertExecutor::replayed_predictions`]),
//! so `--prefetch` prefetches what that model would have. Model layer `l`'s prediction d layers
//! ahead is the trace layer's, where layer `l + d` maps to trace layer `l % L + d` (no wrap past
//! the trace's last layer: none there).

use std::path::{Path, PathBuf};

use super::engine::{ExpertReport, ExpertStats};
use super::trace::Trace;
use super::Experts;
use crate::model::{Backend, Batch, ExpertExecutor, ModelConfig, Route};
use crate::Error;

/// The routing of a trace, token-major: `routes[token][trace layer]` holds that layer's top-k
/// routes (descending weight, ties to the lower expert), None where the trace has none.
#[derive(Debug)]
pub struct Replay {
    path: PathBuf,
    layers: usize,
    routes: Vec<Vec<Option<Vec<Route>>>>,
    /// Like `routes`: the stacked gates' prediction per distance 1, 2, ... (empty: none).
    preds: Vec<Vec<Vec<Vec<Route>>>>,
    /// Layers ahead the trace predicts (its header's pred_depth).
    pred_depth: usize,
    /// First token of every trace sequence.
    starts: Vec<usize>,
}

impl Replay {
    /// Read `path` and check that it can route `cfg`'s model (same experts and top-k).
    pub fn read(path: &Path, cfg: &ModelConfig) -> crate::Result<Replay> {
        Replay::from_trace(path, Trace::read(path)?, (cfg.n_experts, cfg.top_k))
    }

    /// `path` only names the trace in errors and descriptions; the model routes top-k of
    /// `experts`.
    pub fn from_trace(
        path: &Path,
        trace: Trace,
        (experts, top_k): (usize, usize),
    ) -> crate::Result<Replay> {
        let h = &trace.header;
        let bad =
            |what: String| Error::Invalid(format!("--replay-trace {}: {what}", path.display()));
        if h.experts != experts || h.top_k != top_k {
            return Err(bad(format!(
                "the trace routes top-{} of {} experts, the model top-{top_k} of {experts}",
                h.top_k, h.experts
            )));
        }
        let mut routes: Vec<Vec<Option<Vec<Route>>>> = Vec::new();
        let mut preds: Vec<Vec<Vec<Vec<Route>>>> = Vec::new();
        let mut starts = Vec::new();
        let mut last: Option<(u64, u64)> = None;
        for r in &trace.records {
            if last.map(|(s, _)| s) != Some(r.seq) {
                starts.push(routes.len());
            }
            if last != Some((r.seq, r.tok)) {
                routes.push(vec![None; h.layers]);
                preds.push(vec![Vec::new(); h.layers]);
                last = Some((r.seq, r.tok));
            }
            if let Some(tok) = preds.last_mut() {
                tok[r.layer] = r
                    .pred
                    .iter()
                    .map(|p| {
                        let mut v: Vec<Route> = p
                            .iter()
                            .map(|&(expert, weight)| Route { expert, weight })
                            .collect();
                        v.sort_by(|a, b| {
                            b.weight.total_cmp(&a.weight).then(a.expert.cmp(&b.expert))
                        });
                        v
                    })
                    .collect();
            }
            let mut token: Vec<Route> = r
                .routes
                .iter()
                .map(|t| Route {
                    expert: t.expert,
                    weight: t.weight,
                })
                .collect();
            token.sort_by(|a, b| b.weight.total_cmp(&a.weight).then(a.expert.cmp(&b.expert)));
            if let Some(tok) = routes.last_mut() {
                tok[r.layer] = Some(token);
            }
        }
        if routes.is_empty() {
            return Err(bad("the trace has no records".into()));
        }
        Ok(Replay {
            path: path.to_path_buf(),
            layers: h.layers,
            routes,
            preds,
            pred_depth: h.pred_depth,
            starts,
        })
    }

    /// Layers ahead the trace's recorded predictions reach (0: none recorded).
    pub fn pred_depth(&self) -> usize {
        self.pred_depth
    }

    /// The recorded predictions of `token` at model layer `layer` for the layers after it, as
    /// (model layer, routes), within the model's `n_layers`.
    fn predicted(&self, token: usize, layer: usize, n_layers: usize) -> Vec<(usize, Vec<Route>)> {
        let token = token % self.preds.len();
        let tl = layer % self.layers;
        self.preds[token][tl]
            .iter()
            .enumerate()
            .map(|(d, r)| (layer + d + 1, r.clone()))
            .filter(|(target, _)| *target < n_layers)
            .collect()
    }

    /// Tokens in the trace.
    pub fn tokens(&self) -> usize {
        self.routes.len()
    }

    /// The replayed routes of `token` (an index into the trace, taken modulo its length) at
    /// model layer `layer`.
    fn get(&self, token: usize, layer: usize) -> crate::Result<&[Route]> {
        let token = token % self.routes.len();
        let tl = layer % self.layers;
        self.routes[token][tl].as_deref().ok_or_else(|| {
            Error::Invalid(format!(
                "--replay-trace {}: trace token {token} has no routing for its layer {tl} \
                 (model layer {layer}): a dense layer in the traced model",
                self.path.display()
            ))
        })
    }
}

/// An expert executor whose routes come from a [`Replay`]; `inner` computes them.
pub struct Replayed<'a, B: Backend> {
    inner: Box<dyn Experts<B> + 'a>,
    replay: Replay,
    /// The model's last layer: a token is done when it has been computed.
    last_layer: usize,
    /// The trace sequence the current model sequence started at, and tokens taken since.
    seq: Option<usize>,
    taken: usize,
    routes: Vec<Route>,
    /// The current decode token routes on the device with its replayed routes.
    on_device: bool,
}

impl<'a, B: Backend> Replayed<'a, B> {
    pub fn new(inner: Box<dyn Experts<B> + 'a>, replay: Replay, n_layers: usize) -> Self {
        Replayed {
            inner,
            replay,
            last_layer: n_layers.saturating_sub(1),
            seq: None,
            taken: 0,
            routes: Vec::new(),
            on_device: false,
        }
    }

    /// Fill `self.routes` with the replayed routes of the batch's `t` tokens at `layer`.
    fn replace(&mut self, layer: usize, t: usize) -> crate::Result<()> {
        let seq = *self.seq.get_or_insert(0);
        let first = self.replay.starts[seq] + self.taken;
        self.routes.clear();
        for i in 0..t {
            let r = self.replay.get(first + i, layer)?;
            self.routes.extend_from_slice(r);
        }
        Ok(())
    }

    /// A decode token's recorded predictions at `layer`, handed to the inner executor.
    fn predict(&mut self, layer: usize, t: usize) {
        if t != 1 || self.replay.pred_depth == 0 {
            return;
        }
        let seq = self.seq.unwrap_or(0);
        let token = self.replay.starts[seq] + self.taken;
        let p = self.replay.predicted(token, layer, self.last_layer + 1);
        self.inner.replayed_predictions(layer, p);
    }

    fn done(&mut self, layer: usize, t: usize) {
        if layer == self.last_layer {
            self.taken += t;
        }
    }
}

impl<B: Backend> ExpertExecutor<B> for Replayed<'_, B> {
    fn route_reads(&mut self, layer: usize) -> crate::model::ops::RouteReads<'_, B> {
        // The replayed predictions first: the inner executor then asks for no stacked product.
        self.predict(layer, 1);
        self.inner.route_reads(layer)
    }

    fn begin_sequence(&mut self) -> crate::Result<()> {
        self.seq = Some(match self.seq {
            None => 0,
            Some(s) if self.taken == 0 => s,
            Some(s) => (s + 1) % self.replay.starts.len(),
        });
        self.taken = 0;
        self.inner.begin_sequence()
    }

    fn forward(
        &mut self,
        backend: &B,
        layer: usize,
        batch: &Batch<'_, B::Buf>,
        out: &mut B::Buf,
    ) -> crate::Result<()> {
        let t = batch.t;
        self.replace(layer, t)?;
        self.predict(layer, t);
        let replayed = Batch {
            routes: &self.routes,
            ffn: batch.ffn.clone(),
            ..*batch
        };
        self.inner.forward(backend, layer, &replayed, out)?;
        self.done(layer, t);
        Ok(())
    }

    fn forward_add(
        &mut self,
        backend: &B,
        layer: usize,
        batch: &Batch<'_, B::Buf>,
        out: &mut B::Buf,
        x: &mut B::Buf,
    ) -> crate::Result<()> {
        let t = batch.t;
        self.replace(layer, t)?;
        self.predict(layer, t);
        let replayed = Batch {
            routes: &self.routes,
            ffn: batch.ffn.clone(),
            ..*batch
        };
        self.inner.forward_add(backend, layer, &replayed, out, x)?;
        self.done(layer, t);
        Ok(())
    }

    fn launches_run_now(&mut self, now: bool) {
        self.inner.launches_run_now(now);
    }

    fn end_forward(&mut self, backend: &B) -> crate::Result<()> {
        self.inner.end_forward(backend)
    }

    fn after_forward(&mut self, backend: &B) -> crate::Result<()> {
        self.inner.after_forward(backend)
    }

    /// A decode token's replayed routes for every layer go to the inner executor, which may
    /// route the token on the device with them (gated decode); else its routing comes to the
    /// host to be replaced.
    fn decode_on_device(&mut self, backend: &B) -> crate::Result<bool> {
        let seq = *self.seq.get_or_insert(0);
        let token = self.replay.starts[seq] + self.taken;
        let mut all = Vec::new();
        for l in 0..=self.last_layer {
            all.extend_from_slice(self.replay.get(token, l)?);
        }
        self.on_device = self.inner.decode_replayed(backend, &all)?;
        if self.on_device {
            self.taken += 1;
        }
        Ok(self.on_device)
    }

    fn forward_on_device(
        &mut self,
        backend: &B,
        layer: usize,
        block: &crate::model::MoeBlock<'_>,
        xs: &mut B::Buf,
        x: &mut B::Buf,
        before: crate::model::BeforeExperts<'_, B>,
    ) -> crate::Result<crate::model::OnDevice> {
        match self.on_device {
            true => self
                .inner
                .forward_on_device(backend, layer, block, xs, x, before),
            false => Ok(crate::model::OnDevice::No),
        }
    }
}

impl<B: Backend> ExpertReport for Replayed<'_, B> {
    fn describe(&self) -> String {
        format!(
            "{}; routing replayed from {} ({} tokens)",
            self.inner.describe(),
            self.replay.path.display(),
            self.replay.tokens()
        )
    }
    fn stats(&self) -> ExpertStats {
        self.inner.stats()
    }
    fn reset_stats(&mut self) {
        self.inner.reset_stats();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::experts::trace::{TraceHeader, TraceRecord, TracedRoute};
    use crate::experts::Precision;

    /// Records what it was asked to compute.
    struct Spy<'a>(&'a std::cell::RefCell<Vec<(usize, usize, Vec<usize>)>>);

    impl ExpertExecutor<CpuBackend> for Spy<'_> {
        fn forward(
            &mut self,
            _b: &CpuBackend,
            layer: usize,
            batch: &Batch<'_, Vec<f32>>,
            _out: &mut Vec<f32>,
        ) -> crate::Result<()> {
            let experts = batch.routes.iter().map(|r| r.expert).collect();
            self.0.borrow_mut().push((layer, batch.t, experts));
            Ok(())
        }
    }

    impl ExpertReport for Spy<'_> {
        fn describe(&self) -> String {
            "spy".into()
        }
    }

    fn header(layers: usize) -> TraceHeader {
        TraceHeader {
            model: "m".into(),
            layers,
            experts: 8,
            top_k: 2,
            high: "f16".into(),
            low: None,
            high_bytes: 1,
            low_bytes: 0,
            t1: 1.0,
            t2: 1.0,
            pred_depth: 0,
        }
    }

    /// Token `tok` of sequence `seq` at trace layer `l` routes experts (10 seq + tok + l) % 8
    /// (weight 0.3) and the next one (0.7).
    fn trace(layers: usize, seqs: &[u64]) -> Trace {
        let mut records = Vec::new();
        for (seq, &n) in seqs.iter().enumerate() {
            for tok in 0..n {
                for layer in 0..layers {
                    let e = (10 * seq + tok as usize + layer) % 8;
                    let r = |expert, weight| TracedRoute {
                        expert,
                        weight,
                        precision: Precision::High,
                    };
                    records.push(TraceRecord {
                        seq: seq as u64,
                        tok,
                        layer,
                        routes: vec![r(e, 0.3), r((e + 1) % 8, 0.7)],
                        pred: Vec::new(),
                    });
                }
            }
        }
        Trace {
            header: header(layers),
            records,
        }
    }

    #[test]
    fn layers_wrap_tokens_advance_and_sequences_move_on() {
        let seen = std::cell::RefCell::new(Vec::new());
        let replay = Replay::from_trace(Path::new("t"), trace(3, &[2, 3]), (8, 2)).unwrap();
        assert_eq!(replay.tokens(), 5);
        let mut ex = Replayed::new(Box::new(Spy(&seen)), replay, 4);
        let b = CpuBackend::new(1).unwrap();
        let (xs, mut out) = (vec![0.0; 4], vec![0.0; 4]);
        let mut layers = |ex: &mut Replayed<'_, CpuBackend>, t: usize| {
            for l in 0..4 {
                let batch = Batch {
                    xs: &xs,
                    t,
                    hidden: 2,
                    routes: &[],
                    ffn: crate::model::experts::ExpertFfn::PLAIN,
                };
                ex.forward(&b, l, &batch, &mut out).unwrap();
            }
        };
        // Sequence 1: a prefill of 2 tokens, then one more: runs into the trace's sequence 1.
        ex.begin_sequence().unwrap();
        layers(&mut ex, 2);
        layers(&mut ex, 1);
        // Sequence 2 starts at the trace's sequence 1; sequence 3 wraps to the trace's first.
        ex.begin_sequence().unwrap();
        layers(&mut ex, 1);
        ex.begin_sequence().unwrap();
        ex.begin_sequence().unwrap();
        layers(&mut ex, 1);
        // Descending weight: the expert after e first.
        let pair = |seq: usize, tok: usize, l: usize| {
            let e = (10 * seq + tok + l) % 8;
            vec![(e + 1) % 8, e]
        };
        drop(ex);
        let seen = seen.into_inner();
        let mut want = Vec::new();
        for l in 0..4 {
            want.push((l, 2, [pair(0, 0, l % 3), pair(0, 1, l % 3)].concat()));
        }
        for l in 0..4 {
            want.push((l, 1, pair(1, 0, l % 3)));
        }
        for l in 0..4 {
            want.push((l, 1, pair(1, 0, l % 3)));
        }
        for l in 0..4 {
            want.push((l, 1, pair(0, 0, l % 3)));
        }
        assert_eq!(seen, want);
    }

    /// Takes decode tokens on the device (their replayed routes, recorded), and records what the
    /// host asks it to compute as Spy does.
    struct DeviceSpy<'a>(Spy<'a>, &'a std::cell::RefCell<Vec<Vec<usize>>>);

    impl ExpertExecutor<CpuBackend> for DeviceSpy<'_> {
        fn forward(
            &mut self,
            b: &CpuBackend,
            layer: usize,
            batch: &Batch<'_, Vec<f32>>,
            out: &mut Vec<f32>,
        ) -> crate::Result<()> {
            self.0.forward(b, layer, batch, out)
        }

        fn decode_replayed(&mut self, _b: &CpuBackend, routes: &[Route]) -> crate::Result<bool> {
            self.1
                .borrow_mut()
                .push(routes.iter().map(|r| r.expert).collect());
            Ok(true)
        }
    }

    impl ExpertReport for DeviceSpy<'_> {
        fn describe(&self) -> String {
            "device spy".into()
        }
    }

    /// A decode token routed on the device gets every layer's replayed routes at once, and
    /// takes its trace token: the next host-routed token replays the one after it.
    #[test]
    fn a_device_routed_token_takes_every_layers_routes_and_its_trace_token() {
        let (seen, device) = (std::cell::RefCell::new(Vec::new()), Default::default());
        let replay = Replay::from_trace(Path::new("t"), trace(3, &[1, 3]), (8, 2)).unwrap();
        let spy = DeviceSpy(Spy(&seen), &device);
        let mut ex = Replayed::new(Box::new(spy), replay, 4);
        let b = CpuBackend::new(1).unwrap();
        let (xs, mut out) = (vec![0.0; 4], vec![0.0; 4]);
        ex.begin_sequence().unwrap();
        assert!(ex.decode_on_device(&b).unwrap());
        for l in 0..4 {
            let batch = Batch {
                xs: &xs,
                t: 1,
                hidden: 2,
                routes: &[],
                ffn: crate::model::experts::ExpertFfn::PLAIN,
            };
            ex.forward(&b, l, &batch, &mut out).unwrap();
        }
        let pair = |seq: usize, tok: usize, l: usize| {
            let e = (10 * seq + tok + l) % 8;
            vec![(e + 1) % 8, e]
        };
        drop(ex);
        // The trace's first sequence is one token long: the host's token runs into the next.
        let all: Vec<usize> = (0..4).flat_map(|l| pair(0, 0, l % 3)).collect();
        assert_eq!(device.into_inner(), vec![all]);
        let want: Vec<_> = (0..4).map(|l| (l, 1, pair(1, 0, l % 3))).collect();
        assert_eq!(seen.into_inner(), want);
    }

    #[test]
    fn shape_mismatch_and_dense_layers_are_errors() {
        let e = Replay::from_trace(Path::new("t.jsonl"), trace(2, &[1]), (4, 2)).unwrap_err();
        assert!(
            e.to_string()
                .contains("t.jsonl: the trace routes top-2 of 8 experts, the model top-2 of 4"),
            "{e}"
        );
        let mut t = trace(2, &[2]);
        t.records.retain(|r| r.layer == 0);
        let replay = Replay::from_trace(Path::new("t.jsonl"), t, (8, 2)).unwrap();
        let seen = std::cell::RefCell::new(Vec::new());
        let mut ex = Replayed::new(Box::new(Spy(&seen)), replay, 2);
        let b = CpuBackend::new(1).unwrap();
        let (xs, mut out) = (vec![0.0; 4], vec![0.0; 4]);
        ex.begin_sequence().unwrap();
        let batch = Batch {
            xs: &xs,
            t: 1,
            hidden: 4,
            routes: &[],
            ffn: crate::model::experts::ExpertFfn::PLAIN,
        };
        ex.forward(&b, 0, &batch, &mut out).unwrap();
        let e = ex.forward(&b, 1, &batch, &mut out).unwrap_err();
        assert!(e.to_string().contains("no routing for its layer 1"), "{e}");
    }
}
