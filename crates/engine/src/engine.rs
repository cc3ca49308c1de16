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
//! This file is the façade: `Engine` and the state it composes, behind one
//! lock (`Inner`). Its life on the devices (create, open, shutdown) is
//! `lifecycle`, its configuration and errors `config`, its counters
//! `stats`, its invariants `invariants`, its clock and schedule
//! `runtime`. Each part of the engine is a module of its own, with its
//! state and invariants:
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
//! one stream's. State changes under the one lock (`Inner`). Reads take no
//! lock on resident maps (read.rs). User writes hold the lock only to
//! reserve room and to publish; the log write runs outside it (writers.rs).
//! Every other path takes the lock drained of records in flight
//! (`Engine::lock`). A background step's device I/O runs outside the lock
//! (step_io.rs). On a simulated clock, writes run under the lock, which keeps
//! the engine deterministic on emulated devices.

use crate::layout::{crc32c, encode_header, BLOCK_BYTES, RECORD_BLOCKS_MAX};
use crate::metrics::{Op, OpSnapshot, VolumeMetrics};
use crate::persist::{uuid_text, CapacityLabel, CheckpointError, Superblock, SuperblockError, Writer};
use crate::volume::{check, Extent, Volume, VolumeError, WriteBuf};
use serde::Serialize;
use sluice_media::device::{flush, read_at, sync_io, write_at};
use sluice_media::{BlockDevice, DeviceError, DeviceStats, IoBuf, IoOp, IoRequest, SharedDevice};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

mod assist;
mod bands;
mod caching;
mod check;
mod checkpoint;
mod classes;
mod cleaning;
mod compaction;
mod config;
mod direct;
mod disk_identity;
mod flushes;
mod gc;
mod handle;
mod health;
mod home_flight;
mod home_sums;
#[cfg(test)]
mod home_sums_tests;
mod identity;
#[cfg(test)]
mod in_place_tests;
mod invariants;
mod l2p;
mod lifecycle;
mod log;
mod marks;
mod pending;
mod placement;
mod pool;
mod predict;
mod read;
mod reclaim;
mod recovery;
mod relocation_gate;
mod residency;
mod runtime;
mod salvage;
mod segments;
mod sequence;
mod staged;
mod stats;
mod step_io;
mod streams;
#[cfg(test)]
mod tests;
mod throttle;
mod trims;
mod watermark;
mod worker;
mod writers;
mod zoned;

use bands::{Band, BandId, BandState, Bands, Stream};
pub use caching::{CacheMode, CachePolicy, CacheReport, CacheStats, CleanStep, SeqCutoff};
pub use check::CheckReport;
pub use classes::{check_io_classes, ClassDirection, ClassStats, IoClass, CLASSES_MAX};
pub use cleaning::{Cleaning, CleaningMode};
use compaction::CompactCursor;
pub use direct::DIRECT_WRITE_BYTES_DEFAULT;
pub use disk_identity::ChangedBlock;
use gc::GcCursor;
pub use handle::{EngineSnapshot, EngineVolume, VolumeSnapshot};
use identity::write_label;
pub use identity::{label_offset, label_present, superblock_present, wipe_labels, wipe_superblock};
pub use l2p::CAPACITY_BYTES_MAX;
use l2p::{L2p, Loc, Width};
use log::{Chunk, ChunkId, ChunkState, Log};
pub use placement::BandPlacement;
use pool::BufPool;
pub use predict::{Allocation, Outcome};
pub use recovery::Damage;
use segments::{CapWrites, CAP_QUEUE_DEPTH};
pub use staged::{StagedWrite, Stepped, WriteStep};
pub use throttle::Throttle;
pub use worker::{Compactor, CompactorConfig, CompactorSnapshot};

use checkpoint::{
    checkpoint_bytes_max, checkpoint_page_bytes, checkpoint_room, decode_checkpoint, encode_checkpoint, RegionReader,
};
use config::{band_count, on_media_config};
pub use config::{EngineConfig, EngineError, Layout, OpenOptions, VolumeSpec};
pub use home_sums::HomeSumCounts;
use l2p::region::{chunk_count, home_sums_of, l2p_width, new_maps};
use lifecycle::read_checkpoint;
use runtime::ReuseGate;
pub use runtime::{Runtime, Schedule};
use stats::Moves;
pub use stats::{EngineStats, L2pStats};
use zoned::CapGeometry;

const BS: u64 = BLOCK_BYTES as u64;

