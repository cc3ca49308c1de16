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
//!    superseded it is durable (docs/engine.md, segments.rs rule 3).
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

mod bands;
mod chunks;
mod damage;
mod lsns;
mod resolver;
#[cfg(test)]
mod tests;

use super::l2p::PAGE_ENTRIES;
use super::marks::{read_mark, Mark};
use super::{
    band_count, chunk_count, crc32c, new_maps, read_at, Arc, BandId, BlockDevice, CapGeometry, CapWrites, ChunkId,
    EngineConfig, EngineError, Inner, L2p, Superblock, VolumeError, BLOCK_BYTES, BS,
};
pub(super) use bands::LastBands;
use bands::{durability, last_bands, offer_segments, walk_bands, Durability, SegmentReader};
use chunks::{scan_chunks, LogScan};
pub use damage::Damage;
use lsns::{check_lsns, LsnCheck};
use resolver::{Resolver, DAMAGED, PAST_GAP, TOMBSTONE_CRC};

/// How far above the highest sequence it found a recovery restarts
/// numbering: more than the sequences an engine can issue between a crash
/// and the last record recovery still finds (each needs a record, a segment
/// or a new chunk or band, and no more of those are written without a flush
/// than the two devices hold blocks, far below 2^32 here), so that no
/// leftover of a torn write ever shares an epoch with a new chunk or band
/// (2^32 recoveries before sequences run out).
const SEQ_RESTART_GAP: u64 = 1 << 32;

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

/// (`map_dev`: where paged maps keep their pages while they are rebuilt —
/// the cache device's map region when opening, a scratch device for a
/// read-only check.)
pub(super) fn scan(
    cache: &dyn BlockDevice,
    capacity: &dyn BlockDevice,
    map_dev: &Arc<dyn BlockDevice>,
    cfg: EngineConfig,
    geo: CapGeometry,
    sb: Superblock,
) -> Result<Recovered, EngineError> {
    let mut head_guess = None;
    loop {
        let maps = new_maps(&sb, map_dev);
        match scan_with(cache, capacity, maps, cfg.clone(), geo, sb.clone(), head_guess)? {
            Ok(r) => return Ok(r),
            Err(head) => head_guess = Some(head),
        }
    }
}

/// An error of a paged map while recovery rebuilds it: the device's, or
/// damage in a page.
pub(in crate::engine) fn map_error(e: VolumeError) -> EngineError {
    match e {
        VolumeError::Io(d) => EngineError::Device(d),
        e => EngineError::Recovery(e),
    }
}

