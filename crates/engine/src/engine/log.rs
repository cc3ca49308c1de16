//! The write log: appending write and trim records to the cache device and
//! pointing the maps at them.
//!
//! Owns: group commit (writes of one volume share records), records built
//! from the caller's slices or handed over whole in a buffer the engine gave
//! out (no copy: writers.rs logs them), the open chunk, and taking a fresh chunk
//! (compacting when free chunks run low, compaction.rs).
//!
//! Invariants: a record lists each LBA at most once and fits its chunk
//! (`Inner::record_blocks_max`); the maps point at a record's blocks only
//! once its device write completed; a durable record needs every earlier
//! record of its chunk durable, so FUA is a cache flush.

use super::caching::CacheCount;
use super::{
    encode_header, flush, pool, sync_io, writers, BandPlacement, Engine, Inner, IoBuf, IoRequest, Layout, Loc,
    VecDeque, VolumeError, BLOCK_BYTES, BS, RECORD_BLOCKS_MAX,
};
use crate::layout::{Entry, Header, RecordKind};

impl Inner {
    /// The header of the next log record, of `kind`, for `vol`, in `chunk`
    /// (it takes the next sequence number; the caller numbers the LSN).
    pub(super) fn next_header(&mut self, kind: RecordKind, vol: u32, chunk: ChunkId, entries: Vec<Entry>) -> Header {
        Header {
            kind,
            seq: self.seq.next(),
            volume: vol,
            epoch: self.log.chunks[chunk].epoch,
            flushed_seq: self.log.flushed_seq,
            engine: self.tag,
            stream: 0,
            lsn: self.log.lsn + 1,
            head_lsn: self.head_lsn(),
            flushed_lsn: self.log.flushed_lsn,
            prev_epoch: 0,
            prev_end: 0,
            entries,
        }
    }

    /// The first log record still needed: the oldest full chunk's first,
    /// else the open chunk's, else the next one to be written.
    pub(super) fn head_lsn(&self) -> u64 {
        let oldest = self.log.full.front().copied().or(self.log.open.map(|(c, _)| c));
        oldest.map_or(self.log.lsn + 1, |c| self.log.chunks[c].first_lsn)
    }

    /// Most data blocks one write record holds: what a header lists, and
    /// what fits in a chunk after its header.
    pub(super) fn record_blocks_max(&self) -> usize {
        RECORD_BLOCKS_MAX.min(self.blocks_per_chunk() as usize - 1)
    }
}

impl Engine {
    /// Append writes of volume `vol`, each (first LBA, data), as few records
    /// as they fit in (group commit): a record takes blocks until it holds
    /// `RECORD_BLOCKS_MAX` or the next block's LBA is already in it (so an
    /// LBA appears at most once per record and replay needs no tie-break).
    /// Many 4 KiB writes then share one header block and one device write.
    pub(super) fn append(
        &self,
        inner: &mut Inner,
        vol: u32,
        writes: &[(u64, &[u8])],
        crcs: &[u32],
        fua: bool,
    ) -> Result<(), VolumeError> {
        for mut rec in writers::records_of(writes, crcs, inner.record_blocks_max()) {
            let r = self.append_record(inner, vol, &mut rec);
            pool::give_thread_buf(rec.buf);
            r?;
        }
        if fua {
            // A flush, not a FUA write: recovery walks a chunk record by
            // record, so a durable record needs every earlier one durable.
            self.flush_cache_for_client(inner)?;
        }
        Ok(())
    }

    /// One write record (`records_of`) of `vol` logged under the lock, then
    /// the maps. Its entries are used up; its buffer stays in it.
    pub(super) fn append_record(
        &self,
        inner: &mut Inner,
        vol: u32,
        rec: &mut writers::Record,
    ) -> Result<(), VolumeError> {
        debug_assert!((1..=inner.record_blocks_max()).contains(&rec.entries.len()));
        let blocks: Vec<(u64, u32)> = rec.entries.iter().map(|e| (e.lba, e.crc)).collect();
        let buf = std::mem::replace(&mut rec.buf, IoBuf::empty());
        let (r, buf) = self.log_record_in(inner, vol, RecordKind::Write, std::mem::take(&mut rec.entries), buf);
        rec.buf = buf;
        Self::map_record(inner, vol, r?, blocks.into_iter())
    }

