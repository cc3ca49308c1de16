//! The identity of a disk an engine was attached to with its data
//! (`EngineConfig::attached`): nothing of Sluice's is written on such a disk,
//! so the cache device keeps what tells the disk apart — its size and a
//! fingerprint — and opening refuses a disk that is not the one the cache
//! belongs to, or one changed behind the cache's back (docs/format.md,
//! "Cache device: disk identity").
//!
//! Owns: the fingerprint (`DiskIdentity`), where it lives (blocks 4 and 5
//! of the cache device, two copies, the higher generation wins), and
//! keeping it true while the engine itself writes the disk: before a home
//! write changes a sampled block, the new CRC is recorded (durably, as
//! `pending`) beside the old one; once the disk is flushed, the new one is
//! what the disk holds.
//!
//! The fingerprint: the CRC32C of each of 16 sampled 4 KiB blocks — the
//! first 8 (partition tables and file-system superblocks live there, and
//! every mount changes them) and 8 spread evenly to the last block (where a
//! GPT keeps its backup). A disk of the same size whose sampled blocks all
//! hold the same bytes passes for the same disk: the fingerprint catches a
//! different disk and a file system mounted without Sluice, not a write
//! that touched none of the samples.
//!
//! Invariants: every sampled block of the disk holds `crc`, or `pending`
//! when one is recorded (asserted by `check` on opening: a mismatch is a
//! changed disk); at most one home write per sampled block is unflushed.

use super::{crc32c, flush, read_at, write_at, BlockDevice, DeviceError, Engine, VolumeError, BLOCK_BYTES, BS};

/// Blocks sampled at the start of the disk, and spread over the rest.
const FIRST_SAMPLES: u64 = 8;
const SPREAD_SAMPLES: u64 = 8;
const MAGIC: u32 = 0x534C_4449; // "SLDI"
const VERSION: u16 = 1;
/// Where the two copies are: blocks 4 and 5 of the cache device (chunk 0).
pub(super) const IDENTITY_BLOCK: u64 = 4;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Sample {
    /// The disk block.
    block: u64,
    /// What the disk holds there, as far as a flush made known.
    crc: u32,
    /// A home write of this block not yet flushed: the CRC it writes.
    pending: Option<u32>,
}

/// The disk's size and fingerprint, and the generation of the copy last
/// written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct DiskIdentity {
    uuid: [u8; 16],
    disk_bytes: u64,
    generation: u64,
    samples: Vec<Sample>,
}

