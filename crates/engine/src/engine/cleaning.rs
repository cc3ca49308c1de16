//! Cleaning: writing dirty cached blocks to their homes on a plain backing
//! disk (the in-place layout, `Layout::InPlace`), and freeing log chunks
//! whose blocks all have a current home.
//!
//! In place, every volume block has a home at its own LBA on the capacity
//! device (volume after volume from byte 0), so the disk alone is a plain,
//! readable copy of each volume once nothing is dirty. An L2P entry that
//! points nowhere means "at home"; one that points into the log is the
//! current copy, *dirty* (its home is older) or *clean* (its home holds the
//! same bytes: cleaned, written through, or promoted by a read). The log
//! stays a FIFO: compaction's place is taken by a reclaim (reclaim.rs) that
//! cleans the oldest chunk's dirty blocks — sorted by home and merged into
//! runs, so an HDD writes them with few seeks, and written with up to
//! `CAP_QUEUE_DEPTH` in flight (`write_queued`), so its NCQ orders them by
//! rotational position — then drops the chunk's
//! copies and frees it. Blocks trimmed or overwritten before their chunk reaches the
//! head are never written home.
//!
//! Invariants:
//! - A chunk is freed only after the homes of its dirty blocks are durable
//!   (capacity flush), and the capacity mark that moves the log's head past
//!   it is durable (cache flush): recovery never replays a freed chunk, so
//!   a stale cached copy can never be cleaned over a newer home.
//! - A direct home write (write-around, pass-through, spill, cutoff,
//!   write-zeroes) goes to the disk and, if the log holds copies of its
//!   blocks, is made durable (capacity flush); only then are the copies
//!   dropped from the maps (a failed home write leaves reads on them) and
//!   their tombstones logged (logging may reclaim the oldest chunk, and the
//!   copies are out of the maps by then, so no old copy is cleaned over the
//!   new home). A crash loses at most the unflushed home write, and never
//!   keeps a tombstone whose home write it lost.
//! - A write-through logs the new copy (dirty) before it writes home, then
//!   marks it clean: logging may clean the oldest chunk, and an older copy
//!   of the block must be out of the maps by then.
//! - Every home write bumps the volume's `home_gen`; a read's promotion
//!   into the log is dropped if the generation moved under it.
//!
//! Cleaning runs under the engine lock (like every change here): a bounded
//! step writes at most `blocks_max` blocks. Clean bits are kept by the
//! checkpoint, so a clean restart keeps the cache clean; across a crash,
//! Clean records in the log keep the blocks whose homes a disk flush made
//! durable (`log_claims`, `unclaim`: residency.rs), and the rest count as
//! dirty and are cleaned again (the same bytes).

use super::caching::CacheCount;
use super::{
    crc32c, read_at, write_at, BlockDevice, ChunkId, DeviceError, Engine, EngineError, Inner, IoBuf, IoRequest, Layout,
    Loc, Serialize, VolumeError, BLOCK_BYTES, BS,
};

impl Inner {
    /// Whether the capacity device holds the volumes in place.
    pub(super) fn in_place(&self) -> bool {
        self.cfg.layout == Layout::InPlace
    }

    /// The capacity block that is the home of `lba` of `vol` (in place).
    pub(super) fn home(&self, vol: usize, lba: u64) -> u64 {
        self.vols[vol].cache.home() + lba
    }

    /// Every volume's first home block: volume after volume from block 0.
    pub(super) fn place_homes(&mut self) {
        let mut at = 0;
        for v in &mut self.vols {
            v.cache.place_home(at);
            at += v.l2p.len() as u64;
        }
    }

    /// Cache block `cb` (current) was found by a read (`Engine::to_retain`).
    pub(super) fn mark_hot(&mut self, cb: u64) {
        debug_assert!(self.log.is_current(cb), "only a current block is hot");
        self.residency.mark_hot(cb);
    }

    /// Cache block `cb` (current) now has its bytes at home too.
    pub(super) fn mark_clean(&mut self, cb: u64) {
        let (v, lba) = self.log.owner_of(cb).expect("only a current block is cleaned");
        if self.residency.mark_clean(cb, v, lba) {
            self.vols[v as usize].cache.cleaned_one();
        }
    }

    /// The dirty blocks of chunk `c` a cleaning step of at most
    /// `blocks_max` takes (volume, LBA, cache block; by cache block).
    pub(super) fn dirty_of(&self, c: ChunkId, blocks_max: u64) -> Vec<(u32, u64, u64)> {
        let base = c.0 as u64 * self.blocks_per_chunk();
        (self.log.chunk(c).current())
            .map(|(i, v, lba)| (v, lba, base + i as u64))
            .filter(|&(_, _, cb)| !self.residency.is_clean(cb))
            .take(blocks_max.max(1) as usize)
            .collect()
    }

