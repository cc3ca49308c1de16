//! The write path outside the engine lock: reserve, write, publish.
//!
//! Owns: user writes of volumes with bands (`Engine::write_concurrent`),
//! the records in flight (`Log::inflight`), and the drain that gives every
//! other path the lock with none in flight (`Engine::lock`). The same
//! steps, one at a time, are `StagedWrite`'s (staged.rs).
//!
//! A batch of writes becomes records exactly as under the lock (log.rs:
//! group commit, an LBA at most once per record), built and copied into
//! their buffers before the lock is taken. Then:
//! 1. **Reserve**, under the lock: room in the log, the record's LSN and
//!    sequence number, its header (encoded into the buffer's first block);
//!    the record is now in flight.
//! 2. **Write** the record to the cache device, without the lock. Writers of
//!    other threads reserve and write meanwhile.
//! 3. **Publish**, under the lock: the maps point at the record's blocks
//!    (release stores: a lock-free read that sees a place sees its data),
//!    unless a newer copy got there first, and the record leaves the set in
//!    flight.
//!
//! Invariants:
//! - **Order.** Records of one log are reserved in LSN order, and their
//!   places follow it (a chunk's records in order, chunks in epoch order).
//!   A block is published only if the copy the map holds is older than it
//!   (`Inner::supersedes`): two writes of one LBA end with the later
//!   reservation's data whatever order they complete in, as replay, which
//!   goes by sequence number, also finds.
//! - **Relocations** (compaction, GC) give the copies they move new
//!   sequence numbers, and replay keeps the copy with the highest: an older
//!   copy relocated while a newer record of its LBA is still in flight
//!   would win over that record after a crash (the crash simulation found
//!   exactly this, seed 12). A step runs beside records in flight only if
//!   its victims hold no copy (or tombstone) of a block they rewrite, and
//!   no record in flight (`Inner::relocations_clear`, relocation_gate.rs);
//!   otherwise it waits for them (`Engine::lock_for_relocation`), and a
//!   writer whose reservation needs inline compaction
//!   (`Engine::log_space_or_busy`) first writes and publishes what it
//!   holds, then waits for the others.
//!   With no background compactor, writers take bounded compaction steps
//!   themselves before they reserve (assist.rs).
//! - **Durability.** The flushed watermarks never pass the first record in
//!   flight (`Inner::written_upto`), so a flush claims only what was
//!   written. A record may be on the media while an earlier one is not;
//!   recovery walks past such a hole (recovery/chunks.rs) and treats the
//!   missing LSNs above the watermark as torn writes (recovery/lsns.rs).
//!   A FLUSH round does not wait for records in flight: every write
//!   acknowledged before it is published, so written. A FUA write is
//!   published and then waits for a FLUSH round.
//! - **A chunk's first record** is written at its reservation, under the
//!   lock: recovery takes the chunk's generation from it, so a later record
//!   of the chunk must never be durable without it.
//! - **Everything else** but reads and FLUSH (trim, write-zeroes,
//!   compaction and GC steps, checkpoint, invariants, and every write on
//!   the `Serial` schedule, runtime.rs) takes the lock
//!   through `Engine::lock`, which waits until no record is in flight and
//!   holds new reservations back meanwhile (`Inner::draining`): those paths
//!   see the log as when every write ran under the lock.

use super::assist::{Assist, StepGain};
use super::pool::take_thread_buf;
use super::{encode_header, sync_io, Engine, Inner, IoBuf, IoRequest, Loc, VolumeError, BLOCK_BYTES, BS};
use crate::layout::{Entry, RecordKind};
use std::sync::MutexGuard;

/// One record of a batch: its entries and its buffer (a free first block
/// for the header, then the data).
pub(super) struct Record {
    pub(super) entries: Vec<Entry>,
    pub(super) buf: IoBuf,
}

/// Where a reserved record goes.
pub(super) struct Reserved {
    /// Index in the batch's records.
    pub(super) rec: usize,
    pub(super) header_block: u64,
    pub(super) lsn: u64,
    /// Its sequence number.
    pub(super) seq: u64,
    /// Step 2 is done (at reservation for a chunk's first record).
    pub(super) written: bool,
}

