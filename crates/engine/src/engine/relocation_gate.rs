//! The relocation gate: whether a compaction or GC step may run beside
//! the records in flight, or must wait until they are published.
//!
//! Owns the rule, not the steps: relocations (compaction, GC) give the
//! copies they move new sequence numbers, and replay keeps the copy with
//! the highest, so an older copy relocated while a newer record of its LBA
//! is still in flight would win over that record after a crash (the crash
//! simulation found exactly this, seed 12). A step runs beside records in
//! flight only if its victims hold no copy (or tombstone) of a block they
//! rewrite, and no record in flight (`Inner::relocations_clear`); GC passes
//! over such bands when it chooses a victim (`Inner::bands_in_flight`).
//! Otherwise the step waits for them (`Engine::lock_for_relocation`), or a
//! writer's step is skipped (assist.rs).
//!
//! Invariant: the gate is checked under the engine lock before every step,
//! and nothing reserves between the check and the step's walk, which runs
//! under the same hold of the lock.

use super::{BandId, ChunkId, Engine, Inner, Loc};
use std::sync::MutexGuard;

/// What a relocation step moves blocks out of.
#[derive(Clone, Copy)]
enum Source {
    Chunk(ChunkId),
    Band(BandId),
}

impl Inner {
    /// Whether relocating blocks out of `src` now would move a block whose
    /// LBA a record in flight rewrites (or `src` holds a record in flight,
    /// which its P2L does not know yet). The relocated copy would take a
    /// sequence number above the record's and outrank it in replay; the
    /// crash simulation found exactly this (seed 12) before the rule. An
    /// LBA the map holds nowhere may have a live tombstone in any chunk or
    /// band, which relocations carry forward: it waits for every source.
    fn relocation_waits(&self, src: Source) -> bool {
        let bpc = self.blocks_per_chunk();
        let bpb = self.blocks_per_band();
        let inside = |l: Loc| match src {
            Source::Chunk(c) => l.cache_block().is_some_and(|b| b / bpc == c.0 as u64),
            Source::Band(v) => l.capacity_block().is_some_and(|b| b / bpb == v.0 as u64),
        };
        let holds_one = match src {
            Source::Chunk(c) => self.log.inflight().values().any(|f| f.chunk == c),
            Source::Band(_) => false,
        };
        holds_one || self.inflight_places().any(|l| l.is_none_or(inside))
    }

    /// Where the map holds each block a record in flight rewrites: None
    /// where it cannot say, or holds the block nowhere (its live tombstone
    /// may then be in any chunk or band).
    fn inflight_places(&self) -> impl Iterator<Item = Option<Loc>> + '_ {
        self.log.inflight().values().flat_map(move |f| {
            let l2p = &self.vols[f.vol as usize].l2p;
            f.entries.iter().map(move |e| l2p.get(e.lba as usize).ok().filter(|&l| l != Loc::NONE))
        })
    }

    /// Whether the next compaction step and the next GC step may run beside
    /// the records in flight: neither the oldest full chunk nor the GC
    /// victim (the one in progress, or the one `gc_victim` would choose,
    /// which passes over bands a record in flight needs) holds a block a
    /// record in flight rewrites. Checked before every step; otherwise the
    /// step waits for them (the drained lock, or a writer's `Busy`).
    pub(super) fn relocations_clear(&self) -> bool {
        if self.log.inflight().is_empty() {
            return true;
        }
        let chunk = self.log.oldest_full().is_some_and(|c| self.relocation_waits(Source::Chunk(c)));
        let band = self.gc_cursor.is_some_and(|k| self.relocation_waits(Source::Band(k.victim)));
        !chunk && !band
    }

    /// The bands GC passes over as new victims for now: those holding the
    /// current copy of a block a record in flight rewrites; None (every
    /// band) if such a block is unmapped (its tombstone may be anywhere) or
    /// the map cannot say.
    pub(super) fn bands_in_flight(&self) -> Option<Vec<BandId>> {
        let bpb = self.blocks_per_band();
        let mut out = Vec::new();
        for l in self.inflight_places() {
            out.extend(l?.capacity_block().map(|b| BandId((b / bpb) as u32)));
        }
        Some(out)
    }
}

impl Engine {
    /// The engine lock for a relocation step: as it is when the step may
    /// run beside the records in flight (`Inner::relocations_clear`), else
    /// once they are published.
    pub(super) fn lock_for_relocation(&self) -> MutexGuard<'_, Inner> {
        let g = self.lock_raw();
        if g.relocations_clear() {
            return g;
        }
        self.drained(g)
    }

    /// Whether a compaction or GC step now would wait for records in flight
    /// (`compact_some` and `collect_some` would drain them first). The
    /// simulation's scheduler asks before it takes one between steps.
    pub fn relocations_wait(&self) -> bool {
        !self.lock_raw().relocations_clear()
    }
}
