//! The background worker: compaction and GC run ahead of need on a thread
//! of their own, and the foreground writes paced to them.
//!
//! Without a worker the engine compacts inline: the write that finds the
//! log at its floor (`log_free_chunks_min` free chunks) compacts the oldest
//! chunk itself, and the compaction that finds the bands at theirs collects
//! whole bands — hundreds of milliseconds under the lock while every other
//! request waits. `Engine::start_compactor` moves that work to a thread that
//! does it ahead of need in bounded steps (`Engine::compact_step`,
//! `gc_step`: 1/16 of a chunk each, resumable, re-checking the map every
//! step). It takes no turns with requests: a step holds the lock only to
//! plan and walk (its reads and writes run outside it, unless its window
//! moved meanwhile and is read again), so a request waits at most one such
//! hold. When writes outrun it, the set-point controller (throttle.rs)
//! paces them to the measured drain bandwidth; the inline paths stay as
//! safety valves, so no write ever fails for lack of space.
//!
//! A step's device I/O mostly runs without the lock (step_io.rs): the
//! window it reads is read beforehand, and its segment writes complete
//! afterwards, their remaps applied once they have.
//!
//! Invariants: the throttle sleeps outside the engine lock; the worker
//! holds the lock for one bounded step at a time (plus a short one to
//! apply remaps), and the only capacity writes in flight between steps are
//! its last step's, which anything that touches bands settles first;
//! dropping the [`Compactor`] stops and joins its thread.

use super::compaction::CompactStep;
use super::gc::GcStep;
use super::step_io::{PreRead, Window};
use super::throttle::Throttle;
use super::{Arc, DeviceError, Engine, EngineError, Inner, Mutex, Serialize, VolumeError, BS};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// Where the compactor and the throttle act, as fractions of the log's chunks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CompactorConfig {
    /// Compact in the background while fewer chunks than this are free.
    pub start_free: f64,
    /// Below this, foreground writes are paced to compaction bandwidth.
    pub setpoint_free: f64,
    /// Longest a single write is delayed.
    pub max_delay: Duration,
}

impl Default for CompactorConfig {
    fn default() -> CompactorConfig {
        CompactorConfig { start_free: 0.5, setpoint_free: 0.25, max_delay: Duration::from_millis(100) }
    }
}

impl CompactorConfig {
    /// Refuse levels that are not shares of the log, or a set point above the start level.
    pub fn check(&self) -> Result<(), EngineError> {
        if !(0.0..=1.0).contains(&self.setpoint_free)
            || !(0.0..=1.0).contains(&self.start_free)
            || self.setpoint_free > self.start_free
        {
            return Err(EngineError::Config("compactor: need 0 ≤ setpoint ≤ start ≤ 1 (shares of the log)"));
        }
        Ok(())
    }
}

/// The background thread collects ahead of need: GC windows start while
/// free bands are this many above the inline GC level.
const GC_AHEAD_BANDS: usize = 2;

/// A background step walks this share of a chunk (compaction) or as many
/// blocks of a GC victim: 1 MiB of a 16 MiB chunk, a few ms under the lock.
pub(super) const STEP_PARTS: u64 = 16;

/// Longest pause of paced cleaning between two steps (a step cleans no more
/// than the rate allows in that time).
const CLEANING_PAUSE_MAX: Duration = Duration::from_secs(1);

/// What one background step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Work {
    Idle,
    Compacted,
    Collected,
    /// In place: dirty blocks written home ahead of need; then pause this
    /// long (cleaning paced by `CleaningRate`).
    Cleaned {
        pause: Duration,
    },
}

