//! The KV cache on the device (`CudaBackend`'s `Backend::Kv`).

use super::*;

/// The KV cache on the device: (layer, ctx, kv_dim) f16 keys and values.
pub struct CudaKv {
    pub(super) ctx: usize,
    pub(super) kv_dim: usize,
    pub(super) k: CudaSlice<u16>,
    /// One unused value where the values are the keys (`alloc_kv`): `rows` and `attention` read
    /// the keys' rows as values.
    pub(super) v: CudaSlice<u16>,
    pub(super) values_are_keys: bool,
}

impl CudaKv {
    /// Device addresses of `layer`'s key and value rows for positions start..start + t.
    pub(super) fn rows(
        &self,
        layer: usize,
        start: usize,
        t: usize,
        s: &CudaStream,
    ) -> crate::Result<(u64, u64)> {
        if start + t > self.ctx {
            return Err(Error::Invalid(format!(
                "CUDA backend: KV write past the context ({} > {})",
                start + t,
                self.ctx
            )));
        }
        let at = ((layer * self.ctx + start) * self.kv_dim * 2) as u64;
        Ok((ptr(&self.k, s) + at, self.values(s) + at))
    }

    /// The device address of the values' cache (the keys' where they are the same rows).
    pub(super) fn values(&self, s: &CudaStream) -> u64 {
        ptr(
            if self.values_are_keys {
                &self.k
            } else {
                &self.v
            },
            s,
        )
    }
}
