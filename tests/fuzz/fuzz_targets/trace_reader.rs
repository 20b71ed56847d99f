//! `hob sim`'s input: a routing trace (formats/trace.md) through `Trace::parse`, then, when it is
//! accepted, replayed through every cache policy at a few pool sizes, as `hob sim` does.
#![no_main]

use std::path::Path;

use hob::experts::cache::{pool_slots, simulate, Policy};
use hob::experts::Trace;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(trace) = Trace::parse(Path::new("fuzz.trace"), data) else {
        return;
    };
    std::hint::black_box((trace.tokens(), trace.sequences()));
    for r in &trace.records {
        if let Some(i) = r.top1() {
            assert!(i < r.routes.len());
        }
    }
    let h = &trace.header;
    let budget = h.high_bytes.saturating_mul(4);
    let (high, low) = pool_slots(budget, h.high_bytes, h.low_bytes, 0.5);
    for policy in ["lru", "lfu", "hobbit"] {
        let Ok(policy) = Policy::parse(policy, None) else {
            continue;
        };
        for (hs, ls) in [(high, low), (1, 0), (2, 2)] {
            for substitute in [false, true] {
                let r = simulate(&trace, policy, hs, ls, substitute);
                assert!(r.hit_rate() <= 1.0);
            }
        }
    }
});