/// Shared by the engine's write path and its compactor thread.
pub(super) struct Background {
    pub(super) on: AtomicBool,
    /// Free log chunks as of the last change (read without the engine lock).
    pub(super) free_chunks: AtomicUsize,
    pub(super) start_chunks: AtomicUsize,
    pub(super) throttle: Mutex<Option<Throttle>>,
    stop: Mutex<bool>,
    wake: Condvar,
    /// The compactor is waiting on `wake` (set and cleared under `stop`):
    /// only then do writers notify, as every notify is a system call.
    asleep: AtomicBool,
    pub(super) compactions: AtomicU64,
    pub(super) gc_windows: AtomicU64,
    pub(super) compaction_ns: AtomicU64,
    /// Background work (compaction and GC steps) since the last chunk was
    /// freed: the next bandwidth sample's time.
    ns_unbilled: AtomicU64,
    /// `EngineStats::chunks_compacted` at the last bandwidth sample.
    billed_chunks: AtomicU64,
    pub(super) throttled_writes: AtomicU64,
    /// Victims the background GC reclaimed since its last compaction step.
    gc_reclaims_in_a_row: AtomicUsize,
    /// Compaction and GC windows read outside the engine lock and used.
    pub(super) windows_unlocked: AtomicU64,
    /// ... and read again under it (the chunk or band moved on meanwhile).
    pub(super) windows_reread: AtomicU64,
    /// Blocks a background step copied to the capacity device whose remap
    /// was dropped at settling: rewritten or trimmed while the copy was in
    /// flight, so the copy is garbage (still counted in the compaction or
    /// GC bytes written).
    pub(super) copies_superseded: AtomicU64,
    /// GC victims (background or inline) reclaimed without being read.
    pub(super) victims_unread: AtomicU64,
    pub(super) throttle_ns: AtomicU64,
    /// When the last request took the engine lock (ns since `Engine::epoch`).
    last_request_ns: AtomicU64,
    /// In place: the paced cleaning's controller, and its last rate (f64
    /// bits, bytes/s; 0 when cleaning is not paced).
    cleaning_rate: Mutex<super::cleaning::CleaningRate>,
    cleaning_rate_bits: AtomicU64,
}

impl Background {
    pub(super) fn new() -> Background {
        Background {
            on: AtomicBool::new(false),
            free_chunks: AtomicUsize::new(usize::MAX),
            start_chunks: AtomicUsize::new(0),
            throttle: Mutex::new(None),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            asleep: AtomicBool::new(false),
            compactions: AtomicU64::new(0),
            gc_windows: AtomicU64::new(0),
            ns_unbilled: AtomicU64::new(0),
            billed_chunks: AtomicU64::new(0),
            compaction_ns: AtomicU64::new(0),
            throttled_writes: AtomicU64::new(0),
            gc_reclaims_in_a_row: AtomicUsize::new(0),
            windows_unlocked: AtomicU64::new(0),
            windows_reread: AtomicU64::new(0),
            copies_superseded: AtomicU64::new(0),
            victims_unread: AtomicU64::new(0),
            throttle_ns: AtomicU64::new(0),
            last_request_ns: AtomicU64::new(0),
            cleaning_rate: Mutex::new(Default::default()),
            cleaning_rate_bits: AtomicU64::new(0),
        }
    }
}

/// What the compactor and the throttle have done (see [`Engine::snapshot`]).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CompactorSnapshot {
    pub running: bool,
    /// Chunks compacted by the background thread (the rest, in
    /// `EngineStats::chunks_compacted`, were compacted inline).
    pub compactions: u64,
    /// GC windows (chunk-sized reads of a victim band) done in the background.
    pub gc_windows: u64,
    /// Time the thread spent compacting and collecting (its reads outside
    /// the engine lock included).
    pub compaction_seconds: f64,
    /// Measured compaction bandwidth, bytes of log freed per second of work.
    pub bandwidth_bytes_per_s: f64,
    pub throttled_writes: u64,
    /// Compaction and GC windows read without the engine lock and used.
    pub windows_read_unlocked: u64,
    /// Windows read without the lock and then read again under it, because
    /// the chunk or band had moved on meanwhile.
    pub windows_reread: u64,
    /// Blocks background steps copied to the capacity device and then did
    /// not remap, because they were rewritten or trimmed while the copy was
    /// in flight (the copies are garbage; `EngineStats::compaction_bytes`
    /// and `gc_bytes` count what was written, these included).
    pub copies_superseded: u64,
    /// GC victims (inline ones included) reclaimed without reading them:
    /// nothing valid and no tombstone left in them.
    pub victims_unread: u64,
    pub throttle_seconds: f64,
    /// In place: the rate ALRU cleaning was last paced to (bytes/s), 0 when
    /// it is not paced (under the dirty set point, or another policy).
    pub cleaning_rate_bytes_per_s: f64,
}