    /// Point the maps at a record's blocks (LBA, CRC), which follow its
    /// header block — each unless the map holds a newer copy (a record
    /// written outside the lock completed after a later one, writers.rs).
    pub(super) fn map_record(
        inner: &mut Inner,
        vol: u32,
        header_block: u64,
        blocks: impl Iterator<Item = (u64, u32)>,
    ) -> Result<(), VolumeError> {
        for (i, (lba, crc)) in blocks.enumerate() {
            let old = inner.vols[vol as usize].l2p.get(lba as usize)?;
            if inner.supersedes(old, header_block + 1 + i as u64) {
                continue;
            }
            inner.vols[vol as usize].l2p.set(lba as usize, Loc::cache(header_block + 1 + i as u64), crc)?;
            // Lifetime placement's hint, from the copy replaced (placement.rs).
            let lifetime = if inner.placement == BandPlacement::Lifetime { inner.lifetime_class(old) } else { 0 };
            inner.invalidate(old);
            let cb = header_block + 1 + i as u64;
            inner.log.place(cb, vol, lba, lifetime);
            if inner.cfg.layout == Layout::InPlace {
                inner.residency.logged(cb);
                inner.vols[vol as usize].cache.logged_dirty();
            }
        }
        Ok(())
    }

    /// Log a trim of `lbas` of `vol` (header-only records), then unmap them.
    /// `discard`: a user's trim, whose dirty cached blocks (in place) are
    /// counted as never written home.
    pub(super) fn trim_logged(
        &self,
        inner: &mut Inner,
        vol: u32,
        lbas: std::ops::Range<u64>,
        discard: bool,
    ) -> Result<(), VolumeError> {
        let l2p = &inner.vols[vol as usize].l2p;
        let mut mapped: Vec<u64> = Vec::new();
        for lba in lbas {
            if !l2p.get(lba as usize)?.is_none() {
                mapped.push(lba);
            }
        }
        // In place, the copies leave the maps before the tombstones take log
        // space: that may reclaim the oldest chunk, which must not clean
        // home the very blocks being trimmed. (A crash before the
        // tombstones are durable brings back older bytes, which a trim
        // allows.) With bands, the tombstones come first (segments.rs,
        // rule 3).
        let in_place = inner.in_place();
        if in_place {
            // A read that looked before this trim must not promote what it
            // read from the log as if it were the home's bytes.
            inner.vols[vol as usize].cache.home_changed();
        }
        for part in mapped.chunks(RECORD_BLOCKS_MAX) {
            // The tombstones' sequence (one record), kept in the map's
            // entries (`l2p::tombstone_tag`); in place, none.
            let mut seq = None;
            if !in_place {
                self.log_tombstones(inner, vol, part)?;
                seq = Some(inner.seq.last());
            }
            for &lba in part {
                let old = inner.vols[vol as usize].l2p.get(lba as usize)?;
                if let (true, Some(cb)) = (discard && inner.in_place(), old.cache_block()) {
                    if !inner.residency.is_clean(cb) {
                        inner.vols[vol as usize].cache.count(CacheCount::DiscardedDirty, BS);
                    }
                }
                match seq {
                    Some(seq) => inner.vols[vol as usize].l2p.unmap(lba as usize, seq)?,
                    None => inner.vols[vol as usize].l2p.set(lba as usize, Loc::NONE, 0)?,
                }
                inner.invalidate(old);
            }
            if in_place {
                self.log_tombstones(inner, vol, part)?;
            }
        }
        Ok(())
    }

    /// Log tombstones for `lbas` of `vol` (header-only records); the maps
    /// are the caller's.
    pub(super) fn log_tombstones(&self, inner: &mut Inner, vol: u32, lbas: &[u64]) -> Result<(), VolumeError> {
        for part in lbas.chunks(RECORD_BLOCKS_MAX) {
            let entries: Vec<Entry> = part.iter().map(|&lba| Entry { lba, crc: 0, tombstone: true }).collect();
            self.log_record(inner, vol, RecordKind::Trim, entries, &[])?;
        }
        Ok(())
    }

    /// Log tombstones again for unmapped `lbas` of `vol` (with bands): each
    /// new one is its block's newest (`l2p::tombstone_tag`), so an older
    /// copy of the tombstone may leave the media (a band emptied,
    /// salvage.rs).
    pub(super) fn relog_tombstones(&self, inner: &mut Inner, vol: u32, lbas: &[u64]) -> Result<(), VolumeError> {
        debug_assert!(!inner.in_place(), "in place, tombstones carry no tag");
        for part in lbas.chunks(RECORD_BLOCKS_MAX) {
            self.log_tombstones(inner, vol, part)?;
            let seq = inner.seq.last();
            for &lba in part {
                assert!(inner.vols[vol as usize].l2p.get(lba as usize)?.is_none(), "a tombstone of a mapped block");
                inner.vols[vol as usize].l2p.unmap(lba as usize, seq)?;
            }
        }
        Ok(())
    }