    /// Whether the next `blocks` logged would have to wait for cleaning
    /// worth avoiding: the open chunk has no room, free chunks are at the
    /// reserve, and at least half the oldest chunk is dirty (a few dirty
    /// blocks — the start of a long-lived file, say — are cheaper to clean
    /// than every later write is to spill).
    pub(super) fn log_needs_cleaning(&self, blocks: u64) -> bool {
        !self.log_has_room(blocks)
            && self.log.oldest_full().is_some_and(|c| 2 * self.residency.dirty(c) as u64 >= self.blocks_per_chunk())
    }

    /// Whether one record of `blocks` can be logged without reclaiming a
    /// chunk: the open chunk has room, or a free chunk is above the reserve.
    pub(super) fn log_has_room(&self, blocks: u64) -> bool {
        self.log.open().is_some_and(|(_, off)| off + 1 + blocks <= self.blocks_per_chunk())
            || self.log.free_len() > self.cfg.log_free_chunks_min
    }
}

/// How the background compactor cleans an in-place log ahead of need
/// (without it, dirty blocks are written home only when their chunk is
/// reclaimed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CleaningMode {
    /// Only when a chunk is reclaimed (or a spilled write pays for it).
    #[default]
    None,
    /// Like Open CAS's ALRU: chunks sealed longer than `age` ago, oldest
    /// first, once requests have paused for `idle` (data that lives that
    /// long is worth writing home while the disk is free); and, past the
    /// dirty set point, any chunk, at the rate `CleaningRate` sets.
    Alru,
    /// Like Open CAS's ACP: clean continuously, oldest chunk first, as fast
    /// as the disk takes it (yielding to requests between steps).
    Acp,
}

/// The engine's background cleaning (`Engine::set_cleaning`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Cleaning {
    pub mode: CleaningMode,
    /// Share of the log's blocks that may be dirty before ALRU cleans
    /// regardless of age, paced to bring it back (bcache's writeback target
    /// is 10 %).
    pub dirty_setpoint: f64,
    /// ALRU: how long a chunk stays sealed before it is cleaned when idle.
    pub age: std::time::Duration,
    /// ALRU: how long requests must have paused before aged chunks are
    /// cleaned (Open CAS's activity threshold).
    pub idle: std::time::Duration,
    /// ALRU past the set point: the controller's time constant — the
    /// proportional term cleans the excess over the set point at
    /// excess / `response` per second (bcache's `p_term_inverse`, 40 s).
    pub response: std::time::Duration,
}

impl Default for Cleaning {
    fn default() -> Cleaning {
        Cleaning {
            mode: CleaningMode::None,
            dirty_setpoint: 0.1,
            age: std::time::Duration::from_secs(10),
            idle: std::time::Duration::from_secs(1),
            response: std::time::Duration::from_secs(10),
        }
    }
}

/// The rate ALRU cleans at past the dirty set point: a proportional-integral
/// controller on the dirty bytes, shaped like bcache's writeback rate (and
/// like the write throttle, a pure function of what it is told: no clock,
/// no threads).
///
/// rate = max(`CLEANING_RATE_MIN`, excess / response + integral / (250 ·
/// response)), where excess is the dirty bytes over the set point and the
/// integral sums excess · dt. The integral grows only while the log is over
/// the set point and shrinks back to zero under it (no wind-up below
/// target); the proportional term alone cleans a step of excess in about
/// `response`, and the integral removes the offset a steady inflow would
/// leave (bcache's i_term_inverse is 250 × its p_term_inverse).
#[derive(Clone, Debug, Default)]
pub(super) struct CleaningRate {
    integral: f64,
    last_ns: Option<u64>,
}

/// The slowest ALRU cleans past its set point (bytes/s): a trickle, as in
/// bcache (whose minimum is 8 sectors/s), but a whole block per second.
pub(super) const CLEANING_RATE_MIN: f64 = BS as f64;

