//! The L2P: for every block of one volume, where its current copy lives
//! (`Loc`) and the CRC32C it was logged with (what every read checks).
//!
//! `Loc` is the logical entry, 8 bytes: nowhere (reads zeros), a cache
//! block, or a capacity block anywhere on a device of up to
//! `CAPACITY_BYTES_MAX`. The stored entry is narrower where the devices
//! allow it: **4 bytes** (`Width::Narrow`) while every cache and capacity
//! block of the engine has its own number below 2^32 — 0 is nowhere, then
//! the cache blocks, then the capacity blocks, so a 15.36 TB capacity
//! device behind an 800 GB cache still fits — and 8 bytes (`Width::Wide`)
//! beyond. The width depends only on the two devices' sizes, so `create`,
//! the checkpoint and recovery agree on it without storing it anywhere but
//! in the checkpoint (where it is checked).
//!
//! Invariants: an entry is set only through `set` (new copy, new CRC) or
//! `relocate` (same data moved: the CRC stays); a narrow map never holds a
//! `Loc` it cannot encode (asserted: the width was chosen for these devices).
//! The engine's own invariant — every mapped entry's place names it back —
//! is checked by `Inner::check_invariants`.

mod pager;
pub(super) mod region;

use crate::volume::VolumeError;
use pager::Pager;
pub(super) use pager::{PageStore, PAGE_ENTRIES};
use sluice_media::memory::huge_page_vec;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// The largest capacity device an engine addresses (128 TiB: a 122.88 TB
/// QLC drive fits). Past it `create` refuses; the bound is the tested range
/// (compaction and GC at the top of a 64 TiB and of a 128 TiB device), not
/// the entry's (63 bits).
pub const CAPACITY_BYTES_MAX: u64 = 128 << 40;

/// Where a block lives: nowhere (reads zeros), a cache block, or a
/// capacity block (each a device block index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Loc(u64);

const CAP_BIT: u64 = 1 << 63;

impl Loc {
    pub(super) const NONE: Loc = Loc(0);

    pub(super) fn cache(block: u64) -> Loc {
        assert!(block < CAP_BIT - 1, "cache block {block} out of range");
        Loc(block + 1)
    }

    pub(super) fn capacity(block: u64) -> Loc {
        assert!(block < CAP_BIT, "capacity block {block} out of range");
        Loc(block | CAP_BIT)
    }

    pub(super) fn is_none(self) -> bool {
        self.0 == 0
    }

    pub(super) fn cache_block(self) -> Option<u64> {
        (self.0 != 0 && self.0 & CAP_BIT == 0).then(|| self.0 - 1)
    }

    pub(super) fn capacity_block(self) -> Option<u64> {
        (self.0 & CAP_BIT != 0).then_some(self.0 & !CAP_BIT)
    }
}

/// How wide the stored entries are (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Width {
    /// 4 bytes: 0 nowhere, 1..=C cache block + 1, C+1.. capacity block + C + 1
    /// (C = the cache device's blocks).
    Narrow { cache_blocks: u64 },
    /// 8 bytes: `Loc` itself.
    Wide,
}

impl Width {
    /// The width for an engine on a cache device of `cache_blocks` blocks
    /// and a capacity device of `capacity_blocks`.
    pub(super) fn for_devices(cache_blocks: u64, capacity_blocks: u64) -> Width {
        if cache_blocks + capacity_blocks < u32::MAX as u64 {
            Width::Narrow { cache_blocks }
        } else {
            Width::Wide
        }
    }

    /// Bytes per stored entry.
    pub(super) fn bytes(self) -> u64 {
        match self {
            Width::Narrow { .. } => 4,
            Width::Wide => 8,
        }
    }

    fn encode(self, l: Loc) -> u64 {
        match self {
            Width::Wide => l.0,
            Width::Narrow { cache_blocks } => {
                let raw = match (l.cache_block(), l.capacity_block()) {
                    (Some(b), _) => {
                        assert!(b < cache_blocks, "cache block {b} past the device");
                        b + 1
                    }
                    (_, Some(b)) => b + cache_blocks + 1,
                    _ => 0,
                };
                assert!(raw <= u32::MAX as u64, "{l:?} does not fit a narrow L2P");
                raw
            }
        }
    }

