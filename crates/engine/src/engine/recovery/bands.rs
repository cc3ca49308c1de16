//! Steps 1 and 3 of recovery for the capacity device: every band walked
//! segment by segment (headers only), the chains and marks that say how far
//! each band must read back, and every segment's entries offered.

use super::chunks::fits;
use super::damage::Damage;
use super::resolver::{Queued, Resolver, TOMBSTONE_CRC};
use crate::engine::bands::{BandId, Bands, GC_STREAMS};
use crate::engine::l2p::Loc;
use crate::engine::marks::{Mark, RECLAIMED};
use crate::engine::segments::segment_blocks;
use crate::engine::BandState;
use crate::engine::{EngineError, Inner, BS};
use crate::layout::{crc32c, decode_header, Header, HeaderError, RecordKind, BLOCK_BYTES, STREAM_GC};
use sluice_media::device::read_at;
use sluice_media::{BlockDevice, DeviceError};

/// What a band's walk found: where it stopped, and how.
pub(super) struct BandWalk {
    /// The epoch of its segments (None: no segment).
    pub(super) epoch: Option<u64>,
    /// Block where the walk stopped.
    pub(super) stop: u64,
    /// The block there holds something that is not a header of this
    /// engine's, and not zeros: a damaged header, or a torn write.
    pub(super) garbage: bool,
    /// Its first segment's header (what it names as its stream's previous
    /// band, and its sequence).
    pub(super) first: Option<FirstSegment>,
}

#[derive(Clone, Copy)]
pub(super) struct FirstSegment {
    pub(super) seq: u64,
    pub(super) stream: u32,
    pub(super) prev_epoch: u64,
    pub(super) prev_end: u64,
}

/// Each stream's newest full band after a recovery (`Vol::last_band`,
/// `Inner::gc_last_band`). Named — by the next band each stream opens and in
/// marks — only once the reopen's repairs are done: until `relog` has
/// superseded their torn copies, a claim on them would have a later
/// recovery trust what is torn.
pub(crate) struct LastBands {
    vols: Vec<Option<(BandId, u64)>>,
    gc: [Option<(BandId, u64)>; GC_STREAMS],
}

impl LastBands {
    pub(crate) fn apply(self, inner: &mut Inner) {
        inner.bands.set_lasts(self.vols, self.gc);
    }
}

/// Reads segment headers of the capacity device's bands.
pub(super) struct SegmentReader<'a> {
    pub(super) capacity: &'a dyn BlockDevice,
    /// Address stride of a band, blocks a band holds, the write unit.
    pub(super) bpb: u64,
    pub(super) usable: u64,
    pub(super) unit: u64,
    pub(super) tag: u32,
    pub(super) vol_blocks: &'a [usize],
}

impl SegmentReader<'_> {
    /// The segment header at block `pos` of `band`: Ok if it is one of this
    /// engine's that fits the band and the volumes; Err(true) if the block
    /// holds something else that is not zeros (garbage), Err(false) if
    /// zeros or another engine's header.
    fn segment_at(&self, band: u64, pos: u64) -> Result<Result<Header, bool>, EngineError> {
        let hb = read_at(self.capacity, (band * self.bpb + pos) * BS, BLOCK_BYTES)?;
        let h = decode_header(&hb, self.tag);
        Ok(match h {
            Ok(h)
                if h.kind == RecordKind::Segment
                    && pos + 1 + h.data_blocks() as u64 <= self.usable
                    && fits(self.vol_blocks, &h) =>
            {
                Ok(h)
            }
            // A header of another engine, or nothing at all: not garbage.
            Err(HeaderError::OtherEngine(_)) => Err(false),
            Err(HeaderError::NoMagic) => Err(hb.iter().any(|&x| x != 0)),
            _ => Err(true),
        })
    }
}

