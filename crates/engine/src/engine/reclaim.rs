//! Reclaim: freeing the oldest chunk of an in-place log (`Layout::InPlace`),
//! compaction's place in that layout, and what a reclaim keeps.
//!
//! A reclaim works on the oldest full chunk: on its first step it moves the
//! chunk's dirty blocks of pinned classes forward in the log, still dirty
//! (`relog_pinned`); it cleans the rest home (cleaning.rs, under the lock
//! or, ahead of need, without it: home_flight.rs); once nothing in it is
//! dirty it makes the homes durable, keeps what retention asks (pinned and
//! hot blocks, logged again clean: `to_retain`), drops the chunk's copies
//! and frees it after the mark that moves the log's head past it.
//!
//! Invariants:
//! - a reclaim keeps only in room the log has to spare, leaving room for a
//!   writer's record when one waits (`log_has_room_to_keep`); while
//!   pinned classes' blocks are more than `PINNED_SHARE_MAX` of the log's
//!   data blocks it keeps at most `RETAIN_SHARE` of its chunk (moved and
//!   retained together), so every reclaim frees room; below that share it
//!   may move a whole chunk's pinned dirty blocks forward
//!   (`Inner::move_budget`), and the others' and dead blocks of the chunks
//!   behind it free what the move took;
//! - moved copies are durable (cache flush) before anything frees the chunk
//!   whose copies they supersede; retained copies are logged only after
//!   the chunk is freed, their homes durable first;
//! - ahead of need, a chunk holding more pinned dirty blocks than one
//!   reclaim may move is left alone (the cache is full of what it keeps,
//!   writes spill); a writer that needs room reclaims it anyway.

use super::caching::CacheCount;
use super::compaction::CompactStep;
use super::{crc32c, read_at, CacheMode, ChunkId, Engine, Inner, Loc, VolumeError, BLOCK_BYTES, BS};

impl Inner {
    /// Whether a reclaim may keep one more record of `blocks` in the log
    /// (moved forward or retained), having kept `used` blocks (headers
    /// included) so far: room the log has to spare, and — when a writer
    /// waits for room (`writer_waits`: the reclaim frees the chunk it needs)
    /// — room left in that chunk for the writer's record. Otherwise the
    /// kept blocks could fill the freed chunk so the writer's record does
    /// not fit, reclaim after reclaim keeping the same blocks.
    pub(super) fn log_has_room_to_keep(&self, blocks: u64, used: u64) -> bool {
        self.log_has_room(blocks)
            && (self.writer_waits == 0 || used + 1 + blocks + self.writer_waits <= self.blocks_per_chunk())
    }
}

impl Inner {
    /// The pinned dirty blocks one reclaim may move forward: a whole chunk
    /// while blocks of pinned classes, which reclaims keep at every pass
    /// (moved dirty or retained clean), are at most `PINNED_SHARE_MAX` of
    /// the data blocks the log holds (`Log::data_blocks`) — the rest are
    /// others' (cleaned home if dirty, then dropped) or dead, so the chunks
    /// behind this one free what the move takes (a FIFO with reinsertion:
    /// the log's head passes the kept data instead of waiting on it) —
    /// else `RETAIN_SHARE` of one, so that a log full of pinned data still
    /// frees room at each reclaim. Headers and padding do not count as
    /// room: the moves write them again.
    fn move_budget(&self) -> usize {
        let bpc = self.blocks_per_chunk();
        let pinned: u64 = self.vols.iter().map(|v| v.cache.classes().pinned_blocks()).sum();
        match pinned as f64 <= PINNED_SHARE_MAX * self.log.data_blocks() as f64 {
            true => bpc as usize,
            false => relog_budget(bpc),
        }
    }

    /// Data blocks a reclaim could log now without reclaiming another chunk
    /// (`log_has_room`): what the open chunk has left and the free chunks
    /// above the reserve, less a header per record (records do not span
    /// chunks, so one more per chunk).
    fn room_to_keep(&self) -> u64 {
        let bpc = self.blocks_per_chunk();
        let spare = self.log.free_len().saturating_sub(self.cfg.log_free_chunks_min) as u64;
        let open = self.log.open().map_or(0, |(_, off)| bpc - off);
        let per_record = self.record_blocks_max() as u64 + 1;
        let room = |blocks: u64| blocks.saturating_sub(blocks.div_ceil(per_record) + 1);
        room(open) + spare * room(bpc)
    }
}

