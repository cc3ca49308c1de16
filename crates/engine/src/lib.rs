//! Sluice's engine: volumes of 4 KiB blocks over a cache device (a FIFO write
//! log) and a capacity device, written against the media traits only.

pub mod engine;
pub mod faults;
pub mod layout;
pub mod metrics;
pub mod persist;
/// Operator messages, rate-limited (shared with the frontends).
pub use sluice_volume::report;
#[cfg(test)]
mod testkit;
/// The `Volume` trait the engine serves (its own crate, so that the
/// frontends depend on it and not on the engine).
pub use sluice_volume as volume;

pub use engine::{
    Allocation, BandPlacement, CacheMode, CachePolicy, CacheReport, CacheStats, CheckReport, ClassDirection,
    ClassStats, Cleaning, CleaningMode, Compactor, CompactorConfig, CompactorSnapshot, Damage, Engine, EngineConfig,
    EngineError, EngineSnapshot, EngineStats, EngineVolume, IoClass, L2pStats, Layout, OpenOptions, Outcome, Runtime,
    Schedule, SeqCutoff, StagedWrite, Stepped, VolumeSnapshot, VolumeSpec, WriteStep, DIRECT_WRITE_BYTES_DEFAULT,
};
pub use volume::{Extent, Volume, VolumeError, WriteBuf};
