//! The write-shaping engine: volumes over a cache-device write log and a
//! capacity device written only in large sequential per-volume bands.
//!
//! Data path:
//! - **Write**: appended to the open chunk of the log on the cache device as
//!   one record (header + data, one device write); the L2P then points at the
//!   cache. Acknowledged once the device write completes (FUA adds a flush).
//! - **Compaction**: when free chunks fall below `log_free_chunks_min`, the
//!   oldest full chunk is read in one I/O; blocks still current (the L2P still
//!   points at them) go, grouped by volume, to that volume's open band on the
//!   capacity device as one sequential write padded to `write_unit_bytes`
//!   (the capacity SSD's IU, so it never read-modify-writes); the L2P moves
//!   to the capacity only for those blocks. The chunk is then free.
//! - **GC**: when free bands fall below `gc_free_bands_min`, the band with
//!   the best cost-benefit score ((1 − u) · age / (1 + u)) is relocated into a
//!   separate GC band (cold data stays with cold data) and discarded.
//!
//! This file is the façade: `Engine` (create, open, shutdown, handles) and
//! the state it composes, behind one lock (`Inner`). Each part of the
//! engine is a module of its own, with its state and invariants:
//! - the CSAL parts: `l2p` (the map and its entry), `log` (the write log:
//!   chunks, records, group commit), `compaction`, `gc` (victim choice)
//!   and `placement` (which band a volume's blocks go to);
//! - the capacity device: `bands` (bands and their states), `segments`
//!   (how compaction and GC write it, and the crash-safety rules), `zoned`
//!   (ZNS zones as bands);
//! - background work: `worker` (the compactor thread), `throttle` (the
//!   set-point controller), `step_io` (a step's I/O outside the lock);
//! - reads: `read` (L2P to bytes, checked), `handle` (the `Volume` trait);
//! - durability: `recovery` (rebuild from the media), `checkpoint` (clean
//!   shutdown), `marks` (what the capacity device holds durably),
//!   `identity` (which devices belong together), `salvage`, `check`.
//!
//! Invariants (checked by `check_invariants` in tests): every mapped L2P
//! entry points at a cache or capacity block whose P2L names it back (a
//! chunk's P2L, or for a band the segment headers on the media), valid
//! counts equal the number of such blocks, and every open band is exactly
//! one stream's. Requests run synchronously under the one lock, which makes
//! the engine deterministic on emulated devices; reads and a background
//! step's device I/O run outside it (docs/engine.md says how each part
//! takes the write path to every core).

use crate::layout::{crc32c, encode_header, BLOCK_BYTES, RECORD_BLOCKS_MAX};
use crate::metrics::{Op, OpSnapshot, VolumeMetrics};
use crate::persist::{uuid_text, CapacityLabel, CheckpointError, Reader, Superblock, SuperblockError, Writer};
use crate::volume::{check, Extent, Volume, VolumeError, WriteBuf};
use serde::Serialize;
use sluice_media::device::{flush, read_at, sync_io, write_at};
use sluice_media::{BlockDevice, DeviceError, DeviceStats, IoBuf, IoOp, IoRequest, SharedDevice};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

mod bands;
mod check;
mod checkpoint;
mod compaction;
mod gc;
mod handle;
mod identity;
mod l2p;
mod log;
mod marks;
mod placement;
mod pool;
mod read;
mod recovery;
mod salvage;
mod segments;
mod step_io;
#[cfg(test)]
mod tests;
mod throttle;
mod worker;
mod zoned;

use bands::{Band, BandId, BandState, Bands};
pub use check::CheckReport;
use compaction::CompactCursor;
use gc::GcCursor;
pub use handle::{EngineSnapshot, EngineVolume, VolumeSnapshot};
use identity::write_label;
pub use identity::{label_offset, label_present, superblock_present, wipe_labels};
pub use l2p::CAPACITY_BYTES_MAX;
use l2p::{L2p, Loc, PageStore, Width};
use log::{Chunk, ChunkId, ChunkState, Log};
pub use placement::BandPlacement;
use pool::BufPool;
pub use recovery::Damage;
use segments::{CapWrites, CAP_QUEUE_DEPTH};
pub use throttle::Throttle;
pub use worker::{Compactor, CompactorConfig, CompactorSnapshot};

use checkpoint::{checkpoint_bytes_max, checkpoint_page_bytes, decode_checkpoint, encode_checkpoint};
use zoned::CapGeometry;

const BS: u64 = BLOCK_BYTES as u64;

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
        }
    }
}

#[derive(Debug, thiserror::Error)]
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
    #[error("no volume named {0:?}")]
    NoVolume(String),
    #[error("device: {0}")]
    Device(#[from] DeviceError),
    #[error("superblock: {0}")]
    Superblock(#[from] crate::persist::SuperblockError),
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] crate::persist::CheckpointError),
    #[error("checkpoint checksum mismatch")]
    CheckpointChecksum,
    #[error("a device failed earlier; no checkpoint was written, the next open recovers from the media")]
    Failed,
    #[error("the on-media geometry does not match these devices")]
    Geometry,
    /// A write recovery makes after rebuilding the maps failed (a gap
    /// record, a rewrite, the mark): the next open recovers again.
    #[error("recovery: {0}")]
    Recovery(VolumeError),
    #[error("no Sluice engine on these devices (neither holds a Sluice superblock or label)")]
    NoEngine,
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
}

