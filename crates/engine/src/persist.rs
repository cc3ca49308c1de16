//! Superblock, capacity label and clean-shutdown checkpoint (docs/format.md).
//!
//! The superblock lives in the first two blocks of the cache device (two
//! copies; the valid one with the higher generation wins) and records the
//! engine's identity (a random UUID), the geometry, the volumes, whether the
//! engine was shut down cleanly, and where the checkpoint is. The capacity
//! device carries a **label** (two copies, written once at creation): the
//! same UUID, its role and both devices' sizes, so that a capacity device
//! from another engine, a blank one, or one shorter than recorded is refused
//! instead of being read as an empty engine. The checkpoint — the whole
//! in-memory state: maps, chunk and band states — is written at clean
//! shutdown into a region reserved at the end of the capacity device, with
//! its CRC32C in the superblock.
//!
//! Startup order (explicit, like SPDK FTL's management steps): read
//! superblock → refuse if not clean (crash replay is the next increment) →
//! read and verify checkpoint → mark the superblock dirty and flush it before
//! the first change, so a crash after reopening can never be mistaken for a
//! clean state.

use crate::layout::{crc32c, BLOCK_BYTES};
use sluice_media::device::{flush, write_at};
use sluice_media::{BlockDevice, DeviceError};

pub const SUPERBLOCK_MAGIC: u32 = 0x534c_5342; // "SLSB"
/// The highest version this Sluice reads.
pub const SUPERBLOCK_VERSION: u16 = 9;
/// The version an in-place engine without home checksums writes (version
/// 8: Clean records and the attached layout).
pub const SUPERBLOCK_VERSION_IN_PLACE: u16 = 8;
/// The version an in-place engine with home checksums writes (version 9:
/// the home-sum table on the cache device, `Superblock::home_sums`). A
/// version 8 Sluice refuses it: it would write homes without zeroing their
/// sums, and the next open would take its writes for damage.
pub const SUPERBLOCK_VERSION_HOME_SUMS: u16 = 9;
/// The version an engine not attached writes: version 8 only added the
/// attached layout, so such an engine stays readable by a version 7 Sluice.
pub const SUPERBLOCK_VERSION_DETACHED: u16 = 7;
pub const LABEL_MAGIC: u32 = 0x534c_4341; // "SLCA"
pub const NAME_BYTES_MAX: usize = 63;
/// Fixed part of the superblock before the volume table.
const SB_FIXED_BYTES: usize = 128;
/// Per volume: name length u8, name (63 bytes), size u64.
const SB_VOLUME_BYTES: usize = 72;
pub const VOLUMES_MAX: usize = (BLOCK_BYTES - SB_FIXED_BYTES - 4) / SB_VOLUME_BYTES;
const _: () = assert!(SB_FIXED_BYTES + VOLUMES_MAX * SB_VOLUME_BYTES + 4 <= BLOCK_BYTES);

/// The superblock's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The engine's identity, shared with the capacity device's label and
    /// folded into every record header (`engine_tag`).
    pub uuid: [u8; 16],
    pub generation: u64,
    pub clean: bool,
    pub chunk_bytes: u64,
    pub band_bytes: u64,
    pub write_unit_bytes: u64,
    pub log_free_chunks_min: u32,
    pub gc_free_bands_min: u32,
    pub cache_bytes: u64,
    pub capacity_bytes: u64,
    /// Byte offset and length of the checkpoint: on the capacity device, or
    /// on the cache device when attached (`LAYOUT_ATTACHED`).
    pub checkpoint_offset: u64,
    pub checkpoint_bytes: u64,
    pub checkpoint_crc: u32,
    /// The sequence the last recovery restarted at: the next one restarts
    /// above it even if it finds nothing newer (`engine/recovery/`).
    pub seq_floor: u64,
    /// The L2P's DRAM budget when it is paged (the rest of the map lives in
    /// a region at the end of the cache device); 0: every map in DRAM.
    /// (Version 5; version 4 kept these bytes zero.)
    pub l2p_dram_bytes: u64,
    /// How the capacity device holds the volumes' blocks: `LAYOUT_BANDS`
    /// (log-structured bands or zones, written by compaction) or
    /// `LAYOUT_IN_PLACE` (each block at its own LBA, written by cleaning).
    /// (Version 6; versions 4 and 5 kept this byte zero: bands.)
    pub layout: u8,
    /// In place: the cache device holds a CRC32C of every home the engine
    /// wrote (engine/home_sums.rs), in a region before the map region.
    /// (Version 9, byte 121 bit 0; earlier versions kept it zero.)
    pub home_sums: bool,
    pub volumes: Vec<(String, u64)>,
    /// The format version, as read (a new engine's: `SUPERBLOCK_VERSION`),
    /// and as `encode` writes it. Only a clean shutdown writes a clean
    /// superblock, right after its checkpoint, and sets the version to that
    /// checkpoint's: 7 (with the clean bits of cached blocks), or 6 when an
    /// engine created before version 7 has no room for them.
    pub version: u16,
}

