//! Cache policy in front of the log for volumes held in place (cleaning.rs):
//! each volume's mode, its sequential cutoff, read promotion and spill, and
//! what they did (`CacheStats`).
//!
//! A write of an in-place volume goes one of three ways:
//! - **log** (write-back): into the log, dirty; cleaning writes it home
//!   later, unless it is overwritten or trimmed first;
//! - **through** (write-through; write-around for blocks already cached):
//!   into the log, then home, then marked clean;
//! - **past** (write-around and write-invalidate for uncached blocks,
//!   pass-through, a stream past the sequential cutoff, or a spill when the
//!   log could take it only after cleaning): home only, and the blocks the
//!   log held are dropped by a tombstone.
//!
//! Spill keeps writes from waiting for the disk's cleaning when the log is
//! full of dirty data. The background compactor cleans the log meanwhile;
//! without it, once a log's worth of writes has spilled while the oldest
//! chunk stayed put, each spilled write cleans as many blocks of it as it
//! carries (at least `SPILL_CLEAN_BLOCKS_MIN`), so the log always drains —
//! but short-lived data that trims free first is never written home.
//! Sequential streams are tracked per volume and direction (streams.rs),
//! several at once and tolerant of split and reordered requests.
//!
//! Modes follow Open CAS: `wb`, `wt`, `wa`, `wi`, `pt`. A mode may change
//! at any time: dirty blocks stay where they are and are cleaned as usual,
//! and every mode reads a cached block from the log, so no mode ever
//! returns an older copy. A read that found blocks at home promotes them
//! into the log (clean) in every mode but pass-through, at once or after
//! `n` misses of the same block; the promotion is dropped if any home of
//! the volume was written since the read looked (`home_gen`).
//!
//! The policy is not persisted (the server's configuration sets it at
//! start); the counters restart with the engine.

use super::{crc32c, ChunkId, ClassStats, Engine, EngineError, Inner, Serialize, VolumeError, BLOCK_BYTES, BS};
use std::collections::HashMap;

/// How an in-place volume's writes and reads use the cache (Open CAS's set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheMode {
    /// Writes land in the log; cleaning writes them home later.
    #[default]
    WriteBack,
    /// Writes go home and into the log (clean).
    WriteThrough,
    /// Writes go home; blocks already cached are updated there too.
    WriteAround,
    /// Writes go home; cached copies of them are dropped.
    WriteInvalidate,
    /// Nothing new is cached: writes go home (cached copies dropped), reads
    /// are not promoted.
    PassThrough,
}

impl std::str::FromStr for CacheMode {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<CacheMode, EngineError> {
        Ok(match s {
            "wb" | "write-back" => CacheMode::WriteBack,
            "wt" | "write-through" => CacheMode::WriteThrough,
            "wa" | "write-around" => CacheMode::WriteAround,
            "wi" | "write-invalidate" => CacheMode::WriteInvalidate,
            "pt" | "pass-through" => CacheMode::PassThrough,
            _ => return Err(EngineError::Config("cache mode is one of wb, wt, wa, wi, pt")),
        })
    }
}

impl CacheMode {
    /// The mode's short name, as the config writes it (what `from_str`
    /// reads first).
    pub fn short_name(self) -> &'static str {
        match self {
            CacheMode::WriteBack => "wb",
            CacheMode::WriteThrough => "wt",
            CacheMode::WriteAround => "wa",
            CacheMode::WriteInvalidate => "wi",
            CacheMode::PassThrough => "pt",
        }
    }
}

/// When a sequential stream bypasses the cache (Open CAS's policies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SeqCutoff {
    /// Whenever a stream passes the threshold.
    #[default]
    Always,
    /// Only while the log could take the write after cleaning only.
    Full,
    /// Never.
    Never,
}

