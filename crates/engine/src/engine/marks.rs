//! Capacity marks: what the capacity device is known to hold durably,
//! written where recovery can find it (docs/format.md, "Capacity mark").
//!
//! Bands describe themselves (every segment is self-describing), but a
//! damaged segment header and a segment torn by a crash look alike. What
//! tells them apart is whether the segment was durable: a segment that a
//! completed capacity flush covered may be damaged, never torn. A mark
//! records, after each capacity flush that precedes freeing a log chunk or
//! discarding a GC victim, every open band's write pointer (with the band's
//! epoch). Recovery then knows, for the bands open at the last mark, how far
//! they must read back intact; a segment beyond that point was written after
//! the last mark, so the blocks it copied are still in their source (a chunk
//! or a victim is freed only after the next mark), and losing it loses
//! nothing.
//!
//! Invariants: a mark is written after the flush it describes and made
//! durable by the cache flush that always follows it, before the chunk or
//! victim is freed; the two slots alternate, so a torn mark leaves the
//! previous one; the newer valid slot wins.

use super::{
    crc32c, flush, read_at, write_at, BandId, BandState, BlockDevice, ChunkId, DeviceError, Engine, Inner, VolumeError,
    BLOCK_BYTES, BS,
};

pub const MARK_MAGIC: u32 = 0x534c_4d4b; // "SLMK"
const MARK_VERSION: u16 = 1;
/// Blocks of chunk 0 (which holds the superblock in blocks 0 and 1) that
/// hold the two mark slots.
pub(super) const MARK_SLOTS: [u64; 2] = [2, 3];
const MARK_FIXED_BYTES: usize = 32;
const MARK_ENTRY_BYTES: usize = 16;
/// Most bands one mark lists.
pub(super) const MARK_BANDS_MAX: usize = (BLOCK_BYTES - MARK_FIXED_BYTES - 4) / MARK_ENTRY_BYTES;
// Every stream's open and last full bands (each volume's, GC's) and a
// reclaimed victim fit.
const _: () = assert!(MARK_BANDS_MAX > 2 * (crate::persist::VOLUMES_MAX + 1));

/// `MarkedBand::written` of the band GC reclaimed just before the mark.
pub(super) const RECLAIMED: u32 = u32::MAX;

/// One band in a mark: its write pointer (blocks) at the flush, and its
/// epoch (which generation of the band that pointer is for); or, with
/// `written` = `RECLAIMED`, the victim GC is about to discard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MarkedBand {
    pub band: u32,
    pub written: u32,
    pub epoch: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Mark {
    pub gen: u64,
    /// The log's head after the free the mark precedes.
    pub head_lsn: u64,
    pub bands: Vec<MarkedBand>,
}

