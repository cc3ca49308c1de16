//! Where compaction places each volume's blocks on the capacity device,
//! and how mixed the bands are as a result.
//!
//! The engine's design gives every volume its own open band (zone), so
//! tenants with different data lifetimes never share one and a tenant's
//! zones die whole. `BandPlacement::Shared` sends every volume into one
//! open band instead — the layout of a cache that ignores tenants — and
//! exists as the baseline of the ZNS isolation experiment (`sluice bench
//! csal`, workload `tenants4`). It is a placement policy only: segments name
//! their volume either way, so recovery and GC are the same, and it is not
//! persisted. GC's band mixes volumes in both modes.
//!
//! `BandPlacement::Lifetime` places by expected lifetime instead, after
//! SepBIT (Wang et al., FAST'22): a block's next lifespan is inferred from
//! its last one, and blocks expected to die together share bands, so GC
//! finds victims nearly empty. Compaction sends a block to the short-lived
//! stream if the copy its last write replaced was young — still in the log,
//! or in a compaction band opened less than ℓ user blocks before — and to
//! the long-lived stream otherwise (never written before, or last moved by
//! GC). ℓ is the mean lifespan of the last 16 short-lived bands GC
//! reclaimed (until the first, every rewritten block counts as short). GC
//! sends what survives in a short-lived band to its first stream, and
//! everything else by the age of its victim's data: younger than 4ℓ to the
//! second, older to the third. The hints are in memory only (`Band::born`,
//! `short`, `by_gc`, each log block's class); after a reopen every band
//! counts as old, which only costs placement quality until bands turn over.

use super::bands::GC_STREAMS;
use super::{BandId, Engine, EngineError, Inner, Loc, Serialize, Stream, VecDeque, VolumeError, BS};

/// Where compaction places volumes' blocks on the capacity device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum BandPlacement {
    /// Each volume has its own open band (zone): tenants never share one.
    #[default]
    PerVolume,
    /// All volumes write into one open band (the tenant-blind baseline).
    Shared,
    /// Two compaction streams (short- and long-lived blocks, all volumes)
    /// and three GC streams, by inferred lifetime (module doc).
    Lifetime,
}

/// What `BandPlacement::Lifetime` learns from GC: the lifespans (user
/// blocks written between a band's opening and its reclaim) of the last
/// short-lived bands reclaimed.
#[derive(Clone, Debug, Default)]
pub(super) struct Lifespans {
    recent: VecDeque<u64>,
}

/// How many reclaimed short-lived bands ℓ averages.
const LIFESPANS_KEPT: usize = 16;

impl Lifespans {
    /// ℓ: the mean lifespan of the short-lived bands reclaimed lately; None
    /// before the first.
    pub(super) fn ell(&self) -> Option<u64> {
        (!self.recent.is_empty()).then(|| self.recent.iter().sum::<u64>() / self.recent.len() as u64)
    }

    pub(super) fn reclaimed(&mut self, lifespan: u64) {
        if self.recent.len() == LIFESPANS_KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(lifespan);
    }
}

impl Engine {
    /// Choose where compaction and GC write (see the module doc); any time,
    /// and again after every open (it is not persisted). Streams of the old
    /// placement that the new one does not continue have their open bands
    /// closed (finished on a zoned device), so none is left open with no
    /// writer: changing it mid-life costs the rest of those bands until GC
    /// takes them.
    pub fn set_band_placement(&self, placement: BandPlacement) -> Result<(), EngineError> {
        let mut inner = self.lock();
        if inner.placement == placement {
            return Ok(());
        }
        if inner.in_place() {
            return Err(EngineError::Config("band placement applies to the bands layout only"));
        }
        // Partially written zones: the user streams, every GC stream and
        // the checkpoint's last zone (lifecycle.rs checks the others).
        let user_streams = if placement == BandPlacement::Lifetime { inner.vols.len().min(2) } else { 0 };
        if inner.geo.max_active != 0 && (user_streams + GC_STREAMS + 1) as u64 > inner.geo.max_active as u64 {
            return Err(EngineError::Config("lifetime placement needs 6 active zones on a zoned device"));
        }
        self.close_open_bands(&mut inner).map_err(EngineError::Request)?;
        inner.placement = placement;
        Ok(())
    }