    fn decode(self, raw: u64) -> Loc {
        match self {
            Width::Wide => Loc(raw),
            Width::Narrow { cache_blocks } => match raw {
                0 => Loc::NONE,
                r if r <= cache_blocks => Loc::cache(r - 1),
                r => Loc::capacity(r - cache_blocks - 1),
            },
        }
    }
}

enum Entries {
    /// Every entry in DRAM, shared with reads that run without the engine
    /// lock (`Resident`).
    Resident(Arc<Resident>),
    /// Pages within a DRAM budget, the rest on the cache device (pager.rs).
    Paged(RefCell<Pager>),
}

/// A map held whole in DRAM: the stored entries and their CRCs, as atomics
/// so that a read may look at them without the engine lock while a writer
/// (holding it) changes them. Entries and CRCs are stored separately: a
/// read racing a change may see a place with the other copy's CRC, which
/// fails its check and sends it to the locked path, never to wrong data
/// (read.rs). Written under the engine lock only.
pub(super) struct Resident {
    width: Width,
    raw: Raw,
    crcs: Box<[AtomicU32]>,
}

enum Raw {
    Narrow(Box<[AtomicU32]>),
    Wide(Box<[AtomicU64]>),
}

// The atomics are stored where plain integers were allocated (huge pages).
const _: () = assert!(std::mem::align_of::<AtomicU64>() == std::mem::align_of::<u64>());
const _: () = assert!(std::mem::align_of::<AtomicU32>() == std::mem::align_of::<u32>());

/// `n` zeroed 32-bit atomics on huge pages where the OS has them.
fn atomics32(n: usize) -> Box<[AtomicU32]> {
    let b = huge_page_vec(n, 0u32).into_boxed_slice();
    // SAFETY: AtomicU32 has the size, alignment and bit validity of u32.
    unsafe { Box::from_raw(Box::into_raw(b) as *mut [AtomicU32]) }
}

/// `n` zeroed 64-bit atomics on huge pages where the OS has them.
fn atomics64(n: usize) -> Box<[AtomicU64]> {
    let b = huge_page_vec(n, 0u64).into_boxed_slice();
    // SAFETY: AtomicU64 has the size and bit validity of u64, and (asserted
    // above) its alignment.
    unsafe { Box::from_raw(Box::into_raw(b) as *mut [AtomicU64]) }
}

impl Resident {
    fn raw(&self, lba: usize, order: Ordering) -> u64 {
        match &self.raw {
            Raw::Narrow(v) => v[lba].load(order) as u64,
            Raw::Wide(v) => v[lba].load(order),
        }
    }

    /// Bring block `lba`'s entry and CRC into this core's cache (a relaxed
    /// load whose value is dropped): a writer does it for its blocks before
    /// it takes the engine lock to publish them, so that the section under
    /// the lock does not wait for those misses (writers.rs).
    pub(super) fn warm(&self, lba: usize) {
        if lba < self.crcs.len() {
            std::hint::black_box((self.raw(lba, Ordering::Relaxed), self.crcs[lba].load(Ordering::Relaxed)));
        }
    }

    /// Append the places and CRCs of the entries `range` to `locs`, `crcs`,
    /// without the engine lock: each entry as some writer left it, its
    /// place loaded before its CRC (acquire: a place is published only
    /// once the data it names is written).
    pub(super) fn load(&self, range: std::ops::Range<usize>, locs: &mut Vec<Loc>, crcs: &mut Vec<u32>) {
        for lba in range {
            locs.push(self.width.decode(self.raw(lba, Ordering::Acquire)));
            crcs.push(self.crcs[lba].load(Ordering::Acquire));
        }
    }
}

