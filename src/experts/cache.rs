//! The precision-aware, sequence-level expert cache policy (HOBBIT §3.4, Eq. 3).
//!
//! Pure bookkeeping: the device code owns the slot memory of two pools (high and low precision)
//! and asks this module which slot to fill and what it evicts. Per (layer, expert), shared by
//! both pools and reset per sequence, it keeps R (last use), F (uses) and H (high-precision
//! uses); T counts the sequence's tokens.
//!
//! R is a fine clock: a use at layer l of token T (1-based) is tick (T-1)·L + l + 1 (0: never
//! used), so LRU order within a token is exact; Eq. 3's R/T term is R / (T·L), in [0, 1]. Every
//! ratio divides by max(T, 1), so all terms are defined (and 0 for unused experts) before the
//! first token; uses recorded before the first `begin_token` count as token 1's.
//!
//! FLD: the paper's prose says experts of nearer layers are more likely to be used next. With
//! l_c the layer being computed and l the candidate's layer, the default (forward) term is
//! 1 - ((l - l_c + L) mod L) / L: the current layer scores 1, the next 1 - 1/L, ..., the layer
//! just computed 1/L, since decoding reaches it last. This is also Eq. 3 read with the paper's
//! own symbol definitions (l_t the candidate's layer, l_i the current one). The opposite reading,
//! 1 - ((l_c - l + L) mod L) / L (l_t taken as the current layer: the layer just computed scores
//! highest), is `Policy::HobbitBackward`, kept so `hob sim` can compare the two.
//!
//! Eviction takes the lowest-priority unprotected entry, ties to the lowest slot index. A key's
//! protection is a count of holds: each `protect` is released by its own `unprotect`, so a key
//! held for two reasons (a prediction and a placement, or an expert's high and low routes in one
//! slot) stays unevictable until both are done.
//! Lru: oldest R. Lfu: fewest F, then oldest R. Hobbit: lowest Eq. 3 value (computed in f64).

use std::fmt;

use serde::Serialize;

use super::trace::Trace;
use super::{ExpertKey, Precision};
use crate::Error;

/// One of the two slot pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    High,
    Low,
}

impl PoolKind {
    fn idx(self) -> usize {
        match self {
            PoolKind::High => 0,
            PoolKind::Low => 1,
        }
    }
}

/// The weights of Eq. 3's four terms (each >= 0, summing to 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HobbitWeights {
    pub lru: f32,
    pub lfu: f32,
    pub lhu: f32,
    pub fld: f32,
}

impl HobbitWeights {
    /// Not from the paper (it publishes none): fitted with `hob sim --fit` on a trace of the
    /// trained-router shakespeare-moe over held-out Hamlet (2026-11-22; -20% miss penalty vs
    /// LRU, mean of 25/50/75% caches; benches/results/2026-11-22-h100-hobbit-ablation.md).
    pub const DEFAULT: HobbitWeights = HobbitWeights {
        lru: 0.5,
        lfu: 0.0,
        lhu: 0.5,
        fld: 0.0,
    };
    /// The first, unfitted default (a recency-led mix), kept for comparison.
    pub const MIX: HobbitWeights = HobbitWeights {
        lru: 0.4,
        lfu: 0.2,
        lhu: 0.3,
        fld: 0.1,
    };
    /// The LHU term alone (ablation).
    pub const LHU: HobbitWeights = HobbitWeights {
        lru: 0.0,
        lfu: 0.0,
        lhu: 1.0,
        fld: 0.0,
    };
    /// The FLD term alone (ablation).
    pub const FLD: HobbitWeights = HobbitWeights {
        lru: 0.0,
        lfu: 0.0,
        lhu: 0.0,
        fld: 1.0,
    };

    /// Checks each weight is finite and >= 0 and that they sum to 1 (within 1e-3).
    pub fn new(lru: f32, lfu: f32, lhu: f32, fld: f32) -> crate::Result<HobbitWeights> {
        let all = [lru, lfu, lhu, fld];
        let sum: f32 = all.iter().sum();
        if all.iter().any(|w| !w.is_finite() || *w < 0.0) || (sum - 1.0).abs() > 1e-3 {
            return Err(Error::Invalid(format!(
                "--cache-weights {lru},{lfu},{lhu},{fld}: need four weights lru,lfu,lhu,fld, \
                 each >= 0, summing to 1"
            )));
        }
        Ok(HobbitWeights { lru, lfu, lhu, fld })
    }

    /// Parse "lru,lfu,lhu,fld", e.g. "0.4,0.2,0.3,0.1".
    pub fn parse(s: &str) -> crate::Result<HobbitWeights> {
        let bad = || {
            Error::Invalid(format!(
                "--cache-weights {s:?}: need four comma-separated numbers lru,lfu,lhu,fld"
            ))
        };
        let v: Vec<f32> = s
            .split(',')
            .map(|x| x.trim().parse::<f32>().map_err(|_| bad()))
            .collect::<crate::Result<_>>()?;
        match v[..] {
            [a, b, c, d] => HobbitWeights::new(a, b, c, d),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for HobbitWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{},{},{}", self.lru, self.lfu, self.lhu, self.fld)
    }
}

/// Which entry an insertion into a full pool evicts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    Lru,
    Lfu,
    /// Eq. 3 with the forward FLD term (the default; see the module doc).
    Hobbit(HobbitWeights),
    /// Eq. 3 with the backward FLD term (the layer just computed scores highest).
    HobbitBackward(HobbitWeights),
}

impl Policy {
    /// The names `parse` accepts.
    pub const NAMES: [&'static str; 7] = [
        "lru",
        "lfu",
        "lhu",
        "fld",
        "fld-back",
        "hobbit",
        "hobbit-back",
    ];