impl From<DeviceError> for VolumeError {
    fn from(e: DeviceError) -> VolumeError {
        VolumeError::Io(e)
    }
}

/// The L2P's paging (`Engine::l2p_stats`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct L2pStats {
    pub paged: bool,
    /// DRAM the maps take (entries and CRCs, or a paged map's frames and tables).
    pub dram_bytes: u64,
    pub page_faults: u64,
    pub page_writebacks: u64,
}

/// A volume to create.
#[derive(Clone, Debug)]
pub struct VolumeSpec {
    pub name: String,
    pub size_bytes: u64,
}

struct Vol {
    name: String,
    /// Each block's place and the CRC32C of its data as logged (the value
    /// in its record's header entry): every read is checked against it.
    /// Kept in DRAM beside the place (4 B per block) so that a read costs
    /// one device I/O, not a second one for the header.
    l2p: L2p,
    open_band: Option<BandId>,
    /// The band this stream filled last and its epoch (closed, or left full
    /// by a recovery): the next band it opens names it (`Band::prev`).
    last_band: Option<(BandId, u64)>,
    /// Data bytes of this volume compaction and GC wrote to the capacity
    /// device since the engine was opened (not persisted): per-tenant
    /// capacity write amplification.
    moved: Moves,
}

#[derive(Clone, Copy, Debug, Default)]
struct Moves {
    compaction_bytes: u64,
    gc_bytes: u64,
}

/// Counters of the engine (bytes unless named otherwise).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct EngineStats {
    pub user_write_bytes: u64,
    pub user_read_bytes: u64,
    pub user_trim_bytes: u64,
    pub cache_write_bytes: u64,
    pub cache_header_bytes: u64,
    pub capacity_write_bytes: u64,
    pub compaction_bytes: u64,
    pub compaction_pad_bytes: u64,
    pub gc_bytes: u64,
    pub chunks_compacted: u64,
    pub bands_reclaimed: u64,
}

impl EngineStats {
    fn words(&self) -> [u64; 11] {
        [
            self.user_write_bytes,
            self.user_read_bytes,
            self.user_trim_bytes,
            self.cache_write_bytes,
            self.cache_header_bytes,
            self.capacity_write_bytes,
            self.compaction_bytes,
            self.compaction_pad_bytes,
            self.gc_bytes,
            self.chunks_compacted,
            self.bands_reclaimed,
        ]
    }

    fn from_words(w: [u64; 11]) -> EngineStats {
        EngineStats {
            user_write_bytes: w[0],
            user_read_bytes: w[1],
            user_trim_bytes: w[2],
            cache_write_bytes: w[3],
            cache_header_bytes: w[4],
            capacity_write_bytes: w[5],
            compaction_bytes: w[6],
            compaction_pad_bytes: w[7],
            gc_bytes: w[8],
            chunks_compacted: w[9],
            bands_reclaimed: w[10],
        }
    }

    /// Bytes written to both devices / bytes the users wrote.
    pub fn host_waf(&self) -> f64 {
        if self.user_write_bytes == 0 {
            0.0
        } else {
            (self.cache_write_bytes + self.capacity_write_bytes) as f64 / self.user_write_bytes as f64
        }
    }
}

/// The engine's state, behind its one lock: each part owned by the module
/// named after it.
struct Inner {
    cfg: EngineConfig,
    /// The capacity device's band geometry (zones on a zoned device).
    geo: CapGeometry,
    vols: Vec<Vol>,
    /// The write log on the cache device (log.rs).
    log: Log,
    /// The capacity device's bands (bands.rs).
    bands: Bands,
    /// Segment writes to the capacity device and its flush state (segments.rs).
    cap: CapWrites,
    /// The GC victim a bounded step left half done (`Engine::gc_step`);
    /// not persisted: after a reopen GC simply chooses again.
    gc_cursor: Option<GcCursor>,
    /// The background compactor's last step: segment writes in flight and
    /// the remaps that wait for them (`Engine::settle`). Not persisted.
    pending: Option<step_io::Pending>,
    /// Where a bounded compaction step stopped in the oldest full chunk
    /// (`Engine::compact_step`); not persisted, like `gc_cursor`.
    compact_cursor: Option<CompactCursor>,
    /// The engine's write sequence: every record and segment takes the next.
    seq: u64,
    stats: EngineStats,
    /// Reusable I/O buffers (pool.rs).
    pool: BufPool,
    /// The superblock as last written.
    sb: Superblock,
    /// `sb.engine_tag()`: what every record header this engine writes
    /// carries, and every one it reads must.
    tag: u32,
    /// Set by `shutdown`: every later request fails.
    closed: bool,
    /// Set when a device failed under a change: the in-memory state may be
    /// ahead of or behind the media, so nothing more is written; reads still
    /// work. Reopening recovers from the media.
    failed: bool,
    /// Highest sequence made durable on the cache device by a completed flush.
    cache_flushed_seq: u64,
    /// Generation of the last capacity mark written (`marks.rs`).
    mark_gen: u64,
    /// Set in virtual-time simulation only (`Engine::attach_sim_clock`).
    sim: Option<SimGate>,
    /// Where compaction puts each volume's blocks (`Engine::set_band_placement`).
    placement: BandPlacement,
}

