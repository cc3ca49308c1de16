//! GC: choosing a victim band on the capacity device and relocating what is
//! still current in it to the GC band, then discarding it.
//!
//! Owns the GC cursor (the victim a bounded step left half done) and the
//! victim choice: cost-benefit ((1 − u) · age / (1 + u)), with a band that
//! holds nothing valid always first. Relocated data goes to a separate GC
//! band (its own stream), so data that survived a GC stays with data that
//! did. A victim is discarded only after both devices flushed
//! (segments.rs, rule 3) and after its generation was bumped, so a read
//! outside the lock that looked a block up before the move sees that its
//! data may be gone.

use super::bands::TOMBSTONES_UNKNOWN;
use super::pending::Deferred;
use super::segments::{segment_blocks, Data, Moved};
use super::step_io::{PreRead, Window};
use super::{BandId, BandState, Engine, Inner, Loc, VolumeError, BLOCK_BYTES, BS};
use crate::layout::decode_header;
use sluice_volume::Damage;

/// Where a bounded GC step stopped in its victim.
#[derive(Clone, Copy, Debug)]
pub(super) struct GcCursor {
    pub(super) victim: BandId,
    /// Blocks of the victim walked so far.
    pub(super) pos: u64,
}

/// What one bounded GC step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GcStep {
    /// Nothing to reclaim.
    Idle,
    /// Part of the victim moved; the next step continues it.
    Progress,
    /// The victim is free.
    Reclaimed,
}

impl Inner {
    /// Where the next GC step walks: the victim in progress, else the one
    /// `gc_victim` chooses, from its start.
    fn gc_next(&self) -> Option<GcCursor> {
        self.gc_cursor.or_else(|| Engine::gc_victim(self).map(|victim| GcCursor { victim, pos: 0 }))
    }

    /// Whether GC reclaims victim `v` without reading it: nothing valid and
    /// no tombstone is left in it (`Band::tombstones`).
    fn gc_skips_reading(&self, v: BandId) -> bool {
        let b = &self.bands[v];
        b.valid() == 0 && b.tombstones() == 0
    }

    /// Blocks a GC step reads at `pos` of a victim `written` blocks long: a
    /// step bounded below a window reads only what it may walk, and the
    /// whole of a segment that starts within that (so that a bounded step
    /// reads one window, whose read the background compactor makes without
    /// the lock; reading only what it walks left the last segment to a
    /// second read under the lock).
    fn gc_read_blocks(&self, pos: u64, blocks_max: u64, written: u64) -> u64 {
        let seg = self.segment_blocks_max();
        let walk = blocks_max.max(1).max(seg);
        self.gc_window_blocks().min(walk.saturating_add(seg - 1)).min(written - pos)
    }

    /// Blocks GC reads at once from a victim: at least a chunk and at least
    /// the largest segment.
    pub(super) fn gc_window_blocks(&self) -> u64 {
        self.blocks_per_chunk().max(self.segment_blocks_max())
    }

    /// The window the next `gc_step(blocks_max)` reads first, if any.
    pub(super) fn gc_window(&self, blocks_max: u64) -> Option<Window> {
        let GcCursor { victim: v, pos } = self.gc_next()?;
        if self.gc_skips_reading(v) {
            return None;
        }
        let written = self.bands[v].written();
        let len = self.gc_read_blocks(pos, blocks_max, written);
        let offset = (v.0 as u64 * self.blocks_per_band() + pos) * BS;
        let gen = self.bands[v].gen();
        (len > 0).then_some(Window { cache: false, offset, len: (len * BS) as usize, gen, headers_only: false })
    }

    /// Blocks at most that carrying `tombstones` tombstones, which came in
    /// `segments` segments, takes GC: a segment per volume of them (at most
    /// the volumes there are, and as many as their entries need), each
    /// padded to the write unit.
    pub(super) fn tombstone_carry(&self, tombstones: u32, segments: u32) -> u64 {
        let by_entries = (tombstones as u64).div_ceil(crate::layout::RECORD_BLOCKS_MAX as u64);
        let segs = (segments as u64).min(self.vols.len() as u64).max(by_entries).max(1);
        segs * segment_blocks(0, self.cfg.write_unit_bytes / BS)
    }
}

impl Engine {
    /// Reclaim one band (finishing the one a bounded step left half done,
    /// if any); false if nothing is reclaimable.
    pub(super) fn collect_one(&self, inner: &mut Inner) -> Result<bool, VolumeError> {
        loop {
            match self.gc_step(inner, u64::MAX, &mut None, false)? {
                GcStep::Idle => return Ok(false),
                GcStep::Reclaimed => return Ok(true),
                GcStep::Progress => {}
            }
        }
    }