    /// A policy from flags: lru, lfu, hobbit, hobbit-back (these two take `weights`
    /// "lru,lfu,lhu,fld", default `HobbitWeights::DEFAULT`), or the single-term ablations lhu,
    /// fld, fld-back.
    pub fn parse(name: &str, weights: Option<&str>) -> crate::Result<Policy> {
        let w = || weights.map_or(Ok(HobbitWeights::DEFAULT), HobbitWeights::parse);
        let p = match name {
            "hobbit" => return Ok(Policy::Hobbit(w()?)),
            "hobbit-back" => return Ok(Policy::HobbitBackward(w()?)),
            "lru" => Policy::Lru,
            "lfu" => Policy::Lfu,
            "lhu" => Policy::Hobbit(HobbitWeights::LHU),
            "fld" => Policy::Hobbit(HobbitWeights::FLD),
            "fld-back" => Policy::HobbitBackward(HobbitWeights::FLD),
            _ => {
                return Err(Error::Invalid(format!(
                    "cache policy {name:?}: expected one of {}",
                    Policy::NAMES.join(", ")
                )))
            }
        };
        match weights {
            Some(_) => Err(Error::Invalid(format!(
                "--cache-weights only applies to the hobbit policies, not {name}"
            ))),
            None => Ok(p),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Lru => f.write_str("lru"),
            Policy::Lfu => f.write_str("lfu"),
            Policy::Hobbit(w) => write!(f, "hobbit({w})"),
            Policy::HobbitBackward(w) => write!(f, "hobbit-back({w})"),
        }
    }
}

/// Where `insert` put a key, and what it evicted from that slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insertion {
    pub slot: usize,
    pub evicted: Option<ExpertKey>,
}

/// One expert's sequence counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// R: tick of the last use (module doc), 0 if unused this sequence.
    pub last_use: u64,
    /// F: uses this sequence.
    pub uses: u32,
    /// H: high-precision uses this sequence.
    pub high_uses: u32,
}

#[derive(Clone, Debug)]
struct Pool {
    slots: Vec<Option<ExpertKey>>,
    /// Per key index: its slot here.
    slot_of: Vec<Option<usize>>,
    /// Per key index, the holds on it; independent of presence (a key may be protected before
    /// it is inserted).
    protected: Vec<u32>,
    len: usize,
}

impl Pool {
    fn new(slots: usize, keys: usize) -> Pool {
        Pool {
            slots: vec![None; slots],
            slot_of: vec![None; keys],
            protected: vec![0; keys],
            len: 0,
        }
    }
}

/// The cache policy of both pools. Keys must lie inside the model's layers × experts (a key
/// outside panics: a caller bug, traces and routes are validated before they get here).
#[derive(Clone, Debug)]
pub struct ExpertCache {
    policy: Policy,
    n_layers: usize,
    n_experts: usize,
    tokens: u64,
    layer: usize,
    counters: Vec<Counters>,
    pools: [Pool; 2],
    /// Releases of keys nothing held.
    unmatched: u64,
}

