//! Compaction and GC reads outside the engine lock: the window a step will
//! read, read beforehand (`Engine::preread`) and used only if the step
//! reads that window of the same generation (`Engine::read_window`), whole
//! or as the runs of it that matter (`read_runs`, `read_pieces`). A step's
//! writes left in flight with their remaps are pending.rs's.
//!
//! Why: on slow media a step's reads took milliseconds under the lock every
//! request waits for. Invariant: a pre-read is used only for the same
//! window and generation (a full chunk or band changes only after reuse,
//! and reuse changes the generation first; a chunk holding a record in
//! flight is not pre-read, as that record is still to be written).

use super::pool::read_pooled;
use super::{
    sync_io, BlockDevice, ChunkId, DeviceError, Engine, Inner, IoBuf, IoOp, IoRequest, VolumeError, BS, CAP_QUEUE_DEPTH,
};

/// The next read a compaction or GC step will make: `len` bytes at
/// `offset` of the cache (a full chunk) or the capacity device (a victim
/// band), and the generation of that chunk or band when it was planned.
/// `headers_only`: of a chunk whose record headers are known
/// (`Chunk::headers`), a deferred step reads only those; the blocks it
/// moves are read when its segments are filled (`Fill::Cache`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Window {
    pub(super) cache: bool,
    pub(super) offset: u64,
    pub(super) len: usize,
    pub(super) gen: u64,
    pub(super) headers_only: bool,
}

/// A window read outside the engine lock ahead of its step. The bytes are
/// the step's if the step reads the same window of the same generation: a
/// full chunk and a full band change only after they are reused, and reuse
/// changes the generation first (chunk epoch, band `gen`).
pub(super) struct PreRead {
    win: Window,
    buf: IoBuf,
}

impl PreRead {
    pub(super) fn into_buf(self) -> IoBuf {
        self.buf
    }
}

impl Engine {
    /// Read the window `plan` names (under the lock) without the lock, for
    /// the step that follows; None if there is no window, no room for a
    /// read outside the lock, or the read failed (the step then reads, and
    /// reports any error, under the lock).
    pub(super) fn preread(&self, plan: impl FnOnce(&Inner) -> Option<Window>) -> Option<PreRead> {
        let _permit = self.unlocked_read_permit()?;
        let (win, buf, runs) = {
            // Planning only: records in flight or not. But a full chunk
            // still changes while a record reserved in it before it filled
            // is being written: no pre-read of such a chunk.
            let mut inner = self.lock_raw();
            if inner.health.taking_changes().is_err() {
                return None;
            }
            let win = plan(&inner)?;
            let chunk = (win.offset / BS / inner.blocks_per_chunk()) as u32;
            if win.cache && inner.log.inflight().values().any(|f| f.chunk.0 == chunk) {
                return None;
            }
            (win, inner.take_buf(win.len), inner.window_runs(&win))
        };
        let dev = if win.cache { &*self.cache } else { &*self.capacity };
        if let Some(runs) = runs {
            // A few more requests in flight if the unlocked-read budget
            // has room (each permit is one request).
            let more: Vec<_> = (0..7).map_while(|_| self.unlocked_read_permit()).collect();
            let mut buf = buf;
            let ok = read_runs(dev, win.offset, &runs, &mut buf, 1 + more.len(), win.headers_only).is_ok();
            return ok.then_some(PreRead { win, buf });
        }
        let req = IoRequest { op: IoOp::Read, offset: win.offset, len: win.len as u64, buf, fua: false, user_data: 0 };
        let c = sync_io(dev, req);
        c.result.is_ok().then_some(PreRead { win, buf: c.buf })
    }

    /// The step's read of `win`: the pre-read if it is that window of the
    /// same generation, else a read now (a pre-read that does not match
    /// goes back to the pool).
    pub(super) fn read_window(
        &self,
        inner: &mut Inner,
        pre: &mut Option<PreRead>,
        win: Window,
    ) -> Result<IoBuf, VolumeError> {
        if let Some(p) = pre.take() {
            use std::sync::atomic::Ordering::Relaxed;
            if p.win == win {
                self.bg.windows_unlocked.fetch_add(1, Relaxed);
                return Ok(p.buf);
            }
            self.bg.windows_reread.fetch_add(1, Relaxed);
            inner.give_buf(p.buf);
        }
        let dev = if win.cache { &*self.cache } else { &*self.capacity };
        if let Some(runs) = inner.window_runs(&win) {
            let mut buf = inner.take_buf(win.len);
            // Under the lock: within the lock holder's own queue budget.
            if let Err(e) = read_runs(dev, win.offset, &runs, &mut buf, CAP_QUEUE_DEPTH, win.headers_only) {
                inner.give_buf(buf);
                return Err(e.into());
            }
            return Ok(buf);
        }
        read_pooled(dev, inner, win.offset, win.len)
    }
}

