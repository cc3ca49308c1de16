//! FLUSH as a group commit, with the cache device's flush outside the
//! engine lock.
//!
//! Owns: the grouping of concurrent FLUSH requests (any volume, any
//! connection) into rounds, and one round's work.
//!
//! A round snapshots the log's position under the lock (as it is, records
//! of other writers in flight or not: the snapshot stops below the first
//! one, `Inner::written_upto`), flushes the cache device *without* the
//! lock (skipped when no record was reserved since the last flush), then,
//! under the lock again, raises the flushed watermarks to the snapshot
//! (never lowers them) and, in place, flushes the capacity device when
//! anything was written to it since its last flush. One round runs at
//! a time; a request is answered by the first
//! round that *started* after it arrived, so every write acknowledged before
//! the request is in a record at or below that round's snapshot, written to
//! the device before the snapshot, and made durable by the round's device
//! flush. Requests that arrive while a round runs share the next round: with
//! many in flight, one device flush answers them all.
//!
//! Why: a FLUSH used to hold the engine lock across two device flushes, so
//! with a flush every few writes (fio `fsync=4`, a journaling filesystem)
//! every write waited for the disk and flushes could never overlap or merge.
//! Writes now go on while the cache device flushes. With bands the capacity
//! device holds only copies of logged data until its own flush (rule 3:
//! a chunk is freed, a GC victim discarded, only after the capacity device
//! is flushed), so a FLUSH leaves it alone; it used to flush it under the
//! lock on every round while compaction ran. In place, user writes can go
//! straight home, so a round flushes the capacity device (under the lock:
//! its watermark orders chunk reuse) when anything was written to it since
//! its last flush: every capacity write path sets `CapWrites::dirty`.

use std::sync::{Condvar, Mutex, PoisonError};

use super::{flush, Engine, VolumeError};

/// Rounds of FLUSH: started, finished, and the last one's result.
#[derive(Debug, Default)]
pub(super) struct FlushGroup {
    state: Mutex<Rounds>,
    finished: Condvar,
}

#[derive(Debug, Default)]
struct Rounds {
    /// A round is running (its leader does the work).
    running: bool,
    /// Rounds started so far (the running one included).
    started: u64,
    /// The last round that finished, and its result.
    finished: u64,
    result: Option<Result<(), VolumeError>>,
}

impl Engine {
    /// Everything acknowledged before this call is durable when it returns
    /// Ok (see the module doc).
    pub(super) fn flush_grouped(&self) -> Result<(), VolumeError> {
        let g = &self.flushes;
        let mut st = g.state.lock().unwrap_or_else(PoisonError::into_inner);
        // The first round to start after now; a running one started before.
        let need = st.started + 1;
        loop {
            if st.finished >= need {
                return st.result.clone().unwrap_or(Ok(()));
            }
            if !st.running {
                st.running = true;
                st.started += 1;
                let round = st.started;
                drop(st);
                let r = self.flush_round();
                st = g.state.lock().unwrap_or_else(PoisonError::into_inner);
                st.running = false;
                (st.finished, st.result) = (round, Some(r.clone()));
                g.finished.notify_all();
                return r;
            }
            st = g.finished.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// One round: the cache device flushed outside the lock up to a
    /// snapshot of the log, then the watermarks raised and the capacity
    /// device flushed under it.
    fn flush_round(&self) -> Result<(), VolumeError> {
        // The lock as it is, records in flight or not (writers.rs): the
        // snapshot stops below the first record still being written, and
        // every write acknowledged before this round is published, so
        // written, whichever records of other writers are still in flight.
        let (seq, lsn, cache_new, tag, bpc) = {
            let inner = self.lock_for_request();
            inner.taking_changes()?;
            let (seq, lsn) = inner.written_upto();
            // Skipped only if nothing was reserved since the last flush: a
            // record published above one still in flight is past the
            // snapshot, and needs the device flush all the same.
            let new = (inner.seq.last(), inner.log.lsn()) != (inner.log.flushed_seq(), inner.log.flushed_lsn());
            (seq, lsn, new, inner.tag, inner.blocks_per_chunk())
        };
        // A file's fdatasync directly (not queued behind the log writes
        // that go on meanwhile), else a queued flush.
        let cache = match cache_new {
            true => self.cache.flush_now().unwrap_or_else(|| flush(&*self.cache)).map_err(VolumeError::from),
            false => Ok(()),
        };
        let mut inner = self.lock_for_request();
        inner.taking_changes()?;
        let r = cache.and_then(|()| {
            inner.log.flushed_upto(seq, lsn);
            // With bands, acknowledged data stays in the log until
            // compaction's or GC's own capacity flush lets its chunk go
            // (rule 3), so a FLUSH has no capacity work. In place, writes
            // can go straight home: flush if any capacity write happened
            // since the last capacity flush (every one sets `dirty`). In
            // place no record is ever in flight (writes log under the lock).
            if inner.in_place() && (inner.cap.is_dirty() || inner.cap.inflight() > 0) {
                self.flush_capacity(&mut inner)?;
                self.log_claims(&mut inner)?;
            }
            // With bands, direct writes hold data nothing else does: the
            // capacity device flushed and a mark of it (direct.rs).
            self.mark_direct_writes(&mut inner)
        });
        let r = inner.stop_on_device_error(r);
        self.after_change(&inner);
        drop(inner);
        // The records this round answers for, claimed before it answers
        // (watermark.rs), without the lock: a claim is true whenever it lands.
        // Also when the round skipped the device flush: an engine flush
        // (compaction's, say) made the records durable but claimed nothing.
        // The lock again only if the claim's write failed (it stops the
        // engine, as any device error under a change does).
        match r {
            Ok(()) => {
                self.claim_flushed(tag, bpc, lsn).or_else(|e| self.lock_for_request().stop_on_device_error(Err(e)))
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::testkit::*;
    use crate::Volume;
    use sluice_media::memory::MemoryDevice;
    use sluice_media::BlockDevice;
    use std::sync::Arc;

    /// A FLUSH flushes the cache device only when a record was written
    /// since the last one; FLUSHes from many threads at once are answered
    /// by at most as many device flushes as requests, never by none, and
    /// the data reads back (durability across a crash is the crash
    /// simulations' part).
    #[test]
    fn flushes_skip_clean_devices_and_share_rounds() {
        let (c, p) = small_device_bytes(&[256]);
        let cache: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(c, 4096));
        let capacity: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(p, 4096));
        let w = small_world_on(cache.clone(), capacity.clone(), &[256]);
        let flushes = || cache.stats().flushes;
        let vol = &w.volumes[0];
        vol.write(0, &pattern(0, 0, 1), false).unwrap();
        let before = flushes();
        vol.flush().unwrap();
        assert_eq!(flushes() - before, 1, "a write, then a flush: one cache flush");
        vol.flush().unwrap();
        vol.flush().unwrap();
        assert_eq!(flushes() - before, 1, "nothing new: no cache flush");
        let before = flushes();
        std::thread::scope(|s| {
            for i in 0..8u64 {
                s.spawn(move || {
                    vol.write((8 + i) * 4096, &pattern(0, 8 + i, 1), false).unwrap();
                    vol.flush().unwrap();
                });
            }
        });
        let rounds = flushes() - before;
        assert!((1..=8).contains(&rounds), "8 flushes took {rounds} device flushes");
        let mut model = vec![0u64; 256];
        for l in [0, 8, 9, 10, 11, 12, 13, 14, 15] {
            model[l] = 1;
        }
        assert_reads_as(&w, &[model]);
    }
}