impl ExpertCache {
    pub fn new(
        policy: Policy,
        n_layers: usize,
        n_experts: usize,
        high_slots: usize,
        low_slots: usize,
    ) -> Self {
        let keys = n_layers * n_experts;
        ExpertCache {
            policy,
            n_layers,
            n_experts,
            tokens: 0,
            layer: 0,
            counters: vec![Counters::default(); keys],
            unmatched: 0,
            pools: [Pool::new(high_slots, keys), Pool::new(low_slots, keys)],
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn capacity(&self, pool: PoolKind) -> usize {
        self.pools[pool.idx()].slots.len()
    }

    pub fn len(&self, pool: PoolKind) -> usize {
        self.pools[pool.idx()].len
    }

    /// T: tokens begun this sequence.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Start a token: T += 1.
    pub fn begin_token(&mut self) {
        self.tokens += 1;
    }

    /// The layer being computed now (the FLD term's reference point).
    pub fn set_layer(&mut self, layer: usize) {
        self.layer = layer;
    }

    fn index(&self, key: ExpertKey) -> usize {
        assert!(
            key.0 < self.n_layers && key.1 < self.n_experts,
            "expert key {key:?} outside {} layers x {} experts",
            self.n_layers,
            self.n_experts
        );
        key.0 * self.n_experts + key.1
    }

    /// The slot holding `key` in `pool`, if any.
    pub fn lookup(&self, pool: PoolKind, key: ExpertKey) -> Option<usize> {
        self.pools[pool.idx()].slot_of[self.index(key)]
    }

    /// A use by the model at `key`'s layer: updates R and F, and H for a high use. A skip
    /// records nothing.
    pub fn record_use(&mut self, key: ExpertKey, p: Precision) {
        if p == Precision::Skip {
            return;
        }
        let tick = self.tokens.saturating_sub(1) * self.n_layers as u64 + key.0 as u64 + 1;
        let i = self.index(key);
        let c = &mut self.counters[i];
        c.last_use = tick;
        c.uses += 1;
        if p == Precision::High {
            c.high_uses += 1;
        }
    }

    /// R, F and H of `key`.
    pub fn counters(&self, key: ExpertKey) -> Counters {
        self.counters[self.index(key)]
    }

    /// The FLD term of an expert of `layer` (module doc), forward or backward.
    fn fld(&self, layer: usize, backward: bool) -> f64 {
        let l = self.n_layers.max(1);
        let (cur, layer) = (self.layer % l, layer % l);
        let d = if backward {
            (cur + l - layer) % l
        } else {
            (layer + l - cur) % l
        };
        1.0 - d as f64 / l as f64
    }

    /// The policy's priority of `key` now (higher stays longer): Eq. 3 for the Hobbit
    /// policies, R/(T·L) for Lru, F/T for Lfu (whose ties also go by R).
    pub fn priority(&self, key: ExpertKey) -> f64 {
        let c = self.counters(key);
        let t = self.tokens.max(1) as f64;
        let p_lru = c.last_use as f64 / (t * self.n_layers.max(1) as f64);
        let p_lfu = c.uses as f64 / t;
        let p_lhu = c.high_uses as f64 / t;
        let eq3 = |w: &HobbitWeights, backward: bool| {
            f64::from(w.lru) * p_lru
                + f64::from(w.lfu) * p_lfu
                + f64::from(w.lhu) * p_lhu
                + f64::from(w.fld) * self.fld(key.0, backward)
        };
        match &self.policy {
            Policy::Lru => p_lru,
            Policy::Lfu => p_lfu,
            Policy::Hobbit(w) => eq3(w, false),
            Policy::HobbitBackward(w) => eq3(w, true),
        }
    }

    /// (primary, secondary) eviction order: the smallest pair goes first.
    fn order(&self, key: ExpertKey) -> (f64, u64) {
        match self.policy {
            Policy::Lru => (0.0, self.counters(key).last_use),
            Policy::Lfu => {
                let c = self.counters(key);
                (f64::from(c.uses), c.last_use)
            }
            Policy::Hobbit(_) | Policy::HobbitBackward(_) => (self.priority(key), 0),
        }
    }

    /// The slot `insert` would evict in a full pool: lowest priority among unprotected
    /// entries, ties to the lowest slot; None when every entry is protected.
    pub fn victim(&self, pool: PoolKind) -> Option<usize> {
        let p = &self.pools[pool.idx()];
        let mut best: Option<(usize, (f64, u64))> = None;
        for (slot, key) in p.slots.iter().enumerate() {
            let Some(key) = *key else { continue };
            if p.protected[self.index(key)] > 0 {
                continue;
            }
            let o = self.order(key);
            let better = match &best {
                None => true,
                Some((_, b)) => o.0.total_cmp(&b.0).then(o.1.cmp(&b.1)).is_lt(),
            };
            if better {
                best = Some((slot, o));
            }
        }
        best.map(|(slot, _)| slot)
    }

    /// Place `key` in `pool`: its slot if already there (nothing evicted), else the lowest free
    /// slot, else the victim's slot. None when the pool has no slots or all are protected.
    pub fn insert(&mut self, pool: PoolKind, key: ExpertKey) -> Option<Insertion> {
        let i = self.index(key);
        if let Some(slot) = self.pools[pool.idx()].slot_of[i] {
            return Some(Insertion {
                slot,
                evicted: None,
            });
        }
        let free = self.pools[pool.idx()]
            .slots
            .iter()
            .position(Option::is_none);
        let slot = match free {
            Some(s) => s,
            None => self.victim(pool)?,
        };
        let evicted = self.pools[pool.idx()].slots[slot];
        let evicted_index = evicted.map(|k| self.index(k));
        let p = &mut self.pools[pool.idx()];
        if let Some(e) = evicted_index {
            p.slot_of[e] = None;
        } else {
            p.len += 1;
        }
        p.slots[slot] = Some(key);
        p.slot_of[i] = Some(slot);
        Some(Insertion { slot, evicted })
    }

    /// Drop `key` from `pool` (its protection mark stays).
    pub fn remove(&mut self, pool: PoolKind, key: ExpertKey) {
        let i = self.index(key);
        let p = &mut self.pools[pool.idx()];
        if let Some(slot) = p.slot_of[i].take() {
            p.slots[slot] = None;
            p.len -= 1;
        }
    }

    /// One more hold on `key` in `pool`: never evicted while any is left (it may be held before
    /// insertion).
    pub fn protect(&mut self, pool: PoolKind, key: ExpertKey) {
        let i = self.index(key);
        self.pools[pool.idx()].protected[i] += 1;
    }

    /// Release one hold on `key` in `pool`. Releasing a key nothing holds is a caller's
    /// bookkeeping error: counted (`unmatched_releases`), the key stays unheld.
    pub fn unprotect(&mut self, pool: PoolKind, key: ExpertKey) {
        let i = self.index(key);
        let c = &mut self.pools[pool.idx()].protected[i];
        if *c == 0 {
            self.unmatched += 1;
        } else {
            *c -= 1;
        }
    }

    /// Release every hold on every key of both pools.
    pub fn clear_protection(&mut self) {
        for p in &mut self.pools {
            p.protected.fill(0);
        }
    }

    pub fn is_protected(&self, pool: PoolKind, key: ExpertKey) -> bool {
        self.holds(pool, key) > 0
    }

    /// The holds on `key` in `pool`.
    pub fn holds(&self, pool: PoolKind, key: ExpertKey) -> u32 {
        self.pools[pool.idx()].protected[self.index(key)]
    }

    /// How many `unprotect` calls found their key unheld (0 when every release has its hold).
    pub fn unmatched_releases(&self) -> u64 {
        self.unmatched
    }

    /// A new sequence: R, F, H, T and the current layer back to zero; contents and protection
    /// stay.
    pub fn reset_sequence(&mut self) {
        self.counters.fill(Counters::default());
        self.tokens = 0;
        self.layer = 0;
    }

    /// (slot, key) of every entry of `pool`, by slot.
    pub fn entries(&self, pool: PoolKind) -> impl Iterator<Item = (usize, ExpertKey)> + '_ {
        self.pools[pool.idx()]
            .slots
            .iter()
            .enumerate()
            .filter_map(|(s, k)| k.map(|k| (s, k)))
    }
}

/// The default share of the expert cache's bytes for the low-precision pool (`--low-share`, run
/// and sim). Chosen with `hob sim` on a trained router's trace (shakespeare-moe's Hamlet
/// routing, 8 layers, Mixtral's f16 and int4 sizes, T1/T2 calibrated to 67/30/3): at caches of
/// 10, 17, 25, 40 and 60% of the experts, 0.05 missed 4-16% fewer bytes than 0.25 (a missed low
/// route costs 0.28 of a high one; a cached high copy also serves the expert's low routes).
/// Measured on the device under rtx4090-24g and jetson-orin-32g:
/// benches/results/2026-11-23-h100-low-share.md.
pub const DEFAULT_LOW_SHARE: f64 = 0.05;

/// Split a byte budget into pool sizes: `low_share` (clamped to [0, 1]) of the bytes buy low
/// slots of `low_bytes` each (none when `low_bytes` is 0), at least one when the share is above
/// 0 and the budget holds a slot of each; everything left over buys high slots of `high_bytes`
/// each. `hob sim --cache-frac F` uses budget = F × layers × experts × high_bytes (F of the
/// whole model at high precision).
pub fn pool_slots(
    budget_bytes: u64,
    high_bytes: u64,
    low_bytes: u64,
    low_share: f64,
) -> (usize, usize) {
    let share = if low_share.is_nan() {
        0.0
    } else {
        low_share.clamp(0.0, 1.0)
    };
    let low_slots = match low_bytes {
        0 => 0,
        b => {
            let n = ((budget_bytes as f64 * share).floor() as u64) / b;
            if n == 0 && share > 0.0 && budget_bytes >= b + high_bytes {
                1
            } else {
                n
            }
        }
    };
    let left = budget_bytes - low_slots * low_bytes;
    let high_slots = match high_bytes {
        0 => 0,
        b => left / b,
    };
    (high_slots as usize, low_slots as usize)
}

/// Counts of one trace replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct SimResult {
    pub high_hits: u64,
    pub high_misses: u64,
    pub low_hits: u64,
    pub low_misses: u64,
    /// High routes served by the low pool's copy (only with `substitute_low`).
    pub substitutions: u64,
    pub skips: u64,
    /// Misses that found no slot (pool empty or fully protected): loaded, used, not kept.
    pub uncached: u64,
    /// high_misses + low_misses × low_bytes / high_bytes.
    pub penalty: f64,
}

