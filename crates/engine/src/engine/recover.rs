//! Crash recovery: rebuild every map from the media alone.
//!
//! Runs when the superblock says the engine did not shut down cleanly. The
//! steps, in order:
//! 1. **Bands.** Walk every band of the capacity device segment by segment
//!    from its start, reading headers only, until a header does not check
//!    (never written, discarded, or torn). Note the largest `flushed_seq`.
//! 2. **Chunks.** Read every log chunk whole and walk its records (on every core) from the
//!    start while they check and carry the first record's epoch (a reused
//!    chunk still holds the previous generation past its new records). Every
//!    data block's CRC is verified: a torn record keeps its intact blocks.
//! 3. **Torn segments.** Segments newer than the capacity watermark (written
//!    after the last flush the engine saw complete) may be torn: their data
//!    is read and each block's CRC verified. Older segments are trusted.
//! 4. **Resolve.** For each (volume, LBA) the entry with the highest sequence
//!    wins; a winning tombstone leaves the block unmapped. This is sound
//!    because the data path drops an entry from the media only once whatever
//!    superseded it is durable (docs/engine.md, datapath.rs rule 3).
//! 5. **Rebuild** P2L, valid counts and states: every chunk holding a valid
//!    header is Full (in epoch order, the compaction FIFO), and every band
//!    holding an entry that won (a valid block or the winning tombstone);
//!    the rest are Free, so a band reclaimed before the crash whose discard
//!    was lost is free again; nothing is open, so new writes start in fresh
//!    chunks and bands. The sequence restarts above everything seen.
//!
//! Cost: one pass over the cache device and one header read per capacity
//! segment (segments are up to ~1 MiB), so recovery time follows the cache
//! size and the capacity in use, not the number of blocks ever written.
//! Counters restart at zero after a crash (they are saved only by a clean
//! shutdown).

use super::datapath::segment_blocks;
use super::*;
use crate::layout::chunk_records;
use crate::layout::{decode_header, Header, RecordKind};

/// Where one (volume, LBA) currently resolves to during the scan.
#[derive(Clone, Copy)]
struct Best {
    seq: u64,
    /// `Loc::NONE` for a tombstone.
    loc: Loc,
    /// The block's CRC32C from its header entry (0 for a tombstone).
    crc: u32,
}

struct Scan {
    best: Vec<Vec<Best>>,
    seq_max: u64,
}

impl Scan {
    fn offer(&mut self, vol: u32, lba: u64, seq: u64, loc: Loc, crc: u32) {
        let b = &mut self.best[vol as usize][lba as usize];
        if seq > b.seq {
            *b = Best { seq, loc, crc };
        }
    }
}

/// One entry found in a chunk: a candidate for its LBA.
struct Offer {
    vol: u32,
    lba: u64,
    seq: u64,
    loc: Loc,
    crc: u32,
}

/// What one chunk holds: its epoch (None: no valid record), its entries.
struct ChunkScan {
    chunk: u32,
    epoch: Option<u64>,
    seq_max: u64,
    offers: Vec<Offer>,
}

/// Whether a header names a known volume and only LBAs inside it.
fn fits(vol_blocks: &[usize], h: &Header) -> bool {
    vol_blocks.get(h.volume as usize).is_some_and(|&n| h.entries.iter().all(|e| (e.lba as usize) < n))
}

/// Walk the records of chunk `c`, read whole into `data` (see step 2).
fn walk_chunk(c: u32, bpc: u64, data: &[u8], vol_blocks: &[usize], tag: u32) -> ChunkScan {
    let base = c as u64 * bpc;
    let mut out = ChunkScan { chunk: c, epoch: None, seq_max: 0, offers: Vec::new() };
    for (pos, h) in chunk_records(data, bpc, tag) {
        if !fits(vol_blocks, &h) {
            break;
        }
        out.epoch.get_or_insert(h.epoch);
        out.seq_max = out.seq_max.max(h.seq).max(h.epoch);
        let mut data_i = 0u64;
        for e in &h.entries {
            let (vol, lba, seq) = (h.volume, e.lba, h.seq);
            if e.tombstone {
                out.offers.push(Offer { vol, lba, seq, loc: Loc::NONE, crc: 0 });
            } else {
                let block = pos + 1 + data_i;
                let d = &data[(block * BS) as usize..((block + 1) * BS) as usize];
                if crc32c(d) == e.crc {
                    out.offers.push(Offer { vol, lba, seq, loc: Loc::cache(base + block), crc: e.crc });
                }
                data_i += 1;
            }
        }
    }
    out
}

