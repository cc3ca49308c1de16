//! Bands: the capacity device's space, cut into equal bands (zones on a
//! zoned device, zoned.rs), each written strictly sequentially by one
//! stream (a volume, or GC) from Free → Open → Full, and back to Free when
//! it is discarded.
//!
//! A band keeps no P2L in memory: its segments are self-describing, and GC
//! reads them (headers and data) from the band itself. That keeps the
//! engine's DRAM at the L2P's 4 bytes per volume block plus the small cache
//! tier's P2L.
//!
//! Owns, in private fields changed only here: per-band state (its place in
//! the cycle, valid count, write pointer, tombstone count, epoch,
//! generation, the band its stream filled before it, placement hints), the
//! free list, the quarantine, each stream's open band and the band it
//! filled last, and the bands closed since the last capacity mark. Other
//! modules read through getters and change state only through the
//! transitions below, each of which asserts what it needs and leaves:
//! - `open` (Free → Open, the free list's oldest), `append` (a segment at
//!   an Open band's pointer), `close` (Open → Full), `start_victim`
//!   (Full → Victim), `discard` (→ Free: the one way back to the free
//!   list, for GC and for salvage alike, `Engine::discard_band`);
//! - `add_valid` / `drop_valid` (a block mapped into a band, or moved out);
//! - recovery and the checkpoint build the state through `found_walk`,
//!   `found_segment`, `recovered` and `from_checkpoint`.
//!
//! Invariants (`Bands::check`, from `check_invariants`; the transitions
//! assert their part): a band is on the free list exactly when it is Free
//! and not quarantined, and a Free band holds nothing (no valid block, no
//! pointer, no tombstone); a band's valid blocks fit below its pointer, and
//! its pointer within the band; every Open band is exactly one stream's
//! open band, and every stream's open band is Open.

use super::l2p::Loc;
use super::zoned;
use super::{BandPlacement, BLOCK_BYTES, BS};
use super::{Engine, Inner, VolumeError};
use crate::layout::STREAM_GC;
use crate::persist::Writer;
use sluice_media::device::write_at;
use std::collections::VecDeque;

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

/// A stream's place in the bands: the band it writes into, and the band it
/// filled last with that band's epoch (the next band it opens names it,
/// `Band::prev`).
#[derive(Clone, Copy, Default)]
struct StreamBands {
    open: Option<BandId>,
    last: Option<(BandId, u64)>,
}

/// A stream's open band and the band it filled last, with that band's epoch.
pub(super) type StreamPlaces = (Option<BandId>, Option<(BandId, u64)>);

/// The capacity device's bands and the streams' places in them.
pub(super) struct Bands {
    list: Vec<Band>,
    /// Free bands, oldest freed first.
    free: VecDeque<BandId>,
    /// Compaction's streams, by slot (`Inner::user_stream`: one per
    /// volume at most).
    user: Vec<StreamBands>,
    /// GC's streams (placement.rs: one unless `BandPlacement::Lifetime`).
    gc: [StreamBands; GC_STREAMS],
    /// Bands a salvaging open found damaged, or recovery voided: never
    /// opened nor chosen by GC until salvage has emptied and discarded them.
    quarantine: Vec<BandId>,
    /// Bands closed since the last capacity mark: the next mark lists their
    /// final pointers too, or a segment written after one mark into a band
    /// closed before the next would be in no mark at all.
    closed_since_mark: Vec<BandId>,
}

/// One band's state as the checkpoint keeps it (docs/format.md).
pub(super) struct BandRecord {
    state: BandState,
    valid: u32,
    written: u64,
    closed_seq: u64,
    epoch: u64,
    prev: (u64, u64),
}

