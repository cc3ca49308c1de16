//! Compaction: the log's oldest full chunk emptied into the capacity
//! device, its current blocks grouped by volume into each volume's open band.
//!
//! Owns the compaction cursor (where a bounded step stopped in the oldest
//! full chunk). A step reads a window of the chunk (at least one whole
//! record), moves the blocks the L2P still points at and the tombstones
//! still live, and remaps them, all under the lock, so a block rewritten or
//! trimmed between steps is simply not moved. The chunk is freed only by
//! its last step, after both devices flushed (segments.rs, rule 3), and
//! stays first in the log's full queue (and in a checkpoint) until then.
//! The step's device I/O, and copying its blocks into their segments, may
//! happen outside the lock (step_io.rs): a deferred step that walks the
//! chunk's end with writes queued leaves the chunk to the next step (its
//! cursor at the chunk's end), which settles them and frees it.

use super::pending::{Deferred, PENDING_STEPS_MAX};
use super::segments::Data;
use super::step_io::{PreRead, Window};
use super::{ChunkId, Engine, Inner, Loc, VolumeError, BS};
use crate::layout::{record_at, RecordKind};

/// Where a bounded compaction step stopped in the oldest full chunk.
#[derive(Clone, Copy, Debug)]
pub(super) struct CompactCursor {
    pub(super) chunk: ChunkId,
    /// Block of the chunk where the next record starts.
    pub(super) pos: u64,
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

impl Inner {
    /// Where the next compaction step starts: the oldest full chunk, at the
    /// cursor a bounded step left in it (else its start).
    fn compact_next(&self) -> Option<CompactCursor> {
        let chunk = self.log.oldest_full()?;
        let pos = self.compact_cursor.filter(|k| k.chunk == chunk).map_or(0, |k| k.pos);
        Some(CompactCursor { chunk, pos })
    }

    /// Blocks a compaction step reads first from `pos` of its chunk.
    fn compact_read_blocks(&self, pos: u64, blocks_max: u64) -> u64 {
        blocks_max.max(1).min(self.blocks_per_chunk() - pos)
    }

