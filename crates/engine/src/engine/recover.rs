//! Crash recovery: rebuild every map from the media alone, and tell a torn
//! tail from corruption.
//!
//! Runs when the superblock says the engine did not shut down cleanly (and
//! for `sluice check`, which only reads). The steps, in order:
//! 1. **Bands.** Walk every band of the capacity device segment by segment
//!    from its start, reading headers only, while they check and carry the
//!    band's epoch. Note the largest `flushed_seq` (the capacity watermark).
//! 2. **Chunks.** Read every log chunk whole (on every core) and walk its
//!    records of the chunk's newest epoch (a reused chunk still holds the
//!    previous generation past its new records). A header that does not
//!    check is skipped over to the next record of the same epoch with a
//!    higher LSN, if there is one. Every data block's CRC is verified.
//! 3. **Torn or damaged.** The log's records are numbered: every LSN from
//!    the head (`head_lsn`, the oldest record still needed) up to the
//!    watermark (`flushed_lsn`, the newest a flush made durable) must be
//!    found, and their data must check; below the watermark a missing
//!    record or a bad block is **damage**, above it a torn write. For bands:
//!    the last capacity mark (marks.rs) says how far each band then open
//!    must read back; a band that a later band of its stream follows must be
//!    complete once that later band's first segment is durable; and a bad
//!    header followed by a durable segment of the same band is a hole. A
//!    damaged block that lost to a newer copy does no harm and is not
//!    reported. Segments newer than the capacity watermark may be torn:
//!    their data is read and each block's CRC verified.
//! 4. **Resolve.** For each (volume, LBA) the entry with the highest sequence
//!    wins; a winning tombstone leaves the block unmapped. Entries are
//!    offered as they are read, straight into the L2P (`Resolver`). This is sound
//!    because the data path drops an entry from the media only once whatever
//!    superseded it is durable (docs/engine.md, datapath.rs rule 3).
//! 5. **Rebuild** P2L, valid counts and states: every chunk holding a record
//!    at or above the head is Full (in epoch order, the compaction FIFO), and
//!    every band holding an entry that won (a valid block or the winning
//!    tombstone); the rest are Free, so a band reclaimed before the crash
//!    whose discard was lost is free again; nothing is open, so new writes
//!    start in fresh chunks and bands. The sequence restarts above
//!    everything seen.
//!
//! Nothing here writes: `scan` returns the state, the damage found and the
//! blocks to write again; `Engine::open` refuses damage unless told to
//! salvage, then reconciles zones and rewrites. Damaged blocks that won stay
//! mapped with their CRC, so reading them fails (EIO) instead of returning
//! an older copy or zeros.
//!
//! Cost: one pass over the cache device and two header reads per capacity
//! segment (segments are up to ~1 MiB), so recovery time follows the cache
//! size and the capacity in use, not the number of blocks ever written.
//! Memory: the engine being rebuilt and little more. Entries are resolved
//! in place in its L2P (`Resolver`: a place's sequence is found from the
//! record or segment holding it, listed with 12 bytes per record), segment
//! headers are read again rather than kept, each worker reads its chunk
//! through a 2 MiB window, and the log's records are kept only as runs of
//! consecutive LSNs. `sluice bench recovery` reports the peak against the
//! engine's steady state (1.25x with its defaults: 8 GiB cache, 16 GiB
//! volume; it was 3.45x with a 16-byte-per-block table and every header
//! kept), and the crash reopen got faster (1.6–1.9 s → 1.2 s).
//! Counters restart at zero after a crash (they are saved only by a clean
//! shutdown).

use super::marks::{read_mark, Mark, RECLAIMED};
use super::segments::segment_blocks;
use super::*;
use crate::layout::{decode_header, record_at, Header, HeaderError, RecordKind, STREAM_GC};

/// Damage recovery found: something a completed flush made durable is not
/// on the media as written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Damage {
    /// Durable log records `from_lsn..=to_lsn` are missing or their headers
    /// do not check (their LBAs are unknown: whatever they held would revert
    /// to older copies).
    LogRecords { from_lsn: u64, to_lsn: u64, chunk: u32, near_block: u64 },
    /// A data block of a durable log record does not match its CRC, and it
    /// is the block's newest copy.
    LogBlock { volume: String, lba: u64, chunk: u32, block: u64 },
    /// Segments a band must hold are missing or do not check, in blocks
    /// [from, to) of the band.
    Segments { band: u32, from: u64, to: u64 },
    /// A capacity mark slot carries the mark's magic but does not check.
    Mark,
    /// A mapped block's data does not match its CRC (`sluice check` reads
    /// them all; recovery trusts durable segments' data).
    Block { volume: String, lba: u64, device: &'static str, offset: u64 },
    /// The clean-shutdown checkpoint maps a block elsewhere than the media do.
    Checkpoint { volume: String, lba: u64 },
    /// The clean-shutdown checkpoint does not check (or does not decode).
    CheckpointUnreadable,
}

impl Damage {
    /// The bands `damage` finds damaged, each once, ascending.
    pub(super) fn bands(damage: &[Damage]) -> Vec<u32> {
        let mut bands: Vec<u32> = damage
            .iter()
            .filter_map(|d| if let Damage::Segments { band, .. } = d { Some(*band) } else { None })
            .collect();
        bands.sort_unstable();
        bands.dedup();
        bands
    }
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::LogRecords { from_lsn, to_lsn, chunk, near_block } => write!(
                f,
                "log records {from_lsn}..={to_lsn} (chunk {chunk}, near block {near_block}) are missing or their \
                 headers are damaged; the blocks they held are unknown"
            ),
            Damage::LogBlock { volume, lba, chunk, block } => {
                write!(f, "volume {volume:?} LBA {lba}: its newest copy (log chunk {chunk}, block {block}) is damaged")
            }
            Damage::Segments { band, from, to } => {
                write!(f, "band {band}: segments in blocks {from}..{to} are missing or damaged")
            }
            Damage::Mark => write!(f, "a capacity mark (cache device block 2 or 3) is damaged"),
            Damage::Block { volume, lba, device, offset } => {
                write!(f, "volume {volume:?} LBA {lba}: data damaged ({device} device, byte {offset})")
            }
            Damage::Checkpoint { volume, lba } => {
                write!(f, "volume {volume:?} LBA {lba}: the checkpoint and the media disagree")
            }
            Damage::CheckpointUnreadable => write!(f, "the clean-shutdown checkpoint is damaged"),
        }
    }
}

