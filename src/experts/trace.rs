//! Routing traces: which experts each token of each layer selected, with their gate weights and
//! precision decisions, as JSON lines (formats/trace.md). `hob sim` replays them through the
//! cache policies.
//!
//! Line 1 is the header object:
//! `{"hob_trace":1,"model":"mixtral","layers":32,"experts":8,"top_k":2,"high":"f16",
//! "low":"int4","high_bytes":352321536,"low_bytes":99090432,"t1":0.6,"t2":0.9}`
//! (`low` null and `low_bytes` 0 when there is no low variant; the byte counts are one expert's
//! size in that variant). Every further line is one token of one layer:
//! `{"seq":0,"tok":5,"layer":3,"routes":[[6,0.71,"high"],[2,0.29,"low"]]}`, each route
//! `[expert, gate weight, "high"|"low"|"skip"]`, exactly `top_k` of them, distinct experts.
//! Records are in strictly increasing (seq, tok, layer) order; layers a token did not route
//! (dense layers) are simply absent. Blank lines are ignored.
//!
//! Predictions (optional): a header with `"pred_depth":3` says records may carry `"pred"`, what
//! HOBBIT's stacked gates (the next layers' routers applied to this layer's gate input, softmax,
//! top-k) predicted for the following layers: `"pred":[[[4,0.8],[1,0.2]],[[0,0.6],[4,0.4]]]`,
//! one list of `top_k` `[expert, weight]` per distance 1, 2, ... (at most `pred_depth`, never past
//! the model's last layer). `--replay-trace` with `--prefetch` prefetches from them.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::predictor::Predictor;
use super::Precision;
use crate::model::ops::Route;
use crate::Error;

/// The trace format version written in the header's `hob_trace` field.
pub const TRACE_VERSION: u64 = 1;

/// Layers ahead `--record-trace` records the stacked gates' predictions for (HOBBIT recommends
/// prefetching 1-3 layers ahead).
pub const TRACE_PRED_DEPTH: usize = 3;

/// The first line of a trace (its `hob_trace` version field is added on writing).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    pub model: String,
    pub layers: usize,
    pub experts: usize,
    pub top_k: usize,
    /// Name of the high-precision variant (e.g. "f16").
    pub high: String,
    /// Name of the low-precision variant; None: there is none and no route is "low".
    pub low: Option<String>,
    /// Bytes of one expert in the high variant.
    pub high_bytes: u64,
    /// Bytes of one expert in the low variant (0 without one).
    pub low_bytes: u64,
    pub t1: f32,
    pub t2: f32,
    /// Layers ahead the records' `pred` lists reach (0: no predictions recorded).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pred_depth: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl TraceHeader {
    /// The shape and byte-count checks shared by the reader and the writer.
    fn check(&self) -> Result<(), String> {
        // A model's own bounds (model::config::limits): the simulator and replay allocate
        // layers x experts entries.
        use crate::model::config::limits::{EXPERTS, LAYERS};
        if !(LAYERS.0..=LAYERS.1).contains(&self.layers) {
            return Err(format!(
                "layers {} must be in {}..={}",
                self.layers, LAYERS.0, LAYERS.1
            ));
        }
        if !(EXPERTS.0..=EXPERTS.1).contains(&self.experts) {
            return Err(format!(
                "experts {} must be in {}..={}",
                self.experts, EXPERTS.0, EXPERTS.1
            ));
        }
        if self.top_k == 0 || self.top_k > self.experts {
            return Err(format!(
                "top_k {} must be in 1..={} (experts)",
                self.top_k, self.experts
            ));
        }
        if self.high_bytes == 0 {
            return Err("high_bytes must be at least 1".into());
        }
        match self.low {
            Some(_) if self.low_bytes == 0 => {
                return Err("low_bytes must be at least 1 when low is set".into())
            }
            None if self.low_bytes != 0 => {
                return Err("low_bytes must be 0 when low is null".into())
            }
            _ => {}
        }
        if !self.t1.is_finite() || !self.t2.is_finite() {
            return Err("t1 and t2 must be finite numbers".into());
        }
        Ok(())
    }
}

