//! The offload engine's host-side logic (HOBBIT §3), independent of any device: the precision
//! scorer, the precision-aware cache policy, routing traces and their replay, the load
//! scheduler thread and the slow-tier readers. Backends (backend/cuda, backend/cpu) drive these.

pub mod behind;
pub mod cache;
pub mod io;
pub mod predictor;
pub mod replay;
pub mod scheduler;
pub mod scorer;
pub mod trace;

pub use cache::{ExpertCache, HobbitWeights, Insertion, Policy, PoolKind};
pub use io::{open_reader, BlobSource, HostCache};
pub use scheduler::{Priority, Scheduler, Ticket, Worker};
pub use scorer::{Group, LayerPlan, Precision, PrecisionPlan, Thresholds};
pub use trace::{Trace, TraceHeader, TraceWriter};

/// An expert of the model: (layer, expert index).
pub type ExpertKey = (usize, usize);
