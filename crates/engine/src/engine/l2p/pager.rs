//! A paged L2P: a volume's map in pages of `PAGE_ENTRIES` entries, the
//! hot ones held in DRAM within a budget, the rest in the map region of the
//! cache device — as SPDK FTL's `l2p_dram_limit` does.
//!
//! A page is its entries (4 or 8 bytes each, as the map's width) followed
//! by their CRCs (4 bytes each): 8 KiB narrow, 12 KiB wide, whole device
//! blocks. A page never written to the region is all "nowhere" and costs
//! nothing to fault in; one that was is read back and checked against the
//! CRC32C it was written with (kept in DRAM, 4 bytes per page, and in the
//! checkpoint), so a page damaged at rest is reported, never used.
//! Eviction is CLOCK (second chance): a page used since the hand last
//! passed stays; a dirty page is written before its frame is reused.
//!
//! Invariants: a page is in at most one frame; a frame's page is either
//! clean (the region holds it, with `crcs[page]`) or dirty; the region's
//! copy of a page is trusted only while `on_media` says it was written by
//! this open's pager or described by the checkpoint it was opened from —
//! after a crash, recovery starts from an empty pager and never reads the
//! region.

use crate::layout::crc32c;
use crate::volume::VolumeError;
use sluice_media::device::{read_at, write_at};
use sluice_media::BlockDevice;
use std::collections::HashMap;
use std::sync::Arc;

/// Entries per map page.
pub(in crate::engine) const PAGE_ENTRIES: usize = 1024;

/// Most dirty pages written back together (`Pager::write_back_batch`):
/// within the queue depth the engine's lock holder may use.
const WRITE_BACK_BATCH: usize = 8;
/// How far past the CLOCK hand a write-back looks for more dirty pages.
const WRITE_BACK_LOOKAHEAD: usize = 64;

/// `Frame::page` of a frame holding no page (a fault into it failed).
const NO_PAGE: u64 = u64::MAX;

/// One page in DRAM.
struct Frame {
    page: u64,
    dirty: bool,
    used: bool,
    bytes: Box<[u8]>,
}

/// Where a paged map keeps its pages, and how many it may hold in DRAM.
#[derive(Clone)]
pub(in crate::engine) struct PageStore {
    pub(in crate::engine) dev: Arc<dyn BlockDevice>,
    /// Byte offset of the volume's first page on `dev`.
    pub(in crate::engine) base: u64,
    /// Most pages held in DRAM (at least 2).
    pub(in crate::engine) frames: usize,
}

/// The pages of one paged map.
pub(super) struct Pager {
    store: PageStore,
    /// Bytes of a stored entry (4 or 8).
    entry_bytes: usize,
    frames: Vec<Frame>,
    /// Page → frame.
    resident: HashMap<u64, usize>,
    hand: usize,
    /// Per page: written to the region (and `crcs` holds its CRC).
    on_media: Vec<u64>,
    crcs: Vec<u32>,
    /// Faults and write-backs since open (for benchmarks).
    pub(super) faults: u64,
    pub(super) writebacks: u64,
}

impl Pager {
    pub(super) fn new(store: PageStore, entry_bytes: usize, pages: usize) -> Pager {
        let store = PageStore { frames: store.frames.max(2), ..store };
        Pager {
            store,
            entry_bytes,
            frames: Vec::new(),
            resident: HashMap::new(),
            hand: 0,
            on_media: vec![0; pages.div_ceil(64)],
            crcs: vec![0; pages],
            faults: 0,
            writebacks: 0,
        }
    }

    /// Bytes of one page.
    pub(super) fn page_bytes(entry_bytes: usize) -> usize {
        PAGE_ENTRIES * (entry_bytes + 4)
    }

    fn bytes_per_page(&self) -> usize {
        Pager::page_bytes(self.entry_bytes)
    }

    fn written(&self, page: u64) -> bool {
        self.on_media[(page / 64) as usize] & (1 << (page % 64)) != 0
    }