impl Inner {
    /// The highest (sequence, LSN) such that every record at or below it
    /// was written: below the first record in flight, else the last ones.
    pub(super) fn written_upto(&self) -> (u64, u64) {
        match self.log.inflight().first_key_value() {
            Some((&lsn, f)) => (f.seq - 1, lsn - 1),
            None => (self.seq.last(), self.log.lsn()),
        }
    }

    /// Whether the copy at `old` was reserved after cache block `b`: then a
    /// record written to `b` completed late, and must not be published over
    /// it. Only a cache copy can be newer: no relocation moves a block
    /// while a record of its LBA is in flight (`relocations_clear`), so a
    /// capacity copy the map holds is older than every record in flight.
    pub(super) fn supersedes(&self, old: Loc, b: u64) -> bool {
        let Some(ob) = old.cache_block() else { return false };
        let bpc = self.blocks_per_chunk();
        let age = |x: u64| (self.log.chunk_of(x).0.epoch(), x % bpc);
        age(ob) > age(b)
    }
}

impl Engine {
    /// `g` once no record is in flight (new reservations wait meanwhile).
    pub(super) fn drained<'a>(&'a self, mut g: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        if g.log.inflight().is_empty() {
            return g;
        }
        g.draining += 1;
        while !g.log.inflight().is_empty() {
            g = self.wait_published(g);
        }
        g.draining -= 1;
        if g.draining == 0 && g.waiting > 0 {
            self.published.notify_all();
        }
        g
    }

    /// Wait (without the lock) for a publish or the end of a drain.
    pub(super) fn wait_published<'a>(&'a self, mut g: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        g.waiting += 1;
        let mut g = self.published.wait(g).expect("engine lock poisoned");
        g.waiting -= 1;
        g
    }

    /// Log `records` of volume `vol` (built by `records_of`) through the
    /// concurrent path; the buffers come back in order, whatever happened.
    /// Logs under the lock instead (`append_record`) on the `Serial`
    /// schedule, which orders device I/O under the lock (runtime.rs).
    pub(super) fn write_concurrent(
        &self,
        vol: u32,
        mut records: Vec<Record>,
        fua: bool,
    ) -> (Result<(), VolumeError>, Vec<IoBuf>) {
        let r = self.write_records(vol, &mut records);
        let r = r.and_then(|()| if fua { self.flush_grouped() } else { Ok(()) });
        (r, records.into_iter().map(|r| r.buf).collect())
    }

    /// `write_concurrent`'s work. Every record's buffer is back in it on
    /// return, whatever happened.
    fn write_records(&self, vol: u32, recs: &mut [Record]) -> Result<(), VolumeError> {
        if let Some(map) = self.lockless_maps[vol as usize].as_ref() {
            recs.iter().flat_map(|r| &r.entries).for_each(|e| map.warm(e.lba as usize));
        }
        let (mut next, mut assisted) = (0, false);
        let mut g = self.lock_raw();
        let mut gain = StepGain::new(&g);
        while next < recs.len() {
            if !self.may_reserve(&g)? {
                g = self.wait_published(g);
                continue;
            }
            // The log short: a compaction step first (assist.rs), none of
            // this writer's records in flight.
            if !gain.exhausted() && self.assist_due(&g, assisted) {
                let (done, min) = (assisted, g.cfg.log_free_chunks_min);
                let r;
                (g, r) = self.assist(g);
                gain.after_step(&g);
                assisted = true;
                if r? == Assist::Blocked && done && g.log.free_len() <= min {
                    // No room, and a step only once a record is published.
                    g = self.wait_published(g);
                }
                continue;
            }
            if g.serial() {
                // The serial schedule: every device I/O in order, under the lock.
                let mut g = self.drained(g);
                for rec in &mut recs[next..] {
                    let bytes = rec.entries.len() as u64 * BS;
                    let r = self.append_record(&mut g, vol, rec);
                    let r = g.stop_on_device_error(r);
                    self.after_change(&g);
                    r?;
                    g.stats.user_wrote(bytes);
                }
                return Ok(());
            }
            // 1. Reserve as many records as the log has room for now.
            let mut wave: Vec<Reserved> = Vec::new();
            while next < recs.len() {
                match self.reserve(&mut g, vol, next, &mut recs[next], true) {
                    Ok(Some(r)) => wave.push(r),
                    Ok(None) => break,
                    Err(e) => {
                        self.abandon(&mut g, &wave);
                        return Err(e);
                    }
                }
                next += 1;
            }
            if wave.is_empty() {
                // Room only once a record of another writer is published.
                g = self.wait_published(g);
                continue;
            }
            drop(g);
            #[cfg(test)]
            between_reserve_and_write();
            // 2. Write them, without the lock; 3. publish them.
            let written;
            (g, written) = self.write_and_publish(vol, recs, &wave);
            written?;
        }
        Ok(())
    }

    /// Steps 2 and 3 for the reserved records `wave` of `recs`: write those
    /// not written yet, without the lock, then publish them all under it.
    /// After a failed write the engine stops taking changes and none is
    /// published (all are given up); after a failed publish, the rest are.
    /// Returns the lock.
    pub(super) fn write_and_publish(
        &self,
        vol: u32,
        recs: &mut [Record],
        wave: &[Reserved],
    ) -> (MutexGuard<'_, Inner>, Result<(), VolumeError>) {
        let mut failed = None;
        for r in wave.iter().filter(|r| !r.written) {
            if let Err(e) = self.write_reserved(&mut recs[r.rec], r) {
                failed.get_or_insert(e);
            }
        }
        let mut g = self.lock_raw();
        if let Some(e) = failed {
            let e = g.stop_on_device_error(Err(e));
            self.abandon(&mut g, wave);
            return (g, e);
        }
        for (k, r) in wave.iter().enumerate() {
            if let Err(e) = self.publish(&mut g, vol, &mut recs[r.rec], r) {
                self.abandon(&mut g, &wave[k + 1..]);
                return (g, Err(e));
            }
        }
        self.after_change(&g);
        (g, Ok(()))
    }

    /// Whether a reservation may be made now: not while a drain waits for
    /// the log to empty (Ok(false)), nor once the engine is closed or
    /// stopped (the error).
    pub(super) fn may_reserve(&self, g: &Inner) -> Result<bool, VolumeError> {
        g.taking_changes()?;
        Ok(g.draining == 0)
    }

    /// Step 2: write reserved record `rec` (header and data) to the cache
    /// device, without the lock. Its buffer is back in it on return.
    pub(super) fn write_reserved(&self, rec: &mut Record, r: &Reserved) -> Result<(), VolumeError> {
        let buf = std::mem::replace(&mut rec.buf, IoBuf::empty());
        let c = sync_io(&*self.cache, IoRequest::write(r.header_block * BS, buf, 0));
        rec.buf = c.buf;
        c.result.map(|_| ()).map_err(VolumeError::from)
    }

    /// Step 3: the maps point at written record `rec`'s blocks (where no
    /// later reservation got there first), and it leaves the set in flight.
    /// An error stops the engine's changes.
    pub(super) fn publish(&self, g: &mut Inner, vol: u32, rec: &mut Record, r: &Reserved) -> Result<(), VolumeError> {
        rec.entries = self.done(g, r);
        if rec.entries.first().is_some_and(|e| e.tombstone) {
            // A trim's record (trims.rs).
            let unmapped = g.unmap_record(vol, r, &rec.entries);
            return g.stop_on_device_error(unmapped);
        }
        let mapped = Self::map_record(g, vol, r.header_block, rec.entries.iter().map(|e| (e.lba, e.crc)));
        g.stop_on_device_error(mapped)?;
        g.stats.user_wrote(rec.entries.len() as u64 * BS);
        Ok(())
    }

    /// A reserved record leaves the set in flight; its entries come back.
    fn done(&self, g: &mut Inner, r: &Reserved) -> Vec<Entry> {
        let f = g.log.publish(r.lsn);
        if g.waiting > 0 {
            self.published.notify_all();
        }
        f.entries
    }

    /// Reserved records given up after an error (the engine has stopped
    /// taking changes) or a dropped `StagedWrite`: their places hold
    /// nothing the maps point at. A record already written there may be
    /// taken by replay after a crash, as any write that never completed may.
    pub(super) fn abandon(&self, g: &mut Inner, wave: &[Reserved]) {
        for r in wave {
            drop(self.done(g, r));
        }
    }

    /// Step 1: reserve room for record `rec` (number `index` of its batch)
    /// in the log and write its header into its buffer; None when room
    /// needs a compaction while records are in flight (or, `after_assist`,
    /// while a writer takes a compaction step: `log_space_or_busy`). A
    /// record of tombstones (and no data) is a trim's. An error stops the
    /// engine's changes.
    pub(super) fn reserve(
        &self,
        g: &mut Inner,
        vol: u32,
        index: usize,
        rec: &mut Record,
        after_assist: bool,
    ) -> Result<Option<Reserved>, VolumeError> {
        let need = (rec.buf.len() / BLOCK_BYTES) as u64;
        let place = self.log_space_or_busy(g, need, after_assist);
        let Some((chunk, off)) = g.stop_on_device_error(place)? else { return Ok(None) };
        let kind = match rec.entries.first() {
            Some(e) if e.tombstone => RecordKind::Trim,
            _ => RecordKind::Write,
        };
        let h = g.next_header(kind, vol, chunk, std::mem::take(&mut rec.entries));
        encode_header(&mut rec.buf[..BLOCK_BYTES], &h);
        let seq = h.seq;
        let lsn = g.log.reserve(super::log::InFlight { seq, vol, chunk, entries: h.entries });
        g.log.note_header(chunk, off);
        g.log.advance(chunk, off, need);
        g.stats.logged(need);
        let header_block = chunk.0 as u64 * g.blocks_per_chunk() + off;
        let mut r = Reserved { rec: index, header_block, lsn, seq, written: false };
        if off == 0 {
            // A chunk's first record names its generation in recovery:
            // written before the lock goes, so that no later record of the
            // chunk can be on the media, flushed, without it.
            if let Err(e) = self.write_reserved(rec, &r) {
                drop(self.done(g, &r));
                return g.stop_on_device_error(Err(e));
            }
            r.written = true;
        }
        Ok(Some(r))
    }
}