impl CleaningRate {
    /// The rate (bytes/s) to clean at, now `now_ns`, with `dirty` of `total`
    /// log bytes dirty.
    pub(super) fn rate(&mut self, now_ns: u64, dirty: u64, total: u64, c: &Cleaning) -> f64 {
        let excess = dirty as f64 - c.dirty_setpoint * total as f64;
        let dt = self.last_ns.map_or(0.0, |t| now_ns.saturating_sub(t) as f64 / 1e9).min(1.0);
        self.last_ns = Some(now_ns);
        if excess > 0.0 || self.integral > 0.0 {
            self.integral = (self.integral + excess * dt).max(0.0);
        }
        let r = c.response.as_secs_f64().max(1e-3);
        (excess / r + self.integral / (250.0 * r)).max(CLEANING_RATE_MIN)
    }
}

/// A chunk background cleaning may work on, and whether it is paced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct CleaningDue {
    pub(super) chunk: ChunkId,
    /// ALRU past its set point: cleaned at `CleaningRate`'s rate. Otherwise
    /// (ACP, or aged chunks while idle) as fast as the disk goes.
    pub(super) paced: bool,
}

impl Inner {
    /// Blocks of the log that are dirty (in place: the volumes' counts), and
    /// the log's blocks.
    pub(super) fn dirty_blocks(&self) -> (u64, u64) {
        let total = self.log.chunk_count() as u64 * self.blocks_per_chunk();
        (self.vols.iter().map(|v| v.cache.dirty_blocks()).sum(), total)
    }

    /// The full chunk background cleaning should work on now, if any;
    /// `idle`: how long since the last request.
    pub(super) fn cleaning_due(&self, idle: std::time::Duration) -> Option<CleaningDue> {
        let c = self.cleaning;
        if !self.in_place() || c.mode == CleaningMode::None {
            return None;
        }
        let (dirty, total) = self.dirty_blocks();
        let over = dirty as f64 > c.dirty_setpoint * total as f64;
        let aged_ok = idle >= c.idle;
        let now = self.now_ns();
        self.log.full().find_map(|id| {
            if self.residency.dirty(id) == 0 {
                return None;
            }
            let aged = self.residency.sealed_at(id).is_none_or(|t| now.saturating_sub(t) >= c.age.as_nanos() as u64);
            match c.mode {
                CleaningMode::Acp => Some(CleaningDue { chunk: id, paced: false }),
                _ if aged && aged_ok => Some(CleaningDue { chunk: id, paced: false }),
                _ if over => Some(CleaningDue { chunk: id, paced: true }),
                _ => None,
            }
        })
    }
}

impl Engine {
    /// The background cleaning policy, as set.
    pub fn cleaning(&self) -> Cleaning {
        self.lock().cleaning
    }

    /// Choose how the background compactor cleans this in-place engine's
    /// log ahead of need (takes effect with `start_compactor`).
    pub fn set_cleaning(&self, cleaning: Cleaning) -> Result<(), EngineError> {
        if !(0.0..=1.0).contains(&cleaning.dirty_setpoint) {
            return Err(EngineError::Config("cleaning: the dirty set point is a share of the log, in [0, 1]"));
        }
        if cleaning.response.is_zero() {
            return Err(EngineError::Config("cleaning: the response time is positive"));
        }
        let mut inner = self.lock();
        if !inner.in_place() {
            return Err(EngineError::Config("cleaning policies apply to an in-place engine (layout = in-place)"));
        }
        inner.cleaning = cleaning;
        Ok(())
    }

    /// Before the homes of `lbas` of `vol` are written: no claim on them
    /// (residency.rs) may be acted on by a later recovery. A claimed copy
    /// still current (clean: its home holds the same bytes) leaves the maps
    /// and is dropped by a tombstone; then a cache flush makes every record
    /// that supersedes a claimed copy durable.
    fn unclaim(&self, inner: &mut Inner, vol: u32, lbas: &[u64]) -> Result<(), VolumeError> {
        if lbas.is_empty() {
            return Ok(());
        }
        let mut dropped = Vec::new();
        for &lba in lbas {
            let loc = inner.vols[vol as usize].l2p.get(lba as usize)?;
            if let Some(cb) = loc.cache_block().filter(|&cb| inner.residency.is_clean(cb)) {
                inner.vols[vol as usize].l2p.set(lba as usize, Loc::NONE, 0)?;
                inner.invalidate(Loc::cache(cb));
                dropped.push(lba);
            }
        }
        if !dropped.is_empty() {
            self.log_tombstones(inner, vol, &dropped)?;
        }
        self.flush_cache(inner)?;
        for &lba in lbas {
            inner.residency.unclaim(vol, lba);
        }
        Ok(())
    }

