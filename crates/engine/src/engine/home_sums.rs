//! Home checksums, in place: a CRC32C of every home Sluice wrote, kept in a
//! table on the cache device and checked on every read from a home.
//!
//! Owns: the table (one 4-byte sum per capacity block that is a volume's
//! home, 0 meaning *unverified*), its pages in DRAM (all of them, or as
//! many as its share of the L2P budget when the maps are paged), the home
//! writes under way (`flights`) and the sums of written homes that wait for
//! a capacity flush (`pending`).
//!
//! A home is written by cleaning, by writes past the log and by writes
//! through, never atomically with its sum, and a crash may keep the new
//! home or the old one. So the table never claims more than it knows:
//!
//! - **A nonzero sum in DRAM is the CRC of the bytes the home holds
//!   durably**, and no write of that home is under way. A home write
//!   begins (`begin_write`, under the engine lock, before the device
//!   write is issued) by setting its blocks' sums to 0; a sum is recorded
//!   again only after the write completed (`end_write`) *and* a capacity
//!   flush that began after that completed (`disk_flushed`). Two writes of
//!   one home in flight at once (concurrent writes past the log) record
//!   nothing: the disk may have kept either.
//! - **A nonzero sum on the device is the CRC of the home's durable bytes.**
//!   Pages are written only from DRAM (so only with true sums), and a home
//!   whose device page may hold a nonzero sum (`durable_nz`) is not written
//!   until that page, with the sum zeroed, has been written and flushed:
//!   `begin_write` does it, one page write and one flush for a whole step.
//!   Every page carries a magic, its number, the engine's tag and a CRC; a
//!   page that does not check (torn, never written, another engine's) reads
//!   as all unverified. Entries are 4-byte aligned, so even a page torn
//!   across sectors could only mix true sums, but the CRC takes no chances.
//!
//! Recovery therefore has nothing to do: after any crash the table on the
//! device holds only true sums, and what it lost (sums recorded since the
//! last page write) reads as unverified. Dirty pages are written in
//! batches after a capacity flush (`SYNC_PAGES`) and all at a clean
//! shutdown. A sum of 0 cannot be told from unverified: one block in 2^32
//! is not covered.

use crate::layout::{crc32c, BLOCK_BYTES};
use sluice_media::device::{flush, read_at, write_at};
use sluice_media::{BlockDevice, DeviceError};
use std::collections::HashMap;
use std::sync::Arc;

/// Sums per 4 KiB page; the rest of the page is its trailer.
pub(super) const PAGE_SUMS: usize = 1020;
const PAGE_MAGIC: u32 = 0x534c_4853; // "SLHS"
const WORDS: usize = PAGE_SUMS.div_ceil(64);
/// Dirty pages written (one flush) after a capacity flush: how many pages'
/// new sums a crash may lose at most, roughly.
const SYNC_PAGES: usize = 32;

struct Page {
    sums: Vec<u32>,
    /// The device's copy may hold a nonzero sum for this entry.
    durable_nz: [u64; WORDS],
    dirty: bool,
    referenced: bool,
}

impl Page {
    fn nonzero_bits(&self) -> [u64; WORDS] {
        let mut w = [0u64; WORDS];
        for (i, &s) in self.sums.iter().enumerate() {
            if s != 0 {
                w[i / 64] |= 1 << (i % 64);
            }
        }
        w
    }
}

#[derive(Default, Clone, Copy)]
struct Flight {
    writers: u32,
    /// Another write of the same home began while one was under way.
    spoiled: bool,
}

struct Store {
    dev: Arc<dyn BlockDevice>,
    /// The table's first byte on the device.
    base: u64,
    tag: u32,
}

/// What the table holds, for `sluice check` and the scrub.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HomeSumCounts {
    /// Homes with a recorded sum.
    pub verified: u64,
    /// Homes without one (never written by Sluice, written since the last
    /// page write before a crash, or in a page that did not check).
    pub unverified: u64,
    /// Pages that did not check when read (counted as unverified).
    pub pages_unreadable: u64,
}

