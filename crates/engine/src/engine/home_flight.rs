//! Home writes of a cleaning step done without the engine lock (`Engine::
//! clean_ahead`: `clean_others`, and the background compactor's cleaning
//! of a reclaim's chunk or of chunks ACP/ALRU picks): the disk writes that
//! take most of a cleaning step's time no longer hold every request behind
//! them. A reclaim a writer waits for still cleans under the lock.
//!
//! Owns which homes such a step is writing (`HomeFlight`, in `Inner`, under
//! the engine lock) and when its writes completed (`HomesDone`, in
//! `Engine`, behind a lock of its own that the step's writer signals
//! without the engine lock).
//!
//! Invariants:
//! - at most one step is in flight (a second caller cleans under the lock);
//! - while one is, every other write of the disk that overlaps its homes
//!   waits until its writes completed (`Engine::disk_write`), as does every
//!   capacity flush; a write past the log over them is not deferred
//!   (caching.rs), and a read that found them at home promotes nothing: the
//!   disk receives overlapping writes in the engine's order, and no clean
//!   copy is taken of a home about to change;
//! - a block of the step is marked clean only after its write completed,
//!   and only if its cache block still holds the same current copy (chunk
//!   epoch, owner, map): one overwritten, trimmed or reclaimed meanwhile is
//!   left as it is (its home got the older bytes, which its dirty copy or
//!   a later write supersedes, as when cleaning raced nothing).
//!
//! Crash safety is cleaning's: nothing is marked clean before its home is
//! written, and nothing is claimed clean before a disk flush after that.

use super::cleaning::{write_queued, CleanJob};
use super::{Engine, Inner, VolumeError};
use std::sync::{Condvar, Mutex, PoisonError};

/// Most home writes of an unlocked step in flight at once: device-queue
/// permits it takes beside the caller's, as unlocked reads do, when free.
const UNLOCKED_DEPTH: usize = 8;

/// How `Engine::clean_ahead` went: done under the lock, or prepared for
/// writing without it.
pub(super) enum Ahead {
    /// Blocks cleaned under the lock.
    Done(u64),
    /// Home writes to do without the lock, as step `n`.
    Unlocked(CleanJob, u64),
}

impl Engine {
    /// Under the lock: clean `todo` (volume, LBA, cache block; current,
    /// dirty, sorted by cache block) — with the disk writes left for the
    /// caller to do without the lock (`Ahead::Unlocked`, then
    /// `write_unlocked` and `finish_unlocked`) when `unlocked` (the caller
    /// holds a device-queue permit), the engine runs in real time, no other
    /// step is in flight and the disk is not an attached one whose sampled
    /// blocks must be recorded write by write; otherwise all of it now.
    pub(super) fn clean_ahead(
        &self,
        inner: &mut Inner,
        todo: &[(u32, u64, u64)],
        unlocked: bool,
    ) -> Result<Ahead, VolumeError> {
        if todo.is_empty() {
            return Ok(Ahead::Done(0));
        }
        if !unlocked || inner.serial() || inner.disk_id.is_some() || inner.home_flight.in_flight().is_some() {
            let bpc = inner.blocks_per_chunk();
            let mut n = 0;
            for chunk in todo.chunk_by(|a, b| a.2 / bpc == b.2 / bpc) {
                n += self.clean_listed(inner, chunk)?;
            }
            return Ok(Ahead::Done(n));
        }
        let job = self.prepare_clean(inner, todo)?;
        job.begin_sums(inner)?;
        let n = inner.home_flight.begin(job.ranges());
        Ok(Ahead::Unlocked(job, n))
    }

