//! The clean-shutdown checkpoint: the whole in-memory state, serialized
//! (docs/format.md). Written only by `Engine::shutdown`; read by `Engine::open`
//! when the superblock says clean.

use super::bands::{BandRecord, Stream, GC_STREAMS};
use super::l2p::PAGE_ENTRIES;
use super::residency::Residency;
use super::{
    l2p_width, zoned, BandId, BandPlacement, Bands, BlockDevice, BufPool, CapGeometry, CapWrites, CheckpointError,
    Chunk, ChunkId, ChunkState, EngineConfig, EngineError, EngineStats, Inner, L2p, Layout, Log, Moves, Superblock,
    VecDeque, Vol, Width, Writer, BLOCK_BYTES, BS,
};

/// Upper bound of the checkpoint's size for this geometry; `map_bytes`:
/// what the maps take in it (12 bytes per block in DRAM; for paged maps,
/// `checkpoint_page_bytes`).
pub(super) fn checkpoint_bytes_max(cfg: &EngineConfig, chunks: u64, bands: u64, vols: u64, map_bytes: u64) -> u64 {
    let fixed = 8 + 8 + 8 + 11 * 8 + 4 + 8 + 4 + 4 + 8 + 4;
    let per_vol = 4 + 1 + 8 + 4 + 8;
    let per_chunk = 1 + 8 + 4 + 8 + 12 * (cfg.chunk_bytes / BS) + 8 * (cfg.chunk_bytes / BS).div_ceil(64) + 4 + 4;
    let per_band = 1 + 4 + 8 + 8 + 8 + 8 + 8 + 4;
    fixed + vols * per_vol + map_bytes + 4 + chunks * per_chunk + 8 + 4 + bands * per_band + 4
}

/// Bytes the checkpoint region holds: from its start to the label (on a
/// zoned device, whole zones of `usable_blocks` each). Fixed when the engine
/// was created, by that version's `checkpoint_bytes_max`.
pub(super) fn checkpoint_room(capacity: &dyn BlockDevice, geo: &CapGeometry, sb: &Superblock) -> u64 {
    if sb.layout == crate::persist::LAYOUT_ATTACHED {
        // On the cache device, whole chunks before the home-sum table
        // and the map region.
        return super::l2p::region::home_sums_region(sb).0.saturating_sub(sb.checkpoint_offset);
    }
    let span = super::identity::label_offset(capacity).saturating_sub(sb.checkpoint_offset);
    match geo.zoned {
        true => span / sb.band_bytes * geo.usable_blocks * BS,
        false => span,
    }
}

/// What paged maps of `vol_blocks` blocks in `vols` volumes take in a
/// checkpoint at most: per volume a page count, a bit per page (whole
/// 64-bit words) and a CRC per page.
pub(super) fn checkpoint_page_bytes(vol_blocks: u64, vols: u64) -> u64 {
    let pages = vol_blocks / PAGE_ENTRIES as u64 + vols;
    vols * 8 + (pages / 64 + vols) * 8 + pages * 4
}

/// The width byte of a paged map's entry in the checkpoint: the entry width
/// with this bit set.
const PAGED: u8 = 0x80;

