//! Cooperative mode's load-behind, and whether it pays.
//!
//! When the CPU computes a missed expert, the engine may also load it into the cache over an
//! idle link, so that the cache keeps following the routing as it does without CPU experts. That
//! pays when routing has locality (a trained router reuses an expert over neighbouring tokens)
//! and costs when it has none: the load's DMA reads the host memory the CPU experts stream from
//! (slowing them meanwhile) and its victim is as likely to be needed as the newcomer
//! (benches/results/2026-11-23-h100-replayed-routing.md).
//!
//! The judge keeps score with a ghost list. An expert loaded behind the CPU that is hit within
//! [`HORIZON`] tokens is a gain; the expert its slot evicted, missed within the same horizon, is
//! a loss. Under uniform routing the two cancel; under locality gains dominate. Load-behind runs
//! while the decayed net gain per load is at least [`MARGIN`] (the hits that repay the DMA's
//! interference), always for the first [`WARMUP`] loads, and otherwise for one eligible miss in
//! [`PROBE_EVERY`] so that the score follows a change of routing.

use super::ExpertKey;

/// Tokens within which a hit or a miss is credited to a load.
pub const HORIZON: u64 = 8;
/// Net hits per load that make load-behind worth its DMA.
pub const MARGIN: f64 = 0.25;
/// Loads always made before the score decides.
pub const WARMUP: f64 = 16.0;
/// While off, one eligible miss in this many is loaded anyway (to keep measuring).
pub const PROBE_EVERY: u64 = 8;
/// Per-load decay of the score (an effective window of ~1 / (1 - DECAY) loads).
const DECAY: f64 = 0.97;

#[derive(Debug, Default)]
pub struct LoadBehind {
    /// Experts loaded behind the CPU and not yet hit: (key, token of the load).
    loaded: Vec<(ExpertKey, u64)>,
    /// Experts those loads evicted and not yet missed: (key, token of the eviction).
    evicted: Vec<(ExpertKey, u64)>,
    gain: f64,
    loss: f64,
    loads: f64,
    /// Eligible misses not loaded since the last probe.
    passed: u64,
}

impl LoadBehind {
    /// Forget loads and evictions older than the horizon at decode token `token`.
    fn expire(&mut self, token: u64) {
        self.loaded.retain(|&(_, t)| t + HORIZON > token);
        self.evicted.retain(|&(_, t)| t + HORIZON > token);
    }

    /// `key` was used from the cache at decode token `token`.
    pub fn hit(&mut self, key: ExpertKey, token: u64) {
        self.expire(token);
        if let Some(i) = self.loaded.iter().position(|&(k, _)| k == key) {
            self.loaded.swap_remove(i);
            self.gain += 1.0;
        }
    }

    /// `key` missed the cache at decode token `token`.
    pub fn miss(&mut self, key: ExpertKey, token: u64) {
        self.expire(token);
        if let Some(i) = self.evicted.iter().position(|&(k, _)| k == key) {
            self.evicted.swap_remove(i);
            self.loss += 1.0;
        }
    }

    /// Whether to load this CPU-computed miss behind the CPU (the link being idle).
    pub fn wanted(&mut self) -> bool {
        if self.loads < WARMUP || self.net() >= MARGIN {
            self.passed = 0;
            return true;
        }
        self.passed += 1;
        if self.passed >= PROBE_EVERY {
            self.passed = 0;
            return true;
        }
        false
    }

    /// A load behind the CPU of `key` was queued at decode token `token`, evicting `evicted`.
    pub fn loaded(&mut self, key: ExpertKey, evicted: Option<ExpertKey>, token: u64) {
        self.expire(token);
        self.gain *= DECAY;
        self.loss *= DECAY;
        self.loads = self.loads * DECAY + 1.0;
        self.loaded.retain(|&(k, _)| k != key);
        self.loaded.push((key, token));
        if let Some(e) = evicted {
            self.loaded.retain(|&(k, _)| k != e);
            self.evicted.push((e, token));
        }
    }

    /// Decayed net hits per load so far.
    pub fn net(&self) -> f64 {
        if self.loads > 0.0 {
            (self.gain - self.loss) / self.loads
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small LRU cache of `slots` experts of one layer (of `n`) under a routing of top-`k`
    /// experts per token from `route`; every miss is "computed by the CPU" and offered to the
    /// judge. Returns (loads made, eligible misses, final net score).
    fn run(
        tokens: u64,
        slots: usize,
        mut route: impl FnMut(u64) -> Vec<usize>,
    ) -> (usize, usize, f64) {
        let mut cache: Vec<(usize, u64)> = Vec::new(); // (expert, last use)
        let mut judge = LoadBehind::default();
        let (mut loads, mut eligible) = (0, 0);
        for t in 0..tokens {
            for e in route(t) {
                let key = (0, e);
                if let Some(c) = cache.iter_mut().find(|c| c.0 == e) {
                    c.1 = t;
                    judge.hit(key, t);
                    continue;
                }
                judge.miss(key, t);
                eligible += 1;
                if judge.wanted() {
                    loads += 1;
                    let evicted = if cache.len() == slots {
                        let i = (0..slots).min_by_key(|&i| cache[i].1).unwrap();
                        Some((0, cache.swap_remove(i).0))
                    } else {
                        None
                    };
                    cache.push((e, t));
                    judge.loaded(key, evicted, t);
                }
            }
        }
        (loads, eligible, judge.net())
    }

    /// A deterministic xorshift stream.
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    fn two_of(n: usize, r: &mut impl FnMut() -> u64) -> Vec<usize> {
        let a = (r() % n as u64) as usize;
        let mut b = (r() % (n as u64 - 1)) as usize;
        if b >= a {
            b += 1;
        }
        vec![a, b]
    }

    #[test]
    fn uniform_routing_turns_it_off_except_for_probes() {
        let mut r = rng(7);
        let (loads, eligible, net) = run(4000, 2, |_| two_of(8, &mut r));
        assert!(net < MARGIN, "net {net}");
        // Warm-up plus about one probe in PROBE_EVERY (and the odd window the noise lets
        // through): far below every miss.
        assert!(
            (loads as f64) < 0.3 * eligible as f64,
            "{loads} of {eligible}"
        );
        assert!(
            (loads as f64) > 0.9 * eligible as f64 / PROBE_EVERY as f64,
            "{loads} of {eligible}"
        );
    }

    #[test]
    fn sticky_routing_keeps_it_on() {
        // Each token keeps its previous pair with probability 3/4, else draws a new one.
        let mut r = rng(11);
        let mut pair = vec![0, 1];
        let (loads, eligible, net) = run(4000, 2, |_| {
            if r().is_multiple_of(4) {
                pair = two_of(8, &mut r);
            }
            pair.clone()
        });
        assert!(net >= MARGIN, "net {net}");
        assert!(
            loads as f64 > 0.7 * eligible as f64,
            "{loads} of {eligible}"
        );
    }

    #[test]
    fn hits_and_misses_count_only_within_the_horizon() {
        let mut j = LoadBehind::default();
        j.loaded((0, 1), Some((0, 2)), 0);
        j.hit((0, 1), HORIZON); // too late: no gain
        j.miss((0, 2), HORIZON); // too late: no loss
        assert_eq!(j.net(), 0.0);
        j.loaded((0, 3), Some((0, 4)), 10);
        j.hit((0, 3), 11);
        assert!((j.net() - 1.0 / (1.0 + DECAY)).abs() < 1e-12, "{}", j.net());
        j.miss((0, 4), 12);
        j.hit((0, 3), 12); // counted once
        assert_eq!(j.net(), 0.0);
    }
}
