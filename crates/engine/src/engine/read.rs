//! The read path: from L2P entries to bytes, checked.
//!
//! A read takes its blocks' places and CRCs from the L2P under the lock
//! (`ReadSnapshot`), then does its device I/O without it when a read permit
//! is free (the devices' queue depth bounds them), and is good if the
//! generation of every place it read is the same afterwards: a chunk's
//! blocks are overwritten only after it is reopened (new epoch) and a
//! band's only after it is discarded (new `gen`). Runs of blocks stored back
//! to back are one device read; every block is checked against its CRC, and
//! a mismatch is an error naming the block, never data.

use super::home_sums::HomeSums;
use super::{
    crc32c, l2p, sync_io, BlockDevice, Engine, Inner, IoBuf, IoOp, IoRequest, L2p, Loc, VolumeError, BLOCK_BYTES, BS,
};

/// A read's claim on a place outside the lock (`Engine::unlocked_reads`).
pub(super) struct ReadPermit<'a>(&'a Engine);

impl Drop for ReadPermit<'_> {
    fn drop(&mut self) {
        self.0.unlocked_reads.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Inner {
    /// The generation of the chunk or band holding `l`: a read done outside
    /// the lock is good if the generation is the same after it, because a
    /// chunk's blocks are overwritten only after it is reopened (new epoch)
    /// and a band's only after it is discarded (new `gen`).
    pub(super) fn generation(&self, l: Loc) -> u64 {
        if let Some(cb) = l.cache_block() {
            self.log.chunk_of(cb).0.epoch()
        } else if let Some(pb) = l.capacity_block() {
            self.bands[(pb / self.blocks_per_band()) as usize].gen()
        } else {
            0
        }
    }
}

impl Engine {
    /// A read without the engine lock, if this volume's map allows it
    /// (resident, not in place) and nothing interfered; None sends the read
    /// to the locked path (`read_volume`), which answers with authority.
    ///
    /// The places and CRCs are loaded from the shared map (`Resident`),
    /// the blocks read and checked, and the result kept only if no chunk
    /// was reopened and no band discarded meanwhile (`Engine::reuses`,
    /// bumped before anything is written to a reused place): then every
    /// block read was the data its entry named when loaded. A check that
    /// fails may be a race (a place published with the other copy's CRC)
    /// or real damage; the locked path tells which. A device error from a
    /// place not reused is the device's, and is the answer.
    pub(super) fn read_lockless(
        &self,
        vol: usize,
        lbas: std::ops::Range<usize>,
        offset: u64,
        buf: &mut [u8],
    ) -> Option<Result<(), VolumeError>> {
        use std::sync::atomic::{fence, Ordering};
        let map = self.lockless_maps[vol].as_ref()?;
        let _permit = if self.reads_inline { None } else { Some(self.unlocked_read_permit()?) };
        if self.closed.load(Ordering::Acquire) {
            return Some(Err(VolumeError::ReadOnly));
        }
        let before = self.reuses.load(Ordering::Acquire);
        let mut snap = SNAPSHOT.with(|s| s.take());
        snap.load_resident(map, lbas);
        #[cfg(test)]
        if let Some(f) = BETWEEN_LOAD_AND_READ.with(|h| h.take()) {
            f();
        }
        let r = self.read_blocks(&snap.locs, &snap.crcs, offset, buf, None);
        SNAPSHOT.with(|s| s.replace(snap));
        // The data read above is ordered before the second look.
        fence(Ordering::Acquire);
        if matches!(r, Err(VolumeError::Corrupt { .. })) || self.reuses.load(Ordering::Relaxed) != before {
            return None;
        }
        if r.is_ok() {
            self.read_bytes.add(buf.len() as u64);
        }
        Some(r.map(|_| ()))
    }

    /// Room for one more read (or home write past the log, handle.rs)
    /// outside the lock, if there is any.
    pub(super) fn unlocked_read_permit(&self) -> Option<ReadPermit<'_>> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.unlocked_reads.fetch_add(1, Relaxed) < self.unlocked_reads_max {
            Some(ReadPermit(self))
        } else {
            self.unlocked_reads.fetch_sub(1, Relaxed);
            None
        }
    }

    /// Read blocks `lbas` of volume `vol` into `buf` (`offset`: their byte
    /// in the volume, for errors). `inner` is the lock, taken after
    /// `permit`; with a permit the device reads happen without it. Returns
    /// how many blocks were read from their homes (in place).
    pub(super) fn read_volume(
        &self,
        mut inner: std::sync::MutexGuard<'_, Inner>,
        permit: Option<ReadPermit<'_>>,
        vol: usize,
        lbas: std::ops::Range<usize>,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<u64, VolumeError> {
        let home = inner.in_place().then(|| inner.home(vol, lbas.start as u64));
        let Some(_permit) = permit else {
            // No room for another request outside the lock: read under it.
            let i = &mut *inner;
            return self.read_mapped(&i.vols[vol].l2p, &mut i.home_sums, lbas, offset, buf, home);
        };
        // Under the lock: where the blocks are, their CRCs, and the
        // generation of each place. Then the device reads without the
        // lock, so reads of slow media overlap with each other and with
        // writes.
        // The snapshot goes into the thread's own vectors, kept between
        // reads: no allocation per read.
        let mut snap = SNAPSHOT.with(|s| s.take());
        let i = &mut *inner;
        if let Err(e) = snap.load(&i.vols[vol].l2p, lbas.clone()).and_then(|()| snap.home_sums(&mut i.home_sums, home))
        {
            SNAPSHOT.with(|s| s.replace(snap));
            return Err(e);
        }
        snap.gens.clear();
        snap.gens.extend(snap.locs.iter().map(|&l| inner.generation(l)));
        drop(inner);
        let unlocked = self.read_blocks(&snap.locs, &snap.crcs, offset, buf, home);
        // A place reused meanwhile (its chunk reopened, its band
        // discarded) may have handed back someone else's data or an
        // error: read again under the lock. A block merely rewritten or
        // moved meanwhile read its previous version, which is as good
        // an answer as the new one to a read that raced the write; an
        // error from a place that was not reused is the device's.
        // The plain lock, records in flight or not: data read before a
        // shutdown is still good, and a place a reservation reused shows
        // in its generation.
        // A home that did not match its sum may have been written
        // meanwhile (its sum is then 0 under the lock: home_sums.rs): read
        // again under the lock, where a nonzero sum means no write of it is
        // under way, so a mismatch there is damage.
        let mut inner = self.lock_raw();
        let reused = snap.locs.iter().zip(&snap.gens).any(|(&l, &g)| inner.generation(l) != g);
        SNAPSHOT.with(|s| s.replace(snap));
        let home_mismatch = matches!(unlocked, Err(VolumeError::Corrupt { device: "capacity", .. })) && home.is_some();
        if reused || home_mismatch {
            let i = &mut *inner;
            return self.read_mapped(&i.vols[vol].l2p, &mut i.home_sums, lbas, offset, buf, home);
        }
        unlocked
    }

    /// `read_blocks` of the entries `range` of `l2p` (under the lock), their
    /// places decoded into the thread's own vector.
    fn read_mapped(
        &self,
        l2p: &L2p,
        sums: &mut HomeSums,
        range: std::ops::Range<usize>,
        offset: u64,
        out: &mut [u8],
        home: Option<u64>,
    ) -> Result<u64, VolumeError> {
        let mut snap = SNAPSHOT.with(|s| s.take());
        let r = snap
            .load(l2p, range)
            .and_then(|()| snap.home_sums(sums, home))
            .and_then(|()| self.read_blocks(&snap.locs, &snap.crcs, offset, out, home));
        SNAPSHOT.with(|s| s.replace(snap));
        r
    }

    /// Read the blocks at `locs` into `out` (one block each), one device read
    /// per run of blocks stored back to back on the same device: a 64 KiB
    /// read of data written or compacted together is one request, not 16.
    ///
    /// Every block read is checked against `crcs` (its CRC32C as logged): a
    /// mismatch is `VolumeError::Corrupt` naming the first bad block (its
    /// byte in the volume, from `offset`, and where it is stored), and the
    /// bad bytes stay in `out` only for the caller to discard.
    ///
    /// `home`: in place, the capacity block of the first block's home, where
    /// an unmapped block is read from, checked against its home sum in
    /// `crcs` unless that is 0 (unverified: home_sums.rs); otherwise
    /// unmapped blocks read as zeros. Returns the blocks read from home.
    pub(super) fn read_blocks(
        &self,
        locs: &[Loc],
        crcs: &[u32],
        offset: u64,
        out: &mut [u8],
        home: Option<u64>,
    ) -> Result<u64, VolumeError> {
        // (on the cache device, block, checked)
        let place = |i: usize| -> Option<(bool, u64, bool)> {
            let l = locs[i];
            (l.cache_block().map(|b| (true, b, true)))
                .or_else(|| l.capacity_block().map(|b| (false, b, true)))
                .or_else(|| home.map(|h| (false, h + i as u64, false)))
        };
        let mut i = 0;
        let mut at_home = 0;
        while i < locs.len() {
            let Some((in_cache, first, checked)) = place(i) else {
                out[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES].fill(0);
                i += 1;
                continue;
            };
            let mut n = 1;
            while i + n < locs.len() && place(i + n) == Some((in_cache, first + n as u64, checked)) {
                n += 1;
            }
            let dev = if in_cache { &self.cache } else { &self.capacity };
            read_into(&**dev, first * BS, &mut out[i * BLOCK_BYTES..(i + n) * BLOCK_BYTES])?;
            if !checked {
                at_home += n as u64;
            }
            for k in i..i + n {
                if (checked || crcs[k] != 0) && crc32c(&out[k * BLOCK_BYTES..(k + 1) * BLOCK_BYTES]) != crcs[k] {
                    return Err(VolumeError::Corrupt {
                        offset: offset + k as u64 * BS,
                        device: if in_cache { "cache" } else { "capacity" },
                        device_offset: (first + (k - i) as u64) * BS,
                    });
                }
            }
            i += n;
        }
        Ok(at_home)
    }
}

