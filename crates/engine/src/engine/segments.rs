//! Segments: how compaction and GC write to the capacity device, and the
//! rules that make it crash safe.
//!
//! A segment is a header block and up to `RECORD_BLOCKS_MAX` data blocks,
//! padded to the write unit (the capacity SSD's IU), written at the write
//! pointer of a stream's open band (bands.rs). Owns the capacity writes in
//! flight (at most `CAP_QUEUE_DEPTH`), whether the device holds unflushed
//! segments, and the flushed-sequence watermark segment headers carry.
//!
//! Crash safety rests on three rules (docs/engine.md):
//! 1. Every record and segment is self-describing (LBAs, CRCs, a sequence
//!    number); for each LBA the entry with the highest sequence wins.
//! 2. Compaction and GC stamp what they write with a *fresh* sequence: they
//!    only move current blocks, so the copy is newer than every stale one.
//!    Trims are records too, and their tombstones are carried forward by
//!    compaction and GC (read back from the media) while the LBA stays
//!    unmapped, so a stale copy can never win after a crash. Only the
//!    LBA's newest tombstone is carried (its tag is in the L2P entry,
//!    `l2p::tombstone_tag`), and the copy takes the tag of its new
//!    sequence here: an older tombstone loses to the newer one anyway.
//! 3. A compacted chunk is freed, and a GC victim discarded, only after both
//!    devices have flushed: the copies on the capacity device, and on the
//!    cache every record that superseded an entry being dropped (a rewrite
//!    that made a tombstone dead). So whenever an entry disappears from the
//!    media, whatever made it stale is durable, and an older entry that a
//!    crash brings back (a lost write into a reused chunk uncovers the
//!    previous generation) always loses to a durable newer one.
//!
//! A trim of blocks already unmapped writes nothing: their tombstone (or the
//! absence of any copy) is already on the media, and skipping keeps the
//! number of tombstones bounded by the number of unmapped blocks.

use super::bands::{band_has_room, Stream};
use super::pending::{Deferred, Fill, QueuedWrite};
use super::{
    encode_header, flush, BandId, Engine, Inner, IoBuf, IoRequest, Loc, VolumeError, BLOCK_BYTES, BS, RECORD_BLOCKS_MAX,
};
use crate::layout::{Entry, Header, RecordKind};

/// Most capacity segment writes compaction and GC keep in flight.
pub(super) const CAP_QUEUE_DEPTH: usize = 16;

/// The capacity device's segment writes and flush state.
#[derive(Default)]
pub(super) struct CapWrites {
    /// Writes in flight: compaction and GC submit their segments with queue
    /// depth and reap them all before flushing, so a device with internal
    /// parallelism (NAND dies) works on many at once. Zero outside a
    /// compaction or GC pass.
    inflight: usize,
    /// Segments were written since the device's last flush: freeing a chunk
    /// or discarding a GC victim flushes it first (rule 3). Kept here rather
    /// than per pass, so a pass that failed halfway (NoSpace) and is resumed
    /// later still flushes what it wrote before the error.
    dirty: bool,
    /// Highest sequence made durable on the capacity device by a completed flush.
    flushed_seq: u64,
    /// Direct writes (direct.rs) went to the capacity device since the last
    /// mark: a FLUSH or FUA writes one before it is answered.
    unmarked: bool,
    /// After a recovery that found torn segments: segment headers claim no
    /// watermark at or above the first of them until `relog` has written
    /// their blocks again, or a later recovery would trust what is torn.
    flushed_ceiling: Option<u64>,
}

/// Its fields are private to this module: other modules say what they did
/// (`wrote`) and ask (`is_dirty`, `flushed_seq`), and recovery and the
/// checkpoint build it.
impl CapWrites {
    /// After a clean open: everything up to the checkpoint's sequence is durable.
    pub(super) fn at_checkpoint(seq: u64) -> CapWrites {
        CapWrites { flushed_seq: seq, ..CapWrites::default() }
    }