    /// The background compactor's cleaning of at most `blocks_max` dirty
    /// blocks of chunk `c` (ahead of need, or a reclaim's), holding the
    /// lock `inner`: with the disk writes done without it when
    /// `clean_ahead` allows. Returns the blocks cleaned and the lock, held
    /// again.
    pub(super) fn clean_chunk_ahead<'a>(
        &'a self,
        mut inner: std::sync::MutexGuard<'a, Inner>,
        c: super::ChunkId,
        blocks_max: u64,
    ) -> (Result<u64, VolumeError>, std::sync::MutexGuard<'a, Inner>) {
        let todo = inner.dirty_of(c, blocks_max);
        let permit = self.unlocked_read_permit();
        match self.clean_ahead(&mut inner, &todo, permit.is_some()) {
            Err(e) => (Err(e), inner),
            Ok(Ahead::Done(n)) => (Ok(n), inner),
            Ok(Ahead::Unlocked(job, step)) => {
                drop(inner);
                self.complete_unlocked(job, step, permit)
            }
        }
    }

    /// Step `n` (`Ahead::Unlocked`), the engine lock not held: its runs
    /// written (`write_unlocked`), the device-queue permit given back, then
    /// under the lock, taken again, ended (`finish_unlocked`). Returns the
    /// blocks marked clean and the lock.
    pub(super) fn complete_unlocked(
        &self,
        job: CleanJob,
        n: u64,
        permit: Option<super::read::ReadPermit<'_>>,
    ) -> (Result<u64, VolumeError>, std::sync::MutexGuard<'_, Inner>) {
        let written = self.write_unlocked(&job, n);
        drop(permit);
        let mut inner = self.lock_raw();
        let r = self.finish_unlocked(&mut inner, job, n, written);
        (r, inner)
    }

    /// Without the lock: write step `n`'s runs home, as many in flight as
    /// device-queue permits allow (the caller's, and up to
    /// `UNLOCKED_DEPTH - 1` more taken now, given back after), so an HDD's
    /// NCQ orders them; then signal that its writes are over. Returns each
    /// run's result, in order.
    pub(super) fn write_unlocked(&self, job: &CleanJob, n: u64) -> Vec<Result<(), VolumeError>> {
        let more: Vec<_> = (1..UNLOCKED_DEPTH).map_while(|_| self.unlocked_read_permit()).collect();
        let results = write_queued(&*self.capacity, &job.writes(), 1 + more.len());
        drop(more);
        self.homes_done.finished(n);
        results.into_iter().map(|r| r.map_err(VolumeError::from)).collect()
    }

    /// Under the lock again, after `write_unlocked`: step `n` ends; its
    /// written runs are counted, and each of their blocks whose cache block
    /// still holds the same current copy, dirty, is marked clean (unless
    /// the engine stopped meanwhile). A run that failed leaves its blocks
    /// dirty, and the first error stops the engine. Returns the blocks
    /// marked clean.
    pub(super) fn finish_unlocked(
        &self,
        inner: &mut Inner,
        job: CleanJob,
        n: u64,
        results: Vec<Result<(), VolumeError>>,
    ) -> Result<u64, VolumeError> {
        inner.home_flight.end(n);
        job.end_sums(inner, &results);
        let bpc = inner.blocks_per_chunk();
        // A read that looked at these homes before now promotes nothing.
        for run in &job.runs {
            for &(v, ..) in &run.blocks {
                inner.vols[v as usize].cache.home_changed();
            }
        }
        if results.iter().any(|r| r.is_ok()) {
            inner.cap.wrote();
        }
        let first_err = results.iter().find_map(|r| r.as_ref().err().cloned()).map_or(Ok(()), Err);
        if inner.taking_changes().is_err() {
            return first_err.map(|()| 0);
        }
        let mut cleaned = 0;
        for (run, _) in job.runs.iter().zip(&results).filter(|(_, r)| r.is_ok()) {
            run.count(inner);
            for &(v, lba, cb, epoch) in &run.blocks {
                let c = super::ChunkId((cb / bpc) as u32);
                let same = inner.log.chunk(c).epoch() == epoch
                    && inner.log.owner_of(cb) == Some((v, lba))
                    && inner.vols[v as usize].l2p.get(lba as usize)?.cache_block() == Some(cb);
                if same && !inner.residency.is_clean(cb) {
                    inner.mark_clean(cb);
                    cleaned += 1;
                }
            }
        }
        inner.stop_on_device_error(first_err).map(|()| cleaned)
    }
}