impl std::str::FromStr for SeqCutoff {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<SeqCutoff, EngineError> {
        Ok(match s {
            "always" => SeqCutoff::Always,
            "full" => SeqCutoff::Full,
            "never" => SeqCutoff::Never,
            _ => return Err(EngineError::Config("seq_cutoff is one of always, full, never")),
        })
    }
}

/// An in-place volume's cache policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CachePolicy {
    pub mode: CacheMode,
    pub seq_cutoff: SeqCutoff,
    /// A stream longer than this bypasses the cache (`seq_cutoff`).
    pub seq_cutoff_bytes: u64,
    /// A block read from home is promoted into the log on its n-th miss
    /// (1: at once; 0: never) among the last `PROMOTE_WINDOW` misses.
    pub promote_after_misses: u32,
    /// When the log could take a write only after cleaning, write it home
    /// instead (counted as spilled) rather than wait for the disk's
    /// cleaning (module doc).
    pub spill: bool,
    /// When a chunk is reclaimed, keep its blocks that reads found since
    /// they were logged (moved forward in the log, clean): a second chance,
    /// as CLOCK gives. Off: eviction is oldest-first (FIFO). On by default:
    /// `sluice bench caching`'s eviction cases read a hot set from the
    /// disk 3× less with it, and the temporary-data cases are unchanged
    /// (docs/caching.md).
    pub retain_hot: bool,
}

impl Default for CachePolicy {
    fn default() -> CachePolicy {
        CachePolicy {
            mode: CacheMode::WriteBack,
            seq_cutoff: SeqCutoff::Always,
            seq_cutoff_bytes: 1 << 20,
            promote_after_misses: 1,
            spill: true,
            retain_hot: true,
        }
    }
}

/// Blocks a spilled write cleans at least when no background compactor runs.
const SPILL_CLEAN_BLOCKS_MIN: u64 = 16;

/// Distinct blocks whose misses are remembered for promotion: the window
/// `promote_after_misses` counts in (then forgotten all at once).
const PROMOTE_WINDOW: usize = 1 << 16;

/// What an in-place volume's cache did (bytes), since the engine opened.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct CacheStats {
    /// Read bytes found in the log, and read from home.
    pub read_hit_bytes: u64,
    pub read_miss_bytes: u64,
    /// Written into the log (write-back), and home and log (write-through).
    pub write_back_bytes: u64,
    pub write_through_bytes: u64,
    /// Written home past the log by the mode (write-around, -invalidate,
    /// pass-through).
    pub write_past_bytes: u64,
    /// Written home past the log because the stream passed the cutoff.
    pub cutoff_bypass_bytes: u64,
    /// Written home past the log because the log was full of dirty data.
    pub spill_bytes: u64,
    /// Read from home and promoted into the log.
    pub promoted_bytes: u64,
    /// Dirty blocks written home by cleaning.
    pub cleaned_bytes: u64,
    /// Dirty blocks trimmed before cleaning reached them: bytes the disk
    /// never had to write.
    pub discarded_dirty_bytes: u64,
    /// Kept when their chunk was reclaimed (hot or pinned), moved forward
    /// in the log.
    pub retained_bytes: u64,
    /// Dirty blocks of pinned classes moved forward in the log when their
    /// chunk was reclaimed, instead of written home.
    pub relogged_bytes: u64,
    /// Clean copies dropped when their chunk was reclaimed (not retained):
    /// later reads of them go home.
    pub evicted_bytes: u64,
    /// Written home past the log because the request's I/O class is never
    /// cached (share 0).
    pub class_bypass_bytes: u64,
}