impl Bands {
    /// Every band free, for `streams` compaction streams.
    pub(super) fn empty(band_count: u64, streams: usize) -> Bands {
        Bands {
            list: (0..band_count).map(|_| Band::free()).collect(),
            free: (0..band_count as u32).map(BandId).collect(),
            user: vec![StreamBands::default(); streams],
            gc: [StreamBands::default(); GC_STREAMS],
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
    /// How many bands are free.
    pub(super) fn free_len(&self) -> usize {
        self.free.len()
    }
    pub(super) fn is_quarantined(&self, b: BandId) -> bool {
        self.quarantine.contains(&b)
    }

    /// A stream's open band and the band it filled last.
    pub(super) fn stream(&self, s: Stream) -> StreamPlaces {
        let sb = match s {
            Stream::User(slot) => self.user[slot],
            Stream::Gc(k) => self.gc[k],
        };
        (sb.open, sb.last)
    }

    fn stream_mut(&mut self, s: Stream) -> &mut StreamBands {
        match s {
            Stream::User(slot) => &mut self.user[slot],
            Stream::Gc(k) => &mut self.gc[k],
        }
    }

    /// Every stream's open band (compaction's, then GC's).
    pub(super) fn streams_open(&self) -> impl Iterator<Item = BandId> + '_ {
        self.user.iter().chain(&self.gc).filter_map(|s| s.open)
    }

    /// Every stream's last band (compaction's, then GC's).
    pub(super) fn streams_last(&self) -> impl Iterator<Item = (BandId, u64)> + '_ {
        self.user.iter().chain(&self.gc).filter_map(|s| s.last)
    }

    /// The bands closed since the last mark, taken by the next one.
    pub(super) fn take_closed_since_mark(&mut self) -> Vec<BandId> {
        std::mem::take(&mut self.closed_since_mark)
    }

    /// Free → Open: the oldest free band becomes stream `s`'s, with epoch
    /// `epoch` (a fresh sequence). It names the band the stream filled
    /// before if that still holds what it held then (GC may have
    /// reclaimed it since): it must read back as far as it reaches now
    /// once this band's first segment is durable. None if no band is free.
    pub(super) fn open(&mut self, s: Stream, epoch: u64, short: bool) -> Option<BandId> {
        assert!(self.stream(s).0.is_none(), "a stream opens a band only once it closed its last");
        let b = self.free.pop_front()?;
        let prev = self.stream(s).1.map(|(p, e)| (&self.list[p.index()], e));
        let prev = prev.filter(|(p, e)| p.state.holds_all() && p.epoch == *e).map_or((0, 0), |(p, e)| (e, p.written));
        let band = &mut self.list[b.index()];
        assert!(band.holds_nothing(), "band {b} is free but holds something");
        band.to(BandState::Free, BandState::Open);
        (band.epoch, band.prev, band.born, band.short, band.by_gc) = (epoch, prev, u64::MAX, short, s.is_gc());
        self.stream_mut(s).open = Some(b);
        Some(b)
    }

    /// A segment of `blocks` blocks (`tombstones` of its entries
    /// tombstones) written at open band `b`'s pointer, within the band's
    /// `usable` blocks; its data written by users at `born` (placement.rs:
    /// the band keeps its oldest). Returns where it starts in the band.
    pub(super) fn append(&mut self, b: BandId, blocks: u64, tombstones: u32, born: u64, usable: u64) -> u64 {
        let band = &mut self.list[b.index()];
        assert_eq!(band.state, BandState::Open, "segments go to open bands");
        let at = band.written;
        assert!(at + blocks <= usable, "band {b}: a segment of {blocks} blocks at {at} of {usable}");
        band.written += blocks;
        band.tombstones = band.tombstones.saturating_add(tombstones);
        band.tomb_segments += u32::from(tombstones > 0);
        band.born = band.born.min(born);
        at
    }

    /// Open → Full: band `b`, stream `s`'s open band, is full (at
    /// sequence `seq`, for its age); it becomes the stream's last band.
    pub(super) fn close(&mut self, b: BandId, s: Stream, seq: u64) {
        assert_eq!(self.stream(s).0, Some(b), "band {b} is not the stream's open band");
        let band = &mut self.list[b.index()];
        band.to(BandState::Open, BandState::Full);
        band.closed_seq = seq;
        let last = Some((b, band.epoch));
        self.closed_since_mark.push(b);
        *self.stream_mut(s) = StreamBands { open: None, last };
    }

    /// Full → Victim: GC starts relocating what is current in band `b`.
    pub(super) fn start_victim(&mut self, b: BandId) {
        assert!(!self.is_quarantined(b), "GC chose quarantined band {b}");
        self.list[b.index()].to(BandState::Full, BandState::Victim);
    }

