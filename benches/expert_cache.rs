//! The host's cost of the expert cache's bookkeeping at many experts: a decode token's per-layer
//! uses, then look-ups and, on a miss, an insertion into a full pool (whose victim search visits every
//! slot). `cargo bench --bench expert_cache` prints a markdown table: microseconds a miss and a
//! layer, for gpt-oss-120b's and Qwen3-30B-A3B's expert counts at card-sized pools. Routes are a
//! fixed pseudo-random sequence, skewed towards a few experts a layer as trained routers are.

use std::time::Instant;

use hob::experts::cache::{ExpertCache, HobbitWeights, Policy, PoolKind};
use hob::experts::Precision;

/// (name, layers, experts, top-k, high slots, low slots)
const SHAPES: [(&str, usize, usize, usize, usize, usize); 3] = [
    ("gpt-oss-120b, rtx4090-24g", 36, 128, 4, 1100, 600),
    ("Qwen3-30B-A3B, 16 GB", 48, 128, 8, 2600, 1200),
    ("Mixtral-8x7B, 24 GB", 32, 8, 2, 48, 80),
];

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// (microseconds a miss, microseconds a layer, misses a layer) over `tokens` decode tokens.
fn run(
    policy: Policy,
    shape: (usize, usize, usize, usize, usize),
    tokens: usize,
) -> (f64, f64, f64) {
    let (layers, experts, k, high, low) = shape;
    let mut c = ExpertCache::new(policy, layers, experts, high, low);
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let pick = |s: &mut u64| {
        // Half the routes from an eighth of the experts.
        let r = xorshift(s);
        if r & 1 == 0 {
            (r >> 1) as usize % (experts / 8).max(1)
        } else {
            (r >> 1) as usize % experts
        }
    };
    let (mut misses, mut miss_ns, mut all_ns) = (0u64, 0u128, 0u128);
    for _ in 0..tokens {
        c.begin_token();
        for l in 0..layers {
            let t0 = Instant::now();
            c.set_layer(l);
            // As the engine plans a layer: every route's use first, then each one placed.
            let routes: Vec<(usize, PoolKind, Precision)> = (0..k)
                .map(|_| {
                    let e = pick(&mut s);
                    if xorshift(&mut s).is_multiple_of(4) {
                        (e, PoolKind::Low, Precision::Low)
                    } else {
                        (e, PoolKind::High, Precision::High)
                    }
                })
                .collect();
            for &(e, _, p) in &routes {
                c.record_use((l, e), p);
            }
            for &(e, pool, _) in &routes {
                if c.lookup(pool, (l, e)).is_none() {
                    let m0 = Instant::now();
                    std::hint::black_box(c.insert(pool, (l, e)));
                    miss_ns += m0.elapsed().as_nanos();
                    misses += 1;
                }
            }
            all_ns += t0.elapsed().as_nanos();
        }
    }
    let n = (tokens * layers) as f64;
    (
        miss_ns as f64 / 1e3 / misses.max(1) as f64,
        all_ns as f64 / 1e3 / n,
        misses as f64 / n,
    )
}

fn main() {
    println!("| shape | policy | slots (high, low) | misses a layer | µs a miss | µs a layer |");
    println!("|---|---|---|---:|---:|---:|");
    for (name, layers, experts, k, high, low) in SHAPES {
        for (pname, policy) in [
            ("hobbit", Policy::Hobbit(HobbitWeights::DEFAULT)),
            ("lru", Policy::Lru),
        ] {
            // A warm-up pass fills the pools; the measured one runs on full pools.
            let shape = (layers, experts, k, high, low);
            run(policy, shape, 20);
            let (per_miss, per_layer, mpl) = run(policy, shape, 200);
            println!(
                "| {name} | {pname} | {high}, {low} | {mpl:.2} | {per_miss:.2} | {per_layer:.2} |"
            );
        }
    }
}
