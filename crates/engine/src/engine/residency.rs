//! The in-place cache's state of each cached block (`Layout::InPlace`):
//! whether its home holds the same bytes (clean), its I/O class, whether a
//! read found it (hot); and per log chunk, how many of its current blocks
//! are dirty and when it was sealed.
//!
//! Owns: those marks. The log (log.rs) owns which cache blocks are current
//! and whose they are; this module owns only what in-place caching adds to
//! them, so the log with bands carries none of it. Cleaning (cleaning.rs)
//! marks blocks clean and hot, classes (classes.rs) sets classes, the
//! checkpoint saves and restores the clean bits (format version 7), and the
//! engine tells it when a block is logged, dropped, sealed or freed — each a
//! method here.
//!
//! Invariants (asserted, `check` in full): only a current block carries a
//! mark; a chunk's dirty count is its current blocks that are not clean; a
//! freed chunk carries no mark and counts nothing dirty; a block is logged
//! dirty, unclassified and cold. With bands nothing is marked.
//!
//! Built as flat vectors indexed by cache block (the log's numbering),
//! rather than fields of each chunk, so one module changes them all and the
//! chunk stays the log's.
//!
//! **Claims: clean across a crash.** A block marked clean is `pending`
//! until the disk is flushed, then `ready`; ready blocks still current and
//! clean are logged in Clean records (`RecordKind::Clean`, lba and CRC of
//! the copy), and recovery marks a winning copy clean when a Clean record
//! written after it names its CRC. A claim must never outlive the home
//! bytes it vouches for: before the engine writes the home of a block that
//! has a claim (`claims`), the claimed copy is made unable to win a later
//! recovery — the records that supersede it flushed first, and a claimed
//! copy still current dropped by a tombstone flushed before the write
//! (cleaning.rs). A claim leaves `claims` then, or when its copy's chunk is
//! freed (the copy is below the log's head: never replayed again).

use super::log::ChunkId;
use crate::persist::Writer;

pub(super) struct Residency {
    blocks_per_chunk: usize,
    /// Per cache block: its home holds the same bytes (cleaned, written
    /// through, or promoted by a read), so freeing its chunk writes nothing.
    clean: Vec<bool>,
    /// Per cache block: its I/O class (classes.rs; 0 unclassified). Not
    /// persisted: after a reopen every cached block is class 0.
    class: Vec<u8>,
    /// Per cache block: a read found it since it was logged (the second
    /// chance of `Engine::to_retain`). Not persisted.
    hot: Vec<bool>,
    /// Per chunk: current blocks not clean, what cleaning it must still
    /// write home.
    dirty: Vec<u32>,
    /// Per chunk: when it was sealed (age-based cleaning); None after a
    /// reopen, which counts as old.
    sealed_at: Vec<Option<u64>>,
    /// Per chunk being reclaimed: how many of its dirty blocks the reclaim
    /// moved forward in the log (`Engine::relog_pinned`), once it has
    /// decided; None before. What it moved counts against what the same
    /// reclaim may retain, so each reclaim frees room (cleaning.rs).
    moved: Vec<Option<u32>>,
    /// Blocks marked clean since the disk was last flushed, and those whose
    /// homes a flush made durable since: (volume, LBA, cache block).
    pending: Vec<(u32, u64, u64)>,
    ready: Vec<(u32, u64, u64)>,
    /// LBAs with a claim in the log (maybe not yet durable) that a later
    /// recovery could still act on: the claimed copy's cache block.
    claims: std::collections::HashMap<(u32, u64), u64>,
    /// Per chunk: the claims of copies in it (to forget when it is freed).
    claimed_in: Vec<Vec<(u32, u64)>>,
    /// Home writes being prepared (`pause_claims`): no claim is taken then
    /// — a claim logged by a reclaim nested in one could vouch for a home
    /// about to be overwritten.
    claims_paused: u32,
}

