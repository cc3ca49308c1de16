//! Byte-granular requests for clients that never negotiated block sizes.
//!
//! Owns: the per-export write order lock ([`WriteOrder`]) and the
//! read-modify-write of the blocks a request covers only in part.
//!
//! A client that connects with `NBD_OPT_EXPORT_NAME`, or with `NBD_OPT_GO`
//! without asking for `NBD_INFO_BLOCK_SIZE`, may send any offset and length
//! (the NBD spec: the server SHOULD then support a minimum block size of 1).
//! The volumes work in whole blocks, so a write that covers a block only in
//! part reads the block, patches the bytes, and writes the whole block back.
//! Clients that negotiated block sizes keep the aligned path and get EINVAL
//! for a misaligned request, as they agreed.
//!
//! Invariants:
//! - a read-modify-write holds its export's [`WriteOrder`] exclusively, and
//!   every other data-changing request (on any connection of the export)
//!   holds it shared, so no write lands between a patch's read and its write
//!   back: bytes a sub-block write did not name are never reverted to older
//!   data, and two sub-block writes to different bytes of one block both
//!   survive. Reads take no lock (they see each block before or after).
//! - the patched blocks are written with the request's FUA flag through the
//!   volume's ordinary write, so an acknowledged sub-block write is exactly
//!   as durable as any other write (a FLUSH or FUA covers it; recovery sees
//!   whole blocks).
//! - TRIM of a partial block changes nothing in it (a trim is advisory);
//!   WRITE_ZEROES of a partial block writes zero bytes into it.
//!
//! Why one lock per export and not per block range: clients that need this
//! are rare (conformance suites, old kernels' 512-byte sectors); the shared
//! side costs an aligned write one uncontended atomic, and an exclusive
//! patch is a few microseconds, so striping would buy nothing measurable.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use sluice_volume::{Volume, VolumeError};

/// Orders sub-block read-modify-writes against every other write of one
/// export (see the module invariants).
#[derive(Debug, Default)]
pub(crate) struct WriteOrder(RwLock<()>);

impl WriteOrder {
    /// Held by aligned writes, trims and zeroes.
    pub(crate) fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Held across one read-modify-write.
    pub(crate) fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether `[off, off + len)` starts and ends on block boundaries.
pub(crate) fn aligned(off: u64, len: u64, block: u64) -> bool {
    off.is_multiple_of(block) && len.is_multiple_of(block)
}

/// The whole blocks covering `[off, off + len)`: (start, end).
pub(crate) fn covering(off: u64, len: u64, block: u64) -> (u64, u64) {
    let start = off - off % block;
    let end = (off + len).div_ceil(block) * block;
    (start, end)
}

/// The whole blocks inside `[off, off + len)`: (start, end), start ≤ end.
fn inside(off: u64, len: u64, block: u64) -> (u64, u64) {
    let start = off.div_ceil(block) * block;
    let end = ((off + len) / block * block).max(start);
    (start, end)
}

/// Reads `buf.len()` bytes at any offset (the range is in bounds).
pub(crate) fn read(v: &dyn Volume, off: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
    let block = v.block_bytes();
    let (start, end) = covering(off, buf.len() as u64, block);
    let mut whole = vec![0u8; (end - start) as usize];
    v.read(start, &mut whole)?;
    let skip = (off - start) as usize;
    buf.copy_from_slice(&whole[skip..skip + buf.len()]);
    Ok(())
}

/// Writes `data` at any offset by patching the covering blocks. The caller
/// holds the export's [`WriteOrder`] exclusively.
pub(crate) fn write(v: &dyn Volume, off: u64, data: &[u8], fua: bool) -> Result<(), VolumeError> {
    let block = v.block_bytes();
    let len = data.len() as u64;
    let (start, end) = covering(off, len, block);
    let mut whole = vec![0u8; (end - start) as usize];
    let b = block as usize;
    // Only the first and last blocks hold bytes the request does not name.
    if off != start {
        v.read(start, &mut whole[..b])?;
    }
    if off + len != end && (end - start > block || off == start) {
        let last = whole.len() - b;
        v.read(end - block, &mut whole[last..])?;
    }
    let skip = (off - start) as usize;
    whole[skip..skip + data.len()].copy_from_slice(data);
    v.write(start, &whole, fua)
}

/// Zeroes `[off, off + len)` at any offset: the partial edge blocks are
/// patched with zero bytes, and `middle` zeroes the whole blocks between
/// (its own way: by metadata, or as written data). The caller holds the
/// export's [`WriteOrder`] exclusively.
pub(crate) fn write_zeroes(
    v: &dyn Volume,
    off: u64,
    len: u64,
    fua: bool,
    middle: impl FnOnce(u64, u64) -> Result<(), VolumeError>,
) -> Result<(), VolumeError> {
    let block = v.block_bytes();
    let (mid_start, mid_end) = inside(off, len, block);
    if mid_start >= off + len {
        // Within one block.
        return write(v, off, &vec![0u8; len as usize], fua);
    }
    if off < mid_start {
        write(v, off, &vec![0u8; (mid_start - off) as usize], fua)?;
    }
    if mid_end > mid_start {
        middle(mid_start, mid_end - mid_start)?;
    }
    if off + len > mid_end {
        write(v, mid_end, &vec![0u8; (off + len - mid_end) as usize], fua)?;
    }
    Ok(())
}

/// Trims the whole blocks inside `[off, off + len)`; partial blocks keep
/// their data (a trim is a hint).
pub(crate) fn trim(v: &dyn Volume, off: u64, len: u64) -> Result<(), VolumeError> {
    let (start, end) = inside(off, len, v.block_bytes());
    if end > start {
        v.trim(start, end - start)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covering_and_inside_round_outward_and_inward() {
        assert_eq!(covering(0, 4096, 4096), (0, 4096));
        assert_eq!(covering(1, 1, 4096), (0, 4096));
        assert_eq!(covering(4095, 2, 4096), (0, 8192));
        assert_eq!(covering(512, 8192, 4096), (0, 12288));
        assert_eq!(inside(1, 1, 4096), (4096, 4096));
        assert_eq!(inside(512, 8192, 4096), (4096, 8192));
        assert_eq!(inside(4096, 4096, 4096), (4096, 8192));
        assert!(aligned(8192, 4096, 4096));
        assert!(!aligned(8192, 512, 4096));
    }
}