/// Causality for simulating this synchronous engine as many concurrent
/// callers on a virtual clock: each call runs at its caller's own time, so a
/// call may free a chunk (or band) at a time later than another caller's
/// present. No write may land in a chunk or band before it was freed; these
/// are the times they were. This is what throttles simulated writers to the
/// compaction rate, as a real background compactor would.
struct SimGate {
    clock: sluice_media::ClockRef,
    chunk_free_at_ns: Vec<u64>,
    band_free_at_ns: Vec<u64>,
}

/// The engine: owns the devices and every volume's map.
pub struct Engine {
    /// The devices, shared so that reads run outside the engine lock while
    /// the lock holder's I/O keeps its submit-then-reap shape (each thread
    /// reaps only its own requests).
    cache: Arc<dyn BlockDevice>,
    capacity: Arc<dyn BlockDevice>,
    /// Reads doing device I/O outside the lock right now, and the most
    /// allowed: each has one request in flight, and together with the lock
    /// holder's `CAP_QUEUE_DEPTH` they must stay within both devices' queue
    /// depth (a request beyond it fails with `QueueFull`). A read finding
    /// no room reads under the lock, as every read once did.
    unlocked_reads: std::sync::atomic::AtomicUsize,
    unlocked_reads_max: usize,
    inner: Mutex<Inner>,
    /// Buffers `write_buffer` hands out, so requests' payloads are received
    /// where the log record is written from (a lock of their own).
    write_bufs: Mutex<BufPool>,
    /// Set when `open` found an unclean stop: how long recovery took.
    recovered_in: Option<std::time::Duration>,
    /// Damage a salvaging open accepted.
    salvaged: Vec<Damage>,
    /// Request metrics, one per volume (shared by every handle to it).
    metrics: Vec<Arc<VolumeMetrics>>,
    /// Background compaction and the write throttle (`start_compactor`).
    bg: worker::Background,
    /// Time origin of the throttle's schedule.
    epoch: std::time::Instant,
    /// Tell servers to run reads in parallel (`set_parallel_reads`).
    parallel_reads: std::sync::atomic::AtomicBool,
}

impl Engine {
    fn assemble(
        cache: Arc<dyn BlockDevice>,
        capacity: Arc<dyn BlockDevice>,
        inner: Inner,
        recovered_in: Option<std::time::Duration>,
    ) -> Arc<Engine> {
        let metrics = inner.vols.iter().map(|_| Arc::new(VolumeMetrics::default())).collect();
        let depth = cache.info().queue_depth_max.min(capacity.info().queue_depth_max);
        Arc::new(Engine {
            cache: SharedDevice::wrap(cache),
            capacity: SharedDevice::wrap(capacity),
            unlocked_reads: std::sync::atomic::AtomicUsize::new(0),
            unlocked_reads_max: depth.saturating_sub(CAP_QUEUE_DEPTH + 2),
            inner: Mutex::new(inner),
            write_bufs: Mutex::new(BufPool::default()),
            recovered_in,
            salvaged: Vec::new(),
            metrics,
            bg: worker::Background::new(),
            parallel_reads: std::sync::atomic::AtomicBool::new(false),
            epoch: std::time::Instant::now(),
        })
    }

