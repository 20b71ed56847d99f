//! The GPU the tests use, when there is one.

use std::sync::Arc;

use hob::backend::cuda::{self, Gpu};

/// Device 0, or None (printed: why) where CUDA cannot be used: the GPU checks then pass without
/// checking anything.
pub fn gpu() -> Option<Arc<Gpu>> {
    if let Err(why) = cuda::probe() {
        eprintln!("skipping the GPU checks: {why}");
        return None;
    }
    Some(Gpu::open(0).expect("a usable GPU opens"))
}
