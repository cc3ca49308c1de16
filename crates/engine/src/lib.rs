//! Sluice's engine: volumes of 4 KiB blocks over a cache device (a FIFO write
//! log) and a capacity device, written against the media traits only.

pub mod engine;
pub mod ext4;
pub mod faults;
pub mod layout;
pub mod metrics;
pub mod persist;
pub mod report;
#[cfg(test)]
mod testkit;
pub mod volume;

pub use engine::{
    BandPlacement, CacheMode, CachePolicy, CacheReport, CacheStats, CheckReport, ClassDirection, ClassStats, Cleaning,
    CleaningMode, Compactor, CompactorConfig, CompactorSnapshot, Damage, Engine, EngineConfig, EngineError,
    EngineSnapshot, EngineStats, EngineVolume, IoClass, L2pStats, Layout, OpenOptions, Runtime, Schedule, SeqCutoff,
    StagedWrite, Stepped, VolumeSnapshot, VolumeSpec, WriteStep,
};
pub use volume::{Extent, Volume, VolumeError, WriteBuf};
