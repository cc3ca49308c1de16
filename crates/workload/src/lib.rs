//! `sluice-workload`: fio-compatible workload generation and block-trace replay input.
//!
//! Owns: turning fio job files (and CSV traces) into deterministic streams of block I/Os on a
//! device of known size. Modules:
//! - [`rng`]: seeded xoshiro256** ([`Rng`]); the only source of randomness in the crate.
//! - [`dist`]: offset distributions — uniform with fio's random map, `norandommap`, and fio's exact
//!   zipf / pareto arithmetic ([`Distribution`], [`Sampler`]).
//! - [`job`]: fio INI job files → [`JobSpec`] → [`ResolvedJob`] (per-`numjobs` regions and seeds).
//! - [`gen`]: [`IoGen`], the I/O stream of one job instance, and [`PreconditionGen`].
//! - [`trace`]: `timestamp_us,op,offset,size` CSV traces ([`TraceRecord`]).
//!
//! Invariants: no wall-clock time and no OS entropy are used anywhere; the same inputs and seeds give
//! the same I/O sequence on every machine. Runtime limits are the caller's business (time is virtual).
//!
//! Why: the simulator must be driven by the same job files people run with fio, and produce the same
//! access *shape* (measured against the real fio binary in `tests/fio_zipf.rs`).

pub mod dist;
pub mod gen;
pub mod job;
pub mod rng;
pub mod trace;

pub use dist::{DistError, Distribution, Pareto, Permutation, Sampler, Uniform, UniformNoMap, Zipf};
pub use gen::{GenError, GenParams, Io, IoGen, Op, Precondition, PreconditionGen, RwKind};
pub use job::{
    parse_bytes, parse_fio_bytes, parse_job_file, parse_size_in, BlockSizes, JobError, JobFile, JobInstance, JobSpec,
    ResolveError, ResolvedJob, SizeValue, Units, ValueError, Warning,
};
pub use rng::Rng;
pub use trace::{parse_trace, TraceError, TraceFormat, TraceLineError, TraceOp, TraceReader, TraceRecord};