/// The running compactor thread; dropping it stops and joins the thread.
pub struct Compactor {
    engine: Arc<Engine>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Compactor {
    fn drop(&mut self) {
        let bg = &self.engine.bg;
        *bg.stop.lock().expect("compactor stop") = true;
        bg.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        bg.on.store(false, Ordering::SeqCst);
        *bg.throttle.lock().expect("throttle") = None;
    }
}

impl Engine {
    /// Start compacting in the background (see the module doc). One
    /// compactor per engine.
    pub fn start_compactor(self: &Arc<Engine>, cfg: CompactorConfig) -> Result<Compactor, EngineError> {
        cfg.check()?;
        if self.bg.on.swap(true, Ordering::SeqCst) {
            return Err(EngineError::Config("a compactor is already running on this engine"));
        }
        let (chunks, floor, free) = {
            let inner = self.lock();
            (inner.log.chunk_count() - 1, inner.cfg.log_free_chunks_min, inner.log.free_len())
        };
        let start = ((chunks as f64 * cfg.start_free).ceil() as usize).max(floor + 2);
        let setpoint = (chunks as f64 * cfg.setpoint_free).max(floor as f64 + 1.0);
        self.bg.start_chunks.store(start, Ordering::SeqCst);
        self.bg.free_chunks.store(free, Ordering::SeqCst);
        *self.bg.throttle.lock().expect("throttle") = Some(Throttle::new(setpoint, floor as f64, cfg.max_delay));
        *self.bg.stop.lock().expect("compactor stop") = false;
        let engine = self.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-compactor".into())
            .spawn(move || engine.compactor_loop())
            .map_err(|e| EngineError::Device(DeviceError::Io { errno: e.raw_os_error().unwrap_or(0) }))?;
        Ok(Compactor { engine: self.clone(), thread: Some(thread) })
    }

    fn compactor_loop(&self) {
        let mut last = Work::Idle;
        loop {
            if *self.bg.stop.lock().expect("compactor stop") {
                return;
            }
            match self.background_step(last) {
                Ok(Work::Idle) => last = Work::Idle,
                Ok(w @ Work::Cleaned { pause }) if !pause.is_zero() => {
                    last = w;
                    self.pause(pause);
                    continue;
                }
                Ok(w) => {
                    last = w;
                    continue;
                }
                // Closed or failed: writes report it; nothing more to do here
                // until the engine is reopened.
                Err(VolumeError::ReadOnly) => break,
                // Anything else (NoSpace: the capacity device is full) may
                // pass as requests trim or rewrite: wait, then try again.
                Err(_) => last = Work::Idle,
            }
            // Writers notify only while `asleep` is set; a change between
            // the idle step and here waits for the timeout at worst.
            self.pause(Duration::from_millis(50));
        }
        // Stopped for good: writers are no longer paced to a rate nobody
        // measures, and the snapshot says so.
        self.bg.on.store(false, Ordering::SeqCst);
        *self.bg.throttle.lock().expect("throttle") = None;
    }

    /// Wait `pause` (idle, or paced cleaning), or less if the engine stops
    /// or writers need the log reclaimed (they notify while `asleep` is set).
    fn pause(&self, pause: Duration) {
        let stop = self.bg.stop.lock().expect("compactor stop");
        if *stop {
            return;
        }
        self.bg.asleep.store(true, Ordering::SeqCst);
        let stop = self.bg.wake.wait_timeout(stop, pause).map_or_else(|e| e.into_inner().0, |r| r.0);
        self.bg.asleep.store(false, Ordering::SeqCst);
        drop(stop);
    }

    /// The engine lock, for a request: its time noted, so that cleaning
    /// knows when requests pause. As it is, records in flight or not
    /// (`Engine::live` drains them).
    pub(super) fn lock_for_request(&self) -> std::sync::MutexGuard<'_, Inner> {
        let inner = self.lock_raw();
        if !self.bg.on.load(Ordering::Relaxed) {
            return inner;
        }
        self.bg.last_request_ns.store(self.clock.now_ns(), Ordering::Relaxed);
        inner
    }

