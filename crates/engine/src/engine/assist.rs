//! Writers compacting: with no background compactor, the writers keep the
//! log's free chunks up themselves, a bounded step at a time, most of each
//! step outside the engine lock, so that one writer compacts while the
//! others write.
//!
//! Owns: when a writer takes a step (`Engine::assist_due`) and the step
//! (`Engine::assist`). A step is the background compactor's, in the same
//! phases: its window read without the lock (`Engine::preread`; of a chunk
//! whose record headers are known, only the headers), the walk and the
//! segments' places under it (`compact_step`, deferred), the blocks read
//! or copied into the segments, written and reaped without it, and the
//! remaps applied under it (`Engine::settle_one`). GC steps (`gc_step`,
//! deferred) are taken the same way once free bands are at the inline GC
//! level, alternating with compaction, so that no compaction step collects
//! a whole band under the lock as it opens one.
//!
//! Invariants:
//! - **One step planned, read and walked at a time** (`Inner::assisting`,
//!   set from the plan to the end of the walk): two writers never read the
//!   same window. The filling and writing of one step overlap the next
//!   step's read and walk (`Inner::pending` holds both; steps pending
//!   together moved different blocks). A second writer that finds the log
//!   short meanwhile writes on while there is room, then waits for the walk
//!   to end (`Engine::log_space_or_busy`) rather than compact a whole
//!   chunk under the lock.
//! - **Never with records of its own in flight**: a writer steps before it
//!   reserves a wave, so it never waits for records that wait for it.
//! - **Beside records in flight only as any relocation is**
//!   (`Inner::relocations_clear`, writers.rs); otherwise no step is taken
//!   (`Assist::Blocked`), and a writer short of room waits for a publish.
//! - **Steps of at least a largest segment**: a step's moved blocks go out
//!   as segments padded to the write unit.
//!
//! Why: compaction under the lock (inline, whole chunks) was half of a
//! writer's time on memory devices, and that half ran on one core whatever
//! the number of writers; the writers' own steps move the reading, copying
//! and writing of it out of the lock, as the background compactor does.
//! `Engine::set_writer_steps(false)` restores whole-chunk compaction under
//! the lock.

use super::gc::GcStep;
use super::worker::STEP_PARTS;
use super::{Engine, Inner, VolumeError};
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

/// Free log chunks above the minimum (`log_free_chunks_min`) at which
/// writers start taking steps: ahead of the minimum, where a writer would
/// have to compact a whole chunk under the lock.
const ASSIST_CHUNKS: usize = 2;

/// What a writer's compaction step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Assist {
    Stepped,
    /// Records in flight rewrite blocks the step would move: none taken.
    Blocked,
}

/// A writer's steps for one batch, bounded: a step that leaves neither
/// more free log chunks nor more free bands than the writer has seen is
/// fruitless, and after `fruitless_max` of them in a row the writer takes
/// no more (the inline path then compacts under the lock, bounded, or
/// reports no space). Without the bound a full engine whose steps only
/// moved data around (GC carrying live tombstones from band to band in a
/// world of 4-block bands) spun forever in one write: `sluice sim
/// --swarm` seed 300.
pub(super) struct StepGain {
    best: usize,
    fruitless: usize,
    fruitless_max: usize,
}

impl StepGain {
    pub(super) fn new(g: &Inner) -> StepGain {
        // Enough steps to walk every chunk and every band a few times over.
        let walks = (g.log.chunk_count() + g.bands.len()) * STEP_PARTS as usize;
        StepGain { best: Self::free(g), fruitless: 0, fruitless_max: 4 * walks }
    }

    fn free(g: &Inner) -> usize {
        g.log.free_len() + g.bands.free_len()
    }

    pub(super) fn after_step(&mut self, g: &Inner) {
        let free = Self::free(g);
        match free > self.best {
            true => (self.best, self.fruitless) = (free, 0),
            false => self.fruitless += 1,
        }
    }

    pub(super) fn exhausted(&self) -> bool {
        self.fruitless >= self.fruitless_max
    }
}