/// The tag an unmapped entry's CRC slot keeps: the low 32 bits of its
/// newest tombstone's sequence, never 0 (0 means not known). Compaction
/// and GC then carry only that tombstone forward and drop older ones: an
/// LBA written and trimmed again and again left a live tombstone per trim,
/// every one carried while the LBA stayed unmapped, until the log and the
/// bands held nothing else (`sluice sim --swarm` seeds 170, 300, 530, 1066
/// and 1980 ended with no space). A tag shared by two sequences 2^32 apart
/// only keeps an older tombstone live, which is harmless.
pub(super) fn tombstone_tag(seq: u64) -> u32 {
    (seq as u32).max(1)
}

/// One volume's map: an entry and a CRC per block, all in DRAM or paged.
///
/// Every access returns a `Result`: a paged map may fault a page in from
/// the cache device (or write one back to make room), which can fail, and
/// a page damaged at rest is reported, never used. A resident map never
/// fails.
pub(super) struct L2p {
    width: Width,
    len: usize,
    entries: Entries,
}

type MapResult<T> = Result<T, VolumeError>;

impl L2p {
    /// `blocks` entries, all nowhere, in DRAM (on huge pages where the OS
    /// has them).
    pub(super) fn new(blocks: usize, width: Width) -> L2p {
        let raw = match width {
            Width::Narrow { .. } => Raw::Narrow(atomics32(blocks)),
            Width::Wide => Raw::Wide(atomics64(blocks)),
        };
        let resident = Resident { width, raw, crcs: atomics32(blocks) };
        L2p { width, len: blocks, entries: Entries::Resident(Arc::new(resident)) }
    }

    /// `blocks` entries, all nowhere, paged through `store`.
    pub(super) fn paged(blocks: usize, width: Width, store: PageStore) -> L2p {
        let pager = Pager::new(store, width.bytes() as usize, blocks.div_ceil(PAGE_ENTRIES));
        L2p { width, len: blocks, entries: Entries::Paged(RefCell::new(pager)) }
    }

    /// Bytes a paged map of `blocks` entries of `width` takes on the cache
    /// device (whole pages).
    pub(super) fn region_bytes(blocks: u64, width: Width) -> u64 {
        blocks.div_ceil(PAGE_ENTRIES as u64) * Pager::page_bytes(width.bytes() as usize) as u64
    }

    /// DRAM one page takes.
    pub(super) fn page_bytes(width: Width) -> usize {
        Pager::page_bytes(width.bytes() as usize)
    }

    /// The map, shared with lock-free reads, unless it is paged.
    pub(super) fn resident(&self) -> Option<Arc<Resident>> {
        match &self.entries {
            Entries::Resident(r) => Some(r.clone()),
            Entries::Paged(_) => None,
        }
    }