/// A segment found in step 1: band, offset of its header, the header.
struct Segment {
    band: u32,
    pos: u64,
    header: Header,
}

pub(super) fn recover(
    cache: &dyn BlockDevice,
    capacity: &dyn BlockDevice,
    cfg: EngineConfig,
    geo: CapGeometry,
    sb: Superblock,
) -> Result<(Inner, Vec<(u32, u64)>), EngineError> {
    let chunk_count = sb.cache_bytes / cfg.chunk_bytes;
    let band_count = sb.checkpoint_offset / cfg.band_bytes;
    let mut inner = Inner::empty(cfg, geo, sb, chunk_count, band_count);
    let (bpc, bpb, usable) = (inner.blocks_per_chunk(), inner.blocks_per_band(), inner.band_usable());
    let unit = inner.cfg.write_unit_bytes / BS;
    let mut scan = Scan {
        best: inner.vols.iter().map(|v| vec![Best { seq: 0, loc: Loc::NONE, crc: 0 }; v.l2p.len()]).collect(),
        seq_max: 0,
    };
    let vol_blocks: Vec<usize> = inner.vols.iter().map(|v| v.l2p.len()).collect();
    let tag = inner.tag;

    // Step 1: band headers.
    let mut segments: Vec<Segment> = Vec::new();
    let mut cap_watermark = 0u64;
    for band in 0..band_count as u32 {
        let first = band as u64 * bpb;
        let mut pos = 0u64;
        while pos + 1 < usable {
            let hb = read_at(capacity, (first + pos) * BS, BLOCK_BYTES)?;
            let Ok(h) = decode_header(&hb, inner.tag) else { break };
            let n = h.data_blocks() as u64;
            if h.kind != RecordKind::Segment || pos + 1 + n > usable || !fits(&vol_blocks, &h) {
                break;
            }
            cap_watermark = cap_watermark.max(h.flushed_seq);
            let next = (pos + segment_blocks(n, unit)).min(usable);
            segments.push(Segment { band, pos, header: h });
            pos = next;
        }
        let b = &mut inner.bands[band as usize];
        b.written = pos;
    }

    // Step 2: the log, chunk by chunk. Workers each read a chunk (the
    // device is shared: every thread reaps its own reads), walk it and
    // CRC-check it, so reading and checking the whole cache spread over
    // every core.
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
    let next = std::sync::atomic::AtomicU64::new(1);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let found: Mutex<(Vec<ChunkScan>, Option<DeviceError>)> = Mutex::new((Vec::new(), None));
    std::thread::scope(|s| {
        for _ in 0..workers {
            let (next, stop, found, vol_blocks) = (&next, &stop, &found, &vol_blocks);
            s.spawn(move || {
                use std::sync::atomic::Ordering::Relaxed;
                let mut buf = IoBuf::zeroed((bpc * BS) as usize);
                let mut mine = Vec::new();
                let mut err = None;
                loop {
                    let c = next.fetch_add(1, Relaxed);
                    if c >= chunk_count || stop.load(Relaxed) {
                        break;
                    }
                    let req = IoRequest {
                        op: IoOp::Read,
                        offset: c * bpc * BS,
                        len: bpc * BS,
                        buf,
                        fua: false,
                        user_data: 0,
                    };
                    let done = sync_io(cache, req);
                    buf = done.buf;
                    if let Err(e) = done.result {
                        stop.store(true, Relaxed);
                        err = Some(e);
                        break;
                    }
                    mine.push(walk_chunk(c as u32, bpc, &buf, vol_blocks, tag));
                }
                let mut f = found.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                f.0.append(&mut mine);
                if f.1.is_none() {
                    f.1 = err;
                }
            });
        }
    });
    let (mut scans, read_error) = found.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    // Chunk order as before (epochs are sorted below; keep it deterministic).
    scans.sort_by_key(|cs| cs.chunk);
    if let Some(e) = read_error {
        return Err(e.into());
    }
    let mut chunk_epochs: Vec<(u64, u32)> = Vec::new();
    for cs in scans {
        let Some(e) = cs.epoch else { continue };
        let ch = &mut inner.chunks[cs.chunk as usize];
        ch.state = State::Full;
        ch.epoch = e;
        chunk_epochs.push((e, cs.chunk));
        scan.seq_max = scan.seq_max.max(cs.seq_max);
        for o in cs.offers {
            scan.offer(o.vol, o.lba, o.seq, o.loc, o.crc);
        }
    }

    // Step 3: segments, verifying data written after the last flush.
    let mut torn: Vec<(u32, u64, u64)> = Vec::new();
    for s in &segments {
        let h = &s.header;
        scan.seq_max = scan.seq_max.max(h.seq);
        let first = s.band as u64 * bpb + s.pos;
        let n = h.data_blocks();
        let verify = h.seq > cap_watermark && n > 0;
        let body = if verify { Some(read_at(capacity, (first + 1) * BS, n * BLOCK_BYTES)?) } else { None };
        let mut data_i = 0usize;
        for e in &h.entries {
            if e.tombstone {
                scan.offer(h.volume, e.lba, h.seq, Loc::NONE, 0);
                continue;
            }
            let intact =
                body.as_ref().is_none_or(|b| crc32c(&b[data_i * BLOCK_BYTES..(data_i + 1) * BLOCK_BYTES]) == e.crc);
            if intact {
                scan.offer(h.volume, e.lba, h.seq, Loc::capacity(first + 1 + data_i as u64), e.crc);
            } else {
                torn.push((h.volume, e.lba, h.seq));
            }
            data_i += 1;
        }
        let b = &mut inner.bands[s.band as usize];
        b.state = State::Full;
        b.closed_seq = b.closed_seq.max(h.seq);
        b.tombstones = b.tombstones.saturating_add(h.entries.iter().filter(|e| e.tombstone).count() as u32);
    }

    // Steps 4 and 5: winners into the L2P and the P2Ls; states and lists.
    for (vi, best) in scan.best.iter().enumerate() {
        for (lba, b) in best.iter().enumerate() {
            inner.vols[vi].l2p[lba] = b.loc;
            inner.vols[vi].crcs[lba] = b.crc;
            let owner = (vi as u32, lba as u64);
            if let Some(cb) = b.loc.cache_block() {
                let ch = &mut inner.chunks[(cb / bpc) as usize];
                ch.p2l[(cb % bpc) as usize] = owner;
                ch.valid += 1;
            } else if let Some(pb) = b.loc.capacity_block() {
                inner.bands[(pb / bpb) as usize].valid += 1;
            }
        }
    }
    // A band none of whose entries won holds nothing current: everything in
    // it lost to a newer entry on the media (a band GC reclaimed whose
    // discard was not yet durable, or one wholly superseded). It is free, as
    // before the crash. Kept Full, its dead tombstones (their LBAs are
    // unmapped) would have GC copy them into a GC band, taking the free band
    // it frees: with every free band brought back that way, none is left.
    let mut live: Vec<bool> = inner.bands.iter().map(|b| b.valid > 0).collect();
    for s in &segments {
        let h = &s.header;
        let best = &scan.best[h.volume as usize];
        live[s.band as usize] |= h.entries.iter().any(|e| {
            let w = best[e.lba as usize];
            e.tombstone && w.seq == h.seq && w.loc.is_none()
        });
    }
    for (b, band) in inner.bands.iter_mut().enumerate() {
        if !live[b] {
            band.state = State::Free;
        }
    }
    chunk_epochs.sort_unstable();
    inner.full_chunks = chunk_epochs.iter().map(|&(_, c)| c).collect();
    inner.free_chunks = (1..chunk_count as u32).filter(|&c| inner.chunks[c as usize].state == State::Free).collect();
    for b in inner.bands.iter_mut().filter(|b| b.state == State::Free) {
        b.written = 0;
        b.tombstones = 0;
    }
    inner.free_bands = (0..band_count as u32).filter(|&b| inner.bands[b as usize].state == State::Free).collect();
    inner.seq = scan.seq_max + 1;
    inner.cache_flushed_seq = inner.seq;
    inner.cap_flushed_seq = inner.seq;
    inner.check_invariants();
    // On a zoned device: reset zones now free, finish zones now full.
    zoned::reconcile(capacity, &inner)?;
    // A torn segment stays on the media with a sequence above the copy that
    // won instead; once later headers' watermarks pass it, a later recovery
    // would trust it unverified. Such blocks are written again (`relog`).
    let mut superseded: Vec<(u32, u64)> = torn
        .into_iter()
        .filter(|&(v, lba, seq)| scan.best[v as usize][lba as usize].seq < seq)
        .map(|(v, lba, _)| (v, lba))
        .collect();
    superseded.sort_unstable();
    superseded.dedup();
    Ok((inner, superseded))
}