/// One routed expert of a trace record.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TracedRoute {
    pub expert: usize,
    pub weight: f32,
    pub precision: Precision,
}

/// One token of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRecord {
    pub seq: u64,
    pub tok: u64,
    pub layer: usize,
    pub routes: Vec<TracedRoute>,
    /// The stacked gates' prediction for layers layer + 1, layer + 2, ...: (expert, weight) x
    /// top_k per distance (empty: none recorded).
    pub pred: Vec<Vec<(usize, f32)>>,
}

impl TraceRecord {
    /// Index into `routes` of the token's top-1 route: the largest weight, ties to the lower
    /// expert index (the scorer's ranking).
    pub fn top1(&self) -> Option<usize> {
        (0..self.routes.len()).min_by(|&a, &b| {
            let (ra, rb) = (&self.routes[a], &self.routes[b]);
            rb.weight
                .total_cmp(&ra.weight)
                .then(ra.expert.cmp(&rb.expert))
        })
    }
}

/// A whole trace, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub header: TraceHeader,
    pub records: Vec<TraceRecord>,
}

#[derive(Serialize)]
struct HeaderOut<'a> {
    hob_trace: u64,
    #[serde(flatten)]
    header: &'a TraceHeader,
}

#[derive(Serialize)]
struct RecordOut<'a> {
    seq: u64,
    tok: u64,
    layer: usize,
    routes: &'a [(usize, f32, &'static str)],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pred: &'a [Vec<(usize, f32)>],
}

#[derive(Deserialize)]
struct RecordIn {
    seq: u64,
    tok: u64,
    layer: usize,
    routes: Vec<(usize, f32, String)>,
    #[serde(default)]
    pred: Vec<Vec<(usize, f32)>>,
}

/// A record checked against the header and the record before it (`last`: its (seq, tok,
/// layer)); Err: what is wrong with it.
fn check_record(
    h: &TraceHeader,
    rec: RecordIn,
    last: &mut Option<(u64, u64, usize)>,
) -> Result<TraceRecord, String> {
    if rec.layer >= h.layers {
        return Err(format!("layer {} >= layers {}", rec.layer, h.layers));
    }
    if rec.routes.len() != h.top_k {
        return Err(format!(
            "{} routes, the header's top_k is {}",
            rec.routes.len(),
            h.top_k
        ));
    }
    let key = (rec.seq, rec.tok, rec.layer);
    if let Some(prev) = *last {
        if key <= prev {
            return Err(format!(
                "(seq {}, tok {}, layer {}) after (seq {}, tok {}, layer {}): records must be in \
                 increasing (seq, tok, layer) order",
                key.0, key.1, key.2, prev.0, prev.1, prev.2
            ));
        }
    }
    *last = Some(key);
    let routes = check_routes(h, rec.routes)?;
    check_predictions(h, rec.layer, &rec.pred)?;
    Ok(TraceRecord {
        seq: rec.seq,
        tok: rec.tok,
        layer: rec.layer,
        routes,
        pred: rec.pred,
    })
}

/// A record's routes: distinct experts of the model, finite weights, known precisions.
fn check_routes(
    h: &TraceHeader,
    routes: Vec<(usize, f32, String)>,
) -> Result<Vec<TracedRoute>, String> {
    let mut out: Vec<TracedRoute> = Vec::with_capacity(routes.len());
    for (expert, weight, p) in routes {
        if expert >= h.experts {
            return Err(format!("expert {expert} >= experts {}", h.experts));
        }
        if out.iter().any(|r| r.expert == expert) {
            return Err(format!("expert {expert} routed twice"));
        }
        if !weight.is_finite() {
            return Err(format!("expert {expert}: weight {weight} is not finite"));
        }
        let precision = match p.as_str() {
            "high" => Precision::High,
            "low" if h.low.is_some() => Precision::Low,
            "low" => {
                return Err(format!(
                    "expert {expert} is \"low\" but the header has no low variant"
                ))
            }
            "skip" => Precision::Skip,
            other => {
                return Err(format!(
                    "expert {expert}: unknown precision {other:?} (high, low or skip)"
                ))
            }
        };
        out.push(TracedRoute {
            expert,
            weight,
            precision,
        });
    }
    Ok(out)
}