    /// → Free (`Engine::discard_band`, the only caller): band `b` holds
    /// nothing current any more. A GC victim, or a quarantined band
    /// (Full, or Free if nothing in it won in recovery), which leaves the
    /// quarantine. Its generation moves on (reads that looked a block up
    /// in it before must tell its data may be gone) and it goes to the
    /// back of the free list, holding nothing.
    pub(super) fn discard(&mut self, b: BandId) {
        let quarantined = self.is_quarantined(b);
        let band = &mut self.list[b.index()];
        assert_eq!(band.valid, 0, "band {b} discarded with {} valid blocks", band.valid);
        match (band.state, quarantined) {
            (BandState::Victim, false) => band.to(BandState::Victim, BandState::Free),
            (BandState::Full, true) => band.to(BandState::Full, BandState::Free),
            (BandState::Free, true) => {}
            (state, _) => panic!("band {b} discarded while {state:?} (quarantined: {quarantined})"),
        }
        band.gen += 1;
        (band.written, band.tombstones, band.tomb_segments, band.epoch) = (0, 0, 0, 0);
        // (Not on the free list: it was not Free, or it was quarantined,
        // which took it off; `check` verifies the whole list.)
        self.quarantine.retain(|&q| q != b);
        self.free.push_back(b);
    }

    /// Bands `bs` out of reach until discarded (a salvaging open's damaged
    /// bands, the bands recovery voided): off the free list.
    pub(super) fn quarantine(&mut self, bs: impl IntoIterator<Item = BandId>) {
        for b in bs {
            if !self.quarantine.contains(&b) {
                self.quarantine.push(b);
            }
            self.free.retain(|&f| f != b);
        }
    }

    /// A block is now current in band `b` (a segment just written, a
    /// remap settled, or a winner recovery found).
    pub(super) fn add_valid(&mut self, b: BandId) {
        let band = &mut self.list[b.index()];
        assert!(band.state != BandState::Free && (band.valid as u64) < band.written, "band {b}: a block past it");
        band.valid += 1;
    }

    /// A block current in band `b` was overwritten, trimmed or moved.
    pub(super) fn drop_valid(&mut self, b: BandId) {
        let band = &mut self.list[b.index()];
        assert!(band.valid > 0, "band {b}: no valid block to drop");
        band.valid -= 1;
    }

    /// Recovery, step 1: band `b`'s walk ended at `written`, its segments
    /// of epoch `epoch` (0: none).
    pub(super) fn found_walk(&mut self, b: BandId, written: u64, epoch: u64) {
        let band = &mut self.list[b.index()];
        assert!(band.state == BandState::Free && band.valid == 0, "recovery walks bands first");
        (band.written, band.epoch) = (written, epoch);
    }

    /// Recovery: a segment of band `b` with sequence `seq` and
    /// `tombstones` tombstones was offered; the band is Full.
    pub(super) fn found_segment(&mut self, b: BandId, seq: u64, tombstones: u32) {
        let band = &mut self.list[b.index()];
        band.state = match band.state {
            BandState::Free | BandState::Full => BandState::Full,
            s => panic!("recovery found a segment of band {b} while {s:?}"),
        };
        band.closed_seq = band.closed_seq.max(seq);
        band.tombstones = band.tombstones.saturating_add(tombstones);
        band.tomb_segments += u32::from(tombstones > 0);
    }

    /// Recovery, step 5: a band none of whose entries won (`live[b]`
    /// false) is Free, holding nothing; the free list is every Free band
    /// in order (no stream has an open band). Returns the bands now Free
    /// whose walk found segments (`walked[b]` blocks): stale, to be
    /// discarded before reuse.
    pub(super) fn recovered(&mut self, live: &[bool], walked: &[u64]) -> Vec<u32> {
        assert_eq!(live.len(), self.list.len());
        for (b, band) in self.list.iter_mut().enumerate() {
            if !live[b] {
                assert_eq!(band.valid, 0, "band {b}: valid blocks but no entry won");
                band.state = BandState::Free;
            }
        }
        let stale = (0..self.list.len() as u32)
            .filter(|&b| self.list[b as usize].state == BandState::Free && walked[b as usize] > 0)
            .collect();
        for band in self.list.iter_mut().filter(|b| b.state == BandState::Free) {
            (band.written, band.tombstones, band.tomb_segments) = (0, 0, 0);
        }
        self.free = (0..self.list.len() as u32)
            .map(BandId)
            .filter(|&b| self.list[b.index()].state == BandState::Free)
            .collect();
        assert!(self.streams_open().next().is_none(), "recovery opens no band");
        stale
    }