/// How far above the highest sequence it found a recovery restarts
/// numbering: more than the sequences an engine can issue between a crash
/// and the last record recovery still finds (each needs a record, a segment
/// or a new chunk or band, and no more of those are written without a flush
/// than the two devices hold blocks, far below 2^32 here), so that no
/// leftover of a torn write ever shares an epoch with a new chunk or band
/// (2^32 recoveries before sequences run out).
const SEQ_RESTART_GAP: u64 = 1 << 32;

/// The CRC a winning tombstone carries in the L2P being built, so that
/// step 5 looks up its record (`Resolver::seq_at`, which says it is one)
/// only for entries carrying this value, not for every mapped block.
const TOMBSTONE_CRC: u32 = 0x7f0e_57a1;

/// The copy's data did not check although it was durable.
const DAMAGED: u8 = 1;
/// The copy is in a log record past a gap in its chunk (`Offer::past_gap`).
const PAST_GAP: u8 = 2;

/// Step 4 done in place, so that recovery needs no more memory per block
/// than the engine it rebuilds: each offer goes straight into the L2P it
/// is building, and wins if its sequence is higher than that of the copy
/// the entry points at now. That sequence is found from the place itself:
/// every record of a chunk and every segment of a band is listed with its
/// header's block and sequence (a few bytes per record, not per block), and
/// a place belongs to the last record starting at or before it. A winning
/// tombstone points at its own record's header block (no data block is
/// ever there) until step 5 unmaps it. The rare flags (`DAMAGED`,
/// `PAST_GAP`) of current winners live in a map beside.
struct Resolver {
    vols: Vec<Vol>,
    bpc: u64,
    bpb: u64,
    /// Per chunk and per band: header blocks (ascending) and sequences.
    chunk_pos: Vec<Vec<u32>>,
    chunk_seq: Vec<Vec<u64>>,
    band_pos: Vec<Vec<u32>>,
    band_seq: Vec<Vec<u64>>,
    flags: std::collections::HashMap<(u32, u64), u8>,
    seq_max: u64,
}

impl Resolver {
    /// The sequence of the record or segment holding `loc`, and whether
    /// `loc` is its header block (a tombstone's place); (0, false) for none.
    fn seq_at(&self, loc: Loc) -> (u64, bool) {
        let (pos, seq, at) = if let Some(cb) = loc.cache_block() {
            let c = (cb / self.bpc) as usize;
            (&self.chunk_pos[c], &self.chunk_seq[c], (cb % self.bpc) as u32)
        } else if let Some(pb) = loc.capacity_block() {
            let b = (pb / self.bpb) as usize;
            (&self.band_pos[b], &self.band_seq[b], (pb % self.bpb) as u32)
        } else {
            return (0, false);
        };
        let i = pos.partition_point(|&p| p <= at);
        assert!(i > 0, "{loc:?} lies in no listed record");
        (seq[i - 1], pos[i - 1] == at)
    }

    /// A copy of (vol, LBA) with sequence `seq` at `loc` (a data block, or
    /// for a tombstone its record's header block).
    fn offer(&mut self, vol: u32, lba: u64, seq: u64, loc: Loc, crc: u32, flags: u8) {
        let cur = self.vols[vol as usize].l2p.get(lba as usize);
        if seq > self.seq_at(cur).0 {
            self.vols[vol as usize].l2p.set(lba as usize, loc, crc);
            if flags != 0 {
                self.flags.insert((vol, lba), flags);
            } else if !self.flags.is_empty() {
                self.flags.remove(&(vol, lba));
            }
        }
    }

    /// The flags of (vol, LBA)'s current copy.
    fn flags_of(&self, vol: u32, lba: u64) -> u8 {
        if self.flags.is_empty() {
            return 0;
        }
        self.flags.get(&(vol, lba)).copied().unwrap_or(0)
    }
}

/// One entry found in a chunk: a candidate for its LBA.
struct Offer {
    vol: u32,
    lba: u64,
    seq: u64,
    lsn: u64,
    loc: Loc,
    crc: u32,
    /// The data block matched its CRC (always true for tombstones).
    intact: bool,
    /// From a record past a gap (a torn or damaged record) in its chunk.
    /// It counts, but the compactor walks a chunk from its start and stops
    /// at the first gap, so nothing may stay pointing beyond one: such
    /// entries that win are written again (`relog`).
    past_gap: bool,
}

/// A record found in a chunk.
struct Found {
    pos: u64,
    lsn: u64,
    seq: u64,
}

/// What one chunk holds: its epoch (None: no valid record), its records,
/// their entries, the watermarks they carry.
struct ChunkScan {
    chunk: u32,
    epoch: Option<u64>,
    /// The records as walked; once listed with the resolver, kept only as
    /// `runs` (and `seq_max`), a few bytes per run of consecutive LSNs.
    records: Vec<Found>,
    runs: Vec<LsnRun>,
    seq_max: u64,
    offers: Vec<Offer>,
    head_lsn: u64,
    flushed_lsn: u64,
    /// LSN ranges earlier recoveries accepted as torn (gap records).
    gaps: Vec<(u64, u64)>,
}