/// The checkpoint's body in version 7's format, and how long its version 6
/// prefix is: version 7 only appends the cached blocks' clean bits, so the
/// prefix is version 6's checkpoint (`checkpoint_for_room`).
pub(super) fn encode_checkpoint(inner: &Inner) -> (Vec<u8>, usize) {
    let mut w = Writer::default();
    w.u64(inner.seq.last());
    w.u64(inner.log.lsn());
    w.u64(inner.mark_gen);
    inner.stats.get().words().iter().for_each(|&x| w.u64(x));
    inner.log.encode_open(&mut w);
    // Only the first GC stream's bands: shutdown closes the others' (`Engine::close_extra_streams`).
    debug_assert!((1..GC_STREAMS).all(|k| inner.stream_band(Stream::Gc(k)).0.is_none()));
    let (gc_open, gc_last) = inner.stream_band(Stream::Gc(0));
    w.opt_u32(gc_open.map(|b| b.0));
    put_last(&mut w, gc_last);
    w.u32(inner.vols.len() as u32);
    for (slot, v) in inner.vols.iter().enumerate() {
        let (open, last) = inner.stream_band(Stream::User(slot));
        w.opt_u32(open.map(|b| b.0));
        put_last(&mut w, last);
        let width = v.l2p.width().bytes() as u8;
        if let Some((on_media, crcs)) = v.l2p.media_pages() {
            // A paged map: its pages are in the cache device's map region
            // (written and flushed first); here, which were written and
            // their CRCs.
            w.u8(PAGED | width);
            w.u64(v.l2p.len() as u64);
            w.u64(crcs.len() as u64);
            on_media.iter().for_each(|&x| w.u64(x));
            crcs.iter().for_each(|&c| w.u32(c));
            continue;
        }
        w.u8(width);
        w.u64(v.l2p.len() as u64);
        // Per block its stored entry (4 or 8 bytes, as wide as in DRAM) and its CRC.
        for lba in 0..v.l2p.len() {
            match v.l2p.width() {
                Width::Narrow { .. } => w.u32(v.l2p.raw(lba) as u32),
                Width::Wide => w.u64(v.l2p.raw(lba)),
            }
            w.u32(v.l2p.crc(lba).expect("a map in DRAM"));
        }
    }
    w.u32(inner.log.chunk_count() as u32);
    for (_, c) in inner.log.chunks() {
        w.u8(c.state().on_media());
        w.u64(c.epoch());
        w.u32(c.valid());
        w.u64(c.first_lsn());
        put_p2l(&mut w, c.p2l());
    }
    inner.log.encode_lists(&mut w);
    inner.bands.encode(&mut w);
    let v6 = w.0.len();
    // Version 7: per chunk, which cached blocks their homes hold already.
    inner.residency.encode_clean(&mut w);
    (w.0, v6)
}

/// A stream's last band: band u32 (u32::MAX = none), its epoch u64.
fn put_last(w: &mut Writer, last: Option<(BandId, u64)>) {
    w.opt_u32(last.map(|(b, _)| b.0));
    w.u64(last.map_or(0, |(_, e)| e));
}

fn get_last(r: &mut RegionReader) -> Result<Option<(BandId, u64)>, EngineError> {
    let b = r.opt_u32()?;
    let e = r.u64()?;
    Ok(b.map(|b| (BandId(b), e)))
}

/// A P2L list: (volume u32, LBA u64) per block.
fn put_p2l(w: &mut Writer, p2l: &[(u32, u64)]) {
    for &(v, l) in p2l {
        w.u32(v);
        w.u64(l);
    }
}

fn get_p2l(r: &mut RegionReader, blocks: usize) -> Result<Vec<(u32, u64)>, EngineError> {
    (0..blocks).map(|_| Ok((r.u32()?, r.u64()?))).collect()
}

