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

use sluice_media::memory::huge_page_vec;

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
    Narrow(Vec<u32>),
    Wide(Vec<u64>),
}

/// One volume's map: an entry and a CRC per block.
pub(super) struct L2p {
    width: Width,
    entries: Entries,
    crcs: Vec<u32>,
}

impl L2p {
    /// `blocks` entries, all nowhere (on huge pages where the OS has them).
    pub(super) fn new(blocks: usize, width: Width) -> L2p {
        let entries = match width {
            Width::Narrow { .. } => Entries::Narrow(huge_page_vec(blocks, 0)),
            Width::Wide => Entries::Wide(huge_page_vec(blocks, 0)),
        };
        L2p { width, entries, crcs: huge_page_vec(blocks, 0) }
    }

    pub(super) fn len(&self) -> usize {
        self.crcs.len()
    }

    pub(super) fn width(&self) -> Width {
        self.width
    }

    pub(super) fn get(&self, lba: usize) -> Loc {
        self.width.decode(self.raw(lba))
    }

    /// `get`, or None for an LBA past the volume (one read from the media).
    pub(super) fn try_get(&self, lba: u64) -> Option<Loc> {
        (lba < self.len() as u64).then(|| self.get(lba as usize))
    }

    /// The CRC32C the block's current copy was logged with.
    pub(super) fn crc(&self, lba: usize) -> u32 {
        self.crcs[lba]
    }

    pub(super) fn crcs(&self, range: std::ops::Range<usize>) -> &[u32] {
        &self.crcs[range]
    }

    /// A new copy of the block (or `Loc::NONE` and 0: none).
    pub(super) fn set(&mut self, lba: usize, loc: Loc, crc: u32) {
        self.set_raw(lba, self.width.encode(loc));
        self.crcs[lba] = crc;
    }

    /// The same data moved elsewhere: its CRC stays.
    pub(super) fn relocate(&mut self, lba: usize, to: Loc) {
        self.set_raw(lba, self.width.encode(to));
    }

    /// Append the entries of `range` to `out`.
    pub(super) fn locs_into(&self, range: std::ops::Range<usize>, out: &mut Vec<Loc>) {
        match &self.entries {
            Entries::Narrow(v) => out.extend(v[range].iter().map(|&r| self.width.decode(r as u64))),
            Entries::Wide(v) => out.extend(v[range].iter().map(|&r| Loc(r))),
        }
    }

    /// Every entry with its LBA, in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = Loc> + '_ {
        (0..self.len()).map(|lba| self.get(lba))
    }

    /// The stored form of entry `lba` (what the checkpoint keeps).
    pub(super) fn raw(&self, lba: usize) -> u64 {
        match &self.entries {
            Entries::Narrow(v) => v[lba] as u64,
            Entries::Wide(v) => v[lba],
        }
    }

    /// Set entry `lba` from its stored form and its CRC (the checkpoint's
    /// decoder). Refuses a stored form this width cannot hold.
    pub(super) fn set_stored(&mut self, lba: usize, raw: u64, crc: u32) -> Result<(), ()> {
        if let Entries::Narrow(_) = self.entries {
            if raw > u32::MAX as u64 {
                return Err(());
            }
        }
        self.set_raw(lba, raw);
        self.crcs[lba] = crc;
        Ok(())
    }

    fn set_raw(&mut self, lba: usize, raw: u64) {
        match &mut self.entries {
            Entries::Narrow(v) => v[lba] = raw as u32,
            Entries::Wide(v) => v[lba] = raw,
        }
    }

    /// DRAM the map takes: entries and CRCs.
    pub(super) fn bytes(&self) -> usize {
        self.len() * (self.width.bytes() as usize + 4)
    }
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
        };
        let cache = Arc::new(CrashDevice::new(8 * cfg.chunk_bytes, 4096));
        let capacity = Arc::new(CrashDevice::new(capacity_bytes, 4096));
        let specs = [VolumeSpec { name: "v".into(), size_bytes: 2048 * 4096 }];
        let e = Engine::create(cache.clone(), capacity.clone(), cfg.clone(), &specs).expect("create");
        let top_band = {
            let mut inner = e.lock();
            assert_eq!(inner.vols[0].l2p.width(), Width::Wide);
            let down: std::collections::VecDeque<u32> = inner.bands.free.iter().rev().copied().collect();
            inner.bands.free = down;
            inner.bands.len() as u64 - 1
        };
        let v = e.volume("v").expect("volume");
        let mut model = vec![0u64; 2048];
        let mut rng = SplitMix64(64);
        let top = (top_band * cfg.band_bytes / 4096)..((top_band + 1) * cfg.band_bytes / 4096);
        let old_limit = 1u64 << 31;
        let on_capacity = |e: &Arc<Engine>| -> Vec<u64> {
            let inner = e.lock();
            (0..2048).filter_map(|l| inner.vols[0].l2p.get(l).capacity_block()).collect()
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
            m.set(i, l, i as u32 * 7);
        }
        for (i, &l) in locs.iter().enumerate() {
            assert_eq!((m.get(i), m.crc(i)), (l, i as u32 * 7));
        }
        // One more capacity block and the entries must be wide.
        assert_eq!(Width::for_devices(cache, capacity + 1), Width::Wide);
    }

    #[test]
    fn wide_entries_reach_the_top_of_the_largest_device() {
        let top = CAPACITY_BYTES_MAX / 4096 - 1;
        let mut m = L2p::new(2, Width::for_devices(1 << 20, top + 1));
        m.set(0, Loc::capacity(top), 1);
        m.relocate(1, Loc::cache((1 << 20) - 1));
        assert_eq!(m.get(0).capacity_block(), Some(top));
        assert_eq!(m.get(1).cache_block(), Some((1 << 20) - 1));
        assert_eq!(m.bytes(), 2 * 12);
    }

    #[test]
    #[should_panic(expected = "does not fit a narrow L2P")]
    fn a_narrow_map_refuses_a_block_it_cannot_encode() {
        let mut m = L2p::new(1, Width::Narrow { cache_blocks: 10 });
        m.set(0, Loc::capacity(u32::MAX as u64), 0);
    }
}