    /// Create a fresh engine on the two devices with these volumes.
    pub fn create(
        cache: Arc<dyn BlockDevice>,
        capacity: Arc<dyn BlockDevice>,
        mut cfg: EngineConfig,
        volumes: &[VolumeSpec],
    ) -> Result<Arc<Engine>, EngineError> {
        // Shared from the start: a paged map does its I/O through it.
        let (cache, capacity) = (SharedDevice::wrap(cache), SharedDevice::wrap(capacity));
        // On a zoned capacity device, bands are its zones.
        let geo = CapGeometry::of(&*capacity, cfg.band_bytes);
        cfg.band_bytes = geo.band_bytes;
        // Partially written zones: one open band per volume, the GC band, and
        // (briefly, at shutdown) the checkpoint's last zone.
        if geo.max_active != 0 && volumes.len() as u64 + 2 > geo.max_active as u64 {
            return Err(EngineError::Config(
                "more volumes than the zoned device's active-zone limit allows (volumes + 2)",
            ));
        }
        // Chunk 0 holds the superblock and the capacity marks (blocks 0-3).
        if !cfg.chunk_bytes.is_multiple_of(BS) || cfg.chunk_bytes < 4 * BS {
            return Err(EngineError::Config("chunk_bytes must be ≥ 4 blocks and a multiple of 4 KiB"));
        }
        if !cfg.write_unit_bytes.is_multiple_of(BS)
            || cfg.write_unit_bytes == 0
            || !cfg.band_bytes.is_multiple_of(cfg.write_unit_bytes)
        {
            return Err(EngineError::Config("band_bytes must be a multiple of write_unit_bytes, itself of 4 KiB"));
        }
        // Paged maps take a region at the end of the cache device.
        let vols_blocks: u64 = volumes.iter().map(|v| v.size_bytes / BS).sum();
        let width = Width::for_devices(cache.info().capacity_bytes / BS, capacity.info().capacity_bytes / BS);
        let paged = cfg.l2p_dram_bytes != 0 && vols_blocks * (width.bytes() + 4) > cfg.l2p_dram_bytes;
        let region: u64 = if paged {
            let pages: u64 = volumes.iter().map(|v| L2p::region_bytes(v.size_bytes / BS, width)).sum();
            pages.div_ceil(cfg.chunk_bytes) * cfg.chunk_bytes
        } else {
            0
        };
        let chunk_count = cache.info().capacity_bytes.saturating_sub(region) / cfg.chunk_bytes;
        // Chunk 0 holds the superblock; the log needs its reserve plus two.
        if chunk_count < cfg.log_free_chunks_min as u64 + 3 {
            return Err(EngineError::Config("cache device too small for the log"));
        }
        if volumes.len() > crate::persist::VOLUMES_MAX
            || volumes.iter().any(|v| v.name.is_empty() || v.name.len() > crate::persist::NAME_BYTES_MAX)
        {
            return Err(EngineError::Config("too many volumes, or a name empty or over 63 bytes"));
        }
        let capacity_bytes = capacity.info().capacity_bytes;
        if capacity_bytes > CAPACITY_BYTES_MAX {
            return Err(EngineError::CapacityTooLarge(capacity_bytes));
        }
        let all_bands = capacity_bytes / cfg.band_bytes;
        if all_bands >= u32::MAX as u64 || chunk_count >= u32::MAX as u64 {
            return Err(EngineError::Config("more than 2^32 - 1 bands or chunks: make them larger"));
        }
        // The checkpoint region at the end of the capacity device, whole
        // bands, and the label after it (`label_offset`): in the last two
        // blocks of a conventional device, in a zone of its own on a zoned one.
        let map_bytes = if paged { checkpoint_page_bytes(vols_blocks, volumes.len() as u64) } else { 12 * vols_blocks };
        let ckpt_bytes = checkpoint_bytes_max(&cfg, chunk_count, all_bands, volumes.len() as u64, map_bytes);
        let ckpt_bands = if geo.zoned {
            ckpt_bytes.div_ceil(geo.usable_blocks * BS) + 1
        } else {
            (ckpt_bytes + 2 * BS).div_ceil(cfg.band_bytes)
        };
        let band_count = all_bands.saturating_sub(ckpt_bands);
        if band_count == 0 {
            return Err(EngineError::Config("capacity device too small for one band and the checkpoint"));
        }
        // Every volume may hold an open band, GC holds one, and GC needs its reserve.
        let reserve = volumes.len() as u64 + 1 + cfg.gc_free_bands_min as u64;
        // A band holds at least one segment header per RECORD_BLOCKS_MAX
        // data blocks: small bands lose a large share to them (a 4-block
        // band holds at most 3 blocks of data).
        let headers = geo.usable_blocks.div_ceil(RECORD_BLOCKS_MAX as u64 + 1);
        let usable_blocks = band_count.saturating_sub(reserve) * geo.usable_blocks.saturating_sub(headers);
        if let Some(v) = volumes.iter().find(|v| v.size_bytes % BS != 0 || v.size_bytes == 0) {
            return Err(EngineError::TooBig(v.name.clone()));
        }
        if vols_blocks > usable_blocks {
            return Err(EngineError::TooBig(volumes.last().map(|v| v.name.clone()).unwrap_or_default()));
        }
        // Never over another engine: `sluice format --force` wipes first.
        if let Some(uuid) = superblock_present(&*cache)? {
            return Err(EngineError::AlreadyFormatted { device: "cache", uuid });
        }
        if let Some(uuid) = label_present(&*capacity)? {
            return Err(EngineError::AlreadyFormatted { device: "capacity", uuid });
        }
        let uuid = crate::persist::new_uuid();
        let sb = Superblock {
            uuid,
            generation: 1,
            clean: false,
            chunk_bytes: cfg.chunk_bytes,
            band_bytes: cfg.band_bytes,
            write_unit_bytes: cfg.write_unit_bytes,
            log_free_chunks_min: cfg.log_free_chunks_min as u32,
            gc_free_bands_min: cfg.gc_free_bands_min as u32,
            cache_bytes: cache.info().capacity_bytes,
            capacity_bytes: capacity.info().capacity_bytes,
            checkpoint_offset: band_count * cfg.band_bytes,
            checkpoint_bytes: 0,
            checkpoint_crc: 0,
            seq_floor: 0,
            l2p_dram_bytes: if paged { cfg.l2p_dram_bytes } else { 0 },
            volumes: volumes.iter().map(|v| (v.name.clone(), v.size_bytes)).collect(),
        };
        let label = CapacityLabel {
            uuid,
            capacity_bytes: capacity.info().capacity_bytes,
            cache_bytes: cache.info().capacity_bytes,
            band_bytes: cfg.band_bytes,
        };
        let maps = new_maps(&sb, &cache);
        let inner = Inner::empty(cfg, geo, sb, chunk_count, band_count, maps);
        // The label first: a crash between the two leaves a capacity device
        // that names an engine whose cache device is blank, which opening
        // refuses (`CacheUnlabelled`) rather than mistaking for a new engine.
        write_label(&*capacity, &geo, &label)?;
        inner.sb.write_to(&*cache)?;
        Ok(Engine::assemble(cache, capacity, inner, None))
    }