/// A record's stacked-gate predictions: at most the header's depth (within the model), each
/// top_k distinct experts with finite weights.
fn check_predictions(
    h: &TraceHeader,
    layer: usize,
    pred: &[Vec<(usize, f32)>],
) -> Result<(), String> {
    if pred.len() > h.pred_depth.min(h.layers - 1 - layer) {
        return Err(format!(
            "{} predicted layers after layer {layer}: the header's pred_depth is {} and the model \
             has {} layers",
            pred.len(),
            h.pred_depth,
            h.layers
        ));
    }
    for (d, p) in pred.iter().enumerate() {
        let what = |m: String| format!("prediction {} layer(s) ahead: {m}", d + 1);
        if p.len() != h.top_k {
            return Err(what(format!(
                "{} routes, the header's top_k is {}",
                p.len(),
                h.top_k
            )));
        }
        for (i, &(e, w)) in p.iter().enumerate() {
            if e >= h.experts || p[..i].iter().any(|q| q.0 == e) || !w.is_finite() {
                return Err(what(format!(
                    "[{e}, {w}]: experts must be distinct and < {}, weights finite",
                    h.experts
                )));
            }
        }
    }
    Ok(())
}

impl Trace {
    /// Read and validate a trace; errors name the file and the 1-based line.
    pub fn read(path: impl AsRef<Path>) -> crate::Result<Trace> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| Error::io(path, "open", e))?;
        Trace::parse(path, BufReader::new(file))
    }

    /// Parse a trace from any reader; `path` only names it in errors.
    pub fn parse(path: &Path, reader: impl BufRead) -> crate::Result<Trace> {
        let bad =
            |line: usize, msg: String| Error::Invalid(format!("{}:{line}: {msg}", path.display()));
        let mut header: Option<TraceHeader> = None;
        let mut records = Vec::new();
        let mut last: Option<(u64, u64, usize)> = None;
        for (i, line) in reader.lines().enumerate() {
            let n = i + 1;
            let line = line.map_err(|e| Error::io(path, "read", e))?;
            if line.trim().is_empty() {
                continue;
            }
            let Some(h) = &header else {
                header =
                    Some(parse_header(&line).map_err(|m| bad(n, format!("trace header: {m}")))?);
                continue;
            };
            let rec: RecordIn =
                serde_json::from_str(&line).map_err(|e| bad(n, format!("bad record: {e}")))?;
            records.push(check_record(h, rec, &mut last).map_err(|m| bad(n, m))?);
        }
        let header = header.ok_or_else(|| {
            Error::Invalid(format!("{}: empty file, no trace header", path.display()))
        })?;
        Ok(Trace { header, records })
    }

    /// Tokens in the trace (distinct (seq, tok) pairs).
    pub fn tokens(&self) -> usize {
        self.records
            .iter()
            .enumerate()
            .filter(|(i, r)| {
                *i == 0 || {
                    let p = &self.records[i - 1];
                    (p.seq, p.tok) != (r.seq, r.tok)
                }
            })
            .count()
    }

    /// Sequences in the trace (distinct seq values).
    pub fn sequences(&self) -> usize {
        self.records
            .iter()
            .enumerate()
            .filter(|(i, r)| *i == 0 || self.records[i - 1].seq != r.seq)
            .count()
    }
}

fn parse_header(line: &str) -> Result<TraceHeader, String> {
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    match value.get("hob_trace").and_then(|v| v.as_u64()) {
        Some(TRACE_VERSION) => {}
        Some(v) => {
            return Err(format!(
                "version {v}, this hob reads version {TRACE_VERSION}"
            ))
        }
        None => return Err("no \"hob_trace\" version field: not a hob trace".into()),
    }
    let header: TraceHeader = serde_json::from_value(value).map_err(|e| e.to_string())?;
    header.check()?;
    Ok(header)
}

/// One record's `pred`: (expert, weight) x top_k per distance.
type Prediction = Vec<Vec<(usize, f32)>>;

/// A batch's layer kept for writing: layer, routes and decisions ([t, top_k]), predictions per
/// token.
type BatchLayer = (usize, Vec<Route>, Vec<Precision>, Vec<Prediction>);