/// What a read outside the lock took from the maps: where each block is,
/// its CRC, and the generation of its place.
#[derive(Default)]
pub(super) struct ReadSnapshot {
    locs: Vec<Loc>,
    crcs: Vec<u32>,
    gens: Vec<u64>,
}

impl ReadSnapshot {
    /// The places and CRCs of the entries `range` of `l2p`.
    pub(super) fn load(&mut self, l2p: &L2p, range: std::ops::Range<usize>) -> Result<(), VolumeError> {
        self.locs.clear();
        self.crcs.clear();
        l2p.load(range, &mut self.locs, &mut self.crcs)
    }

    /// In place (`home`: the first block's home): the sum of each unmapped
    /// block's home in place of its CRC, 0 where unverified.
    pub(super) fn home_sums(&mut self, sums: &mut HomeSums, home: Option<u64>) -> Result<(), VolumeError> {
        let Some(h) = home else { return Ok(()) };
        for (i, l) in self.locs.iter().enumerate() {
            if l.cache_block().is_none() && l.capacity_block().is_none() {
                self.crcs[i] = sums.sum(h + i as u64)?;
            }
        }
        Ok(())
    }

    /// `load` from a map shared with lock-free reads, without the lock.
    pub(super) fn load_resident(&mut self, map: &l2p::Resident, range: std::ops::Range<usize>) {
        self.locs.clear();
        self.crcs.clear();
        map.load(range, &mut self.locs, &mut self.crcs)
    }
}

