//! Step 4 of recovery: for each (volume, LBA) the entry with the highest
//! sequence wins, resolved in place in the L2P being rebuilt.

use super::super::l2p::Loc;
use super::super::Vol;
use crate::volume::VolumeError;

/// The CRC a winning tombstone carries in the L2P being built, so that
/// step 5 looks up its record (`Resolver::seq_at`, which says it is one)
/// only for entries carrying this value, not for every mapped block.
pub(super) const TOMBSTONE_CRC: u32 = 0x7f0e_57a1;

/// The copy's data did not check although it was durable.
pub(super) const DAMAGED: u8 = 1;
/// The copy is in a log record past a gap in its chunk (`Offer::past_gap`).
pub(super) const PAST_GAP: u8 = 2;

/// Step 4 done in place, so that recovery needs no more memory per block
/// than the engine it rebuilds (beside a bounded queue of offers, applied
/// in map order so a paged map reads each page once per batch): each offer
/// goes into the L2P it is building, and wins if its sequence is higher
/// than that of the copy
/// the entry points at now. That sequence is found from the place itself:
/// every record of a chunk and every segment of a band is listed with its
/// header's block and sequence (a few bytes per record, not per block), and
/// a place belongs to the last record starting at or before it. A winning
/// tombstone points at its own record's header block (no data block is
/// ever there) until step 5 unmaps it. The rare flags (`DAMAGED`,
/// `PAST_GAP`) of current winners live in a map beside.
pub(super) struct Resolver {
    pub(super) vols: Vec<Vol>,
    pub(super) bpc: u64,
    pub(super) bpb: u64,
    /// Per chunk and per band: header blocks (ascending) and sequences.
    pub(super) chunk_pos: Vec<Vec<u32>>,
    pub(super) chunk_seq: Vec<Vec<u64>>,
    pub(super) band_pos: Vec<Vec<u32>>,
    pub(super) band_seq: Vec<Vec<u64>>,
    pub(super) flags: std::collections::HashMap<(u32, u64), u8>,
    pub(super) seq_max: u64,
    /// Offers not applied yet (`queue`), applied sorted by (volume, LBA).
    pub(super) queued: Vec<Queued>,
}

/// An offer waiting in `Resolver::queued`.
#[derive(Clone, Copy)]
pub(super) struct Queued {
    pub(super) vol: u32,
    pub(super) flags: u8,
    pub(super) crc: u32,
    pub(super) lba: u64,
    pub(super) seq: u64,
    pub(super) loc: Loc,
}

/// Most offers queued before they are applied: at ~40 bytes each, 80 MiB.
const QUEUED_MAX: usize = 1 << 21;

impl Resolver {
    /// The sequence of the record or segment holding `loc`, and whether
    /// `loc` is its header block (a tombstone's place); (0, false) for none.
    pub(super) fn seq_at(&self, loc: Loc) -> (u64, bool) {
        let (pos, seq, at) = if let Some(cb) = loc.cache_block() {
            let c = (cb / self.bpc) as usize;
            (&self.chunk_pos[c], &self.chunk_seq[c], (cb % self.bpc) as u32)
        } else if let Some(pb) = loc.capacity_block() {
            let b = (pb / self.bpb) as usize;
            (&self.band_pos[b], &self.band_seq[b], (pb % self.bpb) as u32)
        } else {
            return (0, false);
        };
        let i = pos.partition_point(|&p| p <= at);
        assert!(i > 0, "{loc:?} lies in no listed record");
        (seq[i - 1], pos[i - 1] == at)
    }

    /// A copy of (vol, LBA) with sequence `seq` at `loc` (a data block, or
    /// for a tombstone its record's header block).
    pub(super) fn offer(
        &mut self,
        vol: u32,
        lba: u64,
        seq: u64,
        loc: Loc,
        crc: u32,
        flags: u8,
    ) -> Result<(), VolumeError> {
        let cur = self.vols[vol as usize].l2p.get(lba as usize)?;
        if seq > self.seq_at(cur).0 {
            self.vols[vol as usize].l2p.set(lba as usize, loc, crc)?;
            if flags != 0 {
                self.flags.insert((vol, lba), flags);
            } else if !self.flags.is_empty() {
                self.flags.remove(&(vol, lba));
            }
        }
        Ok(())
    }

    /// `offer`, later: queued, for step 5 to apply page by page
    /// (`take_queued`, `apply`), or in (volume, LBA) order now if
    /// `QUEUED_MAX` are waiting. The winner of an LBA does not depend on
    /// the order of its offers (the highest sequence wins; sorts are
    /// stable, so equal ones keep their order), but a paged map's faults
    /// do: offers in log order touch its pages at random and step 5 then
    /// walks them all again; applied page by page just before step 5 walks
    /// that page, each page is faulted in once. Every offer whose place lies
    /// in a chunk must be queued after that chunk's records are listed
    /// (`chunk_pos`), as for `offer`.
    pub(super) fn queue(&mut self, o: Queued) -> Result<(), VolumeError> {
        self.queued.push(o);
        if self.queued.len() >= QUEUED_MAX {
            let q = self.take_queued();
            return q.iter().try_for_each(|o| self.apply(o));
        }
        Ok(())
    }

    /// The queued offers, sorted by (volume, LBA); none left queued.
    pub(super) fn take_queued(&mut self) -> Vec<Queued> {
        let mut q = std::mem::take(&mut self.queued);
        q.sort_by_key(|o| (o.vol, o.lba));
        q
    }

    /// `offer` a queued offer.
    pub(super) fn apply(&mut self, o: &Queued) -> Result<(), VolumeError> {
        self.offer(o.vol, o.lba, o.seq, o.loc, o.crc, o.flags)
    }

    /// The flags of (vol, LBA)'s current copy.
    pub(super) fn flags_of(&self, vol: u32, lba: u64) -> u8 {
        if self.flags.is_empty() {
            return 0;
        }
        self.flags.get(&(vol, lba)).copied().unwrap_or(0)
    }
}

impl Offer {
    /// The offer, with `flags`, queued for the resolver.
    pub(super) fn queued(&self, flags: u8) -> Queued {
        Queued { vol: self.vol, flags, crc: self.crc, lba: self.lba, seq: self.seq, loc: self.loc }
    }
}

/// One entry found in a chunk: a candidate for its LBA.
pub(super) struct Offer {
    pub(super) vol: u32,
    pub(super) lba: u64,
    pub(super) seq: u64,
    pub(super) lsn: u64,
    pub(super) loc: Loc,
    pub(super) crc: u32,
    /// The data block matched its CRC (always true for tombstones).
    pub(super) intact: bool,
    /// From a record past a gap (a torn or damaged record) in its chunk.
    /// It counts, but the compactor walks a chunk from its start and stops
    /// at the first gap, so nothing may stay pointing beyond one: such
    /// entries that win are written again (`relog`).
    pub(super) past_gap: bool,
}
