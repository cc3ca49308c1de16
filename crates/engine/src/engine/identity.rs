//! Which devices belong together: the engine's identity on the media.
//!
//! The cache device's superblock (two copies) and the capacity device's
//! label (two copies, in a place that depends only on the device) carry the
//! same engine UUID and both devices' sizes (docs/format.md, "Identity").
//! `Engine::inspect` reads and checks them before anything is written, and
//! refuses a blank device beside one that holds an engine, devices of two
//! engines, and a device whose size differs from what was recorded;
//! `superblock_present`/`label_present` tell `create` what it must not
//! overwrite, and `wipe_labels` is `sluice format --force`'s erasure.

use super::{
    flush, read_at, sync_io, write_at, BlockDevice, CapGeometry, CapacityLabel, DeviceError, Engine, EngineError,
    IoRequest, Superblock, SuperblockError, BLOCK_BYTES, BS,
};

impl Engine {
    /// What is on the devices, read without changing anything: the cache
    /// device's superblock and the capacity device's label, checked against
    /// each other and against the devices' sizes. `open` starts with this;
    /// a caller compares its configuration with the result before opening.
    pub fn inspect(cache: &dyn BlockDevice, capacity: &dyn BlockDevice) -> Result<Superblock, EngineError> {
        let copies = [read_at(cache, 0, BLOCK_BYTES)?, read_at(cache, BS, BLOCK_BYTES)?];
        let decoded: Vec<_> = copies.iter().map(|b| Superblock::decode(b)).collect();
        let sb = match (&decoded[0], &decoded[1]) {
            (Ok(a), Ok(b)) => {
                if a.generation >= b.generation {
                    a.clone()
                } else {
                    b.clone()
                }
            }
            (Ok(a), Err(_)) | (Err(_), Ok(a)) => a.clone(),
            (Err(SuperblockError::NoMagic), Err(SuperblockError::NoMagic)) => {
                return Err(match read_label(capacity) {
                    Ok(l) => EngineError::CacheUnlabelled(l.uuid),
                    Err(EngineError::Label(SuperblockError::NoMagic)) => EngineError::NoEngine,
                    Err(e) => e,
                });
            }
            (Err(e), Err(_)) => return Err((*e).into()),
        };
        for (device, recorded, actual) in [
            ("cache", sb.cache_bytes, cache.info().capacity_bytes),
            ("capacity", sb.capacity_bytes, capacity.info().capacity_bytes),
        ] {
            if recorded != actual {
                return Err(EngineError::DeviceSize { device, uuid: sb.uuid, recorded, actual });
            }
        }
        if sb.layout == crate::persist::LAYOUT_ATTACHED {
            // Nothing of Sluice's is on the disk: its identity is checked
            // by `open` (disk_identity.rs).
            return Ok(sb);
        }
        let label = match read_label(capacity) {
            Ok(l) => l,
            Err(EngineError::Label(SuperblockError::NoMagic)) => return Err(EngineError::CapacityUnlabelled(sb.uuid)),
            Err(e) => return Err(e),
        };
        if label.uuid != sb.uuid {
            return Err(EngineError::Mismatch { cache: sb.uuid, capacity: label.uuid });
        }
        if label.cache_bytes != sb.cache_bytes || label.capacity_bytes != sb.capacity_bytes {
            return Err(EngineError::Geometry);
        }
        Ok(sb)
    }
}

/// Where the capacity device's label lives: its last two blocks on a
/// conventional device (past the checkpoint region), the start of its last
/// zone on a zoned one (a zone nothing else uses). It depends only on the
/// device, so a label is found without knowing the engine's geometry.
pub fn label_offset(capacity: &dyn BlockDevice) -> u64 {
    let bytes = capacity.info().capacity_bytes;
    match capacity.as_zoned() {
        Some(z) => {
            let zone = z.zone_limits().zone_size_bytes;
            (bytes / zone).saturating_sub(1) * zone
        }
        None => bytes.saturating_sub(2 * BS),
    }
}

