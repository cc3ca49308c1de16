//! Bands: the capacity device's space, cut into equal bands (zones on a
//! zoned device, zoned.rs), each written strictly sequentially by one
//! stream (a volume, or GC) from Free → Open → Full, and back to Free when
//! GC discards it.
//!
//! A band keeps no P2L in memory: its segments are self-describing, and GC
//! reads them (headers and data) from the band itself. That keeps the
//! engine's DRAM at the L2P's 4 bytes per volume block plus the small cache
//! tier's P2L. Owns: per-band state (valid count, write pointer, epoch, the
//! band its stream filled before it), the free list, opening a band for a
//! stream (running GC first when free bands are short) and closing it.

use super::*;
use crate::layout::STREAM_GC;

/// A band's number: band b holds capacity blocks b·stride onwards
/// (`Inner::blocks_per_band`). On the media (segment headers, marks, the
/// checkpoint) it is a u32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct BandId(pub(super) u32);

impl BandId {
    pub(super) fn index(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for BandId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The capacity device's bands and the streams' places in them.
pub(super) struct Bands {
    pub(super) list: Vec<Band>,
    /// Free bands, oldest freed first.
    pub(super) free: VecDeque<BandId>,
    /// Per GC stream (placement.rs: one unless `BandPlacement::Lifetime`),
    /// the band it writes into and the band it filled last (as
    /// `Vol::last_band`).
    pub(super) gc_open: [Option<BandId>; GC_STREAMS],
    pub(super) gc_last: [Option<(BandId, u64)>; GC_STREAMS],
    /// Bands a salvaging open found damaged: never opened nor chosen by GC
    /// until `salvage_repair` has emptied and discarded them.
    pub(super) quarantine: Vec<BandId>,
    /// Bands closed since the last capacity mark: the next mark lists their
    /// final pointers too, or a segment written after one mark into a band
    /// closed before the next would be in no mark at all.
    pub(super) closed_since_mark: Vec<BandId>,
}

impl Bands {
    /// Every band free.
    pub(super) fn empty(band_count: u64) -> Bands {
        let band = |_| Band {
            state: BandState::Free,
            valid: 0,
            written: 0,
            closed_seq: 0,
            gen: 0,
            tombstones: 0,
            epoch: 0,
            prev: (0, 0),
            born: 0,
            short: false,
            by_gc: false,
        };
        Bands {
            list: (0..band_count).map(band).collect(),
            free: (0..band_count as u32).map(BandId).collect(),
            gc_open: [None; GC_STREAMS],
            gc_last: [None; GC_STREAMS],
            quarantine: Vec::new(),
            closed_since_mark: Vec::new(),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.list.len()
    }
    pub(super) fn iter(&self) -> std::slice::Iter<'_, Band> {
        self.list.iter()
    }
    pub(super) fn iter_mut(&mut self) -> std::slice::IterMut<'_, Band> {
        self.list.iter_mut()
    }
}

impl std::ops::Index<BandId> for Bands {
    type Output = Band;
    fn index(&self, b: BandId) -> &Band {
        &self.list[b.index()]
    }
}

impl std::ops::IndexMut<BandId> for Bands {
    fn index_mut(&mut self, b: BandId) -> &mut Band {
        &mut self.list[b.index()]
    }
}

impl std::ops::Index<usize> for Bands {
    type Output = Band;
    fn index(&self, b: usize) -> &Band {
        &self.list[b]
    }
}

impl std::ops::IndexMut<usize> for Bands {
    fn index_mut(&mut self, b: usize) -> &mut Band {
        &mut self.list[b]
    }
}

/// Where a band is in its cycle: Free → Open (one stream writes it at its
/// pointer) → Full → Victim (GC is relocating what is current in it) →
/// Free. Every change names the state it leaves (`Band::to`), asserted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BandState {
    Free,
    Open,
    Full,
    Victim,
}

impl BandState {
    /// The checkpoint's byte (docs/format.md): 0 free, 1 open, 2 full. A
    /// victim is full there: the GC cursor is not saved.
    pub(super) fn on_media(self) -> u8 {
        match self {
            BandState::Free => 0,
            BandState::Open => 1,
            BandState::Full | BandState::Victim => 2,
        }
    }

    pub(super) fn from_media(x: u8) -> Option<BandState> {
        [BandState::Free, BandState::Open, BandState::Full].get(x as usize).copied()
    }

    /// Full, or full and being collected: the band holds every segment it
    /// was written with.
    pub(super) fn holds_all(self) -> bool {
        matches!(self, BandState::Full | BandState::Victim)
    }
}

impl Band {
    /// Move from state `from` (asserted) to `to`.
    pub(super) fn to(&mut self, from: BandState, to: BandState) {
        assert_eq!(self.state, from, "band state changes from the state it is in");
        self.state = to;
    }
}