impl Residency {
    /// Nothing cached: `chunks` chunks of `blocks_per_chunk` blocks.
    pub(super) fn empty(chunks: usize, blocks_per_chunk: usize) -> Residency {
        let blocks = chunks * blocks_per_chunk;
        Residency {
            blocks_per_chunk,
            clean: vec![false; blocks],
            class: vec![0; blocks],
            hot: vec![false; blocks],
            dirty: vec![0; chunks],
            sealed_at: vec![None; chunks],
            moved: vec![None; chunks],
            pending: Vec::new(),
            ready: Vec::new(),
            claims: Default::default(),
            claimed_in: vec![Vec::new(); chunks],
            claims_paused: 0,
        }
    }

    fn chunk_of(&self, cb: u64) -> usize {
        cb as usize / self.blocks_per_chunk
    }

    pub(super) fn is_clean(&self, cb: u64) -> bool {
        self.clean[cb as usize]
    }
    pub(super) fn class(&self, cb: u64) -> u8 {
        self.class[cb as usize]
    }
    pub(super) fn is_hot(&self, cb: u64) -> bool {
        self.hot[cb as usize]
    }
    /// Current blocks of chunk `c` not yet cleaned home.
    pub(super) fn dirty(&self, c: ChunkId) -> u32 {
        self.dirty[c.index()]
    }
    /// Current blocks not yet cleaned home, in every chunk.
    pub(super) fn dirty_total(&self) -> u64 {
        self.dirty.iter().map(|&d| d as u64).sum()
    }
    pub(super) fn sealed_at(&self, c: ChunkId) -> Option<u64> {
        self.sealed_at[c.index()]
    }
    /// How many dirty blocks the reclaim of chunk `c` moved forward, if it
    /// has decided.
    pub(super) fn moved(&self, c: ChunkId) -> Option<u32> {
        self.moved[c.index()]
    }

    /// The reclaim of chunk `c` moved `n` of its dirty blocks forward (once
    /// per reclaim: it decides before it cleans).
    pub(super) fn set_moved(&mut self, c: ChunkId, n: u32) {
        assert!(self.moved[c.index()].is_none(), "chunk {c}: moved twice in one reclaim");
        assert!(n as usize <= self.blocks_per_chunk, "chunk {c}: moved {n} blocks");
        self.moved[c.index()] = Some(n);
    }

    /// Cache block `cb` became current (logged, or found by recovery):
    /// dirty, unclassified, cold.
    pub(super) fn logged(&mut self, cb: u64) {
        let i = cb as usize;
        assert!(!self.clean[i] && self.class[i] == 0 && !self.hot[i], "cache block {cb} logged over marks");
        let c = self.chunk_of(cb);
        self.dirty[c] += 1;
        assert!(self.dirty[c] as usize <= self.blocks_per_chunk, "chunk {c}: more dirty blocks than blocks");
    }

    /// Cache block `cb` (current) left the cache: its marks go. Returns its
    /// class and whether it was dirty.
    pub(super) fn dropped(&mut self, cb: u64) -> (u8, bool) {
        let i = cb as usize;
        let dirty = !std::mem::take(&mut self.clean[i]);
        self.hot[i] = false;
        if dirty {
            let c = self.chunk_of(cb);
            assert!(self.dirty[c] > 0, "chunk {c}: a dirty block not counted");
            self.dirty[c] -= 1;
        }
        (std::mem::take(&mut self.class[i]), dirty)
    }

    /// Cache block `cb` (current, holding `lba` of `vol`) now has its bytes
    /// at home too (once the disk is flushed: `disk_flushed`). Returns
    /// whether it was dirty.
    pub(super) fn mark_clean(&mut self, cb: u64, vol: u32, lba: u64) -> bool {
        let was_dirty = !std::mem::replace(&mut self.clean[cb as usize], true);
        if was_dirty {
            let c = self.chunk_of(cb);
            assert!(self.dirty[c] > 0, "chunk {c}: a dirty block not counted");
            self.dirty[c] -= 1;
            self.pending.push((vol, lba, cb));
        }
        was_dirty
    }

    /// Recovery: cache block `cb` (current, `lba` of `vol`) is clean by a
    /// claim found in the log, which stays in force.
    pub(super) fn recovered_clean(&mut self, cb: u64, vol: u32, lba: u64) {
        let was_dirty = !std::mem::replace(&mut self.clean[cb as usize], true);
        assert!(was_dirty, "cache block {cb} found clean twice");
        let c = self.chunk_of(cb);
        self.dirty[c] -= 1;
        self.claimed(vol, lba, cb);
    }