struct Vol {
    name: String,
    /// Each block's place and the CRC32C of its data as logged (the value
    /// in its record's header entry): every read is checked against it.
    /// Kept in DRAM beside the place (4 B per block) so that a read costs
    /// one device I/O, not a second one for the header.
    l2p: L2p,
    /// Data bytes of this volume compaction and GC wrote to the capacity
    /// device since the engine was opened (not persisted): per-tenant
    /// capacity write amplification.
    moved: Moves,
    /// In place: the volume's cache policy, home and counters (caching.rs).
    cache: caching::VolCache,
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
    /// In place: what the cache adds to each logged block — clean, class,
    /// hot — and each chunk's dirty count (residency.rs).
    residency: residency::Residency,
    /// Attached to a disk with its data: the disk's identity, kept true as
    /// the engine writes it (disk_identity.rs). None otherwise.
    disk_id: Option<disk_identity::DiskIdentity>,
    /// The capacity device's bands (bands.rs).
    bands: Bands,
    /// Segment writes to the capacity device and its flush state (segments.rs).
    cap: CapWrites,
    /// The GC victim a bounded step left half done (`Engine::gc_step`);
    /// not persisted: after a reopen GC simply chooses again.
    gc_cursor: Option<GcCursor>,
    /// Steps whose segment writes are in flight without the lock, oldest
    /// first, and the remaps that wait for them (`Engine::settle`): the
    /// background compactor's last step, or writers' compaction steps
    /// (assist.rs). Not persisted.
    pending: Vec<pending::Pending>,
    /// Steps left pending so far (`Inner::pending_since`).
    pendings_made: u64,
    /// Where a bounded compaction step stopped in the oldest full chunk
    /// (`Engine::compact_step`); not persisted, like `gc_cursor`.
    compact_cursor: Option<CompactCursor>,
    /// While a writer waits in `log_space` for room (a reclaim it started):
    /// the blocks of its record, which what the reclaim keeps in the log
    /// must leave room for (cleaning.rs: `log_has_room_to_keep`); else 0.
    writer_waits: u64,
    /// The homes a cleaning step is writing without the lock (home_flight.rs).
    home_flight: home_flight::HomeFlight,
    /// In place: the CRC of every home the engine wrote, and the home
    /// writes under way (home_sums.rs). Empty without a table.
    home_sums: home_sums::HomeSums,
    /// The engine's write sequence: every record and segment takes the next.
    seq: sequence::Sequence,
    stats: stats::Counters,
    /// Reusable I/O buffers (pool.rs).
    pool: BufPool,
    /// The superblock as last written.
    sb: Superblock,
    /// `sb.engine_tag()`: what every record header this engine writes
    /// carries, and every one it reads must.
    tag: u32,
    /// Whether the engine takes changes, and if not why (health.rs).
    health: health::Health,
    /// Generation of the last capacity mark written (`marks.rs`).
    mark_gen: u64,
    /// The clock and schedule the engine runs on (runtime.rs).
    runtime: Runtime,
    /// When each chunk and band was freed, on that clock (runtime.rs).
    gate: ReuseGate,
    /// Places reused so far: bumped (under the lock) whenever a chunk is
    /// reopened or a band discarded, before anything new is written there.
    /// Shared with lock-free reads (`Engine::reuses`, read.rs), which are
    /// good only if it did not move while they read.
    reuses: Arc<std::sync::atomic::AtomicU64>,
    /// Threads waiting for the log's in-flight records to finish, so that
    /// the lock is theirs with none in flight (`Engine::lock`): new
    /// reservations wait while any does (writers.rs).
    draining: u32,
    /// Threads waiting on `Engine::published`: whether a publish must
    /// wake anybody.
    waiting: u32,
    /// A writer is taking a compaction or GC step in phases (assist.rs).
    assisting: bool,
    /// The last writer's step was GC (assist.rs alternates when both are due).
    assist_last_gc: bool,
    /// Writers take compaction and GC steps (`Engine::set_writer_steps`).
    writer_steps: bool,
    /// Where compaction puts each volume's blocks (`Engine::set_band_placement`).
    placement: BandPlacement,
    /// What lifetime placement learned from GC (placement.rs; not persisted).
    lifespans: placement::Lifespans,
    /// In place: writes spilled while the log's oldest chunk stayed (caching.rs).
    spill: caching::SpillDebt,
    /// In place: how the background compactor cleans ahead (cleaning.rs).
    cleaning: cleaning::Cleaning,
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
    /// Attached: the sampled blocks of the disk found changed on opening,
    /// and the cached copies (all clean) dropped for it.
    disk_changed: Option<(Vec<disk_identity::ChangedBlock>, u64)>,
    /// Request metrics, one per volume (shared by every handle to it).
    metrics: Vec<Arc<VolumeMetrics>>,
    /// Background compaction and the write throttle (`start_compactor`).
    bg: worker::Background,
    /// The engine's clock (runtime.rs): `Inner::runtime`'s, shared with
    /// paths that run without the lock (request latency, the throttle).
    clock: sluice_media::ClockRef,
    /// FLUSH requests grouped into rounds (`flushes.rs`).
    flushes: flushes::FlushGroup,
    /// From what size writes go to the capacity device directly (direct.rs).
    direct_min: direct::DirectMin,
    /// The flushed watermark's claims on the cache device (watermark.rs).
    claims: watermark::Claims,
    /// Each volume's map when reads may use it without the lock (held
    /// whole in DRAM, volume not in place): read.rs. The maps are never
    /// replaced once the engine is assembled.
    lockless_maps: Vec<Option<Arc<l2p::Resident>>>,
    /// `Inner::reuses`, shared.
    reuses: Arc<std::sync::atomic::AtomicU64>,
    /// Both devices complete requests inline (`BlockDevice::runs_inline`):
    /// lock-free reads then need no permit, since they never occupy a
    /// device queue (and share no counter).
    reads_inline: bool,
    /// Signalled when records in flight were published or a drain ended
    /// (writers.rs); waited on with the engine lock.
    published: std::sync::Condvar,
    /// Set (under the lock) by `shutdown`: lock-free reads fail as locked
    /// ones do after it.
    closed: std::sync::atomic::AtomicBool,
    /// User bytes read without the lock, not yet added to `Inner::stats`
    /// (`Engine::fold_read_bytes`).
    read_bytes: stats::ShardedCounter,
    /// Opened read-only (`OpenOptions::read_only`; also in `Inner::health`):
    /// asked without the lock by FLUSH, which then has nothing to do.
    read_only: bool,
    /// When the home writes of a step in `Inner::home_flight` completed
    /// (home_flight.rs): waited on with the engine lock held.
    homes_done: home_flight::HomesDone,
}