/// Writes a trace as the engine runs.
///
/// Token numbering: within a sequence the first record is token 0, and the token index advances
/// whenever a record's layer is not above the previous record's (the layer wrapped back to 0, or
/// any lower or equal layer); `begin_sequence` starts the next sequence at token 0. Sequences are
/// numbered from 0; `begin_sequence` before any record of the current sequence does nothing.
pub struct TraceWriter {
    path: PathBuf,
    out: BufWriter<File>,
    header: TraceHeader,
    seq: u64,
    tok: u64,
    last_layer: Option<usize>,
    routes: Vec<(usize, f32, &'static str)>,
    /// A batch's layers so far (layer, routes, decisions; [t, top_k] each; predictions per
    /// token), written token-major when its last layer arrives.
    batch: Vec<BatchLayer>,
    /// The model's stacked gates, when predictions are recorded (`create_predicting`).
    predictor: Option<Predictor>,
    /// A write failed: the error was returned and the unfinished file removed.
    failed: bool,
}

impl TraceWriter {
    /// Create (truncate) `path` and write the header.
    pub fn create(path: impl AsRef<Path>, header: &TraceHeader) -> crate::Result<TraceWriter> {
        TraceWriter::create_predicting(path, header, None)
    }

    /// `create`, recording the stacked gates' predictions too where `predictor` is given (its
    /// depth becomes the header's pred_depth): the recorders then pass each layer's gate input
    /// to `record_layer`.
    pub fn create_predicting(
        path: impl AsRef<Path>,
        header: &TraceHeader,
        predictor: Option<Predictor>,
    ) -> crate::Result<TraceWriter> {
        let mut header = header.clone();
        header.pred_depth = predictor.as_ref().map_or(0, Predictor::depth);
        let header = &header;
        let path = path.as_ref().to_path_buf();
        header
            .check()
            .map_err(|m| Error::Invalid(format!("{}: trace header: {m}", path.display())))?;
        let file = File::create(&path).map_err(|e| Error::io(&path, "create", e))?;
        let mut w = TraceWriter {
            out: BufWriter::new(file),
            path,
            header: header.clone(),
            seq: 0,
            tok: 0,
            last_layer: None,
            routes: Vec::new(),
            batch: Vec::new(),
            predictor,
            failed: false,
        };
        let line = HeaderOut {
            hob_trace: TRACE_VERSION,
            header,
        };
        w.write_line(&line)?;
        Ok(w)
    }

    fn write_line(&mut self, v: &impl Serialize) -> crate::Result<()> {
        let res = serde_json::to_writer(&mut self.out, v)
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"));
        res.map_err(|e| self.write_failed(e))
    }

    /// A failed write (a full disk): the unfinished trace is removed (a regular file; not a
    /// device such as /dev/full), and the error says so.
    fn write_failed(&mut self, e: std::io::Error) -> Error {
        let e = crate::error::explain_io(e);
        self.failed = true;
        let removed = std::fs::metadata(&self.path).is_ok_and(|m| m.is_file())
            && std::fs::remove_file(&self.path).is_ok();
        let e = match removed {
            true => std::io::Error::new(e.kind(), format!("{e}; the unfinished trace was removed")),
            false => e,
        };
        Error::io(&self.path, "write", e)
    }

    /// Whether `record_layer` wants the layers' gate inputs.
    pub fn wants_inputs(&self) -> bool {
        self.predictor.is_some()
    }

    /// Start the next sequence (token 0 again).
    pub fn begin_sequence(&mut self) {
        if self.last_layer.is_some() {
            self.seq += 1;
        }
        self.tok = 0;
        self.last_layer = None;
    }

    /// One token of one layer: `decisions[i]` for `routes[i]`. A low decision when the header
    /// has no low variant is written as high (it is computed with the high variant).
    pub fn record(
        &mut self,
        layer: usize,
        routes: &[Route],
        decisions: &[Precision],
    ) -> crate::Result<()> {
        self.record_with(layer, routes, decisions, &[])
    }

