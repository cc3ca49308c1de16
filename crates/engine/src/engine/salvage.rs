//! Salvage: what an open does with damage it was told to accept
//! (`OpenOptions::salvage`, `sluice check --salvage`), and with the bands
//! recovery voided.
//!
//! Blocks whose newest copy is damaged are trimmed; a band is emptied —
//! every block still in it written again to the log, and every live
//! tombstone in it logged again — and discarded, so no later recovery
//! meets the same damage (or the same voided claim) again.
//!
//! A band's live tombstones matter as much as its blocks: the newest
//! tombstone of an unmapped block is what keeps an older copy of it, in
//! another band, from winning the next recovery. Discarding a voided band
//! that held one brought a zeroed block's old data back after the next
//! crash (`sluice sim --seed-start 3447269811`, and with `--zns`).
//! The bands stay in quarantine (never opened, never a GC victim) until
//! they are empty; a fresh mark follows, since none of them is open.

use super::{read_at, segments, BandId, Damage, Engine, EngineError, Inner, VolumeError, BLOCK_BYTES, BS};

impl Engine {
    /// `sluice check --salvage`, after a salvaging open: accept what a scan
    /// (`Engine::check`) found that the open did not meet itself — a data
    /// block at rest that does not match its CRC, found on either device
    /// (recovery trusts durable data it does not need to read) — by
    /// trimming the block (it reads as zeros from now on). Returns what it
    /// trimmed, each once.
    pub fn salvage_found(&self, found: &[Damage]) -> Result<Vec<Damage>, EngineError> {
        let blocks: Vec<Damage> = (found.iter())
            .filter(|d| matches!(d, Damage::Block { .. } | Damage::LogBlock { .. }))
            .filter(|d| !self.salvaged.contains(d))
            .cloned()
            .collect();
        if blocks.is_empty() {
            return Ok(blocks);
        }
        self.change(|e, inner| {
            e.trim_damaged_blocks(inner, &blocks)?;
            e.flush_cache(inner)
        })
        .map_err(EngineError::Request)?;
        Ok(blocks)
    }

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
        assert!(bands.iter().all(|&b| inner.bands.is_quarantined(b)), "damaged bands are quarantined first");
        self.trim_damaged_blocks(&mut inner, damage)?;
        self.empty_bands(&mut inner, &bands)?;
        self.flush_cache(&mut inner)
    }

    /// Trim every block whose newest copy `damage` names damaged (a log
    /// block or a block at rest): it reads as zeros from now on. In place
    /// an unmapped block reads from its home, which may be the damaged
    /// copy (a home that failed its sum) or an older version of the block:
    /// zeros are written there instead (past the log: the cached copy
    /// dropped, the home's sum recorded anew), and the disk flushed.
    fn trim_damaged_blocks(&self, inner: &mut Inner, damage: &[Damage]) -> Result<(), VolumeError> {
        let mut homes = false;
        for d in damage {
            if let Damage::LogBlock { volume, lba, .. } | Damage::Block { volume, lba, .. } = d {
                if let Some(v) = inner.vols.iter().position(|v| v.name == *volume) {
                    match inner.in_place() {
                        true => self.write_past_log(inner, v as u32, *lba, 1, None)?,
                        false => self.trim_logged(inner, v as u32, *lba..*lba + 1, false)?,
                    }
                    homes |= inner.in_place();
                }
            }
        }
        if homes {
            self.flush_capacity(inner)?;
        }
        Ok(())
    }

    /// Empty each of `bands` (in quarantine: nothing opens or collects
    /// them) — every block still in it written again to the log, trimmed
    /// if it does not check, and its live tombstones logged again — and
    /// discard it; then a fresh mark (none of them is open). For salvaged
    /// damage, and for bands recovery voided.
    pub(super) fn empty_bands(&self, inner: &mut Inner, bands: &[BandId]) -> Result<(), VolumeError> {
        let bpb = inner.blocks_per_band();
        for &b in bands {
            if !inner.bands.is_quarantined(b) {
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
            for (v, lbas) in self.band_live_tombstones(inner, b)?.into_iter().enumerate() {
                self.relog_tombstones(inner, v as u32, &lbas)?;
            }
            // Rule 3: what replaces the band's entries is durable before
            // the band is discarded.
            self.flush_cache(inner)?;
            assert_eq!(inner.bands[b].valid(), 0, "every block of a salvaged band moved");
            // (Free already if nothing in it won in recovery.)
            self.discard_band(inner, b)?;
        }
        if !bands.is_empty() {
            // The mark describes flushed capacity state: the discards too.
            self.flush_capacity(inner)?;
            self.write_mark(inner, None, None)?;
        }
        Ok(())
    }

    /// The live tombstones band `b` holds, per volume (each the newest of
    /// its unmapped block, `l2p::tombstone_live`). Its segment headers are
    /// read one at a time from the band's start while they decode and carry
    /// the band's epoch: a damaged band's walk ends at its damage, past
    /// which salvage accepted the loss.
    fn band_live_tombstones(&self, inner: &Inner, b: BandId) -> Result<Vec<Vec<u64>>, VolumeError> {
        let (bpb, unit) = (inner.blocks_per_band(), inner.cfg.write_unit_bytes / BS);
        let (written, epoch) = (inner.bands[b].written(), inner.bands[b].epoch());
        let mut live = vec![Vec::new(); inner.vols.len()];
        let mut pos = 0;
        while pos < written {
            let block = read_at(&*self.capacity, (b.0 as u64 * bpb + pos) * BS, BLOCK_BYTES)?;
            let Ok(h) = crate::layout::decode_header(&block, inner.tag) else { break };
            let vol = h.volume as usize;
            if h.kind != crate::layout::RecordKind::Segment || h.epoch != epoch || vol >= inner.vols.len() {
                break;
            }
            for e in h.entries.iter().filter(|e| e.tombstone) {
                if inner.vols[vol].l2p.tombstone_live(e.lba, h.seq)? {
                    live[vol].push(e.lba);
                }
            }
            pos += segments::segment_blocks(h.data_blocks() as u64, unit);
        }
        Ok(live)
    }
}