/// The records a batch of writes (first LBA, data) becomes, as `append`
/// cuts them (at most `max` blocks, an LBA at most once), each copied into
/// a buffer with a free first block.
pub(super) fn records_of(writes: &[(u64, &[u8])], crcs: &[u32], max: usize) -> Vec<Record> {
    let mut out = Vec::new();
    let mut cur: Vec<(u64, &[u8], u32)> = Vec::with_capacity(max.min(crcs.len()));
    let mut seen = std::collections::HashSet::new();
    let blocks = writes
        .iter()
        .flat_map(|&(lba0, data)| data.chunks(BLOCK_BYTES).enumerate().map(move |(i, b)| (lba0 + i as u64, b)));
    let flush = |cur: &mut Vec<(u64, &[u8], u32)>, out: &mut Vec<Record>| {
        let mut buf = take_thread_buf((1 + cur.len()) * BLOCK_BYTES);
        for (i, (_, d, _)) in cur.iter().enumerate() {
            buf[(1 + i) * BLOCK_BYTES..(2 + i) * BLOCK_BYTES].copy_from_slice(d);
        }
        let entries = cur.iter().map(|&(lba, _, crc)| Entry { lba, crc, tombstone: false }).collect();
        out.push(Record { entries, buf });
        cur.clear();
    };
    for ((lba, b), &crc) in blocks.zip(crcs) {
        if cur.len() == max || (writes.len() > 1 && !seen.insert(lba)) {
            flush(&mut cur, &mut out);
            seen.clear();
            seen.insert(lba);
        }
        cur.push((lba, b, crc));
    }
    if !cur.is_empty() {
        flush(&mut cur, &mut out);
    }
    out
}