    /// How many capacity bands hold valid blocks of exactly 1, 2, … volumes
    /// (index k = bands holding k + 1 volumes), from a walk of the L2P. With
    /// `BandPlacement::PerVolume` only GC's band mixes volumes.
    pub fn band_tenancy(&self) -> Result<Vec<u64>, VolumeError> {
        let inner = self.lock();
        let bpb = inner.blocks_per_band();
        let mut seen = vec![0u64; inner.bands.len()];
        let mut count = vec![0u32; inner.bands.len()];
        for (v, vol) in inner.vols.iter().enumerate() {
            let bit = 1u64 << (v % 64);
            vol.l2p.for_each(|_, loc, _| {
                if let Some(b) = loc.capacity_block() {
                    let band = (b / bpb) as usize;
                    if seen[band] & bit == 0 {
                        seen[band] |= bit;
                        count[band] += 1;
                    }
                }
            })?;
        }
        let last = inner.vols.len().max(1) - 1;
        let mut hist = vec![0u64; last + 1];
        for c in count.into_iter().filter(|&c| c > 0) {
            hist[(c as usize - 1).min(last)] += 1;
        }
        Ok(hist)
    }
}

impl Inner {
    /// The stream compaction writes `vol`'s blocks of lifetime `class` to
    /// (0 short, 1 long: `lifetime_class`): the volume's own, the one all
    /// volumes share (`BandPlacement::Shared`, kept in volume 0's slot), or
    /// the class's (`Lifetime`, in slot `class`; with one volume both share
    /// slot 0).
    pub(super) fn user_stream(&self, vol: u32, class: u8) -> Stream {
        Stream::User(match self.placement {
            BandPlacement::PerVolume => vol as usize,
            BandPlacement::Shared => 0,
            BandPlacement::Lifetime => (class as usize).min(self.vols.len() - 1),
        })
    }

    /// The user clock placement measures lifespans with: blocks users wrote.
    pub(super) fn user_clock(&self) -> u64 {
        self.stats.get().user_write_bytes / BS
    }

    /// A block being written over `old`, its last copy: 0 if that copy was
    /// young (short-lived next too, by the module doc's inference), else 1.
    pub(super) fn lifetime_class(&self, old: Loc) -> u8 {
        if old.cache_block().is_some() {
            return 0;
        }
        let Some(pb) = old.capacity_block() else { return 1 };
        let band = &self.bands[(pb / self.blocks_per_band()) as usize];
        if band.by_gc() {
            return 1;
        }
        let lifespan = self.user_clock().saturating_sub(band.born());
        match self.lifespans.ell() {
            None => 0,
            Some(ell) => u8::from(lifespan >= ell),
        }
    }

    /// The GC stream for what survives in victim `v`.
    pub(super) fn gc_stream(&self, v: BandId) -> Stream {
        if self.placement != BandPlacement::Lifetime {
            return Stream::Gc(0);
        }
        let band = &self.bands[v];
        if band.short() {
            return Stream::Gc(0);
        }
        let age = self.user_clock().saturating_sub(band.born());
        match self.lifespans.ell() {
            Some(ell) if age >= ell.saturating_mul(4) => Stream::Gc(2),
            _ => Stream::Gc(1),
        }
    }

    /// GC reclaimed band `v`: a short-lived one teaches ℓ its lifespan.
    pub(super) fn learn_lifespan(&mut self, v: BandId) {
        let band = &self.bands[v];
        if band.short() && band.born() != u64::MAX {
            let lifespan = self.user_clock().saturating_sub(band.born());
            self.lifespans.reclaimed(lifespan);
        }
    }
}
