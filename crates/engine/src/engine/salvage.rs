//! Salvage: what an open does with damage it was told to accept
//! (`OpenOptions::salvage`, `sluice check --salvage`), and with the bands
//! recovery voided.
//!
//! Blocks whose newest copy is damaged are trimmed; a band is emptied —
//! every block still in it written again to the log — and discarded, so no
//! later recovery meets the same damage (or the same voided claim) again.
//! The bands stay in quarantine (never opened, never a GC victim) until
//! they are empty; a fresh mark follows, since none of them is open.

use super::*;

impl Engine {
    /// After a salvaging open: make the damage it accepted stay accepted.
    /// Blocks whose newest copy is damaged are trimmed (they read as zeros
    /// from now on; `Engine::salvaged` names them). Bands with damage are
    /// emptied — every block they hold written again to the log (trimmed if
    /// it does not check) — and discarded, so no later recovery finds the
    /// same damage again; then a fresh mark (none of them is open).
    pub(super) fn salvage_repair(&self, damage: &[Damage]) -> Result<(), VolumeError> {
        let mut inner = self.lock();
        let bands: Vec<BandId> = Damage::bands(damage).into_iter().map(BandId).collect();
        // Out of reach (`Engine::open_with` put them in quarantine before
        // anything was written): what is written below may compact, and
        // must neither open nor collect one of these.
        debug_assert!(bands.iter().all(|b| inner.bands.quarantine.contains(b) && !inner.bands.free.contains(b)));
        let vol_id = |inner: &Inner, name: &str| inner.vols.iter().position(|v| v.name == name).map(|i| i as u32);
        for d in damage {
            if let Damage::LogBlock { volume, lba, .. } = d {
                if let Some(v) = vol_id(&inner, volume) {
                    self.trim_logged(&mut inner, v, *lba..*lba + 1, false)?;
                }
            }
        }
        self.empty_bands(&mut inner, &bands)?;
        self.flush_cache(&mut inner)
    }

    /// Empty each of `bands` (in quarantine: nothing opens or collects
    /// them) — every block still in it written again to the log, trimmed
    /// if it does not check — and discard it; then a fresh mark (none of
    /// them is open). For salvaged damage, and for bands recovery voided.
    pub(super) fn empty_bands(&self, inner: &mut Inner, bands: &[BandId]) -> Result<(), VolumeError> {
        let bpb = inner.blocks_per_band();
        for &b in bands {
            if !inner.bands.quarantine.contains(&b) {
                continue; // emptied already (damaged and voided both)
            }
            let mut held = Vec::new();
            for (v, vol) in inner.vols.iter().enumerate() {
                vol.l2p.for_each(|lba, loc, crc| {
                    if loc.capacity_block().is_some_and(|pb| pb / bpb == b.0 as u64) {
                        held.push((v as u32, lba as u64, loc, crc));
                    }
                })?;
            }
            for (v, lba, loc, crc) in held {
                let mut data = vec![0u8; BLOCK_BYTES];
                match self.read_blocks(&[loc], &[crc], lba * BS, &mut data, None) {
                    Ok(_) => self.append(inner, v, &[(lba, &data)], &[crc], false)?,
                    Err(VolumeError::Corrupt { .. }) => self.trim_logged(inner, v, lba..lba + 1, false)?,
                    Err(e) => return Err(e),
                }
            }
            self.flush_cache(inner)?;
            assert_eq!(inner.bands[b].valid, 0, "every block of a salvaged band moved");
            inner.bands[b].gen += 1;
            inner.reuses.fetch_add(1, std::sync::atomic::Ordering::Release);
            let len = inner.cfg.band_bytes;
            zoned::reclaim_band(&*self.capacity, inner.geo.zoned, b.0 as u64 * bpb * BS, len)?;
            let band = &mut inner.bands[b];
            (band.written, band.tombstones, band.epoch) = (0, 0, 0);
            // (Free already if nothing in it won in recovery.)
            if band.state != BandState::Free {
                band.to(BandState::Full, BandState::Free);
            }
            inner.bands.free.push_back(b);
        }
        inner.bands.quarantine.retain(|q| !bands.contains(q));
        if !bands.is_empty() {
            self.write_mark(inner, None, None)?;
        }
        Ok(())
    }
}
