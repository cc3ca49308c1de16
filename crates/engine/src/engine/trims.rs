//! Trims (and write-zeroes, which is a trim with bands) through the
//! concurrent write path: no drain, no global stop.
//!
//! Owns: cutting a trimmed range into tombstone records at reservation
//! (`TrimCursor`), the rule that orders a trim after the records in flight
//! that rewrite its blocks, and unmapping a published tombstone record
//! (`Inner::unmap_record`).
//!
//! A trim logs a tombstone for each block the map holds (never for an
//! unmapped one: tombstones stay live while their block is unmapped, and
//! GC carries every live one forward). Its records are header-only and
//! take the writers' three steps (writers.rs): reserved under the lock,
//! written without it, published under it. Which blocks are mapped is
//! read under the same hold of the lock as the reservation, a part of the
//! range at a time (`SCAN_MAX` blocks per hold).
//!
//! Invariants:
//! - **A trim waits for the records in flight that rewrite its blocks.** A
//!   part is reserved only when no record in flight holds a block of it
//!   (else the trimmer waits for a publish). Without the rule a write
//!   reserved before the trim, still in flight, would find the block
//!   unmapped when it completes and publish over the trim, and a block
//!   unmapped at the trim's reservation but written by that record would
//!   get no tombstone at all. The test
//!   `a_trim_waits_for_a_write_in_flight_of_its_blocks` catches the
//!   mutation.
//! - **A write reserved after the trim wins**, whatever order the two
//!   complete in: publishing the tombstones skips a block whose map entry
//!   is a newer cache copy (`Inner::supersedes`, as for data), and replay
//!   keeps the highest sequence number.
//! - **A trim always ends.** Nothing holds new writes back while a part
//!   waits, so a part whose blocks are always in flight somewhere would
//!   wait for ever; after `WAITS_MAX` records logged meanwhile the trim drains the log
//!   and finishes under the lock, as every trim did before.
//! - **Relocations** see a trim's blocks like a write's (its entries are in
//!   `Log::inflight`): a copy the trim unmaps is not moved while the trim
//!   is in flight (relocation_gate.rs).

use super::pool::{give_thread_buf, take_thread_buf};
use super::writers::{Record, Reserved};
use super::{Engine, Inner, VolumeError, BLOCK_BYTES, RECORD_BLOCKS_MAX};
use crate::layout::Entry;

/// Blocks of the range whose mapping one hold of the lock reads.
const SCAN_MAX: u64 = 1 << 16;

/// What is left of a trimmed range.
pub(super) struct TrimCursor {
    pub(super) next: u64,
    pub(super) end: u64,
}

/// The cursor's next part, read under the lock.
enum TrimPart {
    /// Nothing is left.
    Done,
    /// A record in flight rewrites a block of the part: wait for a publish.
    Waits,
    /// A tombstone record for the mapped blocks of `next..end` (none are
    /// mapped: no record, `entries` empty).
    Part { entries: Vec<Entry>, end: u64 },
}

impl TrimCursor {
    /// The next part of volume `vol`'s range: up to `RECORD_BLOCKS_MAX`
    /// mapped blocks within `SCAN_MAX` blocks.
    fn next_part(&self, g: &Inner, vol: u32) -> Result<TrimPart, VolumeError> {
        if self.next >= self.end {
            return Ok(TrimPart::Done);
        }
        let l2p = &g.vols[vol as usize].l2p;
        let (mut entries, mut lba) = (Vec::new(), self.next);
        let stop = self.end.min(self.next.saturating_add(SCAN_MAX));
        while lba < stop && entries.len() < RECORD_BLOCKS_MAX {
            if !l2p.get(lba as usize)?.is_none() {
                entries.push(Entry { lba, crc: 0, tombstone: true });
            }
            lba += 1;
        }
        let part = self.next..lba;
        let waits =
            (g.log.inflight().values()).any(|f| f.vol == vol && f.entries.iter().any(|e| part.contains(&e.lba)));
        Ok(if waits { TrimPart::Waits } else { TrimPart::Part { entries, end: lba } })
    }
}