impl Engine {
    fn assemble(
        cache: Arc<dyn BlockDevice>,
        capacity: Arc<dyn BlockDevice>,
        mut inner: Inner,
        recovered_in: Option<std::time::Duration>,
    ) -> Arc<Engine> {
        inner.recount_classes();
        let clock = inner.runtime.clock.clone();
        let metrics = inner.vols.iter().map(|_| Arc::new(VolumeMetrics::default())).collect();
        let in_place = inner.in_place();
        let lockless_maps = inner.vols.iter().map(|v| v.l2p.resident().filter(|_| !in_place)).collect();
        let reuses = inner.reuses.clone();
        let reads_inline = cache.runs_inline() && capacity.runs_inline();
        let depth = cache.info().queue_depth_max.min(capacity.info().queue_depth_max);
        let claimed_from = inner.log.lsn();
        Arc::new(Engine {
            cache: SharedDevice::wrap(cache),
            capacity: SharedDevice::wrap(capacity),
            unlocked_reads: std::sync::atomic::AtomicUsize::new(0),
            // + 3: the lock holder's log write and flush, and a grouped
            // FLUSH round's cache flush outside the lock (`flushes.rs`).
            unlocked_reads_max: depth.saturating_sub(CAP_QUEUE_DEPTH + 3),
            inner: Mutex::new(inner),
            write_bufs: Mutex::new(BufPool::default()),
            recovered_in,
            salvaged: Vec::new(),
            disk_changed: None,
            metrics,
            bg: worker::Background::new(),
            clock,
            flushes: Default::default(),
            direct_min: Default::default(),
            claims: watermark::Claims::after(claimed_from),
            lockless_maps,
            reuses,
            reads_inline,
            published: Default::default(),
            closed: Default::default(),
            read_bytes: Default::default(),
            read_only: false,
            homes_done: Default::default(),
        })
    }

    /// Damage a `salvage` open accepted (empty otherwise).
    pub fn salvaged(&self) -> &[Damage] {
        &self.salvaged
    }