impl Engine {
    /// In place, compaction's step: clean at most `blocks_max` dirty blocks
    /// of the oldest full chunk; once none is left, make their homes
    /// durable, drop the chunk's copies (they read from home now) and free
    /// it, after the mark that moves the log's head past it.
    ///
    /// Ahead of need (`ahead`: the background compactor's step, no writer
    /// waiting), a chunk not yet started that holds more dirty blocks of
    /// pinned classes on spilling volumes than one reclaim may move forward
    /// is left alone (`CompactStep::Idle`): the cache is full of the data
    /// it was told to keep, so new writes spill home at queue depth rather
    /// than the kept data going home one run at a time under the lock; once
    /// trims or overwrites bring it under the budget, the chunk is
    /// reclaimed and its rest moved forward. A writer that needs room
    /// reclaims it anyway (`compact_oldest`), cleaning what cannot move.
    pub(super) fn reclaim_step(
        &self,
        inner: &mut Inner,
        blocks_max: u64,
        ahead: bool,
    ) -> Result<CompactStep, VolumeError> {
        let Some(c) = self.reclaim_begin(inner, ahead)? else { return Ok(CompactStep::Idle) };
        if inner.residency.dirty(c) > 0 {
            self.clean_chunk(inner, c, blocks_max)?;
            if inner.residency.dirty(c) > 0 {
                return Ok(CompactStep::Progress);
            }
        }
        if inner.cap.is_dirty() {
            self.flush_capacity(inner)?;
        }
        let keep = self.to_retain(inner, c)?;
        let bpc = inner.blocks_per_chunk();
        let current: Vec<(usize, u32, u64)> = inner.log.chunk(c).current().collect();
        let mut dropped = vec![0u64; inner.vols.len()];
        for (i, v, lba) in current {
            let cb = c.0 as u64 * bpc + i as u64;
            inner.vols[v as usize].l2p.set(lba as usize, Loc::NONE, 0)?;
            inner.invalidate(Loc::cache(cb));
            dropped[v as usize] += 1;
        }
        for k in &keep {
            dropped[k.vol as usize] -= 1;
        }
        for (v, n) in dropped.into_iter().enumerate().filter(|&(_, n)| n > 0) {
            inner.vols[v].cache.count(CacheCount::Evicted, n * BS);
        }
        let step = self.free_oldest(inner, c)?;
        // The kept blocks are logged clean only now that `c` is freed:
        // until then their homes (durable before the free) hold the same
        // bytes, so a crash in between loses nothing; what finds no room
        // is left at home.
        self.log_kept(inner, &keep, false)?;
        self.log_claims(inner)?;
        Ok(step)
    }

    /// The chunk a reclaim works on — the oldest full one, started, its
    /// pinned dirty blocks moved forward on its first step — or None: no
    /// full chunk, or (`ahead`) one left alone as `reclaim_step` says.
    pub(super) fn reclaim_begin(&self, inner: &mut Inner, ahead: bool) -> Result<Option<ChunkId>, VolumeError> {
        let Some(c) = inner.log.oldest_full() else { return Ok(None) };
        let fresh = inner.residency.moved(c).is_none();
        if ahead && fresh && self.full_of_pinned(inner, c) {
            return Ok(None);
        }
        inner.log.start_compacting(c);
        if fresh {
            let moved = self.relog_pinned(inner, c)?;
            inner.residency.set_moved(c, moved);
        }
        Ok(Some(c))
    }