    /// Each stream's last band (recovery names them once its repairs are
    /// done, `LastBands::apply`).
    pub(super) fn set_lasts(&mut self, user: Vec<Option<(BandId, u64)>>, gc: [Option<(BandId, u64)>; GC_STREAMS]) {
        assert_eq!(user.len(), self.user.len());
        for (s, l) in self.user.iter_mut().zip(user) {
            s.last = l;
        }
        for (s, l) in self.gc.iter_mut().zip(gc) {
            s.last = l;
        }
    }

    /// The checkpoint's bands: the list, the free list, each stream's open
    /// and last band (GC's first stream only: shutdown closes the others).
    pub(super) fn from_checkpoint(
        records: Vec<BandRecord>,
        free: VecDeque<BandId>,
        user: Vec<StreamPlaces>,
        gc: StreamPlaces,
    ) -> Bands {
        let list = records
            .into_iter()
            .map(|r| {
                let mut band = Band::free();
                (band.state, band.valid, band.closed_seq, band.epoch, band.prev) =
                    (r.state, r.valid, r.closed_seq, r.epoch, r.prev);
                if r.state != BandState::Free {
                    // Not in the checkpoint: GC reads such a band to find its tombstones.
                    band.written = r.written;
                    band.tombstones = if r.written == 0 { 0 } else { TOMBSTONES_UNKNOWN };
                }
                band
            })
            .collect();
        let stream = |(open, last)| StreamBands { open, last };
        let mut gcs = [StreamBands::default(); GC_STREAMS];
        gcs[0] = stream(gc);
        Bands {
            list,
            free,
            user: user.into_iter().map(stream).collect(),
            gc: gcs,
            quarantine: Vec::new(),
            closed_since_mark: Vec::new(),
        }
    }

    /// The checkpoint's part of the bands after the streams' (docs/format.md).
    pub(super) fn encode(&self, w: &mut Writer) {
        w.u32(self.list.len() as u32);
        for b in &self.list {
            w.u8(b.state.on_media());
            w.u32(b.valid);
            w.u64(b.written);
            w.u64(b.closed_seq);
            w.u64(b.epoch);
            w.u64(b.prev.0);
            w.u64(b.prev.1);
        }
        w.u32(self.free.len() as u32);
        self.free.iter().for_each(|&b| w.u32(b.0));
    }

    /// Lay the free list out from the device's end down (a test of the
    /// map's widest entries: l2p).
    #[cfg(test)]
    pub(super) fn free_from_the_end(&mut self) {
        self.free = self.free.iter().rev().copied().collect();
    }

    /// The invariants of the module doc, over every band; `holding[b]`:
    /// valid blocks the maps point at in band b.
    pub(super) fn check(&self, holding: &[u32]) {
        let mut on_free_list = vec![0usize; self.list.len()];
        self.free.iter().for_each(|f| on_free_list[f.index()] += 1);
        let mut open_in = vec![0usize; self.list.len()];
        self.streams_open().for_each(|b| open_in[b.index()] += 1);
        for (i, band) in self.list.iter().enumerate() {
            let b = BandId(i as u32);
            let listed = on_free_list[i];
            let free = band.state == BandState::Free && !self.is_quarantined(b);
            assert_eq!(listed, free as usize, "band {b} ({:?}) on the free list {listed} times", band.state);
            if band.state == BandState::Free {
                assert!(band.holds_nothing() || self.is_quarantined(b), "free band {b} holds something");
            }
            assert_eq!(band.valid, holding[i], "band {b} valid count");
            assert!(band.valid as u64 <= band.written, "band {b}: more valid blocks than written");
            let owners = open_in[i];
            assert_eq!(
                owners,
                (band.state == BandState::Open) as usize,
                "band {b} ({:?}) is open in {owners} streams",
                band.state
            );
        }
    }
}

