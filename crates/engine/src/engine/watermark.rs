//! The log's flushed watermark kept where recovery finds it, so that a
//! record a completed FLUSH (or FUA) covered is provably durable on restart
//! even when no later record says so (docs/format.md, "Cache device:
//! flushed watermark").
//!
//! Owns: the two watermark slots (blocks 6 and 7 of chunk 0 on the cache
//! device), the claims written to them, and reading them back.
//!
//! Claimed: what a client's FLUSH round (flushes.rs) or FUA request
//! (`Engine::flush_cache_for_client`) made durable, before it is answered.
//! The engine's own flushes (compaction, GC, cleaning, recovery) claim
//! nothing: what they cover that a client was promised is claimed by that
//! client's FLUSH or FUA, and a claim per internal flush changed the
//! virtual-time schedule of every bench row for no guarantee.
//!
//! Why: a record header carries the watermark as it was when the record
//! was written (`flushed_lsn`), so it travels only in *later* headers. The
//! newest records a flush made durable were claimed by nobody until the
//! next record, and a header damaged among them was taken for a torn tail:
//! its blocks silently read back their previous versions. Before a
//! client's FLUSH or FUA is answered, the engine now writes a claim — the
//! highest LSN durable for it (by this flush, or an earlier one that
//! claimed nothing) — into one of two slots, unless one as high is on the
//! device already. Recovery takes
//! the highest valid claim as a watermark like any header's, so a record at
//! or below it that does not read back is damage, refused and reported.
//!
//! Invariants:
//! - A claim never claims more than a completed flush made durable: it is
//!   written after the flush returned, with the LSN snapshot that flush
//!   covered. So any claim recovery reads is true, whichever slot a torn or
//!   reordered claim write left behind, and the highest valid one wins.
//! - A claim is on the device before the FLUSH (or FUA write) it covers is
//!   answered — the request's own, or a higher one whose write completed
//!   (`Claims`) — so a process killed after the answer has it on the device
//!   (it becomes durable against power loss with the next flush; until
//!   then, as before, only later headers claim those records).
//! - A slot that does not check (torn, flipped) is ignored, never damage:
//!   claims are written without a flush of their own.
//! - Chunks of fewer than 8 blocks have no room for the slots: no claims.

use std::sync::{Mutex, PoisonError};

use super::{crc32c, read_at, write_at, BlockDevice, DeviceError, Engine, VolumeError, BLOCK_BYTES, BS};

pub const WATERMARK_MAGIC: u32 = 0x534c_4657; // "SLFW"
const WATERMARK_VERSION: u16 = 1;
/// Blocks of chunk 0 (superblock 0-1, marks 2-3, disk identity 4-5) that
/// hold the two watermark slots.
pub(super) const WATERMARK_SLOTS: [u64; 2] = [6, 7];

/// Whether a log of chunks of `blocks_per_chunk` blocks keeps the slots.
pub(super) fn has_slots(blocks_per_chunk: u64) -> bool {
    blocks_per_chunk > WATERMARK_SLOTS[1]
}

fn encode(tag: u32, generation: u64, lsn: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_BYTES];
    b[0..4].copy_from_slice(&WATERMARK_MAGIC.to_le_bytes());
    b[4..6].copy_from_slice(&WATERMARK_VERSION.to_le_bytes());
    b[8..12].copy_from_slice(&tag.to_le_bytes());
    b[16..24].copy_from_slice(&generation.to_le_bytes());
    b[24..32].copy_from_slice(&lsn.to_le_bytes());
    let c = crc32c(&b[..BLOCK_BYTES - 4]);
    b[BLOCK_BYTES - 4..].copy_from_slice(&c.to_le_bytes());
    b
}