/// What step 1 found: per band, its segments' header blocks and sequences
/// (for the resolver), how its walk ended, and the capacity watermark (the
/// largest `flushed_seq` any header carries).
pub(super) struct BandsFound {
    pub(super) pos: Vec<Vec<u32>>,
    pub(super) seq: Vec<Vec<u64>>,
    pub(super) walks: Vec<BandWalk>,
    pub(super) watermark: u64,
}

/// Step 1: walk every band from its start, reading headers only, while
/// they check and carry the band's epoch; set each band's write pointer
/// and epoch. Each segment is listed (header block and sequence); its
/// entries are read again in step 3, once the watermark and the bands'
/// durable pointers say whether its data needs checking (keeping every
/// header's entries would cost 16 bytes per block).
pub(super) fn walk_bands(r: &SegmentReader, bands: &mut Bands) -> Result<BandsFound, EngineError> {
    let n = bands.len();
    let mut out =
        BandsFound { pos: vec![Vec::new(); n], seq: vec![Vec::new(); n], walks: Vec::with_capacity(n), watermark: 0 };
    for band in 0..bands.len() as u32 {
        let mut w = BandWalk { epoch: None, stop: 0, garbage: false, first: None };
        let mut pos = 0u64;
        while pos + 1 < r.usable {
            let h = match r.segment_at(band as u64, pos)? {
                Ok(h) if w.epoch.is_none_or(|e| e == h.epoch) => h,
                // A previous generation's segment: this one's end.
                Ok(_) => break,
                Err(garbage) => {
                    w.garbage = garbage;
                    break;
                }
            };
            out.watermark = out.watermark.max(h.flushed_seq);
            w.epoch.get_or_insert(h.epoch);
            w.first.get_or_insert(FirstSegment {
                seq: h.seq,
                stream: h.stream,
                prev_epoch: h.prev_epoch,
                prev_end: h.prev_end,
            });
            let next = (pos + segment_blocks(h.data_blocks() as u64, r.unit)).min(r.usable);
            out.pos[band as usize].push(pos as u32);
            out.seq[band as usize].push(h.seq);
            pos = next;
        }
        w.stop = pos;
        bands.found_walk(BandId(band), pos, w.epoch.unwrap_or(0));
        out.walks.push(w);
    }
    Ok(out)
}

/// How far each band must read back, and what does not.
pub(super) struct Durability {
    /// Per band, how far its segments are known durable (and so damaged,
    /// never torn, if they do not check).
    pub(super) durable_end: Vec<u64>,
    /// Bands whose predecessor is short while their own first segment is
    /// not known durable (`Recovered::voided`).
    pub(super) voided: Vec<u32>,
    /// Torn headers to zero (`Recovered::torn_headers`).
    pub(super) torn_headers: Vec<u64>,
}