    /// After a recovery: durable up to the watermark the headers carry,
    /// but never claiming `ceiling` or above (the first torn segment) until
    /// `lift_ceiling`.
    pub(super) fn recovered(watermark: u64, ceiling: Option<u64>) -> CapWrites {
        let flushed_seq = watermark.min(ceiling.unwrap_or(u64::MAX));
        CapWrites { flushed_seq, flushed_ceiling: ceiling, ..CapWrites::default() }
    }

    /// Every torn copy now loses to a newer one (the reopen's repairs are
    /// done): watermarks may pass them.
    pub(super) fn lift_ceiling(&mut self) {
        self.flushed_ceiling = None;
    }

    /// Something was written to the capacity device (a segment, a home
    /// block, a band's zeroed tail, a discard): durable only after the
    /// next flush, which a chunk's free, a victim's discard and a mark wait for.
    pub(super) fn wrote(&mut self) {
        self.dirty = true;
    }

    pub(super) fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// A direct write (direct.rs) was written: like `wrote`, and a mark
    /// must follow before a FLUSH or FUA is answered.
    pub(super) fn wrote_direct(&mut self) {
        (self.dirty, self.unmarked) = (true, true);
    }

    /// Whether direct writes went out since the last mark.
    pub(super) fn unmarked(&self) -> bool {
        self.unmarked
    }

    /// A mark was written: after a flush (nothing written since), it
    /// covers every direct write.
    pub(super) fn marked(&mut self) {
        if !self.dirty {
            self.unmarked = false;
        }
    }

    /// Segment writes submitted under the lock and not yet reaped.
    pub(super) fn inflight(&self) -> usize {
        self.inflight
    }

    /// Highest sequence made durable on the capacity device.
    pub(super) fn flushed_seq(&self) -> u64 {
        self.flushed_seq
    }

    /// A flush of the device completed with everything up to `seq`
    /// written: the watermark moves there (never past the ceiling, never
    /// back).
    fn flushed(&mut self, seq: u64) {
        assert_eq!(self.inflight, 0, "a flush with segment writes in flight claims them");
        let to = self.flushed_ceiling.map_or(seq, |c| seq.min(c));
        assert!(to >= self.flushed_seq, "the capacity watermark goes back from {} to {to}", self.flushed_seq);
        (self.flushed_seq, self.dirty) = (to, false);
    }
}

/// A block moved to the capacity device: its LBA, the CRC it was logged
/// with, and where its data starts in the step's `Data`.
pub(super) type Moved = (u64, u32, usize);

/// Where the data of a step's moved blocks is.
#[derive(Clone, Copy)]
pub(super) enum Data<'a> {
    /// In this buffer: copied into the segments as they are cut.
    Here(&'a [u8]),
    /// In the step's `Deferred` sources, one after the other (an offset
    /// past the first source's end is in the second, and so on): copied
    /// into the queued segments when they are submitted, by the thread that
    /// submits them, outside the lock for the background compactor's steps
    /// (step_io.rs).
    Deferred,
    /// In the cache: `Moved`'s third field is the cache block, read when
    /// the queued segment is filled, as for `Deferred`.
    Cache,
}

/// Blocks a record or segment occupies: header + data, for segments padded to the unit.
pub(super) fn segment_blocks(data_blocks: u64, unit_blocks: u64) -> u64 {
    (1 + data_blocks).div_ceil(unit_blocks) * unit_blocks
}

impl Inner {
    /// The header of a segment of `vol` numbered `seq`, listing `entries`,
    /// at the write pointer of stream `s`'s open band `band`.
    pub(super) fn segment_header(&self, band: BandId, s: Stream, vol: u32, seq: u64, entries: Vec<Entry>) -> Header {
        Header {
            kind: RecordKind::Segment,
            seq,
            volume: vol,
            epoch: self.bands[band].epoch(),
            flushed_seq: self.cap.flushed_seq(),
            engine: self.tag,
            stream: s.on_media(),
            lsn: 0,
            head_lsn: 0,
            flushed_lsn: 0,
            prev_epoch: self.bands[band].prev().0,
            prev_end: self.bands[band].prev().1,
            entries,
        }
    }