    /// Which background work is due: a GC window when free bands run low
    /// (or a victim is half done), a chunk compaction when the log is below
    /// the start level — alternating when both are due, so neither starves
    /// and the inline paths (a whole band, many chunks) are left as safety
    /// valves only. GC goes first from one band above the inline level:
    /// compaction would otherwise reach it and collect a whole band under
    /// the lock.
    fn due(&self, inner: &Inner, last: Work) -> (bool, bool) {
        let start = self.bg.start_chunks.load(Ordering::Relaxed);
        let compact_due = inner.log.free_len() < start && inner.log.oldest_full().is_some();
        let (free_bands, gc_min) = (inner.bands.free_len(), inner.cfg.gc_free_bands_min);
        // In place there are no bands, and nothing to collect.
        let gc_due = !inner.in_place() && (inner.gc_cursor.is_some() || free_bands <= gc_min + GC_AHEAD_BANDS);
        // Urgent GC goes first for at most as many victims in a row as there
        // are bands (the bound `open_band` puts on inline GC): victims that
        // free no more than their relocation takes cannot starve compaction.
        let streak = self.bg.gc_reclaims_in_a_row.load(Ordering::Relaxed);
        let gc_urgent = free_bands <= gc_min + 1 && streak < inner.bands.len();
        (gc_due && (gc_urgent || last == Work::Compacted || !compact_due), compact_due)
    }

