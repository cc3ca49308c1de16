//! The concurrent write path's steps taken one at a time by a caller that
//! orders them: `StagedWrite`, which the simulation's seeded scheduler
//! (`sluice sim --concurrent`) drives, several writes at once.
//!
//! Owns nothing but the write's own progress: its records, the next one
//! to reserve, and those reserved and not yet published. A trim is staged
//! the same way (`EngineVolume::stage_trim`): its records are cut from the
//! range at each reservation, as the threaded trim cuts them (trims.rs). Every step calls
//! the code the threaded path runs (writers.rs: reserve, write, publish),
//! so the simulation tests that code, not a copy of it. Invariant: a
//! record reserved is published, or given up only once the engine has
//! stopped taking changes (an LSN handed out cannot be taken back).

use super::trims::{TrimCursor, TrimStep};
use super::writers::{records_of, Record, Reserved};
use super::{Arc, Engine, VolumeError};

/// A batch of writes to one volume taken through the concurrent write
/// path one step at a time, by a caller that chooses the order of the
/// steps of several such writes: the deterministic simulation's scheduler
/// (`sluice sim --concurrent`) interleaves them, and loses power between
/// any two. The steps are the ones every write takes (reserve, write,
/// publish; then a FLUSH round for a FUA write), on the same code.
///
/// Dropped before it is done, it reserves nothing more, and writes and
/// publishes the records it holds: an LSN handed out cannot be taken back,
/// and a later flush would claim a record never written. Only once the
/// engine has stopped taking changes (a device error) are they given up,
/// as a writer's are after the error.
pub struct StagedWrite {
    engine: Arc<Engine>,
    vol: u32,
    recs: Vec<Record>,
    /// The next record to reserve.
    next: usize,
    /// Records reserved and not yet published, in reservation order.
    held: Vec<Reserved>,
    /// FUA: a flush round is still due once every record is published.
    flush_due: bool,
    failed: bool,
    /// A trim: what is left of its range (its records are cut from it at
    /// each reservation, and pushed onto `recs`).
    trim: Option<TrimCursor>,
    /// A trim's records (by number) and the blocks each unmaps.
    trim_lbas: std::collections::HashMap<usize, Vec<u64>>,
}

/// One step of a [`StagedWrite`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteStep {
    /// Reserve the next record's place.
    Reserve,
    /// Write the `n`th held record (reserved, not yet written).
    Write(usize),
    /// Publish the `n`th held record (written).
    Publish(usize),
    /// The FUA write's flush round, once every record is published (it
    /// waits for no other write's records in flight).
    Flush,
}

/// What a step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stepped {
    /// Record `record` of the batch (its blocks are the batch's next
    /// `blocks`, in order) has its place.
    Reserved {
        record: usize,
        blocks: usize,
    },
    /// A trim's next part, blocks `first..end`, is reserved: as record
    /// `record` (a tombstone for each of them the map held), or with no
    /// record when the map held none of them.
    TrimReserved {
        record: Option<usize>,
        first: u64,
        end: u64,
    },
    /// No room until a record in flight (of this write or another) is
    /// published, or (a trim) until the records in flight that rewrite its
    /// next blocks are.
    Busy,
    Written {
        record: usize,
    },
    Published {
        record: usize,
    },
    Flushed,
}

impl StagedWrite {
    /// A write of `recs` (none, for a trim: `trim` cuts them) not started.
    fn new(engine: Arc<Engine>, vol: u32, recs: Vec<Record>, fua: bool, trim: Option<TrimCursor>) -> StagedWrite {
        let (next, held, flush_due, failed, trim_lbas) = (0, Vec::new(), fua, false, Default::default());
        StagedWrite { engine, vol, recs, next, held, flush_due, failed, trim, trim_lbas }
    }

    /// The steps that may come next (none: done).
    pub fn steps(&self) -> Vec<WriteStep> {
        if self.failed {
            return Vec::new();
        }
        let mut out = Vec::new();
        if self.next < self.recs.len() || self.trim.as_ref().is_some_and(|t| t.next < t.end) {
            out.push(WriteStep::Reserve);
        }
        for (i, r) in self.held.iter().enumerate() {
            out.push(if r.written { WriteStep::Publish(i) } else { WriteStep::Write(i) });
        }
        if out.is_empty() && self.flush_due {
            out.push(WriteStep::Flush);
        }
        out
    }

    /// The blocks trim record `record` unmaps (a tombstone each; empty for
    /// a write's record).
    pub fn trim_record_lbas(&self, record: usize) -> &[u64] {
        self.trim_lbas.get(&record).map_or(&[], Vec::as_slice)
    }

    /// Whether a record of this write is reserved and not yet published.
    pub fn in_flight(&self) -> bool {
        !self.held.is_empty()
    }