/// The table (module doc). `HomeSums::none()` for engines without one
/// (bands, or in place created before superblock version 9): every method
/// then does nothing and every home is unverified.
pub(super) struct HomeSums {
    store: Option<Store>,
    blocks: u64,
    pages: Vec<Option<Page>>,
    frames: usize,
    resident: usize,
    hand: usize,
    dirty: usize,
    pending: HashMap<u64, u32>,
    flights: HashMap<u64, Flight>,
    pages_unreadable: u64,
}

impl Default for HomeSums {
    fn default() -> HomeSums {
        HomeSums::none()
    }
}

impl HomeSums {
    /// No table.
    pub(super) fn none() -> HomeSums {
        HomeSums {
            store: None,
            blocks: 0,
            pages: Vec::new(),
            frames: 0,
            resident: 0,
            hand: 0,
            dirty: 0,
            pending: HashMap::new(),
            flights: HashMap::new(),
            pages_unreadable: 0,
        }
    }

    /// The table of `blocks` homes at byte `base` of `dev`, with at most
    /// `frames` pages in DRAM (at least 2), for the engine tagged `tag`.
    pub(super) fn on(dev: Arc<dyn BlockDevice>, base: u64, blocks: u64, tag: u32, frames: usize) -> HomeSums {
        let n = Self::pages_for(blocks);
        HomeSums {
            store: Some(Store { dev, base, tag }),
            blocks,
            pages: (0..n).map(|_| None).collect(),
            frames: frames.max(2),
            ..HomeSums::none()
        }
    }

    fn pages_for(blocks: u64) -> usize {
        (blocks as usize).div_ceil(PAGE_SUMS)
    }

    /// Bytes the table of `blocks` homes takes on the device.
    pub(super) fn region_bytes(blocks: u64) -> u64 {
        (Self::pages_for(blocks) * BLOCK_BYTES) as u64
    }

    pub(super) fn enabled(&self) -> bool {
        self.store.is_some()
    }

    fn page(&mut self, p: usize) -> Result<&mut Page, DeviceError> {
        if self.pages[p].is_none() {
            while self.resident >= self.frames {
                self.evict()?;
            }
            let page = self.load(p)?;
            self.pages[p] = Some(page);
            self.resident += 1;
        }
        let page = self.pages[p].as_mut().expect("resident");
        page.referenced = true;
        Ok(page)
    }

    fn load(&mut self, p: usize) -> Result<Page, DeviceError> {
        let st = self.store.as_ref().expect("a table");
        let b = read_at(&*st.dev, st.base + (p * BLOCK_BYTES) as u64, BLOCK_BYTES)?;
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let t = PAGE_SUMS * 4;
        let good = u32_at(t) == PAGE_MAGIC
            && u32_at(t + 4) == p as u32
            && u32_at(t + 8) == st.tag
            && u32_at(BLOCK_BYTES - 4) == crc32c(&b[..BLOCK_BYTES - 4]);
        let sums = match good {
            true => (0..PAGE_SUMS).map(|i| u32_at(i * 4)).collect(),
            false => {
                // Never written holds zeros; anything else is counted.
                if b.iter().any(|&x| x != 0) {
                    self.pages_unreadable += 1;
                }
                vec![0; PAGE_SUMS]
            }
        };
        let mut page = Page { sums, durable_nz: [0; WORDS], dirty: false, referenced: true };
        page.durable_nz = page.nonzero_bits();
        Ok(page)
    }

