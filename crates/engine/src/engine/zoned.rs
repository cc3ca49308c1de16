//! The capacity device's geometry, conventional or zoned (NVMe ZNS), and the
//! few places where the two differ.
//!
//! On a zoned device a band *is* a zone: `band_bytes` is the zone size (the
//! address stride) and a band holds only `zone capacity` bytes, written
//! strictly at the write pointer — which the engine does anyway, since every
//! band is filled sequentially from its start by one stream. What changes:
//! - a band closed before it is full is **finished** (so the engine's
//!   partially written zones are exactly its open bands: one per volume plus
//!   the GC band, which must fit `max_active`);
//! - a reclaimed band is **reset** instead of discarded;
//! - the checkpoint region is written zone by zone, each reset first and
//!   filled up to its capacity, the last one finished;
//! - after a crash, zones the engine treats as free are reset and zones it
//!   treats as full are finished, so the device and the engine agree.
//!
//! The emulated ZNS SSD rejects any write off the write pointer, beyond the
//! capacity or past the active limit, so a run with zero rejected requests
//! shows the engine keeps every rule.

use super::{read_at, sync_io, write_at, BandState, BlockDevice, DeviceError, Inner, IoRequest, BS};
use sluice_media::device::ZoneAction;
use sluice_media::ZoneState;

/// What the engine needs to know of the capacity device.
#[derive(Clone, Copy, Debug)]
pub(super) struct CapGeometry {
    /// Address stride of a band.
    pub band_bytes: u64,
    /// Blocks a band can hold (the zone capacity on a zoned device).
    pub usable_blocks: u64,
    pub zoned: bool,
    /// Most partially written zones at once (0 = no limit / not zoned).
    pub max_active: u32,
}

impl CapGeometry {
    /// The geometry for `capacity`; on a zoned device bands are its zones
    /// and `band_bytes` is replaced by the zone size.
    pub fn of(capacity: &dyn BlockDevice, band_bytes: u64) -> CapGeometry {
        match capacity.as_zoned() {
            Some(z) => {
                let l = z.zone_limits();
                CapGeometry {
                    band_bytes: l.zone_size_bytes,
                    usable_blocks: l.zone_capacity_bytes / BS,
                    zoned: true,
                    max_active: l.max_active,
                }
            }
            None => CapGeometry { band_bytes, usable_blocks: band_bytes / BS, zoned: false, max_active: 0 },
        }
    }
}

fn zone_op(dev: &dyn BlockDevice, action: ZoneAction, start: u64) -> Result<(), DeviceError> {
    sync_io(dev, IoRequest::zone(action, start, 0)).result.map(|_| ())
}

/// A band closed with room left: finish its zone (no-op when conventional).
pub(super) fn finish_band(dev: &dyn BlockDevice, zoned: bool, start: u64) -> Result<(), DeviceError> {
    if zoned {
        zone_op(dev, ZoneAction::Finish, start)?;
    }
    Ok(())
}

/// A reclaimed band: reset its zone, or discard it.
pub(super) fn reclaim_band(dev: &dyn BlockDevice, zoned: bool, start: u64, len: u64) -> Result<(), DeviceError> {
    if zoned {
        zone_op(dev, ZoneAction::Reset, start)
    } else {
        sluice_media::device::discard(dev, start, len)
    }
}

/// Write `data` (whole blocks) into the region of bands starting at `start`:
/// contiguous on a conventional device; zone by zone up to each zone's
/// capacity on a zoned one (each zone reset first, the last one finished).
pub(super) fn write_region(dev: &dyn BlockDevice, g: &CapGeometry, start: u64, data: &[u8]) -> Result<(), DeviceError> {
    if !g.zoned {
        return write_at(dev, start, data);
    }
    let per = (g.usable_blocks * BS) as usize;
    for (i, piece) in data.chunks(per).enumerate() {
        let zone = start + i as u64 * g.band_bytes;
        zone_op(dev, ZoneAction::Reset, zone)?;
        write_at(dev, zone, piece)?;
        if piece.len() < per {
            zone_op(dev, ZoneAction::Finish, zone)?;
        }
    }
    Ok(())
}

/// Bytes `[from, from + len)` of the region written by `write_region` at
/// `start` (whole blocks).
pub(super) fn read_region_part(
    dev: &dyn BlockDevice,
    g: &CapGeometry,
    start: u64,
    from: u64,
    len: usize,
) -> Result<Vec<u8>, DeviceError> {
    if !g.zoned {
        return read_at(dev, start + from, len).map(|b| b.to_vec());
    }
    let per = g.usable_blocks * BS;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let at = from + out.len() as u64;
        let (zone, within) = (at / per, at % per);
        let n = ((per - within) as usize).min(len - out.len());
        out.extend_from_slice(&read_at(dev, start + zone * g.band_bytes + within, n)?);
    }
    Ok(out)
}

/// After a crash: make each zone's state match the engine's view of its band.
pub(super) fn reconcile(dev: &dyn BlockDevice, inner: &Inner) -> Result<(), DeviceError> {
    let Some(z) = dev.as_zoned() else { return Ok(()) };
    let zones = z.report_zones(0, inner.bands.len());
    for (b, (band, zone)) in inner.bands.iter().zip(zones).enumerate() {
        let start = b as u64 * inner.cfg.band_bytes;
        debug_assert_eq!(zone.start, start);
        let written = zone.write_pointer > zone.start && zone.state != ZoneState::Empty;
        let full = zone.state == ZoneState::Full;
        if band.state() == BandState::Free && written {
            zone_op(dev, ZoneAction::Reset, start)?;
        } else if band.state() == BandState::Full && !full {
            zone_op(dev, ZoneAction::Finish, start)?;
        }
    }
    Ok(())
}