/// `Superblock::layout`: log-structured bands (zones on a zoned device).
pub const LAYOUT_BANDS: u8 = 0;
/// `Superblock::layout`: each volume block at its own LBA (a plain disk).
pub const LAYOUT_IN_PLACE: u8 = 1;
/// `Superblock::layout`: in place on a disk the engine was attached to with
/// its data: nothing of Sluice's on the disk (no label, no checkpoint
/// region); the checkpoint and the disk's identity are on the cache device.
/// (Version 8.)
pub const LAYOUT_ATTACHED: u8 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SuperblockError {
    #[error("no Sluice superblock on the cache device")]
    NoMagic,
    #[error("superblock checksum mismatch")]
    Checksum,
    #[error(
        "unsupported superblock version {0} (this Sluice reads versions 4 to {SUPERBLOCK_VERSION}; \
         version 2 engines have no capacity label and must be re-created)"
    )]
    Version(u16),
    #[error("malformed superblock")]
    Malformed,
}

impl Superblock {
    /// Both copies (blocks 0 and 1 of the cache device), then a flush:
    /// durable before anything relies on it.
    pub fn write_to(&self, cache: &dyn BlockDevice) -> Result<(), DeviceError> {
        let b = self.encode();
        write_at(cache, 0, &b)?;
        write_at(cache, BLOCK_BYTES as u64, &b)?;
        flush(cache)
    }

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.volumes.len() <= VOLUMES_MAX);
        let mut b = vec![0u8; BLOCK_BYTES];
        let mut w = 0;
        let mut put = |bytes: &[u8]| {
            b[w..w + bytes.len()].copy_from_slice(bytes);
            w += bytes.len();
        };
        put(&SUPERBLOCK_MAGIC.to_le_bytes());
        assert!((4..=SUPERBLOCK_VERSION).contains(&self.version), "superblock version {}", self.version);
        put(&self.version.to_le_bytes());
        put(&(self.clean as u16).to_le_bytes());
        put(&self.generation.to_le_bytes());
        put(&self.chunk_bytes.to_le_bytes());
        put(&self.band_bytes.to_le_bytes());
        put(&self.write_unit_bytes.to_le_bytes());
        put(&self.log_free_chunks_min.to_le_bytes());
        put(&self.gc_free_bands_min.to_le_bytes());
        put(&self.cache_bytes.to_le_bytes());
        put(&self.capacity_bytes.to_le_bytes());
        put(&self.checkpoint_offset.to_le_bytes());
        put(&self.checkpoint_bytes.to_le_bytes());
        put(&self.checkpoint_crc.to_le_bytes());
        put(&(self.volumes.len() as u32).to_le_bytes());
        put(&self.seq_floor.to_le_bytes());
        put(&self.uuid);
        put(&self.l2p_dram_bytes.to_le_bytes());
        put(&[self.layout]);
        assert!(!self.home_sums || self.version >= SUPERBLOCK_VERSION_HOME_SUMS, "home sums need version 9");
        put(&[self.home_sums as u8]);
        put(&[0u8; 6]); // reserved
        debug_assert_eq!(w, SB_FIXED_BYTES);
        for (i, (name, size)) in self.volumes.iter().enumerate() {
            let o = SB_FIXED_BYTES + i * SB_VOLUME_BYTES;
            let n = name.len().min(NAME_BYTES_MAX);
            b[o] = n as u8;
            b[o + 1..o + 1 + n].copy_from_slice(&name.as_bytes()[..n]);
            b[o + 64..o + 72].copy_from_slice(&size.to_le_bytes());
        }
        let c = crc32c(&b[..BLOCK_BYTES - 4]);
        b[BLOCK_BYTES - 4..].copy_from_slice(&c.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock, SuperblockError> {
        if b.len() != BLOCK_BYTES || b[0..4] != SUPERBLOCK_MAGIC.to_le_bytes() {
            return Err(SuperblockError::NoMagic);
        }
        if crc32c(&b[..BLOCK_BYTES - 4]) != u32::from_le_bytes(b[BLOCK_BYTES - 4..].try_into().expect("4")) {
            return Err(SuperblockError::Checksum);
        }
        let u16_at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().expect("2"));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        let version = u16_at(4);
        // Versions 4 and 5 differ only in `l2p_dram_bytes` (4) and
        // `layout` (4 and 5), zero there.
        if !(4..=SUPERBLOCK_VERSION).contains(&version) {
            return Err(SuperblockError::Version(version));
        }
        let count = u32_at(84) as usize;
        if count > VOLUMES_MAX {
            return Err(SuperblockError::Malformed);
        }
        let mut volumes = Vec::with_capacity(count);
        for i in 0..count {
            let o = SB_FIXED_BYTES + i * SB_VOLUME_BYTES;
            let n = b[o] as usize;
            if n > NAME_BYTES_MAX {
                return Err(SuperblockError::Malformed);
            }
            let name = std::str::from_utf8(&b[o + 1..o + 1 + n]).map_err(|_| SuperblockError::Malformed)?;
            volumes.push((name.to_string(), u64_at(o + 64)));
        }
        Ok(Superblock {
            uuid: b[96..112].try_into().expect("16"),
            clean: u16_at(6) & 1 == 1,
            generation: u64_at(8),
            chunk_bytes: u64_at(16),
            band_bytes: u64_at(24),
            write_unit_bytes: u64_at(32),
            log_free_chunks_min: u32_at(40),
            gc_free_bands_min: u32_at(44),
            cache_bytes: u64_at(48),
            capacity_bytes: u64_at(56),
            checkpoint_offset: u64_at(64),
            checkpoint_bytes: u64_at(72),
            checkpoint_crc: u32_at(80),
            seq_floor: u64_at(88),
            l2p_dram_bytes: u64_at(112),
            layout: match b[120] {
                l @ (LAYOUT_BANDS | LAYOUT_IN_PLACE) => l,
                LAYOUT_ATTACHED if version >= 8 => LAYOUT_ATTACHED,
                _ => return Err(SuperblockError::Malformed),
            },
            home_sums: version >= SUPERBLOCK_VERSION_HOME_SUMS && b[121] & 1 == 1,
            volumes,
            version,
        })
    }
}