#[cfg(test)]
thread_local! {
    /// Run once by the thread's next lock-free read between loading the
    /// map and reading the devices (tests stage races with it).
    pub(super) static BETWEEN_LOAD_AND_READ: std::cell::Cell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::Cell::new(None) };
}

thread_local! {
    static SNAPSHOT: std::cell::RefCell<ReadSnapshot> = std::cell::RefCell::new(ReadSnapshot::default());
}

thread_local! {
    /// Each thread's buffer for user reads, kept between reads: reads run
    /// outside the engine lock (so not from its pool), and a fresh aligned,
    /// zeroed buffer per 4 KiB read cost more than the read's own memcpy.
    static READ_BUF: std::cell::RefCell<IoBuf> = std::cell::RefCell::new(IoBuf::empty());
}

/// Read `out.len()` bytes at `offset` into `out`, through the thread's buffer.
fn read_into(dev: &dyn BlockDevice, offset: u64, out: &mut [u8]) -> Result<(), VolumeError> {
    READ_BUF.with(|cell| {
        let mut buf = cell.take();
        if buf.capacity() < out.len() {
            buf = IoBuf::zeroed(out.len().next_power_of_two());
        }
        buf.set_len(out.len());
        let c =
            sync_io(dev, IoRequest { op: IoOp::Read, offset, len: out.len() as u64, buf, fua: false, user_data: 0 });
        if c.result.is_ok() {
            out.copy_from_slice(&c.buf);
        }
        // Large one-off reads do not stay resident.
        if c.buf.capacity() <= 1 << 20 {
            cell.replace(c.buf);
        }
        c.result.map(|_| ()).map_err(Into::into)
    })
}