impl Mark {
    pub fn encode(&self, tag: u32) -> Vec<u8> {
        assert!(self.bands.len() <= MARK_BANDS_MAX);
        let mut b = vec![0u8; BLOCK_BYTES];
        b[0..4].copy_from_slice(&MARK_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&MARK_VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&tag.to_le_bytes());
        b[12..16].copy_from_slice(&(self.bands.len() as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.gen.to_le_bytes());
        b[24..32].copy_from_slice(&self.head_lsn.to_le_bytes());
        for (i, m) in self.bands.iter().enumerate() {
            let o = MARK_FIXED_BYTES + i * MARK_ENTRY_BYTES;
            b[o..o + 4].copy_from_slice(&m.band.to_le_bytes());
            b[o + 4..o + 8].copy_from_slice(&m.written.to_le_bytes());
            b[o + 8..o + 16].copy_from_slice(&m.epoch.to_le_bytes());
        }
        let c = crc32c(&b[..BLOCK_BYTES - 4]);
        b[BLOCK_BYTES - 4..].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// A slot's mark: `Ok(None)` for a slot never written (no magic) or
    /// written by another engine; `Err(())` for one that carries the magic
    /// but does not check (damaged or torn).
    pub fn decode(b: &[u8], tag: u32) -> Result<Option<Mark>, ()> {
        if b.len() != BLOCK_BYTES || b[0..4] != MARK_MAGIC.to_le_bytes() {
            return Ok(None);
        }
        if crc32c(&b[..BLOCK_BYTES - 4]) != u32::from_le_bytes(b[BLOCK_BYTES - 4..].try_into().expect("4")) {
            return Err(());
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        if u16::from_le_bytes([b[4], b[5]]) != MARK_VERSION || u32_at(8) != tag {
            return Ok(None);
        }
        let n = u32_at(12) as usize;
        if n > MARK_BANDS_MAX {
            return Err(());
        }
        let bands = (0..n)
            .map(|i| {
                let o = MARK_FIXED_BYTES + i * MARK_ENTRY_BYTES;
                MarkedBand { band: u32_at(o), written: u32_at(o + 4), epoch: u64_at(o + 8) }
            })
            .collect();
        Ok(Some(Mark { gen: u64_at(16), head_lsn: u64_at(24), bands }))
    }
}

/// The newer of the two slots' marks (None if neither holds one), and
/// whether a slot was damaged.
pub(super) fn read_mark(cache: &dyn BlockDevice, tag: u32) -> Result<(Option<Mark>, bool), DeviceError> {
    let mut best: Option<Mark> = None;
    let mut damaged = false;
    for slot in MARK_SLOTS {
        match Mark::decode(&read_at(cache, slot * BS, BLOCK_BYTES)?, tag) {
            Ok(Some(m)) => {
                if best.as_ref().is_none_or(|b| m.gen > b.gen) {
                    best = Some(m);
                }
            }
            Ok(None) => {}
            Err(()) => damaged = true,
        }
    }
    Ok((best, damaged))
}

/// The mark a recovery writes before it changes any band, made durable at
/// once: nothing is open now, but what the last mark said of bands still
/// holding that generation stays said (a crash during this reopen must not
/// make the next one forget what was durable); bands the recovery frees,
/// resets or discards drop out of it.
pub(super) fn write_mark_now(
    cache: &dyn BlockDevice,
    inner: &mut Inner,
    last: Option<&Mark>,
) -> Result<(), DeviceError> {
    let mut m = inner.next_mark(None, None);
    for mb in last.map_or(&[][..], |l| &l.bands[..]) {
        let band = &inner.bands[mb.band as usize];
        if band.state().holds_all() && band.epoch() == mb.epoch && m.bands.len() < MARK_BANDS_MAX {
            let written = if mb.written == RECLAIMED { RECLAIMED } else { mb.written.min(band.written() as u32) };
            m.bands.push(MarkedBand { written, ..*mb });
        }
    }
    put_mark(cache, &m, inner.tag)?;
    flush(cache)
}

/// Write `m` into its slot (generations alternate between the two).
fn put_mark(cache: &dyn BlockDevice, m: &Mark, tag: u32) -> Result<(), DeviceError> {
    write_at(cache, MARK_SLOTS[(m.gen % 2) as usize] * BS, &m.encode(tag))
}

impl Inner {
    /// The next mark (see `Engine::write_mark`); takes its generation.
    fn next_mark(&mut self, freeing: Option<ChunkId>, reclaiming: Option<BandId>) -> Mark {
        let closed = self.bands.take_closed_since_mark();
        // Open bands are the volumes' (or their streams') and GC's: listing
        // them costs the volume count, not the band count (a million bands
        // on a 64 TiB device).
        let mut listed: Vec<BandId> = self.bands.streams_open().collect();
        listed.extend(closed.iter().copied().filter(|&b| self.bands[b].state().holds_all()));
        // Each stream's last full band too: the band its stream opens next
        // names it, but until that one's first segment is known durable
        // (`recovery/bands.rs`, chains), only the mark says how far it must read.
        let last: Vec<(BandId, u64)> = self.bands.streams_last().collect();
        let last = last.into_iter();
        listed.extend(
            last.filter(|&(b, e)| self.bands[b].state().holds_all() && self.bands[b].epoch() == e).map(|(b, _)| b),
        );
        listed.sort_unstable();
        listed.dedup();
        let mut bands: Vec<MarkedBand> = listed
            .into_iter()
            .filter(|&b| self.bands[b].state() != BandState::Free)
            .map(|b| {
                let band = &self.bands[b];
                MarkedBand { band: b.0, written: band.written() as u32, epoch: band.epoch() }
            })
            .collect();
        if let Some(v) = reclaiming {
            bands.insert(0, MarkedBand { band: v.0, written: RECLAIMED, epoch: self.bands[v].epoch() });
        }
        // More open bands than a block lists (a volume count near the
        // superblock's limit): the rest are simply not covered.
        bands.truncate(MARK_BANDS_MAX);
        let head_lsn = match freeing {
            Some(c) => {
                let next = self.log.full().find(|&x| x != c).or(self.log.open().map(|(o, _)| o));
                next.map_or(self.log.lsn() + 1, |n| self.log.chunk(n).first_lsn())
            }
            None => self.head_lsn(),
        };
        self.mark_gen += 1;
        Mark { gen: self.mark_gen, head_lsn, bands }
    }
}

impl Engine {
    /// Write a mark of the capacity device's state as of its last flush:
    /// every open band's pointer, the victim about to be discarded
    /// (`reclaiming`), and the log head once `freeing` (a chunk about to be
    /// freed, if any) is gone. The caller flushes the cache before it frees
    /// anything.
    pub(super) fn write_mark(
        &self,
        inner: &mut Inner,
        freeing: Option<ChunkId>,
        reclaiming: Option<BandId>,
    ) -> Result<(), VolumeError> {
        debug_assert!(!inner.cap.is_dirty(), "a mark describes flushed capacity state");
        let m = inner.next_mark(freeing, reclaiming);
        put_mark(&*self.cache, &m, inner.tag)?;
        inner.cap.marked();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_round_trip_and_rejections() {
        let m = Mark {
            gen: 7,
            head_lsn: 1234,
            bands: vec![MarkedBand { band: 3, written: 96, epoch: 55 }, MarkedBand { band: 9, written: 0, epoch: 61 }],
        };
        let b = m.encode(0xabc);
        assert_eq!(Mark::decode(&b, 0xabc), Ok(Some(m.clone())));
        assert_eq!(Mark::decode(&b, 0xabd), Ok(None), "another engine's mark is none of ours");
        let mut bad = b.clone();
        bad[40] ^= 1;
        assert_eq!(Mark::decode(&bad, 0xabc), Err(()));
        assert_eq!(Mark::decode(&[0u8; BLOCK_BYTES], 0xabc), Ok(None));
    }
}