/// The step in flight, if any: its number and the homes it writes, as
/// sorted, disjoint `[first, end)` block ranges of the capacity device.
#[derive(Debug, Default)]
pub(super) struct HomeFlight {
    step: Option<(u64, Vec<(u64, u64)>)>,
    started: u64,
}

impl HomeFlight {
    /// A step writing `ranges` (sorted, disjoint) begins; returns its number.
    pub(super) fn begin(&mut self, ranges: Vec<(u64, u64)>) -> u64 {
        assert!(self.step.is_none(), "one home-write step in flight at a time");
        assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "sorted, disjoint ranges");
        self.started += 1;
        self.step = Some((self.started, ranges));
        self.started
    }

    /// The step in flight if it writes any of `blocks` blocks from `first`.
    pub(super) fn overlapping(&self, first: u64, blocks: u64) -> Option<u64> {
        let (n, ranges) = self.step.as_ref()?;
        let end = first + blocks;
        let i = ranges.partition_point(|r| r.1 <= first);
        (i < ranges.len() && ranges[i].0 < end).then_some(*n)
    }

    /// The step in flight, whatever it writes.
    pub(super) fn in_flight(&self) -> Option<u64> {
        self.step.as_ref().map(|s| s.0)
    }

    /// Step `n` is over (its writes completed or failed).
    pub(super) fn end(&mut self, n: u64) {
        assert_eq!(self.step.as_ref().map(|s| s.0), Some(n), "the step in flight ends");
        self.step = None;
    }
}

/// The last step whose writes completed, signalled without the engine lock.
#[derive(Debug, Default)]
pub(super) struct HomesDone {
    done: Mutex<u64>,
    cv: Condvar,
}

impl HomesDone {
    /// Step `n`'s writes completed (or failed).
    pub(super) fn finished(&self, n: u64) {
        let mut d = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(*d < n, "steps finish in order");
        *d = n;
        self.cv.notify_all();
    }

    /// Wait until step `n`'s writes completed.
    pub(super) fn wait(&self, n: u64) {
        let mut d = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        while *d < n {
            d = self.cv.wait(d).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_overlaps_exactly_the_homes_it_writes() {
        let mut f = HomeFlight::default();
        assert_eq!(f.overlapping(0, 100), None);
        let n = f.begin(vec![(10, 20), (30, 31)]);
        assert_eq!(f.in_flight(), Some(n));
        assert_eq!(f.overlapping(0, 10), None);
        assert_eq!(f.overlapping(0, 11), Some(n));
        assert_eq!(f.overlapping(19, 1), Some(n));
        assert_eq!(f.overlapping(20, 10), None);
        assert_eq!(f.overlapping(25, 6), Some(n));
        assert_eq!(f.overlapping(31, 5), None);
        f.end(n);
        assert_eq!(f.overlapping(10, 1), None);
        assert_eq!(f.begin(vec![(0, 1)]), n + 1);
    }

    #[test]
    #[should_panic(expected = "one home-write step in flight at a time")]
    fn two_steps_never_fly_at_once() {
        let mut f = HomeFlight::default();
        f.begin(vec![(0, 1)]);
        f.begin(vec![(2, 3)]);
    }

    #[test]
    fn a_waiter_wakes_when_its_step_finishes() {
        let d = std::sync::Arc::new(HomesDone::default());
        let d2 = d.clone();
        let t = std::thread::spawn(move || d2.wait(2));
        d.finished(1);
        d.finished(2);
        t.join().unwrap();
        d.wait(1);
    }
}
