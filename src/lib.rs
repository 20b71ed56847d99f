//! hob: batch-1 Mixture-of-Experts inference with mixed-precision expert offloading.
//!
//! Data flows left to right through the modules: format -> quant -> import -> model -> backend
//! and experts -> generate -> serve -> cli. A module knows nothing of those to its right; backend and
//! experts meet only through model's traits (`ExpertDevice`, `ExpertExecutor`). Beside that
//! line: `platform` (hardware profiles) and `bench` (benchmark statistics, physical limit, result
//! tables).

pub mod backend;
pub mod bench;
pub mod cli;
pub mod error;
pub mod experts;
pub mod format;
pub mod generate;
pub mod import;
pub mod model;
pub mod platform;
pub mod quant;
pub mod serve;

pub use error::{Error, Result};