    /// The band GC should take next, by cost-benefit. A band with nothing
    /// valid left costs no copies and is always taken first (plain
    /// cost-benefit would prefer an older half-full band to a younger empty
    /// one: a sequentially rewritten tenant's zones die whole, a moment
    /// after they are old enough to be chosen). First of all a band that
    /// holds no tombstone either: it is reclaimed without reading or
    /// writing anything, where one with tombstones may need a GC band to
    /// carry the live ones to. With no band free, choosing the latter first
    /// ended in no space while dozens of empty bands waited (`sluice sim
    /// --swarm` seed 1980).
    fn gc_victim(inner: &Inner) -> Option<BandId> {
        let usable = inner.band_usable();
        let now = inner.seq.last();
        // Bands holding blocks that records in flight rewrite wait
        // (writers.rs: `relocations_clear`).
        let avoid = match inner.log.inflight().is_empty() {
            true => Vec::new(),
            false => inner.bands_in_flight()?,
        };
        inner
            .bands
            .iter()
            .enumerate()
            .filter(|&(i, b)| {
                b.state() == BandState::Full
                    && (b.valid() as u64) < usable
                    && !inner.bands.is_quarantined(BandId(i as u32))
                    && !avoid.contains(&BandId(i as u32))
            })
            .map(|(i, b)| {
                let u = b.valid() as f64 / usable as f64;
                let age = (now - b.closed_seq()) as f64 + 1.0;
                let score = match (b.valid(), b.tombstones()) {
                    (0, 0) => f64::INFINITY,
                    (0, TOMBSTONES_UNKNOWN) => f64::MAX,
                    (0, _) => {
                        // Only tombstones: first, as a band with nothing
                        // valid, if carrying them frees blocks. Else last:
                        // two such bands took turns for ever, each carried
                        // into a fresh GC band it filled (`sluice sim
                        // --swarm --seed-start 7100000099`: 4 volumes, bands
                        // of 4 write units). Last, not never: the count
                        // keeps tombstones that died since, free to drop.
                        let carry = inner.tombstone_carry(b.tombstones(), b.tomb_segments());
                        if carry >= b.written() {
                            -1.0
                        } else {
                            f64::MAX
                        }
                    }
                    _ => (1.0 - u) * age / (1.0 + u),
                };
                (i, score)
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| BandId(i as u32))
    }

    /// GC the victim in progress (choosing one if none is) for at least one
    /// segment and until `blocks_max` of its blocks were walked (or the
    /// victim ends; `gc_window_blocks` is one full read): its current blocks and live
    /// tombstones go to the GC band under fresh sequence numbers. Between
    /// steps the victim stays Full and readable and the engine lock is free,
    /// so the background compactor collects a band a window at a time; every
    /// window re-checks the map, so blocks rewritten or trimmed meanwhile are
    /// simply not moved. The victim is discarded (after both devices flush,
    /// rule 3) when its last window is done.
    pub(super) fn gc_step(
        &self,
        inner: &mut Inner,
        blocks_max: u64,
        pre: &mut Option<PreRead>,
        defer: bool,
    ) -> Result<GcStep, VolumeError> {
        // Every remap applied before valid counts choose or walk a victim.
        self.settle(inner)?;
        // `defer`: as in `compact_step`, relocations stay in flight with
        // their remaps for the caller to finish without the lock.
        let mut deferred = defer.then(Deferred::default);
        let blocks_max = blocks_max.max(1);
        let Some(cursor) = inner.gc_next() else { return Ok(GcStep::Idle) };
        inner.gc_cursor = Some(cursor);
        if inner.bands[cursor.victim].state() == BandState::Full {
            inner.bands.start_victim(cursor.victim);
        }
        assert_eq!(inner.bands[cursor.victim].state(), BandState::Victim, "GC walks a full band");
        let GcCursor { victim: v, mut pos } = cursor;
        let bpb = inner.blocks_per_band();
        let unit = inner.cfg.write_unit_bytes / BS;
        let first = v.0 as u64 * bpb;
        let written = inner.bands[v].written();
        // A victim with no valid block and no tombstone holds nothing to
        // move: reclaim it without reading it.
        if inner.gc_skips_reading(v) {
            pos = written;
            if let Some(p) = pre.take() {
                inner.give_buf(p.into_buf());
            }
            self.bg.victims_unread.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // Reads are whole windows of the band (≥ a chunk, ≥ the largest
        // segment), not a header and then data per segment: a NAND device
        // serves one large read from all its dies at once.
        let window_blocks = inner.gc_window_blocks();
        // Walk the victim segment by segment, gathering current blocks and
        // live tombstones per volume; every window's worth of them (and what
        // is left at the end of the step) goes to the GC band as segments.
        let nv = inner.vols.len();
        // Per volume: current blocks (lba, crc, where their data is), their
        // data, live tombstones. A deferred step leaves the data in its
        // windows, which go with its queued writes (`Data::Deferred`).
        type Gathered = (Vec<Moved>, Vec<u8>, Vec<u64>);
        let mut gathered: Vec<Gathered> = vec![(Vec::new(), Vec::new(), Vec::new()); nv];
        let mut held = 0u64;
        let mut walked = 0u64;
        while pos < written && walked < blocks_max {
            self.drain_capacity(inner)?;
            // This thread is about to read the capacity device, whose
            // completions for it would include the deferred writes'.
            if let Some(d) = deferred.as_mut().filter(|d| !d.queued.is_empty()) {
                self.settle_deferred(inner, d)?;
            }
            let len = inner.gc_read_blocks(pos, blocks_max, written);
            let gen = inner.bands[v].gen();
            let win = self.read_window(
                inner,
                pre,
                Window { cache: false, offset: (first + pos) * BS, len: (len * BS) as usize, gen, headers_only: false },
            )?;
            // Segments whose data lies wholly in the window; `at` ends at the
            // first that does not (the next window starts there).
            let base = deferred.as_ref().map(|d| d.next_source_at());
            let mut at = 0u64;
            while at < len && walked + at < blocks_max {
                let h = decode_header(&win[(at * BS) as usize..((at + 1) * BS) as usize], inner.tag);
                let damaged =
                    |what: Damage| VolumeError::Damaged { device: "capacity", offset: (first + pos + at) * BS, what };
                let h = h.map_err(|cause| damaged(Damage::SegmentHeader { band: v.0, cause }))?;
                let n = h.data_blocks() as u64;
                if at + 1 + n > len {
                    break;
                }
                let vol = h.volume as usize;
                if vol >= nv {
                    return Err(damaged(Damage::SegmentVolume { band: v.0, block: pos + at, volume: vol as u32 }));
                }
                let seg = first + pos + at;
                let l2p = &inner.vols[vol].l2p;
                let g = &mut gathered[vol];
                for (i, e) in h.entries.iter().filter(|e| !e.tombstone).enumerate() {
                    if l2p.try_get(e.lba)? == Some(Loc::capacity(seg + 1 + i as u64)) {
                        let d = ((at + 1 + i as u64) * BS) as usize;
                        match base {
                            Some(base) => g.0.push((e.lba, e.crc, base + d)),
                            None => {
                                g.0.push((e.lba, e.crc, g.1.len()));
                                g.1.extend_from_slice(&win[d..d + BLOCK_BYTES]);
                            }
                        }
                        held += 1;
                    }
                }
                for e in h.entries.iter().filter(|e| e.tombstone) {
                    if l2p.tombstone_live(e.lba, h.seq)? {
                        g.2.push(e.lba);
                    }
                }
                at += segment_blocks(n, unit);
            }
            match deferred.as_mut() {
                Some(d) => d.sources.push(win),
                None => inner.give_buf(win),
            }
            if at == 0 {
                return Err(VolumeError::Damaged {
                    device: "capacity",
                    offset: (first + pos) * BS,
                    what: Damage::SegmentTooLarge { band: v.0 },
                });
            }
            pos += at;
            walked += at;
            if held >= window_blocks || pos >= written || walked >= blocks_max {
                for (vol, g) in gathered.iter_mut().enumerate() {
                    if g.0.is_empty() && g.2.is_empty() {
                        continue;
                    }
                    let (s, born) = (inner.gc_stream(v), inner.bands[v].born());
                    let what = if deferred.is_some() { Data::Deferred } else { Data::Here(&g.1) };
                    let moved =
                        self.write_segments(inner, vol as u32, (s, born), (&g.0, what), &g.2, deferred.as_mut())?;
                    inner.stats.collected(moved * BS);
                    g.0.clear();
                    g.1.clear();
                    g.2.clear();
                }
                held = 0;
            }
        }
        // Nothing stays in flight between steps: requests in between use
        // the capacity device synchronously.
        self.drain_capacity(inner)?;
        if pos < written {
            inner.gc_cursor = Some(GcCursor { victim: v, pos });
            inner.defer_pending(deferred);
            return Ok(GcStep::Progress);
        }
        // The victim is discarded below: its blocks must live at their
        // copies first. A deferred step with writes queued leaves that to
        // the next step, which settles them first (as compaction does).
        if deferred.as_ref().is_some_and(|d| !d.queued.is_empty()) {
            inner.gc_cursor = Some(GcCursor { victim: v, pos });
            inner.defer_pending(deferred);
            return Ok(GcStep::Progress);
        }
        inner.defer_pending(deferred);
        assert_eq!(inner.bands[v].valid(), 0, "victim fully relocated");
        // Rule 3: relocations, and whatever made the victim's dropped entries
        // stale, are durable before the victim is discarded.
        if inner.cap.is_dirty() {
            self.flush_capacity(inner)?;
        }
        // ... the log's records among them before the mark that reclaims
        // the victim (as `free_oldest`: one flush of both could keep the
        // mark alone).
        self.flush_cache_if_written(inner)?;
        self.write_mark(inner, None, Some(v))?;
        self.flush_cache(inner)?;
        // (Until the discard is durable, the reclaim mark stands.)
        inner.learn_lifespan(v);
        self.discard_band(inner, v)?;
        inner.gc_cursor = None;
        inner.reuse_freed(None, Some(v));
        inner.stats.band_reclaimed();
        Ok(GcStep::Reclaimed)
    }
}
