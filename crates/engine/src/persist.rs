//! Superblock and clean-shutdown checkpoint (docs/format.md).
//!
//! The superblock lives in the first two blocks of the cache device (two
//! copies; the valid one with the higher generation wins) and records the
//! geometry, the volumes, whether the engine was shut down cleanly, and where
//! the checkpoint is. The checkpoint — the whole in-memory state: maps, chunk
//! and band states — is written at clean shutdown into a region reserved at
//! the end of the capacity device, with its CRC32C in the superblock.
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
pub const SUPERBLOCK_VERSION: u16 = 2;
pub const NAME_BYTES_MAX: usize = 63;
/// Fixed part of the superblock before the volume table.
const SB_FIXED_BYTES: usize = 96;
/// Per volume: name length u8, name (63 bytes), size u64.
const SB_VOLUME_BYTES: usize = 72;
pub const VOLUMES_MAX: usize = (BLOCK_BYTES - SB_FIXED_BYTES - 4) / SB_VOLUME_BYTES;
const _: () = assert!(SB_FIXED_BYTES + VOLUMES_MAX * SB_VOLUME_BYTES + 4 <= BLOCK_BYTES);

/// The superblock's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub generation: u64,
    pub clean: bool,
    pub chunk_bytes: u64,
    pub band_bytes: u64,
    pub write_unit_bytes: u64,
    pub log_free_chunks_min: u32,
    pub gc_free_bands_min: u32,
    pub cache_bytes: u64,
    pub capacity_bytes: u64,
    /// Byte offset and length of the checkpoint on the capacity device.
    pub checkpoint_offset: u64,
    pub checkpoint_bytes: u64,
    pub checkpoint_crc: u32,
    pub volumes: Vec<(String, u64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SuperblockError {
    #[error("no Sluice superblock on the cache device")]
    NoMagic,
    #[error("superblock checksum mismatch")]
    Checksum,
    #[error("unsupported superblock version {0}")]
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
        put(&SUPERBLOCK_VERSION.to_le_bytes());
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
        put(&[0u8; 8]); // reserved
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
        if version != SUPERBLOCK_VERSION {
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
            volumes,
        })
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

/// The matching reader: every read is bounds-checked.
pub struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("checkpoint truncated or malformed at byte {0}")]
pub struct CheckpointError(pub usize);

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { b, at: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], CheckpointError> {
        let s = self.b.get(self.at..self.at + n).ok_or(CheckpointError(self.at))?;
        self.at += n;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8, CheckpointError> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32, CheckpointError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    pub fn u64(&mut self) -> Result<u64, CheckpointError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    pub fn opt_u32(&mut self) -> Result<Option<u32>, CheckpointError> {
        let v = self.u32()?;
        Ok((v != u32::MAX).then_some(v))
    }
    pub fn at(&self) -> usize {
        self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> Superblock {
        Superblock {
            generation: 9,
            clean: true,
            chunk_bytes: 1 << 24,
            band_bytes: 1 << 28,
            write_unit_bytes: 1 << 16,
            log_free_chunks_min: 2,
            gc_free_bands_min: 2,
            cache_bytes: 1 << 33,
            capacity_bytes: 1 << 40,
            checkpoint_offset: 12345 << 12,
            checkpoint_bytes: 777,
            checkpoint_crc: 0xdead_beef,
            volumes: vec![("default".into(), 1 << 30), ("tenant-2".into(), 5 << 30)],
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
    }

    #[test]
    fn reader_rejects_truncation() {
        let mut w = Writer::default();
        w.u64(5);
        w.opt_u32(None);
        let mut r = Reader::new(&w.0);
        assert_eq!(r.u64(), Ok(5));
        assert_eq!(r.opt_u32(), Ok(None));
        assert_eq!(r.u8(), Err(CheckpointError(12)));
    }
}