/// The capacity device's label (either copy).
fn read_label(capacity: &dyn BlockDevice) -> Result<CapacityLabel, EngineError> {
    if capacity.info().capacity_bytes < 2 * BS {
        return Err(EngineError::Label(SuperblockError::NoMagic));
    }
    let at = label_offset(capacity);
    let (a, b) = (read_at(capacity, at, BLOCK_BYTES)?, read_at(capacity, at + BS, BLOCK_BYTES)?);
    CapacityLabel::decode_pair(&a, &b).map_err(EngineError::Label)
}

pub(super) fn write_label(
    capacity: &dyn BlockDevice,
    geo: &CapGeometry,
    label: &CapacityLabel,
) -> Result<(), DeviceError> {
    let at = label_offset(capacity);
    let one = label.encode();
    let mut two = one.clone();
    two.extend_from_slice(&one);
    if geo.zoned {
        // A zone of its own: reset, the two copies, finished (so it never
        // counts against the active-zone limit).
        use sluice_media::device::ZoneAction;
        sync_io(capacity, IoRequest::zone(ZoneAction::Reset, at, 0)).result?;
        write_at(capacity, at, &two)?;
        sync_io(capacity, IoRequest::zone(ZoneAction::Finish, at, 0)).result?;
    } else {
        write_at(capacity, at, &two)?;
    }
    flush(capacity)
}

/// Whether the cache device holds a Sluice superblock (its magic in either
/// copy, damaged or not): the engine's UUID if a copy checks, else zeros.
pub fn superblock_present(cache: &dyn BlockDevice) -> Result<Option<[u8; 16]>, DeviceError> {
    copies_present(cache, 0, crate::persist::SUPERBLOCK_MAGIC, |c| Superblock::decode(c).ok().map(|sb| sb.uuid))
}

/// Whether the capacity device holds a Sluice label (magic in either copy).
pub fn label_present(capacity: &dyn BlockDevice) -> Result<Option<[u8; 16]>, DeviceError> {
    let at = label_offset(capacity);
    copies_present(capacity, at, crate::persist::LABEL_MAGIC, |c| CapacityLabel::decode(c).ok().map(|l| l.uuid))
}

/// The two copies of a superblock or label at `at`: None if neither carries
/// `magic`; else the UUID of the first that decodes, or zeros.
fn copies_present(
    dev: &dyn BlockDevice,
    at: u64,
    magic: u32,
    uuid_of: impl Fn(&[u8]) -> Option<[u8; 16]>,
) -> Result<Option<[u8; 16]>, DeviceError> {
    if dev.info().capacity_bytes < 2 * BS {
        return Ok(None);
    }
    let copies = [read_at(dev, at, BLOCK_BYTES)?, read_at(dev, at + BS, BLOCK_BYTES)?];
    if copies.iter().all(|c| c[0..4] != magic.to_le_bytes()) {
        return Ok(None);
    }
    Ok(Some(copies.iter().find_map(|c| uuid_of(c)).unwrap_or([0; 16])))
}

/// Erase the cache device's superblock copies (`sluice format --force` of
/// an attached cache, which never writes the disk).
pub fn wipe_superblock(cache: &dyn BlockDevice) -> Result<(), DeviceError> {
    write_at(cache, 0, &[0u8; 2 * BLOCK_BYTES])?;
    flush(cache)
}

/// Erase what marks the devices as a Sluice engine's — the cache device's
/// superblock copies and the capacity device's label — so that `create`
/// accepts them (`sluice format --force`). Records left in the log and the
/// bands carry the old engine's tag and are never read as the new one's.
pub fn wipe_labels(cache: &dyn BlockDevice, capacity: &dyn BlockDevice) -> Result<(), DeviceError> {
    let zeros = vec![0u8; 2 * BLOCK_BYTES];
    write_at(cache, 0, &zeros)?;
    flush(cache)?;
    if capacity.info().capacity_bytes >= 2 * BS {
        let at = label_offset(capacity);
        if capacity.as_zoned().is_some() {
            sync_io(capacity, IoRequest::zone(sluice_media::device::ZoneAction::Reset, at, 0)).result?;
        } else {
            write_at(capacity, at, &zeros)?;
        }
        flush(capacity)?;
    }
    Ok(())
}