    /// Append one log record with one device write: a header of `kind`
    /// listing `entries`, then `data` (the blocks of its non-tombstone
    /// entries, in pieces). Returns the cache block of the header.
    pub(super) fn log_record(
        &self,
        inner: &mut Inner,
        vol: u32,
        kind: RecordKind,
        entries: Vec<Entry>,
        data: &[&[u8]],
    ) -> Result<u64, VolumeError> {
        let data_bytes: usize = data.iter().map(|d| d.len()).sum();
        let mut rec = inner.take_buf(BLOCK_BYTES + data_bytes);
        let mut at = BLOCK_BYTES;
        for d in data {
            rec[at..at + d.len()].copy_from_slice(d);
            at += d.len();
        }
        let (r, rec) = self.log_record_in(inner, vol, kind, entries, rec);
        inner.give_buf(rec);
        r
    }

    /// `log_record` of data already in `rec` after its first block, where
    /// the header goes. Gives `rec` back, whatever happened.
    fn log_record_in(
        &self,
        inner: &mut Inner,
        vol: u32,
        kind: RecordKind,
        entries: Vec<Entry>,
        mut rec: IoBuf,
    ) -> (Result<u64, VolumeError>, IoBuf) {
        let need = (rec.len() / BLOCK_BYTES) as u64;
        let (chunk, off) = match self.log_space(inner, need) {
            Ok(place) => place,
            Err(e) => return (Err(e), rec),
        };
        let h = inner.next_header(kind, vol, chunk, entries);
        encode_header(&mut rec[..BLOCK_BYTES], &h);
        // Numbered whether or not the write succeeds: a failed write stops
        // the engine, and its number is above anything a flush made durable.
        inner.log.next_lsn();
        let header_block = chunk.0 as u64 * inner.blocks_per_chunk() + off;
        inner.log.note_header(chunk, off);
        inner.reuse_wait(Some(chunk), None);
        let c = sync_io(&*self.cache, IoRequest::write(header_block * BS, rec, 0));
        if let Err(e) = c.result {
            return (Err(e.into()), c.buf);
        }
        inner.stats.logged(need);
        inner.log.advance(chunk, off, need);
        (Ok(header_block), c.buf)
    }

    /// A place for `need` blocks in the log: the open chunk, or a fresh one
    /// (compacting the oldest chunks when free chunks run low).
    /// In place, a reclaim may log the blocks it keeps (`Engine::log_kept`),
    /// opening a chunk meanwhile: after each compaction the open chunk is
    /// looked at again.
    fn log_space(&self, inner: &mut Inner, need: u64) -> Result<(ChunkId, u64), VolumeError> {
        let place = self.log_space_or_busy(inner, need, false)?;
        Ok(place.expect("with no record in flight, compaction can always go on"))
    }

    /// `log_space`, or None when room needs a compaction that would move a
    /// block a record in flight rewrites (writers.rs: `relocations_clear`),
    /// or (`after_assist`) while a writer takes a compaction step (assist.rs).
    pub(super) fn log_space_or_busy(
        &self,
        inner: &mut Inner,
        need: u64,
        after_assist: bool,
    ) -> Result<Option<(ChunkId, u64)>, VolumeError> {
        loop {
            if let Some((c, off)) = inner.log.open {
                if off + need <= inner.blocks_per_chunk() {
                    return Ok(Some((c, off)));
                }
                let c = inner.log.seal_open();
                inner.residency.sealed(c, inner.now_ns());
            }
            if inner.log.free.len() > inner.cfg.log_free_chunks_min {
                break;
            }
            // Or a writer is taking a step (assist.rs): wait for its end
            // rather than compact a whole chunk under the lock.
            if !inner.relocations_clear() || (after_assist && inner.assisting) {
                return Ok(None);
            }
            inner.writer_waits = need;
            let r = self.compact_oldest(inner);
            inner.writer_waits = 0;
            r?;
        }
        // A reused place: lock-free reads that looked before must read again.
        inner.reuses.fetch_add(1, std::sync::atomic::Ordering::Release);
        let epoch = inner.seq.next();
        // The record about to be written into it is its first.
        let c = inner.log.open_next(epoch, inner.log.lsn() + 1);
        Ok(Some((c, 0)))
    }
}

/// A log chunk's number: chunk c holds cache blocks c·chunk_blocks onwards
/// (`Inner::blocks_per_chunk`); chunk 0 holds the superblock and marks. On
/// the media (marks, the checkpoint) it is a u32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct ChunkId(pub(super) u32);