/// Records of one chunk with consecutive LSNs `first..first + count`, the
/// first at block `first_pos` of the chunk and the last at `last_pos`.
struct LsnRun {
    first: u64,
    count: u64,
    chunk: u32,
    first_pos: u64,
    last_pos: u64,
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
fn fits(vol_blocks: &[usize], h: &Header) -> bool {
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
        if h.kind == RecordKind::Gap {
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

/// What a band's walk found: where it stopped, and how.
struct BandWalk {
    /// The epoch of its segments (None: no segment).
    epoch: Option<u64>,
    /// Block where the walk stopped.
    stop: u64,
    /// The block there holds something that is not a header of this
    /// engine's, and not zeros: a damaged header, or a torn write.
    garbage: bool,
    /// Its first segment's header (what it names as its stream's previous
    /// band, and its sequence).
    first: Option<FirstSegment>,
}

#[derive(Clone, Copy)]
struct FirstSegment {
    seq: u64,
    stream: u32,
    prev_epoch: u64,
    prev_end: u64,
}

/// Each stream's newest full band after a recovery (`Vol::last_band`,
/// `Inner::gc_last_band`). Named — by the next band each stream opens and in
/// marks — only once the reopen's repairs are done: until `relog` has
/// superseded their torn copies, a claim on them would have a later
/// recovery trust what is torn.
pub(super) struct LastBands {
    vols: Vec<Option<(u32, u64)>>,
    gc: Option<(u32, u64)>,
}

impl LastBands {
    pub(super) fn apply(self, inner: &mut Inner) {
        inner.vols.iter_mut().zip(self.vols).for_each(|(v, l)| v.last_band = l);
        inner.bands.gc_last = self.gc;
    }
}

/// The result of a recovery scan (nothing written yet).
pub(super) struct Recovered {
    pub inner: Inner,
    /// Blocks to write again (`Engine::relog`): torn segment copies that
    /// lost, which a later recovery could otherwise trust.
    pub superseded: Vec<(u32, u64)>,
    /// LSN ranges this recovery accepts as missing (torn, or damaged when
    /// salvaging), to be logged (`Engine::log_gaps`) before anything else.
    pub gaps: Vec<(u64, u64)>,
    /// Capacity blocks where a band's walk stopped at a torn header, to be
    /// zeroed: the segments past it were never durable, and must not look
    /// so to a later recovery once flushes have passed their sequence.
    pub torn_headers: Vec<u64>,
    /// Free bands still holding segments, to be discarded before reuse.
    pub stale_bands: Vec<u32>,
    /// Bands whose predecessor in their stream is shorter than they say,
    /// while nothing shows their own first segment durable: the
    /// predecessor's tail was torn, not damaged. Each is emptied and
    /// discarded (`Engine::empty_bands`) so that no later flush makes its
    /// claim look durable.
    pub voided: Vec<u32>,
    /// Each stream's newest full band, for `LastBands::apply` once the
    /// repairs are done.
    pub last_bands: LastBands,
    /// The last capacity mark found (`marks::write_mark_now` carries it on).
    pub mark: Option<Mark>,
    pub damage: Vec<Damage>,
}

pub(super) fn scan(
    cache: &dyn BlockDevice,
    capacity: &dyn BlockDevice,
    cfg: EngineConfig,
    geo: CapGeometry,
    sb: Superblock,
) -> Result<Recovered, EngineError> {
    let mut head_guess = None;
    loop {
        match scan_with(cache, capacity, cfg.clone(), geo, sb.clone(), head_guess)? {
            Ok(r) => return Ok(r),
            Err(head) => head_guess = Some(head),
        }
    }
}

/// One scan, taking the log's head to be `head_guess` (by default the
/// capacity mark's) while it offers the log's entries; `Err(head)` if the
/// records name a later head, to be scanned again with it.
fn scan_with(
    cache: &dyn BlockDevice,
    capacity: &dyn BlockDevice,
    cfg: EngineConfig,
    geo: CapGeometry,
    sb: Superblock,
    head_guess: Option<u64>,
) -> Result<Result<Recovered, u64>, EngineError> {
    let chunk_count = sb.cache_bytes / cfg.chunk_bytes;
    let band_count = sb.checkpoint_offset / cfg.band_bytes;
    let mut inner = Inner::empty(cfg, geo, sb, chunk_count, band_count);
    let (bpc, bpb, usable) = (inner.blocks_per_chunk(), inner.blocks_per_band(), inner.band_usable());
    let unit = inner.cfg.write_unit_bytes / BS;
    let vol_blocks: Vec<usize> = inner.vols.iter().map(|v| v.l2p.len()).collect();
    let tag = inner.tag;
    let mut damage = Vec::new();
    let (mark, mark_damaged) = read_mark(cache, tag)?;
    if mark_damaged {
        damage.push(Damage::Mark);
    }

    // Step 1: band headers. Each segment is listed (header block and
    // sequence); its entries are read again in step 3, once the watermark
    // and the bands' durable pointers say whether its data needs checking
    // (keeping every header's entries would cost 16 bytes per block).
    let mut band_pos: Vec<Vec<u32>> = vec![Vec::new(); band_count as usize];
    let mut band_seq: Vec<Vec<u64>> = vec![Vec::new(); band_count as usize];
    let mut walks: Vec<BandWalk> = Vec::with_capacity(band_count as usize);
    let mut cap_watermark = 0u64;
    let segment_at = |band: u64, pos: u64| -> Result<Result<Header, bool>, EngineError> {
        let hb = read_at(capacity, (band * bpb + pos) * BS, BLOCK_BYTES)?;
        let h = decode_header(&hb, tag);
        Ok(match h {
            Ok(h)
                if h.kind == RecordKind::Segment
                    && pos + 1 + h.data_blocks() as u64 <= usable
                    && fits(&vol_blocks, &h) =>
            {
                Ok(h)
            }
            // A header of another engine, or nothing at all: not garbage.
            Err(HeaderError::OtherEngine(_)) => Err(false),
            Err(HeaderError::NoMagic) => Err(hb.iter().any(|&x| x != 0)),
            _ => Err(true),
        })
    };
    for band in 0..band_count as u32 {
        let mut w = BandWalk { epoch: None, stop: 0, garbage: false, first: None };
        let mut pos = 0u64;
        while pos + 1 < usable {
            let h = match segment_at(band as u64, pos)? {
                Ok(h) if w.epoch.is_none_or(|e| e == h.epoch) => h,
                // A previous generation's segment: this one's end.
                Ok(_) => break,
                Err(garbage) => {
                    w.garbage = garbage;
                    break;
                }
            };
            cap_watermark = cap_watermark.max(h.flushed_seq);
            w.epoch.get_or_insert(h.epoch);
            w.first.get_or_insert(FirstSegment {
                seq: h.seq,
                stream: h.stream,
                prev_epoch: h.prev_epoch,
                prev_end: h.prev_end,
            });
            let next = (pos + segment_blocks(h.data_blocks() as u64, unit)).min(usable);
            band_pos[band as usize].push(pos as u32);
            band_seq[band as usize].push(h.seq);
            pos = next;
        }
        w.stop = pos;
        inner.bands[band as usize].written = pos;
        inner.bands[band as usize].epoch = w.epoch.unwrap_or(0);
        walks.push(w);
    }
    // Chains: a band names the one its stream filled before it and how far
    // that one reached. Once the naming band's first segment is known
    // durable — a later header's watermark passed it, or the last mark
    // covers it — a flush came after every write of the named band, so the
    // named band must read back that far: short of it is damage. Otherwise
    // a short predecessor is a torn tail, and the naming band is voided.
    // The last mark's entry for a band, if it lists it.
    let marked_band = |band: usize| mark.as_ref().and_then(|m| m.bands.iter().find(|mb| mb.band as usize == band));
    let by_epoch: std::collections::HashMap<u64, usize> =
        walks.iter().enumerate().filter_map(|(b, w)| w.epoch.map(|e| (e, b))).collect();
    let mut chain_end = vec![0u64; walks.len()];
    let mut voided = Vec::new();
    for (b, w) in walks.iter().enumerate() {
        let Some(f) = w.first.filter(|f| f.prev_epoch != 0) else { continue };
        let Some(&a) = by_epoch.get(&f.prev_epoch) else { continue };
        if walks[a].stop >= f.prev_end {
            continue;
        }
        let marked = marked_band(b);
        let covered = marked.is_some_and(|mb| Some(mb.epoch) == w.epoch && mb.written != RECLAIMED && mb.written > 0);
        if f.seq <= cap_watermark || covered {
            chain_end[a] = chain_end[a].max(f.prev_end);
        } else {
            voided.push(b as u32);
        }
    }
    let mut torn_headers = Vec::new();
    // Per band, how far its segments are known durable (and so damaged,
    // never torn, if they do not check).
    let mut durable_end = vec![0u64; walks.len()];
    for (band, w) in walks.iter().enumerate() {
        // How far the band must read back: the last mark's pointer for it.
        let marked = marked_band(band).filter(|mb| w.epoch.is_none_or(|e| e == mb.epoch));
        // GC reclaimed this generation of the band just before the last
        // mark: everything in it was relocated; its discard, and whatever
        // was written into it since, may be lost in any part.
        if marked.is_some_and(|mb| mb.written == RECLAIMED) {
            continue;
        }
        let mut must = (marked.map_or(0, |mb| mb.written as u64)).max(chain_end[band]);
        // A damaged header with a durable segment of the same band after it.
        if w.garbage {
            let mut p = (w.stop / unit + 1) * unit;
            while p + 1 < usable {
                if let Ok(h) = segment_at(band as u64, p)? {
                    if w.epoch.is_none_or(|e| e == h.epoch) && h.seq <= cap_watermark {
                        must = must.max(p + 1);
                    }
                    break;
                }
                p += unit;
            }
        }
        // Block 0 of a band only ever holds a segment header, and a 4 KiB
        // write lands whole or not at all: anything there but a header
        // (of this band's generation or an older one) or zeros is damage,
        // never a torn write. (At a later block, leftovers of an older
        // generation's data are.)
        if w.stop == 0 && w.garbage {
            must = must.max(1);
        }
        durable_end[band] = must;
        if w.stop + 1 >= usable {
            continue;
        }
        if w.stop < must {
            damage.push(Damage::Segments { band: band as u32, from: w.stop, to: must });
        } else if w.garbage && !geo.zoned {
            // A torn write, accepted: zeroed (`Engine::open`), or a later
            // flush would make what lies after it look durable.
            torn_headers.push(band as u64 * bpb + w.stop);
        }
    }

    // Step 3 for segments: each segment's header read again, its entries
    // offered; the data of those written after the last flush verified.
    let mut res = Resolver {
        vols: std::mem::take(&mut inner.vols),
        bpc,
        bpb,
        chunk_pos: vec![Vec::new(); chunk_count as usize],
        chunk_seq: vec![Vec::new(); chunk_count as usize],
        band_pos,
        band_seq,
        flags: std::collections::HashMap::new(),
        seq_max: 0,
    };
    let mut torn: Vec<(u32, u64, u64)> = Vec::new();
    for (band, &durable) in durable_end.iter().enumerate() {
        for i in 0..res.band_pos[band].len() {
            let pos = res.band_pos[band][i] as u64;
            // It checked in step 1: a device that now reads otherwise is failing (EIO).
            let Ok(h) = segment_at(band as u64, pos)? else {
                return Err(EngineError::Device(DeviceError::Io { errno: 5 }));
            };
            res.seq_max = res.seq_max.max(h.seq).max(h.epoch);
            let first = band as u64 * bpb + pos;
            let n = h.data_blocks();
            // After the watermark a segment may be torn, unless a mark or
            // the next band of its stream says it was durable: then it is
            // trusted as those before the watermark are, and a damaged block
            // in it fails its reads (EIO) instead of quietly reverting to an
            // older copy.
            let verify = h.seq > cap_watermark && pos + 1 + n as u64 > durable && n > 0;
            let body = if verify { Some(read_at(capacity, (first + 1) * BS, n * BLOCK_BYTES)?) } else { None };
            let mut data_i = 0usize;
            for e in &h.entries {
                if e.tombstone {
                    res.offer(h.volume, e.lba, h.seq, Loc::capacity(first), TOMBSTONE_CRC, 0);
                    continue;
                }
                let intact =
                    body.as_ref().is_none_or(|b| crc32c(&b[data_i * BLOCK_BYTES..(data_i + 1) * BLOCK_BYTES]) == e.crc);
                if intact {
                    res.offer(h.volume, e.lba, h.seq, Loc::capacity(first + 1 + data_i as u64), e.crc, 0);
                } else {
                    torn.push((h.volume, e.lba, h.seq));
                }
                data_i += 1;
            }
            let b = &mut inner.bands[band];
            b.state = State::Full;
            b.closed_seq = b.closed_seq.max(h.seq);
            b.tombstones = b.tombstones.saturating_add(h.entries.iter().filter(|e| e.tombstone).count() as u32);
        }
    }

    // Step 2: the log, chunk by chunk. Workers each read a chunk (the
    // device is shared: every thread reaps its own reads), walk it and
    // CRC-check it, so reading and checking the whole cache spread over
    // every core; then, under the resolver's lock, its intact entries are
    // offered at once (the head is the capacity mark's; should the records
    // show a later one, the scan runs again with it) and only the rest is
    // kept for step 3, which needs every chunk's watermark.
    let guess = head_guess.unwrap_or_else(|| mark.as_ref().map_or(0, |m| m.head_lsn));
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
    let next = std::sync::atomic::AtomicU64::new(1);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let found: Mutex<(Vec<ChunkScan>, Option<DeviceError>)> = Mutex::new((Vec::new(), None));
    // (resolver, entries kept for step 3, the lowest LSN offered)
    let shared = Mutex::new((res, Vec::<Offer>::new(), u64::MAX));
    std::thread::scope(|s| {
        for _ in 0..workers {
            let (next, stop, found, vol_blocks, shared) = (&next, &stop, &found, &vol_blocks, &shared);
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
                            err = Some(e);
                            break;
                        }
                    };
                    let mut sh = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let (res, deferred, lowest) = &mut *sh;
                    res.chunk_pos[c as usize] = cs.records.iter().map(|r| r.pos as u32).collect();
                    res.chunk_seq[c as usize] = cs.records.iter().map(|r| r.seq).collect();
                    for o in cs.offers.drain(..).filter(|o| o.lsn >= guess) {
                        if o.intact {
                            let flags = if o.past_gap { PAST_GAP } else { 0 };
                            *lowest = (*lowest).min(o.lsn);
                            res.offer(o.vol, o.lba, o.seq, o.loc, o.crc, flags);
                        } else {
                            deferred.push(o);
                        }
                    }
                    drop(sh);
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
    let (mut res, deferred, lowest) = shared.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    // Chunk order as before (epochs are sorted below; keep it deterministic).
    scans.sort_by_key(|cs| cs.chunk);
    if let Some(e) = read_error {
        return Err(e.into());
    }
    // Step 3 for the log: the head, the watermark, and every LSN between.
    let head = scans.iter().map(|cs| cs.head_lsn).chain(mark.as_ref().map(|m: &Mark| m.head_lsn)).max().unwrap_or(0);
    if lowest < head {
        // Records below the head (compacted and freed) were offered, and
        // may have won: again, knowing the head.
        return Ok(Err(head));
    }
    let flushed = scans.iter().map(|cs| cs.flushed_lsn).max().unwrap_or(0);
    let mut runs: Vec<&LsnRun> = scans.iter().flat_map(|cs| cs.runs.iter()).collect();
    runs.sort_unstable_by_key(|r| (r.first, r.chunk));
    let lsn_max = runs.iter().map(|r| r.first + r.count - 1).max().unwrap_or(0);
    // Missing ranges [from, to] from the head to the newest record found
    // (or the watermark), less what earlier recoveries accepted as torn:
    // at or below the watermark they are damage, above it torn writes, which
    // are recorded (`new_gaps`) so that later recoveries accept them too.
    let mut accepted: Vec<(u64, u64)> = scans.iter().flat_map(|cs| cs.gaps.iter().copied()).collect();
    accepted.sort_unstable();
    let mut missing: Vec<(u64, u64, u32, u64)> = Vec::new();
    let mut expect = head.max(1);
    for run in runs.iter().filter(|r| r.first + r.count > head) {
        // (A run reaching below the head starts, for this purpose, at it;
        // `expect` is then the head, so nothing before it is missing.)
        let start = run.first.max(head);
        if expect < start {
            missing.push((expect, start - 1, run.chunk, run.first_pos));
        }
        expect = expect.max(run.first + run.count);
    }
    let newest = runs.iter().max_by_key(|r| r.first + r.count);
    let (last_chunk, last_pos) = newest.map_or((0, 0), |r| (r.chunk, r.last_pos));
    if expect <= flushed.max(lsn_max) {
        missing.push((expect, flushed.max(lsn_max), last_chunk, last_pos));
    }
    let mut new_gaps = Vec::new();
    for (from, to, chunk, pos) in missing {
        let mut at = from;
        while at <= to {
            // Skip what a gap record already accepted.
            if let Some(&(_, end)) = accepted.iter().find(|&&(a, b)| a <= at && at <= b) {
                at = end + 1;
                continue;
            }
            let next_accepted = accepted.iter().map(|&(a, _)| a).filter(|&a| a > at).min().unwrap_or(u64::MAX);
            let end = to.min(next_accepted - 1);
            if at <= flushed {
                let to_lsn = end.min(flushed);
                damage.push(Damage::LogRecords { from_lsn: at, to_lsn, chunk, near_block: pos });
                new_gaps.push((at, to_lsn));
                at = to_lsn + 1;
            } else {
                new_gaps.push((at, end));
                at = end + 1;
            }
        }
    }
    inner.log.lsn = lsn_max.max(head.saturating_sub(1));
    inner.mark_gen = mark.as_ref().map_or(0, |m| m.gen);
    let mut chunk_epochs: Vec<(u64, u32)> = Vec::new();
    for cs in scans {
        res.seq_max = res.seq_max.max(cs.seq_max);
        // A chunk whose records are all below the head was compacted and
        // freed: nothing in it is needed.
        let Some(first) = cs.runs.iter().find(|r| r.first + r.count > head).map(|r| r.first.max(head)) else {
            continue;
        };
        let ch = &mut inner.log.chunks[cs.chunk as usize];
        ch.state = State::Full;
        ch.epoch = cs.epoch.expect("records have an epoch");
        ch.first_lsn = first;
        chunk_epochs.push((ch.epoch, cs.chunk));
    }
    for o in deferred.into_iter().filter(|o| o.lsn >= head) {
        // A bad block after the watermark is a torn write: ignored, and its
        // record logged as accepted (a later flush covers its LSN, and the
        // next recovery must not take it for damage), as are those an
        // earlier recovery accepted. At or below the watermark the copy is
        // damaged; if it wins, step 5 says so.
        let was_accepted = accepted.iter().any(|&(a, b)| a <= o.lsn && o.lsn <= b);
        let past_gap = if o.past_gap { PAST_GAP } else { 0 };
        if o.lsn <= flushed && !was_accepted {
            res.offer(o.vol, o.lba, o.seq, o.loc, o.crc, DAMAGED | past_gap);
        } else if !was_accepted {
            new_gaps.push((o.lsn, o.lsn));
        }
    }

    // A torn segment copy that lost keeps a sequence above the winner's:
    // written again (below), or a later recovery would trust it.
    let superseded_torn: Vec<(u32, u64)> = torn
        .iter()
        .filter(|&&(v, lba, seq)| res.seq_at(res.vols[v as usize].l2p.get(lba as usize)).0 < seq)
        .map(|&(v, lba, _)| (v, lba))
        .collect();
    // Step 5: winning tombstones unmapped (their bands hold something
    // current: the tombstone), the P2Ls and valid counts from the rest.
    let mut past_gap: Vec<(u32, u64)> = Vec::new();
    let mut live: Vec<bool> = vec![false; band_count as usize];
    for vi in 0..res.vols.len() {
        for lba in 0..res.vols[vi].l2p.len() {
            let loc = res.vols[vi].l2p.get(lba);
            if loc.is_none() {
                continue;
            }
            let owner = (vi as u32, lba as u64);
            let flags = res.flags_of(owner.0, owner.1);
            // Past a gap, tombstones too: the compactor stops at the gap.
            if flags & PAST_GAP != 0 {
                past_gap.push(owner);
            }
            let tombstone = res.vols[vi].l2p.crc(lba) == TOMBSTONE_CRC && res.seq_at(loc).1;
            if tombstone {
                if let Some(pb) = loc.capacity_block() {
                    live[(pb / bpb) as usize] = true;
                }
                res.vols[vi].l2p.set(lba, Loc::NONE, 0);
                continue;
            }
            if let Some(cb) = loc.cache_block() {
                if flags & DAMAGED != 0 {
                    let (chunk, block) = ((cb / bpc) as u32, cb % bpc);
                    damage.push(Damage::LogBlock { volume: res.vols[vi].name.clone(), lba: lba as u64, chunk, block });
                }
                let ch = &mut inner.log.chunks[(cb / bpc) as usize];
                ch.p2l[(cb % bpc) as usize] = owner;
                ch.valid += 1;
            } else if let Some(pb) = loc.capacity_block() {
                inner.bands[(pb / bpb) as usize].valid += 1;
                live[(pb / bpb) as usize] = true;
            }
        }
    }
    let seq_max = res.seq_max;
    inner.vols = std::mem::take(&mut res.vols);
    drop(res);
    // A band none of whose entries won holds nothing current: everything in
    // it lost to a newer entry on the media (a band GC reclaimed whose
    // discard was not yet durable, or one wholly superseded). It is free, as
    // before the crash. Kept Full, its dead tombstones (their LBAs are
    // unmapped) would have GC copy them into a GC band, taking the free band
    // it frees: with every free band brought back that way, none is left.
    for (b, band) in inner.bands.iter_mut().enumerate() {
        if !live[b] {
            band.state = State::Free;
        }
    }
    chunk_epochs.sort_unstable();
    inner.log.full = chunk_epochs.iter().map(|&(_, c)| c).collect();
    inner.log.free = (1..chunk_count as u32).filter(|&c| inner.log.chunks[c as usize].state == State::Free).collect();
    // Free bands that still hold segments (dead ones, or a previous
    // generation whose discard was lost) are discarded before reuse: a new
    // generation's torn first segments must never leave an older one's
    // durable segments to be read as this band's.
    let stale_bands: Vec<u32> = (0..band_count as u32)
        .filter(|&b| inner.bands[b as usize].state == State::Free && walks[b as usize].stop > 0)
        .collect();
    for b in inner.bands.iter_mut().filter(|b| b.state == State::Free) {
        b.written = 0;
        b.tombstones = 0;
    }
    inner.bands.free = (0..band_count as u32).filter(|&b| inner.bands[b as usize].state == State::Free).collect();
    // Each stream's newest full band is the one its next band names.
    let mut last_bands = LastBands { vols: vec![None; inner.vols.len()], gc: None };
    for (b, w) in walks.iter().enumerate() {
        let (Some(e), Some(f)) = (w.epoch, w.first) else { continue };
        if inner.bands[b].state != State::Full || voided.contains(&(b as u32)) {
            continue;
        }
        let slot = if f.stream == STREAM_GC {
            &mut last_bands.gc
        } else if let Some(v) = last_bands.vols.get_mut(f.stream as usize) {
            v
        } else {
            continue;
        };
        if slot.is_none_or(|(_, le)| le < e) {
            *slot = Some((b as u32, e));
        }
    }
    // Far above everything seen (`SEQ_RESTART_GAP`), and above the previous
    // recovery's restart, recorded in the superblock before anything was
    // written with it: a recovery that finds nothing newer than the last
    // one (what was written since was lost) must not hand out the same
    // numbers again.
    inner.seq = seq_max.max(inner.sb.seq_floor) + SEQ_RESTART_GAP;
    inner.sb.seq_floor = inner.seq;
    inner.cache_flushed_seq = inner.seq;
    // Segments written from now on claim what is known durable; with torn
    // ones on the media, never as far as the first torn one (see
    // `Inner::cap_flushed_ceiling`).
    // Voided bands likewise, until they are discarded.
    let voided_min = voided.iter().filter_map(|&b| walks[b as usize].first.map(|f| f.seq));
    let torn_min = torn.iter().map(|&(_, _, seq)| seq).chain(voided_min).min();
    inner.cap.flushed_ceiling = torn_min.map(|s| s - 1);
    inner.cap.flushed_seq = cap_watermark.min(inner.cap.flushed_ceiling.unwrap_or(u64::MAX));
    inner.log.flushed_lsn = inner.log.lsn;
    inner.check_invariants();
    // A torn segment stays on the media with a sequence above the copy that
    // won instead; once later headers' watermarks pass it, a later recovery
    // would trust it unverified. Such blocks are written again (`relog`).
    let mut superseded: Vec<(u32, u64)> = superseded_torn.into_iter().chain(past_gap).collect();
    superseded.sort_unstable();
    superseded.dedup();
    new_gaps.sort_unstable();
    new_gaps.dedup();
    Ok(Ok(Recovered { inner, superseded, damage, gaps: new_gaps, torn_headers, stale_bands, voided, last_bands, mark }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{pattern, small_world};

    /// (block, header) of every record or segment header on `dev` (a scan
    /// of the raw device, as an attacker flipping bits would see it).
    fn headers(dev: &dyn BlockDevice, tag: u32) -> Vec<(u64, Header)> {
        let blocks = dev.info().capacity_bytes / BS;
        let all = read_at(dev, 0, (blocks * BS) as usize).unwrap();
        (0..blocks)
            .filter_map(|b| decode_header(&all[(b * BS) as usize..((b + 1) * BS) as usize], tag).ok().map(|h| (b, h)))
            .collect()
    }

    fn flip(dev: &dyn BlockDevice, block: u64, byte: usize) {
        let mut b = read_at(dev, block * BS, BLOCK_BYTES).unwrap().to_vec();
        b[byte] ^= 0x40;
        write_at(dev, block * BS, &b).unwrap();
    }

    /// An engine with 40 one-block records in its log, all flushed (a
    /// later record carries the watermark), stopped without a shutdown.
    fn logged() -> (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>, u32) {
        let w = small_world(&[256]);
        for lba in 0..40 {
            w.volumes[0].write(lba * BS, &pattern(0, lba, 1), false).unwrap();
        }
        w.volumes[0].flush().unwrap();
        w.volumes[0].write(100 * BS, &pattern(0, 100, 1), false).unwrap();
        let tag = crate::persist::engine_tag(&w.engine.uuid());
        let (c, p) = w.engine.devices();
        (c, p, tag)
    }

    fn damage_of(r: Result<Arc<Engine>, EngineError>) -> Vec<Damage> {
        match r {
            Err(EngineError::Damaged(d)) => d,
            Err(e) => panic!("expected damage, got {e}"),
            Ok(_) => panic!("expected damage, the engine opened"),
        }
    }

    /// Found by the crash simulation (held-out seed 1000007): writes after
    /// a recovery were lost in a second crash, so the second recovery found
    /// the same newest sequence as the first, restarted at the same number,
    /// and reopened a chunk with the epoch a torn leftover of the lost
    /// writes carried — which then read back as one of its records. A
    /// recovery restarts above the previous one's restart (kept in the
    /// superblock), so numbers are never handed out twice.
    #[test]
    fn a_recovery_that_finds_nothing_newer_never_reissues_sequence_numbers() {
        let (cache, capacity, _) = logged();
        let e = Engine::open(cache.clone(), capacity.clone()).unwrap();
        let first = e.lock().seq;
        // Dropped with nothing written since: the next recovery finds
        // nothing newer, as if what was written had been lost.
        drop(e);
        let e = Engine::open(cache.clone(), capacity.clone()).unwrap();
        let second = e.lock().seq;
        assert!(second >= first + SEQ_RESTART_GAP, "restarted at {second}, the previous recovery at {first}");
        drop(e);
        let e = Engine::open(cache, capacity).unwrap();
        assert!(e.lock().seq >= second + SEQ_RESTART_GAP);
    }

    #[test]
    fn a_damaged_header_of_a_durable_log_record_is_damage_not_a_torn_tail() {
        let (cache, capacity, tag) = logged();
        let (at, _) = headers(&*cache, tag).into_iter().find(|(_, h)| h.lsn == 5).unwrap();
        flip(&*cache, at, 200);
        let d = damage_of(Engine::open(cache.clone(), capacity.clone()));
        assert!(
            matches!(d[..], [Damage::LogRecords { from_lsn: 5, to_lsn: 5, .. }]),
            "the one damaged record, not the records after it: {d:?}"
        );
        // `check` reports the same, and the refusal changed nothing.
        assert_eq!(Engine::check(cache.clone(), capacity.clone()).unwrap().damage, d);
        let before = read_at(&*cache, 0, cache.info().capacity_bytes as usize).unwrap().to_vec();
        assert!(Engine::open(cache.clone(), capacity.clone()).is_err());
        assert!(read_at(&*cache, 0, cache.info().capacity_bytes as usize).unwrap()[..] == before[..]);
        // Salvaged: it opens, what the damaged record held is gone (block
        // 4 was its only write), every other block is there.
        let e = Engine::open_with(cache.clone(), capacity.clone(), OpenOptions { salvage: true }).unwrap();
        assert_eq!(e.salvaged(), &d[..]);
        let v = e.volume("v0").unwrap();
        let mut b = vec![0u8; BLOCK_BYTES];
        for lba in (0..40).filter(|&l| l != 4) {
            v.read(lba * BS, &mut b).unwrap();
            assert!(b == pattern(0, lba, 1), "block {lba}");
        }
        v.read(4 * BS, &mut b).unwrap();
        assert!(b == vec![0u8; BLOCK_BYTES]);
        // The damage accepted stays accepted: a crash now reopens cleanly.
        drop((v, e));
        let e = Engine::open(cache, capacity).unwrap();
        assert!(e.recovered_in().is_some());
    }

    #[test]
    fn a_damaged_data_block_of_a_durable_log_record_is_named_and_salvage_trims_it() {
        let (cache, capacity, tag) = logged();
        let (at, h) = headers(&*cache, tag).into_iter().find(|(_, h)| h.lsn == 7).unwrap();
        assert_eq!(h.entries[0].lba, 6);
        flip(&*cache, at + 1, 3000);
        let d = damage_of(Engine::open(cache.clone(), capacity.clone()));
        assert!(matches!(&d[..], [Damage::LogBlock { lba: 6, .. }]), "{d:?}");
        let e = Engine::open_with(cache.clone(), capacity.clone(), OpenOptions { salvage: true }).unwrap();
        let v = e.volume("v0").unwrap();
        let mut b = vec![0u8; BLOCK_BYTES];
        v.read(6 * BS, &mut b).unwrap();
        assert!(b == vec![0u8; BLOCK_BYTES], "salvage trims a damaged block: never its bad bytes");
        e.shutdown().unwrap();
        drop((v, e));
        let r = Engine::check(cache, capacity).unwrap();
        assert!(r.clean && r.damage.is_empty(), "{}", r.text());
    }

    #[test]
    fn a_damaged_segment_header_followed_by_durable_segments_is_damage() {
        let w = small_world(&[256]);
        // Several passes over the volume: compaction fills bands.
        for pass in 1..=4 {
            for lba in 0..256 {
                w.volumes[0].write(lba * BS, &pattern(0, lba, pass), false).unwrap();
            }
        }
        w.volumes[0].flush().unwrap();
        let tag = crate::persist::engine_tag(&w.engine.uuid());
        let (cache, capacity) = w.engine.devices();
        drop(w);
        let segs: Vec<(u64, Header)> =
            headers(&*capacity, tag).into_iter().filter(|(_, h)| h.kind == RecordKind::Segment).collect();
        // A band's first segment, with a later segment of its generation.
        let bpb = 32;
        let (at, _) = segs
            .iter()
            .find(|(b, h)| b % bpb == 0 && segs.iter().any(|(o, g)| o / bpb == b / bpb && o > b && g.epoch == h.epoch))
            .unwrap();
        flip(&*capacity, *at, 100);
        let d = damage_of(Engine::open(cache.clone(), capacity.clone()));
        assert!(
            d.iter().any(|x| matches!(x, Damage::Segments { band, from: 0, .. } if *band as u64 == at / bpb)),
            "{d:?}"
        );
    }

    #[test]
    fn check_finds_blocks_damaged_at_rest_and_a_damaged_checkpoint() {
        let w = small_world(&[256]);
        for pass in 1..=3 {
            for lba in 0..256 {
                w.volumes[0].write(lba * BS, &pattern(0, lba, pass), false).unwrap();
            }
        }
        w.engine.shutdown().unwrap();
        let (cache, capacity) = w.engine.devices();
        drop(w);
        let clean = Engine::check(cache.clone(), capacity.clone()).unwrap();
        assert!(clean.clean && clean.damage.is_empty() && clean.blocks_checked == 256, "{}", clean.text());
        // A data block on the capacity device: read every block to find one.
        let e = Engine::open(cache.clone(), capacity.clone()).unwrap();
        let loc = e.lock().vols[0].l2p.get(10);
        e.shutdown().unwrap();
        drop(e);
        let pb = loc.capacity_block().expect("block 10 was compacted");
        flip(&*capacity, pb, 7);
        let r = Engine::check(cache.clone(), capacity.clone()).unwrap();
        assert!(matches!(&r.damage[..], [Damage::Block { lba: 10, device: "capacity", .. }]), "{}", r.text());
        flip(&*capacity, pb, 7);
        // The checkpoint.
        let sb = Engine::inspect(&*cache, &*capacity).unwrap();
        flip(&*capacity, sb.checkpoint_offset / BS, 50);
        let r = Engine::check(cache.clone(), capacity.clone()).unwrap();
        assert_eq!(r.damage, vec![Damage::CheckpointUnreadable], "{}", r.text());
        assert!(matches!(Engine::open(cache.clone(), capacity.clone()), Err(EngineError::CheckpointChecksum)));
        // Salvage recovers from the media instead, every block intact.
        let e = Engine::open_with(cache, capacity, OpenOptions { salvage: true }).unwrap();
        let v = e.volume("v0").unwrap();
        let mut b = vec![0u8; BLOCK_BYTES];
        for lba in 0..256 {
            v.read(lba * BS, &mut b).unwrap();
            assert!(b == pattern(0, lba, 3), "block {lba}");
        }
    }
}