/// Step 3 for bands: from the chains (each band names the band its stream
/// filled before and how far that one reached), the last mark, and durable
/// segments found past a bad header, how far each band must read back;
/// short of that is damage (into `damage`), past it a torn tail.
pub(super) fn durability(
    r: &SegmentReader,
    found: &BandsFound,
    mark: Option<&Mark>,
    zoned: bool,
    damage: &mut Vec<Damage>,
) -> Result<Durability, EngineError> {
    // Chains: a band names the one its stream filled before it and how far
    // that one reached. Once the naming band's first segment is known
    // durable — a later header's watermark passed it, or the last mark
    // covers it — a flush came after every write of the named band, so the
    // named band must read back that far: short of it is damage. Otherwise
    // a short predecessor is a torn tail, and the naming band is voided.
    // The last mark's entry for a band, if it lists it.
    let marked_band = |band: usize| mark.and_then(|m| m.bands.iter().find(|mb| mb.band as usize == band));
    let by_epoch: std::collections::HashMap<u64, usize> =
        found.walks.iter().enumerate().filter_map(|(b, w)| w.epoch.map(|e| (e, b))).collect();
    let mut chain_end = vec![0u64; found.walks.len()];
    let mut voided = Vec::new();
    for (b, w) in found.walks.iter().enumerate() {
        let Some(f) = w.first.filter(|f| f.prev_epoch != 0) else { continue };
        let Some(&a) = by_epoch.get(&f.prev_epoch) else { continue };
        let marked = marked_band(b);
        let covered = marked.is_some_and(|mb| Some(mb.epoch) == w.epoch && mb.written != RECLAIMED && mb.written > 0);
        if f.seq <= found.watermark || covered {
            // Also when the named band is not short: its segments are then
            // trusted as durable, so a block damaged at rest in one fails
            // its reads instead of being taken for a torn copy and quietly
            // reverting (`sluice sim --zns --flips` seed 20).
            chain_end[a] = chain_end[a].max(f.prev_end);
        } else if found.walks[a].stop < f.prev_end {
            voided.push(b as u32);
        }
    }
    let mut torn_headers = Vec::new();
    let streams = StreamEpochs::of(found);
    // Per band, how far its segments are known durable (and so damaged,
    // never torn, if they do not check).
    let mut durable_end = vec![0u64; found.walks.len()];
    for (band, w) in found.walks.iter().enumerate() {
        // How far the band must read back: the last mark's pointer for it.
        let marked = marked_band(band).filter(|mb| w.epoch.is_none_or(|e| e == mb.epoch));
        // GC reclaimed this generation of the band just before the last
        // mark: everything in it was relocated; its discard, and whatever
        // was written into it since, may be lost in any part.
        if marked.is_some_and(|mb| mb.written == RECLAIMED) {
            continue;
        }
        let mut must = (marked.map_or(0, |mb| mb.written as u64)).max(chain_end[band]);
        // A later band of the same stream, opened (so this one closed)
        // before a flush that a header records: everything this band holds
        // was written before that band's epoch, so is durable, and a bad
        // header in it is damage, never a torn write. The chain above says
        // as much while that later band names this one; this holds once GC
        // has reclaimed it too (`sluice sim --flips` seed 153 with writers'
        // steps: a flipped header, taken for a torn tail, lost a block
        // whose log copy was long gone).
        if streams.later(w).is_some_and(|e| e <= found.watermark) {
            must = must.max(w.stop + w.garbage as u64);
        }
        // A damaged header with a durable segment of the same band after it.
        if w.garbage {
            let mut p = (w.stop / r.unit + 1) * r.unit;
            while p + 1 < r.usable {
                if let Ok(h) = r.segment_at(band as u64, p)? {
                    if w.epoch.is_none_or(|e| e == h.epoch) && h.seq <= found.watermark {
                        must = must.max(p + 1);
                    }
                    break;
                }
                p += r.unit;
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
        if w.stop + 1 >= r.usable {
            continue;
        }
        if w.stop < must {
            damage.push(Damage::Segments { band: band as u32, from: w.stop, to: must });
        } else if w.garbage && !zoned {
            // A torn write, accepted: zeroed (`Engine::open`), or a later
            // flush would make what lies after it look durable.
            torn_headers.push(band as u64 * r.bpb + w.stop);
        }
    }

    Ok(Durability { durable_end, voided, torn_headers })
}

/// Per stream, the epochs of its bands found, in order: for the band of a
/// stream opened after a given one (`later`).
struct StreamEpochs(std::collections::HashMap<u32, Vec<u64>>);

impl StreamEpochs {
    fn of(found: &BandsFound) -> StreamEpochs {
        let mut m: std::collections::HashMap<u32, Vec<u64>> = Default::default();
        for w in &found.walks {
            if let (Some(e), Some(f)) = (w.epoch, w.first) {
                m.entry(f.stream).or_default().push(e);
            }
        }
        m.values_mut().for_each(|v| v.sort_unstable());
        StreamEpochs(m)
    }

    /// The lowest epoch of a band of `w`'s stream opened after it, if any:
    /// a stream has one open band at a time, so `w`'s was closed by then.
    fn later(&self, w: &BandWalk) -> Option<u64> {
        let (epoch, stream) = (w.epoch?, w.first?.stream);
        let v = self.0.get(&stream)?;
        v.get(v.partition_point(|&e| e <= epoch)).copied()
    }
}

/// Step 3 for segments: each segment's header read again and its entries
/// offered; the data of those that may be torn (written after the
/// watermark and past the band's durable end) verified block by block.
/// Marks every band holding a segment Full. Returns the copies that did not
/// check: (volume, LBA, sequence), torn.
pub(super) fn offer_segments(
    r: &SegmentReader,
    res: &mut Resolver,
    bands: &mut Bands,
    durable_end: &[u64],
    watermark: u64,
) -> Result<Vec<(u32, u64, u64)>, EngineError> {
    let mut torn: Vec<(u32, u64, u64)> = Vec::new();
    for (band, &durable) in durable_end.iter().enumerate() {
        for i in 0..res.band_pos[band].len() {
            let pos = res.band_pos[band][i] as u64;
            // It checked in step 1: a device that now reads otherwise is failing (EIO).
            let Ok(h) = r.segment_at(band as u64, pos)? else {
                return Err(EngineError::Device(DeviceError::Io { errno: 5 }));
            };
            res.seq_max = res.seq_max.max(h.seq).max(h.epoch);
            let first = band as u64 * r.bpb + pos;
            let n = h.data_blocks();
            // After the watermark a segment may be torn, unless a mark or
            // the next band of its stream says it was durable: then it is
            // trusted as those before the watermark are, and a damaged block
            // in it fails its reads (EIO) instead of quietly reverting to an
            // older copy.
            let verify = h.seq > watermark && pos + 1 + n as u64 > durable && n > 0;
            let body = if verify { Some(read_at(r.capacity, (first + 1) * BS, n * BLOCK_BYTES)?) } else { None };
            let mut data_i = 0usize;
            for e in &h.entries {
                if e.tombstone {
                    res.queue(Queued {
                        vol: h.volume,
                        lba: e.lba,
                        seq: h.seq,
                        loc: Loc::capacity(first),
                        crc: TOMBSTONE_CRC,
                        flags: 0,
                    })
                    .map_err(super::map_error)?;
                    continue;
                }
                let intact =
                    body.as_ref().is_none_or(|b| crc32c(&b[data_i * BLOCK_BYTES..(data_i + 1) * BLOCK_BYTES]) == e.crc);
                if intact {
                    let at = Loc::capacity(first + 1 + data_i as u64);
                    res.queue(Queued { vol: h.volume, lba: e.lba, seq: h.seq, loc: at, crc: e.crc, flags: 0 })
                        .map_err(super::map_error)?;
                } else {
                    torn.push((h.volume, e.lba, h.seq));
                }
                data_i += 1;
            }
            let tombstones = h.entries.iter().filter(|e| e.tombstone).count() as u32;
            bands.found_segment(BandId(band as u32), h.seq, tombstones);
        }
    }

    Ok(torn)
}

/// Each stream's newest full band (not voided), for `LastBands::apply`.
pub(super) fn last_bands(walks: &[BandWalk], bands: &Bands, streams: usize, voided: &[u32]) -> LastBands {
    // Each stream's newest full band is the one its next band names.
    let mut last_bands = LastBands { vols: vec![None; streams], gc: [None; GC_STREAMS] };
    for (b, w) in walks.iter().enumerate() {
        let (Some(e), Some(f)) = (w.epoch, w.first) else { continue };
        if bands[b].state() != BandState::Full || voided.contains(&(b as u32)) {
            continue;
        }
        let gc_class = STREAM_GC.wrapping_sub(f.stream) as usize;
        let slot = if gc_class < GC_STREAMS {
            &mut last_bands.gc[gc_class]
        } else if let Some(v) = last_bands.vols.get_mut(f.stream as usize) {
            v
        } else {
            continue;
        };
        if slot.is_none_or(|(_, le)| le < e) {
            *slot = Some((BandId(b as u32), e));
        }
    }
    last_bands
}