impl ChunkId {
    pub(super) fn index(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for ChunkId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::ops::Index<ChunkId> for Vec<Chunk> {
    type Output = Chunk;
    fn index(&self, c: ChunkId) -> &Chunk {
        &self[c.index()]
    }
}

impl std::ops::IndexMut<ChunkId> for Vec<Chunk> {
    fn index_mut(&mut self, c: ChunkId) -> &mut Chunk {
        &mut self[c.index()]
    }
}

/// The log's state: every chunk, which are free (oldest freed first), which
/// are full (oldest first: compaction's queue), the open one, and the LSNs.
///
/// The chunk lists and the open chunk are private to this module: a chunk
/// moves between them only through `open_next`, `seal_open`, `advance`
/// and `free_oldest`, which assert the chunk's state and contents.
pub(super) struct Log {
    chunks: Vec<Chunk>,
    free: VecDeque<ChunkId>,
    full: VecDeque<ChunkId>,
    /// The chunk records are appended to, and the next block in it.
    open: Option<(ChunkId, u64)>,
    /// The last log record's number (LSN), and the highest one made durable
    /// by a completed cache flush.
    lsn: u64,
    flushed_lsn: u64,
    /// The highest write sequence made durable on the cache device by a
    /// completed flush (every record header carries it). Only rises, with
    /// `flushed_lsn` (`flushed_upto`); recovery restarts it above all it saw.
    flushed_seq: u64,
    /// Records reserved and not yet published (writers.rs), by LSN.
    /// Always empty under a drained lock (`Engine::lock`).
    inflight: std::collections::BTreeMap<u64, InFlight>,
    /// Data blocks the chunks not free hold, current or not: the sum of
    /// their `Chunk::placed`.
    placed: u64,
}

/// What a cache block held when it was dropped (`Log::drop_block`).
pub(super) struct Dropped {
    pub(super) vol: u32,
}

/// A record reserved and not yet published.
pub(super) struct InFlight {
    pub(super) seq: u64,
    pub(super) vol: u32,
    pub(super) chunk: ChunkId,
    /// Its entries, held here until it is published (relocations look at
    /// their LBAs: `Inner::relocation_waits`).
    pub(super) entries: Vec<crate::layout::Entry>,
}

impl Log {
    /// Chunk `c`, to look at (it changes only through `Log`'s methods).
    pub(super) fn chunk(&self, c: ChunkId) -> &Chunk {
        &self.chunks[c]
    }
    /// Chunk of cache block `cb`, and the block's index in it.
    pub(super) fn chunk_of(&self, cb: u64) -> (&Chunk, usize) {
        let bpc = self.chunks[0].p2l.len() as u64;
        (&self.chunks[(cb / bpc) as usize], (cb % bpc) as usize)
    }
    /// Chunks, chunk 0 (the superblock's) included.
    pub(super) fn chunk_count(&self) -> usize {
        self.chunks.len()
    }
    pub(super) fn chunks(&self) -> impl Iterator<Item = (ChunkId, &Chunk)> + '_ {
        self.chunks.iter().enumerate().map(|(c, ch)| (ChunkId(c as u32), ch))
    }
    /// Every current cache block: (cache block, volume, LBA).
    pub(super) fn current(&self) -> impl Iterator<Item = (u64, u32, u64)> + '_ {
        let bpc = self.chunks[0].p2l.len() as u64;
        self.chunks()
            .flat_map(move |(c, ch)| ch.current().map(move |(i, v, lba)| (c.0 as u64 * bpc + i as u64, v, lba)))
    }
    /// Who cache block `cb` holds, if it is current: (volume, LBA).
    pub(super) fn owner_of(&self, cb: u64) -> Option<(u32, u64)> {
        let (ch, i) = self.chunk_of(cb);
        Some(ch.p2l[i]).filter(|o| o.0 != u32::MAX)
    }
    /// Whether cache block `cb` is current.
    pub(super) fn is_current(&self, cb: u64) -> bool {
        self.owner_of(cb).is_some()
    }
    /// The last log record's number (LSN).
    pub(super) fn lsn(&self) -> u64 {
        self.lsn
    }
    /// The highest LSN a completed cache flush made durable.
    pub(super) fn flushed_lsn(&self) -> u64 {
        self.flushed_lsn
    }
    /// Number the next record (whether or not its write succeeds: a failed
    /// write stops the engine, and its number is above anything a flush
    /// made durable).
    pub(super) fn next_lsn(&mut self) -> u64 {
        self.lsn += 1;
        self.lsn
    }
    /// A cache flush made every record up to `lsn` durable (flushes
    /// complete in any order: the watermark only rises).
    /// A cache flush completed: every record up to `lsn`, and every write
    /// sequence up to `seq`, is durable. Both watermarks only rise.
    pub(super) fn flushed_upto(&mut self, seq: u64, lsn: u64) {
        assert!(lsn <= self.lsn, "flushed LSN {lsn} past the last record {}", self.lsn);
        self.flushed_lsn = self.flushed_lsn.max(lsn);
        self.flushed_seq = self.flushed_seq.max(seq);
    }
    /// The highest write sequence a completed cache flush made durable.
    pub(super) fn flushed_seq(&self) -> u64 {
        self.flushed_seq
    }
    /// Recovery: the write sequence restarts at `seq`, above everything on
    /// the media, and counts as durable (nothing newer exists).
    pub(super) fn restart_flushed_seq(&mut self, seq: u64) {
        assert!(seq >= self.flushed_seq, "the flushed sequence went back from {} to {seq}", self.flushed_seq);
        self.flushed_seq = seq;
    }
    /// Recovery: the last record found is `lsn`, and every record up to it
    /// is durable (recovery flushes what it accepted before anything new).
    pub(super) fn recovered_lsn(&mut self, lsn: u64) {
        assert!(self.inflight.is_empty());
        self.lsn = lsn;
        self.flushed_lsn = lsn;
    }
    /// Records reserved and not yet published, by LSN.
    pub(super) fn inflight(&self) -> &std::collections::BTreeMap<u64, InFlight> {
        &self.inflight
    }
    /// Reserve the next record (writers.rs): numbered, and in flight until
    /// `publish`ed.
    pub(super) fn reserve(&mut self, f: InFlight) -> u64 {
        let lsn = self.next_lsn();
        self.inflight.insert(lsn, f);
        lsn
    }
    /// Record `lsn` (reserved) is published: no longer in flight.
    pub(super) fn publish(&mut self, lsn: u64) -> InFlight {
        self.inflight.remove(&lsn).expect("a record in flight")
    }
    /// A record's header was placed at block `off` of the open chunk `c`
    /// (`Chunk::headers`).
    pub(super) fn note_header(&mut self, c: ChunkId, off: u64) {
        assert_eq!(self.open.map(|(o, _)| o), Some(c), "headers go into the open chunk");
        if let Some(hs) = self.chunks[c].headers.as_mut() {
            assert!(hs.last().is_none_or(|&h| (h as u64) < off), "chunk {c}: headers in order");
            hs.push(off as u32);
        }
    }
    /// Cache block `cb`, of a chunk written since it was opened, holds
    /// (`vol`, `lba`) now (lifetime class `lifetime`, placement.rs).
    pub(super) fn place(&mut self, cb: u64, vol: u32, lba: u64, lifetime: u8) {
        let bpc = self.chunks[0].p2l.len() as u64;
        let (c, i) = ((cb / bpc) as usize, (cb % bpc) as usize);
        let ch = &mut self.chunks[c];
        assert!(
            matches!(ch.state, ChunkState::Open | ChunkState::Sealed),
            "cache block {cb} placed in a {:?} chunk",
            ch.state
        );
        assert_eq!(ch.p2l[i].0, u32::MAX, "cache block {cb} placed twice");
        ch.p2l[i] = (vol, lba);
        ch.lifetime[i] = lifetime;
        ch.valid += 1;
        ch.placed += 1;
        self.placed += 1;
    }
    /// Sealed → Compacting, once: a step of compaction or cleaning started
    /// on `c`, the oldest full chunk.
    pub(super) fn start_compacting(&mut self, c: ChunkId) {
        assert_eq!(self.full.front(), Some(&c), "the oldest full chunk is compacted");
        if self.chunks[c].state == ChunkState::Sealed {
            self.chunks[c].to(ChunkState::Sealed, ChunkState::Compacting);
        }
        assert_eq!(self.chunks[c].state, ChunkState::Compacting, "compaction takes the oldest sealed chunk");
    }
    /// Recovery: chunk `c` holds records of generation `epoch` still needed,
    /// the first numbered `first_lsn`.
    pub(super) fn found_chunk(&mut self, c: ChunkId, epoch: u64, first_lsn: u64) {
        let ch = &mut self.chunks[c];
        assert_eq!(ch.state, ChunkState::Free, "recovery finds chunk {c} once");
        ch.state = ChunkState::Sealed;
        ch.epoch = epoch;
        ch.first_lsn = first_lsn;
    }
    /// Free chunks.
    pub(super) fn free_len(&self) -> usize {
        self.free.len()
    }
    /// Full chunks, oldest first (compaction's queue).
    pub(super) fn full(&self) -> impl Iterator<Item = ChunkId> + '_ {
        self.full.iter().copied()
    }
    pub(super) fn oldest_full(&self) -> Option<ChunkId> {
        self.full.front().copied()
    }
    /// The chunk records are appended to, and the next block in it.
    pub(super) fn open(&self) -> Option<(ChunkId, u64)> {
        self.open
    }

    /// Open → Sealed: the open chunk is full; it joins the end of
    /// compaction's queue.
    fn seal_open(&mut self) -> ChunkId {
        let (c, _) = self.open.take().expect("a chunk is open");
        self.chunks[c].to(ChunkState::Open, ChunkState::Sealed);
        self.full.push_back(c);
        c
    }

    /// Free → Open: the oldest free chunk, emptied, becomes the open one,
    /// generation `epoch`, its first record numbered `first_lsn`.
    fn open_next(&mut self, epoch: u64, first_lsn: u64) -> ChunkId {
        assert!(self.open.is_none(), "one chunk is open at a time");
        let c = self.free.pop_front().expect("compaction keeps free chunks");
        let ch = &mut self.chunks[c];
        assert!(ch.valid == 0, "chunk {c} is free but holds current blocks");
        assert_eq!(ch.placed, 0, "chunk {c} is free but counts data blocks");
        ch.to(ChunkState::Free, ChunkState::Open);
        ch.epoch = epoch;
        ch.first_lsn = first_lsn;
        ch.p2l.iter_mut().for_each(|e| *e = (u32::MAX, 0));
        ch.lifetime.iter_mut().for_each(|c| *c = 0);
        let mut headers = ch.headers.take().unwrap_or_default();
        headers.clear();
        ch.headers = Some(headers);
        self.open = Some((c, 0));
        c
    }

    /// A record of `blocks` blocks was placed in the open chunk `c` at `off`.
    pub(super) fn advance(&mut self, c: ChunkId, off: u64, blocks: u64) {
        assert_eq!(self.open, Some((c, off)), "records are placed at the open chunk's pointer");
        assert!(off + blocks <= self.chunks[c].p2l.len() as u64, "a record past chunk {c}'s end");
        self.open = Some((c, off + blocks));
    }

    /// Compacting → Free: `c`, the oldest full chunk, holds nothing
    /// current (its blocks live elsewhere durably); it joins the end of
    /// the free list.
    pub(super) fn free_oldest(&mut self, c: ChunkId) {
        assert_eq!(self.full.front(), Some(&c), "chunks are freed oldest first");
        let ch = &mut self.chunks[c];
        assert!(ch.valid == 0, "chunk {c} freed holding current blocks");
        ch.to(ChunkState::Compacting, ChunkState::Free);
        self.placed -= ch.placed as u64;
        ch.placed = 0;
        self.full.pop_front();
        self.free.push_back(c);
    }

    /// Recovery: the chunks holding records at or above the head are
    /// `full` (Sealed, in epoch order); every other chunk but chunk 0 is
    /// Free; none is open.
    pub(super) fn recovered(&mut self, full: Vec<ChunkId>) {
        assert!(full.iter().all(|&c| self.chunks[c].state == ChunkState::Sealed), "recovery seals what it keeps");
        self.full = full.into();
        self.free =
            (1..self.chunks.len() as u32).map(ChunkId).filter(|&c| self.chunks[c].state == ChunkState::Free).collect();
        self.open = None;
    }

    /// The log a checkpoint describes: its chunks, lists and open chunk
    /// (`encode_open`, `encode_lists`), every record up to `lsn` and every
    /// sequence up to `seq` durable.
    pub(super) fn from_checkpoint(
        chunks: Vec<Chunk>,
        full: VecDeque<ChunkId>,
        free: VecDeque<ChunkId>,
        open: Option<(ChunkId, u64)>,
        (seq, lsn): (u64, u64),
    ) -> Log {
        let placed = chunks.iter().map(|ch| ch.placed as u64).sum();
        Log { chunks, free, full, open, lsn, flushed_lsn: lsn, flushed_seq: seq, inflight: Default::default(), placed }
    }

    /// The checkpoint's open chunk, then (later in it) the full and free lists.
    pub(super) fn encode_open(&self, w: &mut crate::persist::Writer) {
        w.opt_u32(self.open.map(|(c, _)| c.0));
        w.u64(self.open.map_or(0, |(_, o)| o));
    }
    pub(super) fn encode_lists(&self, w: &mut crate::persist::Writer) {
        for list in [&self.full, &self.free] {
            w.u32(list.len() as u32);
            list.iter().for_each(|&c| w.u32(c.0));
        }
    }

    /// The lists as `check_invariants` wants them: every chunk but 0 is on
    /// exactly one list, or open, as its state says.
    pub(super) fn check_lists(&self) {
        let mut seen = vec![0u8; self.chunks.len()];
        for &c in self.free.iter().chain(&self.full) {
            seen[c.index()] += 1;
        }
        if let Some((c, off)) = self.open {
            seen[c.index()] += 1;
            assert_eq!(self.chunks[c].state, ChunkState::Open, "the open chunk {c}");
            assert!(off <= self.chunks[c].p2l.len() as u64);
        }
        for &c in &self.free {
            assert_eq!(self.chunks[c].state, ChunkState::Free, "chunk {c} on the free list");
            assert!(self.chunks[c].valid == 0, "free chunk {c} holds current blocks");
        }
        for &c in &self.full {
            assert!(
                matches!(self.chunks[c].state, ChunkState::Sealed | ChunkState::Compacting),
                "chunk {c} on the full list"
            );
        }
        for (c, &n) in seen.iter().enumerate().skip(1) {
            assert_eq!(n, 1, "chunk {c} is on {n} lists");
        }
        assert_eq!(self.placed, self.chunks.iter().map(|ch| ch.placed as u64).sum::<u64>(), "data blocks counted");
    }

    /// Data blocks the log holds, current or not: what its reclaims could
    /// free without writing a header or padding again (reclaim.rs).
    pub(super) fn data_blocks(&self) -> u64 {
        self.placed
    }

    /// Cache block `cb` holds no current block any more: out of its
    /// chunk's P2L and counts. Returns what it held.
    pub(super) fn drop_block(&mut self, cb: u64) -> Dropped {
        let bpc = self.chunks[0].p2l.len() as u64;
        let (c, i) = ((cb / bpc) as usize, (cb % bpc) as usize);
        let ch = &mut self.chunks[c];
        let vol = ch.p2l[i].0;
        assert!(vol != u32::MAX && ch.valid > 0, "cache block {cb} dropped twice");
        assert!(ch.state != ChunkState::Free, "cache block {cb} of a free chunk");
        ch.p2l[i].0 = u32::MAX;
        ch.valid -= 1;
        Dropped { vol }
    }

    /// Every chunk free but chunk 0, which holds the superblock and the
    /// capacity marks.
    pub(super) fn empty(chunk_count: u64, blocks_per_chunk: usize) -> Log {
        let chunk = |_| Chunk {
            state: ChunkState::Free,
            epoch: 0,
            p2l: vec![(u32::MAX, 0); blocks_per_chunk],
            valid: 0,
            placed: 0,
            first_lsn: 0,
            lifetime: vec![0; blocks_per_chunk],
            headers: None,
        };
        Log {
            chunks: (0..chunk_count).map(chunk).collect(),
            free: (1..chunk_count as u32).map(ChunkId).collect(),
            full: VecDeque::new(),
            open: None,
            lsn: 0,
            flushed_lsn: 0,
            flushed_seq: 0,
            inflight: Default::default(),
            placed: 0,
        }
    }
}