    /// At the start of chunk `c`'s reclaim: move its dirty blocks of pinned
    /// classes forward in the log, still dirty, rather than write them home
    /// (temporary data the class keeps is usually deleted before it would
    /// ever need its home). Highest priority first, at most
    /// `Inner::move_budget` — what is moved counts against the reclaim's
    /// retention (`to_retain`) — and only in room the log has to spare (a
    /// move never reclaims another chunk; what does not fit is cleaned home
    /// as before). Each copy is read and checked against its CRC (one
    /// failing it stays, and its cleaning reports it); the moved copies are
    /// made durable (cache flush) before anything frees `c`, whose copies
    /// they supersede. Returns how many blocks moved.
    fn relog_pinned(&self, inner: &mut Inner, c: ChunkId) -> Result<u32, VolumeError> {
        let mut cand: Vec<(u8, usize)> = pinned_dirty(inner, c).map(|(prio, i, _)| (prio, i)).collect();
        cand.sort_by_key(|&(prio, i)| (std::cmp::Reverse(prio), i));
        cand.truncate(inner.move_budget());
        if cand.is_empty() || !inner.log_has_room_to_keep(cand.len().min(inner.record_blocks_max()) as u64, 0) {
            return Ok(0);
        }
        let mut idx: Vec<usize> = cand.into_iter().map(|(_, i)| i).collect();
        idx.sort_unstable();
        let mut moves = self.read_kept(inner, c, &idx)?;
        moves.sort_by_key(|r| (r.vol, r.lba));
        let moved = self.log_kept(inner, &moves, true)?;
        if moved > 0 {
            self.flush_cache(inner)?;
        }
        Ok(moved as u32)
    }

    /// Whether chunk `c` holds more dirty blocks of pinned classes, on
    /// write-back volumes that spill when the log is full, than one reclaim
    /// may move forward (`reclaim_step`).
    fn full_of_pinned(&self, inner: &Inner, c: ChunkId) -> bool {
        let spills = |v: u32| inner.vols[v as usize].cache.policy().spill;
        let movable = inner.move_budget().min(inner.room_to_keep() as usize);
        pinned_dirty(inner, c).filter(|&(_, _, v)| spills(v)).count() > movable
    }

    /// The blocks of chunk `c` (about to be freed, every block clean) that
    /// its reclaim keeps, unless their volume is pass-through: those of
    /// pinned classes, then by class priority,
    /// then those read since they were logged if their volume retains hot
    /// blocks — at most `RETAIN_SHARE` of the chunk less what the reclaim
    /// moved forward (`relog_pinned`), so a reclaim always frees room. Read
    /// from the log and checked now (a copy failing its CRC is not kept:
    /// its home holds the data).
    fn to_retain(&self, inner: &Inner, c: ChunkId) -> Result<Vec<Retained>, VolumeError> {
        let bpc = inner.blocks_per_chunk();
        let budget = relog_budget(bpc).saturating_sub(inner.residency.moved(c).unwrap_or(0) as usize);
        let ch = inner.log.chunk(c);
        let base = c.0 as u64 * bpc;
        let res = &inner.residency;
        let mut cand: Vec<((bool, u8), usize)> = Vec::new();
        for (i, v, _) in ch.current() {
            let vc = &inner.vols[v as usize].cache;
            let cb = base + i as u64;
            let (pinned, prio) = vc.classes().rank(res.class(cb));
            // A pass-through volume caches nothing anew (a detach).
            if vc.policy().mode != CacheMode::PassThrough && (pinned || res.is_hot(cb) && vc.policy().retain_hot) {
                cand.push(((pinned, prio), i));
            }
        }
        cand.sort_by_key(|&(rank, i)| (std::cmp::Reverse(rank), i));
        cand.truncate(budget);
        let mut idx: Vec<usize> = cand.into_iter().map(|(_, i)| i).collect();
        idx.sort_unstable();
        self.read_kept(inner, c, &idx)
    }

    /// Blocks `idx` of chunk `c` (indexes in it, sorted, current) read from
    /// the log in one read over their span, each checked against its CRC:
    /// those that pass, as blocks to keep (a copy failing it is left where
    /// it is).
    fn read_kept(&self, inner: &Inner, c: ChunkId, idx: &[usize]) -> Result<Vec<Retained>, VolumeError> {
        let (Some(&first), Some(&last)) = (idx.first(), idx.last()) else { return Ok(Vec::new()) };
        let base = c.0 as u64 * inner.blocks_per_chunk();
        let data = read_at(&*self.cache, (base + first as u64) * BS, ((last + 1 - first) as u64 * BS) as usize)?;
        let (ch, res) = (inner.log.chunk(c), &inner.residency);
        let mut keep = Vec::with_capacity(idx.len());
        for &i in idx {
            let ((vol, lba), cb) = (ch.owner(i), base + i as u64);
            let block = data[(i - first) * BLOCK_BYTES..][..BLOCK_BYTES].to_vec();
            let crc = inner.vols[vol as usize].l2p.entry(lba as usize)?.1;
            if crc32c(&block) == crc {
                keep.push(Retained { vol, lba, class: res.class(cb), hot: res.is_hot(cb), crc, block });
            }
        }
        Ok(keep)
    }

