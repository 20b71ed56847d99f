//! Where a test finds the checkout, the hob binary and scratch space, also when it runs on another
//! machine than it was built on (tools/stage_gpu.sh copies the test executables to the device).
#![allow(dead_code)] // each test binary uses a different part of this module

use std::path::{Path, PathBuf};

/// The hob checkout: the current directory when it is one (cargo runs tests from the package root,
/// .gpu/run.sh from the repository root), else the one the tests were built from.
pub fn repo_root() -> PathBuf {
    std::env::current_dir()
        .ok()
        .filter(|dir| is_checkout(dir))
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

fn is_checkout(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("Cargo.toml"))
        .is_ok_and(|toml| toml.lines().any(|l| l.trim() == r#"name = "hob""#))
}

/// The hob binary: cargo's build of it where that exists, else the staged copy `.gpu/hob` under
/// the current directory.
pub fn hob_bin() -> PathBuf {
    let built = Path::new(env!("CARGO_BIN_EXE_hob"));
    if built.exists() {
        return built.to_path_buf();
    }
    std::env::current_dir().unwrap_or_default().join(".gpu/hob")
}

/// Scratch space: cargo's target/tmp (a real filesystem as a rule) where it exists, else the
/// system temp dir.
pub fn tmp_root() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"));
    if target.is_dir() {
        target.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}