impl Inner {
    /// Unmap the blocks of published tombstone record `entries` (reserved
    /// as `r`), but those a later reservation wrote meanwhile.
    pub(super) fn unmap_record(&mut self, vol: u32, r: &Reserved, entries: &[Entry]) -> Result<(), VolumeError> {
        let header_block = r.header_block;
        for e in entries {
            let old = self.vols[vol as usize].l2p.get(e.lba as usize)?;
            if old.is_none() || self.supersedes(old, header_block) {
                continue;
            }
            self.vols[vol as usize].l2p.unmap(e.lba as usize, r.seq)?;
            self.invalidate(old);
        }
        Ok(())
    }
}

/// What `Engine::reserve_trim_part` did.
pub(super) enum TrimStep {
    /// Nothing is left of the range.
    Done,
    /// A record in flight rewrites a block of the next part: wait for a
    /// publish.
    Waits,
    /// No room in the log until a record in flight is published.
    NoRoom,
    /// Blocks `first..end` hold nothing mapped: passed over, no record.
    Skipped { first: u64, end: u64 },
    /// Record `rec` (its header written, its tombstones in flight),
    /// reserved as `r`, for blocks `first..end`.
    Reserved { rec: Record, r: Reserved, first: u64, end: u64 },
}

impl Engine {
    /// Step 1 of a trim, under the lock: cut the next part of `cur`'s range
    /// of volume `vol` and reserve its tombstone record (number `index` of
    /// the caller's records). The cursor moves on only past a part that is
    /// reserved or holds nothing mapped. The threaded trim and the
    /// simulation's staged one both take it (`StagedWrite`). An error stops
    /// the engine's changes.
    pub(super) fn reserve_trim_part(
        &self,
        g: &mut Inner,
        vol: u32,
        cur: &mut TrimCursor,
        index: usize,
    ) -> Result<TrimStep, VolumeError> {
        let part = cur.next_part(g, vol);
        let (entries, end) = match g.stop_on_device_error(part)? {
            TrimPart::Done => return Ok(TrimStep::Done),
            TrimPart::Waits => return Ok(TrimStep::Waits),
            TrimPart::Part { entries, end } => (entries, end),
        };
        let first = cur.next;
        if entries.is_empty() {
            cur.next = end;
            return Ok(TrimStep::Skipped { first, end });
        }
        let mut rec = Record { entries, buf: take_thread_buf(BLOCK_BYTES) };
        match self.reserve(g, vol, index, &mut rec, false) {
            Ok(Some(r)) => {
                cur.next = end;
                Ok(TrimStep::Reserved { rec, r, first, end })
            }
            Ok(None) => {
                give_thread_buf(rec.buf);
                Ok(TrimStep::NoRoom)
            }
            Err(e) => {
                give_thread_buf(rec.buf);
                Err(e)
            }
        }
    }

    /// Trim blocks `lbas` of volume `vol` (with bands) through the
    /// concurrent path, a record at a time. On the `Serial` schedule, under
    /// the drained lock instead (`trim_logged`), as writes do.
    pub(super) fn trim_concurrent(&self, vol: u32, lbas: std::ops::Range<u64>) -> Result<(), VolumeError> {
        let mut cur = TrimCursor { next: lbas.start, end: lbas.end };
        let mut g = self.lock_for_request();
        // The last LSN when this part began to wait: it waits for at most
        // `WAITS_MAX` records logged since (counted by LSN, not by its own
        // wake-ups, which a loaded machine may merge).
        let mut waiting_since: Option<u64> = None;
        loop {
            if !self.may_reserve(&g)? {
                g = self.wait_published(g);
                continue;
            }
            let waited = waiting_since.map_or(0, |from| g.log.lsn().saturating_sub(from));
            if g.serial() || waited > WAITS_MAX as u64 {
                // Under the drained lock, which holds new reservations back.
                let mut g = self.drained(g);
                let r = self.trim_logged(&mut g, vol, cur.next..cur.end, true);
                let r = g.stop_on_device_error(r);
                self.after_change(&g);
                return r;
            }
            let (rec, r) = match self.reserve_trim_part(&mut g, vol, &mut cur, 0)? {
                TrimStep::Done => return Ok(()),
                TrimStep::Waits => {
                    waiting_since.get_or_insert(g.log.lsn());
                    g = self.wait_published(g);
                    continue;
                }
                TrimStep::NoRoom => {
                    waiting_since = None;
                    g = self.wait_published(g);
                    continue;
                }
                TrimStep::Skipped { .. } => {
                    // Nothing mapped there: the lock goes between parts.
                    waiting_since = None;
                    drop(g);
                    g = self.lock_for_request();
                    continue;
                }
                TrimStep::Reserved { rec, r, .. } => (rec, r),
            };
            waiting_since = None;
            drop(g);
            #[cfg(test)]
            super::writers::between_reserve_and_write();
            let mut recs = [rec];
            let written;
            (g, written) = self.write_and_publish(vol, &mut recs, &[r]);
            let [rec] = recs;
            give_thread_buf(rec.buf);
            written?;
        }
    }
}