    /// The window the next deferred `compact_step(blocks_max)` reads
    /// first, if any.
    pub(super) fn compact_window(&self, blocks_max: u64) -> Option<Window> {
        let CompactCursor { chunk: c, pos } = self.compact_next()?;
        let len = self.compact_read_blocks(pos, blocks_max);
        let offset = (c.0 as u64 * self.blocks_per_chunk() + pos) * BS;
        let gen = self.log.chunk(c).epoch();
        let headers_only = self.log.chunk(c).headers().is_some();
        (len > 0).then_some(Window { cache: true, offset, len: (len * BS) as usize, gen, headers_only })
    }
}

/// Blocks between two runs a sparse read reads anyway rather than issue
/// another request.
const RUN_GAP_MAX: u64 = 1;

impl Inner {
    /// For a window of `len` blocks at `pos` of chunk `c` whose record
    /// headers are known (`Chunk::headers`): the runs (start, blocks,
    /// relative to the window) holding every header and (unless
    /// `headers_only`) every current block, if they spare a quarter of the
    /// window or more. The rest is
    /// garbage — superseded or trimmed blocks, padding, unwritten space —
    /// and the walk never looks at it (a block after the last record reads
    /// as zeros, the chunk's end). Blocks only ever leave a sealed chunk's
    /// current set, so runs taken now cover what any later look needs.
    pub(super) fn compact_runs(&self, c: ChunkId, pos: u64, len: u64, headers_only: bool) -> Option<Vec<(u64, u64)>> {
        let ch = self.log.chunk(c);
        let headers = ch.headers()?;
        let first = headers.partition_point(|&h| (h as u64) < pos);
        let mut hs = headers[first..].iter().map(|&h| h as u64 - pos).take_while(|&h| h < len).peekable();
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut needed = 0;
        for i in 0..len {
            let header = hs.peek() == Some(&i);
            if header {
                hs.next();
            }
            if !header && (headers_only || ch.owner((pos + i) as usize).0 == u32::MAX) {
                continue;
            }
            needed += 1;
            match runs.last_mut() {
                Some((s, n)) if i - (*s + *n) <= RUN_GAP_MAX => *n = i + 1 - *s,
                _ => runs.push((i, 1)),
            }
        }
        let read: u64 = runs.iter().map(|r| r.1).sum();
        debug_assert!(read >= needed);
        (read * 4 <= len * 3).then_some(runs)
    }
}

impl Engine {
    /// Move the oldest full chunk's current blocks and live tombstones to the
    /// capacity device, flush it, free the chunk (finishing the chunk a
    /// bounded step left half done, if any).
    pub(super) fn compact_oldest(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        assert!(inner.log.oldest_full().is_some(), "a full chunk exists when the log is short of space");
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
        // A deferred step leaves an earlier one's writes pending on a
        // conventional device (`PENDING_STEPS_MAX` at most): it walks
        // another window, so moves other blocks, and its segments take band
        // space after theirs (a step that needs a new band settles them
        // first: `open_band` drains). A zone takes writes strictly in order,
        // so there every step settles the one before.
        if !defer || inner.geo.zoned || inner.pending.len() >= PENDING_STEPS_MAX {
            self.settle(inner)?;
        }
        // Relocations never move a block a record in flight rewrites
        // (writers.rs: `relocations_clear`).
        debug_assert!(inner.relocations_clear(), "a compaction step beside a record in flight it would outrank");
        if inner.in_place() {
            return self.reclaim_step(inner, blocks_max, defer);
        }
        let Some(CompactCursor { chunk: c, mut pos }) = inner.compact_next() else { return Ok(CompactStep::Idle) };
        // `defer`: the step's segment writes are left in flight with their
        // remaps (`Pending`), for the caller to finish without the lock.
        let mut deferred = defer.then(Deferred::default);
        inner.log.start_compacting(c);
        let bpc = inner.blocks_per_chunk();
        let base = c.0 as u64 * bpc;
        let epoch = inner.log.chunk(c).epoch();
        // The window: `blocks_max` blocks, or the first record whole if it is
        // larger (read again at its size).
        let mut len = inner.compact_read_blocks(pos, blocks_max);
        let mut end_of_chunk = len == 0;
        // A deferred step of a chunk whose headers are known reads only
        // them: its segments are filled from the cache afterwards.
        let headers_only = defer && inner.log.chunk(c).headers().is_some();
        while !end_of_chunk {
            let offset = (base + pos) * BS;
            let win = Window { cache: true, offset, len: (len * BS) as usize, gen: epoch, headers_only };
            let data = self.read_window(inner, pre, win)?;
            // Per volume and lifetime class (placement.rs): current data
            // blocks (lba, crc, offset in window); per volume, live tombstones.
            let mut blocks: Vec<[Vec<(u64, u32, usize)>; 2]> = vec![Default::default(); inner.vols.len()];
            let mut tombs: Vec<Vec<u64>> = vec![Vec::new(); inner.vols.len()];
            let mut at = 0u64;
            let mut first_needs = None;
            while at < len {
                let block = &data[(at * BS) as usize..((at + 1) * BS) as usize];
                // Never written, torn, or a previous generation: the chunk's
                // end — unless blocks of it are still current past this
                // point (a recovery kept records past a torn or damaged
                // one): then the next block is looked at.
                // Read with headers only, the window holds whatever its
                // buffer last held between them (`read_runs`): only a known
                // header's place is looked at.
                let header_here = !headers_only
                    || (inner.log.chunk(c).headers()).is_some_and(|hs| hs.binary_search(&((pos + at) as u32)).is_ok());
                let h = header_here.then(|| record_at(block, pos + at, bpc, inner.tag)).flatten();
                let h = h.filter(|h| h.epoch == epoch);
                let Some(h) = h.filter(|h| (h.volume as usize) < inner.vols.len()) else {
                    let collected: usize = blocks.iter().flatten().map(|b| b.len()).sum();
                    if inner.log.chunk(c).valid() as usize <= collected {
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
                        if inner.vols[vol].l2p.try_get(e.lba)? == Some(Loc::cache(cb)) {
                            let class = inner.log.chunk(c).lifetime((pos + at + 1 + i as u64) as usize).min(1);
                            let at_win = ((at + 1 + i as u64) * BS) as usize;
                            let at = if headers_only { cb as usize } else { at_win };
                            blocks[vol][class as usize].push((e.lba, e.crc, at));
                        }
                    }
                } else {
                    for e in &h.entries {
                        if inner.vols[vol].l2p.tombstone_live(e.lba, h.seq)? {
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
            let now = inner.user_clock();
            // A deferred step's blocks are copied into its segments when
            // they are submitted (outside the lock for the background
            // compactor and an assisting writer): the window goes with them.
            let mut data = Some(data);
            if headers_only {
                // The walk is done with the headers.
                inner.give_buf(data.take().expect("the window"));
            } else if let Some(d) = deferred.as_mut() {
                let base = d.next_source_at();
                d.sources.extend(data.take());
                blocks.iter_mut().flatten().flatten().for_each(|b| b.2 += base);
            }
            for vol in 0..inner.vols.len() {
                let [short, long] = &mut blocks[vol];
                let streams = [inner.user_stream(vol as u32, 0), inner.user_stream(vol as u32, 1)];
                if streams[0] == streams[1] {
                    long.append(short);
                }
                for (class, s) in streams.into_iter().enumerate() {
                    // Tombstones go with the long-lived class.
                    let tombs: &[u64] = if class == 1 { &tombs[vol] } else { &[] };
                    let blocks = &blocks[vol][class];
                    if blocks.is_empty() && tombs.is_empty() {
                        continue;
                    }
                    let what = match &data {
                        Some(d) => Data::Here(d),
                        None if headers_only => Data::Cache,
                        None => Data::Deferred,
                    };
                    let moved =
                        self.write_segments(inner, vol as u32, (s, now), (blocks, what), tombs, deferred.as_mut())?;
                    inner.stats.compacted(moved * BS);
                }
            }
            if let Some(data) = data {
                inner.give_buf(data);
            }
            pos += at;
            end_of_chunk |= pos >= bpc;
            break;
        }
        // Nothing this thread submitted stays in flight between steps:
        // requests in between use the capacity device synchronously.
        match defer {
            true => self.reap_own_writes(inner)?,
            false => self.drain_capacity(inner)?,
        }
        // A deferred step that walked the chunk's end with writes queued
        // leaves freeing it to the next step, which settles them first:
        // settling here would copy and write them under the lock.
        let queued = deferred.as_ref().is_some_and(|d| !d.queued.is_empty());
        if !end_of_chunk || queued {
            let pos = if end_of_chunk { bpc } else { pos };
            inner.compact_cursor = Some(CompactCursor { chunk: c, pos });
            inner.defer_pending(deferred);
            return Ok(CompactStep::Progress);
        }
        // Nothing queued: the sources go back to the pool. Every step of
        // the chunk settled before its valid count is looked at.
        inner.defer_pending(deferred);
        self.settle(inner)?;
        // Blocks still current that no record header led to: a header
        // damaged at rest since the engine opened (a clean open reads the
        // checkpoint, not the log). Damage, not a bug: changes stop, and
        // the next open's recovery refuses it for `sluice check`.
        let left = inner.log.chunk(c).valid();
        if left != 0 {
            return Err(VolumeError::Damaged {
                device: "cache",
                offset: base * BS,
                what: sluice_volume::Damage::UnreadHeaders { chunk: c.0, blocks: left },
            });
        }
        // Rule 3: the copies, and whatever superseded the chunk's dropped
        // entries, are durable before the chunk can be reused.
        if inner.cap.is_dirty() {
            self.flush_capacity(inner)?;
        }
        self.free_oldest(inner, c)
    }

    /// Free `c`, the oldest full chunk, whose blocks all live elsewhere
    /// durably: after a mark of what the capacity device now holds (for
    /// recovery to tell damage from a torn write, marks.rs, and to start
    /// past the chunk), durable with the chunk's flush.
    pub(super) fn free_oldest(&self, inner: &mut Inner, c: ChunkId) -> Result<CompactStep, VolumeError> {
        // The records that superseded the chunk's dropped entries are
        // durable before the mark that drops the chunk is written: a power
        // loss during one flush of both may keep the mark and not them
        // (the sim's failed flushes found it, seed 224).
        self.flush_cache_if_written(inner)?;
        self.write_mark(inner, Some(c), None)?;
        self.flush_cache(inner)?;
        inner.log.free_oldest(c);
        inner.residency.freed(c);
        inner.compact_cursor = None;
        inner.reuse_freed(Some(c), None);
        inner.stats.chunk_compacted();
        Ok(CompactStep::Freed)
    }
}
