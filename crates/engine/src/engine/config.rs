//! What an engine is made of and what can go wrong: the configuration
//! (`EngineConfig`, recorded in the superblock at create and read back from
//! it at open), the volumes to create, the open options, and the engine's
//! typed errors.

use super::{
    uuid_text, BlockDevice, CapGeometry, Damage, DeviceError, Serialize, Superblock, SuperblockError, VolumeError,
    CAPACITY_BYTES_MAX,
};

/// Engine configuration.
#[derive(Clone, Debug, Serialize)]
pub struct EngineConfig {
    /// Size of one log chunk on the cache device.
    pub chunk_bytes: u64,
    /// Size of one band on the capacity device.
    pub band_bytes: u64,
    /// Capacity write unit (IU); compaction writes are padded to it.
    pub write_unit_bytes: u64,
    /// Compact when fewer free chunks remain.
    pub log_free_chunks_min: usize,
    /// Run GC when fewer free bands remain.
    pub gc_free_bands_min: usize,
    /// DRAM the L2P may take (0: no limit). When every volume's map does
    /// not fit, the maps are paged: this much of them stays in DRAM, the
    /// rest lives in a region at the end of the cache device (l2p/pager.rs).
    pub l2p_dram_bytes: u64,
    /// How the capacity device holds the volumes (chosen at create,
    /// recorded in the superblock).
    pub layout: Layout,
    /// In place only: attached to a disk that holds data — the volumes
    /// from its byte 0, and nothing of Sluice's on it (no label, no
    /// checkpoint region: both live on the cache device, with the disk's
    /// identity, disk_identity.rs). Chosen at create.
    pub attached: bool,
    /// In place only: keep a CRC32C of every home the engine writes, in a
    /// table on the cache device (4 bytes per volume block; home_sums.rs),
    /// and check it on every read from a home. Chosen at create
    /// (superblock version 9); engines created without it never verify
    /// their homes.
    pub home_sums: bool,
}

/// How the capacity device holds the volumes' blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// Write shaping (CSAL): log-structured bands, zones on a zoned device,
    /// written only by compaction and GC in large sequential segments.
    #[default]
    Bands,
    /// Caching over a plain disk: each volume block has a home at its own
    /// LBA (volume after volume from byte 0); the log holds dirty and clean
    /// copies and cleaning writes the dirty ones home (cleaning.rs).
    InPlace,
}

impl Layout {
    pub(super) fn on_media(self) -> u8 {
        match self {
            Layout::Bands => crate::persist::LAYOUT_BANDS,
            Layout::InPlace => crate::persist::LAYOUT_IN_PLACE,
        }
    }
}

impl std::str::FromStr for Layout {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Layout, EngineError> {
        match s {
            "bands" => Ok(Layout::Bands),
            "in-place" => Ok(Layout::InPlace),
            _ => Err(EngineError::Config("layout is \"bands\" or \"in-place\"")),
        }
    }
}