/// Records logged while a trim's part waits before the trim drains the log
/// instead (and finishes under the lock, `trim_logged`): writes that keep
/// a block of the part in flight all the time (a journal written at a
/// queue depth of two or more) would otherwise hold it back for ever, as
/// nothing stops new reservations while it waits.
const WAITS_MAX: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::*;
    use crate::testkit::{flushed_and_reopened, pattern, read_block as read, small_world};
    use crate::Volume;

    /// A write reserved before a trim of its block and completed after it:
    /// the trim waits for it, so the block ends trimmed, in the map and
    /// after replay. (Without the wait the trim, finding nothing in its way
    /// under the lock, completes first and the late write publishes over
    /// it.)
    #[test]
    fn a_trim_waits_for_a_write_in_flight_of_its_blocks() {
        let w = small_world(&[256]);
        w.volumes[0].write(9 * BS, &pattern(0, 9, 1), false).unwrap();
        let (e, v) = (w.engine.clone(), w.engine.volume("v0").unwrap());
        let trimmer: std::sync::Arc<std::sync::Mutex<Option<std::thread::JoinHandle<()>>>> = Default::default();
        let slot = trimmer.clone();
        super::super::writers::after_reserving(move || {
            *slot.lock().unwrap() = Some(std::thread::spawn(move || v.trim(8 * BS, 4 * BS).unwrap()));
            // Until the trimmer waits for this write, or (wrongly) is done.
            let t0 = std::time::Instant::now();
            while e.lock_raw().waiting == 0 && t0.elapsed() < std::time::Duration::from_secs(5) {
                std::thread::yield_now();
            }
        });
        w.volumes[0].write(9 * BS, &pattern(0, 9, 2), false).unwrap();
        trimmer.lock().unwrap().take().expect("started").join().unwrap();
        assert!(read(&w.volumes[0], 9) == vec![0u8; BLOCK_BYTES], "the write in flight covered the later trim");
        w.engine.check_invariants();
        let e = flushed_and_reopened(w);
        assert!(read(&e.volume("v0").unwrap(), 9) == vec![0u8; BLOCK_BYTES], "replay brought the block back");
    }

    /// A part whose block stays in flight while other writes keep
    /// publishing: after `WAITS_MAX` records logged meanwhile the trim drains the log
    /// (which holds the other writer back) and finishes under the lock, and
    /// the block ends trimmed (the write in flight was reserved first).
    #[test]
    fn a_trim_held_back_by_a_block_in_flight_drains_and_ends() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let cfg = crate::testkit::small_config();
        let (_, capacity) = crate::testkit::small_device_bytes(&[512]);
        // A log long enough for the other writer's writes meanwhile: no
        // compaction while the paused record of an unmapped block is in
        // flight (relocations would wait for it).
        let cache = Arc::new(sluice_media::MemoryDevice::new(64 * cfg.chunk_bytes, 4096));
        let capacity = Arc::new(sluice_media::MemoryDevice::new(capacity, 4096));
        let w = crate::testkit::small_world_with(cache, capacity, &[512], cfg);
        let (e, t, b) = (w.engine.clone(), w.engine.volume("v0").unwrap(), w.engine.volume("v0").unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let drained = Arc::new(AtomicBool::new(false));
        let threads: Arc<std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>> = Default::default();
        let (s2, d2, th) = (stop.clone(), drained.clone(), threads.clone());
        super::super::writers::after_reserving(move || {
            let mut th = th.lock().unwrap();
            th.push(std::thread::spawn(move || t.trim(0, 16 * BS).unwrap()));
            let (s3, e3) = (s2.clone(), e.clone());
            th.push(std::thread::spawn(move || {
                // Only once the trim waits for a publish: on a loaded
                // machine the trim's thread may start late, and it must
                // see `WAITS_MAX` records logged while it waits, whatever the
                // machine's speed.
                let t0 = std::time::Instant::now();
                while e3.lock_raw().waiting == 0 && t0.elapsed() < std::time::Duration::from_secs(20) {
                    std::thread::yield_now();
                }
                for i in 0u64.. {
                    if s3.load(Ordering::Relaxed) || i == 1500 {
                        break;
                    }
                    let lba = 100 + i % 300;
                    b.write(lba * BS, &pattern(0, lba, 1 + i / 300), false).unwrap();
                }
            }));
            let t0 = std::time::Instant::now();
            while t0.elapsed() < std::time::Duration::from_secs(20) {
                if e.lock_raw().draining > 0 {
                    d2.store(true, Ordering::Relaxed);
                    break;
                }
                std::thread::yield_now();
            }
            s2.store(true, Ordering::Relaxed);
        });
        w.volumes[0].write(5 * BS, &pattern(0, 5, 1), false).unwrap();
        for h in threads.lock().unwrap().drain(..) {
            h.join().unwrap();
        }
        assert!(drained.load(Ordering::Relaxed), "the trim never drained the log");
        assert!(read(&w.volumes[0], 5) == vec![0u8; BLOCK_BYTES], "the write reserved before the trim covered it");
        w.engine.check_invariants();
        let v = flushed_and_reopened(w).volume("v0").unwrap();
        assert!(read(&v, 5) == vec![0u8; BLOCK_BYTES], "replay brought the block back");
    }

    /// A write reserved after a trim of its block wins, whichever of the
    /// two completes first: here the trim is reserved and paused, the write
    /// runs to the end on another thread, then the trim publishes.
    #[test]
    fn a_write_after_a_trim_in_flight_wins() {
        let w = small_world(&[256]);
        for lba in 0..16 {
            w.volumes[0].write(lba * BS, &pattern(0, lba, 1), false).unwrap();
        }
        let v = w.engine.volume("v0").unwrap();
        super::super::writers::after_reserving(move || {
            std::thread::spawn(move || v.write(5 * BS, &pattern(0, 5, 2), false).unwrap()).join().unwrap();
        });
        w.volumes[0].trim(0, 16 * BS).unwrap();
        for lba in 0..16 {
            let want = if lba == 5 { pattern(0, 5, 2) } else { vec![0u8; BLOCK_BYTES] };
            assert!(read(&w.volumes[0], lba) == want, "block {lba}");
        }
        w.engine.check_invariants();
        let v = flushed_and_reopened(w).volume("v0").unwrap();
        for lba in 0..16 {
            let want = if lba == 5 { pattern(0, 5, 2) } else { vec![0u8; BLOCK_BYTES] };
            assert!(read(&v, lba) == want, "after replay: block {lba}");
        }
    }
}

