//! hob: batch-1 Mixture-of-Experts inference with mixed-precision expert offloading.
//!
//! Data flows left to right through the modules: format -> quant -> import -> model -> backend
//! -> generate -> cli. A module knows nothing of those to its right.

pub mod error;
pub mod format;
pub mod quant;
pub mod import;
pub mod model;
pub mod backend;
pub mod generate;
pub mod cli;

pub use error::{Error, Result};