/// One scan, taking the log's head to be `head_guess` (by default the
/// capacity mark's) while it offers the log's entries; `Err(head)` if the
/// records name a later head, to be scanned again with it.
fn scan_with(
    cache: &dyn BlockDevice,
    capacity: &dyn BlockDevice,
    maps: Vec<L2p>,
    cfg: EngineConfig,
    geo: CapGeometry,
    sb: Superblock,
    head_guess: Option<u64>,
) -> Result<Result<Recovered, u64>, EngineError> {
    let chunk_count = chunk_count(&sb);
    let band_count = band_count(&sb, &cfg);
    let mut inner = Inner::empty(cfg, geo, sb, chunk_count, band_count, maps);
    let (bpc, bpb) = (inner.blocks_per_chunk(), inner.blocks_per_band());
    let vol_blocks: Vec<usize> = inner.vols.iter().map(|v| v.l2p.len()).collect();
    let tag = inner.tag;
    let mut damage = Vec::new();
    let (mark, mark_damaged) = read_mark(cache, tag)?;
    if mark_damaged {
        damage.push(Damage::Mark);
    }
    let reader = SegmentReader {
        capacity,
        bpb,
        usable: inner.band_usable(),
        unit: inner.cfg.write_unit_bytes / BS,
        tag,
        vol_blocks: &vol_blocks,
    };

    // Step 1: band headers.
    let mut found = walk_bands(&reader, &mut inner.bands)?;
    // Step 3 for bands: how far each must read back.
    let Durability { durable_end, voided, torn_headers } =
        durability(&reader, &found, mark.as_ref(), geo.zoned, &mut damage)?;
    // Steps 3 and 4 for segments: entries offered, the data of those that
    // may be torn verified.
    let mut res = Resolver {
        vols: std::mem::take(&mut inner.vols),
        bpc,
        bpb,
        chunk_pos: vec![Vec::new(); chunk_count as usize],
        chunk_seq: vec![Vec::new(); chunk_count as usize],
        band_pos: std::mem::take(&mut found.pos),
        band_seq: std::mem::take(&mut found.seq),
        flags: std::collections::HashMap::new(),
        seq_max: 0,
        queued: Vec::new(),
    };
    let mut torn = offer_segments(&reader, &mut res, &mut inner.bands, &durable_end, found.watermark)?;

    // Step 2: the log, chunk by chunk, its intact entries offered at once
    // (the head is the capacity mark's; should the records show a later
    // one, the scan runs again with it).
    let guess = head_guess.unwrap_or_else(|| mark.as_ref().map_or(0, |m| m.head_lsn));
    let LogScan { scans, mut res, deferred, lowest } =
        scan_chunks(cache, chunk_count, bpc, &vol_blocks, tag, guess, res)?;
    // Step 3 for the log: the head, the watermark, and every LSN between.
    let head = scans.iter().map(|cs| cs.head_lsn).chain(mark.as_ref().map(|m: &Mark| m.head_lsn)).max().unwrap_or(0);
    if lowest < head {
        // Records below the head (compacted and freed) were offered, and
        // may have won: again, knowing the head.
        return Ok(Err(head));
    }
    let claimed = super::watermark::read_claimed(cache, tag, bpc)?;
    let LsnCheck { flushed, lsn_max, accepted, mut new_gaps } = check_lsns(&scans, head, claimed, &mut damage);
    // Above every LSN found and every one claimed durable: when damage is
    // accepted, the numbers of the records it lost are not handed out again.
    inner.log.recovered_lsn(lsn_max.max(flushed).max(head.saturating_sub(1)));
    inner.mark_gen = mark.as_ref().map_or(0, |m| m.gen);
    let mut chunk_epochs: Vec<(u64, u32)> = Vec::new();
    // In place, the newest claim on each block at or above the head
    // (residency.rs): a winning cached copy older than it, with its CRC,
    // is clean.
    let mut claims: std::collections::HashMap<(u32, u64), (u64, u32)> = Default::default();
    for &(vol, lba, crc, seq, lsn) in scans.iter().flat_map(|cs| &cs.claims) {
        if lsn >= head && claims.get(&(vol, lba)).is_none_or(|&(s, _)| s < seq) {
            claims.insert((vol, lba), (seq, crc));
        }
    }
    for cs in scans {
        res.seq_max = res.seq_max.max(cs.seq_max);
        // A chunk whose records are all below the head was compacted and
        // freed: nothing in it is needed.
        let Some(first) = cs.runs.iter().find(|r| r.first + r.count > head).map(|r| r.first.max(head)) else {
            continue;
        };
        let epoch = cs.epoch.expect("records have an epoch");
        inner.log.found_chunk(ChunkId(cs.chunk), epoch, first);
        chunk_epochs.push((epoch, cs.chunk));
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
            res.queue(o.queued(DAMAGED | past_gap)).map_err(map_error)?;
        } else if !was_accepted {
            new_gaps.push((o.lsn, o.lsn));
        }
    }

    // Step 5, page by page: the page's queued offers applied (step 4, in
    // map order: a paged map faults each page in once for both steps), its
    // torn segment copies judged, then winning tombstones unmapped (their
    // bands hold something current: the tombstone), the P2Ls and valid
    // counts from the rest.
    let queued = res.take_queued();
    torn.sort_unstable();
    let mut superseded_torn: Vec<(u32, u64)> = Vec::new();
    let mut past_gap: Vec<(u32, u64)> = Vec::new();
    let mut live: Vec<bool> = vec![false; band_count as usize];
    let (mut qi, mut ti) = (0usize, 0usize);
    for vi in 0..res.vols.len() {
        let v = vi as u32;
        let q_end = qi + queued[qi..].partition_point(|o| o.vol == v);
        let t_end = ti + torn[ti..].partition_point(|t| t.0 == v);
        let page = |lba: u64| lba as usize / PAGE_ENTRIES * PAGE_ENTRIES;
        // The windows that may hold an entry (a paged map: only the pages
        // that may hold any), and those the queued offers and torn copies
        // fall in.
        let mut starts: Vec<usize> = res.vols[vi].l2p.windows().map(|w| w.start).collect();
        starts.extend(queued[qi..q_end].iter().map(|o| page(o.lba)));
        starts.extend(torn[ti..t_end].iter().map(|t| page(t.1)));
        starts.sort_unstable();
        starts.dedup();
        let len = res.vols[vi].l2p.len();
        for start in starts {
            let window = start..(start + PAGE_ENTRIES).min(len);
            while qi < q_end && (queued[qi].lba as usize) < window.end {
                res.apply(&queued[qi]).map_err(map_error)?;
                qi += 1;
            }
            // A torn segment copy that lost keeps a sequence above the
            // winner's: written again (below), or a later recovery would
            // trust it.
            while ti < t_end && (torn[ti].1 as usize) < window.end {
                let (_, lba, seq) = torn[ti];
                if res.vols[vi].l2p.get(lba as usize).is_ok_and(|l| res.seq_at(l).0 < seq) {
                    superseded_torn.push((v, lba));
                }
                ti += 1;
            }
            for (lba, loc, crc) in res.vols[vi].l2p.mapped(window).map_err(map_error)? {
                let owner = (vi as u32, lba as u64);
                let flags = res.flags_of(owner.0, owner.1);
                // Past a gap, tombstones too: the compactor stops at the gap.
                if flags & PAST_GAP != 0 {
                    past_gap.push(owner);
                }
                let (seq, at_header) = res.seq_at(loc);
                if crc == TOMBSTONE_CRC && at_header {
                    if let Some(pb) = loc.capacity_block() {
                        live[(pb / bpb) as usize] = true;
                    }
                    res.vols[vi].l2p.unmap(lba, seq).map_err(map_error)?;
                    continue;
                }
                if let Some(cb) = loc.cache_block() {
                    if flags & DAMAGED != 0 {
                        let (chunk, block) = ((cb / bpc) as u32, cb % bpc);
                        damage.push(Damage::LogBlock {
                            volume: res.vols[vi].name.clone(),
                            lba: lba as u64,
                            chunk,
                            block,
                        });
                    }
                    inner.log.place(cb, owner.0, owner.1, 0);
                    if inner.in_place() {
                        inner.residency.logged(cb);
                        if claims.get(&owner).is_some_and(|&(s, c)| s > seq && c == crc) {
                            inner.residency.recovered_clean(cb, owner.0, owner.1);
                        }
                    }
                } else if let Some(pb) = loc.capacity_block() {
                    inner.bands.add_valid(BandId((pb / bpb) as u32));
                    live[(pb / bpb) as usize] = true;
                }
            }
        }
    }
    assert_eq!((qi, ti), (queued.len(), torn.len()), "every queued offer and torn copy had its window");
    let seq_max = res.seq_max;
    inner.vols = std::mem::take(&mut res.vols);
    drop(res);
    // A band none of whose entries won holds nothing current: everything in
    // it lost to a newer entry on the media (a band GC reclaimed whose
    // discard was not yet durable, or one wholly superseded). It is free, as
    // before the crash. Kept Full, its dead tombstones (their LBAs are
    // unmapped) would have GC copy them into a GC band, taking the free band
    // it frees: with every free band brought back that way, none is left.
    // Free bands that still hold segments (dead ones, or a previous
    // generation whose discard was lost) are discarded before reuse: a new
    // generation's torn first segments must never leave an older one's
    // durable segments to be read as this band's.
    let walked: Vec<u64> = found.walks.iter().map(|w| w.stop).collect();
    let stale_bands = inner.bands.recovered(&live, &walked);
    chunk_epochs.sort_unstable();
    inner.log.recovered(chunk_epochs.iter().map(|&(_, c)| ChunkId(c)).collect());
    let last_bands = last_bands(&found.walks, &inner.bands, inner.vols.len(), &voided);
    // Far above everything seen (`SEQ_RESTART_GAP`), and above the previous
    // recovery's restart, recorded in the superblock before anything was
    // written with it: a recovery that finds nothing newer than the last
    // one (what was written since was lost) must not hand out the same
    // numbers again.
    let restart = inner.seq.restart_above(seq_max.max(inner.sb.seq_floor), SEQ_RESTART_GAP);
    inner.sb.seq_floor = restart;
    inner.log.restart_flushed_seq(restart);
    // Segments written from now on claim what is known durable; with torn
    // ones on the media, never as far as the first torn one (see
    // `Inner::cap_flushed_ceiling`).
    // Voided bands likewise, until they are discarded.
    let voided_min = voided.iter().filter_map(|&b| found.walks[b as usize].first.map(|f| f.seq));
    let torn_min = torn.iter().map(|&(_, _, seq)| seq).chain(voided_min).min();
    inner.cap = CapWrites::recovered(found.watermark, torn_min.map(|s| s - 1));
    inner.check_invariants_unless_paged();
    // A torn segment stays on the media with a sequence above the copy that
    // won instead; once later headers' watermarks pass it, a later recovery
    // would trust it unverified. Such blocks are written again (`relog`).
    let mut superseded: Vec<(u32, u64)> = superseded_torn.into_iter().chain(past_gap).collect();
    superseded.sort_unstable();
    superseded.dedup();
    // Their data is read back by `relog`; recovery trusts durable segments
    // unread, so a copy on the capacity device damaged at rest is found
    // here, as damage, before anything is written (it failed the reopen
    // halfway: `sluice sim --flips --seed-start 3447269777`). Copies in the
    // log were checked by the chunk scan.
    for &(v, lba) in &superseded {
        let vol = &inner.vols[v as usize];
        let (loc, crc) = vol.l2p.entry(lba as usize).map_err(map_error)?;
        let Some(pb) = loc.capacity_block() else { continue };
        if crc32c(&read_at(capacity, pb * BS, BLOCK_BYTES)?) != crc {
            damage.push(Damage::Block { volume: vol.name.clone(), lba, device: "capacity", offset: pb * BS });
        }
    }
    new_gaps.sort_unstable();
    new_gaps.dedup();
    Ok(Ok(Recovered { inner, superseded, damage, gaps: new_gaps, torn_headers, stale_bands, voided, last_bands, mark }))
}