    /// Simulation only: run on `clock` (the virtual clock the emulated devices
    /// use, which the simulator sets to each caller's time before a call).
    /// From now on a write waits until the chunk or band it lands in was
    /// freed (`SimGate`). Without this the engine ignores time entirely.
    pub fn attach_sim_clock(&self, clock: sluice_media::ClockRef) {
        let mut inner = self.lock();
        let (chunks, bands) = (inner.log.chunks.len(), inner.bands.len());
        inner.sim = Some(SimGate { clock, chunk_free_at_ns: vec![0; chunks], band_free_at_ns: vec![0; bands] });
    }

    /// Reopen an engine from its devices: from its checkpoint after a clean
    /// shutdown, by recovery otherwise. Damage recovery finds is refused
    /// (`EngineError::Damaged`) before anything is written.
    pub fn open(cache: Arc<dyn BlockDevice>, capacity: Arc<dyn BlockDevice>) -> Result<Arc<Engine>, EngineError> {
        Engine::open_with(cache, capacity, OpenOptions::default())
    }

    /// `open`, with options: `salvage` accepts damage (see `OpenOptions`).
    pub fn open_with(
        cache: Arc<dyn BlockDevice>,
        capacity: Arc<dyn BlockDevice>,
        opts: OpenOptions,
    ) -> Result<Arc<Engine>, EngineError> {
        // Step 1: the superblock (the valid copy with the higher
        // generation), the capacity device's label, both devices' sizes.
        // Nothing is written until all of them check.
        let sb = Engine::inspect(&*cache, &*capacity)?;
        let (cfg, geo) = on_media_config(&sb, &*capacity)?;
        // Step 2: after a crash, rebuild everything from the media; after a
        // clean shutdown, read the checkpoint, verified (a damaged one is
        // refused, or with `salvage` replaced by recovery from the media).
        let (mut relog, mut gaps, mut voided) = (Vec::new(), Vec::new(), Vec::new());
        let mut lasts = None;
        // Shared before recovery, whose workers read the cache at once.
        let (cache, capacity) = (SharedDevice::wrap(cache), SharedDevice::wrap(capacity));
        let checkpoint = if sb.clean {
            match read_checkpoint(&*capacity, &geo, &sb) {
                Ok(body) => Some(decode_checkpoint(&body, cfg.clone(), geo, sb.clone(), new_maps(&sb, &cache))),
                Err(e) => Some(Err(e)),
            }
        } else {
            None
        };
        let (mut inner, recovered_in, salvaged) = match checkpoint {
            Some(Ok(inner)) => (inner, None, Vec::new()),
            Some(Err(e)) if !opts.salvage => return Err(e),
            _ => {
                let t = std::time::Instant::now();
                let mut r = recovery::scan(&*cache, &*capacity, &cache, cfg, geo, sb)?;
                if !r.damage.is_empty() && !opts.salvage {
                    return Err(EngineError::Damaged(r.damage));
                }
                (relog, gaps) = (std::mem::take(&mut r.superseded), std::mem::take(&mut r.gaps));
                // (Voided bands nothing won in are free already, and discarded
                // as stale ones.)
                voided = r.voided.iter().map(|&b| BandId(b)).collect();
                voided.retain(|&b| r.inner.bands[b].state != BandState::Free);
                lasts = Some(r.last_bands);
                // Damaged bands out of reach before anything is written.
                let inner = &mut r.inner;
                inner.bands.quarantine = Damage::bands(&r.damage).into_iter().map(BandId).collect();
                inner.bands.quarantine.extend(&voided);
                inner.bands.free.retain(|b| !inner.bands.quarantine.contains(b));
                // Before changing any band: a fresh mark (no band is open
                // now), durable, so that a crash in what follows never
                // leaves the last mark expecting segments of a band reset,
                // discarded or zeroed below.
                marks::write_mark_now(&*cache, inner, r.mark.as_ref())?;
                // On a zoned device: reset zones now free, finish zones now full.
                zoned::reconcile(&*capacity, &r.inner)?;
                for &b in &r.torn_headers {
                    write_at(&*capacity, b * BS, &[0u8; BLOCK_BYTES])?;
                }
                for &b in &r.stale_bands {
                    let start = b as u64 * r.inner.cfg.band_bytes;
                    zoned::reclaim_band(&*capacity, geo.zoned, start, r.inner.cfg.band_bytes)?;
                }
                if !r.torn_headers.is_empty() || !r.stale_bands.is_empty() {
                    flush(&*capacity)?;
                }
                (r.inner, Some(t.elapsed()), r.damage)
            }
        };
        // Step 3: dirty before the first change.
        inner.sb.clean = false;
        inner.sb.generation += 1;
        inner.sb.write_to(&*cache)?;
        let mut engine = Engine::assemble(cache, capacity, inner, recovered_in);
        Arc::get_mut(&mut engine).expect("not shared yet").salvaged = salvaged;
        if !gaps.is_empty() {
            engine.log_gaps(&gaps).map_err(EngineError::Recovery)?;
        }
        if !engine.salvaged.is_empty() {
            engine.salvage_repair(&engine.salvaged).map_err(EngineError::Recovery)?;
        }
        if !voided.is_empty() {
            let mut inner = engine.lock();
            engine.empty_bands(&mut inner, &voided).map_err(EngineError::Recovery)?;
            engine.flush_cache(&mut inner).map_err(EngineError::Recovery)?;
        }
        if !relog.is_empty() {
            engine.relog(&relog).map_err(EngineError::Recovery)?;
        }
        // Every torn copy now loses to a newer one, and no voided band is
        // left: watermarks may pass them, and claims name them.
        let mut inner = engine.lock();
        inner.cap.flushed_ceiling = None;
        if let Some(l) = lasts {
            l.apply(&mut inner);
        }
        drop(inner);
        Ok(engine)
    }

