//! Token-level dynamic precision (HOBBIT Eq. 2).
//!
//! The top-k experts a token selects are ranked by gate weight; an expert's score is the sum of
//! the weights ranked above it, as a share of the selected weights' sum (the top expert scores 0).
//! HOBBIT's Mixtral weights sum to 1; the share makes the score mean the same where they do not
//! (Qwen2-MoE and OLMoE keep softmax weights un-renormalized, Phi's sparsemixer gives each
//! selected expert a weight near 1). Score <= T1: high precision; T1 < score <= T2: low
//! precision; score > T2: skipped. The top-1 expert is always high. With T1 >= 1 every selected
//! expert is high (nothing can score above 1): the exact mode.

use crate::model::ops::Route;

/// What one routed expert of one token is computed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    High,
    Low,
    Skip,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::High => "high",
            Precision::Low => "low",
            Precision::Skip => "skip",
        }
    }
}

/// The two cumulative-gate thresholds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    pub t1: f32,
    pub t2: f32,
}

impl Thresholds {
    /// HOBBIT's values for Mixtral-8x7B (67% high, 30% low, 3% skipped there).
    pub const HOBBIT_MIXTRAL: Thresholds = Thresholds { t1: 0.6, t2: 0.9 };
    /// Every selected expert in high precision, none skipped.
    pub const ALL_HIGH: Thresholds = Thresholds { t1: 1.0, t2: 1.0 };

    /// Checks 0 <= t1 <= t2 <= 1 (finite), naming the flags on error.
    pub fn new(t1: f32, t2: f32) -> crate::Result<Thresholds> {
        let ok = |v: f32| v.is_finite() && (0.0..=1.0).contains(&v);
        if !ok(t1) || !ok(t2) || t1 > t2 {
            return Err(crate::Error::Invalid(format!(
                "--t1 {t1} / --t2 {t2}: need 0 <= T1 <= T2 <= 1"
            )));
        }
        Ok(Thresholds { t1, t2 })
    }

    /// True when nothing can be scored low or skipped.
    pub fn all_high(&self) -> bool {
        self.t1 >= 1.0
    }

    /// The precision of an expert whose higher-ranked experts' weights sum to `score`.
    pub fn classify(&self, score: f32) -> Precision {
        if self.all_high() || score <= self.t1 {
            Precision::High
        } else if score <= self.t2 || self.t2 >= 1.0 {
            Precision::Low
        } else {
            Precision::Skip
        }
    }

    /// Decide every route of one token: `out[i]` for `routes[i]` (any order; ties in weight rank
    /// the lower expert index first). The top-ranked expert is always high.
    pub fn decide(&self, routes: &[Route], out: &mut [Precision]) {
        debug_assert_eq!(routes.len(), out.len());
        let total = selected_sum(routes);
        for (i, r) in routes.iter().enumerate() {
            let above = score(routes, r, total);
            let ranked_first = routes
                .iter()
                .all(|o| o.weight < r.weight || (o.weight == r.weight && o.expert >= r.expert));
            out[i] = if ranked_first {
                Precision::High
            } else {
                self.classify(above)
            };
        }
    }

    /// The score of each route of one token (the share of the weights ranked above it).
    pub fn scores(routes: &[Route], out: &mut Vec<f32>) {
        out.clear();
        let total = selected_sum(routes);
        out.extend(routes.iter().map(|r| score(routes, r, total)));
    }
}

/// The sum of a token's selected weights, or 1 where it cannot divide (none, zero, not finite).
fn selected_sum(routes: &[Route]) -> f32 {
    let total: f32 = routes.iter().map(|r| r.weight).sum();
    if total.is_finite() && total > 0.0 {
        total
    } else {
        1.0
    }
}

/// The weights ranked above `r` (ties: the lower expert index ranks first), as a share of `total`.
fn score(routes: &[Route], r: &Route, total: f32) -> f32 {
    let above: f32 = routes
        .iter()
        .filter(|o| o.weight > r.weight || (o.weight == r.weight && o.expert < r.expert))
        .map(|o| o.weight)
        .sum();
    above / total
}

