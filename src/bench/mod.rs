//! Benchmark reporting: statistics, the physical limit of batch-1 decoding, and llama-bench-style
//! result tables (markdown and JSON). Pure data and formatting: no timing, no I/O; `hob bench`
//! measures and calls this.
//!
//! - `mean_sd`: mean and sample standard deviation of repeated measurements.
//! - `physical_limit`: the bound of shared/REFERENCE.md, with and without load/compute overlap.
//! - `project`: a decode row's tokens/s projected onto an emulated profile's slower memory.
//! - `report`: `BenchRow`, `render_markdown`, `render_json`.

pub mod projection;
pub mod report;

pub use projection::{project, Projection};
pub use report::{render_json, render_markdown, BenchRow, BenchTest, HitRate, MoeStats};

/// Mean and sample standard deviation (n - 1 in the denominator) of `xs`. One value: sd 0.
/// No values: (NaN, NaN).
pub fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return (mean, 0.0);
    }
    let ss: f64 = xs.iter().map(|x| (x - mean) * (x - mean)).sum();
    (mean, (ss / (n - 1) as f64).sqrt())
}

/// The physical limit of one token (shared/REFERENCE.md):
/// T_resident = bytes read from device memory / memory bandwidth,
/// T_load = bytes loaded over the link (or from the disk) / link bandwidth.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Limit {
    /// Seconds per token reading device memory.
    pub t_resident_s: f64,
    /// Seconds per token loading missed experts (infinite when bytes must cross a link of
    /// bandwidth 0).
    pub t_load_s: f64,
    /// Loads and compute one after the other: 1 / (T_resident + T_load).
    pub no_overlap_tok_s: f64,
    /// Loads fully hidden behind compute (or the reverse): 1 / max(T_resident, T_load). Nothing
    /// can beat this.
    pub overlap_tok_s: f64,
}

/// The limit for one token that reads `resident_bytes` from device memory and loads
/// `loaded_bytes` over a link or from a disk. Bandwidths in GB/s (1e9 bytes per second).
///
/// `resident_bytes` counts every byte a token reads on the device: the non-expert weights plus
/// every expert it computes (hits and loaded misses alike, each at its precision), i.e.
/// non_expert + E_tok x S_p for Mixtral at one precision. `loaded_bytes` is the share that was
/// missing: (1 - h) x E_tok x S_p.
pub fn physical_limit(
    resident_bytes: f64,
    loaded_bytes: f64,
    memory_bandwidth_gbs: f64,
    link_gbs: f64,
) -> Limit {
    let secs = |bytes: f64, gbs: f64| {
        if bytes <= 0.0 {
            0.0
        } else if gbs > 0.0 {
            bytes / (gbs * 1e9)
        } else {
            f64::INFINITY
        }
    };
    let t_resident_s = secs(resident_bytes, memory_bandwidth_gbs);
    let t_load_s = secs(loaded_bytes, link_gbs);
    Limit {
        t_resident_s,
        t_load_s,
        no_overlap_tok_s: 1.0 / (t_resident_s + t_load_s),
        overlap_tok_s: 1.0 / t_resident_s.max(t_load_s),
    }
}

/// Link bandwidth reached, GB/s: `bytes_per_token` moved at `tok_s` tokens per second.
pub fn achieved_gbs(bytes_per_token: f64, tok_s: f64) -> f64 {
    bytes_per_token * tok_s / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn mean_and_sample_sd() {
        let (m, sd) = mean_sd(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(m, 5.0);
        // Sum of squares 32, n - 1 = 7.
        assert!(close(sd, (32.0f64 / 7.0).sqrt(), 1e-12), "{sd}");
        assert_eq!(mean_sd(&[3.5]), (3.5, 0.0));
        let (m, sd) = mean_sd(&[]);
        assert!(m.is_nan() && sd.is_nan());
    }

    // Mixtral-8x7B (shared/REFERENCE.md): non-expert weights 3.21 GB f16, one expert 352 MB f16,
    // 179 MB int8, 64 experts per token.
    const NON_EXPERT: f64 = 3.21e9;
    const F16: f64 = 352e6;
    const INT8: f64 = 179e6;

    #[test]
    fn rtx4090_mixtral_f16_all_resident_is_39_tok_s() {
        // (3.21 + 64 x 0.352) GB = 25.738 GB read per token at 1008 GB/s: 25.53 ms, 39.16 tok/s.
        let l = physical_limit(NON_EXPERT + 64.0 * F16, 0.0, 1008.0, 25.0);
        assert!(close(l.t_resident_s, 25.738 / 1008.0, 1e-12));
        assert_eq!(l.t_load_s, 0.0);
        assert!(close(l.no_overlap_tok_s, 39.164, 1e-3), "{l:?}");
        assert_eq!(l.no_overlap_tok_s, l.overlap_tok_s);
    }

    #[test]
    fn rtx4090_mixtral_f16_half_missed_is_2_1_tok_s() {
        // One missed f16 expert over PCIe 4.0 (25 GB/s): 14.08 ms.
        assert!(close(
            physical_limit(0.0, F16, 1008.0, 25.0).t_load_s,
            0.01408,
            1e-9
        ));
        // h = 0.5: 32 x 352 MB = 11.264 GB loaded: 450.56 ms; + 25.53 ms resident.
        let l = physical_limit(NON_EXPERT + 64.0 * F16, 32.0 * F16, 1008.0, 25.0);
        assert!(close(l.t_load_s, 0.45056, 1e-9));
        assert!(close(l.no_overlap_tok_s, 1.0 / (0.45056 + 0.0255337), 1e-6));
        assert!(close(l.no_overlap_tok_s, 2.1005, 1e-3), "{l:?}");
        assert!(close(l.overlap_tok_s, 1.0 / 0.45056, 1e-9)); // 2.2195
    }

    #[test]
    fn jetson_int8_from_ssd_is_half_a_token_per_second() {
        // Orin: 204.8 GB/s memory, 3 GB/s NVMe; int8 experts, h = 0.5.
        let l = physical_limit(NON_EXPERT + 64.0 * INT8, 32.0 * INT8, 204.8, 3.0);
        // (3.21 + 11.456) GB / 204.8 = 71.6 ms; 5.728 GB / 3 = 1.909 s.
        assert!(close(l.no_overlap_tok_s, 0.5048, 1e-3), "{l:?}");
        assert!(close(l.overlap_tok_s, 3.0 / 5.728, 1e-9));
    }

    #[test]
    fn a_link_of_zero_cannot_load() {
        let l = physical_limit(1e9, 1e6, 100.0, 0.0);
        assert_eq!((l.no_overlap_tok_s, l.overlap_tok_s), (0.0, 0.0));
        let l = physical_limit(1e9, 0.0, 100.0, 0.0);
        assert_eq!(l.no_overlap_tok_s, 100.0);
        assert!(close(achieved_gbs(352e6, 10.0), 3.52, 1e-12));
    }
}
