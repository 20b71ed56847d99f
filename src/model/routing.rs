//! Routing rules: which experts a token's router logits pick, with which weights. Each
//! architecture names its rule (`Architecture::routing`).

use super::forward::all_finite;
use super::ops::Route;

/// How an architecture turns router logits into routes (`'a`: a layer's selection bias).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Routing<'a> {
    /// Softmax over all logits, the top k; their weights renormalized to sum to 1 (Mixtral,
    /// Qwen3-MoE) or used as they are (OLMoE, Qwen2-MoE).
    Softmax { renormalize: bool },
    /// Phi-3.5-MoE's sparsemixer at inference: two experts, each weighted by a softmax over the
    /// logits within a relative `jitter_eps` margin of the best remaining one.
    SparseMixer { jitter_eps: f32 },
    /// gpt-oss: the top k logits, then a softmax over those k.
    TopkSoftmax,
    /// GLM-4.5 and DeepSeek-V3: sigmoid scores, experts picked by score + `bias` (the layer's
    /// score-correction bias) within the best groups; DeepSeek-V2: softmax scores, in groups or
    /// not. Weighted by their scores.
    Grouped {
        rule: Grouped,
        bias: Option<&'a [f32]>,
    },
}

/// Group-limited top-k over scores: sigmoid (GLM-4.5, DeepSeek-V3: a group's score is the sum of
/// its two best choice values) or softmax (DeepSeek-V2: a group's best); the experts of the best
/// `topk_groups` of `groups` compete; the k picked are weighted by their scores, renormalized to
/// sum to 1 (or not), times `scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Grouped {
    pub softmax: bool,
    pub groups: usize,
    pub topk_groups: usize,
    pub renormalize: bool,
    pub scale: f32,
}

impl Grouped {
    /// Softmax scores of every group, unscaled: `route_grouped` without a bias is then
    /// `route_softmax_top` bit for bit (its renormalizing sum's 1e-20 is below the ulp of a
    /// top-k softmax sum, at least 1 / n_experts).
    fn limits_nothing(&self) -> bool {
        self.softmax && self.groups >= 1 && self.topk_groups == self.groups && self.scale == 1.0
    }
}

/// The most groups a grouped router may have (DeepSeek-V3 and GLM-4.5 use 8 or 1).
pub const MAX_GROUPS: usize = 64;

impl<'a> Routing<'a> {
    /// The routes ([k]) of one token's router `logits`.
    pub fn route(self, logits: &[f32], routes: &mut [Route]) {
        match self {
            Routing::Softmax { renormalize } => route_softmax_top(logits, routes, renormalize),
            Routing::SparseMixer { jitter_eps } => route_sparsemixer(logits, routes, jitter_eps),
            Routing::TopkSoftmax => route_topk_softmax(logits, routes),
            Routing::Grouped { rule, bias } => route_grouped(logits, bias, rule, routes),
        }
    }

