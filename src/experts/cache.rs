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
    /// Not from the paper (it publishes none): fitted with `hob sim --fit` on a trained router's
    /// trace (benches/results/2026-11-22-h100-hobbit-ablation.md).
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

/// The priority terms of one token and layer (`ExpertCache::ranker`): the same arithmetic, in
/// the same order, as Eq. 3 written out per key.
struct Ranker {
    policy: Policy,
    /// T, and T times the layer count.
    t: f64,
    tl: f64,
    /// The Hobbit policies' weights of R, F and H, and each layer's weighted FLD term.
    eq3: Option<(f64, f64, f64, Vec<f64>)>,
}

impl Ranker {
    fn priority(&self, c: &Counters, layer: usize) -> f64 {
        let p_lru = c.last_use as f64 / self.tl;
        match &self.eq3 {
            Some((lru, lfu, lhu, fld)) => {
                lru * p_lru
                    + lfu * (c.uses as f64 / self.t)
                    + lhu * (c.high_uses as f64 / self.t)
                    + fld[layer]
            }
            None if self.policy == Policy::Lfu => c.uses as f64 / self.t,
            None => p_lru,
        }
    }

    /// (primary, secondary) eviction order: the smallest pair goes first.
    fn order(&self, c: &Counters, layer: usize) -> (f64, u64) {
        match self.policy {
            Policy::Lru => (0.0, c.last_use),
            Policy::Lfu => (c.uses as f64, c.last_use),
            Policy::Hobbit(_) | Policy::HobbitBackward(_) => (self.priority(c, layer), 0),
        }
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
        self.ranker().priority(&c, key.0)
    }

    /// The policy's terms at this token and layer, computed once for a victim search.
    fn ranker(&self) -> Ranker {
        let t = self.tokens.max(1) as f64;
        let eq3 = |w: &HobbitWeights, backward: bool| {
            let fld = (0..self.n_layers)
                .map(|l| f64::from(w.fld) * self.fld(l, backward))
                .collect();
            Some((f64::from(w.lru), f64::from(w.lfu), f64::from(w.lhu), fld))
        };
        Ranker {
            policy: self.policy,
            t,
            tl: t * self.n_layers.max(1) as f64,
            eq3: match &self.policy {
                Policy::Hobbit(w) => eq3(w, false),
                Policy::HobbitBackward(w) => eq3(w, true),
                Policy::Lru | Policy::Lfu => None,
            },
        }
    }

    /// The slot `insert` would evict in a full pool: lowest priority among unprotected
    /// entries, ties to the lowest slot; None when every entry is protected. A scan of every
    /// slot, so its terms are made once (a miss at 128 experts x 48 layers visits thousands:
    /// `cargo bench --bench expert_cache`).
    pub fn victim(&self, pool: PoolKind) -> Option<usize> {
        let p = &self.pools[pool.idx()];
        let rank = self.ranker();
        let ne = self.n_experts;
        let mut best: Option<(usize, (f64, u64))> = None;
        for (slot, key) in p.slots.iter().enumerate() {
            let Some((layer, e)) = *key else { continue };
            let i = layer * ne + e;
            if p.protected[i] > 0 {
                continue;
            }
            let o = rank.order(&self.counters[i], layer);
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
        let p = &self.pools[pool.idx()];
        let free = if p.len < p.slots.len() {
            p.slots.iter().position(Option::is_none)
        } else {
            None
        };
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
/// and sim): small, because a cached high copy also serves the expert's low routes; chosen with
/// `hob sim` on a trained router's trace (benches/results/2026-11-23-h100-low-share.md).
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
    /// High misses whose low copy was cached: where high and low are widths of one ap8 blob,
    /// the engine loads only their missing planes.
    pub low_cached_misses: u64,
    /// high_misses + low_misses × low_bytes / high_bytes, with the low-cached high misses at
    /// (high_bytes - low_bytes) / high_bytes where the widths nest.
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
                        if cache.lookup(PoolKind::Low, key).is_some() {
                            res.low_cached_misses += 1;
                        }
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
    let low_cost = h.low_bytes as f64 / h.high_bytes as f64;
    let upgraded = match &h.low {
        Some(low) if widths_nest(&h.high, low) => res.low_cached_misses as f64,
        _ => 0.0,
    };
    res.penalty = res.high_misses as f64 - upgraded * low_cost + res.low_misses as f64 * low_cost;
    res
}

/// Whether variants `high` and `low` (names) are widths of one ap8 blob, the low one narrower.
pub fn widths_nest(high: &str, low: &str) -> bool {
    use crate::format::{Variant, VariantKind};
    match (Variant::parse(high, None), Variant::parse(low, None)) {
        (Ok(h), Ok(l)) => {
            h.kind == VariantKind::Ap8
                && l.kind == VariantKind::Ap8
                && h.group_size == l.group_size
                && l.width < h.width
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