    /// The frame holding `page`, faulting it in (and evicting another) if
    /// it is not resident.
    fn frame(&mut self, page: u64) -> Result<&mut Frame, VolumeError> {
        if let Some(&f) = self.resident.get(&page) {
            let frame = &mut self.frames[f];
            frame.used = true;
            return Ok(frame);
        }
        let len = self.bytes_per_page();
        let f = if self.frames.len() < self.store.frames {
            let bytes = vec![0u8; len].into_boxed_slice();
            self.frames.push(Frame { page: NO_PAGE, dirty: false, used: false, bytes });
            self.frames.len() - 1
        } else {
            let f = self.victim();
            if self.frames[f].dirty {
                self.write_back_batch(f)?;
            }
            let old = std::mem::replace(&mut self.frames[f].page, NO_PAGE);
            if old != NO_PAGE {
                self.resident.remove(&old);
            }
            f
        };
        // From here the frame holds no page until the fault succeeds: a
        // failed read leaves it empty, never named by a page it does not
        // hold (evicting it later would unmap that page's real frame).
        self.faults += 1;
        let offset = self.offset(page);
        if self.written(page) {
            let data = read_at(&*self.store.dev, offset, len)?;
            if crc32c(&data) != self.crcs[page as usize] {
                return Err(VolumeError::Damaged {
                    device: "cache",
                    offset,
                    what: sluice_volume::Damage::MapPage { page },
                });
            }
            self.frames[f].bytes.copy_from_slice(&data);
        } else {
            self.frames[f].bytes.fill(0);
        }
        let frame = &mut self.frames[f];
        (frame.page, frame.dirty, frame.used) = (page, false, true);
        self.resident.insert(page, f);
        Ok(&mut self.frames[f])
    }

    /// The next frame the CLOCK hand finds unused since it last passed.
    fn victim(&mut self) -> usize {
        loop {
            let f = self.hand;
            self.hand = (self.hand + 1) % self.frames.len();
            if !std::mem::replace(&mut self.frames[f].used, false) {
                return f;
            }
        }
    }