/// A band keeps no P2L in memory: its segments are self-describing, and GC
/// reads them (headers and data) from the band itself. That keeps the
/// engine's DRAM at the L2P's 4 bytes per volume block plus the small cache
/// tier's P2L.
pub(super) struct Band {
    pub(super) state: BandState,
    pub(super) valid: u32,
    /// Blocks written so far (write pointer, relative).
    pub(super) written: u64,
    /// Engine write sequence when the band was closed (for age).
    pub(super) closed_seq: u64,
    /// Tombstone entries written into the band since it was last free;
    /// `TOMBSTONES_UNKNOWN` after a clean open (the checkpoint does not keep
    /// it). With `valid` 0 and none, GC has nothing to look at in the band.
    pub(super) tombstones: u32,
    /// Bumped (in memory) before the band's blocks are discarded, so a read
    /// that looked a block up before GC moved it and read it after can tell
    /// its data may be gone (`Inner::generation`).
    pub(super) gen: u64,
    /// Sequence when the band was last opened: every segment in it carries
    /// it, so recovery tells this generation's segments from a previous one's.
    pub(super) epoch: u64,
    /// The band filled just before this one by its stream: (its epoch, the
    /// blocks it held), (0, 0) if none; in every segment header
    /// (`Header::prev_epoch`, `prev_end`), so recovery can tell that band's
    /// damaged tail from a torn one.
    pub(super) prev: (u64, u64),
    /// Placement hints (placement.rs), in memory only: when the data in the
    /// band was written by users (user blocks written before: for a
    /// compaction band, when it was opened; for a GC band, the oldest
    /// victim's), whether the short-lived user stream filled it, and
    /// whether GC did.
    pub(super) born: u64,
    pub(super) short: bool,
    pub(super) by_gc: bool,
}

/// GC streams: `BandPlacement::Lifetime` separates what GC moves into
/// this many classes by age (placement.rs); other placements use the first.
pub(super) const GC_STREAMS: usize = 3;

/// A writer of segments with an open band of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stream {
    /// Compaction's, in the volume slot `Inner::user_stream` chose (a
    /// volume's own, the shared one, or a lifetime class's).
    User(usize),
    /// GC's, by class (`GC_STREAMS`).
    Gc(usize),
}

impl Stream {
    /// `Header::stream` of its segments (docs/format.md).
    pub(super) fn on_media(self) -> u32 {
        match self {
            Stream::User(slot) => slot as u32,
            Stream::Gc(k) => STREAM_GC - k as u32,
        }
    }

    pub(super) fn is_gc(self) -> bool {
        matches!(self, Stream::Gc(_))
    }
}

/// `Band::tombstones` when not known: GC walks the band to find out.
pub(super) const TOMBSTONES_UNKNOWN: u32 = u32::MAX;

/// Whether the stream's open band has room for a segment: a band with room
/// for less than a header and one block is closed.
pub(super) fn band_has_room(inner: &Inner, s: Stream) -> bool {
    inner.stream_band(s).0.is_some_and(|b| inner.band_usable() - inner.bands[b].written >= 2)
}

impl Inner {
    /// Address stride of a band, in blocks (capacity block = band × stride + i).
    pub(super) fn blocks_per_band(&self) -> u64 {
        self.cfg.band_bytes / BS
    }

    /// Blocks a band can hold (≤ the stride; less on a zoned device).
    pub(super) fn band_usable(&self) -> u64 {
        self.geo.usable_blocks
    }

    /// A stream's open band and the band it filled last.
    pub(super) fn stream_band(&self, s: Stream) -> (Option<BandId>, Option<(BandId, u64)>) {
        match s {
            Stream::User(slot) => (self.vols[slot].open_band, self.vols[slot].last_band),
            Stream::Gc(k) => (self.bands.gc_open[k], self.bands.gc_last[k]),
        }
    }

    fn stream_band_mut(&mut self, s: Stream) -> (&mut Option<BandId>, &mut Option<(BandId, u64)>) {
        match s {
            Stream::User(slot) => {
                let v = &mut self.vols[slot];
                (&mut v.open_band, &mut v.last_band)
            }
            Stream::Gc(k) => (&mut self.bands.gc_open[k], &mut self.bands.gc_last[k]),
        }
    }

    /// Every stream's open band, then every stream's last band.
    pub(super) fn streams_open(&self) -> impl Iterator<Item = BandId> + '_ {
        self.vols.iter().filter_map(|v| v.open_band).chain(self.bands.gc_open.iter().flatten().copied())
    }

    pub(super) fn streams_last(&self) -> impl Iterator<Item = (BandId, u64)> + '_ {
        self.vols.iter().filter_map(|v| v.last_band).chain(self.bands.gc_last.iter().flatten().copied())
    }

    /// Band `b`, the open band of stream `s`, is full: close it.
    pub(super) fn close_band(&mut self, b: BandId, s: Stream) {
        let band = &mut self.bands[b];
        band.to(BandState::Open, BandState::Full);
        band.closed_seq = self.seq;
        let last = Some((b, band.epoch));
        self.bands.closed_since_mark.push(b);
        let (open, prev) = self.stream_band_mut(s);
        *open = None;
        *prev = last;
    }
}