    /// Log `keep` again, a record per run of one volume's blocks, while the
    /// log has room to keep them (`log_has_room_to_keep`): each new copy in
    /// its class; `moved` (`relog_pinned`), dirty and hot if it was, counted
    /// as relogged; else (retention, `to_retain`) clean and cold — a retention spends the
    /// second chance — counted as retained. Returns how many were logged.
    fn log_kept(&self, inner: &mut Inner, keep: &[Retained], moved: bool) -> Result<usize, VolumeError> {
        let max = inner.record_blocks_max();
        let (mut i, mut records) = (0, 0);
        while i < keep.len() {
            let vol = keep[i].vol;
            let n = keep[i..].iter().take(max).take_while(|r| r.vol == vol).count();
            if !inner.log_has_room_to_keep(n as u64, (i + records) as u64) {
                break;
            }
            let part = &keep[i..i + n];
            let writes: Vec<(u64, &[u8])> = part.iter().map(|r| (r.lba, r.block.as_slice())).collect();
            let crcs: Vec<u32> = part.iter().map(|r| r.crc).collect();
            self.append(inner, vol, &writes, &crcs, false)?;
            for r in part {
                let cb = inner.vols[vol as usize].l2p.get(r.lba as usize)?.cache_block().expect("just logged");
                if !moved {
                    inner.mark_clean(cb);
                }
                if r.class != 0 {
                    inner.set_class(cb, r.class);
                }
                if moved && r.hot {
                    inner.mark_hot(cb);
                }
            }
            let what = if moved { CacheCount::Relogged } else { CacheCount::Retained };
            inner.vols[vol as usize].cache.count(what, n as u64 * BS);
            i += n;
            records += 1;
        }
        Ok(i)
    }
}

/// A block a reclaim keeps (`Engine::read_kept`): moved forward dirty or
/// retained clean.
struct Retained {
    vol: u32,
    lba: u64,
    class: u8,
    hot: bool,
    crc: u32,
    block: Vec<u8>,
}

/// Most of a reclaimed chunk's blocks its reclaim keeps, when the log is
/// mostly dirty (`Inner::move_budget`).
const RETAIN_SHARE: f64 = 0.5;

/// Share of the log's data blocks held by pinned classes up to which a
/// reclaim may move a whole chunk's pinned dirty blocks forward
/// (`Inner::move_budget`): each block kept is paid for by the others' and
/// dead blocks of the chunks behind it, so at this share the log writes at
/// most 1 / (1 - 0.75) = 4 blocks for each it frees in the worst case, and
/// far fewer when the kept data dies before the head comes round again
/// (temporary files).
const PINNED_SHARE_MAX: f64 = 0.75;

/// The blocks one reclaim of a chunk of `bpc` blocks may keep in the log,
/// moved dirty and retained clean together (`RETAIN_SHARE` of it).
fn relog_budget(bpc: u64) -> usize {
    (bpc as f64 * RETAIN_SHARE) as usize
}

/// Chunk `c`'s dirty blocks of pinned classes on write-back volumes, as
/// (class priority, index in the chunk, volume): what a reclaim may move
/// forward (`Engine::relog_pinned`).
fn pinned_dirty(inner: &Inner, c: ChunkId) -> impl Iterator<Item = (u8, usize, u32)> + '_ {
    let base = c.0 as u64 * inner.blocks_per_chunk();
    inner.log.chunk(c).current().filter_map(move |(i, v, _)| {
        let cb = base + i as u64;
        let vc = &inner.vols[v as usize].cache;
        let (pinned, prio) = vc.classes().rank(inner.residency.class(cb));
        let keep = pinned && !inner.residency.is_clean(cb) && vc.policy().mode == CacheMode::WriteBack;
        keep.then_some((prio, i, v))
    })
}