    /// If this engine was opened after an unclean stop: how long the
    /// recovery from the media took.
    /// Attached to a disk found changed on opening (the cache held nothing
    /// dirty, so it stayed attached): the sampled blocks that changed, and
    /// the cached copies dropped for it (every read goes to the disk).
    pub fn disk_changed(&self) -> Option<&(Vec<disk_identity::ChangedBlock>, u64)> {
        self.disk_changed.as_ref()
    }

    /// Whether the engine was opened read-only (`OpenOptions::read_only`).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    pub fn recovered_in(&self) -> Option<std::time::Duration> {
        self.recovered_in
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

    /// The engine lock with no record in flight: every path but the
    /// concurrent write path's own steps sees the log as if writes ran
    /// under the lock, one at a time (writers.rs).
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.drained(self.lock_raw())
    }

    /// The engine lock as it is, records in flight or not.
    ///
    /// Tried for a while before it blocks: writers hold it for short
    /// sections (reserve, publish), and a writer that sleeps on it costs a
    /// futex wait, a wake-up syscall by the holder and a context switch,
    /// which took 7 % of the CPU of two writers on two cores (`sluice bench
    /// engine --threads 2`, docs/results/2026-11-27-engine-threads.md).
    fn lock_raw(&self) -> std::sync::MutexGuard<'_, Inner> {
        for _ in 0..LOCK_SPINS {
            match self.inner.try_lock() {
                Ok(g) => return g,
                Err(std::sync::TryLockError::WouldBlock) => std::hint::spin_loop(),
                Err(std::sync::TryLockError::Poisoned(_)) => break,
            }
        }
        self.inner.lock().expect("engine lock poisoned")
    }
}

/// Tries of the engine lock before a thread blocks on it (`lock_raw`):
/// about 10 µs, a few of the writers' sections under it.
const LOCK_SPINS: usize = 200;

impl Inner {
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
        let mut inner = Inner {
            vols: (sb.volumes.iter().zip(maps))
                .map(|((name, _), l2p)| Vol {
                    name: name.clone(),
                    l2p,
                    moved: Moves::default(),
                    cache: Default::default(),
                })
                .collect(),
            log: Log::empty(chunk_count, blocks_per_chunk),
            residency: residency::Residency::empty(chunk_count as usize, blocks_per_chunk),
            disk_id: None,
            bands: Bands::empty(band_count, sb.volumes.len()),
            cap: CapWrites::default(),
            gc_cursor: None,
            pending: Vec::new(),
            pendings_made: 0,
            compact_cursor: None,
            writer_waits: 0,
            home_flight: Default::default(),
            home_sums: Default::default(),
            placement: BandPlacement::PerVolume,
            lifespans: Default::default(),
            seq: sequence::Sequence::at(0),
            stats: Default::default(),
            pool: BufPool::default(),
            tag: sb.engine_tag(),
            sb,
            health: Default::default(),
            mark_gen: 0,
            cfg,
            geo,
            runtime: Runtime::default(),
            gate: ReuseGate::new(chunk_count as usize, band_count as usize),
            reuses: Default::default(),
            draining: 0,
            waiting: 0,
            assisting: false,
            assist_last_gc: false,
            writer_steps: true,
            spill: Default::default(),
            cleaning: Default::default(),
        };
        inner.place_homes();
        inner
    }

    /// Whether the engine takes changes: not once shut down (`ReadOnly`),
    /// nor after a stop (`Stopped`).
    fn taking_changes(&self) -> Result<(), VolumeError> {
        self.health.taking_changes()
    }

    /// Pass `r` on; if it is a device error (or corrupt data, or damage),
    /// stop all further changes until the engine is reopened: the
    /// in-memory state may be ahead of or behind the media (health.rs).
    fn stop_on_device_error<T>(&mut self, r: Result<T, VolumeError>) -> Result<T, VolumeError> {
        if let Err(e @ (VolumeError::Io(_) | VolumeError::Corrupt { .. } | VolumeError::Damaged { .. })) = &r {
            self.health.stop(e);
        }
        r
    }

    /// Forget where a block was (it was overwritten, trimmed or moved):
    /// its old place's owner drops it — the log (and in place, the
    /// volume's cache counters), or its band.
    fn invalidate(&mut self, loc: Loc) {
        if let Some(cb) = loc.cache_block() {
            let dropped = self.log.drop_block(cb);
            if self.cfg.layout == Layout::InPlace {
                let (class, dirty) = self.residency.dropped(cb);
                self.vols[dropped.vol as usize].cache.dropped(class, dirty);
            }
        } else if let Some(b) = self.band_of(loc) {
            self.bands.drop_valid(b);
        }
    }
}