impl BandRecord {
    /// One band from the checkpoint (`Bands::encode`).
    pub(super) fn decode(r: &mut super::checkpoint::RegionReader) -> Result<BandRecord, super::EngineError> {
        let bad = |at| super::EngineError::Checkpoint(crate::persist::CheckpointError(at));
        let state = BandState::from_media(r.u8()?).ok_or(bad(r.at()))?;
        let (valid, written, closed_seq, epoch) = (r.u32()?, r.u64()?, r.u64()?, r.u64()?);
        let prev = (r.u64()?, r.u64()?);
        Ok(BandRecord { state, valid, written, closed_seq, epoch, prev })
    }
}

impl std::ops::Index<BandId> for Bands {
    type Output = Band;
    fn index(&self, b: BandId) -> &Band {
        &self.list[b.index()]
    }
}

impl std::ops::Index<usize> for Bands {
    type Output = Band;
    fn index(&self, b: usize) -> &Band {
        &self.list[b]
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
    /// A free band: nothing in it.
    fn free() -> Band {
        Band {
            state: BandState::Free,
            valid: 0,
            written: 0,
            closed_seq: 0,
            gen: 0,
            tombstones: 0,
            tomb_segments: 0,
            epoch: 0,
            prev: (0, 0),
            born: 0,
            short: false,
            by_gc: false,
        }
    }

    /// Move from state `from` (asserted) to `to`.
    fn to(&mut self, from: BandState, to: BandState) {
        assert_eq!(self.state, from, "band state changes from the state it is in");
        self.state = to;
    }

    fn holds_nothing(&self) -> bool {
        self.valid == 0 && self.written == 0 && self.tombstones == 0
    }

    pub(super) fn state(&self) -> BandState {
        self.state
    }
    /// Blocks the maps point at in the band.
    pub(super) fn valid(&self) -> u32 {
        self.valid
    }
    /// Blocks written so far (the write pointer, relative).
    pub(super) fn written(&self) -> u64 {
        self.written
    }
    /// Engine write sequence when the band was closed (for its age).
    pub(super) fn closed_seq(&self) -> u64 {
        self.closed_seq
    }
    /// Tombstone entries written into the band since it was last free
    /// (`TOMBSTONES_UNKNOWN` after a clean open).
    pub(super) fn tombstones(&self) -> u32 {
        self.tombstones
    }

    /// Segments that carried tombstones into the band (`tomb_segments`).
    pub(super) fn tomb_segments(&self) -> u32 {
        self.tomb_segments
    }
    pub(super) fn gen(&self) -> u64 {
        self.gen
    }
    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }
    /// The band its stream filled before it: (epoch, blocks it held).
    pub(super) fn prev(&self) -> (u64, u64) {
        self.prev
    }
    pub(super) fn born(&self) -> u64 {
        self.born
    }
    pub(super) fn short(&self) -> bool {
        self.short
    }
    pub(super) fn by_gc(&self) -> bool {
        self.by_gc
    }
}

/// A band keeps no P2L in memory: its segments are self-describing, and GC
/// reads them (headers and data) from the band itself. That keeps the
/// engine's DRAM at the L2P's 4 bytes per volume block plus the small cache
/// tier's P2L.
pub(super) struct Band {
    state: BandState,
    valid: u32,
    /// Blocks written so far (write pointer, relative).
    written: u64,
    /// Engine write sequence when the band was closed (for age).
    closed_seq: u64,
    /// Tombstone entries written into the band since it was last free;
    /// `TOMBSTONES_UNKNOWN` after a clean open (the checkpoint does not keep
    /// it). With `valid` 0 and none, GC has nothing to look at in the band.
    tombstones: u32,
    /// Segments written into the band since it was last free that carried
    /// tombstones (known with `tombstones`): what carrying them costs GC is
    /// at most one segment per volume of these (`Inner::tombstone_carry`).
    tomb_segments: u32,
    /// Bumped (in memory) when the band's blocks are discarded, so a read
    /// that looked a block up before GC moved it and read it after can tell
    /// its data may be gone (`Inner::generation`).
    gen: u64,
    /// Sequence when the band was last opened: every segment in it carries
    /// it, so recovery tells this generation's segments from a previous one's.
    epoch: u64,
    /// The band filled just before this one by its stream: (its epoch, the
    /// blocks it held), (0, 0) if none; in every segment header
    /// (`Header::prev_epoch`, `prev_end`), so recovery can tell that band's
    /// damaged tail from a torn one.
    prev: (u64, u64),
    /// Placement hints (placement.rs), in memory only: when the data in the
    /// band was written by users (user blocks written before: for a
    /// compaction band, when it was opened; for a GC band, the oldest
    /// victim's), whether the short-lived user stream filled it, and
    /// whether GC did.
    born: u64,
    short: bool,
    by_gc: bool,
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
    pub(super) fn stream_band(&self, s: Stream) -> StreamPlaces {
        self.bands.stream(s)
    }

