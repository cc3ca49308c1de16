//! On-media layout of the write log's records (see docs/format.md).
//!
//! A record is one header block followed by its data blocks, written with a
//! single device write into a chunk of the cache device. The header names the
//! volume, a sequence number, and for each data block its LBA and CRC32C, and
//! ends with a CRC32C of the header itself, so recovery can tell a whole
//! record from a torn one and rebuild the map from the log alone.

pub const BLOCK_BYTES: usize = 4096;
pub const RECORD_MAGIC: u32 = 0x534c_5243; // "SLRC"
pub const FORMAT_VERSION: u16 = 1;
/// Header: magic u32, version u16, kind u8, pad u8, seq u64, volume u32,
/// count u32, then `count` entries of (lba u64, crc u32, pad u32), then at the
/// end of the block the header CRC u32 over bytes [0, 4092).
pub const HEADER_FIXED_BYTES: usize = 24;
pub const ENTRY_BYTES: usize = 16;
/// Most data blocks one record carries.
pub const RECORD_BLOCKS_MAX: usize = (BLOCK_BYTES - HEADER_FIXED_BYTES - 4) / ENTRY_BYTES;
const _: () = assert!(HEADER_FIXED_BYTES + RECORD_BLOCKS_MAX * ENTRY_BYTES + 4 <= BLOCK_BYTES);

/// What a record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// Data blocks follow the header.
    Write = 1,
    /// The listed LBAs were trimmed / zeroed; no data follows.
    Trim = 2,
}

/// CRC32C (Castagnoli); hardware-accelerated (SSE4.2 / ARMv8 CRC) where the
/// CPU has it.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Encode a record header into `out` (one block).
pub fn encode_header(out: &mut [u8], kind: RecordKind, seq: u64, volume: u32, entries: &[(u64, u32)]) {
    assert_eq!(out.len(), BLOCK_BYTES);
    assert!(entries.len() <= RECORD_BLOCKS_MAX);
    out.fill(0);
    out[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    out[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    out[6] = kind as u8;
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    out[16..20].copy_from_slice(&volume.to_le_bytes());
    out[20..24].copy_from_slice(&(entries.len() as u32).to_le_bytes());
    for (i, (lba, crc)) in entries.iter().enumerate() {
        let o = HEADER_FIXED_BYTES + i * ENTRY_BYTES;
        out[o..o + 8].copy_from_slice(&lba.to_le_bytes());
        out[o + 8..o + 12].copy_from_slice(&crc.to_le_bytes());
    }
    let c = crc32c(&out[..BLOCK_BYTES - 4]);
    out[BLOCK_BYTES - 4..].copy_from_slice(&c.to_le_bytes());
}

/// A decoded header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: RecordKind,
    pub seq: u64,
    pub volume: u32,
    pub entries: Vec<(u64, u32)>,
}

/// Why a block is not a valid header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("no record magic")]
    NoMagic,
    #[error("unsupported format version {0}")]
    Version(u16),
    #[error("header checksum mismatch")]
    Checksum,
    #[error("malformed header")]
    Malformed,
}

pub fn decode_header(b: &[u8]) -> Result<Header, HeaderError> {
    if b.len() != BLOCK_BYTES || b[0..4] != RECORD_MAGIC.to_le_bytes() {
        return Err(HeaderError::NoMagic);
    }
    let stored = u32::from_le_bytes(b[BLOCK_BYTES - 4..].try_into().expect("4 bytes"));
    if crc32c(&b[..BLOCK_BYTES - 4]) != stored {
        return Err(HeaderError::Checksum);
    }
    let version = u16::from_le_bytes([b[4], b[5]]);
    if version != FORMAT_VERSION {
        return Err(HeaderError::Version(version));
    }
    let kind = match b[6] {
        1 => RecordKind::Write,
        2 => RecordKind::Trim,
        _ => return Err(HeaderError::Malformed),
    };
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let count = u32_at(20) as usize;
    if count > RECORD_BLOCKS_MAX {
        return Err(HeaderError::Malformed);
    }
    let entries = (0..count)
        .map(|i| {
            let o = HEADER_FIXED_BYTES + i * ENTRY_BYTES;
            (u64_at(o), u32_at(o + 8))
        })
        .collect();
    Ok(Header { kind, seq: u64_at(8), volume: u32_at(16), entries })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_answer() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn header_round_trip_and_rejections() {
        let mut b = vec![0u8; BLOCK_BYTES];
        let entries: Vec<(u64, u32)> = (0..RECORD_BLOCKS_MAX as u64).map(|i| (i * 3, i as u32 ^ 0xabcd)).collect();
        encode_header(&mut b, RecordKind::Write, 42, 7, &entries);
        let h = decode_header(&b).unwrap();
        assert_eq!((h.kind, h.seq, h.volume), (RecordKind::Write, 42, 7));
        assert_eq!(h.entries, entries);
        let mut torn = b.clone();
        torn[100] ^= 1;
        assert_eq!(decode_header(&torn), Err(HeaderError::Checksum));
        assert_eq!(decode_header(&vec![0u8; BLOCK_BYTES]), Err(HeaderError::NoMagic));
    }
}