impl Superblock {
    /// The 32-bit tag of this engine every record header carries, so that
    /// records another engine left on a reused device are never replayed.
    pub fn engine_tag(&self) -> u32 {
        engine_tag(&self.uuid)
    }
}

/// The record-header tag of the engine with this UUID (never 0).
pub fn engine_tag(uuid: &[u8; 16]) -> u32 {
    crc32c(uuid).max(1)
}

/// A fresh random engine UUID (version 4, RFC 9562 layout).
pub fn new_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    let n = rustix::rand::getrandom(&mut u, rustix::rand::GetRandomFlags::empty());
    if n != Ok(16) {
        // No entropy syscall (very old kernel): time and PID still tell engines apart.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        u.copy_from_slice(&(t ^ ((std::process::id() as u128) << 64)).to_le_bytes());
    }
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

/// A UUID as text (8-4-4-4-12 hex digits).
pub fn uuid_text(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// The capacity device's label: written once, when the engine is created,
/// in two copies (docs/format.md says where); never changed afterwards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityLabel {
    pub uuid: [u8; 16],
    pub capacity_bytes: u64,
    pub cache_bytes: u64,
    pub band_bytes: u64,
}

const LABEL_VERSION: u16 = 1;
/// Role byte: this device is the engine's capacity device.
const ROLE_CAPACITY: u8 = 2;