    /// Claim the blocks whose homes a disk flush made durable since they
    /// were marked clean (residency.rs), in Clean records — only in room
    /// the log has to spare (a claim never reclaims a chunk; a block left
    /// unclaimed is counted dirty after a crash, as before). Called where
    /// no home write is under way (after a reclaim or a cleaning pass).
    pub(super) fn log_claims(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        if !inner.in_place() {
            return Ok(());
        }
        let log = &inner.log;
        let mut ready = inner.residency.take_ready(|v, lba, cb| log.owner_of(cb) == Some((v, lba)));
        ready.sort_unstable();
        let max = inner.record_blocks_max();
        let mut i = 0;
        while i < ready.len() {
            let vol = ready[i].0;
            let n = ready[i..].iter().take(max).take_while(|r| r.0 == vol).count();
            if !inner.log_has_room(0) {
                break;
            }
            let mut entries = Vec::with_capacity(n);
            for &(_, lba, _) in &ready[i..i + n] {
                let crc = inner.vols[vol as usize].l2p.entry(lba as usize)?.1;
                entries.push(crate::layout::Entry { lba, crc, tombstone: true });
            }
            self.log_record(inner, vol, crate::layout::RecordKind::Clean, entries, &[])?;
            for &(v, lba, cb) in &ready[i..i + n] {
                inner.residency.claimed(v, lba, cb);
            }
            i += n;
        }
        Ok(())
    }

    /// Write `data` (whole blocks) to the disk from block `block`: the one
    /// way the in-place engine writes the disk. On a disk the engine was
    /// attached to, a sampled block it changes is recorded first, durably
    /// (disk_identity.rs), so the next open does not take the engine's own
    /// write for a change behind its back.
    fn disk_write(&self, inner: &mut Inner, block: u64, data: &[u8]) -> Result<(), VolumeError> {
        self.wait_overlapping(inner, block, data.len());
        if let Some(id) = inner.disk_id.as_ref() {
            if id.needs_flush_before(block, data) {
                self.flush_capacity(inner)?;
            }
            let id = inner.disk_id.as_mut().expect("attached");
            if id.before_write(block, data) {
                id.save(&*self.cache)?;
            }
        }
        // Its sums zeroed first, on the cache device too if it had any;
        // recorded again after the next capacity flush (home_sums.rs).
        let n = (data.len() / BLOCK_BYTES) as u64;
        inner.home_sums.begin_write(block, n)?;
        let r = write_at(&*self.capacity, block * BS, data);
        inner.home_sums.end_write(block, n, r.is_ok().then_some(data));
        r?;
        inner.cap.wrote();
        Ok(())
    }

    /// Write `data` (whole blocks from `lba0` of `vol`) to its home, and
    /// count it; the caller deals with cached copies.
    pub(super) fn write_home(&self, inner: &mut Inner, vol: usize, lba0: u64, data: &[u8]) -> Result<(), VolumeError> {
        // No claim is logged while a home write is prepared (residency.rs):
        // dropping a claimed copy logs a tombstone, which may reclaim a
        // chunk, whose reclaim logs claims — perhaps on these very blocks.
        // (Cleaning and writes past the log write homes only through here
        // or, in `clean_chunk`, with no log record in between.)
        inner.residency.pause_claims();
        let r = self.write_home_unpaused(inner, vol, lba0, data);
        inner.residency.resume_claims();
        r
    }

    fn write_home_unpaused(&self, inner: &mut Inner, vol: usize, lba0: u64, data: &[u8]) -> Result<(), VolumeError> {
        let claimed: Vec<u64> = (lba0..lba0 + (data.len() / BLOCK_BYTES) as u64)
            .filter(|&l| inner.residency.has_claim(vol as u32, l))
            .collect();
        self.unclaim(inner, vol as u32, &claimed)?;
        let at = inner.home(vol, lba0);
        inner.reuse_wait(None, None);
        self.disk_write(inner, at, data)?;
        inner.stats.capacity_wrote(data.len() as u64);
        inner.vols[vol].cache.home_changed();
        Ok(())
    }

    /// Write at most `blocks_max` dirty blocks of chunk `c` home: read from
    /// the log (one read over their span), checked against their CRCs,
    /// sorted by home and written as runs of adjacent blocks; then marked
    /// clean. Returns the blocks cleaned.
    pub(super) fn clean_chunk(&self, inner: &mut Inner, c: ChunkId, blocks_max: u64) -> Result<u64, VolumeError> {
        let todo = inner.dirty_of(c, blocks_max);
        self.clean_listed(inner, &todo)
    }

