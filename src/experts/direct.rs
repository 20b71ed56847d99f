//! Experts computed straight from the mapped file by a backend whose buffers are host memory
//! (the CPU), each route in the variant the precision plan picks (HOBBIT's scorer: high, low or
//! skipped). Nothing is cached or loaded: every expert is in memory already.

use super::engine::{ExpertReport, ExpertStats, VariantStats};
use super::predictor::Predictor;
use super::trace::TraceWriter;
use super::{LayerPlan, PrecisionPlan};
use crate::format::HobFile;
use crate::model::experts::ExpertFfn;
use crate::model::{Backend, Batch, ExpertExecutor, Route};
use crate::quant::Matrix;

pub struct DirectExperts<'a> {
    file: &'a HobFile,
    plan: PrecisionPlan,
    hidden: usize,
    ffn: usize,
    layer_plan: LayerPlan,
    /// (n, hidden) gathered inputs of one expert
    xs: Vec<f32>,
    /// (n, ffn)
    gate: Vec<f32>,
    /// (n, ffn)
    up: Vec<f32>,
    /// (n, hidden)
    down: Vec<f32>,
    /// Uses per variant, and skips.
    uses: Vec<u64>,
    skipped: u64,
    trace: Option<TraceWriter>,
    /// Stacked-gate prediction, scored only (nothing to prefetch: every expert is in memory).
    predictor: Option<Predictor>,
    pred_logits: Vec<f32>,
    /// A replayed routing's prediction for the layer about to run (replayed_predictions).
    replayed_pred: Option<Vec<(usize, Vec<Route>)>>,
}

impl<'a> DirectExperts<'a> {
    /// One variant (an index into `file.variants()`) for every expert.
    pub fn new(file: &'a HobFile, variant: usize) -> crate::Result<Self> {
        Self::with_plan(file, PrecisionPlan::single(variant))
    }

    /// Experts in the plan's high and low variants.
    pub fn with_plan(file: &'a HobFile, plan: PrecisionPlan) -> crate::Result<Self> {
        for v in std::iter::once(plan.high).chain(plan.low) {
            if v >= file.variants().len() {
                return Err(crate::Error::Invalid(format!(
                    "expert variant index {v} out of range: the file stores {}",
                    file.variants().len()
                )));
            }
        }
        let (hidden, ffn) = file.expert_dims();
        Ok(DirectExperts {
            file,
            plan,
            hidden,
            ffn,
            layer_plan: LayerPlan::default(),
            xs: Vec::new(),
            gate: Vec::new(),
            up: Vec::new(),
            down: Vec::new(),
            uses: vec![0; file.variants().len()],
            skipped: 0,
            trace: None,
            predictor: None,
            pred_logits: Vec::new(),
            replayed_pred: None,
        })
    }

    /// Score stacked-gate predictions `depth` layers ahead against the routes taken (reported
    /// in the stats, as the GPU engine does; the CPU has nothing to prefetch).
    pub fn with_predictor(
        mut self,
        model: &crate::model::Model<'_>,
        depth: usize,
    ) -> crate::Result<Self> {
        if depth > 0 && model.cfg.moe_layers() > 1 {
            let routers: Vec<Matrix<'_>> = model
                .weights()
                .layers
                .iter()
                .filter_map(|l| l.router)
                .collect();
            self.predictor = Some(Predictor::new(&routers, depth, model.cfg.top_k)?);
        }
        Ok(self)
    }

    /// Record every routing decision into `trace` (`--record-trace`).
    pub fn with_trace(mut self, trace: Option<TraceWriter>) -> Self {
        self.trace = trace;
        self
    }

    /// Compute one expert (layer, expert, variant) on the rows of `xs` listed in `rows`, adding
    /// weight * expert(x) into those rows of `out`.
    fn compute<B: Backend<Buf = Vec<f32>>>(
        &mut self,
        b: &B,
        (layer, expert, variant): (usize, usize, usize),
        (rows, ffn): (&[(usize, f32)], &ExpertFfn),
        xs: &[f32],
        out: &mut [f32],
    ) -> crate::Result<()> {
        let (h, f) = (self.hidden, self.ffn);
        let n = rows.len();
        // Its checksum, the first time this process reads the blob.
        self.file.verify_expert(layer, expert, variant)?;
        let view = self.file.expert(layer, expert, variant);
        self.xs.resize(n * h, 0.0);
        self.gate.resize(n * f, 0.0);
        self.up.resize(n * f, 0.0);
        self.down.resize(n * h, 0.0);
        for (j, &(i, _)) in rows.iter().enumerate() {
            self.xs[j * h..(j + 1) * h].copy_from_slice(&xs[i * h..(i + 1) * h]);
        }
        // Mixtral's expert: w2(silu(w1(x)) * w3(x)); gpt-oss's with biases and its activation.
        b.matmul(&Matrix::from_view(view.gate()), &self.xs, n, &mut self.gate)?;
        b.matmul(&Matrix::from_view(view.up()), &self.xs, n, &mut self.up)?;
        ffn.activate(&mut self.gate, &self.up, f, |_| expert);
        b.matmul(
            &Matrix::from_view(view.down()),
            &self.gate,
            n,
            &mut self.down,
        )?;
        if let Some(bias) = ffn.down_bias(expert, h) {
            for row in self.down.chunks_exact_mut(h) {
                row.iter_mut().zip(bias).for_each(|(d, b)| *d += b);
            }
        }
        for (j, &(i, w)) in rows.iter().enumerate() {
            for (o, &d) in out[i * h..(i + 1) * h]
                .iter_mut()
                .zip(&self.down[j * h..(j + 1) * h])
            {
                *o += w * d;
            }
        }
        Ok(())
    }
}

