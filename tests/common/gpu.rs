//! The GPU the tests use, when there is one.

use std::sync::Arc;

use hob::backend::cuda::{self, Gpu};

/// Device 0. The GPU tests are `#[ignore]`d (so a machine without a GPU counts them as ignored,
/// not passed); run with `--include-ignored`, they fail where CUDA cannot be used, saying why.
pub fn gpu() -> Arc<Gpu> {
    if let Err(why) = cuda::probe() {
        panic!("this GPU test was asked for (--include-ignored) but CUDA cannot be used: {why}");
    }
    Gpu::open(0).expect("a usable GPU opens")
}
