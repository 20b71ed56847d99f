//! The experts of a layer, computed: the offload engine (`engine`, HOBBIT §3, device-generic),
//! the experts computed straight from the mapped file (`direct`, the CPU), and the host-side
//! parts they are built from: the precision scorer, the precision-aware cache policy, stacked-gate
//! prediction, the load scheduler and the slow-tier readers, routing traces and their replay.
//! How the engine works: README.md beside this file.

pub mod behind;
pub mod cache;
pub mod direct;
pub mod engine;
pub mod io;
pub mod predictor;
pub mod replay;
pub mod scheduler;
pub mod scorer;
pub mod trace;

pub use cache::{ExpertCache, HobbitWeights, Insertion, Policy, PoolKind};
pub use direct::DirectExperts;
pub use engine::{Engine, EngineConfig, ExpertReport, ExpertStats, VariantStats};
pub use io::{open_reader, BlobSource};
pub use scheduler::{Priority, Scheduler, Ticket, Worker};
pub use scorer::{Group, LayerPlan, Precision, PrecisionPlan, Thresholds};
pub use trace::{Trace, TraceHeader, TraceWriter};

use crate::model::{Backend, ExpertExecutor};

/// An expert of the model: (layer, expert index).
pub type ExpertKey = (usize, usize);

/// An executor a session can hold: it computes experts and reports what it did.
pub trait Experts<B: Backend>: ExpertExecutor<B> + ExpertReport {}
impl<B: Backend, T: ExpertExecutor<B> + ExpertReport> Experts<B> for T {}