    /// One piece of background work (see `due`): its first read done
    /// without the engine lock when there is room for it (`preread`), the
    /// rest under one hold of the lock.
    fn background_step(&self, last: Work) -> Result<Work, VolumeError> {
        let t = self.clock.now_ns();
        let step_blocks = |inner: &Inner| (inner.blocks_per_chunk() / STEP_PARTS).max(1);
        // A GC step walks at least what it reads anyway (a largest
        // segment): what it relocates goes out packed into one segment per
        // volume. Walking less made segments no denser than the victim's
        // own, and on small bands GC could then reclaim victims forever
        // without freeing a block, starving compaction.
        let gc_blocks = |inner: &Inner| step_blocks(inner).max(inner.segment_blocks_max());
        let mut pre = self.preread(|inner| match self.due(inner, last) {
            (true, _) => inner.gc_window(gc_blocks(inner)),
            (false, true) => inner.compact_window(step_blocks(inner)),
            (false, false) => None,
        });
        let mut inner = self.lock_for_relocation();
        let made = inner.pendings_made;
        if inner.health.taking_changes().is_err() {
            return Err(VolumeError::ReadOnly);
        }
        let (gc, compact_due) = self.due(&inner, last);
        if (gc || compact_due) && crate::faults::armed("compactor-panic") {
            panic!("injected fault compactor-panic: the compactor panics holding the engine lock");
        }
        let (step_blocks, gc_blocks) = (step_blocks(&inner), gc_blocks(&inner));
        if gc {
            let r = self.gc_step(&mut inner, gc_blocks, &mut pre, true);
            match inner.stop_on_device_error(r)? {
                GcStep::Idle => {}
                done => {
                    if done == GcStep::Reclaimed {
                        self.bg.gc_reclaims_in_a_row.fetch_add(1, Ordering::Relaxed);
                    }
                    self.finish_step(inner, made)?;
                    let ns = self.clock.now_ns().saturating_sub(t);
                    self.bg.gc_windows.fetch_add(1, Ordering::Relaxed);
                    self.bg.compaction_ns.fetch_add(ns, Ordering::Relaxed);
                    self.bg.ns_unbilled.fetch_add(ns, Ordering::Relaxed);
                    return Ok(Work::Collected);
                }
            }
        }
        if !compact_due {
            // In place, with nothing to reclaim: clean ahead, if the policy
            // says a chunk is due (cleaning.rs).
            let now = self.clock.now_ns();
            let idle = Duration::from_nanos(now.saturating_sub(self.bg.last_request_ns.load(Ordering::Relaxed)));
            let Some(due) = inner.cleaning_due(idle) else {
                self.bg.cleaning_rate_bits.store(0, Ordering::Relaxed);
                return Ok(Work::Idle);
            };
            // Paced: a step of what the rate allows in `CLEANING_PAUSE_MAX`
            // at most, then a pause as long as the rate says it takes.
            let (mut blocks, mut rate) = (step_blocks, 0.0);
            if due.paced {
                let (dirty, total) = inner.dirty_blocks();
                let policy = inner.cleaning;
                rate = self.bg.cleaning_rate.lock().expect("cleaning rate").rate(now, dirty * BS, total * BS, &policy);
                let allowed = (rate * CLEANING_PAUSE_MAX.as_secs_f64()) as u64 / BS;
                blocks = blocks.min(allowed.max(1));
            }
            let (r, mut inner) = self.clean_chunk_ahead(inner, due.chunk, blocks);
            let cleaned = inner.stop_on_device_error(r)?;
            if cleaned > 0 {
                // What it cleaned: its homes durable, and claimed, so a
                // crash keeps them clean (residency.rs).
                let r = self.flush_capacity(&mut inner).and_then(|()| self.log_claims(&mut inner));
                inner.stop_on_device_error(r)?;
            }
            let pause = match due.paced {
                true => Duration::from_secs_f64((cleaned * BS) as f64 / rate).min(CLEANING_PAUSE_MAX),
                false => Duration::ZERO,
            };
            self.bg.cleaning_rate_bits.store(f64::to_bits(rate), Ordering::Relaxed);
            drop(inner);
            return Ok(Work::Cleaned { pause });
        }
        if inner.in_place() {
            // A reclaim's cleaning: its disk writes without the lock when
            // they can (home_flight.rs); the chunk is freed by a later step.
            let r = self.reclaim_begin(&mut inner, true);
            match inner.stop_on_device_error(r)? {
                None => return Ok(Work::Idle),
                Some(c) if inner.residency.dirty(c) > 0 => {
                    let (r, mut inner) = self.clean_chunk_ahead(inner, c, step_blocks);
                    inner.stop_on_device_error(r)?;
                    drop(inner);
                    // Billed to the chunk's reclaim, as any of its steps.
                    let ns = self.clock.now_ns().saturating_sub(t);
                    self.bg.compaction_ns.fetch_add(ns, Ordering::Relaxed);
                    self.bg.ns_unbilled.fetch_add(ns, Ordering::Relaxed);
                    return Ok(Work::Compacted);
                }
                Some(_) => {}
            }
        }
        let r = self.compact_step(&mut inner, step_blocks, &mut pre, true);
        let step = inner.stop_on_device_error(r)?;
        self.bg.gc_reclaims_in_a_row.store(0, Ordering::Relaxed);
        self.bg.free_chunks.store(inner.log.free_len(), Ordering::Relaxed);
        let freed = inner.cfg.chunk_bytes;
        let compacted = inner.stats.get().chunks_compacted;
        self.finish_step(inner, made)?;
        let ns = self.clock.now_ns().saturating_sub(t);
        self.bg.compaction_ns.fetch_add(ns, Ordering::Relaxed);
        self.bg.ns_unbilled.fetch_add(ns, Ordering::Relaxed);
        if step == CompactStep::Freed {
            self.bg.compactions.fetch_add(1, Ordering::Relaxed);
            // The log space a chunk frees costs its compaction steps and the
            // GC done meanwhile (the capacity space compaction needs):
            // writes are paced to both together.
            // A chunk freed inline since the last sample took foreground
            // time this thread did not see: skip the sample, start afresh.
            let work = self.bg.ns_unbilled.swap(0, Ordering::Relaxed);
            let inline = compacted - self.bg.billed_chunks.swap(compacted, Ordering::Relaxed) > 1;
            if let (false, Some(t)) = (inline, self.bg.throttle.lock().expect("throttle").as_mut()) {
                t.observe(freed, work);
            }
        }
        Ok(Work::Compacted)
    }

