//! Hardware profiles (platforms/*.toml): memory budget, memory, link and disk bandwidth of a
//! target. They feed the physical-limit column of `hob bench` and profile emulation on a faster
//! machine (cap device memory to the profile's budget, pace expert loads to its slow tier).
//!
//! `Platform::resolve("rtx4090-24g")` picks a built-in profile (the TOML files are compiled in,
//! so the binary works anywhere); `Platform::resolve("my.toml")` loads a file. Every key is
//! documented in platforms/README.md.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize, Serializer};

use crate::error::Error;

/// The profiles compiled into the binary: (name, file name, TOML text).
const BUILTIN: [(&str, &str, &str); 9] = [
    (
        "h100",
        "platforms/h100.toml",
        include_str!("../platforms/h100.toml"),
    ),
    (
        "h200",
        "platforms/h200.toml",
        include_str!("../platforms/h200.toml"),
    ),
    (
        "jetson-orin-32g",
        "platforms/jetson-orin-32g.toml",
        include_str!("../platforms/jetson-orin-32g.toml"),
    ),
    (
        "jetson-orin-64g",
        "platforms/jetson-orin-64g.toml",
        include_str!("../platforms/jetson-orin-64g.toml"),
    ),
    (
        "jetson-orin-nx-16g",
        "platforms/jetson-orin-nx-16g.toml",
        include_str!("../platforms/jetson-orin-nx-16g.toml"),
    ),
    (
        "jetson-orin-nano-8g",
        "platforms/jetson-orin-nano-8g.toml",
        include_str!("../platforms/jetson-orin-nano-8g.toml"),
    ),
    (
        "rtx3060-12g",
        "platforms/rtx3060-12g.toml",
        include_str!("../platforms/rtx3060-12g.toml"),
    ),
    (
        "rtx4060ti-16g",
        "platforms/rtx4060ti-16g.toml",
        include_str!("../platforms/rtx4060ti-16g.toml"),
    ),
    (
        "rtx4090-24g",
        "platforms/rtx4090-24g.toml",
        include_str!("../platforms/rtx4090-24g.toml"),
    ),
];

/// How the GPU reaches the experts that are not in its cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PlatformKind {
    /// Own device memory; experts cross a host link (PCIe) from pinned host memory, with the
    /// disk as a third tier.
    Discrete,
    /// CPU and GPU share memory (Jetson); the slow tier is the disk.
    Unified,
}

impl PlatformKind {
    pub fn name(self) -> &'static str {
        match self {
            PlatformKind::Discrete => "discrete",
            PlatformKind::Unified => "unified",
        }
    }
}

/// The tier expert loads come from when they miss the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlowTier {
    /// Pinned host memory over the host link (`host_link_gbs`).
    HostLink,
    /// The disk (`disk_read_gbs`).
    Disk,
}

impl fmt::Display for SlowTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SlowTier::HostLink => "host link",
            SlowTier::Disk => "disk",
        })
    }
}

/// One hardware profile. Bandwidths are in GB/s (1e9 bytes per second); `*_gib` budgets in GiB.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Platform {
    pub name: String,
    pub kind: PlatformKind,
    /// The device's physical memory, GB (informational; the budget is `gpu_mem_gib`).
    pub gpu_memory_gb: f64,
    pub memory_bandwidth_gbs: f64,
    /// Host-to-device copy bandwidth from pinned memory; 0 on unified memory (no copy).
    pub host_link_gbs: f64,
    pub disk_read_gbs: f64,
    /// "major.minor", e.g. "8.9".
    pub compute_capability: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_threads: Option<usize>,
    /// Device memory hob may use in total (resident weights, KV cache, expert cache), GiB.
    /// Unset: no cap, the machine's own memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_mem_gib: Option<f64>,
    /// Expert cache size, GiB. Unset: whatever `gpu_mem_gib` (or the device) leaves after the
    /// resident weights, KV cache and buffers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_cache_gib: Option<f64>,
    /// When emulating this profile on a faster machine, pace expert loads to this profile's slow
    /// tier (`slow_tier()`): host-to-device copies to `host_link_gbs` on discrete GPUs, reads to
    /// `disk_read_gbs` on unified memory. Pacing only slows down: a machine slower than the
    /// profile runs at its own speed.
    #[serde(default)]
    pub pace_link: bool,
    /// Expert variant for high precision (HOBBIT's scorer), e.g. "f16"; unset: the file's first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_variant: Option<String>,
    /// Expert variant for low precision, e.g. "int4"; unset: no dynamic precision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_variant: Option<String>,
    /// Scorer thresholds (`hob calibrate` writes them for a model); unset: HOBBIT's 0.6 / 0.9.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "short_f32"
    )]
    pub t1: Option<f32>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "short_f32"
    )]
    pub t2: Option<f32>,
}