/// Where a chunk is in its cycle: Free → Open (records are appended) →
/// Sealed (full, queued for compaction) → Compacting (a bounded step has
/// started on it) → Free. Every change names the state it leaves
/// (`Chunk::to`), asserted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ChunkState {
    Free,
    Open,
    Sealed,
    Compacting,
}

impl ChunkState {
    /// The checkpoint's byte (docs/format.md): 0 free, 1 open, 2 full. A
    /// chunk being compacted is full there: the cursor is not saved, and
    /// compaction starts it again.
    pub(super) fn on_media(self) -> u8 {
        match self {
            ChunkState::Free => 0,
            ChunkState::Open => 1,
            ChunkState::Sealed | ChunkState::Compacting => 2,
        }
    }

    pub(super) fn from_media(x: u8) -> Option<ChunkState> {
        [ChunkState::Free, ChunkState::Open, ChunkState::Sealed].get(x as usize).copied()
    }
}

impl Chunk {
    /// Move from state `from` (asserted) to `to`.
    fn to(&mut self, from: ChunkState, to: ChunkState) {
        assert_eq!(self.state, from, "chunk state changes from the state it is in");
        self.state = to;
    }

    /// A chunk as a checkpoint saved it (no headers known, no lifetimes);
    /// None if its valid count is not its current blocks' (damage).
    pub(super) fn from_checkpoint(
        state: ChunkState,
        epoch: u64,
        p2l: Vec<(u32, u64)>,
        valid: u32,
        first_lsn: u64,
    ) -> Option<Chunk> {
        let current = p2l.iter().filter(|o| o.0 != u32::MAX).count();
        let free_and_empty = state != ChunkState::Free || current == 0;
        (current == valid as usize && free_and_empty && state != ChunkState::Compacting).then(|| Chunk {
            state,
            epoch,
            lifetime: vec![0; p2l.len()],
            p2l,
            valid,
            placed: valid,
            first_lsn,
            headers: None,
        })
    }
    pub(super) fn state(&self) -> ChunkState {
        self.state
    }
    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }
    pub(super) fn valid(&self) -> u32 {
        self.valid
    }
    pub(super) fn first_lsn(&self) -> u64 {
        self.first_lsn
    }
    /// Who block `i` of the chunk holds: (volume, LBA); u32::MAX volume for
    /// a header, padding, or a block no longer current.
    pub(super) fn owner(&self, i: usize) -> (u32, u64) {
        self.p2l[i]
    }
    pub(super) fn p2l(&self) -> &[(u32, u64)] {
        &self.p2l
    }
    /// Its current blocks: (block, volume, LBA).
    pub(super) fn current(&self) -> impl Iterator<Item = (usize, u32, u64)> + '_ {
        self.p2l.iter().enumerate().filter(|(_, o)| o.0 != u32::MAX).map(|(i, &(v, lba))| (i, v, lba))
    }
    /// With bands: block `i`'s lifetime class (placement.rs; 0 short).
    pub(super) fn lifetime(&self, i: usize) -> u8 {
        self.lifetime[i]
    }
    pub(super) fn headers(&self) -> Option<&[u32]> {
        self.headers.as_deref()
    }
}