    /// Damage a `salvage` open accepted (empty otherwise).
    pub fn salvaged(&self) -> &[Damage] {
        &self.salvaged
    }

    /// Clean shutdown: flush, write the checkpoint, mark the superblock
    /// clean. Later requests fail with `VolumeError::ReadOnly`.
    pub fn shutdown(&self) -> Result<(), EngineError> {
        let mut inner = self.lock();
        if inner.closed {
            return Ok(());
        }
        if inner.failed {
            // The map may not match the media: leave the superblock dirty so
            // the next open recovers from the media instead.
            inner.closed = true;
            return Err(EngineError::Failed);
        }
        if self.settle(&mut inner).is_err() {
            inner.failed = true;
            inner.closed = true;
            return Err(EngineError::Failed);
        }
        // Flush, then record that flush in one more (empty) record, flushed
        // too: the watermark otherwise travels only in later records, and a
        // shutdown cut short here would leave the newest records' damage
        // indistinguishable from a torn tail (docs/format.md).
        let watermark = self.flush_cache(&mut inner).and_then(|()| {
            self.log_record(&mut inner, 0, crate::layout::RecordKind::Gap, Vec::new(), &[])?;
            self.flush_cache(&mut inner)
        });
        if watermark.is_err() {
            inner.failed = true;
            inner.closed = true;
            return Err(EngineError::Failed);
        }
        // Paged maps: every dirty page into the cache device's map region,
        // durable before the checkpoint that describes them.
        let pages = (inner.vols.iter_mut().try_for_each(|v| v.l2p.write_pages()))
            .and_then(|()| flush(&*self.cache).map_err(VolumeError::from));
        if pages.is_err() {
            inner.failed = true;
            inner.closed = true;
            return Err(EngineError::Failed);
        }
        let mut body = encode_checkpoint(&inner);
        let (body_bytes, body_crc) = (body.len(), crc32c(&body));
        body.resize(body_bytes.div_ceil(BLOCK_BYTES) * BLOCK_BYTES, 0);
        let at = inner.sb.checkpoint_offset;
        zoned::write_region(&*self.capacity, &inner.geo, at, &body)?;
        flush(&*self.capacity)?;
        inner.sb.checkpoint_bytes = body_bytes as u64;
        inner.sb.checkpoint_crc = body_crc;
        inner.sb.clean = true;
        inner.sb.generation += 1;
        inner.sb.write_to(&*self.cache)?;
        inner.closed = true;
        Ok(())
    }

    /// If this engine was opened after an unclean stop: how long the
    /// recovery from the media took.
    pub fn recovered_in(&self) -> Option<std::time::Duration> {
        self.recovered_in
    }

    pub fn stats(&self) -> EngineStats {
        self.lock().stats
    }

    /// The engine's identity (its superblock's and label's UUID).
    pub fn uuid(&self) -> [u8; 16] {
        self.lock().sb.uuid
    }

    /// The cache and capacity devices, as the engine uses them (shared:
    /// `Engine::open` on them again keeps the one wrapper).
    pub fn devices(&self) -> (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) {
        (self.cache.clone(), self.capacity.clone())
    }

    /// DRAM the maps take per 4 KiB block of volume capacity: the L2P, the
    /// chunk P2L of the cache tier and per-chunk and per-band state, over
    /// the volumes' blocks.
    pub fn dram_bytes_per_block(&self) -> f64 {
        let inner = self.lock();
        let blocks: usize = inner.vols.iter().map(|v| v.l2p.len()).sum();
        let l2p: usize = inner.vols.iter().map(|v| v.l2p.bytes()).sum();
        let chunks: usize = inner.log.chunks.iter().map(|c| std::mem::size_of::<Chunk>() + c.p2l.len() * 16).sum();
        let bands = inner.bands.len() * std::mem::size_of::<Band>();
        (l2p + chunks + bands) as f64 / blocks.max(1) as f64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("engine lock poisoned")
    }