/// Which stored variants serve as high and low precision, and how to choose between them.
#[derive(Clone, Debug, PartialEq)]
pub struct PrecisionPlan {
    /// Index into the file's variants.
    pub high: usize,
    /// Index into the file's variants; None: low decisions use the high variant.
    pub low: Option<usize>,
    pub thresholds: Thresholds,
    /// After a skip, rescale the kept experts' weights to sum to what the token's routes summed
    /// to (the paper is silent; off by default: a skipped expert just contributes nothing).
    pub renormalize_skips: bool,
}

impl PrecisionPlan {
    /// One variant for every expert, nothing skipped: the exact mode.
    pub fn single(variant: usize) -> PrecisionPlan {
        PrecisionPlan {
            high: variant,
            low: None,
            thresholds: Thresholds::ALL_HIGH,
            renormalize_skips: false,
        }
    }

    /// True when every expert runs in the high variant.
    pub fn is_exact(&self) -> bool {
        self.thresholds.all_high()
    }

    /// The variant a decision computes with (None for a skip).
    pub fn variant(&self, p: Precision) -> Option<usize> {
        match p {
            Precision::High => Some(self.high),
            Precision::Low => Some(self.low.unwrap_or(self.high)),
            Precision::Skip => None,
        }
    }

    /// Decide one token's routes and apply the skip rule: the returned weights are what each
    /// route contributes with (0 for a skipped one).
    pub fn apply(&self, routes: &[Route], decisions: &mut [Precision], weights: &mut [f32]) {
        self.thresholds.decide(routes, decisions);
        let total: f32 = routes.iter().map(|r| r.weight).sum();
        let kept: f32 = routes
            .iter()
            .zip(decisions.iter())
            .filter(|(_, d)| **d != Precision::Skip)
            .map(|(r, _)| r.weight)
            .sum();
        let scale = if self.renormalize_skips && kept > 0.0 && kept < total {
            total / kept
        } else {
            1.0
        };
        for ((w, r), d) in weights.iter_mut().zip(routes).zip(decisions.iter()) {
            *w = if *d == Precision::Skip {
                0.0
            } else {
                r.weight * scale
            };
        }
    }
}

/// The rows of a layer's batch that one expert computes in one precision.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub expert: usize,
    pub precision: Precision,
    /// (token index in the batch, weight it contributes with)
    pub rows: Vec<(usize, f32)>,
}

/// A layer's routes, decided and grouped: what an expert executor computes.
#[derive(Clone, Debug, Default)]
pub struct LayerPlan {
    /// Ordered by expert index, then high before low: every token sums its experts in ascending
    /// index order whatever the batch, so prefill and decode agree.
    pub groups: Vec<Group>,
    /// Per route ([t, top_k], token-major), the decision taken.
    pub decisions: Vec<Precision>,
    /// Routes skipped.
    pub skipped: usize,
    weights: Vec<f32>,
    /// Scratch: sort keys, and row lists of earlier groups for reuse.
    order: Vec<u64>,
    spare: Vec<Vec<(usize, f32)>>,
}

