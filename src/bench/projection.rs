//! A decode row's projection onto the emulated profile's memory (issue 50, item 4).
//!
//! A profile caps device memory and paces the link, but the device's GPU still reads its own
//! memory (an H200 copies at ~4.3 TB/s; an RTX 4060 Ti's memory is 0.29 TB/s, an Orin NX's 0.1).
//! The projection keeps what the run measured outside the GPU's kernels (host work, waits for
//! paced loads, CPU experts) and scales the GPU-busy time's memory part by the two memories'
//! ratio. The memory part is the time the token's bytes take at the device's rate (at most the
//! busy time); the rest of the busy time (launch gaps, latency-bound small kernels, which a
//! slower memory does not slow in proportion) stays as measured:
//!
//! m = min(gpu_busy, read_bytes / device_gbs)
//! projected s/token = measured s/token - m + m x device_gbs / profile_gbs.
//!
//! The target's compute, its launch latency and its host CPU are not modelled. It is an
//! estimate, not a measurement.

/// Project only where the profile's memory is this much slower than the device's: below it the
/// ratio is within the measurement's noise (the h200 profile on an H200 reads ~1.0).
pub const MIN_RATIO: f64 = 1.05;

/// One row's projection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Projection {
    /// Projected tokens per second on the profile's memory.
    pub tok_s: f64,
    /// Seconds per token the GPU spent in kernels, as used (at most the measured time a token).
    pub gpu_busy_s: f64,
    /// The device's memory (measured copy, read + write), GB/s.
    pub device_gbs: f64,
    /// The profile's memory, GB/s.
    pub profile_gbs: f64,
}

/// The projection of a decode run of `tok_s` tokens per second whose kernels kept the GPU busy
/// `gpu_busy_s` seconds a token reading `read_bytes` of device memory, from a device reading
/// `device_gbs` to a profile reading `profile_gbs` (infinite `read_bytes`: all of the busy time
/// scales). None where the profile's memory is not slower (by `MIN_RATIO`) or a figure is
/// not a positive finite number.
///
/// `gpu_busy_s` comes from a separate run with every kernel timed: that run records an event
/// pair around each launch, so its steps run without CUDA graphs and a pair can include the wait
/// for a launch the host has not yet made. It can then exceed the measured time a token (which
/// graphs shorten), so it is clamped to that time: at most every measured second is GPU time.
pub fn project(
    tok_s: f64,
    (gpu_busy_s, read_bytes): (f64, f64),
    device_gbs: f64,
    profile_gbs: f64,
) -> Option<Projection> {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !(positive(tok_s) && positive(device_gbs) && positive(profile_gbs)) {
        return None;
    }
    if !gpu_busy_s.is_finite() || device_gbs < MIN_RATIO * profile_gbs {
        return None;
    }
    let per_token = 1.0 / tok_s;
    let busy = gpu_busy_s.clamp(0.0, per_token);
    let memory = busy.min(read_bytes.max(0.0) / (device_gbs * 1e9));
    let projected = (per_token - memory) + memory * (device_gbs / profile_gbs);
    Some(Projection {
        tok_s: 1.0 / projected,
        gpu_busy_s: busy,
        device_gbs,
        profile_gbs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn gpu_time_scales_by_the_memory_ratio_and_the_rest_stays() {
        // 100 tok/s: 10 ms a token, 6 ms of it in kernels. H200 (4275 GB/s) to an RTX 4060 Ti
        // (288 GB/s): 4 ms + 6 ms x 14.84 = 93.06 ms, 10.75 tok/s.
        let p = project(100.0, (0.006, f64::INFINITY), 4275.0, 288.0).unwrap();
        let want = 0.004 + 0.006 * 4275.0 / 288.0;
        assert!(close(p.tok_s, 1.0 / want), "{p:?}");
        assert!((p.tok_s - 10.7455).abs() < 1e-4, "{p:?}");
        assert_eq!(
            (p.gpu_busy_s, p.device_gbs, p.profile_gbs),
            (0.006, 4275.0, 288.0)
        );
        // No GPU time: nothing to scale (a run waiting on its loads only).
        assert!(close(
            project(50.0, (0.0, f64::INFINITY), 4275.0, 102.4)
                .unwrap()
                .tok_s,
            50.0
        ));
        // All GPU time: the plain ratio.
        assert!(close(
            project(500.0, (0.002, f64::INFINITY), 4000.0, 1000.0)
                .unwrap()
                .tok_s,
            125.0
        ));
    }

    #[test]
    fn only_the_memory_part_of_the_gpu_time_scales() {
        // 10 ms a token, 6 ms in kernels reading 4.275 GB at 4275 GB/s (1 ms): 9 ms stay, the
        // 1 ms becomes 4.275 / 288 s.
        let p = project(100.0, (0.006, 4.275e9), 4275.0, 288.0).unwrap();
        assert!(close(1.0 / p.tok_s, 0.009 + 4.275 / 288.0), "{p:?}");
        // Bytes beyond the busy time: the busy time is the memory part.
        let all = project(100.0, (0.006, 1e12), 4275.0, 288.0).unwrap();
        let inf = project(100.0, (0.006, f64::INFINITY), 4275.0, 288.0).unwrap();
        assert!(close(all.tok_s, inf.tok_s));
    }

    #[test]
    fn gpu_time_above_the_measured_time_is_clamped_to_it() {
        // The timed run (no graphs) saw 12 ms of kernels a token where the row measured 10 ms.
        let p = project(100.0, (0.012, f64::INFINITY), 4000.0, 1000.0).unwrap();
        assert_eq!(p.gpu_busy_s, 0.01);
        assert!(close(p.tok_s, 25.0), "{p:?}");
        // A negative sum (never expected) counts as none.
        assert_eq!(
            project(100.0, (-1.0, f64::INFINITY), 4000.0, 1000.0)
                .unwrap()
                .gpu_busy_s,
            0.0
        );
    }

    #[test]
    fn no_projection_where_the_profile_is_not_slower_or_a_figure_is_missing() {
        // The h200 profile on an H200 (measured copy a little above or below the profile's).
        assert_eq!(project(100.0, (0.005, f64::INFINITY), 4250.0, 4275.0), None);
        assert_eq!(project(100.0, (0.005, f64::INFINITY), 4400.0, 4275.0), None);
        // h100 (3000 GB/s) emulated on an H200: projected.
        assert!(project(100.0, (0.005, f64::INFINITY), 4275.0, 3000.0).is_some());
        for (t, b, d, p) in [
            (0.0, 0.005, 4275.0, 288.0),
            (f64::NAN, 0.005, 4275.0, 288.0),
            (100.0, f64::INFINITY, 4275.0, 288.0),
            (100.0, 0.005, 0.0, 288.0),
            (100.0, 0.005, 4275.0, 0.0),
        ] {
            assert_eq!(
                project(t, (b, f64::INFINITY), d, p),
                None,
                "{t} {b} {d} {p}"
            );
        }
    }
}