impl SimResult {
    /// Routes computed (everything but skips).
    pub fn served(&self) -> u64 {
        self.high_hits + self.high_misses + self.low_hits + self.low_misses + self.substitutions
    }

    /// Share of the computed routes found in a pool.
    pub fn hit_rate(&self) -> f64 {
        match self.served() {
            0 => 0.0,
            n => (self.high_hits + self.low_hits + self.substitutions) as f64 / n as f64,
        }
    }
}

/// Replay a trace through a cache the way the engine drives it: `reset_sequence` at each new
/// sequence, `begin_token` at each new token, `set_layer` per record. Per layer, every route not
/// skipped is looked up in the pool of its precision; a high route that misses, is not the
/// token's top-1 and is in the low pool is served from there when `substitute_low`. The layer's
/// hits are protected, then each miss is inserted (and protected), then every use is recorded
/// (a substitution as a low use), then protection is cleared.
pub fn simulate(
    trace: &Trace,
    policy: Policy,
    high_slots: usize,
    low_slots: usize,
    substitute_low: bool,
) -> SimResult {
    let h = &trace.header;
    let mut cache = ExpertCache::new(policy, h.layers, h.experts, high_slots, low_slots);
    let mut res = SimResult::default();
    let mut pos: Option<(u64, u64)> = None;
    // (key, pool, hit, precision used)
    let mut plan: Vec<(ExpertKey, PoolKind, bool, Precision)> = Vec::new();
    for rec in &trace.records {
        if pos.map(|p| p.0) != Some(rec.seq) {
            cache.reset_sequence();
        }
        if pos != Some((rec.seq, rec.tok)) {
            cache.begin_token();
        }
        pos = Some((rec.seq, rec.tok));
        cache.set_layer(rec.layer);
        let top1 = rec.top1();
        plan.clear();
        for (i, r) in rec.routes.iter().enumerate() {
            let key = (rec.layer, r.expert);
            match r.precision {
                Precision::Skip => res.skips += 1,
                Precision::High => {
                    if cache.lookup(PoolKind::High, key).is_some() {
                        res.high_hits += 1;
                        plan.push((key, PoolKind::High, true, Precision::High));
                    } else if substitute_low
                        && top1 != Some(i)
                        && cache.lookup(PoolKind::Low, key).is_some()
                    {
                        res.substitutions += 1;
                        plan.push((key, PoolKind::Low, true, Precision::Low));
                    } else {
                        res.high_misses += 1;
                        plan.push((key, PoolKind::High, false, Precision::High));
                    }
                }
                // A low route whose high copy is cached runs from it (low precision is for
                // misses only, as the engine does).
                Precision::Low if cache.lookup(PoolKind::High, key).is_some() => {
                    res.low_hits += 1;
                    plan.push((key, PoolKind::High, true, Precision::High));
                }
                Precision::Low => {
                    let hit = cache.lookup(PoolKind::Low, key).is_some();
                    if hit {
                        res.low_hits += 1;
                    } else {
                        res.low_misses += 1;
                    }
                    plan.push((key, PoolKind::Low, hit, Precision::Low));
                }
            }
        }
        for &(key, pool, hit, _) in &plan {
            if hit {
                cache.protect(pool, key);
            }
        }
        for &(key, pool, hit, _) in &plan {
            if !hit {
                if cache.insert(pool, key).is_some() {
                    cache.protect(pool, key);
                } else {
                    res.uncached += 1;
                }
            }
        }
        for &(key, _, _, p) in &plan {
            cache.record_use(key, p);
        }
        cache.clear_protection();
    }
    res.penalty =
        res.high_misses as f64 + res.low_misses as f64 * h.low_bytes as f64 / h.high_bytes as f64;
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::trace::{TraceRecord, TracedRoute};
    use proptest::prelude::*;
    use PoolKind::{High as HP, Low as LP};
    use Precision::{High, Low, Skip};

    fn full(policy: Policy, l: usize, e: usize, keys: &[ExpertKey]) -> ExpertCache {
        let mut c = ExpertCache::new(policy, l, e, keys.len(), 1);
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(
                c.insert(HP, k),
                Some(Insertion {
                    slot: i,
                    evicted: None
                })
            );
        }
        c
    }

    #[test]
    fn lru_evicts_oldest_use_exact_within_a_token() {
        let (a, b, c) = ((0, 0), (1, 0), (2, 0));
        let mut cache = full(Policy::Lru, 3, 2, &[b, a]);
        cache.begin_token();
        cache.record_use(a, High); // tick 1
        cache.record_use(b, Low); // tick 2: same token, later layer
        assert_eq!(cache.counters(a).last_use, 1);
        assert_eq!(cache.counters(b).last_use, 2);
        assert_eq!(
            cache.insert(HP, c),
            Some(Insertion {
                slot: 1,
                evicted: Some(a)
            })
        );
        // Next token: b was used at tick 2, c never; a later use of b makes c the victim.
        cache.begin_token();
        cache.record_use(b, High); // tick 3 + 1 + 1 = 5
        assert_eq!(cache.counters(b).last_use, 5);
        assert_eq!(cache.lookup(HP, a), None);
        assert_eq!(cache.insert(HP, a).unwrap().evicted, Some(c));
        // Present key: its slot, nothing evicted.
        assert_eq!(
            cache.insert(HP, b),
            Some(Insertion {
                slot: 0,
                evicted: None
            })
        );
    }

    #[test]
    fn lfu_evicts_fewest_uses_ties_by_oldest() {
        let (a, b, c, d) = ((0, 0), (0, 1), (0, 2), (0, 3));
        let mut cache = full(Policy::Lfu, 1, 4, &[a, b, c]);
        cache.begin_token();
        cache.record_use(a, Low); // a: F 1, R 1
        cache.begin_token();
        cache.record_use(c, High); // c: F 1, R 2
        cache.record_use(b, High);
        cache.begin_token();
        cache.record_use(b, High); // b: F 2
                                   // a and c have F 1; a is older.
        assert_eq!(cache.insert(HP, d).unwrap().evicted, Some(a));
        // d: F 0 now; protected, so c (F 1) goes next.
        cache.protect(HP, d);
        assert_eq!(cache.insert(HP, a).unwrap().evicted, Some(c));
        assert!(cache.is_protected(HP, d) && !cache.is_protected(LP, d));
    }

    /// Three experts of a 4-layer model after two tokens, current layer 3:
    /// A=(0,0): R 5, F 2, H 2; B=(1,1): R 6, F 2, H 0; C=(2,2): R 3, F 1, H 1.
    /// With T=2, L=4: p_lru = R/8 = .625/.75/.375, p_lfu = F/2 = 1/1/.5, p_lhu = H/2 = 1/0/.5,
    /// forward FLD = 1 - ((l-3+4)%4)/4 = .75/.5/.25, backward = 1 - ((3-l+4)%4)/4 = .25/.5/.75.
    fn hobbit_case(policy: Policy) -> ExpertCache {
        let (a, b, c) = ((0, 0), (1, 1), (2, 2));
        let mut cache = full(policy, 4, 4, &[a, b, c]);
        cache.begin_token();
        cache.record_use(a, High);
        cache.record_use(b, Low);
        cache.record_use(c, High);
        cache.begin_token();
        cache.record_use(a, High);
        cache.record_use(b, Low);
        cache.set_layer(3);
        cache
    }

    #[test]
    fn hobbit_priorities_by_hand() {
        let (a, b, c, d) = ((0, 0), (1, 1), (2, 2), (3, 3));
        let close = |x: f64, y: f64| (x - y).abs() < 1e-6;
        let cache = hobbit_case(Policy::Hobbit(HobbitWeights::MIX));
        assert_eq!(
            cache.counters(a),
            Counters {
                last_use: 5,
                uses: 2,
                high_uses: 2
            }
        );
        // .4 p_lru + .2 p_lfu + .3 p_lhu + .1 fld
        assert!(close(cache.priority(a), 0.25 + 0.2 + 0.3 + 0.075));
        assert!(close(cache.priority(b), 0.3 + 0.2 + 0.0 + 0.05));
        assert!(close(cache.priority(c), 0.15 + 0.1 + 0.15 + 0.025));
        let victim = |p: Policy| {
            let mut cache = hobbit_case(p);
            cache.insert(HP, d).unwrap().evicted.unwrap()
        };
        assert_eq!(victim(Policy::Hobbit(HobbitWeights::MIX)), c);
        assert_eq!(victim(Policy::Lru), c);
        assert_eq!(victim(Policy::Lfu), c);
        // LHU alone: B has no high uses.
        assert_eq!(victim(Policy::Hobbit(HobbitWeights::LHU)), b);
        // A = .0625+.1+.7+.075, B = .075+.1+0+.05, C = .0375+.05+.35+.025: B lowest.
        let w = HobbitWeights::new(0.1, 0.1, 0.7, 0.1).unwrap();
        assert_eq!(victim(Policy::Hobbit(w)), b);
        // FLD forward drops C (layer 2: from layer 3 it is reached last); backward drops A
        // (layer 0, the farthest behind).
        assert_eq!(victim(Policy::Hobbit(HobbitWeights::FLD)), c);
        assert_eq!(victim(Policy::HobbitBackward(HobbitWeights::FLD)), a);
    }

    #[test]
    fn fld_forward_prefers_the_next_layers() {
        let keys = [(0, 0), (1, 0), (2, 0), (3, 0)];
        let mut cache = full(Policy::Hobbit(HobbitWeights::FLD), 4, 1, &keys);
        cache.set_layer(1);
        let p: Vec<f64> = keys.iter().map(|&k| cache.priority(k)).collect();
        assert_eq!(p, [0.25, 1.0, 0.75, 0.5]);
        let mut back = cache.clone();
        back.policy = Policy::HobbitBackward(HobbitWeights::FLD);
        let p: Vec<f64> = keys.iter().map(|&k| back.priority(k)).collect();
        assert_eq!(p, [0.75, 1.0, 0.25, 0.5]);
    }

    #[test]
    fn before_any_token_everything_is_defined() {
        let mut cache = ExpertCache::new(Policy::Hobbit(HobbitWeights::MIX), 2, 2, 1, 0);
        cache.record_use((1, 1), High);
        let p = cache.priority((1, 1));
        // T = 0 counts as 1: R = 2 (token 1, layer 1), so .4·2/2 + .2 + .3 + .1·(1 - 1/2).
        assert!((p - 0.95).abs() < 1e-6, "{p}");
        assert!((cache.priority((0, 0)) - 0.1).abs() < 1e-7);
    }

    #[test]
    fn protection_capacity_and_remove() {
        let mut cache = ExpertCache::new(Policy::Lru, 1, 4, 2, 0);
        assert_eq!(cache.insert(LP, (0, 0)), None); // no low slots
        cache.protect(HP, (0, 1)); // before insertion
        cache.insert(HP, (0, 0)).unwrap();
        cache.insert(HP, (0, 1)).unwrap();
        cache.protect(HP, (0, 0));
        cache.protect(HP, (0, 0)); // held twice (say a prediction and a placement)
        assert_eq!(cache.insert(HP, (0, 2)), None); // all protected
        cache.unprotect(HP, (0, 0));
        assert_eq!(cache.holds(HP, (0, 0)), 1);
        assert_eq!(cache.insert(HP, (0, 2)), None); // one hold left
        cache.unprotect(HP, (0, 0));
        assert_eq!(cache.unmatched_releases(), 0);
        assert_eq!(cache.insert(HP, (0, 2)).unwrap().evicted, Some((0, 0)));
        cache.unprotect(HP, (0, 0)); // nothing holds it: counted, nothing else released
        assert_eq!(cache.unmatched_releases(), 1);
        assert!(cache.is_protected(HP, (0, 1)));
        cache.remove(HP, (0, 2));
        assert_eq!(cache.len(HP), 1);
        assert_eq!(cache.entries(HP).collect::<Vec<_>>(), [(1, (0, 1))]);
        // The freed slot 0 is filled first, and a removed key keeps no slot.
        assert_eq!(
            cache.insert(HP, (0, 3)),
            Some(Insertion {
                slot: 0,
                evicted: None
            })
        );
        assert_eq!(cache.lookup(HP, (0, 2)), None);
        cache.clear_protection();
        assert!(!cache.is_protected(HP, (0, 1)));
    }

    #[test]
    fn reset_sequence_keeps_contents_and_protection() {
        let mut cache = ExpertCache::new(Policy::Lfu, 2, 2, 2, 2);
        cache.insert(HP, (1, 1)).unwrap();
        cache.protect(HP, (1, 1));
        cache.begin_token();
        cache.set_layer(1);
        cache.record_use((1, 1), High);
        cache.reset_sequence();
        assert_eq!(cache.tokens(), 0);
        assert_eq!(cache.counters((1, 1)), Counters::default());
        assert_eq!(cache.lookup(HP, (1, 1)), Some(0));
        assert!(cache.is_protected(HP, (1, 1)));
    }

    #[test]
    fn weights_and_policy_parsing() {
        assert_eq!(
            HobbitWeights::parse("0.4, 0.2,0.3,0.1").unwrap(),
            HobbitWeights::MIX
        );
        for bad in [
            "0.5,0.5,0.5,0.5",
            "1,0,0",
            "-0.1,0.5,0.5,0.1",
            "a,b,c,d",
            "nan,0,0,1",
        ] {
            let e = HobbitWeights::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--cache-weights"), "{e}");
        }
        assert_eq!(Policy::parse("lru", None).unwrap(), Policy::Lru);
        assert_eq!(
            Policy::parse("hobbit", Some("0.25,0.25,0.25,0.25")).unwrap(),
            Policy::Hobbit(HobbitWeights::new(0.25, 0.25, 0.25, 0.25).unwrap())
        );
        assert_eq!(
            Policy::parse("hobbit-back", None).unwrap(),
            Policy::HobbitBackward(HobbitWeights::DEFAULT)
        );
        assert_eq!(
            Policy::parse("fld", None).unwrap(),
            Policy::Hobbit(HobbitWeights::FLD)
        );
        assert!(Policy::parse("lru", Some("1,0,0,0")).is_err());
        let e = Policy::parse("arc", None).unwrap_err().to_string();
        assert!(e.contains("arc") && e.contains("hobbit"), "{e}");
    }

    #[test]
    fn pool_slots_split() {
        // 1000 bytes, high 100, low 30, a quarter for low: 250/30 = 8 low (240 bytes), the
        // remaining 760 buy 7 high.
        assert_eq!(pool_slots(1000, 100, 30, 0.25), (7, 8));
        assert_eq!(pool_slots(1000, 100, 0, 0.25), (10, 0));
        assert_eq!(pool_slots(1000, 100, 30, 0.0), (10, 0));
        assert_eq!(pool_slots(1000, 100, 30, 1.0), (0, 33));
        assert_eq!(pool_slots(99, 100, 30, 0.25), (0, 0));
        // A share too small for one low slot still gets one when a high slot fits beside it.
        assert_eq!(pool_slots(1000, 100, 30, 0.01), (9, 1));
        assert_eq!(pool_slots(129, 100, 30, 0.01), (1, 0));
        assert_eq!(pool_slots(130, 100, 30, 0.01), (1, 1));
    }

    fn rec(seq: u64, tok: u64, layer: usize, routes: &[(usize, f32, Precision)]) -> TraceRecord {
        TraceRecord {
            seq,
            tok,
            layer,
            routes: routes
                .iter()
                .map(|&(expert, weight, precision)| TracedRoute {
                    expert,
                    weight,
                    precision,
                })
                .collect(),
            pred: Vec::new(),
        }
    }

    /// 2 layers x 4 experts, top-2, a high expert 4 bytes, a low one 1 (a low miss costs 1/4).
    fn tiny_trace() -> Trace {
        Trace {
            header: crate::experts::trace::tests::header(),
            records: vec![
                rec(0, 0, 0, &[(0, 0.7, High), (1, 0.3, Low)]),
                rec(0, 0, 1, &[(2, 0.8, High), (3, 0.2, Skip)]),
                rec(0, 1, 0, &[(0, 0.6, High), (1, 0.4, High)]),
                rec(0, 1, 1, &[(2, 0.5, High), (0, 0.5, Low)]),
                rec(1, 0, 0, &[(1, 0.9, High), (0, 0.1, Low)]),
            ],
        }
    }

    #[test]
    fn simulate_tiny_trace_by_hand() {
        let t = tiny_trace();
        // LRU, 2 high slots, 1 low slot, no substitution:
        // s0t0 L0: (0,0) high miss -> H0; (0,1) low miss -> L0.
        // s0t0 L1: (1,2) high miss -> H1; skip.
        // s0t1 L0: (0,0) hit (protected); (0,1) high miss evicts (1,2), the only unprotected.
        // s0t1 L1: (1,2) high miss: (0,0), (0,1) both used at tick 3, the lower slot (0,0)
        //          goes; (1,0) low miss evicts (0,1) from L.
        // s1t0 L0: (0,1) high hit; (0,0) low miss evicts (1,0).
        let r = simulate(&t, Policy::Lru, 2, 1, false);
        assert_eq!(
            r,
            SimResult {
                high_hits: 2,
                high_misses: 4,
                low_hits: 0,
                low_misses: 3,
                substitutions: 0,
                skips: 1,
                uncached: 0,
                penalty: 4.75,
            }
        );
        // With substitution, s0t1 L0's (0,1) (not top-1) uses the low copy: H keeps (1,2), so
        // s0t1 L1's (1,2) hits; (1,0) low miss evicts (0,1). At s1t0 the top-1 (0,1) cannot
        // substitute: high miss; the low route (0,0) runs from its cached high copy (a low
        // hit, protected), so (0,1) evicts (1,2).
        let r = simulate(&t, Policy::Lru, 2, 1, true);
        assert_eq!(
            r,
            SimResult {
                high_hits: 2,
                high_misses: 3,
                low_hits: 1,
                low_misses: 2,
                substitutions: 1,
                skips: 1,
                uncached: 0,
                penalty: 3.5,
            }
        );
        assert!((r.hit_rate() - 4.0 / 9.0).abs() < 1e-12);
        // No slots at all: every served route misses and nothing is kept.
        let r = simulate(&t, Policy::Lru, 0, 0, false);
        assert_eq!((r.high_misses, r.low_misses, r.uncached), (6, 3, 9));
        assert_eq!(r.penalty, 6.75);
    }

    // ----- property test against a naive reference -----

    #[derive(Clone, Debug)]
    enum Op {
        Begin,
        Layer(usize),
        Use(usize, usize, u8),
        Insert(bool, usize, usize),
        Remove(bool, usize, usize),
        Protect(bool, usize, usize),
        Unprotect(bool, usize, usize),
        ClearProtection,
        Reset,
    }

    fn op() -> impl Strategy<Value = Op> {
        let k = (any::<bool>(), 0..8usize, 0..8usize);
        prop_oneof![
            2 => Just(Op::Begin),
            2 => (0..8usize).prop_map(Op::Layer),
            6 => (0..8usize, 0..8usize, 0..3u8).prop_map(|(l, e, p)| Op::Use(l, e, p)),
            6 => k.clone().prop_map(|(p, l, e)| Op::Insert(p, l, e)),
            1 => k.clone().prop_map(|(p, l, e)| Op::Remove(p, l, e)),
            2 => k.clone().prop_map(|(p, l, e)| Op::Protect(p, l, e)),
            1 => k.prop_map(|(p, l, e)| Op::Unprotect(p, l, e)),
            1 => Just(Op::ClearProtection),
            1 => Just(Op::Reset),
        ]
    }

    fn policy() -> impl Strategy<Value = Policy> {
        let w = (0..=10u8, 0..=10u8, 0..=10u8).prop_filter_map("sum <= 10", |(a, b, c)| {
            let d = 10i32 - i32::from(a) - i32::from(b) - i32::from(c);
            (d >= 0).then(|| {
                HobbitWeights::new(
                    f32::from(a) / 10.0,
                    f32::from(b) / 10.0,
                    f32::from(c) / 10.0,
                    d as f32 / 10.0,
                )
                .unwrap()
            })
        });
        prop_oneof![
            Just(Policy::Lru),
            Just(Policy::Lfu),
            w.clone().prop_map(Policy::Hobbit),
            w.prop_map(Policy::HobbitBackward),
        ]
    }

    /// Straightforward model: vectors of slots and of (key, R, F, H) rows, a list of holds (a
    /// key once per hold).
    struct Reference {
        policy: Policy,
        l: usize,
        t: u64,
        layer: usize,
        stats: Vec<(ExpertKey, u64, u32, u32)>,
        pools: [Vec<Option<ExpertKey>>; 2],
        protected: [Vec<ExpertKey>; 2],
        unmatched: u64,
    }

    impl Reference {
        fn stat(&self, k: ExpertKey) -> (u64, u32, u32) {
            self.stats
                .iter()
                .find(|s| s.0 == k)
                .map_or((0, 0, 0), |s| (s.1, s.2, s.3))
        }

        fn use_(&mut self, k: ExpertKey, p: Precision) {
            if p == Skip {
                return;
            }
            let tick = (self.t.max(1) - 1) * self.l as u64 + k.0 as u64 + 1;
            let h = u32::from(p == High);
            match self.stats.iter_mut().find(|s| s.0 == k) {
                Some(s) => {
                    s.1 = tick;
                    s.2 += 1;
                    s.3 += h;
                }
                None => self.stats.push((k, tick, 1, h)),
            }
        }

        fn prio(&self, k: ExpertKey) -> f64 {
            let (r, f, h) = self.stat(k);
            let t = self.t.max(1) as f64;
            let l = self.l as f64;
            let fld = |backward: bool| {
                let d = if backward {
                    (self.layer + self.l - k.0) % self.l
                } else {
                    (k.0 + self.l - self.layer) % self.l
                };
                1.0 - d as f64 / l
            };
            let eq3 = |w: HobbitWeights, b: bool| {
                f64::from(w.lru) * (r as f64 / (t * l))
                    + f64::from(w.lfu) * (f as f64 / t)
                    + f64::from(w.lhu) * (h as f64 / t)
                    + f64::from(w.fld) * fld(b)
            };
            match self.policy {
                Policy::Hobbit(w) => eq3(w, false),
                Policy::HobbitBackward(w) => eq3(w, true),
                Policy::Lru => r as f64 / (t * l),
                Policy::Lfu => f as f64 / t,
            }
        }

        fn insert(&mut self, pool: usize, k: ExpertKey) -> Option<Insertion> {
            let slots = &self.pools[pool];
            if let Some(s) = slots.iter().position(|x| *x == Some(k)) {
                return Some(Insertion {
                    slot: s,
                    evicted: None,
                });
            }
            let slot = match slots.iter().position(|x| x.is_none()) {
                Some(s) => s,
                None => {
                    let mut cands: Vec<(usize, ExpertKey)> = (0..slots.len())
                        .filter_map(|s| slots[s].map(|k| (s, k)))
                        .filter(|(_, k)| !self.protected[pool].contains(k))
                        .collect();
                    cands.sort_by(|x, y| {
                        let (rx, fx, _) = self.stat(x.1);
                        let (ry, fy, _) = self.stat(y.1);
                        let o = match self.policy {
                            Policy::Lru => rx.cmp(&ry),
                            Policy::Lfu => fx.cmp(&fy).then(rx.cmp(&ry)),
                            _ => self.prio(x.1).partial_cmp(&self.prio(y.1)).unwrap(),
                        };
                        o.then(x.0.cmp(&y.0))
                    });
                    cands.first()?.0
                }
            };
            let evicted = self.pools[pool][slot].replace(k);
            Some(Insertion { slot, evicted })
        }
    }

    fn pool_of(high: bool) -> (PoolKind, usize) {
        if high {
            (HP, 0)
        } else {
            (LP, 1)
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn matches_reference(
            policy in policy(),
            l in 1..4usize,
            e in 1..5usize,
            hs in 0..5usize,
            ls in 0..4usize,
            ops in proptest::collection::vec(op(), 0..200),
        ) {
            let mut cache = ExpertCache::new(policy, l, e, hs, ls);
            let mut re = Reference {
                policy, l, t: 0, layer: 0, stats: Vec::new(),
                pools: [vec![None; hs], vec![None; ls]],
                protected: [Vec::new(), Vec::new()],
                unmatched: 0,
            };
            let all_keys: Vec<ExpertKey> =
                (0..l).flat_map(|a| (0..e).map(move |b| (a, b))).collect();
            for op in ops {
                match op {
                    Op::Begin => { cache.begin_token(); re.t += 1; }
                    Op::Layer(x) => { cache.set_layer(x % l); re.layer = x % l; }
                    Op::Use(a, b, p) => {
                        let p = [High, Low, Skip][p as usize];
                        cache.record_use((a % l, b % e), p);
                        re.use_((a % l, b % e), p);
                    }
                    Op::Insert(h, a, b) => {
                        let ((pk, pi), k) = (pool_of(h), (a % l, b % e));
                        let got = cache.insert(pk, k);
                        prop_assert_eq!(got, re.insert(pi, k));
                        if let Some(Insertion { evicted: Some(v), .. }) = got {
                            prop_assert!(!cache.is_protected(pk, v), "evicted protected {:?}", v);
                        }
                    }
                    Op::Remove(h, a, b) => {
                        let ((pk, pi), k) = (pool_of(h), (a % l, b % e));
                        cache.remove(pk, k);
                        for s in re.pools[pi].iter_mut() {
                            if *s == Some(k) { *s = None; }
                        }
                    }
                    Op::Protect(h, a, b) => {
                        let ((pk, pi), k) = (pool_of(h), (a % l, b % e));
                        cache.protect(pk, k);
                        re.protected[pi].push(k);
                    }
                    Op::Unprotect(h, a, b) => {
                        let ((pk, pi), k) = (pool_of(h), (a % l, b % e));
                        cache.unprotect(pk, k);
                        match re.protected[pi].iter().position(|x| *x == k) {
                            Some(at) => { re.protected[pi].swap_remove(at); }
                            None => re.unmatched += 1,
                        }
                    }
                    Op::ClearProtection => {
                        cache.clear_protection();
                        re.protected = [Vec::new(), Vec::new()];
                    }
                    Op::Reset => {
                        cache.reset_sequence();
                        re.t = 0; re.layer = 0; re.stats.clear();
                        // Same priorities as a fresh cache holding the same entries.
                        let mut fresh = ExpertCache::new(policy, l, e, hs, ls);
                        for pk in [HP, LP] {
                            for (_, k) in cache.entries(pk) { fresh.insert(pk, k); }
                        }
                        for &k in &all_keys {
                            prop_assert_eq!(cache.priority(k), fresh.priority(k));
                            prop_assert_eq!(cache.counters(k), Counters::default());
                        }
                    }
                }
                for (pk, pi) in [(HP, 0), (LP, 1)] {
                    prop_assert!(cache.len(pk) <= cache.capacity(pk));
                    let entries: Vec<_> = cache.entries(pk).collect();
                    prop_assert_eq!(entries.len(), cache.len(pk));
                    let want: Vec<_> = re.pools[pi].iter().enumerate()
                        .filter_map(|(s, k)| k.map(|k| (s, k))).collect();
                    prop_assert_eq!(&entries, &want);
                    for &k in &all_keys {
                        let slot = entries.iter().find(|x| x.1 == k).map(|x| x.0);
                        prop_assert_eq!(cache.lookup(pk, k), slot);
                        let holds = re.protected[pi].iter().filter(|x| **x == k).count();
                        prop_assert_eq!(cache.holds(pk, k) as usize, holds);
                        prop_assert_eq!(cache.is_protected(pk, k), holds > 0);
                    }
                }
                for &k in &all_keys {
                    prop_assert_eq!(cache.priority(k), re.prio(k));
                }
                prop_assert_eq!(cache.unmatched_releases(), re.unmatched);
            }
        }
    }
}