/// One in-place volume's policy and state (`Vol::cache`). Its fields are
/// private to this module; other modules change them only through the
/// methods below. Invariants: `dirty_blocks` never goes below zero (a
/// block cleaned or dropped dirty was counted dirty); `home_gen` only
/// rises; the home is placed once, when the engine is assembled.
#[derive(Default)]
pub(super) struct VolCache {
    policy: CachePolicy,
    stats: CacheStats,
    /// The capacity block of LBA 0's home.
    home: u64,
    /// Bumped by every write to a home of the volume, and by trims.
    home_gen: u64,
    /// Cached blocks of the volume that are not clean (kept as they change,
    /// so a report does not walk the log; checked by `check_invariants`).
    dirty_blocks: u64,
    /// The sequential streams last seen (cutoff), of writes and of reads
    /// (streams.rs).
    write_streams: super::streams::Streams,
    read_streams: super::streams::Streams,
    /// Misses per block since the window opened (promotion).
    misses: HashMap<u64, u32>,
    /// The volume's I/O classes and their counters (classes.rs).
    classes: super::classes::Classes,
}

/// What a volume's cache counts (`CacheStats`, one field each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CacheCount {
    ReadHit,
    ReadMiss,
    WriteBack,
    WriteThrough,
    WritePast,
    CutoffBypass,
    Spill,
    ClassBypass,
    Promoted,
    Cleaned,
    DiscardedDirty,
    Retained,
    Relogged,
    Evicted,
}

impl VolCache {
    pub(super) fn policy(&self) -> CachePolicy {
        self.policy
    }

    pub(super) fn set_policy(&mut self, policy: CachePolicy) {
        self.policy = policy;
    }

    pub(super) fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Count `bytes` of `what`.
    pub(super) fn count(&mut self, what: CacheCount, bytes: u64) {
        let s = &mut self.stats;
        *match what {
            CacheCount::ReadHit => &mut s.read_hit_bytes,
            CacheCount::ReadMiss => &mut s.read_miss_bytes,
            CacheCount::WriteBack => &mut s.write_back_bytes,
            CacheCount::WriteThrough => &mut s.write_through_bytes,
            CacheCount::WritePast => &mut s.write_past_bytes,
            CacheCount::CutoffBypass => &mut s.cutoff_bypass_bytes,
            CacheCount::Spill => &mut s.spill_bytes,
            CacheCount::ClassBypass => &mut s.class_bypass_bytes,
            CacheCount::Promoted => &mut s.promoted_bytes,
            CacheCount::Cleaned => &mut s.cleaned_bytes,
            CacheCount::DiscardedDirty => &mut s.discarded_dirty_bytes,
            CacheCount::Retained => &mut s.retained_bytes,
            CacheCount::Relogged => &mut s.relogged_bytes,
            CacheCount::Evicted => &mut s.evicted_bytes,
        } += bytes;
    }

    /// The capacity block of LBA 0's home.
    pub(super) fn home(&self) -> u64 {
        self.home
    }

    /// Place the volume's home at capacity block `at` (once, on assembly).
    pub(super) fn place_home(&mut self, at: u64) {
        assert!(self.home == 0 || self.home == at, "a volume's home moved from {} to {at}", self.home);
        self.home = at;
    }

    /// The home generation: a read that saw another may not promote.
    pub(super) fn home_gen(&self) -> u64 {
        self.home_gen
    }

    /// A home of the volume was written, or a block trimmed.
    pub(super) fn home_changed(&mut self) {
        self.home_gen += 1;
    }

    /// Cached blocks of the volume not yet clean.
    pub(super) fn dirty_blocks(&self) -> u64 {
        self.dirty_blocks
    }

    /// A block of the volume was logged (dirty, of the unclassified class
    /// until classified).
    pub(super) fn logged_dirty(&mut self) {
        self.classes.count(0, true);
        self.dirty_blocks += 1;
    }

    /// One of the volume's dirty cached blocks became clean.
    pub(super) fn cleaned_one(&mut self) {
        assert!(self.dirty_blocks > 0, "a dirty block the volume did not count");
        self.dirty_blocks -= 1;
    }

    /// One of the volume's cached blocks (of I/O class `class`, `dirty`
    /// if not yet cleaned home) left the cache.
    pub(super) fn dropped(&mut self, class: u8, dirty: bool) {
        self.classes.count(class, false);
        if dirty {
            self.cleaned_one();
        }
    }