    /// Write back dirty frame `f` with the next dirty frames the CLOCK hand
    /// would evict soon (unused since it passed, among the next
    /// `WRITE_BACK_LOOKAHEAD`), up to `WRITE_BACK_BATCH` in flight at once:
    /// a map whose dirty pages stream through its frames (recovery, random
    /// writes over a huge volume) pays one device round trip per batch, not
    /// per page. Writing a page early is harmless: the region's copy counts
    /// only once it is written (`on_media`, `crcs`). On an error the frames
    /// whose writes failed stay dirty.
    fn write_back_batch(&mut self, f: usize) -> Result<(), VolumeError> {
        let n = self.frames.len();
        let mut batch = vec![f];
        for k in 0..WRITE_BACK_LOOKAHEAD.min(n) {
            if batch.len() >= WRITE_BACK_BATCH {
                break;
            }
            let g = (self.hand + k) % n;
            let fr = &self.frames[g];
            if g != f && fr.dirty && !fr.used && fr.page != NO_PAGE {
                batch.push(g);
            }
        }
        let writes: Vec<(u64, &[u8])> =
            batch.iter().map(|&g| (self.offset(self.frames[g].page), &self.frames[g].bytes[..])).collect();
        let results = crate::engine::cleaning::write_queued(&*self.store.dev, &writes, WRITE_BACK_BATCH);
        let mut first_err = None;
        for (&g, r) in batch.iter().zip(results) {
            match r {
                Ok(()) => self.written_back(g),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Frame `f`'s page is now the region's copy: clean, its CRC recorded.
    fn written_back(&mut self, f: usize) {
        let frame = &mut self.frames[f];
        frame.dirty = false;
        let page = frame.page;
        self.crcs[page as usize] = crc32c(&frame.bytes);
        self.on_media[(page / 64) as usize] |= 1 << (page % 64);
        self.writebacks += 1;
    }

    /// Byte offset of `page` in the region.
    fn offset(&self, page: u64) -> u64 {
        self.store.base + page * self.bytes_per_page() as u64
    }

    /// Write frame `f`'s page to the region if it is dirty.
    fn write_back(&mut self, f: usize) -> Result<(), VolumeError> {
        if !self.frames[f].dirty {
            return Ok(());
        }
        write_at(&*self.store.dev, self.offset(self.frames[f].page), &self.frames[f].bytes)?;
        self.written_back(f);
        Ok(())
    }

    /// Entry `i` (stored form) and CRC of `page`.
    pub(super) fn get(&mut self, page: u64, i: usize) -> Result<(u64, u32), VolumeError> {
        let eb = self.entry_bytes;
        let frame = self.frame(page)?;
        Ok(read_entry(&frame.bytes, eb, i))
    }

    /// Set entry `i` of `page` (stored form) and, if given, its CRC.
    pub(super) fn set(&mut self, page: u64, i: usize, raw: u64, crc: Option<u32>) -> Result<(), VolumeError> {
        let eb = self.entry_bytes;
        let frame = self.frame(page)?;
        frame.dirty = true;
        frame.bytes[i * eb..(i + 1) * eb].copy_from_slice(&raw.to_le_bytes()[..eb]);
        if let Some(c) = crc {
            let at = PAGE_ENTRIES * eb + i * 4;
            frame.bytes[at..at + 4].copy_from_slice(&c.to_le_bytes());
        }
        Ok(())
    }

    /// The entries of `page` that are not "nowhere": (index in the page,
    /// stored form, CRC).
    pub(super) fn mapped(&mut self, page: u64) -> Result<Vec<(usize, u64, u32)>, VolumeError> {
        let eb = self.entry_bytes;
        let frame = self.frame(page)?;
        let bytes = &frame.bytes;
        Ok((0..PAGE_ENTRIES)
            .filter(|&i| bytes[i * eb..(i + 1) * eb].iter().any(|&b| b != 0))
            .map(|i| {
                let (raw, crc) = read_entry(bytes, eb, i);
                (i, raw, crc)
            })
            .collect())
    }

    /// Whether `page` may hold anything but "nowhere": resident, or written.
    pub(super) fn may_hold(&self, page: u64) -> bool {
        self.written(page) || self.resident.contains_key(&page)
    }

    /// Write every dirty page to the region (the caller flushes the device).
    pub(super) fn write_all(&mut self) -> Result<(), VolumeError> {
        (0..self.frames.len()).try_for_each(|f| self.write_back(f))
    }

    /// Per page: written to the region, and its CRC (what a checkpoint
    /// keeps, after `write_all`).
    pub(super) fn media_state(&self) -> (&[u64], &[u32]) {
        (&self.on_media, &self.crcs)
    }

    /// Take the region's pages as a checkpoint described them.
    pub(super) fn adopt(&mut self, on_media: Vec<u64>, crcs: Vec<u32>) -> Result<(), ()> {
        if on_media.len() != self.on_media.len() || crcs.len() != self.crcs.len() {
            return Err(());
        }
        (self.on_media, self.crcs) = (on_media, crcs);
        Ok(())
    }

    /// DRAM the pager takes: its frames, and per page a bit and a CRC.
    pub(super) fn bytes(&self) -> usize {
        self.frames.len() * self.bytes_per_page() + self.on_media.len() * 8 + self.crcs.len() * 4
    }
}

/// Entry `i` (stored form) and its CRC, from a page's bytes.
fn read_entry(bytes: &[u8], eb: usize, i: usize) -> (u64, u32) {
    let mut raw = [0u8; 8];
    raw[..eb].copy_from_slice(&bytes[i * eb..(i + 1) * eb]);
    let at = PAGE_ENTRIES * eb + i * 4;
    let crc = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    (u64::from_le_bytes(raw), crc)
}