impl PrecisionPlan {
    /// Decide and group a layer's routes ([t, top_k], token-major).
    pub fn plan_layer(&self, routes: &[Route], t: usize, out: &mut LayerPlan) {
        let k = routes.len() / t.max(1);
        out.decisions.clear();
        out.decisions.resize(routes.len(), Precision::High);
        out.weights.clear();
        out.weights.resize(routes.len(), 0.0);
        out.skipped = 0;
        if self.is_exact() {
            // Every route high with its own weight (what apply decides, without the ranking).
            for (w, r) in out.weights.iter_mut().zip(routes) {
                *w = r.weight;
            }
        } else {
            for ((r, d), w) in routes
                .chunks_exact(k.max(1))
                .zip(out.decisions.chunks_exact_mut(k.max(1)))
                .zip(out.weights.chunks_exact_mut(k.max(1)))
            {
                self.apply(r, d, w);
            }
        }
        // Rows of the previous plan's groups are reused (a prefill layer has a thousand routes;
        // this runs between the router's read-back and the first expert launch).
        for mut g in out.groups.drain(..) {
            g.rows.clear();
            out.spare.push(g.rows);
        }
        // One sort of packed (expert, low, route) keys: expert order, high before low, token
        // order within a group.
        out.order.clear();
        out.order.extend(
            (0..routes.len())
                .filter(|&i| out.decisions[i] != Precision::Skip)
                .map(|i| {
                    let low = u64::from(out.decisions[i] != Precision::High);
                    ((routes[i].expert as u64) << 33) | (low << 32) | i as u64
                }),
        );
        out.skipped = routes.len() - out.order.len();
        out.order.sort_unstable();
        for &key in &out.order {
            let i = (key & 0xffff_ffff) as usize;
            let (expert, precision) = (routes[i].expert, out.decisions[i]);
            let row = (i / k.max(1), out.weights[i]);
            match out.groups.last_mut() {
                Some(g) if g.expert == expert && g.precision == precision => g.rows.push(row),
                _ => {
                    let mut rows = out.spare.pop().unwrap_or_default();
                    rows.push(row);
                    out.groups.push(Group {
                        expert,
                        precision,
                        rows,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Precision::*;

    fn r(expert: usize, weight: f32) -> Route {
        Route { expert, weight }
    }

    fn decide(th: Thresholds, routes: &[Route]) -> Vec<Precision> {
        let mut out = vec![Skip; routes.len()];
        th.decide(routes, &mut out);
        out
    }

    #[test]
    fn hobbit_bands_for_top2() {
        let th = Thresholds::HOBBIT_MIXTRAL;
        // Top-2, renormalized: the second expert's score is the first's weight.
        // 0.55 above it: <= T1 -> high.
        assert_eq!(decide(th, &[r(3, 0.55), r(1, 0.45)]), [High, High]);
        // Exactly T1 is still high (score <= T1).
        assert_eq!(decide(th, &[r(3, 0.6), r(1, 0.4)]), [High, High]);
        // 0.75 above: in (T1, T2] -> low.
        assert_eq!(decide(th, &[r(3, 0.75), r(1, 0.25)]), [High, Low]);
        // Exactly T2: low.
        assert_eq!(decide(th, &[r(0, 0.9), r(5, 0.1)]), [High, Low]);
        // 0.95 above: > T2 -> skip.
        assert_eq!(decide(th, &[r(0, 0.95), r(5, 0.05)]), [High, Skip]);
        // Order of the input does not matter; the top one is always high.
        assert_eq!(decide(th, &[r(5, 0.05), r(0, 0.95)]), [Skip, High]);
    }

    #[test]
    fn top4_scores_are_cumulative() {
        // Ranked 2 (0.5), 4 (0.25), 1 (0.125, lower index first), 7 (0.125): scores 0, 0.5,
        // 0.75, 0.875 (binary-exact weights, so the bands are hand-checkable).
        let routes = [r(7, 0.125), r(2, 0.5), r(4, 0.25), r(1, 0.125)];
        let mut s = Vec::new();
        Thresholds::scores(&routes, &mut s);
        assert_eq!(s, [0.875, 0.0, 0.5, 0.75]);
        assert_eq!(
            decide(Thresholds::HOBBIT_MIXTRAL, &routes),
            [Low, High, High, Low]
        );
        assert_eq!(
            decide(Thresholds::new(0.3, 0.5).unwrap(), &routes),
            [Skip, High, Low, Skip]
        );
    }

    #[test]
    fn weights_that_do_not_sum_to_one_score_as_shares() {
        // Phi's sparsemixer: each selected expert's weight near 1. The second scores 0.96 / 1.76
        // of the token's weight (~0.545), not 0.96: high under HOBBIT's T1, not always low.
        let mut s = Vec::new();
        Thresholds::scores(&[r(3, 0.96), r(1, 0.8)], &mut s);
        assert!((s[1] - 0.96 / 1.76).abs() < 1e-6, "{s:?}");
        assert_eq!(
            decide(Thresholds::HOBBIT_MIXTRAL, &[r(3, 0.96), r(1, 0.8)]),
            [High, High]
        );
        // Softmax top-k kept as is (OLMoE, Qwen2-MoE): 0.3 + 0.1 = 0.4 selected, 0.75 above the second.
        assert_eq!(
            decide(Thresholds::HOBBIT_MIXTRAL, &[r(0, 0.3), r(1, 0.1)]),
            [High, Low]
        );
        // Nothing to divide by: the plain sum.
        Thresholds::scores(&[r(0, 0.0), r(1, 0.0)], &mut s);
        assert_eq!(s, [0.0, 0.0]);
    }

    #[test]
    fn top1_is_high_even_with_zero_thresholds() {
        let th = Thresholds::new(0.0, 0.0).unwrap();
        assert_eq!(decide(th, &[r(0, 0.5), r(1, 0.5)]), [High, Skip]);
        // Equal weights: the lower expert index ranks first.
        assert_eq!(decide(th, &[r(4, 0.5), r(2, 0.5)]), [Skip, High]);
    }

    #[test]
    fn all_high_never_lowers_or_skips() {
        let th = Thresholds::ALL_HIGH;
        // Scores can round to just above 1 in f32; the exact mode must not care.
        assert_eq!(
            decide(th, &[r(0, 0.7), r(1, 0.3 + 1e-7), r(2, 1e-9)]),
            [High, High, High]
        );
    }

    #[test]
    fn thresholds_are_checked() {
        assert!(Thresholds::new(0.9, 0.6).is_err());
        assert!(Thresholds::new(-0.1, 0.5).is_err());
        assert!(Thresholds::new(0.5, f32::NAN).is_err());
        assert!(Thresholds::new(0.5, 1.5).is_err());
    }

    #[test]
    fn plan_weights_with_and_without_renormalization() {
        let routes = [r(0, 0.95), r(5, 0.05)];
        let mut plan = PrecisionPlan {
            high: 0,
            low: Some(1),
            thresholds: Thresholds::HOBBIT_MIXTRAL,
            renormalize_skips: false,
        };
        let (mut d, mut w) = ([High; 2], [0.0; 2]);
        plan.apply(&routes, &mut d, &mut w);
        assert_eq!(d, [High, Skip]);
        assert_eq!(w, [0.95, 0.0]);
        plan.renormalize_skips = true;
        plan.apply(&routes, &mut d, &mut w);
        assert!((w[0] - 1.0).abs() < 1e-6 && w[1] == 0.0);
        assert_eq!(plan.variant(Low), Some(1));
        assert_eq!(PrecisionPlan::single(2).variant(Low), Some(2));
        assert_eq!(plan.variant(Skip), None);
    }

    #[test]
    fn layer_plan_groups_by_expert_then_precision() {
        let plan = PrecisionPlan {
            high: 0,
            low: Some(1),
            thresholds: Thresholds::HOBBIT_MIXTRAL,
            renormalize_skips: false,
        };
        // 3 tokens, top-2: (2 high, 0 low), (2 high, 3 high), (0 high, 2 skip).
        let routes = [
            r(2, 0.75),
            r(0, 0.25),
            r(2, 0.5),
            r(3, 0.5),
            r(0, 0.96875),
            r(2, 0.03125),
        ];
        let mut lp = LayerPlan::default();
        plan.plan_layer(&routes, 3, &mut lp);
        assert_eq!(lp.decisions, [High, Low, High, High, High, Skip]);
        assert_eq!(lp.skipped, 1);
        let got: Vec<_> = lp
            .groups
            .iter()
            .map(|g| (g.expert, g.precision, g.rows.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, High, vec![(2, 0.96875)]),
                (0, Low, vec![(0, 0.25)]),
                (2, High, vec![(0, 0.75), (1, 0.5)]),
                (3, High, vec![(1, 0.5)]),
            ]
        );
        // The exact plan groups exactly like plain routing: each expert's (token, weight) rows
        // in token order.
        let mut groups: Vec<Vec<(usize, f32)>> = vec![Vec::new(); 4];
        for (i, token) in routes.chunks_exact(2).enumerate() {
            for r in token {
                groups[r.expert].push((i, r.weight));
            }
        }
        PrecisionPlan::single(0).plan_layer(&routes, 3, &mut lp);
        let flat: Vec<_> = lp
            .groups
            .iter()
            .map(|g| (g.expert, g.rows.clone()))
            .collect();
        let want: Vec<_> = groups
            .into_iter()
            .enumerate()
            .filter(|(_, g)| !g.is_empty())
            .collect();
        assert_eq!(flat, want);
    }
}