#[cfg(test)]
mod tests {
    use crate::testkit::{flushed_and_reopened, pattern, read_block, small_world};
    use crate::volume::Volume;

    /// A band emptied (voided by recovery, or damaged and salvaged) that
    /// holds a trimmed block's newest tombstone: the tombstone is logged
    /// again before the band is discarded, or the block's older copy in
    /// another band wins the next recovery. Without it, block 5 reads back
    /// its written data after the reopen.
    #[test]
    fn an_emptied_band_keeps_its_live_tombstones() {
        let w = small_world(&[256]);
        let v = &w.volumes[0];
        let write_range = |lbas: std::ops::Range<u64>, version: u64| {
            for lba in lbas {
                v.write(lba * 4096, &pattern(0, lba, version), false).unwrap();
            }
        };
        // Block 5 reaches a band, then is trimmed, and the tombstone
        // follows it to a later band (the log's churn compacts both).
        write_range(0..64, 1);
        write_range(64..256, 1);
        while w.engine.compact_some(u64::MAX).unwrap() {}
        let data_band = {
            let inner = w.engine.lock();
            let pb = inner.vols[0].l2p.get(5).unwrap().capacity_block().expect("compacted");
            pb / inner.blocks_per_band()
        };
        v.trim(5 * 4096, 4096).unwrap();
        write_range(64..256, 2);
        while w.engine.compact_some(u64::MAX).unwrap() {}
        {
            let mut inner = w.engine.lock();
            w.engine.close_open_bands(&mut inner).unwrap();
            w.engine.flush_capacity(&mut inner).unwrap();
            let holding: Vec<crate::engine::BandId> = (0..inner.bands.len() as u32)
                .map(crate::engine::BandId)
                .filter(|&b| inner.bands[b].state() == crate::engine::BandState::Full)
                .filter(|&b| w.engine.band_live_tombstones(&inner, b).unwrap()[0].contains(&5))
                .collect();
            assert_eq!(holding.len(), 1, "one band holds block 5's live tombstone");
            assert_ne!(holding[0].0 as u64, data_band, "the tombstone and the data it hides share a band");
            inner.bands.quarantine([holding[0]]);
            w.engine.empty_bands(&mut inner, &holding).unwrap();
        }
        assert!(read_block(v, 5) == vec![0u8; 4096], "the trimmed block reads back data");
        let e = flushed_and_reopened(w);
        let v = e.volume("v0").unwrap();
        assert!(read_block(&v, 5) == vec![0u8; 4096], "the trimmed block came back after the reopen");
        e.check_invariants();
    }
}