/// An f32 written as the shortest decimal that reads back as the same f32 (0.6, not
/// 0.6000000238418579, which is what widening it to f64 would print).
fn short_f32<S: Serializer>(v: &Option<f32>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(x) => s.serialize_f64(x.to_string().parse::<f64>().unwrap_or(*x as f64)),
        None => s.serialize_none(),
    }
}

/// Expert loads are paced to `gbs` GB/s, emulating `tier`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pacing {
    pub tier: SlowTier,
    pub gbs: f64,
}

const GIB: f64 = (1u64 << 30) as f64;

impl Platform {
    /// A built-in profile's name, or a path ending in `.toml`.
    pub fn resolve(name_or_path: &str) -> crate::Result<Platform> {
        if name_or_path.ends_with(".toml") {
            return Platform::load(Path::new(name_or_path));
        }
        Platform::builtin(name_or_path).ok_or_else(|| {
            Error::Invalid(format!(
                "unknown platform '{name_or_path}' (known: {}; or give a path to a .toml file)",
                Platform::builtin_names().join(", ")
            ))
        })
    }

    /// Names of the built-in profiles.
    pub fn builtin_names() -> Vec<&'static str> {
        BUILTIN.iter().map(|(n, _, _)| *n).collect()
    }

    /// A built-in profile by name.
    pub fn builtin(name: &str) -> Option<Platform> {
        BUILTIN
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, f, t)| {
                // The embedded files are checked by the unit tests.
                Platform::parse(t, f).unwrap_or_else(|e| panic!("built-in profile {f}: {e}"))
            })
    }

    /// Load and check a profile file.
    pub fn load(path: &Path) -> crate::Result<Platform> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, "read", e))?;
        Platform::parse(&text, &path.display().to_string())
    }

    /// Parse and check profile text; `source` (a file name) prefixes every error.
    pub fn parse(text: &str, source: &str) -> crate::Result<Platform> {
        let p: Platform = toml::from_str(text)
            .map_err(|e| Error::Invalid(format!("{source}: {}", e.to_string().trim_end())))?;
        p.check()
            .map_err(|(key, detail)| Error::Invalid(format!("{source}: key '{key}': {detail}")))?;
        Ok(p)
    }

    fn check(&self) -> Result<(), (&'static str, String)> {
        if self.name.trim().is_empty() {
            return Err(("name", "must not be empty".into()));
        }
        // Bounds far above any machine of today: a value past one is a typo (a unit in MB/s).
        let positive = |key: &'static str, v: f64| {
            let max = if key.ends_with("_gbs") {
                1e5
            } else {
                1e5 / 2.0
            };
            if !(v.is_finite() && v > 0.0) {
                Err((key, format!("expected a positive number, found {v}")))
            } else if v > max {
                Err((
                    key,
                    format!("{v} is beyond any device (at most {max}): check the unit"),
                ))
            } else {
                Ok(())
            }
        };
        positive("gpu_memory_gb", self.gpu_memory_gb)?;
        positive("memory_bandwidth_gbs", self.memory_bandwidth_gbs)?;
        positive("disk_read_gbs", self.disk_read_gbs)?;
        match self.kind {
            PlatformKind::Discrete => positive("host_link_gbs", self.host_link_gbs)?,
            PlatformKind::Unified => {
                if !(self.host_link_gbs.is_finite() && self.host_link_gbs >= 0.0) {
                    return Err((
                        "host_link_gbs",
                        format!("expected 0 or more, found {}", self.host_link_gbs),
                    ));
                }
            }
        }
        let cc_ok = self
            .compute_capability
            .split_once('.')
            .is_some_and(|(a, b)| {
                !a.is_empty()
                    && !b.is_empty()
                    && a.chars().all(|c| c.is_ascii_digit())
                    && b.chars().all(|c| c.is_ascii_digit())
            });
        if !cc_ok {
            return Err((
                "compute_capability",
                format!(
                    "expected \"major.minor\" such as \"8.9\", found \"{}\"",
                    self.compute_capability
                ),
            ));
        }
        match self.cpu_threads {
            Some(0) => return Err(("cpu_threads", "must be at least 1".into())),
            Some(n) if n > 1 << 16 => {
                return Err((
                    "cpu_threads",
                    format!("{n} is beyond any machine (at most 65536)"),
                ))
            }
            _ => {}
        }
        if let Some(g) = self.gpu_mem_gib {
            positive("gpu_mem_gib", g)?;
        }
        if let Some(c) = self.expert_cache_gib {
            positive("expert_cache_gib", c)?;
            if let Some(g) = self.gpu_mem_gib {
                if c > g {
                    return Err((
                        "expert_cache_gib",
                        format!("{c} exceeds the device-memory budget gpu_mem_gib = {g}"),
                    ));
                }
            }
        }
        for (key, v) in [("t1", self.t1), ("t2", self.t2)] {
            if v.is_some_and(|t| !(t.is_finite() && (0.0..=1.0).contains(&t))) {
                return Err((key, format!("expected a number in [0, 1], found {v:?}")));
            }
        }
        if let (Some(a), Some(b)) = (self.t1, self.t2) {
            if a > b {
                return Err(("t1", format!("t1 = {a} exceeds t2 = {b}")));
            }
        }
        Ok(())
    }

    /// The profile as TOML text that [`Platform::parse`] reads back equal.
    pub fn to_toml(&self) -> crate::Result<String> {
        toml::to_string(self)
            .map_err(|e| Error::Invalid(format!("profile '{}': cannot write TOML: {e}", self.name)))
    }

    /// Write the profile to `path` atomically (a temporary file beside it, then a rename):
    /// `path` is either left as it was or holds the whole new profile. `header` lines are
    /// written first as `#` comments.
    pub fn save(&self, path: &Path, header: &[String]) -> crate::Result<()> {
        use std::io::Write;
        let mut text = String::new();
        for h in header {
            text += &format!("# {h}\n");
        }
        text += &self.to_toml()?;
        // What we write must load: check before anything touches the disk.
        Platform::parse(&text, &path.display().to_string())?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".tmp-{}", std::process::id()));
        let tmp = std::path::PathBuf::from(tmp);
        let result = (|| {
            let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, "create", e))?;
            f.write_all(text.as_bytes())
                .and_then(|_| f.sync_all())
                .map_err(|e| Error::io(&tmp, "write", e))?;
            std::fs::rename(&tmp, path).map_err(|e| Error::io(path, "rename onto", e))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Where missed experts come from: the host link on discrete GPUs, the disk on unified memory.
    pub fn slow_tier(&self) -> SlowTier {
        match self.kind {
            PlatformKind::Discrete => SlowTier::HostLink,
            PlatformKind::Unified => SlowTier::Disk,
        }
    }

    /// Bandwidth of the slow tier, GB/s: the `link_gbs` of the physical limit.
    pub fn load_gbs(&self) -> f64 {
        match self.slow_tier() {
            SlowTier::HostLink => self.host_link_gbs,
            SlowTier::Disk => self.disk_read_gbs,
        }
    }

    /// The pacing to apply when emulating this profile; None when `pace_link` is false.
    pub fn pacing(&self) -> Option<Pacing> {
        self.pace_link.then(|| Pacing {
            tier: self.slow_tier(),
            gbs: self.load_gbs(),
        })
    }

    /// `gpu_mem_gib` in bytes; None: no cap.
    pub fn gpu_mem_bytes(&self) -> Option<u64> {
        self.gpu_mem_gib.map(|g| (g * GIB) as u64)
    }

    /// `expert_cache_gib` in bytes; None: what remains after the resident weights.
    pub fn expert_cache_bytes(&self) -> Option<u64> {
        self.expert_cache_gib.map(|g| (g * GIB) as u64)
    }
}

