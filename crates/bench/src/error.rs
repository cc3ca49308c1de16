//! The error of every benchmark run: building a system, reading a job
//! file, running it, replaying a trace.
//!
//! Why a module of its own: the systems a job runs on (`job`), the stacks
//! they are built from (`stacked`) and the trace replay (`trace`) all
//! return it, and the job runner uses the other two; kept here, none of
//! them imports a module that imports it.

use crate::runner::RunError;
use crate::trace::ReplayError;
use sluice_workload::job::{JobError, ResolveError};
use sluice_workload::GenError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    #[error(
        "unknown system {0:?} (expected qlc, tlc, scm, zns, hdd, sluice+qlc, sluice+zns, sluice+zns-shared or setassoc+qlc)"
    )]
    UnknownSystem(String),
    #[error("engine: {0}")]
    Engine(sluice_engine::EngineError),
    #[error("{system}: capacity {capacity_bytes} bytes is not a usable size for this medium")]
    BadCapacity { system: &'static str, capacity_bytes: u64 },
    #[error("job file: {0}")]
    Job(#[from] JobError),
    #[error("job file: {0}")]
    Resolve(#[from] ResolveError),
    #[error("job file: {0}")]
    Gen(#[from] GenError),
    #[error("run: {0}")]
    Run(#[from] RunError),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("replay: {0}")]
    Replay(#[from] ReplayError),
}