pub(super) struct Chunk {
    state: ChunkState,
    /// Sequence number when the chunk was last opened; every record written
    /// into it carries it, so replay stops at a previous generation's records.
    epoch: u64,
    /// (volume, lba) per cache block of the chunk; u32::MAX volume = header/pad.
    p2l: Vec<(u32, u64)>,
    valid: u32,
    /// Data blocks placed in the chunk since it was opened, current or not
    /// (headers and padding are not); for a chunk a checkpoint saved, its
    /// current blocks (which of the others held data is not saved).
    placed: u32,
    /// LSN of the first record written into the chunk since it was opened.
    first_lsn: u64,
    /// With bands: per block, its lifetime class (placement.rs; 0 short).
    /// Not persisted. (In place, the cache's own marks: residency.rs.)
    lifetime: Vec<u8>,
    /// Where each record's header block is, in order, for a chunk opened
    /// since the engine was: compaction then reads only headers and current
    /// blocks (compaction.rs). None (unknown) for chunks a reopen found.
    headers: Option<Vec<u32>>,
}

impl Inner {
    pub(super) fn blocks_per_chunk(&self) -> u64 {
        self.cfg.chunk_bytes / BS
    }
}

impl Engine {
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
            let (loc, crc) = inner.vols[vol as usize].l2p.entry(lba as usize)?;
            if loc.is_none() && inner.in_place() {
                self.log_tombstones(&mut inner, vol, &[lba])?;
            } else if loc.is_none() {
                // The copy just logged is the newest (`l2p::tombstone_tag`).
                self.relog_tombstones(&mut inner, vol, &[lba])?;
            } else {
                let mut b = vec![0u8; BLOCK_BYTES];
                self.read_blocks(&[loc], &[crc], lba * BS, &mut b, None)?;
                self.append(&mut inner, vol, &[(lba, &b)], &[crc], false)?;
            }
        }
        self.flush_cache(&mut inner)
    }

    /// Flush the cache device; every record written so far is durable
    /// (the watermarks stop below the first record still being written).
    pub(super) fn flush_cache(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        let (seq, lsn) = inner.written_upto();
        flush(&*self.cache)?;
        inner.log.flushed_upto(seq, lsn);
        Ok(())
    }

    /// `flush_cache` if a record was written to the log since the last
    /// flush (up to the first record still being written).
    pub(super) fn flush_cache_if_written(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        if inner.written_upto().1 == inner.log.flushed_lsn() {
            return Ok(());
        }
        self.flush_cache(inner)
    }

    /// `flush_cache` for a client's FUA request, which is answered after
    /// it: the records it made durable are claimed (watermark.rs).
    pub(super) fn flush_cache_for_client(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        self.flush_cache(inner)?;
        self.claim_flushed(inner.tag, inner.blocks_per_chunk(), inner.log.flushed_lsn())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_goes_through_its_cycle_and_the_checkpoint_keeps_a_compacting_one_sealed() {
        let mut log = Log::empty(2, 4);
        assert_eq!(log.free, [ChunkId(1)], "chunk 0 holds the superblock");
        let c = &mut log.chunks[1];
        c.to(ChunkState::Free, ChunkState::Open);
        c.to(ChunkState::Open, ChunkState::Sealed);
        c.to(ChunkState::Sealed, ChunkState::Compacting);
        assert_eq!(ChunkState::from_media(c.state.on_media()), Some(ChunkState::Sealed));
        c.to(ChunkState::Compacting, ChunkState::Free);
    }

    #[test]
    #[should_panic(expected = "chunk state changes from the state it is in")]
    fn a_chunk_changes_only_from_the_state_it_is_in() {
        let mut log = Log::empty(2, 4);
        log.chunks[1].to(ChunkState::Sealed, ChunkState::Free);
    }
}