impl Default for EngineConfig {
    fn default() -> EngineConfig {
        EngineConfig {
            chunk_bytes: 16 << 20,
            band_bytes: 256 << 20,
            write_unit_bytes: 64 << 10,
            log_free_chunks_min: 2,
            gc_free_bands_min: 2,
            l2p_dram_bytes: 0,
            layout: Layout::Bands,
            attached: false,
            home_sums: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("bad configuration: {0}")]
    Config(&'static str),
    #[error("volume {0:?} does not fit: capacity device too small for the volumes' total size")]
    TooBig(String),
    #[error(
        "the capacity device is {0} bytes; this engine addresses at most {max} bytes (128 TiB): \
         use a partition or a namespace of at most that size",
        max = CAPACITY_BYTES_MAX
    )]
    CapacityTooLarge(u64),
    /// A request the engine was asked to carry out failed.
    #[error("{0}")]
    Request(VolumeError),
    #[error("no volume named {0:?}")]
    NoVolume(String),
    #[error("device: {0}")]
    Device(#[from] DeviceError),
    #[error("superblock: {0}")]
    Superblock(#[from] crate::persist::SuperblockError),
    #[error(
        "checkpoint: {0}; refusing to open. `sluice check` reports it, `sluice check --salvage` rebuilds the \
         maps from the media instead"
    )]
    Checkpoint(#[from] crate::persist::CheckpointError),
    #[error(
        "checkpoint checksum mismatch (the clean-shutdown checkpoint is damaged); refusing to open. `sluice check` \
         reports it, `sluice check --salvage` rebuilds the maps from the media instead"
    )]
    CheckpointChecksum,
    /// Shutdown found the engine stopped by a failure (its first cause):
    /// no checkpoint was written.
    #[error("a device failed earlier ({0}); no checkpoint was written, the next open recovers from the media")]
    Failed(VolumeError),
    #[error("the on-media geometry does not match these devices")]
    Geometry,
    /// A write recovery makes after rebuilding the maps failed (a gap
    /// record, a rewrite, the mark): the next open recovers again.
    #[error("recovery: {0}")]
    Recovery(VolumeError),
    #[error("no Sluice engine on these devices (neither holds a Sluice superblock or label)")]
    NoEngine,
    #[error(
        "the engine on the devices was not shut down cleanly, and recovering it writes to them: \
         start it once read-write (without --read-only, on a writable file system), or run `sluice check`"
    )]
    ReadOnlyNeedsRecovery,
    #[error(
        "the cache device holds no Sluice superblock, but the capacity device belongs to engine {}: \
         the cache device was replaced, wiped or truncated; restore it (starting an empty engine over the \
         capacity device's data would lose it)",
        uuid_text(.0)
    )]
    CacheUnlabelled([u8; 16]),
    #[error(
        "the capacity device holds no Sluice label, but the cache device belongs to engine {}: the capacity \
         device was replaced, wiped or truncated; restore it",
        uuid_text(.0)
    )]
    CapacityUnlabelled([u8; 16]),
    #[error(
        "the devices belong to different engines: the cache device to {}, the capacity device to {}",
        uuid_text(.cache), uuid_text(.capacity)
    )]
    Mismatch { cache: [u8; 16], capacity: [u8; 16] },
    #[error(
        "the {device} device is {actual} bytes, but engine {} recorded {recorded}: it was truncated, resized \
         or is the wrong device",
        uuid_text(.uuid)
    )]
    DeviceSize { device: &'static str, uuid: [u8; 16], recorded: u64, actual: u64 },
    #[error("the {device} device already holds a Sluice engine ({}); refusing to overwrite it", uuid_text(.uuid))]
    AlreadyFormatted { device: &'static str, uuid: [u8; 16] },
    #[error("the capacity device's label: {0}")]
    Label(SuperblockError),
    #[error(
        "recovery found damage (not a torn write: a flush had made it durable); refusing to open. \
         `sluice check` reports it, `sluice check --salvage` accepts it:\n  {}",
        .0.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("\n  ")
    )]
    Damaged(Vec<Damage>),
    #[error(
        "the disk changed behind the cache's back (engine {}): {} of its sampled blocks hold what the cache \
         never wrote ({}); the cache holds {dirty_blocks} dirty blocks that would overwrite it, so nothing \
         was served or written. Put back the disk the cache belongs to, or, if what is on the disk now is \
         what you want, `sluice format` a new cache for it (the cache's dirty data is then lost)",
        uuid_text(.uuid),
        .changed.len(),
        .changed.iter().map(|c| format!("byte {}", c.offset)).collect::<Vec<_>>().join(", ")
    )]
    DiskChanged { uuid: [u8; 16], changed: Vec<super::disk_identity::ChangedBlock>, dirty_blocks: u64 },
    #[error("engine {} is attached to a disk, but the cache device holds no readable identity of it", uuid_text(.0))]
    NoDiskIdentity([u8; 16]),
}

/// A volume to create.
#[derive(Clone, Debug)]
pub struct VolumeSpec {
    pub name: String,
    pub size_bytes: u64,
}

/// How `Engine::open_with` opens.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// The clock and schedule the engine runs on (runtime.rs; real time,
    /// concurrent, by default).
    pub runtime: super::Runtime,
    /// Serve reads only and write nothing, ever (a read-only file system,
    /// `sluice serve --read-only`): only an engine shut down cleanly opens
    /// this way (recovery writes), and every change is refused with
    /// `VolumeError::ReadOnly`; shutting it down writes nothing either.
    pub read_only: bool,
    /// With `salvage`: rebuild every map from the media even after a clean
    /// shutdown, as after a crash, instead of trusting the checkpoint
    /// (`sluice check --salvage`: the checkpoint itself may be what is
    /// damaged, or disagree with the media).
    pub ignore_checkpoint: bool,
    /// Open even though recovery found damage, or the checkpoint is
    /// damaged (recovering from the media instead): blocks whose newest copy
    /// is damaged are trimmed (they read as zeros), damaged bands are
    /// emptied and discarded (`Engine::salvage_repair`), and what damaged
    /// log records held (their LBAs are unknown) reverts to older copies.
    /// `Engine::salvaged` lists what was accepted.
    pub salvage: bool,
}

/// The engine geometry the superblock records, and the capacity device's.
pub(super) fn on_media_config(
    sb: &Superblock,
    capacity: &dyn BlockDevice,
) -> Result<(EngineConfig, CapGeometry), EngineError> {
    let geo = CapGeometry::of(capacity, sb.band_bytes);
    if geo.band_bytes != sb.band_bytes {
        return Err(EngineError::Geometry);
    }
    let cfg = EngineConfig {
        chunk_bytes: sb.chunk_bytes,
        band_bytes: sb.band_bytes,
        write_unit_bytes: sb.write_unit_bytes,
        log_free_chunks_min: sb.log_free_chunks_min as usize,
        gc_free_bands_min: sb.gc_free_bands_min as usize,
        l2p_dram_bytes: sb.l2p_dram_bytes,
        layout: if sb.layout == crate::persist::LAYOUT_BANDS { Layout::Bands } else { Layout::InPlace },
        attached: sb.layout == crate::persist::LAYOUT_ATTACHED,
        home_sums: sb.home_sums,
    };
    Ok((cfg, geo))
}

/// Bands on the capacity device: those before the checkpoint region; none
/// in place, where that space is the volumes' homes.
pub(super) fn band_count(sb: &Superblock, cfg: &EngineConfig) -> u64 {
    match cfg.layout {
        Layout::Bands => sb.checkpoint_offset / cfg.band_bytes,
        Layout::InPlace => 0,
    }
}