    pub(super) fn is_paged(&self) -> bool {
        matches!(self.entries, Entries::Paged(_))
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn width(&self) -> Width {
        self.width
    }

    pub(super) fn get(&self, lba: usize) -> MapResult<Loc> {
        Ok(self.entry(lba)?.0)
    }

    /// The block's place and the CRC32C its current copy was logged with.
    pub(super) fn entry(&self, lba: usize) -> MapResult<(Loc, u32)> {
        let (raw, crc) = match &self.entries {
            Entries::Resident(r) => (r.raw(lba, Ordering::Relaxed), r.crcs[lba].load(Ordering::Relaxed)),
            Entries::Paged(p) => p.borrow_mut().get(page_of(lba), lba % PAGE_ENTRIES)?,
        };
        Ok((self.width.decode(raw), crc))
    }

    /// `get`, or None for an LBA past the volume (one read from the media).
    pub(super) fn try_get(&self, lba: u64) -> MapResult<Option<Loc>> {
        if lba >= self.len as u64 {
            return Ok(None);
        }
        self.get(lba as usize).map(Some)
    }

    /// The CRC32C the block's current copy was logged with.
    pub(super) fn crc(&self, lba: usize) -> MapResult<u32> {
        Ok(self.entry(lba)?.1)
    }

    /// A new copy of the block (or `Loc::NONE` and 0: none).
    pub(super) fn set(&mut self, lba: usize, loc: Loc, crc: u32) -> MapResult<()> {
        self.put(lba, self.width.encode(loc), Some(crc))
    }

    /// Unmap block `lba`, whose newest tombstone (the one just logged, or
    /// the one a replay found winning) has sequence `seq`: the entry's CRC
    /// slot keeps that sequence's tag (`tombstone_tag`).
    pub(super) fn unmap(&mut self, lba: usize, seq: u64) -> MapResult<()> {
        self.set(lba, Loc::NONE, tombstone_tag(seq))
    }

    /// Whether a tombstone of block `lba` logged (or last moved) under
    /// sequence `seq` is live: the block is unmapped and this is its newest
    /// tombstone, or which one is newest is not known (tag 0: an image
    /// from before tags, or an in-place volume). False past the volume.
    pub(super) fn tombstone_live(&self, lba: u64, seq: u64) -> MapResult<bool> {
        if lba >= self.len as u64 {
            return Ok(false);
        }
        let (loc, tag) = self.entry(lba as usize)?;
        Ok(loc.is_none() && (tag == 0 || tag == tombstone_tag(seq)))
    }

    /// Live tombstone of unmapped block `lba` moved by compaction or GC
    /// under sequence `seq`: the copy moved is now the newest.
    pub(super) fn retag(&mut self, lba: u64, seq: u64) -> MapResult<()> {
        match self.try_get(lba)? {
            Some(l) if l.is_none() => self.unmap(lba as usize, seq),
            _ => Ok(()),
        }
    }

    /// The same data moved elsewhere: its CRC stays.
    pub(super) fn relocate(&mut self, lba: usize, to: Loc) -> MapResult<()> {
        self.put(lba, self.width.encode(to), None)
    }

    /// Append the places and CRCs of the entries `range` to `locs`, `crcs`.
    pub(super) fn load(
        &self,
        range: std::ops::Range<usize>,
        locs: &mut Vec<Loc>,
        crcs: &mut Vec<u32>,
    ) -> MapResult<()> {
        match &self.entries {
            Entries::Resident(r) => r.load(range, locs, crcs),
            Entries::Paged(_) => {
                for lba in range {
                    let (l, c) = self.entry(lba)?;
                    locs.push(l);
                    crcs.push(c);
                }
            }
        }
        Ok(())
    }

    /// Windows of at most `PAGE_ENTRIES` LBAs, in order, outside which
    /// every entry is "nowhere": every page of a paged map that was ever
    /// written or is resident (a 64 TiB map is not walked page by page, let
    /// alone entry by entry); every `PAGE_ENTRIES` entries of a map in DRAM.
    pub(super) fn windows(&self) -> Windows {
        match &self.entries {
            Entries::Paged(p) => {
                let p = p.borrow();
                let pages: Vec<u64> = (0..self.len.div_ceil(PAGE_ENTRIES) as u64).filter(|&g| p.may_hold(g)).collect();
                Windows { len: self.len, at: 0, pages: Some(pages.into_iter()) }
            }
            _ => Windows { len: self.len, at: 0, pages: None },
        }
    }

    /// The mapped entries (place not "nowhere") of `window`, with their
    /// LBAs and CRCs, in order: a page faulted in once, then scanned.
    pub(super) fn mapped(&self, window: std::ops::Range<usize>) -> MapResult<Vec<(usize, Loc, u32)>> {
        let mut out = Vec::new();
        match &self.entries {
            Entries::Resident(r) => out.extend(window.filter_map(|lba| {
                let raw = r.raw(lba, Ordering::Relaxed);
                (raw != 0).then(|| (lba, self.width.decode(raw), r.crcs[lba].load(Ordering::Relaxed)))
            })),
            Entries::Paged(p) => {
                let page = page_of(window.start);
                let first = page as usize * PAGE_ENTRIES;
                for (i, raw, crc) in p.borrow_mut().mapped(page)? {
                    let lba = first + i;
                    if window.contains(&lba) {
                        out.push((lba, self.width.decode(raw), crc));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every mapped entry with its LBA and CRC, in order (`windows`, `mapped`).
    pub(super) fn for_each(&self, mut f: impl FnMut(usize, Loc, u32)) -> MapResult<()> {
        for w in self.windows() {
            for (lba, loc, crc) in self.mapped(w)? {
                f(lba, loc, crc);
            }
        }
        Ok(())
    }

    /// The stored form of entry `lba` of a resident map (what the
    /// checkpoint keeps).
    pub(super) fn raw(&self, lba: usize) -> u64 {
        match &self.entries {
            Entries::Resident(r) => r.raw(lba, Ordering::Relaxed),
            Entries::Paged(_) => unreachable!("a paged map's checkpoint is its pages"),
        }
    }

    /// Set entry `lba` of a resident map from its stored form and its CRC
    /// (the checkpoint's decoder). Refuses a stored form this width cannot
    /// hold.
    pub(super) fn set_stored(&mut self, lba: usize, raw: u64, crc: u32) -> Result<(), ()> {
        if let Width::Narrow { .. } = self.width {
            if raw > u32::MAX as u64 {
                return Err(());
            }
        }
        self.put(lba, raw, Some(crc)).map_err(|_| ())
    }

    fn put(&mut self, lba: usize, raw: u64, crc: Option<u32>) -> MapResult<()> {
        match &mut self.entries {
            Entries::Resident(r) => {
                // The CRC first: a lock-free read that sees the new place
                // most likely sees its CRC too (and if not, its check fails
                // and it reads again under the lock).
                if let Some(c) = crc {
                    r.crcs[lba].store(c, Ordering::Release);
                }
                match &r.raw {
                    Raw::Narrow(v) => v[lba].store(raw as u32, Ordering::Release),
                    Raw::Wide(v) => v[lba].store(raw, Ordering::Release),
                }
                Ok(())
            }
            Entries::Paged(p) => p.get_mut().set(page_of(lba), lba % PAGE_ENTRIES, raw, crc),
        }
    }

    /// A paged map: write every dirty page to the cache device's map
    /// region (the caller flushes the device). Nothing for a map in DRAM.
    pub(super) fn write_pages(&mut self) -> MapResult<()> {
        match &mut self.entries {
            Entries::Paged(p) => p.get_mut().write_all(),
            _ => Ok(()),
        }
    }

    /// What a checkpoint keeps of a paged map (after `write_pages`): per
    /// page whether it was written to the region (a bit per page), and its
    /// CRC. None for a map in DRAM.
    pub(super) fn media_pages(&self) -> Option<(Vec<u64>, Vec<u32>)> {
        match &self.entries {
            Entries::Paged(p) => {
                let p = p.borrow();
                let (on_media, crcs) = p.media_state();
                Some((on_media.to_vec(), crcs.to_vec()))
            }
            _ => None,
        }
    }

    /// A paged map opened from a checkpoint: its pages are in the region as
    /// the checkpoint describes them.
    pub(super) fn adopt_pages(&mut self, on_media: Vec<u64>, crcs: Vec<u32>) -> Result<(), ()> {
        match &mut self.entries {
            Entries::Paged(p) => p.get_mut().adopt(on_media, crcs),
            _ => Err(()),
        }
    }

    /// Pages faulted in and written back since open (0 for a resident map).
    pub(super) fn page_traffic(&self) -> (u64, u64) {
        match &self.entries {
            Entries::Paged(p) => {
                let p = p.borrow();
                (p.faults, p.writebacks)
            }
            _ => (0, 0),
        }
    }

    /// DRAM the map takes: entries and CRCs, or the pager's frames and tables.
    pub(super) fn bytes(&self) -> usize {
        match &self.entries {
            Entries::Paged(p) => p.borrow().bytes(),
            _ => self.len * (self.width.bytes() as usize + 4),
        }
    }
}

/// The windows `L2p::windows` walks.
pub(super) struct Windows {
    len: usize,
    /// Next window's start (maps in DRAM).
    at: usize,
    /// The pages left (paged maps).
    pages: Option<std::vec::IntoIter<u64>>,
}

impl Iterator for Windows {
    type Item = std::ops::Range<usize>;

    fn next(&mut self) -> Option<std::ops::Range<usize>> {
        let start = match &mut self.pages {
            Some(pages) => pages.next()? as usize * PAGE_ENTRIES,
            None if self.at < self.len => self.at,
            None => return None,
        };
        let end = (start + PAGE_ENTRIES).min(self.len);
        self.at = end;
        Some(start..end)
    }
}

fn page_of(lba: usize) -> u64 {
    (lba / PAGE_ENTRIES) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Engine, EngineConfig, VolumeSpec};
    use crate::testkit::pattern;
    use crate::volume::Volume;
    use sluice_media::rng::SplitMix64;
    use sluice_media::CrashDevice;
    use std::sync::Arc;

    /// Every block of `v` reads back as its version in `model` (0 = zeros).
    fn verify(e: &Arc<Engine>, model: &[u64]) {
        let v = e.volume("v").expect("volume");
        let mut got = vec![0u8; 4096];
        for (lba, &ver) in model.iter().enumerate() {
            v.read(lba as u64 * 4096, &mut got).expect("read");
            let want = if ver == 0 { vec![0u8; 4096] } else { pattern(0, lba as u64, ver) };
            assert!(got == want, "block {lba} does not read back as version {ver}");
        }
    }

    /// Defect: entries held 31-bit capacity block numbers, so compaction
    /// into a band past 8 TiB panicked. Here the free bands are handed out
    /// from the top of a (sparse) device down: compaction fills the
    /// top bands, GC reclaims some, and every block reads back — live,
    /// after a crash (recovery from the media) and after a clean shutdown
    /// (the checkpoint).
    #[test]
    fn compaction_and_gc_reach_the_top_of_a_64_tib_capacity_device() {
        top_of_the_device(64 << 40);
    }

    #[test]
    fn compaction_and_gc_reach_the_top_of_the_largest_capacity_device() {
        top_of_the_device(CAPACITY_BYTES_MAX);
    }

    fn top_of_the_device(capacity_bytes: u64) {
        let cfg = EngineConfig {
            chunk_bytes: 64 * 4096,
            band_bytes: 64 << 20,
            write_unit_bytes: 64 << 10,
            log_free_chunks_min: 2,
            gc_free_bands_min: 2,
            l2p_dram_bytes: 0,
            layout: Default::default(),
            attached: false,
            home_sums: true,
        };
        let cache = Arc::new(CrashDevice::new(8 * cfg.chunk_bytes, 4096));
        let capacity = Arc::new(CrashDevice::new(capacity_bytes, 4096));
        let specs = [VolumeSpec { name: "v".into(), size_bytes: 2048 * 4096 }];
        let e = Engine::create(cache.clone(), capacity.clone(), cfg.clone(), &specs).expect("create");
        let top_band = {
            let mut inner = e.lock();
            assert_eq!(inner.vols[0].l2p.width(), Width::Wide);
            inner.bands.free_from_the_end();
            inner.bands.len() as u64 - 1
        };
        let v = e.volume("v").expect("volume");
        let mut model = vec![0u64; 2048];
        let mut rng = SplitMix64(64);
        let top = (top_band * cfg.band_bytes / 4096)..((top_band + 1) * cfg.band_bytes / 4096);
        let old_limit = 1u64 << 31;
        let on_capacity = |e: &Arc<Engine>| -> Vec<u64> {
            let inner = e.lock();
            (0..2048).filter_map(|l| inner.vols[0].l2p.get(l).unwrap().capacity_block()).collect()
        };
        for version in 1..=40_000u64 {
            let lba = rng.below(2048);
            v.write(lba * 4096, &pattern(0, lba, version), false).expect("write");
            model[lba as usize] = version;
            if version == 8192 {
                assert!(on_capacity(&e).iter().any(|b| top.contains(b)), "no block compacted into the top band");
            }
            if version % 512 == 0 {
                e.collect_some(4096).expect("gc step");
            }
        }
        v.flush().expect("flush");
        let placed = on_capacity(&e);
        assert!(placed.len() > 1000 && placed.iter().all(|&b| b > old_limit), "blocks below 8 TiB");
        assert!(e.stats().bands_reclaimed > 0, "GC reclaimed no band");
        e.check_invariants();
        verify(&e, &model);
        // kill -9: dropped without a shutdown; recovery walks every band.
        drop(v);
        drop(e);
        let e = Engine::open(cache.clone(), capacity.clone()).expect("recover");
        assert!(e.recovered_in().is_some());
        e.check_invariants();
        verify(&e, &model);
        e.shutdown().expect("shutdown");
        drop(e);
        let e = Engine::open(cache, capacity).expect("open from the checkpoint");
        assert!(e.recovered_in().is_none());
        verify(&e, &model);
    }

    #[test]
    fn a_capacity_device_past_the_limit_is_refused_at_create() {
        let cache = Arc::new(CrashDevice::new(1 << 20, 4096));
        let capacity = Arc::new(CrashDevice::new(CAPACITY_BYTES_MAX + (1 << 30), 4096));
        let specs = [VolumeSpec { name: "v".into(), size_bytes: 1 << 20 }];
        let cfg = EngineConfig { band_bytes: 1 << 30, chunk_bytes: 64 << 10, ..EngineConfig::default() };
        match Engine::create(cache.clone(), capacity.clone(), cfg, &specs) {
            Err(crate::EngineError::CapacityTooLarge(b)) => assert_eq!(b, CAPACITY_BYTES_MAX + (1 << 30)),
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("created an engine on a device past the limit"),
        }
        assert!(cache.durable_equals_live() && capacity.unflushed_ops() == 0);
    }

    #[test]
    fn narrow_entries_hold_the_first_and_last_block_of_each_device() {
        let (cache, capacity) = (1000u64, u32::MAX as u64 - 1001);
        let w = Width::for_devices(cache, capacity);
        assert_eq!(w, Width::Narrow { cache_blocks: cache });
        let mut m = L2p::new(8, w);
        let locs = [Loc::NONE, Loc::cache(0), Loc::cache(cache - 1), Loc::capacity(0), Loc::capacity(capacity - 1)];
        for (i, &l) in locs.iter().enumerate() {
            m.set(i, l, i as u32 * 7).unwrap();
        }
        for (i, &l) in locs.iter().enumerate() {
            assert_eq!(m.entry(i).unwrap(), (l, i as u32 * 7));
        }
        // One more capacity block and the entries must be wide.
        assert_eq!(Width::for_devices(cache, capacity + 1), Width::Wide);
    }

    #[test]
    fn wide_entries_reach_the_top_of_the_largest_device() {
        let top = CAPACITY_BYTES_MAX / 4096 - 1;
        let mut m = L2p::new(2, Width::for_devices(1 << 20, top + 1));
        m.set(0, Loc::capacity(top), 1).unwrap();
        m.relocate(1, Loc::cache((1 << 20) - 1)).unwrap();
        assert_eq!(m.get(0).unwrap().capacity_block(), Some(top));
        assert_eq!(m.get(1).unwrap().cache_block(), Some((1 << 20) - 1));
        assert_eq!(m.bytes(), 2 * 12);
    }

    #[test]
    #[should_panic(expected = "does not fit a narrow L2P")]
    fn a_narrow_map_refuses_a_block_it_cannot_encode() {
        let mut m = L2p::new(1, Width::Narrow { cache_blocks: 10 });
        m.set(0, Loc::capacity(u32::MAX as u64), 0).unwrap();
    }

    /// A paged map over a memory device with room for 2 pages in DRAM.
    fn paged(blocks: usize, width: Width) -> (L2p, Arc<dyn sluice_media::BlockDevice>) {
        let dev: Arc<dyn sluice_media::BlockDevice> =
            Arc::new(sluice_media::MemoryDevice::new(L2p::region_bytes(blocks as u64, width), 4096));
        (L2p::paged(blocks, width, PageStore { dev: dev.clone(), base: 0, frames: 2 }), dev)
    }

    #[test]
    fn a_paged_map_reads_back_what_it_was_set_to_through_evictions() {
        for width in [Width::Narrow { cache_blocks: 1 << 20 }, Width::Wide] {
            let blocks = 10 * PAGE_ENTRIES + 7;
            let (mut m, _dev) = paged(blocks, width);
            let mut rng = SplitMix64(5);
            let mut model = std::collections::HashMap::new();
            for i in 0..5000u64 {
                let lba = rng.below(blocks as u64) as usize;
                let loc = if i % 3 == 0 { Loc::cache(i) } else { Loc::capacity(i * 7) };
                m.set(lba, loc, i as u32).unwrap();
                model.insert(lba, (loc, i as u32));
            }
            let moved = rng.below(blocks as u64) as usize;
            m.relocate(moved, Loc::capacity(99)).unwrap();
            model.entry(moved).or_insert((Loc::NONE, 0)).0 = Loc::capacity(99);
            for lba in 0..blocks {
                assert_eq!(m.entry(lba).unwrap(), model.get(&lba).copied().unwrap_or((Loc::NONE, 0)), "LBA {lba}");
            }
            let (faults, writebacks) = m.page_traffic();
            assert!(faults > 100 && writebacks > 100, "{faults} faults, {writebacks} write-backs");
            // Only pages ever used are walked, and DRAM stays at two pages plus the tables.
            assert_eq!(m.windows().count(), 11);
            assert!(m.bytes() <= 2 * L2p::page_bytes(width) + 11 * 4 + 8);
        }
    }

    /// A fault whose read fails leaves its frame empty: evicting that frame
    /// later must not unmap the page it held before from the frame that
    /// holds it by then (that page's newer entries would be lost to its
    /// older copy in the region). Random sets and reads, a page read
    /// failing now and then, checked against a model.
    #[test]
    fn a_failed_page_read_leaves_no_frame_claiming_a_page() {
        let width = Width::Wide;
        let blocks = 16 * PAGE_ENTRIES;
        let dev = Arc::new(CrashDevice::new(L2p::region_bytes(blocks as u64, width), 4096));
        let store = PageStore { dev: dev.clone(), base: 0, frames: 4 };
        let mut m = L2p::paged(blocks, width, store);
        let mut model = std::collections::HashMap::new();
        let mut rng = SplitMix64(9);
        let mut failed = 0;
        for i in 0..20_000u64 {
            let lba = (rng.below(16) as usize) * PAGE_ENTRIES + rng.below(4) as usize;
            if i % 7 == 0 {
                dev.inject(sluice_media::FaultPlan::nth_read(1));
                match m.entry(lba) {
                    Ok(e) => assert_eq!(e, model.get(&lba).copied().unwrap_or((Loc::NONE, 0)), "op {i}"),
                    Err(VolumeError::Io(_)) => failed += 1,
                    Err(e) => panic!("op {i}: {e}"),
                }
                dev.inject(sluice_media::FaultPlan::none());
            } else {
                m.set(lba, Loc::capacity(i), i as u32).unwrap();
                model.insert(lba, (Loc::capacity(i), i as u32));
            }
        }
        assert!(failed > 100, "{failed} failed faults");
        for (&lba, &e) in &model {
            assert_eq!(m.entry(lba).unwrap(), e, "LBA {lba}");
        }
    }

    #[test]
    fn a_page_damaged_in_the_region_is_reported_never_used() {
        let (mut m, dev) = paged(4 * PAGE_ENTRIES, Width::Wide);
        for page in 0..4 {
            m.set(page * PAGE_ENTRIES + 1, Loc::capacity(page as u64), 1).unwrap();
        }
        // Pages 0 and 1 were evicted to the region; flip a byte of page 0 there.
        let mut b = sluice_media::device::read_at(&*dev, 0, 4096).unwrap().to_vec();
        b[8] ^= 1;
        sluice_media::device::write_at(&*dev, 0, &b).unwrap();
        match m.get(1) {
            Err(VolumeError::Damaged { device: "cache", offset: 0, .. }) => {}
            other => panic!("a damaged page was used: {other:?}"),
        }
        assert_eq!(m.get(PAGE_ENTRIES + 1).unwrap(), Loc::capacity(1));
    }
}
