//! Per-kernel GPU time (`hob bench --kernel-times`): an event pair around every launch of the
//! compute stream while switched on; read back and summed by kernel name on demand.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaFunction, CudaStream};

use super::cuda_err;
use crate::model::KernelTime;

#[derive(Default)]
pub struct KernelClock {
    on: AtomicBool,
    /// Kernel handle -> name (cuda/*.cu), filled when the kernels are loaded.
    names: HashMap<usize, String>,
    pending: Mutex<Vec<(usize, CudaEvent, CudaEvent)>>,
    /// Events already read back, recorded again (creating one per launch costs host time that
    /// the GPU then waits for).
    free: Mutex<Vec<CudaEvent>>,
    totals: Mutex<HashMap<usize, (u64, f64)>>,
}

fn key(f: &CudaFunction) -> usize {
    f.cu_function() as usize
}

impl KernelClock {
    pub fn new(names: impl IntoIterator<Item = (usize, String)>) -> KernelClock {
        KernelClock {
            names: names.into_iter().collect(),
            ..Default::default()
        }
    }

    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// An event before a launch, when the clock runs.
    pub fn start(&self, stream: &CudaStream) -> crate::Result<Option<CudaEvent>> {
        if !self.on.load(Ordering::Relaxed) {
            return Ok(None);
        }
        self.record(stream).map(Some)
    }

    fn record(&self, stream: &CudaStream) -> crate::Result<CudaEvent> {
        let reused = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match reused {
            Some(e) => e.record(stream).map(|_| e),
            None => stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)),
        }
        .map_err(cuda_err)
    }

    /// The event after the launch of `f` that `start` opened.
    pub fn stop(
        &self,
        stream: &CudaStream,
        f: &CudaFunction,
        start: Option<CudaEvent>,
    ) -> crate::Result<()> {
        let Some(start) = start else { return Ok(()) };
        let end = self.record(stream)?;
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.push((key(f), start, end));
        // Bound the events alive at once: every 4096 launches, resolve those the stream has
        // passed. Never wait for it here: a gated decode layer holds the stream until the host,
        // still launching, follows the token (src/experts/engine/gated.rs).
        if pending.len() >= 4096 {
            let mut passed = 0;
            while passed < pending.len() && pending[passed].2.try_is_complete().map_err(cuda_err)? {
                passed += 1;
            }
            let done: Vec<_> = pending.drain(..passed).collect();
            drop(pending);
            self.resolve(done)?;
        }
        Ok(())
    }

    fn resolve(&self, done: Vec<(usize, CudaEvent, CudaEvent)>) -> crate::Result<()> {
        let mut totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        let mut free = Vec::with_capacity(2 * done.len());
        for (k, a, b) in done {
            let ms = a.elapsed_ms(&b).map_err(cuda_err)?;
            let t = totals.entry(k).or_insert((0, 0.0));
            t.0 += 1;
            t.1 += ms as f64 / 1e3;
            free.extend([a, b]);
        }
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .append(&mut free);
        Ok(())
    }

    /// Time per kernel name since the last take, most time first (waits for recorded launches).
    pub fn take(&self) -> crate::Result<Vec<KernelTime>> {
        let done = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        self.resolve(done)?;
        let totals = std::mem::take(&mut *self.totals.lock().unwrap_or_else(|p| p.into_inner()));
        let mut by_name: HashMap<String, KernelTime> = HashMap::new();
        for (k, (n, s)) in totals {
            let name = self.names.get(&k).cloned().unwrap_or_else(|| "?".into());
            let t = by_name.entry(name.clone()).or_insert(KernelTime {
                name,
                launches: 0,
                seconds: 0.0,
            });
            t.launches += n;
            t.seconds += s;
        }
        let mut v: Vec<KernelTime> = by_name.into_values().collect();
        v.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        Ok(v)
    }
}