    /// Blocks of the largest capacity segment (header + data, padded).
    pub(super) fn segment_blocks_max(&self) -> u64 {
        segment_blocks(RECORD_BLOCKS_MAX as u64, self.cfg.write_unit_bytes / BS)
    }
}

impl Engine {
    /// Write `blocks` (lba, crc, where in `data`) and `tombs` of `vol` as segments into
    /// stream `s`'s open band, each padded to the write unit, under fresh
    /// sequence numbers; remap the blocks. `born`: when users wrote the
    /// data (placement.rs; a band keeps its oldest). Returns blocks moved. The
    /// CRC is the one the block was first logged with, carried along rather
    /// than recomputed: it costs nothing, and a block damaged while it sat
    /// on a device keeps a CRC that says so.
    pub(super) fn write_segments(
        &self,
        inner: &mut Inner,
        vol: u32,
        (s, born): (Stream, u64),
        (blocks, data): (&[Moved], Data<'_>),
        tombs: &[u64],
        mut deferred: Option<&mut Deferred>,
    ) -> Result<u64, VolumeError> {
        debug_assert!(matches!(data, Data::Here(_)) || deferred.is_some(), "a source is a deferred step's");
        let unit = inner.cfg.write_unit_bytes / BS;
        let (bpb, usable) = (inner.blocks_per_band(), inner.band_usable());
        let (mut rest, mut rest_t) = (blocks, tombs);
        let mut moved = 0;
        while !rest.is_empty() || !rest_t.is_empty() {
            // Deferred writes stay within the band they went to and the
            // queue depth: a new band (possibly after GC, which must see
            // every remap) is opened only once they are settled.
            if let Some(d) = deferred.as_deref_mut() {
                let writes = d.queued.len();
                if writes > 0 && (writes >= CAP_QUEUE_DEPTH || !band_has_room(inner, s)) {
                    self.settle_deferred(inner, d)?;
                }
            }
            let band = self.open_band(inner, s)?;
            let room = usable - inner.bands[band].written();
            let n = (rest.len() as u64).min(room - 1).min(RECORD_BLOCKS_MAX as u64) as usize;
            let t = rest_t.len().min(RECORD_BLOCKS_MAX - n);
            let padded = segment_blocks(n as u64, unit).min(room);
            let wp = inner.bands.append(band, padded, t as u32, born, usable);
            let seq = inner.seq.next();
            let mut entries: Vec<Entry> =
                rest[..n].iter().map(|&(lba, crc, _)| Entry { lba, crc, tombstone: false }).collect();
            entries.extend(rest_t[..t].iter().map(|&lba| Entry { lba, crc: 0, tombstone: true }));
            for &lba in &rest_t[..t] {
                inner.vols[vol as usize].l2p.retag(lba, seq)?;
            }
            let mut buf = inner.take_buf((padded * BS) as usize);
            let h = inner.segment_header(band, s, vol, seq, entries);
            encode_header(&mut buf[..BLOCK_BYTES], &h);
            buf[(n + 1) * BLOCK_BYTES..].fill(0);
            let fill = match data {
                Data::Here(d) => {
                    for (i, &(_, _, at)) in rest[..n].iter().enumerate() {
                        buf[(i + 1) * BLOCK_BYTES..(i + 2) * BLOCK_BYTES].copy_from_slice(&d[at..at + BLOCK_BYTES]);
                    }
                    None
                }
                Data::Deferred => Some(Fill::Sources(rest[..n].iter().map(|b| b.2).collect())),
                Data::Cache => Some(Fill::Cache(rest[..n].iter().map(|b| b.2 as u64).collect())),
            };
            let first = band.0 as u64 * bpb + wp;
            inner.reuse_wait(None, Some(band));
            match deferred.as_deref_mut() {
                Some(d) => {
                    d.queued.push(QueuedWrite { req: IoRequest::write(first * BS, buf, 0), fill });
                    inner.cap.wrote();
                }
                None => self.submit_capacity(inner, first * BS, buf)?,
            }
            inner.stats.segment_written(padded, n as u64);
            for (i, &(lba, _, _)) in rest[..n].iter().enumerate() {
                let loc = inner.vols[vol as usize].l2p.get(lba as usize)?;
                let to = Loc::capacity(first + 1 + i as u64);
                match deferred.as_deref_mut() {
                    Some(d) => d.remaps.push((vol, lba, loc, to)),
                    None => {
                        inner.vols[vol as usize].l2p.relocate(lba as usize, to)?;
                        inner.invalidate(loc);
                        inner.bands.add_valid(band);
                    }
                }
                moved += 1;
            }
            if inner.bands[band].written() == usable {
                inner.bands.close(band, s, seq);
            }
            rest = &rest[n..];
            rest_t = &rest_t[t..];
        }
        inner.vols[vol as usize].moved.moved(moved * BS, s.is_gc());
        Ok(moved)
    }

    /// Submit a segment write to the capacity device without waiting (at most
    /// `CAP_QUEUE_DEPTH` in flight); `drain_capacity` reaps them.
    fn submit_capacity(&self, inner: &mut Inner, offset: u64, buf: IoBuf) -> Result<(), VolumeError> {
        if inner.cap.inflight >= CAP_QUEUE_DEPTH {
            self.reap_capacity(inner, 1)?;
        }
        self.capacity.submit(IoRequest::write(offset, buf, 0));
        inner.cap.inflight += 1;
        inner.cap.wrote();
        Ok(())
    }

    /// Reap at least `min` in-flight capacity writes; the first error fails the call.
    fn reap_capacity(&self, inner: &mut Inner, min: usize) -> Result<(), VolumeError> {
        let mut out = Vec::with_capacity(inner.cap.inflight);
        let mut got = 0;
        while got < min {
            got += self.capacity.reap(min - got, &mut out);
        }
        inner.cap.inflight -= got;
        let mut first_err = None;
        if out.iter().any(|c| c.result.is_err()) && inner.cap.inflight > 0 {
            // Failing: leave nothing in flight behind the error.
            let rest = inner.cap.inflight;
            let mut n = 0;
            while n < rest {
                n += self.capacity.reap(rest - n, &mut out);
            }
            inner.cap.inflight = 0;
        }
        for c in out {
            if let Err(e) = c.result {
                first_err.get_or_insert(e);
            }
            inner.give_buf(c.buf);
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Reap the capacity writes this thread submitted under the lock
    /// (`submit_capacity`), leaving pending steps pending.
    pub(super) fn reap_own_writes(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        match inner.cap.inflight {
            0 => Ok(()),
            n => self.reap_capacity(inner, n),
        }
    }

    /// Wait for every capacity write in flight.
    pub(super) fn drain_capacity(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        self.settle(inner)?;
        self.reap_own_writes(inner)
    }

    /// Flush the capacity device; every segment written so far is durable.
    pub(super) fn flush_capacity(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        // The flushed watermark covers every segment written so far, and
        // every home write begun (home_flight.rs).
        self.drain_capacity(inner)?;
        if let Some(n) = inner.home_flight.in_flight() {
            self.homes_done.wait(n);
        }
        let seq = inner.seq.last();
        flush(&*self.capacity)?;
        inner.cap.flushed(seq);
        if let Some(id) = inner.disk_id.as_mut() {
            id.flushed();
        }
        inner.residency.disk_flushed();
        // Every home write that ended before this flush is durable: its sum
        // is true now (home_sums.rs).
        inner.home_sums.disk_flushed()?;
        Ok(())
    }
}