impl Engine {
    /// Close the open bands of the GC streams past the first, which the
    /// checkpoint does not keep (placement.rs): before a clean shutdown.
    pub(super) fn close_extra_streams(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        let extra: Vec<Stream> = (1..GC_STREAMS).map(Stream::Gc).collect();
        self.close_streams(inner, &extra)
    }

    /// Close every stream's open band (a placement change, placement.rs).
    pub(super) fn close_open_bands(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        let all: Vec<Stream> = (0..inner.vols.len()).map(Stream::User).chain((0..GC_STREAMS).map(Stream::Gc)).collect();
        self.close_streams(inner, &all)
    }

    fn close_streams(&self, inner: &mut Inner, streams: &[Stream]) -> Result<(), VolumeError> {
        // Segment writes into them are done first; zone finish is synchronous.
        self.drain_capacity(inner)?;
        for &s in streams {
            if let Some(b) = inner.stream_band(s).0 {
                let start = b.0 as u64 * inner.cfg.band_bytes;
                zoned::finish_band(&*self.capacity, inner.geo.zoned, start)?;
                // Closed short of its end, a conventional band's walk would
                // end at whatever an older generation left there, which
                // recovery could take for a damaged header once a later
                // band of the stream is durable (recovery/bands.rs): zeros
                // end it instead.
                let (written, usable) = (inner.bands[b].written, inner.band_usable());
                if !inner.geo.zoned && written + 1 < usable {
                    write_at(&*self.capacity, start + written * BS, &[0u8; BLOCK_BYTES])?;
                    inner.cap.dirty = true;
                }
                inner.close_band(b, s);
            }
        }
        Ok(())
    }

    /// The open band of a stream, opening a free one (after GC if short).
    pub(super) fn open_band(&self, inner: &mut Inner, s: Stream) -> Result<BandId, VolumeError> {
        let cur = inner.stream_band(s).0;
        if let (Some(b), true) = (cur, band_has_room(inner, s)) {
            return Ok(b);
        }
        // Zone finish and GC are synchronous on the capacity device.
        self.drain_capacity(inner)?;
        if let Some(b) = cur {
            let start = b.0 as u64 * inner.cfg.band_bytes;
            zoned::finish_band(&*self.capacity, inner.geo.zoned, start)?;
            inner.close_band(b, s);
        }
        if !s.is_gc() {
            // Bounded: a victim that frees no more than its relocation takes
            // cannot spin here; past the bound the caller sees NoSpace.
            let mut rounds = inner.bands.len();
            while inner.bands.free.len() <= inner.cfg.gc_free_bands_min && rounds > 0 {
                if !self.collect_one(inner)? {
                    break;
                }
                rounds -= 1;
            }
        }
        let b = inner.bands.free.pop_front().ok_or(VolumeError::NoSpace)?;
        let band = &mut inner.bands[b];
        assert_eq!(band.valid, 0);
        band.to(BandState::Free, BandState::Open);
        band.written = 0;
        band.tombstones = 0;
        inner.seq += 1;
        // The band this stream filled before, if it still holds what it
        // held then (GC may have reclaimed it since): it must read back as
        // far as it reaches now once this band's first segment is durable.
        let last = inner.stream_band(s).1;
        let prev = last
            .map(|(p, epoch)| (&inner.bands[p], epoch))
            .filter(|(p, epoch)| p.state.holds_all() && p.epoch == *epoch)
            .map_or((0, 0), |(p, epoch)| (epoch, p.written));
        let band = &mut inner.bands[b];
        band.epoch = inner.seq;
        band.prev = prev;
        band.born = u64::MAX;
        band.short = s == Stream::User(0) && inner.placement == BandPlacement::Lifetime;
        band.by_gc = s.is_gc();
        *inner.stream_band_mut(s).0 = Some(b);
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_band_goes_through_its_cycle_and_the_checkpoint_keeps_a_victim_full() {
        let mut bands = Bands::empty(1);
        let b = &mut bands[0];
        b.to(BandState::Free, BandState::Open);
        b.to(BandState::Open, BandState::Full);
        b.to(BandState::Full, BandState::Victim);
        assert!(b.state.holds_all());
        assert_eq!(BandState::from_media(b.state.on_media()), Some(BandState::Full));
        b.to(BandState::Victim, BandState::Free);
        assert_eq!(BandState::from_media(3), None);
    }

    #[test]
    #[should_panic(expected = "band state changes from the state it is in")]
    fn a_band_changes_only_from_the_state_it_is_in() {
        let mut bands = Bands::empty(1);
        bands[0].to(BandState::Full, BandState::Victim);
    }
}
