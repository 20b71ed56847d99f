//! Tests of cache.rs.

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
            low_cached_misses: 1,
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
            low_cached_misses: 0,
            penalty: 3.5,
        }
    );
    assert!((r.hit_rate() - 4.0 / 9.0).abs() < 1e-12);
    // No slots at all: every served route misses and nothing is kept.
    let r = simulate(&t, Policy::Lru, 0, 0, false);
    assert_eq!((r.high_misses, r.low_misses, r.uncached), (6, 3, 9));
    assert_eq!(r.penalty, 6.75);
    // Two widths of one ap8 blob: s0t1 L0's (0,1), a high miss with its low copy cached, loads
    // only its missing planes (1 - 1/4 of a high load).
    let mut t = tiny_trace();
    t.header.high = "ap8@5".into();
    t.header.low = Some("ap8@3".into());
    assert_eq!(simulate(&t, Policy::Lru, 2, 1, false).penalty, 4.5);
    assert!(widths_nest("ap8", "ap8@2") && !widths_nest("ap8@3", "ap8@5"));
    assert!(!widths_nest("ap8/g128@5", "ap8@3") && !widths_nest("int8", "int2"));
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