    /// After a step under `inner`: release the lock, let the step's segment
    /// writes complete without it, then (unless a request needed them
    /// settled first) apply their remaps.
    fn finish_step(&self, inner: std::sync::MutexGuard<'_, Inner>, made: u64) -> Result<(), VolumeError> {
        let pending = inner.pending_since(made);
        drop(inner);
        let Some(io) = pending else { return Ok(()) };
        self.reap_pending(&io);
        // Remaps only (each applied if its block did not move meanwhile):
        // beside the records in flight or not, as any relocation.
        let mut inner = self.lock_raw();
        let r = self.settle(&mut inner);
        inner.stop_on_device_error(r)
    }

    /// One bounded GC step, as the background compactor takes them: the
    /// victim in progress (or a new one) walked for at least one segment and
    /// up to `blocks_max` blocks. False if there was nothing to collect.
    /// Simulations call it between requests to put half-collected victims
    /// under reads, writes, trims and crashes.
    pub fn collect_some(&self, blocks_max: u64) -> Result<bool, VolumeError> {
        let step = self.step_in_phases(
            |inner| inner.gc_window(blocks_max),
            |e, inner, pre| e.gc_step(inner, blocks_max, pre, true),
        )?;
        self.relocate(true, |e, inner| e.settle(inner))?;
        Ok(step != GcStep::Idle)
    }

    /// One bounded compaction step of the oldest full chunk (at least one
    /// record, up to `blocks_max` blocks of it). False if no chunk is full.
    /// Simulations call it between requests, like `collect_some`.
    pub fn compact_some(&self, blocks_max: u64) -> Result<bool, VolumeError> {
        let step = self.compact_some_leaving_remaps(blocks_max)?;
        self.relocate(true, |e, inner| e.settle(inner))?;
        Ok(step)
    }

    /// `compact_some`, but the step's remaps stay pending (its writes
    /// completed) until a later request settles them: simulations put
    /// writes, trims, reads, GC and crashes between a compaction's writes
    /// and its remaps, which the background compactor's unlocked wait
    /// allows in any order.
    pub fn compact_some_leaving_remaps(&self, blocks_max: u64) -> Result<bool, VolumeError> {
        let step = self.step_in_phases(
            |inner| inner.compact_window(blocks_max),
            |e, inner, pre| e.compact_step(inner, blocks_max, pre, true),
        )?;
        Ok(step != CompactStep::Idle)
    }

    /// A bounded step in the background compactor's phases: the window
    /// `plan` names read without the lock, the step under it, and its
    /// deferred writes reaped without it. The remaps stay pending for the
    /// caller (or any later request) to settle.
    fn step_in_phases<S>(
        &self,
        plan: impl FnOnce(&Inner) -> Option<Window>,
        step: impl FnOnce(&Engine, &mut Inner, &mut Option<PreRead>) -> Result<S, VolumeError>,
    ) -> Result<S, VolumeError> {
        let mut pre = self.preread(plan);
        let mut pending = None;
        let done = self.relocate(false, |e, inner| {
            let made = inner.pendings_made;
            let done = step(e, inner, &mut pre)?;
            pending = inner.pending_since(made);
            Ok(done)
        })?;
        if let Some(io) = pending {
            self.reap_pending(&io);
        }
        Ok(done)
    }

    /// Before a write of `bytes` (outside the engine lock): wait as long as
    /// the throttle says.
    pub(super) fn pace_write(&self, bytes: u64) {
        if !self.bg.on.load(Ordering::Relaxed) {
            return;
        }
        let free = self.bg.free_chunks.load(Ordering::Relaxed);
        let delay = {
            let mut t = self.bg.throttle.lock().expect("throttle");
            let Some(t) = t.as_mut() else { return };
            t.admit(self.clock.now_ns(), bytes, free)
        };
        if delay > 0 {
            self.bg.throttled_writes.fetch_add(1, Ordering::Relaxed);
            self.bg.throttle_ns.fetch_add(delay, Ordering::Relaxed);
            std::thread::sleep(Duration::from_nanos(delay));
        }
    }