#[cfg(test)]
thread_local! {
    /// Run once by the thread's next batch (or trim record) between
    /// reserving its records and writing them (tests stage races with it).
    static BETWEEN_RESERVE_AND_WRITE: std::cell::Cell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::Cell::new(None) };
}

/// `f` runs once, in this thread's next write batch (or trim record)
/// between its reservation and its device write.
#[cfg(test)]
pub(super) fn after_reserving(f: impl FnOnce() + 'static) {
    BETWEEN_RESERVE_AND_WRITE.with(|h| h.set(Some(Box::new(f))));
}

#[cfg(test)]
pub(super) fn between_reserve_and_write() {
    if let Some(f) = BETWEEN_RESERVE_AND_WRITE.with(|h| h.take()) {
        f();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::*;
    use crate::testkit::{flushed_and_reopened, pattern, read_block as read, small_world};
    use crate::{CompactorConfig, Volume};
    use std::sync::Mutex;

    /// Two writes of one block: the first reserved writes last. The map
    /// keeps the later reservation's data, as replay (by sequence number)
    /// does after an unclean stop.
    #[test]
    fn a_write_completed_late_does_not_cover_a_later_one() {
        let w = small_world(&[256]);
        // (A handle now: taking one drains the log, which the record paused
        // in flight would never let happen.)
        let v = w.engine.volume("v0").unwrap();
        after_reserving(move || {
            std::thread::spawn(move || v.write(7 * BS, &pattern(0, 7, 2), false).unwrap()).join().unwrap();
        });
        w.volumes[0].write(7 * BS, &pattern(0, 7, 1), false).unwrap();
        assert!(read(&w.volumes[0], 7) == pattern(0, 7, 2), "the earlier reservation's data won");
        w.engine.check_invariants();
        let e = flushed_and_reopened(w);
        assert!(e.recovered_in().is_some(), "an unclean stop");
        assert!(read(&e.volume("v0").unwrap(), 7) == pattern(0, 7, 2), "replay disagrees with the map");
    }

    /// While a record is reserved and not yet written, nothing is relocated,
    /// by a writer needing room (it waits for the record instead) or by the
    /// background compactor (its lock drains the log first). The record
    /// paused here replaces a copy in the very chunk compaction needs next:
    /// relocated meanwhile, that older copy would carry a higher sequence
    /// number than the record and win over it in replay.
    #[test]
    fn nothing_is_relocated_while_a_record_is_in_flight() {
        for compactor in [false, true] {
            let w = small_world(&[256]);
            w.volumes[0].write(0, &pattern(0, 0, 1), false).unwrap();
            let c = compactor.then(|| w.engine.start_compactor(CompactorConfig::default()).unwrap());
            let (e, v) = (w.engine.clone(), w.engine.volume("v0").unwrap());
            let other: std::sync::Arc<Mutex<Option<std::thread::JoinHandle<()>>>> = Default::default();
            let slot = other.clone();
            after_reserving(move || {
                let first_chunk = 1;
                let epoch = e.lock_raw().log.chunk(ChunkId(first_chunk)).epoch();
                *slot.lock().unwrap() = Some(std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        let lba = 1 + i % 255;
                        v.write(lba * BS, &pattern(0, lba, 1 + i / 255), false).unwrap();
                    }
                }));
                // Until the other writer waits for this record, or (wrongly)
                // the chunk holding it was compacted and reopened.
                loop {
                    let g = e.lock_raw();
                    let ch = g.log.chunk(ChunkId(first_chunk));
                    if g.waiting > 0 || ch.epoch() != epoch || ch.state() == ChunkState::Free {
                        break;
                    }
                    drop(g);
                    std::thread::yield_now();
                }
            });
            w.volumes[0].write(0, &pattern(0, 0, 2), false).unwrap();
            other.lock().unwrap().take().expect("started").join().unwrap();
            drop(c);
            let expect = |lba: u64| match lba {
                0 => pattern(0, 0, 2),
                _ => pattern(0, lba, 1 + (0..2000u64).rev().find(|i| 1 + i % 255 == lba).unwrap() / 255),
            };
            for lba in 0..256u64 {
                assert!(read(&w.volumes[0], lba) == expect(lba), "block {lba} (compactor: {compactor})");
            }
            assert!(w.engine.stats().chunks_compacted > 5);
            w.engine.check_invariants();
            // Replay agrees after an unclean stop.
            let e = flushed_and_reopened(w);
            let v = e.volume("v0").unwrap();
            for lba in 0..256u64 {
                assert!(read(&v, lba) == expect(lba), "after replay: block {lba} (compactor: {compactor})");
            }
        }
    }

    /// Four writers on two volumes, each owning every other block of its
    /// volume, beside FLUSHes and (second round) the background compactor,
    /// in a world small enough that the log turns over many times: a
    /// writer reads back each block it wrote as exactly that write, at once
    /// (nobody else writes it), whatever the others reserve, publish,
    /// compact or flush meanwhile; at the end every block holds its last
    /// write, and so it does after an unclean stop and replay. Holds for
    /// any interleaving the scheduler picks: it depends on no timing.
    #[test]
    fn writers_on_four_threads_beside_the_compactor_keep_every_block() {
        use sluice_media::rng::SplitMix64 as Rng;
        const SIZES: [u64; 2] = [512, 256];
        for compactor in [false, true] {
            let w = small_world(&SIZES);
            let c = compactor.then(|| w.engine.start_compactor(CompactorConfig::default()).unwrap());
            let writers: Vec<_> = (0..4u64)
                .map(|t| {
                    let (vol, mine) = ((t % 2) as usize, t / 2);
                    let v = w.engine.volume(&format!("v{vol}")).unwrap();
                    std::thread::spawn(move || {
                        let mut rng = Rng(t + 1);
                        let mut last = vec![0u64; SIZES[vol] as usize];
                        for i in 1..=1500u64 {
                            let lbas: Vec<u64> =
                                (0..1 + rng.below(4)).map(|_| 2 * rng.below(SIZES[vol] / 2) + mine).collect();
                            let data: Vec<Vec<u8>> = lbas.iter().map(|&l| pattern(vol, l, i)).collect();
                            let batch: Vec<(u64, &[u8])> =
                                lbas.iter().zip(&data).map(|(&l, d)| (l * BS, &d[..])).collect();
                            v.write_batch(&batch, rng.below(16) == 0).unwrap();
                            for &l in &lbas {
                                last[l as usize] = i;
                                assert!(
                                    read(&v, l) == pattern(vol, l, i),
                                    "thread {t}: block {l} of v{vol} after write {i}"
                                );
                            }
                            if rng.below(50) == 0 {
                                v.flush().unwrap();
                            }
                        }
                        (vol, mine, last)
                    })
                })
                .collect();
            let done: Vec<_> = writers.into_iter().map(|h| h.join().unwrap()).collect();
            drop(c);
            let expect = |vol: usize, lba: u64| {
                let (_, _, last) = done.iter().find(|(v, m, _)| *v == vol && *m == lba % 2).unwrap();
                match last[lba as usize] {
                    0 => vec![0u8; BLOCK_BYTES],
                    i => pattern(vol, lba, i),
                }
            };
            assert!(w.engine.stats().chunks_compacted > 20, "the log turned over");
            w.engine.check_invariants();
            for (vol, &n) in SIZES.iter().enumerate() {
                for lba in 0..n {
                    assert!(
                        read(&w.volumes[vol], lba) == expect(vol, lba),
                        "block {lba} of v{vol} (compactor: {compactor})"
                    );
                }
            }
            let e = flushed_and_reopened(w);
            for (vol, &n) in SIZES.iter().enumerate() {
                let v = e.volume(&format!("v{vol}")).unwrap();
                for lba in 0..n {
                    assert!(
                        read(&v, lba) == expect(vol, lba),
                        "after replay: block {lba} of v{vol} (compactor: {compactor})"
                    );
                }
            }
        }
    }
}