    /// The L2P's paging: whether the maps are paged, the DRAM they take, and
    /// pages faulted in and written back since the engine opened.
    pub fn l2p_stats(&self) -> L2pStats {
        let inner = self.lock();
        let mut s = L2pStats::default();
        for v in &inner.vols {
            let (faults, writebacks) = v.l2p.page_traffic();
            s.paged |= v.l2p.is_paged();
            s.dram_bytes += v.l2p.bytes() as u64;
            s.page_faults += faults;
            s.page_writebacks += writebacks;
        }
        s
    }

    /// Assert the map's invariants (O(blocks); for simulation and tests).
    pub fn check_invariants(&self) {
        self.lock().check_invariants();
    }
}

/// The L2P entry width for the devices a superblock records.
fn l2p_width(sb: &Superblock) -> Width {
    Width::for_devices(sb.cache_bytes / BS, sb.capacity_bytes / BS)
}

/// Where the paged maps live: the map region's first byte on the cache
/// device (its end, if no map is paged) and each volume's pages' offset in
/// it. The region is whole chunks at the end of the cache device.
fn map_region(sb: &Superblock) -> (u64, Vec<u64>) {
    if sb.l2p_dram_bytes == 0 {
        return (sb.cache_bytes, Vec::new());
    }
    let width = l2p_width(sb);
    let mut offsets = Vec::with_capacity(sb.volumes.len());
    let mut at = 0;
    for (_, size) in &sb.volumes {
        offsets.push(at);
        at += L2p::region_bytes(size / BS, width);
    }
    (sb.cache_bytes.saturating_sub(at.div_ceil(sb.chunk_bytes) * sb.chunk_bytes), offsets)
}

/// Log chunks on the cache device: what the map region leaves.
fn chunk_count(sb: &Superblock) -> u64 {
    map_region(sb).0 / sb.chunk_bytes
}

/// Every volume's map, empty: in DRAM, or paged through `dev` (the cache
/// device, or a scratch device for a read-only scan) with the superblock's
/// budget shared in proportion to the volumes' sizes.
fn new_maps(sb: &Superblock, dev: &Arc<dyn BlockDevice>) -> Vec<L2p> {
    let width = l2p_width(sb);
    let (base, offsets) = map_region(sb);
    let total: u64 = sb.volumes.iter().map(|(_, s)| s / BS).sum::<u64>().max(1);
    let page = L2p::page_bytes(width) as u64;
    sb.volumes
        .iter()
        .enumerate()
        .map(|(i, (_, size))| {
            let blocks = size / BS;
            if sb.l2p_dram_bytes == 0 {
                return L2p::new(blocks as usize, width);
            }
            let share = (sb.l2p_dram_bytes as u128 * blocks as u128 / total as u128) as u64;
            let store = PageStore { dev: dev.clone(), base: base + offsets[i], frames: (share / page) as usize };
            L2p::paged(blocks as usize, width, store)
        })
        .collect()
}

/// How `Engine::open_with` opens.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOptions {
    /// Open even though recovery found damage, or the checkpoint is
    /// damaged (recovering from the media instead): blocks whose newest copy
    /// is damaged are trimmed (they read as zeros), damaged bands are
    /// emptied and discarded (`Engine::salvage_repair`), and what damaged
    /// log records held (their LBAs are unknown) reverts to older copies.
    /// `Engine::salvaged` lists what was accepted.
    pub salvage: bool,
}

/// The engine geometry the superblock records, and the capacity device's.
fn on_media_config(sb: &Superblock, capacity: &dyn BlockDevice) -> Result<(EngineConfig, CapGeometry), EngineError> {
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
    };
    Ok((cfg, geo))
}

/// The clean-shutdown checkpoint's body, checked against its CRC.
fn read_checkpoint(capacity: &dyn BlockDevice, geo: &CapGeometry, sb: &Superblock) -> Result<Vec<u8>, EngineError> {
    let len = sb.checkpoint_bytes.div_ceil(BS) as usize * BLOCK_BYTES;
    let mut raw = zoned::read_region(capacity, geo, sb.checkpoint_offset, len)?;
    raw.truncate(sb.checkpoint_bytes as usize);
    if crc32c(&raw) != sb.checkpoint_crc {
        return Err(EngineError::CheckpointChecksum);
    }
    Ok(raw)
}

impl Inner {
    /// Simulation: wait until chunk `c` (or band `b`) was freed.
    fn sim_wait(&self, chunk: Option<ChunkId>, band: Option<BandId>) {
        if let Some(g) = &self.sim {
            let t = chunk.map_or(0, |c| g.chunk_free_at_ns[c.index()]);
            g.clock.wait_until(t.max(band.map_or(0, |b| g.band_free_at_ns[b.index()])));
        }
    }

    /// Simulation: chunk `c` (or band `b`) is free as of now.
    fn sim_freed(&mut self, chunk: Option<ChunkId>, band: Option<BandId>) {
        if let Some(g) = &mut self.sim {
            let now = g.clock.now_ns();
            if let Some(c) = chunk {
                g.chunk_free_at_ns[c.index()] = now;
            }
            if let Some(b) = band {
                g.band_free_at_ns[b.index()] = now;
            }
        }
    }