    /// `record` with the stacked gates' prediction for the layers after `layer`.
    fn record_with(
        &mut self,
        layer: usize,
        routes: &[Route],
        decisions: &[Precision],
        pred: &[Vec<(usize, f32)>],
    ) -> crate::Result<()> {
        let h = &self.header;
        let bad = |m: String| Error::Invalid(format!("{}: trace record: {m}", self.path.display()));
        if layer >= h.layers {
            return Err(bad(format!("layer {layer} >= layers {}", h.layers)));
        }
        if routes.len() != h.top_k || decisions.len() != h.top_k {
            return Err(bad(format!(
                "{} routes and {} decisions, top_k is {}",
                routes.len(),
                decisions.len(),
                h.top_k
            )));
        }
        if let Some(r) = routes.iter().find(|r| r.expert >= h.experts) {
            return Err(bad(format!("expert {} >= experts {}", r.expert, h.experts)));
        }
        let has_low = h.low.is_some();
        if let Some(last) = self.last_layer {
            if layer <= last {
                self.tok += 1;
            }
        }
        self.last_layer = Some(layer);
        self.routes.clear();
        for (r, d) in routes.iter().zip(decisions) {
            let name = match d {
                Precision::Low if !has_low => Precision::High.name(),
                d => d.name(),
            };
            self.routes.push((r.expert, r.weight, name));
        }
        let routes = std::mem::take(&mut self.routes);
        let res = self.write_line(&RecordOut {
            seq: self.seq,
            tok: self.tok,
            layer,
            routes: &routes,
            pred,
        });
        self.routes = routes;
        res
    }

    /// One layer of a batch of `t` tokens (`routes` and `decisions` are [t, top_k],
    /// token-major). A batch runs layer by layer, but the trace is written token by token: the
    /// layers are kept until the model's last one, then written in (token, layer) order.
    /// `x`: the layer's gate inputs ([t, hidden]), for the predictions when they are recorded
    /// (None: this layer's records carry none).
    pub fn record_layer(
        &mut self,
        layer: usize,
        routes: &[Route],
        decisions: &[Precision],
        t: usize,
        x: Option<&[f32]>,
    ) -> crate::Result<()> {
        let pred: Vec<Prediction> = match (&self.predictor, x) {
            (Some(p), Some(x)) => {
                let hidden = p.hidden();
                if x.len() < t * hidden {
                    return Err(Error::Invalid(format!(
                        "{}: trace record: {} gate input values for {t} tokens of {hidden}",
                        self.path.display(),
                        x.len()
                    )));
                }
                (0..t)
                    .map(|i| {
                        p.predict_host(layer, &x[i * hidden..(i + 1) * hidden])
                            .into_iter()
                            .map(|(_, r)| r.iter().map(|r| (r.expert, r.weight)).collect())
                            .collect()
                    })
                    .collect()
            }
            _ => vec![Vec::new(); t],
        };
        if t <= 1 {
            self.record_with(layer, routes, decisions, &pred[0])?;
        } else {
            self.batch
                .push((layer, routes.to_vec(), decisions.to_vec(), pred));
            if layer + 1 < self.header.layers {
                return Ok(());
            }
            let batch = std::mem::take(&mut self.batch);
            let k = self.header.top_k;
            for i in 0..t {
                for (l, r, d, p) in &batch {
                    self.record_with(*l, &r[i * k..(i + 1) * k], &d[i * k..(i + 1) * k], &p[i])?;
                }
            }
        }
        // Out at each token's end: a full disk is an error of the run, not a warning at exit.
        if layer + 1 == self.header.layers {
            self.out.flush().map_err(|e| self.write_failed(e))?;
        }
        Ok(())
    }