    /// The disk was flushed: the homes of the blocks marked clean before
    /// are durable.
    pub(super) fn disk_flushed(&mut self) {
        self.ready.append(&mut self.pending);
    }

    /// No claim is taken until as many `resume_claims` (a home write is
    /// being prepared).
    pub(super) fn pause_claims(&mut self) {
        self.claims_paused += 1;
    }
    pub(super) fn resume_claims(&mut self) {
        assert!(self.claims_paused > 0, "claims resumed more often than paused");
        self.claims_paused -= 1;
    }

    /// The blocks to claim now: ready ones, as `still` (current, clean, at
    /// that cache block) confirms; the rest are forgotten. None while
    /// claims are paused (they stay ready).
    pub(super) fn take_ready(&mut self, still: impl Fn(u32, u64, u64) -> bool) -> Vec<(u32, u64, u64)> {
        if self.claims_paused > 0 {
            return Vec::new();
        }
        let mut out = std::mem::take(&mut self.ready);
        out.retain(|&(v, lba, cb)| self.clean[cb as usize] && still(v, lba, cb));
        out
    }

    /// A Clean record claims `lba` of `vol` for the copy at `cb`.
    pub(super) fn claimed(&mut self, vol: u32, lba: u64, cb: u64) {
        self.claims.insert((vol, lba), cb);
        let c = self.chunk_of(cb);
        self.claimed_in[c].push((vol, lba));
    }

    /// Whether `lba` of `vol` has a claim a recovery could still act on.
    pub(super) fn has_claim(&self, vol: u32, lba: u64) -> bool {
        !self.claims.is_empty() && self.claims.contains_key(&(vol, lba))
    }

    /// The claim on `lba` of `vol` can no longer be acted on (its copy was
    /// made unable to win a recovery).
    pub(super) fn unclaim(&mut self, vol: u32, lba: u64) {
        self.claims.remove(&(vol, lba));
    }

    /// Cache block `cb` (current) was found by a read.
    pub(super) fn mark_hot(&mut self, cb: u64) {
        self.hot[cb as usize] = true;
    }

    /// Cache block `cb` (current) belongs to class `id` now. Returns the
    /// class it had.
    pub(super) fn set_class(&mut self, cb: u64, id: u8) -> u8 {
        std::mem::replace(&mut self.class[cb as usize], id)
    }

    /// Chunk `c` was sealed at `now`.
    pub(super) fn sealed(&mut self, c: ChunkId, now_ns: u64) {
        self.sealed_at[c.index()] = Some(now_ns);
    }

    /// Chunk `c` was freed: nothing of it is current any more.
    pub(super) fn freed(&mut self, c: ChunkId) {
        let c = c.index();
        assert_eq!(self.dirty[c], 0, "chunk {c} freed holding dirty blocks");
        let blocks = c * self.blocks_per_chunk..(c + 1) * self.blocks_per_chunk;
        assert!(
            self.clean[blocks.clone()].iter().all(|&x| !x)
                && self.class[blocks.clone()].iter().all(|&x| x == 0)
                && self.hot[blocks].iter().all(|&x| !x),
            "chunk {c} freed with marks on its blocks"
        );
        self.sealed_at[c] = None;
        self.moved[c] = None;
        // Its copies are below the log's head: no recovery replays them.
        for key in std::mem::take(&mut self.claimed_in[c]) {
            if self.claims.get(&key).is_some_and(|&cb| cb as usize / self.blocks_per_chunk == c) {
                self.claims.remove(&key);
            }
        }
        let bpc = self.blocks_per_chunk;
        self.pending.retain(|&(_, _, cb)| cb as usize / bpc != c);
        self.ready.retain(|&(_, _, cb)| cb as usize / bpc != c);
    }

    /// The checkpoint's clean bits (version 7): per chunk, words of 64
    /// blocks, bit i of word w for block 64·w + i.
    pub(super) fn encode_clean(&self, w: &mut Writer) {
        for chunk in self.clean.chunks(self.blocks_per_chunk) {
            for word in chunk.chunks(64) {
                w.u64(word.iter().enumerate().fold(0u64, |x, (i, &clean)| x | (clean as u64) << i));
            }
        }
    }