/// A slot's claimed LSN, if it holds a claim of this engine that checks.
fn decode(b: &[u8], tag: u32) -> Option<u64> {
    if b.len() != BLOCK_BYTES || b[0..4] != WATERMARK_MAGIC.to_le_bytes() {
        return None;
    }
    if crc32c(&b[..BLOCK_BYTES - 4]) != u32::from_le_bytes(b[BLOCK_BYTES - 4..].try_into().expect("4")) {
        return None;
    }
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
    let ok = u16::from_le_bytes([b[4], b[5]]) == WATERMARK_VERSION && b[8..12] == tag.to_le_bytes();
    ok.then(|| u64_at(24))
}

/// The highest LSN a valid slot claims durable (0 if none does).
pub(super) fn read_claimed(cache: &dyn BlockDevice, tag: u32, blocks_per_chunk: u64) -> Result<u64, DeviceError> {
    if !has_slots(blocks_per_chunk) {
        return Ok(0);
    }
    let mut best = 0;
    for slot in WATERMARK_SLOTS {
        if let Some(lsn) = decode(&read_at(cache, slot * BS, BLOCK_BYTES)?, tag) {
            best = best.max(lsn);
        }
    }
    Ok(best)
}

/// The claims this engine wrote: how many (the next one's slot and
/// generation) and the highest LSN a completed claim write holds. Behind
/// its own lock, held across the slot write: a FLUSH round claims without
/// the engine lock, a FUA write under it (engine lock first, then this),
/// and a claim counts only once its write completed — so a request that
/// finds its records claimed already is answered after that claim is on
/// the device, and claims land in rising order (the two slots hold the two
/// highest).
#[derive(Debug, Default)]
pub(super) struct Claims {
    state: Mutex<ClaimState>,
}

#[derive(Debug, Default)]
struct ClaimState {
    written: u64,
    lsn: u64,
}

impl Claims {
    /// An engine opened with its log at `lsn`: only records written from
    /// now on are claimed. After a recovery the records up to `lsn` that it
    /// found torn count as flushed in the log's watermark (nothing is left
    /// to flush of them), but they are only *accepted* once the gap record
    /// naming them is durable: a claim over them before that would make a
    /// crash during the reopen look like damage.
    pub(super) fn after(lsn: u64) -> Claims {
        Claims { state: Mutex::new(ClaimState { written: 0, lsn }) }
    }
}

impl Engine {
    /// A flush just made every record up to `lsn` durable: claim it, unless
    /// a claim as high was written already (or there is no room for one).
    pub(super) fn claim_flushed(&self, tag: u32, blocks_per_chunk: u64, lsn: u64) -> Result<(), VolumeError> {
        if !has_slots(blocks_per_chunk) {
            return Ok(());
        }
        let mut st = self.claims.state.lock().unwrap_or_else(PoisonError::into_inner);
        if st.lsn >= lsn {
            return Ok(());
        }
        let n = st.written;
        write_at(&*self.cache, WATERMARK_SLOTS[(n % 2) as usize] * BS, &encode(tag, n, lsn))?;
        (st.written, st.lsn) = (n + 1, lsn);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_media::memory::MemoryDevice;

    #[test]
    fn the_highest_valid_claim_of_this_engine_wins_and_damaged_slots_are_ignored() {
        let d = MemoryDevice::new(16 * BS, 4096);
        assert_eq!(read_claimed(&d, 7, 16).unwrap(), 0, "no claim yet");
        write_at(&d, 6 * BS, &encode(7, 0, 40)).unwrap();
        write_at(&d, 7 * BS, &encode(7, 1, 55)).unwrap();
        assert_eq!(read_claimed(&d, 7, 16).unwrap(), 55);
        assert_eq!(read_claimed(&d, 8, 16).unwrap(), 0, "another engine's claims");
        assert_eq!(read_claimed(&d, 7, 4).unwrap(), 0, "chunks too small for the slots");
        let mut b = encode(7, 1, 55);
        b[25] ^= 1;
        write_at(&d, 7 * BS, &b).unwrap();
        assert_eq!(read_claimed(&d, 7, 16).unwrap(), 40, "a flipped slot is ignored, the other one stands");
    }
}