/// (`maps`: every volume's, empty, from `new_maps`: the checkpoint fills
/// them, or for paged maps says which pages the region holds.)
pub(super) fn decode_checkpoint(
    mut r: RegionReader<'_>,
    cfg: EngineConfig,
    geo: CapGeometry,
    sb: Superblock,
    maps: Vec<L2p>,
) -> Result<Inner, EngineError> {
    let bad = |r: &RegionReader| EngineError::Checkpoint(CheckpointError(r.at()));
    let seq = r.u64()?;
    let lsn = r.u64()?;
    let mark_gen = r.u64()?;
    let mut words = [0u64; 11];
    for x in words.iter_mut() {
        *x = r.u64()?;
    }
    let open_c = r.opt_u32()?.map(ChunkId);
    let open_off = r.u64()?;
    let gc_band = r.opt_u32()?.map(BandId);
    let gc_last_band = get_last(&mut r)?;
    let nv = r.u32()? as usize;
    if nv != sb.volumes.len() {
        return Err(bad(&r));
    }
    let mut vols = Vec::with_capacity(nv);
    let mut user_streams = Vec::with_capacity(nv);
    for ((name, size), mut l2p) in sb.volumes.iter().zip(maps) {
        let open_band = r.opt_u32()?.map(BandId);
        user_streams.push((open_band, get_last(&mut r)?));
        let width = l2p_width(&sb);
        let (paged, entry_bytes) = {
            let b = r.u8()?;
            (b & PAGED != 0, (b & !PAGED) as u64)
        };
        if entry_bytes != width.bytes() || paged != l2p.is_paged() {
            return Err(bad(&r));
        }
        let n = r.u64()?;
        if n != size / BS {
            return Err(bad(&r));
        }
        if paged {
            let pages = r.u64()? as usize;
            if pages != (n as usize).div_ceil(PAGE_ENTRIES) {
                return Err(bad(&r));
            }
            let on_media = (0..pages.div_ceil(64)).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
            let crcs = (0..pages).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
            l2p.adopt_pages(on_media, crcs).map_err(|()| bad(&r))?;
        } else {
            for lba in 0..n as usize {
                let raw = if width == Width::Wide { r.u64()? } else { r.u32()? as u64 };
                let crc = r.u32()?;
                l2p.set_stored(lba, raw, crc).map_err(|()| bad(&r))?;
            }
        }
        vols.push(Vol { name: name.clone(), l2p, moved: Moves::default(), cache: Default::default() });
    }
    let bpc = (cfg.chunk_bytes / BS) as usize;
    let nc = r.u32()? as usize;
    let mut chunks = Vec::with_capacity(nc);
    for _ in 0..nc {
        let state = ChunkState::from_media(r.u8()?).ok_or(CheckpointError(r.at()))?;
        let epoch = r.u64()?;
        let valid = r.u32()?;
        let first_lsn = r.u64()?;
        let p2l = get_p2l(&mut r, bpc)?;
        // (Clean bits, if any, come at the end.)
        chunks.push(Chunk::from_checkpoint(state, epoch, p2l, valid, first_lsn).ok_or_else(|| bad(&r))?);
    }
    let mut lists = [VecDeque::new(), VecDeque::new()];
    for list in lists.iter_mut() {
        let n = r.u32()? as usize;
        for _ in 0..n {
            list.push_back(ChunkId(r.u32()?));
        }
    }
    let [full_chunks, free_chunks] = lists;
    let nb = r.u32()? as usize;
    let bands = (0..nb).map(|_| BandRecord::decode(&mut r)).collect::<Result<Vec<_>, _>>()?;
    let n = r.u32()? as usize;
    let mut free_bands = VecDeque::with_capacity(n);
    for _ in 0..n {
        free_bands.push_back(BandId(r.u32()?));
    }
    // In place, which cached blocks their homes hold already (from
    // version 7; before it, all are cleaned again). Only current blocks
    // are clean.
    let log = Log::from_checkpoint(chunks, full_chunks, free_chunks, open_c.map(|c| (c, open_off)), (seq, lsn));
    let in_place = cfg.layout == Layout::InPlace;
    let mut word = || r.u64();
    let clean_words: Option<&mut dyn FnMut() -> Result<u64, EngineError>> = (sb.version >= 7).then_some(&mut word);
    let owner = |cb| if in_place { log.owner_of(cb) } else { None };
    let residency = Residency::from_checkpoint(nc, bpc, owner, clean_words)?;
    if r.at() != r.len() {
        return Err(bad(&r));
    }
    let gate = super::ReuseGate::new(log.chunk_count(), bands.len());
    let mut inner = Inner {
        cfg,
        vols,
        log,
        residency,
        disk_id: None,
        bands: Bands::from_checkpoint(bands, free_bands, user_streams, (gc_band, gc_last_band)),
        cap: CapWrites::at_checkpoint(seq),
        gc_cursor: None,
        pending: Vec::new(),
        pendings_made: 0,
        compact_cursor: None,
        writer_waits: 0,
        home_flight: Default::default(),
        home_sums: Default::default(),
        seq: super::sequence::Sequence::at(seq),
        stats: super::stats::Counters::restored(EngineStats::from_words(words)),
        pool: BufPool::default(),
        tag: sb.engine_tag(),
        sb,
        health: Default::default(),
        mark_gen,
        geo,
        runtime: Default::default(),
        gate,
        draining: 0,
        waiting: 0,
        assisting: false,
        assist_last_gc: false,
        writer_steps: true,
        reuses: Default::default(),
        placement: BandPlacement::PerVolume,
        lifespans: Default::default(),
        spill: Default::default(),
        cleaning: Default::default(),
    };
    inner.place_homes();
    inner.check_invariants_unless_paged();
    Ok(inner)
}

/// Bytes the checkpoint reader holds at once.
const WINDOW_BYTES: usize = 1 << 20;

/// The checkpoint's body read from the capacity device a window at a time
/// (zone by zone on a zoned device: `zoned::read_region_part`), decoded as
/// it goes: little-endian integers, as `persist::Reader` reads a slice.
pub(super) struct RegionReader<'a> {
    dev: &'a dyn BlockDevice,
    geo: &'a CapGeometry,
    start: u64,
    /// Body bytes (the region holds them padded to whole blocks).
    len: usize,
    /// Body bytes `[buf_at, buf_at + buf.len())`.
    buf: Vec<u8>,
    buf_at: usize,
    at: usize,
}

