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

use super::*;

/// Where compaction places volumes' blocks on the capacity device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum BandPlacement {
    /// Each volume has its own open band (zone): tenants never share one.
    #[default]
    PerVolume,
    /// All volumes write into one open band (the tenant-blind baseline).
    Shared,
}

impl Engine {
    /// Choose where compaction writes each volume's blocks (see the module
    /// doc), before the first write.
    pub fn set_band_placement(&self, placement: BandPlacement) -> Result<(), EngineError> {
        let mut inner = self.lock();
        // Changing it later would strand the open bands of the old streams.
        if inner.placement != placement && (inner.stats.user_write_bytes > 0 || inner.stats.capacity_write_bytes > 0) {
            return Err(EngineError::Config("band placement is chosen before the first write"));
        }
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
    /// The band stream compaction of `vol` writes to: its own, or the one
    /// all volumes share (`BandPlacement::Shared`, kept in volume 0's slot).
    pub(super) fn stream(&self, vol: u32) -> usize {
        match self.placement {
            BandPlacement::PerVolume => vol as usize,
            BandPlacement::Shared => 0,
        }
    }
}
