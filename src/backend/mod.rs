//! Compute backends. `cpu`: a persistent thread pool and parallel matvec over quant's kernels.

pub mod cpu;
pub mod cuda;