/// CPU cores this process may use (`std::thread::available_parallelism`; 1 when unknown).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The threads a user's count asks for on a machine of `cores` cores: 0 is one per core, and a
/// count above the cores is capped to them (the pools spin while they wait for work, so a
/// thread beyond the cores only takes time slices from the others: 7-100x slower, never faster).
/// Returns (threads, capped).
pub fn user_threads(requested: usize, cores: usize) -> (usize, bool) {
    match requested {
        0 => (cores, false),
        n if n > cores => (cores, true),
        n => (n, false),
    }
}

/// A pool of `threads` CPU threads named `name-N` (0: one per available core): the CPU backend's
/// and the expert engine's helpers. Any other count is built as asked (tests compare thread
/// counts above a small machine's cores); the command line caps a user's count with
/// [`user_threads`].
pub fn thread_pool(threads: usize, name: &'static str) -> crate::Result<rayon::ThreadPool> {
    let threads = if threads == 0 { cores() } else { threads };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("{name}-{i}"))
        .build()
        .map_err(|e| Error::Invalid(format!("cannot start {threads} CPU threads ({name}): {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_parse_and_have_the_intended_budgets() {
        for name in Platform::builtin_names() {
            let p = Platform::resolve(name).unwrap();
            assert_eq!(p.name, name);
        }
        let r = Platform::resolve("rtx4090-24g").unwrap();
        assert_eq!(r.kind, PlatformKind::Discrete);
        assert_eq!(r.gpu_mem_gib, Some(24.0));
        assert_eq!(r.gpu_mem_bytes(), Some(24 << 30));
        assert_eq!(
            r.pacing(),
            Some(Pacing {
                tier: SlowTier::HostLink,
                gbs: 25.0
            })
        );
        let j = Platform::resolve("jetson-orin-32g").unwrap();
        assert_eq!((j.kind, j.gpu_mem_gib), (PlatformKind::Unified, Some(24.0)));
        assert_eq!(
            j.pacing(),
            Some(Pacing {
                tier: SlowTier::Disk,
                gbs: 3.0
            })
        );
        assert_eq!(
            Platform::resolve("jetson-orin-64g").unwrap().gpu_mem_gib,
            Some(52.0)
        );
        let h = Platform::resolve("h100").unwrap();
        assert_eq!((h.gpu_mem_gib, h.pacing()), (None, None));
        assert_eq!((h.expert_cache_bytes(), h.load_gbs()), (None, 54.0));
    }

    #[test]
    fn user_thread_counts_are_capped_at_the_cores() {
        assert_eq!(user_threads(0, 2), (2, false));
        assert_eq!(user_threads(1, 2), (1, false));
        assert_eq!(user_threads(2, 2), (2, false));
        assert_eq!(user_threads(1000, 2), (2, true));
        assert_eq!(user_threads(3, 16), (3, false));
        assert!(cores() >= 1);
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let e = Platform::resolve("a100").unwrap_err().to_string();
        assert!(
            e.contains("'a100'")
                && e.contains("h100, h200, jetson-orin-32g, jetson-orin-64g, jetson-orin-nx-16g, jetson-orin-nano-8g, rtx3060-12g, rtx4060ti-16g, rtx4090-24g")
                && e.contains(".toml"),
            "{e}"
        );
    }

    #[test]
    fn profiles_round_trip_through_toml() {
        let dir = tempfile::tempdir().unwrap();
        for name in Platform::builtin_names() {
            let mut p = Platform::resolve(name).unwrap();
            p.t1 = Some(0.35);
            p.t2 = Some(0.8125);
            let text = p.to_toml().unwrap();
            // f32 thresholds are written short, not widened to f64 digits.
            assert!(text.contains("t1 = 0.35\n"), "{text}");
            assert_eq!(Platform::parse(&text, "x.toml").unwrap(), p);
            let path = dir.path().join(format!("{name}.toml"));
            p.save(&path, &["a comment".into()]).unwrap();
            assert!(std::fs::read_to_string(&path)
                .unwrap()
                .starts_with("# a comment\n"));
            assert_eq!(Platform::load(&path).unwrap(), p);
        }
        // No temporary file is left beside the profiles.
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            BUILTIN.len()
        );
        // A folder that does not exist: the error names the file.
        let bad = dir.path().join("missing/p.toml");
        let e = Platform::resolve("h100")
            .unwrap()
            .save(&bad, &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing/p.toml"), "{e}");
    }

    const GOOD: &str = r#"
name = "mine"
kind = "discrete"
gpu_memory_gb = 16
memory_bandwidth_gbs = 500
host_link_gbs = 12.5
disk_read_gbs = 3
compute_capability = "8.6"
gpu_mem_gib = 14
expert_cache_gib = 8
pace_link = true
"#;

    #[test]
    fn files_load_and_errors_name_the_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mine.toml");
        std::fs::write(&path, GOOD).unwrap();
        let p = Platform::resolve(path.to_str().unwrap()).unwrap();
        assert_eq!(p.name, "mine");
        assert_eq!(p.cpu_threads, None);
        assert_eq!(p.expert_cache_bytes(), Some(8 << 30));
        assert_eq!(p.pacing().unwrap().gbs, 12.5);

        let e = Platform::resolve(dir.path().join("none.toml").to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("none.toml"), "{e}");

        let bad = |text: &str, want: &[&str]| {
            let e = Platform::parse(text, "x.toml").unwrap_err().to_string();
            assert!(e.starts_with("x.toml: "), "{e}");
            for w in want {
                assert!(e.contains(w), "expected '{w}' in: {e}");
            }
        };
        bad(&format!("{GOOD}bogus = 1\n"), &["unknown field", "bogus"]);
        bad(
            &GOOD.replace("kind = \"discrete\"", "kind = \"cloud\""),
            &["cloud", "discrete", "unified"],
        );
        bad(
            &GOOD.replace("memory_bandwidth_gbs = 500\n", ""),
            &["memory_bandwidth_gbs"],
        );
        bad(
            &GOOD.replace("host_link_gbs = 12.5", "host_link_gbs = 0"),
            &["key 'host_link_gbs'", "positive"],
        );
        bad(
            &GOOD.replace("\"8.6\"", "\"sm86\""),
            &["key 'compute_capability'", "sm86"],
        );
        bad(
            &GOOD.replace("expert_cache_gib = 8", "expert_cache_gib = 20"),
            &["key 'expert_cache_gib'", "gpu_mem_gib"],
        );
        bad(
            &GOOD.replace("pace_link = true", "pace_link = \"yes\""),
            &["pace_link"],
        );
        // Issue 55, item 4: values no device has (a unit slip) are refused by key.
        bad(
            &GOOD.replace(
                "memory_bandwidth_gbs = 500",
                "memory_bandwidth_gbs = 500000",
            ),
            &["key 'memory_bandwidth_gbs'", "beyond any device", "unit"],
        );
        bad(
            &format!("{GOOD}cpu_threads = 1000000\n"),
            &["key 'cpu_threads'", "beyond any machine"],
        );
        // Unified memory has no host link to copy over.
        let unified = GOOD
            .replace("kind = \"discrete\"", "kind = \"unified\"")
            .replace("host_link_gbs = 12.5", "host_link_gbs = 0");
        let u = Platform::parse(&unified, "u.toml").unwrap();
        assert_eq!(u.slow_tier(), SlowTier::Disk);
        assert_eq!(u.pacing().unwrap().gbs, 3.0);
    }
}