    /// The band holding capacity location `loc`, if it is one.
    pub(super) fn band_of(&self, loc: Loc) -> Option<BandId> {
        loc.capacity_block().map(|pb| BandId((pb / self.blocks_per_band()) as u32))
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
                    inner.cap.wrote();
                }
                inner.bands.close(b, s, inner.seq.last());
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
            inner.bands.close(b, s, inner.seq.last());
        }
        if !s.is_gc() {
            // Bounded: a victim that frees no more than its relocation takes
            // cannot spin here; past the bound the caller sees NoSpace.
            let mut rounds = inner.bands.len();
            while inner.bands.free_len() <= inner.cfg.gc_free_bands_min && rounds > 0 {
                if !self.collect_one(inner)? {
                    break;
                }
                rounds -= 1;
            }
        }
        if inner.bands.free_len() == 0 {
            return Err(VolumeError::NoSpace);
        }
        let short = s == Stream::User(0) && inner.placement == BandPlacement::Lifetime;
        let epoch = inner.seq.next();
        Ok(inner.bands.open(s, epoch, short).expect("a band is free"))
    }

    /// Discard band `b` — a GC victim relocated, or a quarantined band
    /// salvage emptied — and free it: the one way a band goes back to the
    /// free list. Reads outside the lock that still hold a place in it must
    /// see that its data may be gone (its generation and the reuse counter
    /// move first), and the discard is durable only after the next
    /// capacity flush, which the next mark must follow.
    pub(super) fn discard_band(&self, inner: &mut Inner, b: BandId) -> Result<(), VolumeError> {
        assert_eq!(inner.bands[b].valid, 0, "band {b} discarded holding current blocks");
        inner.reuses.fetch_add(1, std::sync::atomic::Ordering::Release);
        // The device first: should it fail, the band is still what it was
        // (a victim GC's cursor names, or quarantined). Locked reads check
        // the generation again under the lock, which this holds throughout.
        let len = inner.cfg.band_bytes;
        zoned::reclaim_band(&*self.capacity, inner.geo.zoned, b.0 as u64 * len, len)?;
        inner.cap.wrote();
        inner.bands.discard(b);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_band_goes_through_its_cycle_and_the_checkpoint_keeps_a_victim_full() {
        let mut bands = Bands::empty(1, 1);
        let s = Stream::User(0);
        let b = bands.open(s, 7, false).expect("a free band");
        assert_eq!(bands.append(b, 4, 1, 0, 32), 0);
        bands.add_valid(b);
        bands.close(b, s, 9);
        bands.start_victim(b);
        assert!(bands[b].state().holds_all());
        assert_eq!(BandState::from_media(bands[b].state().on_media()), Some(BandState::Full));
        bands.drop_valid(b);
        bands.discard(b);
        assert_eq!((bands[b].state(), bands[b].written(), bands[b].gen()), (BandState::Free, 0, 1));
        assert_eq!(bands.free_len(), 1);
        bands.check(&[0]);
        assert_eq!(BandState::from_media(3), None);
    }

    #[test]
    #[should_panic(expected = "band state changes from the state it is in")]
    fn a_band_changes_only_from_the_state_it_is_in() {
        let mut bands = Bands::empty(1, 1);
        bands.start_victim(BandId(0));
    }

    #[test]
    #[should_panic(expected = "discarded with 1 valid blocks")]
    fn a_band_holding_current_blocks_is_never_discarded() {
        let mut bands = Bands::empty(1, 1);
        let s = Stream::User(0);
        let b = bands.open(s, 7, false).expect("a free band");
        bands.append(b, 4, 0, 0, 32);
        bands.add_valid(b);
        bands.close(b, s, 9);
        bands.start_victim(b);
        bands.discard(b);
    }
}