impl<'a> RegionReader<'a> {
    pub(super) fn new(dev: &'a dyn BlockDevice, geo: &'a CapGeometry, start: u64, len: usize) -> RegionReader<'a> {
        RegionReader { dev, geo, start, len, buf: Vec::new(), buf_at: 0, at: 0 }
    }

    pub(super) fn at(&self) -> usize {
        self.at
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The rest of the current window from `at` (reading the next one if
    /// none is left), consumed: for a pass over the body (its CRC).
    pub(super) fn window(&mut self) -> Result<&[u8], EngineError> {
        if self.at >= self.buf_at + self.buf.len() {
            self.fill()?;
        }
        let from = self.at - self.buf_at;
        let end = self.buf.len().min(self.len - self.buf_at);
        self.at = self.buf_at + end;
        Ok(&self.buf[from..end])
    }

    /// Read the window holding `at` (block aligned, whole blocks).
    fn fill(&mut self) -> Result<(), EngineError> {
        let bs = BLOCK_BYTES;
        let first = self.at / bs * bs;
        let padded = self.len.div_ceil(bs) * bs;
        let n = WINDOW_BYTES.min(padded - first);
        self.buf = zoned::read_region_part(self.dev, self.geo, self.start, first as u64, n)?;
        self.buf_at = first;
        Ok(())
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], EngineError> {
        if self.at + N > self.len {
            return Err(EngineError::Checkpoint(CheckpointError(self.at)));
        }
        let mut out = [0u8; N];
        let from = self.at.wrapping_sub(self.buf_at);
        if self.at >= self.buf_at && from + N <= self.buf.len() {
            out.copy_from_slice(&self.buf[from..from + N]);
            self.at += N;
            return Ok(out);
        }
        for b in out.iter_mut() {
            if self.at >= self.buf_at + self.buf.len() {
                self.fill()?;
            }
            *b = self.buf[self.at - self.buf_at];
            self.at += 1;
        }
        Ok(out)
    }

    pub(super) fn u8(&mut self) -> Result<u8, EngineError> {
        Ok(self.take::<1>()?[0])
    }

    pub(super) fn u32(&mut self) -> Result<u32, EngineError> {
        Ok(u32::from_le_bytes(self.take()?))
    }

    pub(super) fn u64(&mut self) -> Result<u64, EngineError> {
        Ok(u64::from_le_bytes(self.take()?))
    }

    pub(super) fn opt_u32(&mut self) -> Result<Option<u32>, EngineError> {
        let v = self.u32()?;
        Ok((v != u32::MAX).then_some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::*;
    use sluice_media::MemoryDevice;

    /// What `Writer` wrote reads back through the window, across a window
    /// boundary, and a read past the body's end is refused with its offset.
    #[test]
    fn the_region_reader_reads_back_across_windows_and_rejects_truncation() {
        let mut w = Writer::default();
        w.u64(5);
        w.opt_u32(None);
        // 12 bytes, then u32s up to 4 bytes short of the first window.
        let filler = WINDOW_BYTES / 4 - 4;
        (0..filler).for_each(|i| w.u32(i as u32));
        w.u64(u64::MAX - 1);
        let len = w.0.len();
        let dev = MemoryDevice::new(2 * WINDOW_BYTES as u64, BS);
        let mut body = w.0.clone();
        body.resize(len.div_ceil(BLOCK_BYTES) * BLOCK_BYTES, 0);
        write_at(&dev, 0, &body).unwrap();
        let geo = CapGeometry::of(&dev, 1 << 20);
        let mut r = RegionReader::new(&dev, &geo, 0, len);
        assert_eq!(r.u64().unwrap(), 5);
        assert_eq!(r.opt_u32().unwrap(), None);
        for i in 0..filler {
            assert_eq!(r.u32().unwrap(), i as u32);
        }
        // This one straddles the first window's end.
        assert_eq!(r.u64().unwrap(), u64::MAX - 1);
        assert_eq!(r.at(), len);
        match r.u8() {
            Err(EngineError::Checkpoint(CheckpointError(at))) => assert_eq!(at, len),
            other => panic!("read past the end: {other:?}"),
        }
    }
}