impl<B: Backend<Buf = Vec<f32>>> ExpertExecutor<B> for DirectExperts<'_> {
    fn begin_sequence(&mut self) -> crate::Result<()> {
        if let Some(tw) = self.trace.as_mut() {
            tw.begin_sequence();
        }
        if let Some(p) = self.predictor.as_mut() {
            p.forget();
        }
        Ok(())
    }

    fn replayed_predictions(&mut self, _layer: usize, predicted: Vec<(usize, Vec<Route>)>) {
        self.replayed_pred = Some(predicted);
    }

    fn forward(
        &mut self,
        b: &B,
        layer: usize,
        batch: &Batch<'_, Vec<f32>>,
        out: &mut Vec<f32>,
    ) -> crate::Result<()> {
        let (xs, t, routes) = (batch.xs, batch.t, batch.routes);
        let h = self.hidden;
        if let Some(p) = self.predictor.as_mut() {
            // Token by token: score the predictions made for this layer, then predict ahead.
            let k = routes.len() / t.max(1);
            for i in 0..t {
                p.observe(layer, &routes[i * k..(i + 1) * k]);
                if let Some(given) = self.replayed_pred.take() {
                    // A replayed routing's recorded prediction (decode: t = 1).
                    p.given(layer, given);
                } else if let Some(m) = p.stacked(layer) {
                    self.pred_logits.resize(m.rows, 0.0);
                    m.matvec_rows(&xs[i * h..(i + 1) * h], 0..m.rows, &mut self.pred_logits);
                    let logits = std::mem::take(&mut self.pred_logits);
                    p.predict(layer, &logits);
                    self.pred_logits = logits;
                }
            }
        }
        let out = &mut out[..t * h];
        let mut lp = std::mem::take(&mut self.layer_plan);
        self.plan.plan_layer(routes, t, &mut lp);
        self.skipped += lp.skipped as u64;
        if let Some(tw) = self.trace.as_mut() {
            tw.record_layer(layer, routes, &lp.decisions, t, Some(&xs[..t * h]))?;
        }
        out.fill(0.0);
        // Groups in expert order, so each token sums its experts in the same order whatever the
        // batch: prefill and decode agree on the summation.
        for g in &lp.groups {
            let variant = self.plan.variant(g.precision).unwrap_or(self.plan.high);
            self.uses[variant] += g.rows.len() as u64;
            let ffn = (&g.rows[..], &batch.ffn);
            self.compute(b, (layer, g.expert, variant), ffn, xs, out)?;
        }
        self.layer_plan = lp;
        Ok(())
    }
}

impl ExpertReport for DirectExperts<'_> {
    fn describe(&self) -> String {
        let v = self.file.variants();
        let mut s = format!("{}", v[self.plan.high]);
        if !self.plan.is_exact() {
            let th = self.plan.thresholds;
            s += &format!(
                " high, {} low (T1 {}, T2 {})",
                v[self.plan.low.unwrap_or(self.plan.high)],
                th.t1,
                th.t2
            );
        }
        s + " computed on the CPU from the mapped file"
    }

    fn stats(&self) -> ExpertStats {
        ExpertStats {
            per_variant: self
                .file
                .variants()
                .iter()
                .zip(&self.uses)
                .map(|(v, &hits)| VariantStats {
                    name: v.to_string(),
                    hits,
                    misses: 0,
                })
                .collect(),
            skipped: self.skipped,
            prediction: self
                .predictor
                .as_ref()
                .map(|p| {
                    p.accuracy()
                        .iter()
                        .map(|a| (a.predicted, a.correct))
                        .collect()
                })
                .unwrap_or_default(),
            ..Default::default()
        }
    }

    fn reset_stats(&mut self) {
        self.uses.fill(0);
        self.skipped = 0;
        if let Some(p) = self.predictor.as_mut() {
            p.reset_stats();
        }
    }
}

impl Drop for DirectExperts<'_> {
    fn drop(&mut self) {
        if let Some(tw) = self.trace.take() {
            if let Err(e) = tw.finish() {
                log::warn!("{e}");
            }
        }
    }
}