    /// The marks a checkpoint describes: each `current` block dirty, unless
    /// the checkpoint holds clean bits (version 7, read by `word` in
    /// `encode_clean`'s order) that say it is clean. A bit of a block that
    /// is not current is ignored.
    pub(super) fn from_checkpoint<E>(
        chunks: usize,
        blocks_per_chunk: usize,
        owner: impl Fn(u64) -> Option<(u32, u64)>,
        word: Option<&mut dyn FnMut() -> Result<u64, E>>,
    ) -> Result<Residency, E> {
        let current = |cb| owner(cb).is_some();
        let mut res = Residency::empty(chunks, blocks_per_chunk);
        for cb in (0..(chunks * blocks_per_chunk) as u64).filter(|&cb| current(cb)) {
            res.logged(cb);
        }
        let Some(next) = word else { return Ok(res) };
        for c in 0..chunks {
            for word in 0..blocks_per_chunk.div_ceil(64) {
                let bits = next()?;
                let first = c * blocks_per_chunk + word * 64;
                for i in 0..64.min(blocks_per_chunk - word * 64) {
                    // Only a current block is clean.
                    // (Claimed, for all the engine knows: the log may hold
                    // a claim on it.)
                    if let Some((v, lba)) = owner((first + i) as u64).filter(|_| bits >> i & 1 == 1) {
                        res.recovered_clean((first + i) as u64, v, lba);
                    }
                }
            }
        }
        Ok(res)
    }

    /// Every mark agrees with the log's current blocks (`current`).
    pub(super) fn check(&self, current: impl Fn(u64) -> bool) {
        for (c, chunk) in self.clean.chunks(self.blocks_per_chunk).enumerate() {
            let first = (c * self.blocks_per_chunk) as u64;
            let mut dirty = 0;
            for (i, &clean) in chunk.iter().enumerate() {
                let cb = first + i as u64;
                if current(cb) {
                    dirty += !clean as u32;
                } else {
                    assert!(
                        !clean && self.class[cb as usize] == 0 && !self.hot[cb as usize],
                        "cache block {cb} is not current but carries marks"
                    );
                }
            }
            assert_eq!(self.dirty[c], dirty, "chunk {c} dirty count");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_dirty_until_cleaned_and_its_marks_leave_with_it() {
        let mut r = Residency::empty(2, 4);
        r.logged(5);
        r.logged(6);
        assert_eq!(r.dirty(ChunkId(1)), 2);
        assert!(r.mark_clean(5, 0, 1));
        assert!(!r.mark_clean(5, 0, 1), "cleaned once");
        r.mark_hot(6);
        assert_eq!(r.set_class(6, 3), 0);
        r.check(|cb| cb == 5 || cb == 6);
        assert_eq!(r.dropped(5), (0, false));
        assert_eq!(r.dropped(6), (3, true));
        r.check(|_| false);
        r.freed(ChunkId(1));
    }

    #[test]
    #[should_panic(expected = "freed holding dirty blocks")]
    fn a_chunk_holding_dirty_blocks_is_never_freed() {
        let mut r = Residency::empty(2, 4);
        r.logged(4);
        r.freed(ChunkId(1));
    }

    #[test]
    fn the_clean_bits_come_back_from_the_checkpoint_for_current_blocks_only() {
        let mut r = Residency::empty(2, 70);
        for cb in [70, 71, 139] {
            r.logged(cb);
        }
        r.mark_clean(71, 0, 1);
        r.mark_clean(139, 0, 69);
        let mut w = Writer(Vec::new());
        r.encode_clean(&mut w);
        assert_eq!(w.0.len(), 2 * 2 * 8, "two words per chunk of 70 blocks");
        let mut words = w.0.chunks(8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
        let mut next = || words.next().ok_or(());
        // Block 139 is no longer current in the log read back.
        let owner = |cb: u64| (cb == 70 || cb == 71).then(|| (0, cb - 70));
        let back = Residency::from_checkpoint(2, 70, owner, Some(&mut next)).unwrap();
        assert!(back.is_clean(71) && !back.is_clean(70) && !back.is_clean(139));
        assert_eq!(back.dirty(ChunkId(1)), 1);
        back.check(|cb| cb == 70 || cb == 71);
    }
}