impl Inner {
    /// A compaction window's runs worth reading (`compact_runs`), if it is
    /// one and they spare enough: None reads the whole window.
    fn window_runs(&self, win: &Window) -> Option<Vec<(u64, u64)>> {
        if !win.cache || self.in_place() {
            return None;
        }
        let (block, bpc) = (win.offset / BS, self.blocks_per_chunk());
        self.compact_runs(ChunkId((block / bpc) as u32), block % bpc, win.len as u64 / BS, win.headers_only)
    }
}

/// Read `runs` (first block, blocks; from `offset`) of `dev` into `buf`,
/// at most `in_flight` requests at a time: zeros elsewhere, or with
/// `headers_only` (the runs are a chunk's record headers, whose walk jumps
/// over each record's data: `Engine::compact_step`) zeros only before the
/// first run and after the last.
fn read_runs(
    dev: &dyn BlockDevice,
    offset: u64,
    runs: &[(u64, u64)],
    buf: &mut IoBuf,
    in_flight: usize,
    headers_only: bool,
) -> Result<(), DeviceError> {
    // Zeros only between the runs: the window is a chunk (16 MiB by
    // default), and zeroing what the reads overwrite anyway cost memory
    // bandwidth, which is what two writers on this machine's two cores run
    // short of first (docs/results/2026-11-27-engine-threads.md). Between
    // headers lie the records' data, which the walk never reads: zeroing
    // it cost a chunk's worth of memset per chunk compacted (5.8 % of the
    // server's CPU on 128 KiB sequential writes).
    let mut at = 0usize;
    for &(s, n) in runs {
        let start = ((s * BS) as usize).min(buf.len());
        if start > at && (!headers_only || at == 0) {
            buf[at..start].fill(0);
        }
        at = at.max(start + (n * BS) as usize);
    }
    if at < buf.len() {
        buf[at..].fill(0);
    }
    let pieces: Vec<(u64, u64, usize)> =
        runs.iter().map(|&(s, n)| (offset + s * BS, n * BS, (s * BS) as usize)).collect();
    read_pieces(dev, &pieces, buf, in_flight)
}