#[cfg(test)]
mod tag_tests {
    use super::*;
    use crate::engine::BS;
    use crate::testkit::{pattern, small_world};
    use crate::Volume;

    /// 32 blocks written and trimmed 1,200 times while other writes keep
    /// GC going: the tombstones the bands hold stay bounded (256 here),
    /// because only each block's newest tombstone is live
    /// (`l2p::tombstone_tag`). Without the tag every trim's tombstone stayed
    /// live whenever GC met it while its block was unmapped: 896 after 300
    /// cycles, 1,551 after 1,200, growing until no band was left.
    #[test]
    fn tombstones_of_rewritten_and_retrimmed_blocks_do_not_pile_up() {
        let w = small_world(&[256]);
        let v = &w.volumes[0];
        for cycle in 1..=1200u64 {
            for lba in 0..32u64 {
                v.write(lba * BS, &pattern(0, lba, cycle), false).unwrap();
            }
            v.trim(0, 32 * BS).unwrap();
            for i in 0..64u64 {
                let lba = 32 + (cycle * 64 + i) % 224;
                v.write(lba * BS, &pattern(0, lba, cycle), false).unwrap();
            }
        }
        let g = w.engine.lock();
        let tombs: u64 = g.bands.iter().map(|b| b.tombstones() as u64).sum();
        assert!(g.stats.get().bands_reclaimed > 1000, "GC ran: {} bands", g.stats.get().bands_reclaimed);
        assert!(tombs <= 16 * 32, "{tombs} tombstones in the bands for 32 trimmed blocks");
        drop(g);
        w.engine.check_invariants();
        for lba in 0..32 {
            let mut b = vec![1u8; BLOCK_BYTES];
            v.read(lba * BS, &mut b).unwrap();
            assert!(b.iter().all(|&x| x == 0), "block {lba} trimmed");
        }
    }
}