    /// This rule with a layer's selection bias (used by `Grouped`; the others ignore it).
    /// A grouped rule that limits nothing (softmax scores, every group kept, no bias, unscaled:
    /// DeepSeek-V2-Lite's) becomes the plain softmax top-k, the same bits, whose fused device
    /// kernels (the norm, router and routing in one launch) then take it.
    pub fn with_bias(self, layer_bias: Option<&'a [f32]>) -> Routing<'a> {
        match self {
            Routing::Grouped { rule, .. } if layer_bias.is_none() && rule.limits_nothing() => {
                Routing::Softmax {
                    renormalize: rule.renormalize,
                }
            }
            Routing::Grouped { rule, .. } => Routing::Grouped {
                rule,
                bias: layer_bias,
            },
            other => other,
        }
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Insert (e, v) into `routes` sorted by descending v, keeping its length; strict > keeps the
/// lower index first on ties (as torch.topk).
fn insert_top(routes: &mut [Route], e: usize, v: f32) {
    if let Some(slot) = routes.iter().position(|r| v > r.weight) {
        routes[slot..].rotate_right(1);
        routes[slot] = Route {
            expert: e,
            weight: v,
        };
    }
}

/// GLM-4.5's and DeepSeek-V3's routing ([`Grouped`]) as transformers computes it, in f32;
/// non-finite logits or a bias of the wrong length as in [`route_softmax_topk`].
pub fn route_grouped(logits: &[f32], bias: Option<&[f32]>, g: Grouped, routes: &mut [Route]) {
    let ne = logits.len();
    let valid_groups = g.groups >= 1
        && g.groups <= MAX_GROUPS
        && ne.is_multiple_of(g.groups)
        && (1..=g.groups).contains(&g.topk_groups);
    if !all_finite(logits)
        || routes.len() > ne
        || !valid_groups
        || bias.is_some_and(|b| b.len() != ne)
    {
        return refuse(logits, routes);
    }
    // Softmax scores: exp(l - max) / sum, as route_softmax_top computes them.
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = match g.softmax {
        true => logits.iter().map(|&l| (l - max).exp()).sum(),
        false => 1.0,
    };
    let score = |e: usize| match g.softmax {
        true => (logits[e] - max).exp() / sum,
        false => sigmoid(logits[e]),
    };
    let choice = |e: usize| score(e) + bias.map_or(0.0, |b| b[e]);
    // The kept groups, as a mask: with one group, all of them.
    let size = ne / g.groups;
    let mut kept = u64::MAX;
    if g.topk_groups < g.groups {
        let mut best = [Route {
            expert: usize::MAX,
            weight: f32::NEG_INFINITY,
        }; MAX_GROUPS];
        let best = &mut best[..g.topk_groups];
        for group in 0..g.groups {
            let mut two = [Route {
                expert: usize::MAX,
                weight: f32::NEG_INFINITY,
            }; 2];
            // The sum of the best two (sigmoid), or the best (softmax).
            let two = &mut two[..size.min(if g.softmax { 1 } else { 2 })];
            for e in group * size..(group + 1) * size {
                insert_top(two, e, choice(e));
            }
            insert_top(best, group, two.iter().map(|r| r.weight).sum());
        }
        kept = best.iter().fold(0, |m, r| m | 1u64 << r.expert);
    }
    for r in routes.iter_mut() {
        *r = Route {
            expert: usize::MAX,
            weight: f32::NEG_INFINITY,
        };
    }
    for e in (0..ne).filter(|e| kept >> (e / size) & 1 == 1) {
        insert_top(routes, e, choice(e));
    }
    if routes.iter().any(|r| r.expert >= ne) {
        // Fewer experts in the kept groups than k.
        return refuse(logits, routes);
    }
    for r in routes.iter_mut() {
        r.weight = score(r.expert);
    }
    let norm = match g.renormalize {
        true => routes.iter().map(|r| r.weight).sum::<f32>() + 1e-20,
        false => 1.0,
    };
    for r in routes.iter_mut() {
        r.weight = r.weight / norm * g.scale;
    }
}

/// Routes in range with NaN weights, for logits that have no softmax: the forward pass refuses a
/// NaN weight, naming the layer.
fn refuse(logits: &[f32], routes: &mut [Route]) {
    for (j, r) in routes.iter_mut().enumerate() {
        *r = Route {
            expert: j.min(logits.len().saturating_sub(1)),
            weight: f32::NAN,
        };
    }
}

/// Mixtral routing: softmax over all router logits, keep the top-k (ties: lower index first),
/// renormalize their weights to sum to 1. `routes.len()` is k (at most `logits.len()`).
///
/// A non-finite logit (NaN, or an infinity) has no softmax: the routes are then experts
/// 0..k with NaN weights, an index in range that the caller must not compute with (the
/// forward pass refuses a NaN weight, naming the layer).
pub fn route_softmax_topk(logits: &[f32], routes: &mut [Route]) {
    route_softmax_top(logits, routes, true)
}

/// The softmax's top-k of `logits` into `routes`, renormalized over the top-k or not (OLMoE's
/// and Qwen2-MoE's weights are the softmax's own); non-finite logits as in
/// [`route_softmax_topk`].
pub fn route_softmax_top(logits: &[f32], routes: &mut [Route], renormalize: bool) {
    if !all_finite(logits) || routes.len() > logits.len() {
        return refuse(logits, routes);
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    for r in routes.iter_mut() {
        *r = Route {
            expert: usize::MAX,
            weight: f32::NEG_INFINITY,
        };
    }
    for (e, &l) in logits.iter().enumerate() {
        let p = (l - max).exp() / sum;
        // Insertion into the sorted top-k; strict > keeps the lower index first on ties.
        if let Some(slot) = routes.iter().position(|r| p > r.weight) {
            routes[slot..].rotate_right(1);
            routes[slot] = Route {
                expert: e,
                weight: p,
            };
        }
    }
    if renormalize {
        let total: f32 = routes.iter().map(|r| r.weight).sum();
        for r in routes.iter_mut() {
            r.weight /= total;
        }
    }
}

/// gpt-oss's routing: the k largest logits (ties: the lower index first), weighted by the
/// softmax over those k alone; non-finite logits as in [`route_softmax_topk`].
pub fn route_topk_softmax(logits: &[f32], routes: &mut [Route]) {
    if !all_finite(logits) || routes.len() > logits.len() {
        return refuse(logits, routes);
    }
    for r in routes.iter_mut() {
        *r = Route {
            expert: usize::MAX,
            weight: f32::NEG_INFINITY,
        };
    }
    for (e, &l) in logits.iter().enumerate() {
        if let Some(slot) = routes.iter().position(|r| l > r.weight) {
            routes[slot..].rotate_right(1);
            routes[slot] = Route {
                expert: e,
                weight: l,
            };
        }
    }
    let max = routes.first().map_or(0.0, |r| r.weight);
    let sum: f32 = routes.iter().map(|r| (r.weight - max).exp()).sum();
    for r in routes.iter_mut() {
        r.weight = (r.weight - max).exp() / sum;
    }
}

/// Phi-3.5-MoE's sparsemixer, as transformers computes it at inference, for k = 2: the best
/// expert, weighted by the softmax over the logits s with (max - s) / max(|s|, max) <= 2 eps;
/// then the same over the other experts for the second.
pub fn route_sparsemixer(logits: &[f32], routes: &mut [Route], jitter_eps: f32) {
    if !all_finite(logits) || routes.len() != 2 || logits.len() < 2 {
        return refuse(logits, routes);
    }
    let mut excluded = None;
    for r in routes.iter_mut() {
        // The best logit not excluded (ties: the lower index, as torch.max).
        let (mut best, mut max) = (0, f32::NEG_INFINITY);
        for (e, &l) in logits.iter().enumerate() {
            if Some(e) != excluded && l > max {
                (best, max) = (e, l);
            }
        }
        // The softmax over the logits within the margin, evaluated at the best one.
        let kept = |e: usize, l: f32| {
            Some(e) != excluded && (max - l) / l.abs().max(max) <= 2.0 * jitter_eps
        };
        let sum: f32 = logits
            .iter()
            .enumerate()
            .filter(|&(e, &l)| kept(e, l))
            .map(|(_, &l)| (l - max).exp())
            .sum();
        *r = Route {
            expert: best,
            weight: 1.0 / sum,
        };
        excluded = Some(best);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_picks_top_k_and_renormalizes() {
        let mut routes = vec![
            Route {
                expert: 0,
                weight: 0.0
            };
            2
        ];
        route_softmax_topk(&[0.1, 2.0, -1.0, 1.0], &mut routes);
        assert_eq!(routes[0].expert, 1);
        assert_eq!(routes[1].expert, 3);
        let (a, b) = (2.0f32.exp(), 1.0f32.exp());
        assert!((routes[0].weight - a / (a + b)).abs() < 1e-6);
        assert!((routes[0].weight + routes[1].weight - 1.0).abs() < 1e-6);
        route_softmax_topk(&[1.0, 1.0, 1.0, 1.0], &mut routes);
        assert_eq!((routes[0].expert, routes[1].expert), (0, 1));
    }

    #[test]
    fn olmoe_routing_keeps_the_softmax_weights() {
        let logits = [0.5f32, 2.0, -1.0, 1.0];
        let sum: f32 = logits.iter().map(|l| l.exp()).sum();
        let r0 = Route {
            expert: 0,
            weight: 0.0,
        };
        let (mut kept, mut renormalized) = ([r0; 2], [r0; 2]);
        route_softmax_top(&logits, &mut kept, false);
        route_softmax_top(&logits, &mut renormalized, true);
        assert_eq!((kept[0].expert, kept[1].expert), (1, 3));
        assert!((kept[0].weight - 2f32.exp() / sum).abs() < 1e-6);
        assert!((kept[1].weight - 1f32.exp() / sum).abs() < 1e-6);
        assert!((renormalized[0].weight + renormalized[1].weight - 1.0).abs() < 1e-6);
    }

    #[test]
    fn nan_router_logit_is_an_error_not_a_panic() {
        // A NaN logit made every softmax weight NaN: no expert beat the sentinel and the
        // route kept expert usize::MAX, which panicked in the file's expert lookup.
        let mut routes = vec![
            Route {
                expert: 7,
                weight: 0.5
            };
            2
        ];
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            route_softmax_topk(&[0.1, bad, -1.0, 1.0], &mut routes);
            for (j, r) in routes.iter().enumerate() {
                assert_eq!(r.expert, j, "{bad}: an expert in range");
                assert!(
                    r.weight.is_nan(),
                    "{bad}: a weight the forward pass refuses"
                );
            }
        }
        assert!(all_finite(&[0.0; 1000]));
        let mut v = vec![1.0f32; 1000];
        v[999] = f32::INFINITY;
        assert!(!all_finite(&v));
        v[999] = f32::NAN;
        assert!(!all_finite(&v[500..]));
    }

    #[test]
    fn gpt_oss_routing_takes_the_top_logits_then_their_softmax() {
        let r0 = Route {
            expert: 0,
            weight: 0.0,
        };
        let mut routes = [r0; 2];
        route_topk_softmax(&[0.5, 3.0, -1.0, 2.0], &mut routes);
        assert_eq!((routes[0].expert, routes[1].expert), (1, 3));
        let p = 1.0 / (1.0 + (-1.0f32).exp());
        assert!((routes[0].weight - p).abs() < 1e-6);
        assert!((routes[0].weight + routes[1].weight - 1.0).abs() < 1e-6);
        route_topk_softmax(&[0.5, f32::NAN, -1.0, 2.0], &mut routes);
        assert!(routes[0].weight.is_nan());
    }

    #[test]
    fn grouped_routing_picks_within_the_best_groups_by_biased_scores() {
        let r0 = Route {
            expert: 0,
            weight: 0.0,
        };
        let rule = Grouped {
            softmax: false,
            groups: 2,
            topk_groups: 1,
            renormalize: true,
            scale: 2.5,
        };
        // Group 0 = experts 0..4, group 1 = 4..8. By score alone expert 5 is best, but the bias
        // lifts group 0's two best (0 and 2) above group 1's pair.
        let logits = [1.0, -2.0, 0.5, -1.0, 3.0, 2.0, -3.0, -3.0];
        let bias = [0.5, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0];
        let mut routes = [r0; 2];
        route_grouped(&logits, Some(&bias), rule, &mut routes);
        assert_eq!((routes[0].expert, routes[1].expert), (0, 2));
        let (a, b) = (sigmoid(1.0), sigmoid(0.5));
        assert!(
            (routes[0].weight - 2.5 * a / (a + b)).abs() < 1e-6,
            "{routes:?}"
        );
        // Without the bias, group 1 wins.
        route_grouped(&logits, None, rule, &mut routes);
        assert_eq!((routes[0].expert, routes[1].expert), (4, 5));
        // Not renormalized: the scores themselves, scaled.
        let plain = Grouped {
            renormalize: false,
            ..rule
        };
        route_grouped(&logits, None, plain, &mut routes);
        assert!((routes[0].weight - 2.5 * sigmoid(3.0)).abs() < 1e-6);
        // k larger than a kept group, a NaN logit, a bias of the wrong length: refused.
        let mut five = [r0; 5];
        route_grouped(&logits, None, rule, &mut five);
        assert!(five[0].weight.is_nan());
        route_grouped(&[f32::NAN; 8], None, rule, &mut routes);
        assert!(routes[0].weight.is_nan());
        route_grouped(&logits, Some(&bias[..3]), rule, &mut routes);
        assert!(routes[0].weight.is_nan());
        // DeepSeek-V2: softmax scores kept as they are, scaled; a group's best decides.
        let v2 = Grouped {
            softmax: true,
            renormalize: false,
            scale: 1.5,
            ..rule
        };
        route_grouped(&logits, None, v2, &mut routes);
        let sum: f32 = logits.iter().map(|l| (l - 3.0).exp()).sum();
        assert_eq!((routes[0].expert, routes[1].expert), (4, 5));
        assert!((routes[0].weight - 1.5 / sum).abs() < 1e-6, "{routes:?}");
    }

    /// A grouped rule that limits nothing routes as the plain softmax top-k, bit for bit, and
    /// `with_bias` gives that rule (not with a bias, a group limit, sigmoid scores or a scale).
    #[test]
    fn grouped_routing_that_limits_nothing_is_the_plain_softmax() {
        let r0 = Route {
            expert: 0,
            weight: 0.0,
        };
        let mut seed = 7u64;
        for renormalize in [false, true] {
            let rule = Grouped {
                softmax: true,
                groups: 1,
                topk_groups: 1,
                renormalize,
                scale: 1.0,
            };
            for _ in 0..200 {
                let logits: Vec<f32> = (0..64)
                    .map(|_| {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 12.0
                    })
                    .collect();
                let (mut a, mut b) = ([r0; 6], [r0; 6]);
                route_grouped(&logits, None, rule, &mut a);
                route_softmax_top(&logits, &mut b, renormalize);
                let bits = |r: &[Route; 6]| r.map(|r| (r.expert, r.weight.to_bits()));
                assert_eq!(bits(&a), bits(&b), "renormalize {renormalize}");
            }
            let grouped = Routing::Grouped { rule, bias: None };
            assert!(
                matches!(grouped.with_bias(None), Routing::Softmax { renormalize: r } if r == renormalize)
            );
            let bias = [0.0f32; 64];
            assert!(matches!(
                grouped.with_bias(Some(&bias)),
                Routing::Grouped { .. }
            ));
            for other in [
                Grouped { groups: 2, ..rule },
                Grouped {
                    softmax: false,
                    ..rule
                },
                Grouped { scale: 2.5, ..rule },
            ] {
                let g = Routing::Grouped {
                    rule: other,
                    bias: None,
                };
                assert!(
                    matches!(g.with_bias(None), Routing::Grouped { .. }),
                    "{other:?}"
                );
            }
        }
    }

    #[test]
    fn sparsemixer_weights_the_experts_within_its_margin() {
        let r0 = Route {
            expert: 0,
            weight: 0.0,
        };
        let mut routes = [r0; 2];
        // Far apart: each pick alone in its margin, weight 1.
        route_sparsemixer(&[0.0, 10.0, 5.0, -3.0], &mut routes, 0.01);
        assert_eq!((routes[0].expert, routes[1].expert), (1, 2));
        assert_eq!((routes[0].weight, routes[1].weight), (1.0, 1.0));
        // Two logits within 2 eps of the best share the first softmax.
        route_sparsemixer(&[10.0, 9.9, 0.0, 0.0], &mut routes, 0.01);
        let p = 1.0 / (1.0 + (-0.1f32).exp());
        assert_eq!(routes[0].expert, 0);
        assert!((routes[0].weight - p).abs() < 1e-6, "{routes:?}");
        assert_eq!(routes[1].expert, 1);
    }
}
