//! Step 2 of recovery: the log, chunk by chunk, on every core.
//!
//! Each worker reads a chunk forward through a 2 MiB window
//! (`ChunkWindow`), walks its records of the chunk's newest generation
//! (`walk_chunk`), checks every data block's CRC, and hands the entries to
//! the resolver at once; the records themselves are kept only as runs of
//! consecutive LSNs (`LsnRun`), for step 3 (lsns.rs).

use super::resolver::{Offer, Resolver, PAST_GAP, TOMBSTONE_CRC};
use crate::engine::l2p::Loc;
use crate::engine::{EngineError, BS};
use crate::layout::{crc32c, record_at, Header, RecordKind, BLOCK_BYTES};
use sluice_media::device::sync_io;
use sluice_media::{BlockDevice, DeviceError, IoBuf, IoOp, IoRequest};
use std::sync::Mutex;

/// A record found in a chunk.
pub(super) struct Found {
    pub(super) pos: u64,
    pub(super) lsn: u64,
    pub(super) seq: u64,
}

/// What one chunk holds: its epoch (None: no valid record), its records,
/// their entries, the watermarks they carry.
pub(super) struct ChunkScan {
    pub(super) chunk: u32,
    pub(super) epoch: Option<u64>,
    /// The records as walked; once listed with the resolver, kept only as
    /// `runs` (and `seq_max`), a few bytes per run of consecutive LSNs.
    pub(super) records: Vec<Found>,
    pub(super) runs: Vec<LsnRun>,
    pub(super) seq_max: u64,
    pub(super) offers: Vec<Offer>,
    pub(super) head_lsn: u64,
    pub(super) flushed_lsn: u64,
    /// LSN ranges earlier recoveries accepted as torn (gap records).
    pub(super) gaps: Vec<(u64, u64)>,
    /// In place, the Clean records' claims: (volume, LBA, CRC of the copy
    /// claimed clean, the record's sequence and LSN).
    pub(super) claims: Vec<(u32, u64, u32, u64, u64)>,
}

/// Records of one chunk with consecutive LSNs `first..first + count`, the
/// first at block `first_pos` of the chunk and the last at `last_pos`.
pub(super) struct LsnRun {
    pub(super) first: u64,
    pub(super) count: u64,
    pub(super) chunk: u32,
    pub(super) first_pos: u64,
    pub(super) last_pos: u64,
}

impl ChunkScan {
    /// Fold `records` into `runs` and `seq_max`, and drop them.
    fn fold_records(&mut self) {
        for r in std::mem::take(&mut self.records) {
            self.seq_max = self.seq_max.max(r.seq);
            match self.runs.last_mut() {
                Some(run) if run.first + run.count == r.lsn => {
                    run.count += 1;
                    run.last_pos = r.pos;
                }
                _ => self.runs.push(LsnRun {
                    first: r.lsn,
                    count: 1,
                    chunk: self.chunk,
                    first_pos: r.pos,
                    last_pos: r.pos,
                }),
            }
        }
    }
}

/// Whether a header names a known volume and only LBAs inside it (a gap
/// record names LSNs, and no data).
pub(super) fn fits(vol_blocks: &[usize], h: &Header) -> bool {
    if h.kind == RecordKind::Gap {
        return h.entries.iter().all(|e| e.tombstone);
    }
    vol_blocks.get(h.volume as usize).is_some_and(|&n| h.entries.iter().all(|e| (e.lba as usize) < n))
}

/// Blocks a recovery worker reads of a chunk at once (2 MiB): more than
/// the largest record, so a record is read in at most two reads, and far
/// less than a chunk (16 MiB by default), which recovery never holds whole.
const WINDOW_BLOCKS: u64 = 512;

/// One chunk read forward through a window: the walk goes forward, so
/// each block is read once (twice for a chunk whose first record is
/// damaged: its generation is searched for first).
struct ChunkWindow<'a> {
    dev: &'a dyn BlockDevice,
    /// The chunk's first block on the device, and its blocks.
    base: u64,
    bpc: u64,
    buf: Option<IoBuf>,
    /// Chunk blocks [start, start + len) are in `buf`; len 0: none yet.
    start: u64,
    len: u64,
}