/// Read `pieces` (device offset, bytes, where in `out`) of `dev` into
/// `out`, at most `in_flight` requests at a time; the first error, once
/// the reads in flight are reaped.
pub(super) fn read_pieces(
    dev: &dyn BlockDevice,
    pieces: &[(u64, u64, usize)],
    out: &mut [u8],
    in_flight: usize,
) -> Result<(), DeviceError> {
    let mut done = Vec::with_capacity(in_flight);
    let (mut next, mut inflight, mut failed) = (0, 0, None);
    // After a failed read nothing more is submitted: the loop ends once
    // the reads in flight are reaped (it spun forever on an empty device
    // queue before, `sluice sim --swarm` seed 744).
    while (next < pieces.len() && failed.is_none()) || inflight > 0 {
        if next < pieces.len() && inflight < in_flight && failed.is_none() {
            let (offset, len, _) = pieces[next];
            // A buffer this thread kept (contents undefined: the read fills it).
            let buf = super::pool::take_thread_buf(len as usize);
            let req = IoRequest { op: IoOp::Read, offset, len, buf, fua: false, user_data: next as u64 };
            dev.submit(req);
            next += 1;
            inflight += 1;
            continue;
        }
        done.clear();
        inflight -= dev.reap(1, &mut done);
        for c in done.drain(..) {
            match c.result {
                Ok(_) => {
                    let at = pieces[c.user_data as usize].2;
                    out[at..at + c.buf.len()].copy_from_slice(&c.buf);
                    super::pool::give_thread_buf(c.buf);
                }
                Err(e) => {
                    failed.get_or_insert(e);
                    super::pool::give_thread_buf(c.buf);
                }
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::*;
    use crate::testkit::{assert_reads_as, pattern, small_world};
    use sluice_media::rng::SplitMix64 as Rng;

    /// A failed read among several runs is the answer, with the reads in
    /// flight reaped and none submitted after it, one request at a time or
    /// several.
    #[test]
    fn a_failed_run_read_ends_the_read_with_its_error() {
        for in_flight in [1, 2] {
            let dev = sluice_media::CrashDevice::new(64 * BS, 4096);
            dev.inject(sluice_media::FaultPlan::nth_read(1));
            let mut buf = IoBuf::zeroed(16 * BS as usize);
            let r = read_runs(&dev, 0, &[(0, 2), (4, 2), (8, 2)], &mut buf, in_flight, false);
            assert!(matches!(r, Err(DeviceError::Injected)), "{r:?} (in flight: {in_flight})");
            assert_eq!(dev.in_flight(), 0);
        }
    }

    /// A window read without the lock stands in for the step's read only if
    /// it is the same window of the same generation: here a stand-in full
    /// of 0xAB is taken when it matches and refused (the device read again)
    /// when the generation moved on.
    #[test]
    fn a_window_read_outside_the_lock_is_used_only_for_the_same_generation() {
        let w = small_world(&[256]);
        for lba in 0..256 {
            w.volumes[0].write(lba * 4096, &pattern(0, lba, 1), false).unwrap();
        }
        let e = &w.engine;
        let c0 = e.snapshot().compactor;
        let mut inner = e.lock();
        let win = Window { headers_only: false, ..inner.compact_window(8).expect("a full chunk") };
        let fake = |gen| {
            let mut buf = IoBuf::zeroed(win.len);
            buf.fill(0xAB);
            Some(PreRead { win: Window { gen, ..win }, buf })
        };
        let stale = e.read_window(&mut inner, &mut fake(win.gen + 1), win).unwrap();
        let device = read_pooled(&*e.cache, &mut inner, win.offset, win.len).unwrap();
        assert!(stale[..] == device[..], "a stale window was refused and read again");
        let same = e.read_window(&mut inner, &mut fake(win.gen), win).unwrap();
        assert!(same.iter().all(|&b| b == 0xAB), "a matching window was used as read");
        drop(inner);
        let c = e.snapshot().compactor;
        assert_eq!((c.windows_read_unlocked - c0.windows_read_unlocked, c.windows_reread - c0.windows_reread), (1, 1));
    }

    /// Sequential writes of 24 blocks, compacted one record per step: each
    /// segment's blocks lie together in the cache and are read in one
    /// request straight into the segment, its header put back
    /// (`read_after_header`); windows of headers only leave the data
    /// between them unzeroed (`read_runs`). Every block reads back, over
    /// several wraps of the log.
    #[test]
    fn sequential_records_compacted_one_at_a_time_read_back() {
        let w = small_world(&[240]);
        let mut model = vec![vec![0u64; 240]];
        let mut gen = 0u64;
        for pass in 0..12u64 {
            for first in (0..240u64).step_by(24) {
                gen += 1;
                let data: Vec<u8> = (first..first + 24).flat_map(|lba| pattern(0, lba, gen)).collect();
                w.volumes[0].write(first * 4096, &data, false).unwrap();
                (first..first + 24).for_each(|lba| model[0][lba as usize] = gen);
                if (pass + first) % 2 == 0 {
                    w.engine.compact_some(25).unwrap();
                }
            }
        }
        assert_reads_as(&w, &model);
        assert!(w.engine.stats().chunks_compacted > 2, "{:?}", w.engine.stats());
        w.engine.check_invariants();
    }

    /// Bounded compaction and GC steps, as the simulations take them, read
    /// their windows outside the lock, and every block still reads back.
    #[test]
    fn compaction_and_gc_steps_read_their_windows_outside_the_lock() {
        let w = small_world(&[200, 200]);
        let mut rng = Rng(7);
        let mut model = vec![vec![0u64; 200]; 2];
        for i in 1..=4000u64 {
            let (v, lba) = (rng.below(2) as usize, rng.below(200));
            w.volumes[v].write(lba * 4096, &pattern(v, lba, i), false).unwrap();
            model[v][lba as usize] = i;
            if i % 7 == 0 {
                w.engine.compact_some(8).unwrap();
                w.engine.collect_some(8).unwrap();
            }
        }
        assert_reads_as(&w, &model);
        let c = w.engine.snapshot().compactor;
        assert!(c.windows_read_unlocked > 100, "{c:?}");
        assert!(w.engine.stats().bands_reclaimed > 0);
        w.engine.check_invariants();
    }
}