impl Engine {
    /// Whether a writer about to reserve (holding `g`, no record of its
    /// own in flight) should take a compaction step first: the log is
    /// short, no step is under way, no background compactor runs, on a
    /// the concurrent schedule, with bands. `again`: it stepped already for this batch
    /// (then only at the log's minimum).
    pub(super) fn assist_due(&self, g: &Inner, again: bool) -> bool {
        let (free, min) = (g.log.free_len(), g.cfg.log_free_chunks_min);
        free <= min + ASSIST_CHUNKS
            && (!again || free <= min)
            && g.writer_steps
            && !g.assisting
            && g.log.oldest_full().is_some()
            && !g.serial()
            && !g.in_place()
            && !self.bg.on.load(Ordering::Relaxed)
    }

    /// Whether writers take compaction and GC steps when the log runs short
    /// and no background compactor runs (on by default; not persisted).
    /// Off, a writer that finds the log at its minimum compacts a whole
    /// chunk under the lock, as every writer did before: tests that count
    /// what inline compaction does turn it off.
    pub fn set_writer_steps(&self, on: bool) {
        self.lock_raw().writer_steps = on;
    }

    /// Take one compaction step in phases (see the module doc); returns
    /// the lock, taken again, and what the step did.
    pub(super) fn assist<'a>(
        &'a self,
        mut g: MutexGuard<'a, Inner>,
    ) -> (MutexGuard<'a, Inner>, Result<Assist, VolumeError>) {
        // Blocked already: no window read for nothing (in the 2-thread
        // bench one attempt in ten or so is).
        if !g.relocations_clear() {
            return (g, Ok(Assist::Blocked));
        }
        assert!(!g.assisting, "one writer's step planned, read and walked at a time");
        g.assisting = true;
        // A step walks 1/16 of a chunk, and at least a largest segment: the
        // blocks it moves go out as segments padded to the write unit, and
        // a chunk of 64 blocks taken 4 at a time wrote seven times as much
        // padding as data (for GC, worker.rs says more).
        let blocks = (g.blocks_per_chunk() / STEP_PARTS).max(g.segment_blocks_max());
        // GC from the inline level (where compaction would collect a whole
        // band under the lock as it opens one), alternating with compaction
        // unless bands are below it. (From a band earlier, tiny engines ran
        // out of space: `sluice sim --swarm` seed 2.)
        let (free_bands, gc_min) = (g.bands.free_len(), g.cfg.gc_free_bands_min);
        let gc_due = g.gc_cursor.is_some() || free_bands <= gc_min;
        let gc = gc_due && (free_bands < gc_min || !g.assist_last_gc);
        g.assist_last_gc = gc;
        drop(g);
        let mut pre = self.preread(|inner| match gc {
            true => inner.gc_window(blocks),
            false => inner.compact_window(blocks),
        });
        let mut g = self.lock_raw();
        let made = g.pendings_made;
        let mut r = (|| {
            g.taking_changes()?;
            if !g.relocations_clear() {
                return Ok(Assist::Blocked);
            }
            if gc {
                let r = self.gc_step(&mut g, blocks, &mut pre, true);
                if g.stop_on_device_error(r)? != GcStep::Idle {
                    return Ok(Assist::Stepped);
                }
            }
            let r = self.compact_step(&mut g, blocks, &mut pre, true);
            g.stop_on_device_error(r)?;
            Ok(Assist::Stepped)
        })();
        if let Some(p) = pre.take() {
            g.give_buf(p.into_buf());
        }
        self.after_change(&g);
        // The next writer may plan, read and walk its step while this one
        // fills and writes (`compact_step` leaves this one pending beside
        // its own; a GC step, a zoned device or a third step settles it
        // first, waiting for these writes, which need no lock).
        assert!(g.assisting, "the step ends that began");
        g.assisting = false;
        if g.waiting > 0 {
            self.published.notify_all();
        }
        if let (Ok(Assist::Stepped), Some(io)) = (&r, g.pending_since(made)) {
            drop(g);
            self.reap_pending(&io);
            g = self.lock_raw();
            // Unless a later step (or anything else) settled it already.
            let settled = self.settle_one(&mut g, &io);
            r = g.stop_on_device_error(settled).and(r);
        }
        (g, r)
    }
}