    /// Flush and close.
    pub fn finish(mut self) -> crate::Result<()> {
        if self.failed {
            // Returned when it happened; the file is gone.
            return Ok(());
        }
        self.out.flush().map_err(|e| self.write_failed(e))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use Precision::*;

    pub(crate) fn header() -> TraceHeader {
        TraceHeader {
            model: "tiny".into(),
            layers: 2,
            experts: 4,
            top_k: 2,
            high: "f16".into(),
            low: Some("int4".into()),
            high_bytes: 4,
            low_bytes: 1,
            t1: 0.6,
            t2: 0.9,
            pred_depth: 0,
        }
    }

    fn r(expert: usize, weight: f32) -> Route {
        Route { expert, weight }
    }

    #[test]
    fn writer_roundtrip_and_token_numbering() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let mut w = TraceWriter::create(&path, &header()).unwrap();
        w.begin_sequence(); // before any record: still sequence 0
        w.record(0, &[r(1, 0.7), r(2, 0.3)], &[High, Low]).unwrap();
        w.record(1, &[r(0, 0.95), r(3, 0.05)], &[High, Skip])
            .unwrap();
        w.record(0, &[r(2, 0.5), r(1, 0.5)], &[High, High]).unwrap(); // wrap: token 1
        w.record(0, &[r(3, 0.6), r(1, 0.4)], &[High, High]).unwrap(); // same layer: token 2
        w.begin_sequence();
        w.record(1, &[r(3, 0.6), r(0, 0.4)], &[High, Low]).unwrap();
        assert!(w.record(2, &[r(0, 0.5), r(1, 0.5)], &[High, High]).is_err());
        assert!(w.record(0, &[r(4, 0.5), r(1, 0.5)], &[High, High]).is_err());
        assert!(w.record(0, &[r(0, 1.0)], &[High]).is_err());
        w.finish().unwrap();

        let t = Trace::read(&path).unwrap();
        assert_eq!(t.header, header());
        let keys: Vec<_> = t.records.iter().map(|r| (r.seq, r.tok, r.layer)).collect();
        assert_eq!(
            keys,
            [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 2, 0), (1, 0, 1)]
        );
        assert_eq!(
            t.records[1].routes,
            [
                TracedRoute {
                    expert: 0,
                    weight: 0.95,
                    precision: High
                },
                TracedRoute {
                    expert: 3,
                    weight: 0.05,
                    precision: Skip
                },
            ]
        );
        assert_eq!(t.records[0].routes[1].precision, Low);
        assert_eq!(t.tokens(), 4);
        assert_eq!(t.sequences(), 2);
        // Equal weights: the lower expert is the top-1.
        assert_eq!(t.records[2].top1(), Some(1));
    }

