//! The data path behind the log (engine/log.rs appends to it): compaction
//! into capacity segments, and GC.
//!
//! Crash safety rests on three rules (docs/engine.md):
//! 1. Every record and segment is self-describing (LBAs, CRCs, a sequence
//!    number); for each LBA the entry with the highest sequence wins.
//! 2. Compaction and GC stamp what they write with a *fresh* sequence: they
//!    only move current blocks, so the copy is newer than every stale one.
//!    Trims are records too, and their tombstones are carried forward by
//!    compaction and GC (read back from the media) while the LBA stays
//!    unmapped, so a stale copy can never win after a crash.
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

use super::unlocked::{Deferred, PreRead, Window};
use super::*;
use crate::layout::{decode_header, record_at, Entry, Header, RecordKind, STREAM_GC};

/// A block moved to the capacity device: its LBA, the CRC it was logged
/// with, and its data.
type Moved<'a> = (u64, u32, &'a [u8]);

/// Read `len` bytes at `offset` into a pooled buffer.
pub(super) fn read_pooled(
    dev: &dyn BlockDevice,
    inner: &mut Inner,
    offset: u64,
    len: usize,
) -> Result<IoBuf, VolumeError> {
    let buf = inner.take_buf(len);
    let c = sync_io(dev, IoRequest { op: IoOp::Read, offset, len: len as u64, buf, fua: false, user_data: 0 });
    match c.result {
        Ok(_) => Ok(c.buf),
        Err(e) => {
            inner.give_buf(c.buf);
            Err(e.into())
        }
    }
}

/// What one bounded compaction step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CompactStep {
    /// No full chunk.
    Idle,
    /// Part of the oldest chunk moved; the next step continues it.
    Progress,
    /// The chunk is free.
    Freed,
}

/// What one bounded GC step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GcStep {
    /// Nothing to reclaim.
    Idle,
    /// Part of the victim moved; the next step continues it.
    Progress,
    /// The victim is free.
    Reclaimed,
}

impl Inner {
    /// Where the next compaction step starts: the oldest full chunk, at the
    /// cursor a bounded step left in it (else its start).
    pub(super) fn compact_next(&self) -> Option<CompactCursor> {
        let &chunk = self.full_chunks.front()?;
        let pos = self.compact_cursor.filter(|k| k.chunk == chunk).map_or(0, |k| k.pos);
        Some(CompactCursor { chunk, pos })
    }

    /// Blocks a compaction step reads first from `pos` of its chunk.
    pub(super) fn compact_read_blocks(&self, pos: u64, blocks_max: u64) -> u64 {
        blocks_max.max(1).min(self.blocks_per_chunk() - pos)
    }

    /// Where the next GC step walks: the victim in progress, else the one
    /// `gc_victim` chooses, from its start.
    pub(super) fn gc_next(&self) -> Option<GcCursor> {
        self.gc_cursor.or_else(|| Engine::gc_victim(self).map(|victim| GcCursor { victim, pos: 0 }))
    }

    /// Whether GC reclaims victim `v` without reading it: nothing valid and
    /// no tombstone is left in it (`Band::tombstones`).
    pub(super) fn gc_skips_reading(&self, v: u32) -> bool {
        let b = &self.bands[v as usize];
        b.valid == 0 && b.tombstones == 0
    }

    /// Blocks a GC step reads at `pos` of a victim `written` blocks long: a
    /// step bounded below a window reads only what it may walk (but always
    /// enough for the largest segment).
    pub(super) fn gc_read_blocks(&self, pos: u64, blocks_max: u64, written: u64) -> u64 {
        self.gc_window_blocks().min(blocks_max.max(1).max(self.segment_blocks_max())).min(written - pos)
    }
}

/// Whether the stream's open band (or the GC band) has room for a segment:
/// a band with room for less than a header and one block is closed.
fn band_has_room(inner: &Inner, vol: u32, gc: bool) -> bool {
    let cur = if gc { inner.gc_band } else { inner.vols[inner.stream(vol)].open_band };
    cur.is_some_and(|b| inner.band_usable() - inner.bands[b as usize].written >= 2)
}

/// Blocks a record or segment occupies: header + data, for segments padded to the unit.
pub(super) fn segment_blocks(data_blocks: u64, unit_blocks: u64) -> u64 {
    (1 + data_blocks).div_ceil(unit_blocks) * unit_blocks
}