    /// Counted again from the log (`Inner::recount_classes`): `held`
    /// blocks cached, all unclassified, `dirty` of them dirty.
    pub(super) fn recounted(&mut self, held: u64, dirty: u64) {
        assert!(dirty <= held, "{dirty} dirty of {held} cached blocks");
        self.classes.reset_counts(held);
        self.dirty_blocks = dirty;
    }

    pub(super) fn classes(&self) -> &super::classes::Classes {
        &self.classes
    }

    /// The volume's classes, owned by classes.rs, changed through its methods.
    pub(super) fn classes_mut(&mut self) -> &mut super::classes::Classes {
        &mut self.classes
    }
}

/// Writes spilled while the oldest chunk (and its epoch) stayed the same
/// (`Engine::clean_for_spill`).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SpillDebt {
    head: Option<(ChunkId, u64)>,
    blocks: u64,
}

/// Where one write of an in-place volume goes (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Log,
    Through,
    Past(PastWhy),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PastWhy {
    Mode,
    Cutoff,
    Spill,
    Class,
}

impl Inner {
    /// Whether the log holds a copy of any of `blocks` from `lba0` of `vol`.
    fn any_cached(&self, vol: usize, lba0: u64, blocks: u64) -> Result<bool, VolumeError> {
        let l2p = &self.vols[vol].l2p;
        for lba in lba0..lba0 + blocks {
            if !l2p.get(lba as usize)?.is_none() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Where a write of `blocks` from `lba0` of `vol` goes, and the stream
    /// it continues.
    /// (And the I/O class the blocks are cached under.)
    fn route(&mut self, vol: usize, lba0: u64, blocks: u64) -> Result<(Route, u8), VolumeError> {
        let full = self.log_needs_cleaning(blocks);
        let log_blocks = self.log.chunk_count() as u64 * self.blocks_per_chunk();
        let vc = &mut self.vols[vol].cache;
        let admit = if matches!(vc.policy.mode, CacheMode::PassThrough | CacheMode::WriteInvalidate) {
            super::classes::Admit::Class(0)
        } else {
            vc.classes.admit_write(lba0 * BS, blocks, log_blocks)
        };
        let class = match admit {
            super::classes::Admit::Class(id) => id,
            super::classes::Admit::Bypass => return Ok((Route::Past(PastWhy::Class), 0)),
            super::classes::Admit::Spill => return Ok((Route::Past(PastWhy::Spill), 0)),
        };
        let streaming = vc.write_streams.extend(lba0 * BS, blocks * BS, false) > vc.policy.seq_cutoff_bytes;
        let p = vc.policy;
        let cut = match p.seq_cutoff {
            SeqCutoff::Always => streaming,
            SeqCutoff::Full => streaming && full,
            SeqCutoff::Never => false,
        };
        let cached = || self.any_cached(vol, lba0, blocks);
        let route = match p.mode {
            CacheMode::PassThrough | CacheMode::WriteInvalidate => Route::Past(PastWhy::Mode),
            _ if cut => Route::Past(PastWhy::Cutoff),
            CacheMode::WriteAround if cached()? => Route::Through,
            CacheMode::WriteAround => Route::Past(PastWhy::Mode),
            CacheMode::WriteThrough => Route::Through,
            CacheMode::WriteBack if full && p.spill => Route::Past(PastWhy::Spill),
            CacheMode::WriteBack => Route::Log,
        };
        Ok((route, class))
    }
}

/// Whether any two of `writes` (first LBA, data) share a block.
fn overlapping(writes: &[(u64, &[u8])]) -> bool {
    if writes.len() < 2 {
        return false;
    }
    let mut spans: Vec<(u64, u64)> = writes.iter().map(|&(l, d)| (l, l + (d.len() / BLOCK_BYTES) as u64)).collect();
    spans.sort_unstable();
    spans.windows(2).any(|w| w[1].0 < w[0].1)
}

/// A write past the log left for the caller to do without the engine lock
/// (`Engine::write_in_place`): write `writes[index]` at byte `at` of the
/// capacity device, then `Engine::finish_home_writes`.
#[derive(Clone, Copy, Debug)]
pub(super) struct DeferredHome {
    pub(super) index: usize,
    pub(super) at: u64,
}

impl Engine {
    /// Writes (LBA, data) of in-place volume `vol`, each routed by its
    /// policy (module doc); `crcs` per block.
    ///
    /// A write that goes home past the log while the log holds no copy of
    /// its blocks touches nothing of the engine but the disk: in real time
    /// it is left in `deferred`, for the caller to write without the lock —
    /// so a pass-through or spilled write does not hold every other
    /// request behind a disk seek — and then to finish
    /// (`finish_home_writes`: home generation bumped again, disk marked
    /// unflushed, FUA flushed). Its home generation is bumped now as well,
    /// so a read that saw the home before the write lands never promotes
    /// what it read. A newer write of the same blocks logged meanwhile
    /// wins in the maps, as a write racing another may.
    pub(super) fn write_in_place(
        &self,
        inner: &mut Inner,
        vol: u32,
        writes: &[(u64, &[u8])],
        crcs: &[u32],
        fua: bool,
        deferred: &mut Vec<DeferredHome>,
    ) -> Result<(), VolumeError> {
        let bg = self.bg.on.load(std::sync::atomic::Ordering::Relaxed);
        // A write is deferred only if no other write of the batch overlaps
        // it: a later one must land after it, and it lands after the lock.
        let may_defer = !inner.serial() && !overlapping(writes);
        let mut first = 0;
        let mut home_written = false;
        for (index, &(lba0, data)) in writes.iter().enumerate() {
            let blocks = (data.len() / BLOCK_BYTES) as u64;
            let crc = &crcs[first..first + blocks as usize];
            first += blocks as usize;
            let v = vol as usize;
            let (route, class) = inner.route(v, lba0, blocks)?;
            match route {
                Route::Log => {
                    self.append(inner, vol, &[(lba0, data)], crc, false)?;
                    self.class_range(inner, v, lba0, blocks, class)?;
                    inner.vols[v].cache.count(CacheCount::WriteBack, data.len() as u64);
                }
                Route::Through => {
                    // Logged first: logging may clean the oldest chunk, and
                    // an older copy must not be written over this home.
                    self.append(inner, vol, &[(lba0, data)], crc, false)?;
                    self.class_range(inner, v, lba0, blocks, class)?;
                    self.write_home(inner, v, lba0, data)?;
                    self.mark_range_clean(inner, v, lba0, blocks)?;
                    inner.vols[v].cache.count(CacheCount::WriteThrough, data.len() as u64);
                    home_written = true;
                }
                Route::Past(why) => {
                    // (A write of a block the disk's identity samples is
                    // recorded first, under the lock: disk_identity.rs; so
                    // is one of a block claimed clean: residency.rs.)
                    let sampled = inner.disk_id.as_ref().is_some_and(|d| d.samples_any(inner.home(v, lba0), blocks));
                    let claimed = (lba0..lba0 + blocks).any(|l| inner.residency.has_claim(vol, l));
                    // (Nor over homes a cleaning step is writing: home_flight.rs.)
                    let cleaning = inner.home_flight.overlapping(inner.home(v, lba0), blocks).is_some();
                    if may_defer && !sampled && !claimed && !cleaning && !inner.any_cached(v, lba0, blocks)? {
                        inner.vols[v].cache.home_changed();
                        // Its sums zeroed before the write is issued (home_sums.rs).
                        inner.home_sums.begin_write(inner.home(v, lba0), blocks)?;
                        deferred.push(DeferredHome { index, at: inner.home(v, lba0) * BS });
                    } else {
                        self.write_past_log(inner, vol, lba0, blocks, Some(data))?;
                        home_written = true;
                    }
                    if why == PastWhy::Spill && !bg {
                        self.clean_for_spill(inner, blocks)?;
                    }
                    if why == PastWhy::Cutoff {
                        inner.vols[v].cache.classes_mut().cut_off(class, data.len() as u64);
                    }
                    let what = match why {
                        PastWhy::Mode => CacheCount::WritePast,
                        PastWhy::Cutoff => CacheCount::CutoffBypass,
                        PastWhy::Spill => CacheCount::Spill,
                        PastWhy::Class => CacheCount::ClassBypass,
                    };
                    inner.vols[v].cache.count(what, data.len() as u64);
                }
            }
        }
        if fua {
            self.flush_cache_for_client(inner)?;
            if home_written {
                self.flush_capacity(inner)?;
            }
        }
        Ok(())
    }

    /// After the deferred home writes of a request (`write_in_place`) were
    /// done without the lock (`homes`: each one's first byte on the disk and
    /// data, the first `done` of them written; `result`: the bytes they
    /// wrote, or their error): their home sums told (home_sums.rs), volume
    /// `vol`'s home generation bumped again (a read that looked while they
    /// were in flight promotes nothing), counted, and with `fua` the disk
    /// made durable.
    pub(super) fn finish_home_writes(
        &self,
        inner: &mut Inner,
        vol: usize,
        (homes, done): (&[(u64, &[u8])], usize),
        result: Result<u64, VolumeError>,
        fua: bool,
    ) -> Result<(), VolumeError> {
        for (i, &(at, data)) in homes.iter().enumerate() {
            inner.home_sums.end_write(at / BS, (data.len() / BLOCK_BYTES) as u64, (i < done).then_some(data));
        }
        inner.vols[vol].cache.home_changed();
        let bytes = result?;
        inner.cap.wrote();
        inner.stats.capacity_wrote(bytes);
        if fua {
            self.flush_capacity(inner)?;
        }
        Ok(())
    }

    /// A write of `blocks` spilled and no background compactor runs: once
    /// a whole log's worth of writes has spilled while the oldest chunk
    /// stayed (nothing else, such as trims of short-lived data, freed it),
    /// clean as many of its blocks as the write carried (at least
    /// `SPILL_CLEAN_BLOCKS_MIN`), so the log drains as fast as writes spill.
    /// Cleaning sooner would write home data about to be deleted.
    fn clean_for_spill(&self, inner: &mut Inner, blocks: u64) -> Result<(), VolumeError> {
        let Some(c) = inner.log.oldest_full() else { return Ok(()) };
        let head = (c, inner.log.chunk(c).epoch());
        if inner.spill.head != Some(head) {
            inner.spill = SpillDebt { head: Some(head), blocks: 0 };
        }
        inner.spill.blocks += blocks;
        let log_blocks = inner.log.chunk_count() as u64 * inner.blocks_per_chunk();
        if inner.spill.blocks > log_blocks {
            self.clean_chunk(inner, c, blocks.max(SPILL_CLEAN_BLOCKS_MIN))?;
        }
        Ok(())
    }

    /// The cached copies of `blocks` from `lba0` of `vol` belong to class `id`.
    fn class_range(&self, inner: &mut Inner, vol: usize, lba0: u64, blocks: u64, id: u8) -> Result<(), VolumeError> {
        if id == 0 {
            return Ok(());
        }
        for lba in lba0..lba0 + blocks {
            if let Some(cb) = inner.vols[vol].l2p.get(lba as usize)?.cache_block() {
                inner.set_class(cb, id);
            }
        }
        Ok(())
    }

    /// Mark the cached copies of `blocks` from `lba0` of `vol` clean.
    fn mark_range_clean(&self, inner: &mut Inner, vol: usize, lba0: u64, blocks: u64) -> Result<(), VolumeError> {
        for lba in lba0..lba0 + blocks {
            if let Some(cb) = inner.vols[vol].l2p.get(lba as usize)?.cache_block() {
                inner.mark_clean(cb);
            }
        }
        Ok(())
    }

    /// After a read of `data` from `lba0` of `vol` that found `at_home` of
    /// its blocks at home, unless the read is part of a stream past the
    /// cutoff (a scan): mark the blocks it found in the log hot (a second
    /// chance at reclaim, `Engine::to_retain`); and when no home of the volume
    /// was written since (`gen`), log the blocks still at home whose
    /// promotion is due, marked clean.
    pub(super) fn promote(
        &self,
        inner: &mut Inner,
        vol: u32,
        lba0: u64,
        data: &[u8],
        gen: u64,
        at_home: u64,
    ) -> Result<(), VolumeError> {
        let missed = at_home > 0;
        let v = vol as usize;
        let p = inner.vols[v].cache.policy();
        // Homes a cleaning step is writing may change under the read
        // (home_flight.rs): nothing read there is promoted.
        let cleaning = inner.home_flight.overlapping(inner.home(v, lba0), data.len() as u64 / BS).is_some();
        // Reads are streams too: a sequential read past the cutoff (a
        // scan, a bulk file read back) is not promoted.
        let vc = &mut inner.vols[v].cache;
        let class_ok = vc.classes.admit_read(lba0 * BS, data.len() as u64);
        let stream = vc.read_streams.extend(lba0 * BS, data.len() as u64, true);
        let cut = p.seq_cutoff != SeqCutoff::Never && stream > p.seq_cutoff_bytes;
        let moved = vc.home_gen != gen || cleaning;
        let blocks = data.len() as u64 / BS;
        if at_home < blocks && !cut {
            for lba in lba0..lba0 + blocks {
                if let Some(cb) = inner.vols[v].l2p.get(lba as usize)?.cache_block() {
                    inner.mark_hot(cb);
                }
            }
        }
        if !missed || !class_ok || cut || p.mode == CacheMode::PassThrough || p.promote_after_misses == 0 || moved {
            return Ok(());
        }
        let mut due: Vec<(u64, &[u8])> = Vec::new();
        for (i, block) in data.chunks(BLOCK_BYTES).enumerate() {
            let lba = lba0 + i as u64;
            if !inner.vols[v].l2p.get(lba as usize)?.is_none() {
                continue;
            }
            let vc = &mut inner.vols[v].cache;
            if vc.misses.len() >= PROMOTE_WINDOW {
                vc.misses.clear();
            }
            let n = vc.misses.entry(lba).or_insert(0);
            *n += 1;
            if *n >= p.promote_after_misses {
                vc.misses.remove(&lba);
                due.push((lba, block));
            }
        }
        // A promotion never makes the log reclaim a chunk (let alone clean
        // one): it takes room the log has to spare, in one record, or is
        // skipped.
        due.truncate(inner.record_blocks_max());
        if due.is_empty() || !inner.log_has_room(due.len() as u64) {
            return Ok(());
        }
        let crcs: Vec<u32> = due.iter().map(|d| crc32c(d.1)).collect();
        self.append(inner, vol, &due, &crcs, false)?;
        for &(lba, _) in &due {
            self.mark_range_clean(inner, v, lba, 1)?;
        }
        inner.vols[v].cache.count(CacheCount::Promoted, due.len() as u64 * BS);
        Ok(())
    }

    /// Set the cache policy of in-place volume `name`. Dirty blocks stay
    /// and are cleaned as usual (every mode reads them from the log).
    pub fn set_cache_policy(&self, name: &str, policy: CachePolicy) -> Result<(), EngineError> {
        let mut inner = self.lock();
        if !inner.in_place() {
            return Err(EngineError::Config("cache policies apply to an in-place engine (layout = in-place)"));
        }
        let v = inner.vols.iter().position(|v| v.name == name).ok_or_else(|| EngineError::NoVolume(name.into()))?;
        inner.vols[v].cache.set_policy(policy);
        Ok(())
    }

    /// Each volume's cache policy and counters, with its dirty and cached
    /// bytes (in-place engines; empty otherwise).
    pub fn cache_report(&self) -> Vec<CacheReport> {
        self.lock().cache_report()
    }

    /// Write every dirty block home and make the disk durable; then, with
    /// `detach`, stop caching (every volume pass-through): the disk alone
    /// is a complete copy of every volume (`Engine::home_offset` says where
    /// each starts). Returns the bytes written home.
    pub fn clean(&self, detach: bool) -> Result<u64, EngineError> {
        if !self.lock().in_place() {
            return Err(EngineError::Config("cleaning applies to an in-place engine (layout = in-place)"));
        }
        self.change(|e, inner| {
            if detach {
                inner
                    .vols
                    .iter_mut()
                    .for_each(|v| v.cache.set_policy(CachePolicy { mode: CacheMode::PassThrough, ..v.cache.policy() }));
            }
            let n = e.clean_oldest_first(inner, u64::MAX)?;
            Ok(n * BS)
        })
        .map_err(EngineError::Request)
    }

    /// One step of cleaning, for an operator's clean that shows progress and
    /// can stop between steps (`sluice cache clean`): write at most
    /// `blocks_max` dirty blocks home, oldest chunk first, make them
    /// durable and claim them clean. The lock is let go between steps, so
    /// requests go on. A clean stopped anywhere is resumed by the next
    /// step: what it wrote home is clean, what it did not is still dirty.
    pub fn clean_step(&self, blocks_max: u64) -> Result<CleanStep, EngineError> {
        if !self.lock().in_place() {
            return Err(EngineError::Config("cleaning applies to an in-place engine (layout = in-place)"));
        }
        self.change(|e, inner| {
            let n = e.clean_oldest_first(inner, blocks_max)?;
            let dirty: u64 = inner.vols.iter().map(|v| v.cache.dirty_blocks()).sum();
            Ok(CleanStep { cleaned_bytes: n * BS, dirty_bytes: dirty * BS })
        })
        .map_err(EngineError::Request)
    }

    /// Where volume `name` starts on the capacity device (in place).
    pub fn home_offset(&self, name: &str) -> Option<u64> {
        let inner = self.lock();
        let v = inner.vols.iter().position(|v| v.name == name)?;
        inner.in_place().then(|| inner.vols[v].cache.home() * BS)
    }
}

impl Inner {
    /// `Engine::cache_report` under the lock.
    pub(super) fn cache_report(&self) -> Vec<CacheReport> {
        if !self.in_place() {
            return Vec::new();
        }
        (self.vols.iter())
            .map(|v| {
                let classes = v.cache.classes().report();
                CacheReport {
                    volume: v.name.clone(),
                    policy: v.cache.policy(),
                    stats: v.cache.stats(),
                    cached_bytes: classes.iter().map(|c| c.cached_bytes).sum(),
                    dirty_bytes: v.cache.dirty_blocks() * BS,
                    classes,
                }
            })
            .collect()
    }
}

/// What one `Engine::clean_step` did: bytes it wrote home, and the dirty
/// bytes left in every volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CleanStep {
    pub cleaned_bytes: u64,
    pub dirty_bytes: u64,
}

/// One volume in `Engine::cache_report`.
#[derive(Clone, Debug, Serialize)]
pub struct CacheReport {
    pub volume: String,
    pub policy: CachePolicy,
    pub stats: CacheStats,
    /// Bytes of the volume current in the log, and of those, dirty.
    pub cached_bytes: u64,
    pub dirty_bytes: u64,
    /// Per I/O class (the first is "unclassified").
    pub classes: Vec<ClassStats>,
}