    /// A state with every volume unmapped and every chunk and band free.
    /// (`sb` names the devices' sizes, which fix the L2P's width.)
    /// (`maps`: every volume's, empty, from `new_maps`.)
    fn empty(
        cfg: EngineConfig,
        geo: CapGeometry,
        sb: Superblock,
        chunk_count: u64,
        band_count: u64,
        maps: Vec<L2p>,
    ) -> Inner {
        let blocks_per_chunk = (cfg.chunk_bytes / BS) as usize;
        Inner {
            vols: (sb.volumes.iter().zip(maps))
                .map(|((name, _), l2p)| Vol {
                    name: name.clone(),
                    l2p,
                    open_band: None,
                    last_band: None,
                    moved: Moves::default(),
                })
                .collect(),
            log: Log::empty(chunk_count, blocks_per_chunk),
            bands: Bands::empty(band_count),
            cap: CapWrites::default(),
            gc_cursor: None,
            pending: None,
            compact_cursor: None,
            placement: BandPlacement::PerVolume,
            seq: 0,
            stats: EngineStats::default(),
            pool: BufPool::default(),
            tag: sb.engine_tag(),
            sb,
            closed: false,
            failed: false,
            cache_flushed_seq: 0,
            mark_gen: 0,
            cfg,
            geo,
            sim: None,
        }
    }

    /// Pass `r` on; if it is a device error (or corrupt data), stop all
    /// further changes until the engine is reopened (`failed`): the
    /// in-memory state may be ahead of or behind the media.
    fn stop_on_device_error<T>(&mut self, r: Result<T, VolumeError>) -> Result<T, VolumeError> {
        if let Err(e @ (VolumeError::Io(_) | VolumeError::Corrupt { .. } | VolumeError::Damaged { .. })) = &r {
            if !self.failed {
                // Said the moment it happens, with the cause: every later
                // change fails until a restart recovers from the devices.
                crate::report::say(format_args!(
                    "sluice: engine stopped taking changes: {e}; reads go on, restart to recover"
                ));
            }
            self.failed = true;
        }
        r
    }

    /// Forget where a block was (it was overwritten, trimmed or moved).
    fn invalidate(&mut self, loc: Loc) {
        if let Some(cb) = loc.cache_block() {
            let (c, i) = ((cb / self.blocks_per_chunk()) as usize, (cb % self.blocks_per_chunk()) as usize);
            debug_assert_ne!(self.log.chunks[c].p2l[i].0, u32::MAX);
            self.log.chunks[c].p2l[i].0 = u32::MAX;
            self.log.chunks[c].valid -= 1;
        } else if let Some(pb) = loc.capacity_block() {
            let b = (pb / self.blocks_per_band()) as usize;
            self.bands[b].valid -= 1;
        }
    }

    /// `check_invariants` when every map is in DRAM, where it costs a pass
    /// over memory; a paged map would fault in every page ever written
    /// (what opening a paged engine must not do). Simulations and tests
    /// check paged maps by calling `Engine::check_invariants`.
    fn check_invariants_unless_paged(&self) {
        if !self.vols.iter().any(|v| v.l2p.is_paged()) {
            self.check_invariants();
        }
    }

    fn check_invariants(&self) {
        let mut chunk_valid = vec![0u32; self.log.chunks.len()];
        let mut band_valid = vec![0u32; self.bands.len()];
        let (bpc, bpb) = (self.blocks_per_chunk(), self.blocks_per_band());
        for (vi, v) in self.vols.iter().enumerate() {
            // A paged map reads its pages from the cache device, where a
            // simulation may have armed a fault: then nothing is checked
            // this time.
            let walked = v.l2p.for_each(|lba, loc, _| {
                if let Some(cb) = loc.cache_block() {
                    let (c, i) = ((cb / bpc) as usize, (cb % bpc) as usize);
                    assert_eq!(self.log.chunks[c].p2l[i], (vi as u32, lba as u64), "chunk P2L names the block");
                    assert_ne!(self.log.chunks[c].state, ChunkState::Free);
                    chunk_valid[c] += 1;
                } else if let Some(pb) = loc.capacity_block() {
                    let (b, i) = ((pb / bpb) as usize, pb % bpb);
                    assert!(
                        i < self.bands[b].written,
                        "capacity block {pb} of volume {vi} LBA {lba} past its band's pointer"
                    );
                    assert_ne!(self.bands[b].state, BandState::Free);
                    band_valid[b] += 1;
                }
            });
            if walked.is_err() {
                return;
            }
        }
        for (c, ch) in self.log.chunks.iter().enumerate() {
            assert_eq!(ch.valid, chunk_valid[c], "chunk {c} valid count");
        }
        for (b, band) in self.bands.iter().enumerate() {
            assert_eq!(band.valid, band_valid[b], "band {b} valid count");
        }
        // Every open band is exactly one stream's: none is stranded.
        let mut owned: Vec<BandId> =
            self.vols.iter().map(|v| v.open_band).chain([self.bands.gc_open]).flatten().collect();
        owned.sort_unstable();
        let open: Vec<BandId> =
            (0..self.bands.len() as u32).map(BandId).filter(|&b| self.bands[b].state == BandState::Open).collect();
        assert_eq!(owned, open, "open bands are the streams' bands");
    }
}