impl Engine {
    /// Move the oldest full chunk's current blocks and live tombstones to the
    /// capacity device, flush it, free the chunk (finishing the chunk a
    /// bounded step left half done, if any).
    pub(super) fn compact_oldest(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        assert!(!inner.full_chunks.is_empty(), "a full chunk exists when the log is short of space");
        while self.compact_step(inner, u64::MAX, &mut None, false)? != CompactStep::Freed {}
        Ok(())
    }

    /// Compact the oldest full chunk from where the last step stopped:
    /// read at most `blocks_max` of it (at least one whole record; the
    /// chunk itself when unbounded), move the current blocks and live
    /// tombstones of the whole records in it to their volumes' bands, and
    /// remap them — all in this call, so a block rewritten or trimmed
    /// between steps is simply not moved. The chunk stays first in
    /// `full_chunks` (and in a checkpoint) until its last step frees it,
    /// after both devices flushed (rule 3).
    pub(super) fn compact_step(
        &self,
        inner: &mut Inner,
        blocks_max: u64,
        pre: &mut Option<PreRead>,
        defer: bool,
    ) -> Result<CompactStep, VolumeError> {
        self.settle(inner)?;
        let Some(CompactCursor { chunk: c, mut pos }) = inner.compact_next() else { return Ok(CompactStep::Idle) };
        // `defer`: the step's segment writes are left in flight with their
        // remaps (`Pending`), for the caller to finish without the lock.
        let mut deferred = defer.then(Deferred::default);
        assert_eq!(inner.chunks[c as usize].state, State::Full);
        let bpc = inner.blocks_per_chunk();
        let base = c as u64 * bpc;
        let epoch = inner.chunks[c as usize].epoch;
        // The window: `blocks_max` blocks, or the first record whole if it is
        // larger (read again at its size).
        let mut len = inner.compact_read_blocks(pos, blocks_max);
        let mut end_of_chunk = len == 0;
        while !end_of_chunk {
            let win = Window { cache: true, offset: (base + pos) * BS, len: (len * BS) as usize, gen: epoch };
            let data = self.read_window(inner, pre, win)?;
            // Per volume: current data blocks (lba, crc, offset in window) and live tombstones.
            let mut blocks: Vec<Vec<(u64, u32, usize)>> = vec![Vec::new(); inner.vols.len()];
            let mut tombs: Vec<Vec<u64>> = vec![Vec::new(); inner.vols.len()];
            let mut at = 0u64;
            let mut first_needs = None;
            while at < len {
                let block = &data[(at * BS) as usize..((at + 1) * BS) as usize];
                // Never written, torn, or a previous generation: the chunk's
                // end — unless blocks of it are still current past this
                // point (a recovery kept records past a torn or damaged
                // one): then the next block is looked at.
                let h = record_at(block, pos + at, bpc, inner.tag).filter(|h| h.epoch == epoch);
                let Some(h) = h.filter(|h| (h.volume as usize) < inner.vols.len()) else {
                    let collected: usize = blocks.iter().map(|b| b.len()).sum();
                    if inner.chunks[c as usize].valid as usize <= collected {
                        end_of_chunk = true;
                        break;
                    }
                    at += 1;
                    continue;
                };
                let n = h.data_blocks() as u64;
                if at + 1 + n > len {
                    // The next step's window starts with this record.
                    first_needs = (at == 0).then_some(1 + n);
                    break;
                }
                let vol = h.volume as usize;
                if h.kind == RecordKind::Gap {
                    // Nothing to move: it names LSNs, not blocks.
                } else if h.kind == RecordKind::Write {
                    for (i, e) in h.entries.iter().enumerate() {
                        let cb = base + pos + at + 1 + i as u64;
                        if inner.vols[vol].l2p.try_get(e.lba) == Some(Loc::cache(cb)) {
                            blocks[vol].push((e.lba, e.crc, ((at + 1 + i as u64) * BS) as usize));
                        }
                    }
                } else {
                    for e in &h.entries {
                        if inner.vols[vol].l2p.try_get(e.lba) == Some(Loc::NONE) {
                            tombs[vol].push(e.lba);
                        }
                    }
                }
                at += 1 + n;
            }
            if let Some(need) = first_needs {
                inner.give_buf(data);
                len = need;
                continue;
            }
            for vol in 0..inner.vols.len() {
                if blocks[vol].is_empty() && tombs[vol].is_empty() {
                    continue;
                }
                let payload: Vec<Moved<'_>> =
                    blocks[vol].iter().map(|&(lba, crc, off)| (lba, crc, &data[off..off + BLOCK_BYTES])).collect();
                let moved = self.write_segments(inner, vol as u32, false, &payload, &tombs[vol], deferred.as_mut())?;
                inner.stats.compaction_bytes += moved * BS;
            }
            inner.give_buf(data);
            pos += at;
            end_of_chunk |= pos >= bpc;
            break;
        }
        // Nothing stays in flight between steps: requests in between use
        // the capacity device synchronously.
        self.drain_capacity(inner)?;
        if !end_of_chunk {
            inner.compact_cursor = Some(CompactCursor { chunk: c, pos });
            inner.defer_pending(deferred);
            return Ok(CompactStep::Progress);
        }
        // The chunk is freed below: its moved blocks must live at their
        // copies first.
        if let Some(d) = deferred.as_mut() {
            self.settle_deferred(inner, d)?;
        }
        // Blocks still current that no record header led to: a header
        // damaged at rest since the engine opened (a clean open reads the
        // checkpoint, not the log). Damage, not a bug: changes stop, and
        // the next open's recovery refuses it for `sluice check`.
        let left = inner.chunks[c as usize].valid;
        if left != 0 {
            return Err(VolumeError::Damaged {
                device: "cache",
                offset: base * BS,
                what: format!("log chunk {c}: {left} current blocks follow no readable record header"),
            });
        }
        // Rule 3: the copies, and whatever superseded the chunk's dropped
        // entries, are durable before the chunk can be reused.
        if inner.cap_dirty {
            self.flush_capacity(inner)?;
        }
        // What the capacity device now holds durably, for recovery to tell
        // damage from a torn write (marks.rs); durable with the chunk's flush.
        self.write_mark(inner, Some(c), None)?;
        self.flush_cache(inner)?;
        assert_eq!(inner.full_chunks.pop_front(), Some(c));
        inner.compact_cursor = None;
        inner.chunks[c as usize].state = State::Free;
        inner.sim_freed(Some(c), None);
        inner.free_chunks.push_back(c);
        inner.stats.chunks_compacted += 1;
        Ok(CompactStep::Freed)
    }