    /// After a change (under the engine lock): publish the free level and
    /// wake the compactor if the log fell below its start level.
    pub(super) fn after_change(&self, inner: &Inner) {
        if !self.bg.on.load(Ordering::Relaxed) {
            return;
        }
        let free = inner.log.free_len();
        self.bg.free_chunks.store(free, Ordering::SeqCst);
        if free < self.bg.start_chunks.load(Ordering::Relaxed) && self.bg.asleep.load(Ordering::SeqCst) {
            // The compactor sets `asleep` holding `stop` until its wait
            // releases it: taking `stop` orders this notify after the wait
            // began, so it cannot be lost.
            drop(self.bg.stop.lock().unwrap_or_else(PoisonError::into_inner));
            self.bg.wake.notify_one();
        }
    }

    pub(super) fn compactor_snapshot(&self) -> CompactorSnapshot {
        let bg = &self.bg;
        CompactorSnapshot {
            running: bg.on.load(Ordering::Relaxed),
            compactions: bg.compactions.load(Ordering::Relaxed),
            gc_windows: bg.gc_windows.load(Ordering::Relaxed),
            compaction_seconds: bg.compaction_ns.load(Ordering::Relaxed) as f64 / 1e9,
            bandwidth_bytes_per_s: bg.throttle.lock().expect("throttle").as_ref().map_or(0.0, |t| t.bandwidth()),
            throttled_writes: bg.throttled_writes.load(Ordering::Relaxed),
            windows_read_unlocked: bg.windows_unlocked.load(Ordering::Relaxed),
            windows_reread: bg.windows_reread.load(Ordering::Relaxed),
            copies_superseded: bg.copies_superseded.load(Ordering::Relaxed),
            victims_unread: bg.victims_unread.load(Ordering::Relaxed),
            throttle_seconds: bg.throttle_ns.load(Ordering::Relaxed) as f64 / 1e9,
            cleaning_rate_bytes_per_s: f64::from_bits(bg.cleaning_rate_bits.load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::*;
    use crate::testkit::{assert_reads_as, pattern, small_world};
    use crate::volume::Volume;
    use sluice_media::rng::SplitMix64 as Rng;

    /// Poll `cond` for up to 20 s (a loaded CI machine may be slow; the
    /// outcome, not the time, is what is asserted).
    fn eventually(mut cond: impl FnMut() -> bool) -> bool {
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_secs(20) {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn idle_time_refills_the_log_in_the_background() {
        let w = small_world(&[400]);
        let c = w.engine.start_compactor(CompactorConfig::default()).unwrap();
        assert!(matches!(w.engine.start_compactor(CompactorConfig::default()), Err(EngineError::Config(_))));
        // Fill the log to its floor without pausing: 7 chunks of 64 blocks.
        for lba in 0..380u64 {
            w.volumes[0].write(lba * 4096, &pattern(0, lba, 1), false).unwrap();
        }
        // Then nobody writes: the compactor alone brings the log back above
        // its start level (4 of 7 chunks free).
        let free = || w.engine.snapshot().log_chunks_free;
        let ok = eventually(|| free() >= 4);
        assert!(ok, "free chunks stayed at {}: {:?}", free(), w.engine.snapshot().compactor);
        let snap = w.engine.snapshot();
        assert!(snap.compactor.running && snap.compactor.compactions > 0, "{:?}", snap.compactor);
        assert!(snap.compactor.bandwidth_bytes_per_s > 0.0);
        for lba in 0..380u64 {
            let mut b = vec![0u8; 4096];
            w.volumes[0].read(lba * 4096, &mut b).unwrap();
            assert!(b == pattern(0, lba, 1), "block {lba}");
        }
        drop(c);
        assert!(!w.engine.snapshot().compactor.running);
        w.engine.check_invariants();
        w.engine.shutdown().unwrap();
    }

    #[test]
    fn writers_racing_the_compactor_lose_nothing() {
        let w = small_world(&[256, 256]);
        let cfg = CompactorConfig { max_delay: Duration::from_millis(2), ..Default::default() };
        let c = w.engine.start_compactor(cfg).unwrap();
        let models: Vec<Vec<u64>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2usize)
                .map(|v| {
                    let vol = &w.volumes[v];
                    s.spawn(move || {
                        let mut rng = Rng(v as u64 + 1);
                        let mut model = vec![0u64; 256];
                        for i in 1..=3000u64 {
                            let lba = rng.below(256);
                            vol.write(lba * 4096, &pattern(v, lba, i), false).unwrap();
                            model[lba as usize] = i;
                        }
                        model
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        drop(c);
        assert_reads_as(&w, &models);
        let s = w.engine.stats();
        assert!(s.chunks_compacted > 20 && s.bands_reclaimed > 0, "{s:?}");
        w.engine.check_invariants();
    }

    #[test]
    fn reads_racing_writers_compaction_and_gc_see_only_their_blocks() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let w = small_world(&[256, 256]);
        let cfg = CompactorConfig { max_delay: Duration::from_millis(2), ..Default::default() };
        let c = w.engine.start_compactor(cfg).unwrap();
        // Per block: the newest version whose write was acknowledged.
        let acked: Vec<Vec<AtomicU64>> = (0..2).map(|_| (0..256).map(|_| AtomicU64::new(0)).collect()).collect();
        let done = AtomicBool::new(false);
        let reads = AtomicU64::new(0);
        std::thread::scope(|s| {
            for r in 0..2u64 {
                let (w, acked, done, reads) = (&w, &acked, &done, &reads);
                s.spawn(move || {
                    let mut rng = Rng(100 + r);
                    let mut b = vec![0u8; 4096];
                    while !done.load(Ordering::Relaxed) {
                        let (v, lba) = (rng.below(2) as usize, rng.below(256));
                        let floor = acked[v][lba as usize].load(Ordering::SeqCst);
                        w.volumes[v].read(lba * 4096, &mut b).unwrap();
                        // Whatever version came back must be this block's own,
                        // and no older than what was acknowledged before.
                        let first = u64::from_le_bytes(b[..8].try_into().unwrap());
                        let ver = first ^ (v as u64) << 56 ^ lba << 20;
                        let ok = if b.iter().all(|&x| x == 0) {
                            floor == 0
                        } else {
                            ver >= floor && b == pattern(v, lba, ver)
                        };
                        assert!(ok, "volume {v} block {lba}: read version {ver}, acknowledged {floor}");
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
            let writers: Vec<_> = (0..2usize)
                .map(|v| {
                    let (vol, acked) = (&w.volumes[v], &acked);
                    s.spawn(move || {
                        let mut rng = Rng(v as u64 + 1);
                        for i in 1..=20_000u64 {
                            let lba = rng.below(256);
                            vol.write(lba * 4096, &pattern(v, lba, i), false).unwrap();
                            acked[v][lba as usize].fetch_max(i, Ordering::SeqCst);
                        }
                    })
                })
                .collect();
            writers.into_iter().for_each(|h| h.join().unwrap());
            done.store(true, Ordering::Relaxed);
        });
        drop(c);
        let s = w.engine.stats();
        assert!(s.chunks_compacted > 20 && s.bands_reclaimed > 0, "{s:?}");
        assert!(reads.load(Ordering::Relaxed) > 1000, "the readers ran alongside");
        w.engine.check_invariants();
    }

    #[test]
    fn the_compactor_stops_by_itself_when_the_engine_shuts_down() {
        let w = small_world(&[64]);
        let c = w.engine.start_compactor(CompactorConfig::default()).unwrap();
        w.volumes[0].write(0, &pattern(0, 0, 1), false).unwrap();
        w.engine.shutdown().unwrap();
        assert!(eventually(|| !w.engine.snapshot().compactor.running), "still running after shutdown");
        // Writes are refused, not paced against a rate nobody measures.
        assert_eq!(w.volumes[0].write(0, &pattern(0, 0, 2), false), Err(VolumeError::ReadOnly));
        drop(c);
    }

    #[test]
    fn a_bad_configuration_is_refused() {
        let w = small_world(&[64]);
        let bad = CompactorConfig { start_free: 0.2, setpoint_free: 0.5, ..Default::default() };
        assert!(matches!(w.engine.start_compactor(bad), Err(EngineError::Config(_))));
        assert!(!w.engine.snapshot().compactor.running);
    }
}