    fn encode(&self, p: usize) -> Vec<u8> {
        let st = self.store.as_ref().expect("a table");
        let page = self.pages[p].as_ref().expect("resident");
        let mut b = vec![0u8; BLOCK_BYTES];
        for (i, s) in page.sums.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&s.to_le_bytes());
        }
        let t = PAGE_SUMS * 4;
        b[t..t + 4].copy_from_slice(&PAGE_MAGIC.to_le_bytes());
        b[t + 4..t + 8].copy_from_slice(&(p as u32).to_le_bytes());
        b[t + 8..t + 12].copy_from_slice(&st.tag.to_le_bytes());
        let c = crc32c(&b[..BLOCK_BYTES - 4]);
        b[BLOCK_BYTES - 4..].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Write resident pages `list`, then flush: their device copies are
    /// their DRAM sums. On an error the device may hold either version.
    fn sync_pages(&mut self, list: &[usize]) -> Result<(), DeviceError> {
        if list.is_empty() {
            return Ok(());
        }
        let r = (|| {
            let st = self.store.as_ref().expect("a table");
            for &p in list {
                write_at(&*st.dev, st.base + (p * BLOCK_BYTES) as u64, &self.encode(p))?;
            }
            flush(&*st.dev)
        })();
        for &p in list {
            let page = self.pages[p].as_mut().expect("resident");
            let nz = page.nonzero_bits();
            for (d, n) in page.durable_nz.iter_mut().zip(nz) {
                *d = if r.is_ok() { n } else { *d | n };
            }
            if r.is_ok() && page.dirty {
                page.dirty = false;
                self.dirty -= 1;
            }
        }
        r
    }

    /// Drop one page from DRAM (the clock's next unreferenced one), written
    /// first if dirty.
    fn evict(&mut self) -> Result<(), DeviceError> {
        loop {
            self.hand = (self.hand + 1) % self.pages.len();
            let p = self.hand;
            let Some(page) = self.pages[p].as_mut() else { continue };
            if page.referenced {
                page.referenced = false;
                continue;
            }
            if page.dirty {
                self.sync_pages(&[p])?;
            }
            self.pages[p] = None;
            self.resident -= 1;
            return Ok(());
        }
    }

    fn set(&mut self, b: u64, sum: u32) -> Result<(), DeviceError> {
        let (p, i) = (b as usize / PAGE_SUMS, b as usize % PAGE_SUMS);
        let page = self.page(p)?;
        if page.sums[i] != sum {
            page.sums[i] = sum;
            if !page.dirty {
                page.dirty = true;
                self.dirty += 1;
            }
        }
        Ok(())
    }

    /// The sum of home block `b`: 0 if unverified (or no table).
    pub(super) fn sum(&mut self, b: u64) -> Result<u32, DeviceError> {
        if self.store.is_none() {
            return Ok(0);
        }
        assert!(b < self.blocks, "home {b} past the table's {}", self.blocks);
        let i = b as usize % PAGE_SUMS;
        Ok(self.page(b as usize / PAGE_SUMS)?.sums[i])
    }

    /// Before homes `first..first + n` are written (the write not issued
    /// yet): their sums are 0 in DRAM and on the device. Writes and flushes
    /// the pages whose device copy may hold a sum for one of them. On an
    /// error nothing is under way and the write must not be issued.
    pub(super) fn begin_write(&mut self, first: u64, n: u64) -> Result<(), DeviceError> {
        if self.store.is_none() || n == 0 {
            return Ok(());
        }
        assert!(first + n <= self.blocks, "homes {first}+{n} past the table's {}", self.blocks);
        let mut sync = Vec::new();
        for b in first..first + n {
            self.pending.remove(&b);
            self.set(b, 0)?;
            let (p, i) = (b as usize / PAGE_SUMS, b as usize % PAGE_SUMS);
            let page = self.pages[p].as_ref().expect("resident");
            if page.durable_nz[i / 64] & (1 << (i % 64)) != 0 && sync.last() != Some(&p) {
                sync.push(p);
            }
        }
        // (Every page of the step is resident unless more than `frames`
        // were touched: then an evicted one was written and flushed with
        // the zeros already, and `sync` skips it.)
        sync.retain(|&p| self.pages[p].is_some());
        self.sync_pages(&sync)?;
        for b in first..first + n {
            let f = self.flights.entry(b).or_default();
            f.spoiled |= f.writers > 0;
            f.writers += 1;
        }
        Ok(())
    }

    /// Homes `first..` were written with `data` (whole blocks), or their
    /// write failed (`None`, `n` blocks): a completed write's sums wait for
    /// the next capacity flush.
    pub(super) fn end_write(&mut self, first: u64, n: u64, data: Option<&[u8]>) {
        if self.store.is_none() || n == 0 {
            return;
        }
        if let Some(d) = data {
            assert_eq!(d.len() as u64, n * BLOCK_BYTES as u64, "whole blocks");
        }
        for (k, b) in (first..first + n).enumerate() {
            let f = self.flights.get_mut(&b).expect("a home write ends only after it began");
            f.writers -= 1;
            let (alone, done) = (!f.spoiled, f.writers == 0);
            if done {
                self.flights.remove(&b);
            }
            if let (Some(d), true, true) = (data, alone, done) {
                self.pending.insert(b, crc32c(&d[k * BLOCK_BYTES..(k + 1) * BLOCK_BYTES]));
            }
        }
    }

    /// A capacity flush completed (it began after every `end_write` so
    /// far): the waiting sums are true now; a batch of dirty pages is
    /// written when enough have gathered.
    pub(super) fn disk_flushed(&mut self) -> Result<(), DeviceError> {
        if self.store.is_none() {
            return Ok(());
        }
        let pending: Vec<(u64, u32)> = self.pending.drain().collect();
        for (b, s) in pending {
            debug_assert!(!self.flights.contains_key(&b), "a waiting sum has no write under way");
            self.set(b, s)?;
        }
        if self.dirty >= SYNC_PAGES {
            self.sync_dirty()?;
        }
        Ok(())
    }

    /// Write every dirty page, then flush (a clean shutdown, a batch).
    pub(super) fn sync_dirty(&mut self) -> Result<(), DeviceError> {
        let list: Vec<usize> =
            (0..self.pages.len()).filter(|&p| self.pages[p].as_ref().is_some_and(|pg| pg.dirty)).collect();
        self.sync_pages(&list)
    }

    /// The scrub: home `b`, read under the engine lock with nothing under
    /// way for it and no sum recorded, holds bytes whose CRC is `sum`; it
    /// is recorded as a written home's is, after the next capacity flush.
    /// False (nothing recorded) if a write began or a sum is known.
    pub(super) fn scrubbed(&mut self, b: u64, sum: u32) -> Result<bool, DeviceError> {
        if self.store.is_none() || self.flights.contains_key(&b) || self.pending.contains_key(&b) || self.sum(b)? != 0 {
            return Ok(false);
        }
        self.pending.insert(b, sum);
        Ok(true)
    }

    /// Whether a scrub may read home `b` now (no write under way).
    pub(super) fn quiet(&self, b: u64) -> bool {
        !self.flights.contains_key(&b)
    }

    /// Count verified and unverified homes (reads every page).
    pub(super) fn counts(&mut self) -> Result<HomeSumCounts, DeviceError> {
        let mut c = HomeSumCounts::default();
        if self.store.is_none() {
            c.unverified = self.blocks;
            return Ok(c);
        }
        for b in 0..self.blocks {
            match self.sum(b)? {
                0 => c.unverified += 1,
                _ => c.verified += 1,
            }
        }
        c.pages_unreadable = self.pages_unreadable;
        Ok(c)
    }

    /// Every sum forgotten, on the device too (written and flushed): the
    /// disk was changed behind the engine's back.
    pub(super) fn forget_all(&mut self) -> Result<(), DeviceError> {
        if self.store.is_none() {
            return Ok(());
        }
        self.pending.clear();
        for p in 0..self.pages.len() {
            let page = self.page(p)?;
            if page.sums.iter().all(|&s| s == 0) && page.durable_nz == [0; WORDS] {
                continue;
            }
            page.sums.fill(0);
            if !page.dirty {
                page.dirty = true;
                self.dirty += 1;
            }
        }
        self.sync_dirty()
    }

    /// Homes the table covers.
    pub(super) fn blocks(&self) -> u64 {
        self.blocks
    }
}