    /// Take step `s` (one of `steps()`). After an error the write is over
    /// (its reservations given up, as a writer's after a device error).
    pub fn step(&mut self, s: WriteStep) -> Result<Stepped, VolumeError> {
        let r = self.step_inner(s);
        if r.is_err() {
            self.give_up();
        }
        r
    }

    fn step_inner(&mut self, s: WriteStep) -> Result<Stepped, VolumeError> {
        let e = &*self.engine;
        match s {
            WriteStep::Reserve if self.trim.is_some() => self.reserve_trim(),
            WriteStep::Reserve => {
                let mut g = e.lock_raw();
                if !e.may_reserve(&g)? {
                    return Ok(Stepped::Busy);
                }
                let index = self.next;
                let Some(r) = e.reserve(&mut g, self.vol, index, &mut self.recs[index], true)? else {
                    return Ok(Stepped::Busy);
                };
                let blocks = g.log.inflight()[&r.lsn].entries.len();
                self.held.push(r);
                self.next += 1;
                Ok(Stepped::Reserved { record: index, blocks })
            }
            WriteStep::Write(i) => {
                let r = &mut self.held[i];
                assert!(!r.written, "record already written");
                if let Err(err) = e.write_reserved(&mut self.recs[r.rec], r) {
                    return e.lock_raw().stop_on_device_error(Err(err));
                }
                r.written = true;
                Ok(Stepped::Written { record: r.rec })
            }
            WriteStep::Publish(i) => {
                assert!(self.held[i].written, "record not written");
                let r = self.held.remove(i);
                let mut g = e.lock_raw();
                e.publish(&mut g, self.vol, &mut self.recs[r.rec], &r)?;
                e.after_change(&g);
                Ok(Stepped::Published { record: r.rec })
            }
            WriteStep::Flush => {
                assert!(self.flush_due && self.held.is_empty() && self.next == self.recs.len());
                self.flush_due = false;
                e.flush_grouped()?;
                Ok(Stepped::Flushed)
            }
        }
    }

    /// A trim's Reserve step: its next part, cut and reserved by the code
    /// the threaded trim runs (`Engine::reserve_trim_part`).
    fn reserve_trim(&mut self) -> Result<Stepped, VolumeError> {
        let e = &*self.engine;
        let mut g = e.lock_raw();
        if !e.may_reserve(&g)? {
            return Ok(Stepped::Busy);
        }
        let cur = self.trim.as_mut().expect("a trim");
        let index = self.recs.len();
        match e.reserve_trim_part(&mut g, self.vol, cur, index)? {
            TrimStep::Done => unreachable!("a Reserve step is offered while the range lasts"),
            TrimStep::Waits | TrimStep::NoRoom => Ok(Stepped::Busy),
            TrimStep::Skipped { first, end } => Ok(Stepped::TrimReserved { record: None, first, end }),
            TrimStep::Reserved { rec, r, first, end } => {
                let lbas = g.log.inflight()[&r.lsn].entries.iter().map(|e| e.lba).collect();
                self.recs.push(rec);
                self.held.push(r);
                self.next = self.recs.len();
                self.trim_lbas.insert(index, lbas);
                Ok(Stepped::TrimReserved { record: Some(index), first, end })
            }
        }
    }

    /// End the write where it is (see the type's doc): no more
    /// reservations; the records held are written and published, unless
    /// the engine stopped taking changes (then they are given up, and no
    /// later flush can claim their places).
    fn give_up(&mut self) {
        self.failed = true;
        if self.held.is_empty() {
            return;
        }
        let held = std::mem::take(&mut self.held);
        let e = &*self.engine;
        let mut g = e.lock_raw();
        if g.taking_changes().is_err() {
            e.abandon(&mut g, &held);
            return;
        }
        drop(g);
        // (An error stops the engine's changes; the next request reports it.)
        let _ = e.write_and_publish(self.vol, &mut self.recs, &held);
    }
}

impl Drop for StagedWrite {
    fn drop(&mut self) {
        self.give_up();
    }
}

impl Engine {
    /// `writes` (volume `vol`'s LBA, data), cut into records as any batch
    /// is, to be taken step by step (`StagedWrite`).
    pub(super) fn stage_write(
        self: &Arc<Engine>,
        vol: u32,
        writes: &[(u64, &[u8])],
        crcs: &[u32],
        max: usize,
        fua: bool,
    ) -> StagedWrite {
        StagedWrite::new(self.clone(), vol, records_of(writes, crcs, max), fua, None)
    }

    /// A trim of blocks `lbas` of volume `vol` (with bands), to be taken
    /// step by step (`StagedWrite`).
    pub(super) fn stage_trim(self: &Arc<Engine>, vol: u32, lbas: std::ops::Range<u64>) -> StagedWrite {
        StagedWrite::new(self.clone(), vol, Vec::new(), false, Some(TrimCursor { next: lbas.start, end: lbas.end }))
    }
}
