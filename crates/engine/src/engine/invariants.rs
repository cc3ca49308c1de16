//! The engine's invariants, checked: every mapped L2P entry points at a
//! cache or capacity block whose P2L names it back (a chunk's P2L, or for a
//! band a place below its write pointer), valid counts equal the number of
//! such blocks, chunks and bands holding current blocks are not free, and
//! every open band is exactly one stream's. O(blocks): run by tests and
//! simulations, and by opens whose maps are in DRAM.

use super::{crc32c, read_at, BandState, ChunkState, Engine, Inner, BLOCK_BYTES, BS};

impl Engine {
    /// Assert the map's invariants (O(blocks); for simulation and tests).
    pub fn check_invariants(&self) {
        self.lock().check_invariants();
    }

    /// In place: every cached block counted clean holds what its home
    /// holds, and every home with a sum (home_sums.rs) holds bytes with
    /// that CRC (read from both devices; for simulations and tests).
    /// Returns the clean blocks and sums checked, or the first that differs.
    pub fn check_clean_copies(&self) -> Result<u64, String> {
        let mut inner = self.lock();
        if !inner.in_place() {
            return Ok(0);
        }
        let mut n = 0;
        for b in 0..inner.home_sums.blocks() {
            let sum = inner.home_sums.sum(b).map_err(|e| e.to_string())?;
            if sum == 0 {
                continue;
            }
            let home = read_at(&*self.capacity, b * BS, BLOCK_BYTES).map_err(|e| e.to_string())?;
            if crc32c(&home) != sum {
                return Err(format!("home block {b}: its sum is {sum:#x}, its bytes' CRC {:#x}", crc32c(&home)));
            }
            n += 1;
        }
        for (cb, v, lba) in inner.log.current() {
            if !inner.residency.is_clean(cb) {
                continue;
            }
            let copy = read_at(&*self.cache, cb * BS, BLOCK_BYTES).map_err(|e| e.to_string())?;
            let home =
                read_at(&*self.capacity, inner.home(v as usize, lba) * BS, BLOCK_BYTES).map_err(|e| e.to_string())?;
            if copy[..] != home[..] {
                return Err(format!("volume {v} block {lba}: counted clean, but its cached copy (cache block {cb}, CRC {}) differs from its home (CRC {})", crc32c(&copy), crc32c(&home)));
            }
            n += 1;
        }
        Ok(n)
    }
}

impl Inner {
    /// `check_invariants` when every map is in DRAM, where it costs a pass
    /// over memory; a paged map would fault in every page ever written
    /// (what opening a paged engine must not do). Simulations and tests
    /// check paged maps by calling `Engine::check_invariants`.
    pub(super) fn check_invariants_unless_paged(&self) {
        if !self.vols.iter().any(|v| v.l2p.is_paged()) {
            self.check_invariants();
        }
    }

    pub(super) fn check_invariants(&self) {
        self.stats.check();
        let mut chunk_valid = vec![0u32; self.log.chunk_count()];
        let mut band_valid = vec![0u32; self.bands.len()];
        let (bpc, bpb) = (self.blocks_per_chunk(), self.blocks_per_band());
        for (vi, v) in self.vols.iter().enumerate() {
            // A paged map reads its pages from the cache device, where a
            // simulation may have armed a fault: then nothing is checked
            // this time.
            let walked = v.l2p.for_each(|lba, loc, _| {
                if let Some(cb) = loc.cache_block() {
                    let (ch, i) = self.log.chunk_of(cb);
                    assert_eq!(ch.owner(i), (vi as u32, lba as u64), "chunk P2L names the block");
                    assert_ne!(ch.state(), ChunkState::Free);
                    chunk_valid[(cb / bpc) as usize] += 1;
                } else if let Some(pb) = loc.capacity_block() {
                    let (b, i) = ((pb / bpb) as usize, pb % bpb);
                    assert!(
                        i < self.bands[b].written(),
                        "capacity block {pb} of volume {vi} LBA {lba} past its band's pointer"
                    );
                    assert_ne!(self.bands[b].state(), BandState::Free);
                    band_valid[b] += 1;
                }
            });
            if walked.is_err() {
                return;
            }
        }
        self.log.check_lists();
        for (c, ch) in self.log.chunks() {
            assert_eq!(ch.valid(), chunk_valid[c.index()], "chunk {c} valid count");
            assert_eq!(ch.current().count(), ch.valid() as usize, "chunk {c}: its P2L names its valid blocks");
        }
        // In place, the cache's marks agree with the log; with bands, none.
        let in_place = self.in_place();
        self.residency.check(|cb| in_place && self.log.is_current(cb));
        // Valid counts, the free list, every open band exactly one
        // stream's (none is stranded).
        self.bands.check(&band_valid);
        self.check_classes();
    }
}