/// Homes a scrub reads at once, under the lock.
const SCRUB_BLOCKS: u64 = 256;

impl super::Engine {
    /// Record the sum of every home that has none (`sluice scrub`): an
    /// attached disk's existing data, or homes whose sums a crash lost.
    /// Each run of homes is read under the engine lock (no write of them
    /// can be under way), its sums recorded as a written home's are, then
    /// made true by a capacity flush and written to the table. Requests go
    /// on between runs. Returns what the table holds afterwards.
    pub fn scrub_homes(&self) -> Result<HomeSumCounts, super::EngineError> {
        use super::EngineError;
        let blocks = {
            let inner = self.lock();
            if !inner.in_place() || !inner.home_sums.enabled() {
                return Err(EngineError::Config(
                    "scrubbing applies to an in-place engine with home checksums (created with superblock version 9)",
                ));
            }
            inner.home_sums.blocks()
        };
        let mut at = 0;
        while at < blocks {
            let n = (blocks - at).min(SCRUB_BLOCKS);
            self.change(|e, inner| {
                let todo: Vec<u64> = (at..at + n)
                    .filter(|&b| inner.home_sums.quiet(b) && inner.home_flight.overlapping(b, 1).is_none())
                    .collect();
                if todo.is_empty() {
                    return Ok(());
                }
                let data = crate::engine::read_at(&*e.capacity, at * super::BS, n as usize * BLOCK_BYTES)?;
                for b in todo {
                    let k = (b - at) as usize;
                    inner.home_sums.scrubbed(b, crc32c(&data[k * BLOCK_BYTES..(k + 1) * BLOCK_BYTES]))?;
                }
                Ok(())
            })
            .map_err(EngineError::Request)?;
            at += n;
        }
        self.change(|e, inner| {
            e.flush_capacity(inner)?;
            inner.home_sums.sync_dirty()?;
            Ok(inner.home_sums.counts()?)
        })
        .map_err(EngineError::Request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_media::memory::MemoryDevice;

    fn table(frames: usize) -> (Arc<MemoryDevice>, HomeSums) {
        let dev = Arc::new(MemoryDevice::new(64 * BLOCK_BYTES as u64, BLOCK_BYTES as u64));
        let t = HomeSums::on(dev.clone(), 4 * BLOCK_BYTES as u64, 5 * PAGE_SUMS as u64, 7, frames);
        (dev, t)
    }

    fn block(x: u8) -> Vec<u8> {
        vec![x; BLOCK_BYTES]
    }

    /// A sum is recorded only after the write completed and a flush came
    /// after it; reopening the table from the device keeps what was synced.
    #[test]
    fn a_sum_needs_a_completed_write_and_a_flush() {
        let (dev, mut t) = table(8);
        t.begin_write(3, 1).unwrap();
        t.disk_flushed().unwrap();
        assert_eq!(t.sum(3).unwrap(), 0, "in flight: unverified");
        t.end_write(3, 1, Some(&block(1)));
        assert_eq!(t.sum(3).unwrap(), 0, "written, not flushed: unverified");
        t.disk_flushed().unwrap();
        assert_eq!(t.sum(3).unwrap(), crc32c(&block(1)));
        let mut again = HomeSums::on(dev.clone(), 4 * BLOCK_BYTES as u64, 5 * PAGE_SUMS as u64, 7, 8);
        assert_eq!(again.sum(3).unwrap(), 0, "not synced: lost, so unverified");
        t.sync_dirty().unwrap();
        let mut again = HomeSums::on(dev.clone(), 4 * BLOCK_BYTES as u64, 5 * PAGE_SUMS as u64, 7, 8);
        assert_eq!(again.sum(3).unwrap(), crc32c(&block(1)));
        let mut other = HomeSums::on(dev, 4 * BLOCK_BYTES as u64, 5 * PAGE_SUMS as u64, 8, 8);
        assert_eq!(other.sum(3).unwrap(), 0, "another engine's page is not ours");
    }

    /// Before a home whose sum the device holds is written again, the
    /// device's page says 0: a crash during the write finds no stale sum.
    #[test]
    fn a_rewrite_zeroes_the_durable_sum_first() {
        let (dev, mut t) = table(8);
        t.begin_write(3, 1).unwrap();
        t.end_write(3, 1, Some(&block(1)));
        t.disk_flushed().unwrap();
        t.sync_dirty().unwrap();
        let flushes = dev.stats().flushes;
        t.begin_write(3, 1).unwrap();
        assert_eq!(dev.stats().flushes, flushes + 1, "the zero is flushed before the write");
        // The crash: the device's table as it is now.
        let mut after = HomeSums::on(dev.clone(), 4 * BLOCK_BYTES as u64, 5 * PAGE_SUMS as u64, 7, 8);
        assert_eq!(after.sum(3).unwrap(), 0);
        t.end_write(3, 1, Some(&block(2)));
        // A second write of a home never synced needs no page write.
        let flushes = dev.stats().flushes;
        t.begin_write(3, 1).unwrap();
        assert_eq!(dev.stats().flushes, flushes, "nothing durable to zero");
        t.end_write(3, 1, Some(&block(3)));
        t.disk_flushed().unwrap();
        assert_eq!(t.sum(3).unwrap(), crc32c(&block(3)));
    }

    /// Two writes of one home under way at once record nothing.
    #[test]
    fn overlapping_writes_record_nothing() {
        let (_dev, mut t) = table(8);
        t.begin_write(10, 2).unwrap();
        t.begin_write(11, 1).unwrap();
        t.end_write(11, 1, Some(&block(5)));
        t.end_write(10, 2, Some(&[block(4), block(4)].concat()));
        t.disk_flushed().unwrap();
        assert_eq!(t.sum(10).unwrap(), crc32c(&block(4)), "block 10 had one writer");
        assert_eq!(t.sum(11).unwrap(), 0, "block 11 had two at once");
        // A failed write records nothing either.
        t.begin_write(12, 1).unwrap();
        t.end_write(12, 1, None);
        t.disk_flushed().unwrap();
        assert_eq!(t.sum(12).unwrap(), 0);
    }

    /// With fewer frames than pages, evicted pages are written and read
    /// back; a damaged page reads as unverified and is counted.
    #[test]
    fn paged_and_damaged_pages() {
        let (dev, mut t) = table(2);
        for p in 0..5u64 {
            let b = p * PAGE_SUMS as u64 + 1;
            t.begin_write(b, 1).unwrap();
            t.end_write(b, 1, Some(&block(p as u8 + 1)));
            t.disk_flushed().unwrap();
        }
        assert!(t.resident <= 2);
        for p in 0..5u64 {
            assert_eq!(t.sum(p * PAGE_SUMS as u64 + 1).unwrap(), crc32c(&block(p as u8 + 1)), "page {p}");
        }
        t.sync_dirty().unwrap();
        let mut b = read_at(&*dev, 4 * BLOCK_BYTES as u64 + BLOCK_BYTES as u64, BLOCK_BYTES).unwrap().to_vec();
        b[100] ^= 1;
        write_at(&*dev, 4 * BLOCK_BYTES as u64 + BLOCK_BYTES as u64, &b).unwrap();
        let mut t = HomeSums::on(dev, 4 * BLOCK_BYTES as u64, 5 * PAGE_SUMS as u64, 7, 2);
        let c = t.counts().unwrap();
        assert_eq!((c.verified, c.pages_unreadable), (4, 1), "{c:?}");
        assert_eq!(c.unverified, 5 * PAGE_SUMS as u64 - 4);
    }
}