    /// Write the dirty cached blocks `todo` (volume, LBA, cache block;
    /// current, dirty, sorted by cache block, all of one chunk) home as
    /// `clean_chunk` does. Returns how many.
    pub(super) fn clean_listed(&self, inner: &mut Inner, todo: &[(u32, u64, u64)]) -> Result<u64, VolumeError> {
        let bpc = inner.blocks_per_chunk();
        assert!(todo.first().zip(todo.last()).is_none_or(|(a, b)| a.2 / bpc == b.2 / bpc), "one chunk");
        let job = self.prepare_clean(inner, todo)?;
        if inner.disk_id.is_some() {
            // An attached disk records its sampled blocks write by write.
            for run in &job.runs {
                self.disk_write(inner, run.at, &run.data)?;
                run.count(inner);
            }
        } else {
            self.write_runs_home(inner, &job)?;
        }
        for &(v, lba, cb) in todo {
            debug_assert_eq!(inner.log.owner_of(cb), Some((v, lba)));
            inner.mark_clean(cb);
        }
        Ok(todo.len() as u64)
    }

    /// Disjoint runs of a cleaning step written home together, up to
    /// `CAP_QUEUE_DEPTH` in flight (`write_queued`), so a disk that
    /// reorders its queue (an HDD's NCQ) serves them in the order its heads
    /// reach them. Each is counted once written; the first error is
    /// returned after every write completed (the blocks stay dirty).
    fn write_runs_home(&self, inner: &mut Inner, job: &CleanJob) -> Result<(), VolumeError> {
        for run in &job.runs {
            self.wait_overlapping(inner, run.at, run.data.len());
        }
        job.begin_sums(inner)?;
        // The lock holder's share of the disk's queue: what unlocked reads
        // and the log's own requests leave (engine.rs), at most
        // `CAP_QUEUE_DEPTH`.
        let share = self.capacity.info().queue_depth_max.saturating_sub(self.unlocked_reads_max + 3);
        let results = write_queued(&*self.capacity, &job.writes(), share.clamp(1, super::CAP_QUEUE_DEPTH));
        job.end_sums(inner, &results);
        let mut first_err = None;
        for (run, r) in job.runs.iter().zip(results) {
            match r {
                Ok(()) => {
                    inner.cap.wrote();
                    run.count(inner);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Before a disk write of `bytes` from block `block`: a home-write step
    /// in flight over any of them finished first, so overlapping writes
    /// reach the disk in the engine's order (home_flight.rs).
    fn wait_overlapping(&self, inner: &Inner, block: u64, bytes: usize) {
        if let Some(n) = inner.home_flight.overlapping(block, (bytes / BLOCK_BYTES) as u64) {
            self.homes_done.wait(n);
        }
    }

    /// The first half of cleaning `todo` (volume, LBA, cache block; current,
    /// dirty, sorted by cache block): each chunk's blocks read from the log
    /// in one read over their span, checked against their CRCs (a mismatch
    /// fails the step, the block stays dirty and reading it fails the same
    /// way), claims on them withdrawn, and the blocks sorted by home into
    /// runs of adjacent homes. The disk is not written yet.
    pub(super) fn prepare_clean(&self, inner: &mut Inner, todo: &[(u32, u64, u64)]) -> Result<CleanJob, VolumeError> {
        let bpc = inner.blocks_per_chunk();
        assert!(todo.windows(2).all(|w| w[0].2 < w[1].2), "sorted by cache block");
        let mut homes: Vec<(u64, u32, u64, u64, Vec<u8>)> = Vec::with_capacity(todo.len());
        for chunk in todo.chunk_by(|a, b| a.2 / bpc == b.2 / bpc) {
            let (first, span) = (chunk[0].2, chunk[chunk.len() - 1].2 + 1 - chunk[0].2);
            let data = read_at(&*self.cache, first * BS, (span * BS) as usize)?;
            for &(v, lba, cb) in chunk {
                let block = &data[((cb - first) * BS) as usize..][..BLOCK_BYTES];
                let crc = inner.vols[v as usize].l2p.entry(lba as usize)?.1;
                if crc32c(block) != crc {
                    return Err(VolumeError::Corrupt { offset: lba * BS, device: "cache", device_offset: cb * BS });
                }
                homes.push((inner.home(v as usize, lba), v, lba, cb, block.to_vec()));
            }
        }
        homes.sort_unstable_by_key(|h| h.0);
        // Older copies claimed clean must not win a recovery once these
        // homes hold newer bytes.
        let mut claimed: Vec<(u32, u64)> =
            todo.iter().filter(|t| inner.residency.has_claim(t.0, t.1)).map(|t| (t.0, t.1)).collect();
        claimed.sort_unstable();
        for vol in claimed.iter().map(|c| c.0).collect::<std::collections::BTreeSet<u32>>() {
            let lbas: Vec<u64> = claimed.iter().filter(|c| c.0 == vol).map(|c| c.1).collect();
            self.unclaim(inner, vol, &lbas)?;
        }
        let mut runs: Vec<CleanRun> = Vec::new();
        for (at, v, lba, cb, block) in homes {
            let epoch = inner.log.chunk(ChunkId((cb / bpc) as u32)).epoch();
            match runs.last_mut() {
                Some(r) if r.at + r.blocks.len() as u64 == at && r.blocks.len() < RUN_BLOCKS_MAX => {
                    r.data.extend_from_slice(&block);
                    r.blocks.push((v, lba, cb, epoch));
                }
                _ => runs.push(CleanRun { at, data: block, blocks: vec![(v, lba, cb, epoch)] }),
            }
        }
        Ok(CleanJob { runs })
    }

    /// Clean at most `blocks_max` dirty blocks of the log, oldest chunk
    /// first (the open chunk last), make the homes durable and claim them
    /// clean; with `u64::MAX`, every one: the disk alone is then a complete
    /// copy of every volume. Returns the blocks written.
    pub(super) fn clean_oldest_first(&self, inner: &mut Inner, blocks_max: u64) -> Result<u64, VolumeError> {
        let order: Vec<ChunkId> = inner.log.full().chain(inner.log.open().map(|(c, _)| c)).collect();
        let mut n = 0;
        for c in order {
            while n < blocks_max && inner.residency.dirty(c) > 0 {
                n += self.clean_chunk(inner, c, blocks_max - n)?;
            }
        }
        if inner.cap.is_dirty() {
            self.flush_capacity(inner)?;
        }
        self.log_claims(inner)?;
        Ok(n)
    }

    /// Write whole blocks home past the log (write-around, pass-through,
    /// spill, cutoff, write-zeroes), dropping the copies the log held: the
    /// disk first, durable if there are copies; then the copies out of the
    /// maps, so that no cleaning the tombstones' logging starts can write an
    /// old copy over the new home; then a tombstone for each (module doc).
    /// Writing home touches no log, so nothing cleans in between. `data` is
    /// `None` for zeros.
    pub(super) fn write_past_log(
        &self,
        inner: &mut Inner,
        vol: u32,
        lba0: u64,
        blocks: u64,
        data: Option<&[u8]>,
    ) -> Result<(), VolumeError> {
        let mut cached = Vec::new();
        for lba in lba0..lba0 + blocks {
            if !inner.vols[vol as usize].l2p.get(lba as usize)?.is_none() {
                cached.push(lba);
            }
        }
        match data {
            Some(d) => self.write_home(inner, vol as usize, lba0, d)?,
            None => {
                let zeros = vec![0u8; (RUN_BLOCKS_MAX as u64).min(blocks) as usize * BLOCK_BYTES];
                let mut at = 0;
                while at < blocks {
                    let n = (blocks - at).min(RUN_BLOCKS_MAX as u64);
                    self.write_home(inner, vol as usize, lba0 + at, &zeros[..(n * BS) as usize])?;
                    at += n;
                }
            }
        }
        if cached.is_empty() {
            return Ok(());
        }
        // The tombstones must not become durable before the home write: a
        // crash could keep them and lose the write, and the blocks would
        // read a home older than the copies they drop. Until the home is
        // durable the copies stay mapped (a failure leaves reads on them).
        self.flush_capacity(inner)?;
        // Out of the maps before the tombstones take log space: that may
        // reclaim the oldest chunk, which must not clean an old copy over
        // the new home.
        for &lba in &cached {
            let old = inner.vols[vol as usize].l2p.get(lba as usize)?;
            inner.vols[vol as usize].l2p.set(lba as usize, Loc::NONE, 0)?;
            inner.invalidate(old);
        }
        self.log_tombstones(inner, vol, &cached)
    }
}

/// A cleaning step's home writes (`Engine::prepare_clean`), in home order.
pub(super) struct CleanJob {
    pub(super) runs: Vec<CleanRun>,
}

/// Blocks with adjacent homes, written home in one write.
pub(super) struct CleanRun {
    /// The first home block.
    pub(super) at: u64,
    pub(super) data: Vec<u8>,
    /// Each block's volume, LBA, cache block and its chunk's epoch.
    pub(super) blocks: Vec<(u32, u64, u64, u64)>,
}

impl CleanJob {
    /// The home ranges `[first, end)` the job writes (sorted, disjoint).
    pub(super) fn ranges(&self) -> Vec<(u64, u64)> {
        self.runs.iter().map(|r| (r.at, r.at + r.blocks.len() as u64)).collect()
    }

    /// Its runs as device writes (byte offset, data), for `write_queued`.
    pub(super) fn writes(&self) -> Vec<(u64, &[u8])> {
        self.runs.iter().map(|r| (r.at * BS, &r.data[..])).collect()
    }

    /// Before any run is written: every run's home sums zeroed
    /// (home_sums.rs). On an error none is under way and nothing may be
    /// written.
    pub(super) fn begin_sums(&self, inner: &mut Inner) -> Result<(), DeviceError> {
        for (i, run) in self.runs.iter().enumerate() {
            if let Err(e) = inner.home_sums.begin_write(run.at, run.blocks.len() as u64) {
                for r in &self.runs[..i] {
                    inner.home_sums.end_write(r.at, r.blocks.len() as u64, None);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// After the writes (`results`, one per run): each run's sums told
    /// whether it was written.
    pub(super) fn end_sums<E>(&self, inner: &mut Inner, results: &[Result<(), E>]) {
        assert_eq!(results.len(), self.runs.len(), "a result per run");
        for (run, r) in self.runs.iter().zip(results) {
            inner.home_sums.end_write(run.at, run.blocks.len() as u64, r.is_ok().then_some(&run.data[..]));
        }
    }
}

impl CleanRun {
    /// The run was written home: count it.
    pub(super) fn count(&self, inner: &mut Inner) {
        inner.stats.capacity_wrote(self.data.len() as u64);
        for &(v, ..) in &self.blocks {
            let vc = &mut inner.vols[v as usize].cache;
            vc.count(CacheCount::Cleaned, BS);
            vc.home_changed();
        }
        inner.stats.compacted(self.data.len() as u64);
    }
}

/// Most blocks one home write carries (1 MiB).
const RUN_BLOCKS_MAX: usize = 256;

/// Write each of `writes` (device byte, data; disjoint) to `dev`, with up to
/// `depth` of them in flight: one thread's submit-then-reap, so the device
/// may serve them in any order (an HDD's NCQ by where its heads are). A
/// device that runs requests inline, or one write, goes one at a time (no
/// queue to fill). Returns each write's result, in `writes` order, after
/// every one completed.
pub(super) fn write_queued(
    dev: &dyn BlockDevice,
    writes: &[(u64, &[u8])],
    depth: usize,
) -> Vec<Result<(), DeviceError>> {
    if writes.len() <= 1 || depth <= 1 || dev.runs_inline() {
        return writes.iter().map(|&(at, data)| write_at(dev, at, data)).collect();
    }
    let mut results: Vec<Option<Result<(), DeviceError>>> = vec![None; writes.len()];
    let mut out = Vec::with_capacity(depth);
    let (mut next, mut in_flight) = (0, 0);
    while next < writes.len() || in_flight > 0 {
        while next < writes.len() && in_flight < depth {
            let (at, data) = writes[next];
            dev.submit(IoRequest::write(at, IoBuf::from_slice(data), next as u64));
            next += 1;
            in_flight += 1;
        }
        out.clear();
        let got = dev.reap(1, &mut out);
        assert!(got > 0, "a request in flight always completes");
        for c in out.drain(..) {
            results[c.user_data as usize] = Some(c.result.map(|_| ()));
            in_flight -= 1;
        }
    }
    results.into_iter().map(|r| r.expect("every write completed")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Cleaning's home writes in flight together let an HDD's NCQ order
    /// them by where its heads are: the same 32 scattered runs, in the home
    /// order a step writes them, take less disk time than one at a time
    /// (rotational positioning: the sorted order already saves the seeks),
    /// and every run lands. (Virtual time: the numbers are exact.)
    #[test]
    fn queued_home_writes_let_ncq_reorder_them() {
        use sluice_media::{hdd_device, HddProfile, MemoryDevice, VirtualClock};
        let cap = 4u64 << 30;
        let disk = |ncq: bool| {
            let p = HddProfile { capacity_bytes: cap, ncq, ..HddProfile::hdd_7200() };
            hdd_device(p, Box::new(MemoryDevice::new(cap, 4096)), VirtualClock::new())
        };
        // Homes sorted as a cleaning step sorts them, the step's runs
        // scattered over the stroke (run i at a pseudo-random block).
        let mut at: Vec<u64> = (0..32u64).map(|i| (i * 7_919 + 13) % 1_000 * (cap / 1_000 / BS) * BS).collect();
        at.sort_unstable();
        let data: Vec<Vec<u8>> = (0..32u8).map(|i| vec![i + 1; 16 * BLOCK_BYTES]).collect();
        let writes: Vec<(u64, &[u8])> = at.iter().zip(&data).map(|(&a, d)| (a, &d[..])).collect();
        let busy = |depth: usize| {
            let d = disk(true);
            let r = write_queued(&d, &writes, depth);
            assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
            for &(a, want) in &writes {
                assert!(read_at(&d, a, want.len()).unwrap()[..] == *want, "run at {a} landed");
            }
            d.stats().busy_ns
        };
        let (one, queued) = (busy(1), busy(super::super::CAP_QUEUE_DEPTH));
        assert!(queued * 20 < one * 19, "queued {queued} ns against one at a time {one} ns");
    }

    /// A write that fails among queued ones fails alone: its result is the
    /// error, every other write completed and landed.
    #[test]
    fn a_queued_write_that_fails_fails_alone() {
        let d = sluice_media::CrashDevice::new(1 << 20, 4096);
        d.inject(sluice_media::FaultPlan::nth_write(3));
        let data: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i + 1; BLOCK_BYTES]).collect();
        let writes: Vec<(u64, &[u8])> = data.iter().enumerate().map(|(i, b)| (i as u64 * 2 * BS, &b[..])).collect();
        let r = write_queued(&d, &writes, 4);
        assert_eq!(r.iter().filter(|r| r.is_err()).count(), 1, "{r:?}");
        for (i, (res, &(a, want))) in r.iter().zip(&writes).enumerate() {
            if res.is_ok() {
                assert!(read_at(&d, a, BLOCK_BYTES).unwrap()[..] == *want, "write {i} landed");
            }
        }
    }

    fn alru(setpoint: f64, response_ms: u64) -> Cleaning {
        Cleaning {
            mode: CleaningMode::Alru,
            dirty_setpoint: setpoint,
            response: Duration::from_millis(response_ms),
            ..Cleaning::default()
        }
    }

    #[test]
    fn under_the_set_point_the_rate_is_a_trickle() {
        let mut r = CleaningRate::default();
        let c = alru(0.1, 10_000);
        assert_eq!(r.rate(0, 0, 1 << 30, &c), CLEANING_RATE_MIN);
        assert_eq!(r.rate(1_000_000_000, 100 << 20, 1 << 30, &c), CLEANING_RATE_MIN, "just under 10 %");
    }

    #[test]
    fn the_proportional_term_cleans_the_excess_in_one_response_time() {
        let mut r = CleaningRate::default();
        let c = alru(0.1, 10_000);
        let total = 1000 << 20;
        // 100 MiB over the set point, first sample (no integral yet):
        // 10 MiB/s.
        let rate = r.rate(0, 200 << 20, total, &c);
        assert!((rate - (10 << 20) as f64).abs() < 1.0, "{rate}");
        // Twice the excess, twice the rate (the integral still small).
        let mut r2 = CleaningRate::default();
        assert!((r2.rate(0, 300 << 20, total, &c) / rate - 2.0).abs() < 1e-9);
    }

    #[test]
    fn the_integral_grows_over_the_set_point_and_drains_under_it() {
        let mut r = CleaningRate::default();
        let c = alru(0.1, 1000);
        let total = 1000 << 20;
        let s = 1_000_000_000u64;
        let p_only = (100 << 20) as f64;
        // A steady excess of 100 MiB: the rate climbs above the proportional
        // term, second after second.
        let rates: Vec<f64> = (0..5).map(|i| r.rate(i * s, 200 << 20, total, &c)).collect();
        assert!((rates[0] - p_only).abs() < 1.0);
        assert!(rates.windows(2).all(|w| w[1] > w[0]), "{rates:?}");
        // A long gap counts as one second at most (no jump after a pause).
        let before = r.integral;
        r.rate(100 * s, 200 << 20, total, &c);
        assert!((r.integral - before - (100 << 20) as f64).abs() < 1.0);
        // Under the set point the integral drains to zero, never below.
        for i in 0..1000 {
            r.rate((101 + i) * s, 0, total, &c);
        }
        assert_eq!(r.integral, 0.0);
        assert_eq!(r.rate(2000 * s, 0, total, &c), CLEANING_RATE_MIN);
    }
}