    /// Write `blocks` (lba, crc, data) and `tombs` of `vol` as segments into
    /// its open band (or the GC band), each padded to the write unit, under
    /// fresh sequence numbers; remap the blocks. Returns blocks moved. The
    /// CRC is the one the block was first logged with, carried along rather
    /// than recomputed: it costs nothing, and a block damaged while it sat
    /// on a device keeps a CRC that says so.
    pub(super) fn write_segments(
        &self,
        inner: &mut Inner,
        vol: u32,
        gc: bool,
        blocks: &[Moved<'_>],
        tombs: &[u64],
        mut deferred: Option<&mut Deferred>,
    ) -> Result<u64, VolumeError> {
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
                if writes > 0 && (writes >= CAP_QUEUE_DEPTH || !band_has_room(inner, vol, gc)) {
                    self.settle_deferred(inner, d)?;
                }
            }
            let band = self.open_band(inner, vol, gc)?;
            let wp = inner.bands[band as usize].written;
            let room = usable - wp;
            let n = (rest.len() as u64).min(room - 1).min(RECORD_BLOCKS_MAX as u64) as usize;
            let t = rest_t.len().min(RECORD_BLOCKS_MAX - n);
            let padded = segment_blocks(n as u64, unit).min(room);
            inner.seq += 1;
            let mut entries: Vec<Entry> =
                rest[..n].iter().map(|&(lba, crc, _)| Entry { lba, crc, tombstone: false }).collect();
            entries.extend(rest_t[..t].iter().map(|&lba| Entry { lba, crc: 0, tombstone: true }));
            let mut buf = inner.take_buf((padded * BS) as usize);
            let h = Header {
                kind: RecordKind::Segment,
                seq: inner.seq,
                volume: vol,
                epoch: inner.bands[band as usize].epoch,
                flushed_seq: inner.cap_flushed_seq,
                engine: inner.tag,
                stream: if gc { STREAM_GC } else { inner.stream(vol) as u32 },
                lsn: 0,
                head_lsn: 0,
                flushed_lsn: 0,
                prev_epoch: inner.bands[band as usize].prev.0,
                prev_end: inner.bands[band as usize].prev.1,
                entries,
            };
            encode_header(&mut buf[..BLOCK_BYTES], &h);
            let b = &mut inner.bands[band as usize];
            b.tombstones = b.tombstones.saturating_add(t as u32);
            for (i, (_, _, d)) in rest[..n].iter().enumerate() {
                buf[(i + 1) * BLOCK_BYTES..(i + 2) * BLOCK_BYTES].copy_from_slice(d);
            }
            buf[(n + 1) * BLOCK_BYTES..].fill(0);
            let first = band as u64 * bpb + wp;
            inner.sim_wait(None, Some(band));
            match deferred.as_deref_mut() {
                Some(d) => {
                    d.queued.push(IoRequest::write(first * BS, buf, 0));
                    inner.cap_dirty = true;
                }
                None => self.submit_capacity(inner, first * BS, buf)?,
            }
            inner.stats.capacity_write_bytes += padded * BS;
            inner.stats.compaction_pad_bytes += (padded - n as u64) * BS;
            for (i, &(lba, _, _)) in rest[..n].iter().enumerate() {
                let loc = inner.vols[vol as usize].l2p.get(lba as usize);
                let to = Loc::capacity(first + 1 + i as u64);
                match deferred.as_deref_mut() {
                    Some(d) => d.remaps.push((vol, lba, loc, to)),
                    None => {
                        inner.invalidate(loc);
                        inner.vols[vol as usize].l2p.relocate(lba as usize, to);
                        inner.bands[band as usize].valid += 1;
                    }
                }
                moved += 1;
            }
            inner.bands[band as usize].written += padded;
            if inner.bands[band as usize].written == usable {
                inner.close_band(band, vol, gc);
            }
            rest = &rest[n..];
            rest_t = &rest_t[t..];
        }
        let m = &mut inner.vols[vol as usize].moved;
        if gc {
            m.gc_bytes += moved * BS;
        } else {
            m.compaction_bytes += moved * BS;
        }
        Ok(moved)
    }

    /// The open band of a stream, opening a free one (after GC if short).
    fn open_band(&self, inner: &mut Inner, vol: u32, gc: bool) -> Result<u32, VolumeError> {
        let stream = inner.stream(vol);
        let cur = if gc { inner.gc_band } else { inner.vols[stream].open_band };
        if let (Some(b), true) = (cur, band_has_room(inner, vol, gc)) {
            return Ok(b);
        }
        // Zone finish and GC are synchronous on the capacity device.
        self.drain_capacity(inner)?;
        if let Some(b) = cur {
            let start = b as u64 * inner.cfg.band_bytes;
            zoned::finish_band(&*self.capacity, inner.geo.zoned, start)?;
            inner.close_band(b, vol, gc);
        }
        if !gc {
            // Bounded: a victim that frees no more than its relocation takes
            // cannot spin here; past the bound the caller sees NoSpace.
            let mut rounds = inner.bands.len();
            while inner.free_bands.len() <= inner.cfg.gc_free_bands_min && rounds > 0 {
                if !self.collect_one(inner)? {
                    break;
                }
                rounds -= 1;
            }
        }
        let b = inner.free_bands.pop_front().ok_or(VolumeError::NoSpace)?;
        let band = &mut inner.bands[b as usize];
        assert_eq!(band.state, State::Free);
        assert_eq!(band.valid, 0);
        band.state = State::Open;
        band.written = 0;
        band.tombstones = 0;
        inner.seq += 1;
        // The band this stream filled before, if it still holds what it
        // held then (GC may have reclaimed it since): it must read back as
        // far as it reaches now once this band's first segment is durable.
        let last = if gc { inner.gc_last_band } else { inner.vols[stream].last_band };
        let prev = last
            .map(|(p, epoch)| (&inner.bands[p as usize], epoch))
            .filter(|(p, epoch)| p.state == State::Full && p.epoch == *epoch)
            .map_or((0, 0), |(p, epoch)| (epoch, p.written));
        let band = &mut inner.bands[b as usize];
        band.epoch = inner.seq;
        band.prev = prev;
        if gc {
            inner.gc_band = Some(b);
        } else {
            inner.vols[stream].open_band = Some(b);
        }
        Ok(b)
    }

    /// Reclaim one band (finishing the one a bounded step left half done,
    /// if any); false if nothing is reclaimable.
    fn collect_one(&self, inner: &mut Inner) -> Result<bool, VolumeError> {
        loop {
            match self.gc_step(inner, u64::MAX, &mut None, false)? {
                GcStep::Idle => return Ok(false),
                GcStep::Reclaimed => return Ok(true),
                GcStep::Progress => {}
            }
        }
    }

    /// The band GC should take next, by cost-benefit. A band with nothing
    /// valid left costs no copies and is always taken first (plain
    /// cost-benefit would prefer an older half-full band to a younger empty
    /// one: a sequentially rewritten tenant's zones die whole, a moment
    /// after they are old enough to be chosen).
    pub(super) fn gc_victim(inner: &Inner) -> Option<u32> {
        let usable = inner.band_usable();
        let now = inner.seq;
        inner
            .bands
            .iter()
            .enumerate()
            .filter(|&(i, b)| {
                b.state == State::Full && (b.valid as u64) < usable && !inner.quarantine.contains(&(i as u32))
            })
            .map(|(i, b)| {
                let u = b.valid as f64 / usable as f64;
                let age = (now - b.closed_seq) as f64 + 1.0;
                (i, if b.valid == 0 { f64::INFINITY } else { (1.0 - u) * age / (1.0 + u) })
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i as u32)
    }

    /// GC the victim in progress (choosing one if none is) for at least one
    /// segment and until `blocks_max` of its blocks were walked (or the
    /// victim ends; `gc_window_blocks` is one full read): its current blocks and live
    /// tombstones go to the GC band under fresh sequence numbers. Between
    /// steps the victim stays Full and readable and the engine lock is free,
    /// so the background compactor collects a band a window at a time; every
    /// window re-checks the map, so blocks rewritten or trimmed meanwhile are
    /// simply not moved. The victim is discarded (after both devices flush,
    /// rule 3) when its last window is done.
    pub(super) fn gc_step(
        &self,
        inner: &mut Inner,
        blocks_max: u64,
        pre: &mut Option<PreRead>,
        defer: bool,
    ) -> Result<GcStep, VolumeError> {
        // Every remap applied before valid counts choose or walk a victim.
        self.settle(inner)?;
        // `defer`: as in `compact_step`, relocations stay in flight with
        // their remaps for the caller to finish without the lock.
        let mut deferred = defer.then(Deferred::default);
        let blocks_max = blocks_max.max(1);
        let Some(cursor) = inner.gc_next() else { return Ok(GcStep::Idle) };
        inner.gc_cursor = Some(cursor);
        let GcCursor { victim: v, mut pos } = cursor;
        let bpb = inner.blocks_per_band();
        let unit = inner.cfg.write_unit_bytes / BS;
        let first = v as u64 * bpb;
        let written = inner.bands[v as usize].written;
        // A victim with no valid block and no tombstone holds nothing to
        // move: reclaim it without reading it.
        if inner.gc_skips_reading(v) {
            pos = written;
            if let Some(p) = pre.take() {
                inner.give_buf(p.into_buf());
            }
            self.bg.victims_unread.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // Reads are whole windows of the band (≥ a chunk, ≥ the largest
        // segment), not a header and then data per segment: a NAND device
        // serves one large read from all its dies at once.
        let window_blocks = inner.gc_window_blocks();
        // Walk the victim segment by segment, gathering current blocks and
        // live tombstones per volume; every window's worth of them (and what
        // is left at the end of the step) goes to the GC band as segments.
        let nv = inner.vols.len();
        // Per volume: current blocks (lba, crc), their data, live tombstones.
        type Gathered = (Vec<(u64, u32)>, Vec<u8>, Vec<u64>);
        let mut gathered: Vec<Gathered> = vec![(Vec::new(), Vec::new(), Vec::new()); nv];
        let mut held = 0u64;
        let mut walked = 0u64;
        while pos < written && walked < blocks_max {
            self.drain_capacity(inner)?;
            // This thread is about to read the capacity device, whose
            // completions for it would include the deferred writes'.
            if let Some(d) = deferred.as_mut().filter(|d| !d.queued.is_empty()) {
                self.settle_deferred(inner, d)?;
            }
            let len = inner.gc_read_blocks(pos, blocks_max, written);
            let gen = inner.bands[v as usize].gen;
            let win = self.read_window(
                inner,
                pre,
                Window { cache: false, offset: (first + pos) * BS, len: (len * BS) as usize, gen },
            )?;
            // Segments whose data lies wholly in the window; `at` ends at the
            // first that does not (the next window starts there).
            let mut at = 0u64;
            while at < len && walked + at < blocks_max {
                let h = decode_header(&win[(at * BS) as usize..((at + 1) * BS) as usize], inner.tag);
                let damaged =
                    |what: String| VolumeError::Damaged { device: "capacity", offset: (first + pos + at) * BS, what };
                let h = h.map_err(|e| damaged(format!("band {v} segment header: {e}")))?;
                let n = h.data_blocks() as u64;
                if at + 1 + n > len {
                    break;
                }
                let vol = h.volume as usize;
                if vol >= nv {
                    let msg = format!("band {v} segment at block {}: volume {vol} unknown", pos + at);
                    return Err(damaged(msg));
                }
                let seg = first + pos + at;
                let l2p = &inner.vols[vol].l2p;
                let g = &mut gathered[vol];
                for (i, e) in h.entries.iter().filter(|e| !e.tombstone).enumerate() {
                    if l2p.try_get(e.lba) == Some(Loc::capacity(seg + 1 + i as u64)) {
                        let d = ((at + 1 + i as u64) * BS) as usize;
                        g.0.push((e.lba, e.crc));
                        g.1.extend_from_slice(&win[d..d + BLOCK_BYTES]);
                        held += 1;
                    }
                }
                let tombs = h.entries.iter().filter(|e| e.tombstone && l2p.try_get(e.lba) == Some(Loc::NONE));
                g.2.extend(tombs.map(|e| e.lba));
                at += segment_blocks(n, unit);
            }
            inner.give_buf(win);
            if at == 0 {
                return Err(VolumeError::Damaged {
                    device: "capacity",
                    offset: (first + pos) * BS,
                    what: format!("band {v} segment larger than a GC window"),
                });
            }
            pos += at;
            walked += at;
            if held >= window_blocks || pos >= written || walked >= blocks_max {
                for (vol, g) in gathered.iter_mut().enumerate() {
                    if g.0.is_empty() && g.2.is_empty() {
                        continue;
                    }
                    let payload: Vec<Moved<'_>> =
                        g.0.iter().zip(g.1.chunks(BLOCK_BYTES)).map(|(&(lba, crc), d)| (lba, crc, d)).collect();
                    let moved = self.write_segments(inner, vol as u32, true, &payload, &g.2, deferred.as_mut())?;
                    inner.stats.gc_bytes += moved * BS;
                    g.0.clear();
                    g.1.clear();
                    g.2.clear();
                }
                held = 0;
            }
        }
        // Nothing stays in flight between steps: requests in between use
        // the capacity device synchronously.
        self.drain_capacity(inner)?;
        if pos < written {
            inner.gc_cursor = Some(GcCursor { victim: v, pos });
            inner.defer_pending(deferred);
            return Ok(GcStep::Progress);
        }
        // The victim is discarded below: its blocks must live at their
        // copies first.
        if let Some(d) = deferred.as_mut() {
            self.settle_deferred(inner, d)?;
        }
        assert_eq!(inner.bands[v as usize].valid, 0, "victim fully relocated");
        // Rule 3: relocations, and whatever made the victim's dropped entries
        // stale, are durable before the victim is discarded.
        if inner.cap_dirty {
            self.flush_capacity(inner)?;
        }
        self.write_mark(inner, None, Some(v))?;
        self.flush_cache(inner)?;
        // Reads outside the lock that still hold a location in the victim
        // must see that its data may be gone.
        inner.bands[v as usize].gen += 1;
        zoned::reclaim_band(&*self.capacity, inner.geo.zoned, first * BS, inner.cfg.band_bytes)?;
        // The discard is durable only after the next capacity flush, which
        // the next mark must follow (until then the reclaim mark stands).
        inner.cap_dirty = true;
        inner.gc_cursor = None;
        inner.bands[v as usize].state = State::Free;
        inner.sim_freed(None, Some(v));
        inner.free_bands.push_back(v);
        inner.stats.bands_reclaimed += 1;
        Ok(GcStep::Reclaimed)
    }

    /// After recovery: log the LSN ranges it accepted as missing (a gap
    /// record), flushed before anything else is written, so that later
    /// recoveries count them neither as missing nor as damage.
    pub(super) fn log_gaps(&self, gaps: &[(u64, u64)]) -> Result<(), VolumeError> {
        let mut inner = self.lock();
        let mut entries: Vec<Entry> = Vec::new();
        for &(from, to) in gaps {
            let mut at = from;
            while at <= to {
                let more = (to - at).min(u32::MAX as u64);
                entries.push(Entry { lba: at, crc: more as u32, tombstone: true });
                at += more + 1;
            }
        }
        for part in entries.chunks(RECORD_BLOCKS_MAX) {
            self.log_record(&mut inner, 0, RecordKind::Gap, part.to_vec(), &[])?;
        }
        self.flush_cache(&mut inner)
    }

    /// After recovery: write the current content of `blocks` (volume, LBA)
    /// again under fresh sequence numbers — data as a write record, an
    /// unmapped block as a tombstone — and flush, so a torn segment left on
    /// the media with a higher sequence can never win a later recovery.
    pub(super) fn relog(&self, blocks: &[(u32, u64)]) -> Result<(), VolumeError> {
        let mut inner = self.lock();
        for &(vol, lba) in blocks {
            let l2p = &inner.vols[vol as usize].l2p;
            let (loc, crc) = (l2p.get(lba as usize), l2p.crc(lba as usize));
            if loc.is_none() {
                let e = Entry { lba, crc: 0, tombstone: true };
                self.log_record(&mut inner, vol, RecordKind::Trim, vec![e], &[])?;
            } else {
                let mut b = vec![0u8; BLOCK_BYTES];
                self.read_blocks(&[loc], &[crc], lba * BS, &mut b)?;
                self.append(&mut inner, vol, &[(lba, &b)], &[crc], false)?;
            }
        }
        self.flush_cache(&mut inner)
    }

    /// Submit a segment write to the capacity device without waiting (at most
    /// `CAP_QUEUE_DEPTH` in flight); `drain_capacity` reaps them.
    fn submit_capacity(&self, inner: &mut Inner, offset: u64, buf: IoBuf) -> Result<(), VolumeError> {
        if inner.cap_inflight >= CAP_QUEUE_DEPTH {
            self.reap_capacity(inner, 1)?;
        }
        self.capacity.submit(IoRequest::write(offset, buf, 0));
        inner.cap_inflight += 1;
        inner.cap_dirty = true;
        Ok(())
    }

    /// Reap at least `min` in-flight capacity writes; the first error fails the call.
    fn reap_capacity(&self, inner: &mut Inner, min: usize) -> Result<(), VolumeError> {
        let mut out = Vec::with_capacity(inner.cap_inflight);
        let mut got = 0;
        while got < min {
            got += self.capacity.reap(min - got, &mut out);
        }
        inner.cap_inflight -= got;
        let mut first_err = None;
        if out.iter().any(|c| c.result.is_err()) && inner.cap_inflight > 0 {
            // Failing: leave nothing in flight behind the error.
            let rest = inner.cap_inflight;
            let mut n = 0;
            while n < rest {
                n += self.capacity.reap(rest - n, &mut out);
            }
            inner.cap_inflight = 0;
        }
        for c in out {
            if let Err(e) = c.result {
                first_err.get_or_insert(e);
            }
            inner.give_buf(c.buf);
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Wait for every capacity write in flight.
    pub(super) fn drain_capacity(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        self.settle(inner)?;
        let n = inner.cap_inflight;
        if n == 0 {
            return Ok(());
        }
        self.reap_capacity(inner, n)
    }

    /// Flush the cache device; every record written so far is durable.
    pub(super) fn flush_cache(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        let (seq, lsn) = (inner.seq, inner.lsn);
        flush(&*self.cache)?;
        inner.cache_flushed_seq = seq;
        inner.cache_flushed_lsn = lsn;
        Ok(())
    }

    /// Flush the capacity device; every segment written so far is durable.
    pub(super) fn flush_capacity(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        // The flushed watermark covers every segment written so far.
        self.drain_capacity(inner)?;
        let seq = inner.seq;
        flush(&*self.capacity)?;
        inner.cap_flushed_seq = inner.cap_flushed_ceiling.map_or(seq, |c| seq.min(c));
        inner.cap_dirty = false;
        Ok(())
    }
}