impl<'a> ChunkWindow<'a> {
    fn new(dev: &'a dyn BlockDevice, c: u32, bpc: u64, buf: IoBuf) -> ChunkWindow<'a> {
        ChunkWindow { dev, base: c as u64 * bpc, bpc, buf: Some(buf), start: 0, len: 0 }
    }

    /// Block `p` of the chunk.
    fn block(&mut self, p: u64) -> Result<&[u8], DeviceError> {
        if !(self.start..self.start + self.len).contains(&p) {
            let len = WINDOW_BLOCKS.min(self.bpc);
            let start = p.min(self.bpc - len);
            let buf = self.buf.take().expect("the window's buffer");
            let req = IoRequest {
                op: IoOp::Read,
                offset: (self.base + start) * BS,
                len: len * BS,
                buf,
                fua: false,
                user_data: 0,
            };
            let done = sync_io(self.dev, req);
            self.buf = Some(done.buf);
            done.result?;
            (self.start, self.len) = (start, len);
        }
        let at = ((p - self.start) * BS) as usize;
        Ok(&self.buf.as_ref().expect("the window's buffer")[at..at + BLOCK_BYTES])
    }

    /// The whole record of this engine that starts at block `p`, if any.
    fn record(&mut self, p: u64, vol_blocks: &[usize], tag: u32) -> Result<Option<Header>, DeviceError> {
        let bpc = self.bpc;
        Ok(record_at(self.block(p)?, p, bpc, tag).filter(|h| fits(vol_blocks, h)))
    }

    /// The first record at or after `from` that `want` accepts.
    fn next_record(
        &mut self,
        from: u64,
        vol_blocks: &[usize],
        tag: u32,
        want: impl Fn(&Header) -> bool,
    ) -> Result<Option<(u64, Header)>, DeviceError> {
        for p in from..self.bpc {
            if let Some(h) = self.record(p, vol_blocks, tag)?.filter(&want) {
                return Ok(Some((p, h)));
            }
        }
        Ok(None)
    }

    fn into_buf(self) -> IoBuf {
        self.buf.expect("the window's buffer")
    }
}

/// Walk the records of chunk `c` (see step 2), read through `w`.
fn walk_chunk(c: u32, w: &mut ChunkWindow, vol_blocks: &[usize], tag: u32) -> Result<ChunkScan, DeviceError> {
    let bpc = w.bpc;
    let base = c as u64 * bpc;
    let mut out = ChunkScan {
        chunk: c,
        epoch: None,
        records: Vec::new(),
        runs: Vec::new(),
        seq_max: 0,
        offers: Vec::new(),
        head_lsn: 0,
        flushed_lsn: 0,
        gaps: Vec::new(),
        claims: Vec::new(),
    };
    // The chunk's generation: its first record's, or if that one is
    // damaged, the newest found anywhere in it (old generations lie past
    // the current one's records, never before).
    let epoch = match w.record(0, vol_blocks, tag)? {
        Some(h) => h.epoch,
        None => {
            let mut newest = None;
            for p in 1..bpc {
                if let Some(h) = w.record(p, vol_blocks, tag)? {
                    newest = newest.max(Some(h.epoch));
                }
            }
            match newest {
                Some(e) => e,
                None => return Ok(out),
            }
        }
    };
    out.epoch = Some(epoch);
    let (mut pos, _) = w.next_record(0, vol_blocks, tag, |h| h.epoch == epoch)?.expect("found above");
    let mut last_lsn = 0;
    let mut usable = pos == 0;
    while pos < bpc {
        let h = match w.record(pos, vol_blocks, tag)?.filter(|h| h.epoch == epoch && h.lsn > last_lsn) {
            Some(h) => h,
            // The end, a torn record, or damage: go on at the next record
            // of this generation, if any (step 3 tells which it was).
            None => match w.next_record(pos + 1, vol_blocks, tag, |h| h.epoch == epoch && h.lsn > last_lsn)? {
                Some((p, _)) => {
                    pos = p;
                    usable = false;
                    continue;
                }
                None => break,
            },
        };
        out.head_lsn = out.head_lsn.max(h.head_lsn);
        out.flushed_lsn = out.flushed_lsn.max(h.flushed_lsn);
        out.records.push(Found { pos, lsn: h.lsn, seq: h.seq.max(h.epoch) });
        last_lsn = h.lsn;
        if h.kind == RecordKind::Gap {
            out.gaps.extend(h.entries.iter().map(|e| (e.lba, e.lba + e.crc as u64)));
        }
        if h.kind == RecordKind::Clean {
            out.claims.extend(h.entries.iter().map(|e| (h.volume, e.lba, e.crc, h.seq, h.lsn)));
        }
        if matches!(h.kind, RecordKind::Gap | RecordKind::Clean) {
            pos += 1;
            continue;
        }
        let past_gap = !usable;
        let mut data_i = 0u64;
        for e in &h.entries {
            let (vol, lba, seq, lsn) = (h.volume, e.lba, h.seq, h.lsn);
            if e.tombstone {
                let loc = Loc::cache(base + pos);
                out.offers.push(Offer { vol, lba, seq, lsn, loc, crc: TOMBSTONE_CRC, intact: true, past_gap });
            } else {
                let b = pos + 1 + data_i;
                let intact = crc32c(w.block(b)?) == e.crc;
                out.offers.push(Offer { vol, lba, seq, lsn, loc: Loc::cache(base + b), crc: e.crc, intact, past_gap });
                data_i += 1;
            }
        }
        pos += 1 + data_i;
    }
    Ok(out)
}

/// What step 2 found: every chunk's scan (in chunk order), the resolver
/// with the intact entries offered, the entries left for step 3 (their data
/// did not check), and the lowest LSN offered.
pub(super) struct LogScan {
    pub(super) scans: Vec<ChunkScan>,
    pub(super) res: Resolver,
    pub(super) deferred: Vec<Offer>,
    pub(super) lowest: u64,
}

/// Step 2: workers each read a chunk (the device is shared: every thread
/// reaps its own reads), walk it and CRC-check it, so reading and checking
/// the whole cache spread over every core; then, under the resolver's lock,
/// its intact entries at or above `guess` (the log's head as far as known)
/// are offered at once (queued, and applied page by page in step 5 with
/// the segments': `Resolver::queue`) and only the rest is kept for step 3,
/// which needs every chunk's watermark.
pub(super) fn scan_chunks(
    cache: &dyn BlockDevice,
    chunk_count: u64,
    bpc: u64,
    vol_blocks: &[usize],
    tag: u32,
    guess: u64,
    res: Resolver,
) -> Result<LogScan, EngineError> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
    let next = std::sync::atomic::AtomicU64::new(1);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let found: Mutex<(Vec<ChunkScan>, Option<EngineError>)> = Mutex::new((Vec::new(), None));
    // (resolver, entries kept for step 3, the lowest LSN offered)
    let shared = Mutex::new((res, Vec::<Offer>::new(), u64::MAX));
    std::thread::scope(|s| {
        for _ in 0..workers {
            let (next, stop, found, shared) = (&next, &stop, &found, &shared);
            s.spawn(move || {
                use std::sync::atomic::Ordering::Relaxed;
                let mut buf = IoBuf::zeroed((WINDOW_BLOCKS.min(bpc) * BS) as usize);
                let mut mine = Vec::new();
                let mut err = None;
                loop {
                    let c = next.fetch_add(1, Relaxed);
                    if c >= chunk_count || stop.load(Relaxed) {
                        break;
                    }
                    let mut w = ChunkWindow::new(cache, c as u32, bpc, buf);
                    let walked = walk_chunk(c as u32, &mut w, vol_blocks, tag);
                    buf = w.into_buf();
                    let mut cs = match walked {
                        Ok(cs) => cs,
                        Err(e) => {
                            stop.store(true, Relaxed);
                            err = Some(e.into());
                            break;
                        }
                    };
                    let mut sh = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let (res, deferred, lowest) = &mut *sh;
                    res.chunk_pos[c as usize] = cs.records.iter().map(|r| r.pos as u32).collect();
                    res.chunk_seq[c as usize] = cs.records.iter().map(|r| r.seq).collect();
                    let mut offered = Ok(());
                    for o in cs.offers.drain(..).filter(|o| o.lsn >= guess) {
                        if o.intact {
                            let flags = if o.past_gap { PAST_GAP } else { 0 };
                            *lowest = (*lowest).min(o.lsn);
                            offered = offered.and_then(|()| res.queue(o.queued(flags)));
                        } else {
                            deferred.push(o);
                        }
                    }
                    drop(sh);
                    if let Err(e) = offered {
                        stop.store(true, Relaxed);
                        err = Some(super::map_error(e));
                        break;
                    }
                    cs.offers = Vec::new();
                    cs.fold_records();
                    mine.push(cs);
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
    let (res, deferred, lowest) = shared.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    // Chunk order as before (epochs are sorted below; keep it deterministic).
    scans.sort_by_key(|cs| cs.chunk);
    if let Some(e) = read_error {
        return Err(e);
    }
    Ok(LogScan { scans, res, deferred, lowest })
}