/// The sampled blocks of a disk of `blocks` blocks, in order, each once.
fn sampled_blocks(blocks: u64) -> Vec<u64> {
    let mut out: Vec<u64> = (0..FIRST_SAMPLES.min(blocks)).collect();
    if blocks > 0 {
        out.extend((1..=SPREAD_SAMPLES).map(|k| k * (blocks - 1) / SPREAD_SAMPLES));
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// A sampled block that does not hold what the cache expects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedBlock {
    /// Its byte offset on the disk.
    pub offset: u64,
    pub expected: u32,
    pub found: u32,
}

impl DiskIdentity {
    /// The identity of `disk` as it is now, for engine `uuid`.
    pub(super) fn of(disk: &dyn BlockDevice, uuid: [u8; 16]) -> Result<DiskIdentity, DeviceError> {
        let disk_bytes = disk.info().capacity_bytes;
        let samples = (sampled_blocks(disk_bytes / BS).into_iter())
            .map(|block| Ok(Sample { block, crc: crc32c(&read_at(disk, block * BS, BLOCK_BYTES)?), pending: None }))
            .collect::<Result<_, DeviceError>>()?;
        Ok(DiskIdentity { uuid, disk_bytes, generation: 0, samples })
    }

    /// The sampled blocks of `disk` that hold neither what the identity
    /// records nor what a pending write would have put there (empty: the
    /// same disk, unchanged). When none differs, the identity takes what
    /// each holds, pending or not: a write pending at a crash was kept or
    /// lost, and only this engine's next flush may settle its own writes
    /// (`flushed`), never an earlier one's.
    pub(super) fn check(&mut self, disk: &dyn BlockDevice) -> Result<Vec<ChangedBlock>, DeviceError> {
        let mut out = Vec::new();
        let mut found = Vec::with_capacity(self.samples.len());
        for s in &self.samples {
            let crc = crc32c(&read_at(disk, s.block * BS, BLOCK_BYTES)?);
            if crc != s.crc && Some(crc) != s.pending {
                out.push(ChangedBlock { offset: s.block * BS, expected: s.crc, found: crc });
            }
            found.push(crc);
        }
        if out.is_empty() {
            for (s, crc) in self.samples.iter_mut().zip(found) {
                (s.crc, s.pending) = (crc, None);
            }
        }
        Ok(out)
    }

    /// Take what `disk` holds now as its identity (a clean cache re-attached
    /// to a changed disk, after dropping its copies).
    pub(super) fn retake(&mut self, disk: &dyn BlockDevice) -> Result<(), DeviceError> {
        let generation = self.generation;
        *self = DiskIdentity::of(disk, self.uuid)?;
        self.generation = generation;
        Ok(())
    }

    /// Whether writing `data` at disk block `first` writes a sampled block
    /// whose last write, of other bytes, is still unflushed (then the disk
    /// must be flushed first: a sample records one pending write, the last
    /// — even one that puts back what a flush made durable).
    pub(super) fn needs_flush_before(&self, first: u64, data: &[u8]) -> bool {
        self.touched(first, data).any(|(s, crc)| s.pending.is_some_and(|p| p != crc))
    }

    /// A home write of `data` at disk block `first` is about to be issued:
    /// the sampled blocks it changes record its CRC as pending. Returns
    /// whether anything changed (then `save` before the write).
    pub(super) fn before_write(&mut self, first: u64, data: &[u8]) -> bool {
        let changes: Vec<(usize, u32)> = (self.touched(first, data))
            .filter(|(s, crc)| s.pending.is_none() && *crc != s.crc)
            .map(|(s, crc)| (self.samples.iter().position(|x| x.block == s.block).expect("a sample"), crc))
            .collect();
        assert!(
            self.touched(first, data).all(|(s, crc)| s.pending.is_none_or(|p| p == crc)),
            "a sampled block written twice between flushes"
        );
        for &(i, crc) in &changes {
            assert!(
                self.samples[i].pending.is_none(),
                "two unflushed writes of sampled block {}",
                self.samples[i].block
            );
            self.samples[i].pending = Some(crc);
        }
        !changes.is_empty()
    }

    /// The disk was flushed: every pending write is what it holds.
    pub(super) fn flushed(&mut self) {
        for s in &mut self.samples {
            if let Some(p) = s.pending.take() {
                s.crc = p;
            }
        }
    }

    /// Whether `blocks` disk blocks from `first` hold a sampled one.
    pub(super) fn samples_any(&self, first: u64, blocks: u64) -> bool {
        let i = self.samples.partition_point(|s| s.block < first);
        self.samples.get(i).is_some_and(|s| s.block < first + blocks)
    }

    /// The sampled blocks a write of `data` at `first` covers, with the CRC
    /// it writes to each.
    fn touched<'a>(&'a self, first: u64, data: &'a [u8]) -> impl Iterator<Item = (&'a Sample, u32)> + 'a {
        let end = first + (data.len() / BLOCK_BYTES) as u64;
        let from = self.samples.partition_point(|s| s.block < first);
        self.samples[from..]
            .iter()
            .take_while(move |s| s.block < end)
            .map(move |s| (s, crc32c(&data[((s.block - first) * BS) as usize..][..BLOCK_BYTES])))
    }

    /// Write it (the copy the next generation names), then flush.
    pub(super) fn save(&mut self, cache: &dyn BlockDevice) -> Result<(), DeviceError> {
        self.generation += 1;
        let at = (IDENTITY_BLOCK + self.generation % 2) * BS;
        write_at(cache, at, &self.encode())?;
        flush(cache)
    }

    fn encode(&self) -> Vec<u8> {
        let mut w = crate::persist::Writer::default();
        w.u32(MAGIC);
        w.0.extend_from_slice(&VERSION.to_le_bytes());
        w.0.extend_from_slice(&[0; 2]);
        w.0.extend_from_slice(&self.uuid);
        w.u64(self.generation);
        w.u64(self.disk_bytes);
        w.u32(self.samples.len() as u32);
        for s in &self.samples {
            w.u64(s.block);
            w.u32(s.crc);
            w.u32(s.pending.unwrap_or(0));
            w.0.push(s.pending.is_some() as u8);
        }
        let mut b = w.0;
        assert!(b.len() <= BLOCK_BYTES - 4);
        b.resize(BLOCK_BYTES - 4, 0);
        let crc = crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8], uuid: [u8; 16]) -> Option<DiskIdentity> {
        if b.len() != BLOCK_BYTES || crc32c(&b[..BLOCK_BYTES - 4]).to_le_bytes() != b[BLOCK_BYTES - 4..] {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        if u32_at(0) != MAGIC || b[4..6] != VERSION.to_le_bytes() || b[8..24] != uuid {
            return None;
        }
        let n = u32_at(40) as usize;
        if 44 + n * 17 > BLOCK_BYTES - 4 {
            return None;
        }
        let samples = (0..n)
            .map(|i| {
                let o = 44 + i * 17;
                Sample { block: u64_at(o), crc: u32_at(o + 8), pending: (b[o + 16] == 1).then(|| u32_at(o + 12)) }
            })
            .collect();
        Some(DiskIdentity { uuid, generation: u64_at(24), disk_bytes: u64_at(32), samples })
    }

    /// The identity engine `uuid` saved on `cache`: the copy of the higher
    /// generation among those that check.
    pub(super) fn read(cache: &dyn BlockDevice, uuid: [u8; 16]) -> Result<Option<DiskIdentity>, DeviceError> {
        let a = DiskIdentity::decode(&read_at(cache, IDENTITY_BLOCK * BS, BLOCK_BYTES)?, uuid);
        let b = DiskIdentity::decode(&read_at(cache, (IDENTITY_BLOCK + 1) * BS, BLOCK_BYTES)?, uuid);
        Ok(a.into_iter().chain(b).max_by_key(|d| d.generation))
    }
}