impl CapacityLabel {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_BYTES];
        b[0..4].copy_from_slice(&LABEL_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&LABEL_VERSION.to_le_bytes());
        b[6] = ROLE_CAPACITY;
        b[8..24].copy_from_slice(&self.uuid);
        b[24..32].copy_from_slice(&self.capacity_bytes.to_le_bytes());
        b[32..40].copy_from_slice(&self.cache_bytes.to_le_bytes());
        b[40..48].copy_from_slice(&self.band_bytes.to_le_bytes());
        let c = crc32c(&b[..BLOCK_BYTES - 4]);
        b[BLOCK_BYTES - 4..].copy_from_slice(&c.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<CapacityLabel, SuperblockError> {
        if b.len() != BLOCK_BYTES || b[0..4] != LABEL_MAGIC.to_le_bytes() {
            return Err(SuperblockError::NoMagic);
        }
        if crc32c(&b[..BLOCK_BYTES - 4]) != u32::from_le_bytes(b[BLOCK_BYTES - 4..].try_into().expect("4")) {
            return Err(SuperblockError::Checksum);
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != LABEL_VERSION {
            return Err(SuperblockError::Version(version));
        }
        if b[6] != ROLE_CAPACITY {
            return Err(SuperblockError::Malformed);
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        Ok(CapacityLabel {
            uuid: b[8..24].try_into().expect("16"),
            capacity_bytes: u64_at(24),
            cache_bytes: u64_at(32),
            band_bytes: u64_at(40),
        })
    }

    /// The label from its two copies (`at` and the block after): the first
    /// that checks. Both damaged or absent: the first copy's error.
    pub fn decode_pair(a: &[u8], b: &[u8]) -> Result<CapacityLabel, SuperblockError> {
        CapacityLabel::decode(a).or_else(|e| CapacityLabel::decode(b).map_err(|_| e))
    }
}

/// Little-endian serializer for the checkpoint.
#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn opt_u32(&mut self, v: Option<u32>) {
        self.u32(v.unwrap_or(u32::MAX));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("checkpoint truncated or malformed at byte {0}")]
pub struct CheckpointError(pub usize);

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> Superblock {
        Superblock {
            uuid: *b"0123456789abcdef",
            generation: 9,
            clean: true,
            chunk_bytes: 1 << 24,
            band_bytes: 1 << 28,
            write_unit_bytes: 1 << 16,
            log_free_chunks_min: 2,
            gc_free_bands_min: 2,
            l2p_dram_bytes: 0,
            layout: LAYOUT_BANDS,
            home_sums: false,
            cache_bytes: 1 << 33,
            capacity_bytes: 1 << 40,
            checkpoint_offset: 12345 << 12,
            checkpoint_bytes: 777,
            checkpoint_crc: 0xdead_beef,
            seq_floor: 1 << 40,
            volumes: vec![("default".into(), 1 << 30), ("tenant-2".into(), 5 << 30)],
            version: SUPERBLOCK_VERSION,
        }
    }

    #[test]
    fn superblock_round_trip_and_rejections() {
        let b = sb().encode();
        assert_eq!(Superblock::decode(&b), Ok(sb()));
        let mut bad = b.clone();
        bad[200] ^= 1;
        assert_eq!(Superblock::decode(&bad), Err(SuperblockError::Checksum));
        assert_eq!(Superblock::decode(&vec![0; BLOCK_BYTES]), Err(SuperblockError::NoMagic));
        // A budget round-trips; a version 4 superblock reads as one without.
        let paged = Superblock { l2p_dram_bytes: 1 << 30, ..sb() };
        assert_eq!(Superblock::decode(&paged.encode()), Ok(paged));
        let in_place = Superblock { layout: LAYOUT_IN_PLACE, ..sb() };
        assert_eq!(Superblock::decode(&in_place.encode()), Ok(in_place.clone()));
        let sums = Superblock { home_sums: true, ..in_place.clone() };
        assert_eq!(Superblock::decode(&sums.encode()), Ok(sums.clone()));
        // Before version 9 the byte is not read.
        let mut v8 = sums.encode();
        v8[4..6].copy_from_slice(&8u16.to_le_bytes());
        let c = crc32c(&v8[..BLOCK_BYTES - 4]);
        v8[BLOCK_BYTES - 4..].copy_from_slice(&c.to_le_bytes());
        assert_eq!(Superblock::decode(&v8), Ok(Superblock { version: 8, ..in_place }));
        let mut unknown = sb().encode();
        unknown[120] = 7;
        let c = crc32c(&unknown[..BLOCK_BYTES - 4]);
        unknown[BLOCK_BYTES - 4..].copy_from_slice(&c.to_le_bytes());
        assert_eq!(Superblock::decode(&unknown), Err(SuperblockError::Malformed));
        let mut v4 = sb().encode();
        v4[4..6].copy_from_slice(&4u16.to_le_bytes());
        let c = crc32c(&v4[..BLOCK_BYTES - 4]);
        v4[BLOCK_BYTES - 4..].copy_from_slice(&c.to_le_bytes());
        // (It says which version it was, which a clean one's checkpoint is.)
        assert_eq!(Superblock::decode(&v4), Ok(Superblock { version: 4, ..sb() }));
        let mut v3 = v4.clone();
        v3[4..6].copy_from_slice(&3u16.to_le_bytes());
        let c = crc32c(&v3[..BLOCK_BYTES - 4]);
        v3[BLOCK_BYTES - 4..].copy_from_slice(&c.to_le_bytes());
        assert_eq!(Superblock::decode(&v3), Err(SuperblockError::Version(3)));
    }

    #[test]
    fn label_round_trip_either_copy_and_rejections() {
        let l = CapacityLabel { uuid: new_uuid(), capacity_bytes: 1 << 40, cache_bytes: 1 << 33, band_bytes: 1 << 28 };
        let b = l.encode();
        assert_eq!(CapacityLabel::decode(&b), Ok(l.clone()));
        let mut bad = b.clone();
        bad[30] ^= 4;
        assert_eq!(CapacityLabel::decode(&bad), Err(SuperblockError::Checksum));
        assert_eq!(CapacityLabel::decode_pair(&bad, &b), Ok(l.clone()));
        let zero = vec![0u8; BLOCK_BYTES];
        assert_eq!(CapacityLabel::decode_pair(&zero, &zero), Err(SuperblockError::NoMagic));
        // A superblock is not a label.
        assert_eq!(CapacityLabel::decode(&sb().encode()), Err(SuperblockError::NoMagic));
        assert_ne!(new_uuid(), new_uuid());
        assert_eq!(uuid_text(&[0xab; 16]).len(), 36);
    }
}