    #[test]
    fn low_without_low_variant_is_written_high() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let h = TraceHeader {
            low: None,
            low_bytes: 0,
            ..header()
        };
        let mut w = TraceWriter::create(&path, &h).unwrap();
        w.record(0, &[r(1, 0.7), r(2, 0.3)], &[High, Low]).unwrap();
        w.finish().unwrap();
        let t = Trace::read(&path).unwrap();
        assert_eq!(t.records[0].routes[1].precision, High);
    }

    fn read_err(text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.jsonl");
        std::fs::write(&path, text).unwrap();
        let e = Trace::read(&path).unwrap_err().to_string();
        assert!(e.contains("bad.jsonl"), "{e}");
        e
    }

    const HEAD: &str = r#"{"hob_trace":1,"model":"m","layers":2,"experts":4,"top_k":2,"high":"f16","low":"int4","high_bytes":4,"low_bytes":1,"t1":0.6,"t2":0.9}"#;

    #[test]
    fn reader_errors_name_line_and_problem() {
        let rec = |s: &str| format!("{HEAD}\n{s}\n");
        assert!(read_err("").contains("no trace header"));
        let e = read_err(r#"{"hob_trace":1,"model":"m","layers":2}"#);
        assert!(
            e.contains("bad.jsonl:1: trace header") && e.contains("missing field"),
            "{e}"
        );
        let e = read_err(r#"{"model":"m"}"#);
        assert!(e.contains(":1:") && e.contains("not a hob trace"), "{e}");
        // A shape no model has (the fuzzer's: the simulator would allocate layers x experts).
        let e = read_err(&HEAD.replace(r#""layers":2"#, r#""layers":666666666666662"#));
        assert!(
            e.contains(":1:") && e.contains("layers 666666666666662 must be in 1..=1024"),
            "{e}"
        );
        let e = read_err(&HEAD.replace(r#""experts":4"#, r#""experts":5000"#));
        assert!(e.contains("experts 5000 must be in 1..=4096"), "{e}");
        let e = read_err(&rec(
            r#"{"seq":0,"tok":0,"layer":0,"routes":[[1,0.5,"high"],"#,
        ));
        assert!(e.contains("bad.jsonl:2: bad record"), "{e}");
        let e = read_err(&rec(
            r#"{"seq":0,"tok":0,"layer":0,"routes":[[4,0.5,"high"],[1,0.5,"low"]]}"#,
        ));
        assert!(e.contains(":2: expert 4 >= experts 4"), "{e}");
        let e = read_err(&rec(
            r#"{"seq":0,"tok":0,"layer":2,"routes":[[0,0.5,"high"],[1,0.5,"low"]]}"#,
        ));
        assert!(e.contains(":2: layer 2 >= layers 2"), "{e}");
        let e = read_err(&rec(
            r#"{"seq":0,"tok":0,"layer":0,"routes":[[0,1.0,"high"]]}"#,
        ));
        assert!(e.contains(":2: 1 routes, the header's top_k is 2"), "{e}");
        let e = read_err(&rec(
            r#"{"seq":0,"tok":0,"layer":0,"routes":[[0,0.5,"high"],[1,0.5,"int3"]]}"#,
        ));
        assert!(
            e.contains(":2: expert 1: unknown precision \"int3\""),
            "{e}"
        );
        let e = read_err(&rec(
            r#"{"seq":0,"tok":0,"layer":0,"routes":[[0,0.5,"high"],[0,0.5,"low"]]}"#,
        ));
        assert!(e.contains("routed twice"), "{e}");
        let two = format!(
            "{HEAD}\n{}\n\n{}\n",
            r#"{"seq":0,"tok":1,"layer":0,"routes":[[0,0.5,"high"],[1,0.5,"low"]]}"#,
            r#"{"seq":0,"tok":0,"layer":1,"routes":[[0,0.5,"high"],[1,0.5,"low"]]}"#
        );
        let e = read_err(&two);
        assert!(
            e.contains("bad.jsonl:4:") && e.contains("increasing (seq, tok, layer)"),
            "{e}"
        );
        let no_low = HEAD
            .replace(r#""int4""#, "null")
            .replace(r#""low_bytes":1"#, r#""low_bytes":0"#);
        let e = read_err(&format!(
            "{no_low}\n{}\n",
            r#"{"seq":0,"tok":0,"layer":0,"routes":[[0,0.5,"high"],[1,0.5,"low"]]}"#
        ));
        assert!(e.contains("no low variant"), "{e}");
        let e = read_err(&HEAD.replace(r#""top_k":2"#, r#""top_k":5"#));
        assert!(e.contains("top_k 5"), "{e}");
        // Predictions: only with a pred_depth, never past the last layer, top_k distinct experts.
        let r0 = r#"{"seq":0,"tok":0,"layer":0,"routes":[[0,0.5,"high"],[1,0.5,"low"]],"pred":"#;
        let e = read_err(&rec(&format!("{r0}[[[2,0.6],[3,0.4]]]}}")));
        assert!(e.contains(":2: 1 predicted layers after layer 0"), "{e}");
        let deep = HEAD.replace(r#""t2":0.9"#, r#""t2":0.9,"pred_depth":3"#);
        let e = read_err(&format!(
            "{deep}\n{r0}[[[2,0.6],[3,0.4]],[[2,0.6],[3,0.4]]]}}\n"
        ));
        assert!(e.contains("the model has 2 layers"), "{e}");
        let e = read_err(&format!("{deep}\n{r0}[[[2,0.6],[2,0.4]]]}}\n"));
        assert!(e.contains("prediction 1 layer(s) ahead: [2, 0.4]"), "{e}");
        let e = read_err(&format!("{deep}\n{r0}[[[2,1.0]]]}}\n"));
        assert!(e.contains("1 routes, the header's top_k is 2"), "{e}");
        let t = Trace::parse(
            Path::new("t"),
            format!("{deep}\n{r0}[[[2,0.6],[3,0.4]]]}}\n").as_bytes(),
        )
        .unwrap();
        assert_eq!(t.header.pred_depth, 3);
        assert_eq!(t.records[0].pred, vec![vec![(2, 0.6), (3, 0.4)]]);
    }
}