impl Engine {
    /// A clean cache attached to a disk that changed: every cached copy
    /// leaves the cache (a tombstone each, flushed), then what the disk
    /// holds now becomes its identity. Returns the copies dropped.
    pub(super) fn drop_cached_copies(&self) -> Result<u64, VolumeError> {
        let mut inner = self.lock();
        let mut cached: Vec<(u32, u64)> = inner.log.current().map(|(_, v, lba)| (v, lba)).collect();
        cached.sort_unstable();
        let mut i = 0;
        while i < cached.len() {
            let (vol, first) = cached[i];
            let n =
                cached[i..].iter().enumerate().take_while(|&(k, &(v, l))| v == vol && l == first + k as u64).count();
            self.trim_logged(&mut inner, vol, first..first + n as u64, false)?;
            i += n;
        }
        self.flush_cache(&mut inner)?;
        let id = inner.disk_id.as_mut().expect("attached");
        id.retake(&*self.capacity)?;
        id.save(&*self.cache)?;
        Ok(cached.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_media::MemoryDevice;

    fn disk(blocks: u64) -> MemoryDevice {
        let d = MemoryDevice::new(blocks * BS, 4096);
        for b in 0..blocks {
            write_at(&d, b * BS, &[b as u8 + 1; BLOCK_BYTES]).unwrap();
        }
        d
    }

    #[test]
    fn the_samples_are_the_first_blocks_and_a_spread_to_the_last() {
        assert_eq!(sampled_blocks(1000), [0, 1, 2, 3, 4, 5, 6, 7, 124, 249, 374, 499, 624, 749, 874, 999]);
        assert_eq!(sampled_blocks(3), [0, 1, 2]);
        assert!(sampled_blocks(0).is_empty());
    }

    #[test]
    fn a_write_behind_the_cache_is_found_and_the_engine_own_writes_are_not() {
        let (d, cache) = (disk(64), MemoryDevice::new(16 * BS, 4096));
        let mut id = DiskIdentity::of(&d, [7; 16]).unwrap();
        id.save(&cache).unwrap();
        assert_eq!(DiskIdentity::read(&cache, [7; 16]).unwrap().as_ref(), Some(&id));
        assert_eq!(DiskIdentity::read(&cache, [8; 16]).unwrap(), None, "another engine's");
        // The engine writes block 0 home: pending, saved, then written.
        let new = [0xAAu8; BLOCK_BYTES];
        assert!(id.before_write(0, &new));
        id.save(&cache).unwrap();
        let saved = DiskIdentity::read(&cache, [7; 16]).unwrap().unwrap();
        assert!(saved.clone().check(&d).unwrap().is_empty(), "before the write lands");
        write_at(&d, 0, &new).unwrap();
        let mut after = saved.clone();
        assert!(after.check(&d).unwrap().is_empty(), "after it lands");
        assert_eq!(after.samples[0], Sample { block: 0, crc: crc32c(&new), pending: None }, "settled");
        assert!(id.needs_flush_before(0, &[0xBB; BLOCK_BYTES]), "a second unflushed write of a sample");
        assert!(id.needs_flush_before(0, &[1u8; BLOCK_BYTES]), "even one that puts back the durable bytes");
        id.flushed();
        assert!(!id.needs_flush_before(0, &[0xBB; BLOCK_BYTES]));
        // Someone else writes block 7: found.
        write_at(&d, 7 * BS, &[0; BLOCK_BYTES]).unwrap();
        let changed = id.check(&d).unwrap();
        assert_eq!(changed.len(), 1);
        assert_eq!(changed[0].offset, 7 * BS);
        id.retake(&d).unwrap();
        assert!(id.check(&d).unwrap().is_empty());
    }
}
