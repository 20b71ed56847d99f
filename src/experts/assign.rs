//! Cooperative mode: which of a layer's missed experts the CPU helpers compute and which the link
//! loads.
//!
//! A decode layer waits for the slower of its two workers: the CPU helpers, computing their
//! experts from host memory, and the link, loading the rest into the GPU cache. Deciding miss by
//! miss (each to whichever worker frees up first) is not the best split when misses differ in
//! size. With Mixtral's top-2 on a 24 GiB card a layer often misses an f16 top-1 expert (~4 ms on
//! the CPU, ~14 ms over the link) and an int4 second expert (~1.7 ms / ~3.7 ms): the greedy order
//! puts both on the CPU (5.8 ms) while the assignment that loads the int4 one finishes at
//! max(4.1, 3.7) ms. [`assign`] tries every assignment of a layer's misses (a handful) and keeps
//! the one whose slower worker finishes first.

/// A missed expert's two ways to be computed, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MissCost {
    /// Computing it on the CPU helpers (measured, refreshed while running).
    pub cpu_s: f64,
    /// Loading it over the link (its slot's bytes at the measured bandwidth).
    pub load_s: f64,
}

/// Most misses assigned jointly (2^n assignments tried); beyond, each in turn goes to whichever
/// worker frees up first.
pub const MAX_JOINT: usize = 12;

/// For each miss, whether the CPU computes it (true) or the link loads it (false): the assignment
/// whose slower worker finishes first, the CPU already busy for `cpu_busy` seconds and the link
/// for `link_busy`. Among equally fast ones, the one that leaves the CPU the least work (a loaded
/// expert stays in the cache for the tokens after).
pub fn assign(cpu_busy: f64, link_busy: f64, misses: &[MissCost]) -> Vec<bool> {
    if misses.len() > MAX_JOINT {
        let (mut cpu, mut link) = (cpu_busy, link_busy);
        return misses
            .iter()
            .map(|m| {
                let to_cpu = cpu + m.cpu_s < link + m.load_s;
                if to_cpu {
                    cpu += m.cpu_s;
                } else {
                    link += m.load_s;
                }
                to_cpu
            })
            .collect();
    }
    let mut best = (f64::INFINITY, f64::INFINITY, 0u32);
    // Bit i of `mask` set: miss i on the CPU.
    for mask in 0u32..(1u32 << misses.len()) {
        let (mut cpu, mut link) = (cpu_busy, link_busy);
        for (i, m) in misses.iter().enumerate() {
            if mask >> i & 1 == 1 {
                cpu += m.cpu_s;
            } else {
                link += m.load_s;
            }
        }
        let end = cpu.max(link);
        if end < best.0 || (end == best.0 && cpu < best.1) {
            best = (end, cpu, mask);
        }
    }
    (0..misses.len()).map(|i| best.2 >> i & 1 == 1).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(cpu_s: f64, load_s: f64) -> MissCost {
        MissCost { cpu_s, load_s }
    }

    /// The slower worker's finish time of an assignment.
    fn end(cpu_busy: f64, link_busy: f64, misses: &[MissCost], to_cpu: &[bool]) -> f64 {
        let (mut cpu, mut link) = (cpu_busy, link_busy);
        for (x, &c) in misses.iter().zip(to_cpu) {
            if c {
                cpu += x.cpu_s;
            } else {
                link += x.load_s;
            }
        }
        cpu.max(link)
    }

    #[test]
    fn an_f16_and_an_int4_miss_split_between_the_workers() {
        // The module's example: f16 4.1 / 14 ms, int4 1.7 / 3.7 ms.
        let misses = [m(4.1, 14.0), m(1.7, 3.7)];
        assert_eq!(assign(0.0, 0.0, &misses), vec![true, false]);
        // In the other order too (the greedy order would put both on the CPU).
        assert_eq!(assign(0.0, 0.0, &[misses[1], misses[0]]), vec![false, true]);
    }

    #[test]
    fn a_lone_miss_goes_to_the_faster_worker() {
        assert_eq!(assign(0.0, 0.0, &[m(1.7, 3.7)]), vec![true]);
        assert_eq!(assign(0.0, 0.0, &[m(3.7, 1.7)]), vec![false]);
        // A CPU already busy (experts it must compute) tips it to the link.
        assert_eq!(assign(3.0, 0.0, &[m(1.7, 3.7)]), vec![false]);
        // A busy link tips it back.
        assert_eq!(assign(3.0, 2.0, &[m(1.7, 3.7)]), vec![true]);
    }

    #[test]
    fn ties_leave_the_cpu_less_work() {
        // Both ways end at 2.0: the link takes it.
        assert_eq!(assign(0.0, 0.0, &[m(2.0, 2.0)]), vec![false]);
        assert!(assign(0.0, 0.0, &[]).is_empty());
    }

    #[test]
    fn the_joint_assignment_is_never_slower_than_any_other() {
        // Against every assignment, on pseudo-random costs (a fixed LCG: reproducible).
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        for n in 0..=8 {
            for _ in 0..50 {
                let misses: Vec<MissCost> =
                    (0..n).map(|_| m(next() * 5.0, next() * 15.0)).collect();
                let (cb, lb) = (next() * 3.0, next() * 3.0);
                let got = assign(cb, lb, &misses);
                assert_eq!(got.len(), n);
                let e = end(cb, lb, &misses, &got);
                for mask in 0u32..(1 << n) {
                    let other: Vec<bool> = (0..n).map(|i| mask >> i & 1 == 1).collect();
                    assert!(
                        e <= end(cb, lb, &misses, &other) + 1e-12,
                        "{misses:?}: {got:?} vs {other:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn many_misses_fall_back_to_greedy_in_order() {
        let misses = vec![m(1.0, 1.5); MAX_JOINT + 1];
        let got = assign(0.0, 0.0, &misses);
        // CPU, link, CPU (1+1 < 1.5? no: 2.0 vs 1.5 -> link)...: each to the worker done first.
        let (mut cpu, mut link) = (0.0, 0.0);
        for (x, &c) in misses.iter().zip(&got) {
            assert_eq!(c, cpu + x.cpu_s < link + x.load_s);
            if c {
                cpu += x.cpu_s;
            } else {
                link += x.load_s;
            }
        }
        assert!(got.contains(&true) && got.contains(&false));
    }
}
