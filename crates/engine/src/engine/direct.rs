//! Direct writes: a large write goes to the capacity device as a segment of
//! its own, without passing through the log (write shaping, `Layout::Bands`).
//!
//! Owns: the size from which a write goes direct (`Direct`), and the direct
//! segment's write: sized to whole write units (header included), written
//! at the write pointer of the volume's open band, its blocks remapped.
//!
//! Why: a write that is already large and unit-aligned gains nothing from
//! the log — its segment on the capacity device is what compaction would
//! write — and through the log it costs a cache write, a compaction read
//! and a second capacity copy (3.6x nbdkit's CPU per 128 KiB write on
//! memory devices, where copies are the devices' work). The log still
//! takes small writes (a 4 KiB random write is what it shapes), and the
//! blocks of a large write past its last whole unit: a segment is
//! `k * unit` blocks, header included, so it never pads, and the capacity
//! device sees exactly the bytes compaction's full segments would give.
//!
//! Invariants, beside segments.rs's rules (a direct segment is a segment:
//! self-describing, a fresh sequence, so it wins over every older copy):
//! - a direct write never overlaps a log record in flight (writers.rs): a
//!   capacity copy the map holds is older than every record in flight, so
//!   a record that completes late is published over it; such a write goes
//!   through the log instead;
//! - it is made under the lock, device write included, so no relocation,
//!   trim or other write of its blocks runs meanwhile;
//! - its blocks were never anywhere but here: unlike compaction's copies,
//!   a lost direct segment loses data. So a FLUSH or FUA after direct
//!   writes flushes the capacity device and writes a mark (marks.rs) of
//!   the bands' pointers before it is answered, and recovery reads the
//!   segment back as durable: damage if it does not check, never a torn
//!   tail quietly dropped (`CapWrites::unmarked`);
//! - not on a zoned device: compaction's deferred segments, written later
//!   outside the lock, may sit below the write pointer in the same zone.

use super::bands::band_has_room;
use super::{encode_header, sync_io, Engine, Inner, IoBuf, IoRequest, Loc, VolumeError, BLOCK_BYTES, BS};
use crate::layout::{Entry, RECORD_BLOCKS_MAX};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes of at least this many bytes go direct by default: none (0). The
/// direct write holds the engine lock across its device write, so on a
/// slow capacity device it serializes large writes at the device's
/// latency: on emulated SCM + QLC in real time a 128 KiB stream beside
/// 4 KiB random writes ran 276 MiB/s with direct writes against 319
/// without, and the small writes' p99 doubled (12.4 ms against 6.1;
/// docs/results/2026-12-04-direct-writes.md). On memory or fast devices
/// it pays (`examples/memory.toml` turns it on).
pub const DIRECT_WRITE_BYTES_DEFAULT: u64 = 0;

/// When writes go direct: from this many bytes (0: never), read without
/// the lock by every write (`Engine::direct_min`).
pub(super) struct DirectMin(AtomicU64);

impl Default for DirectMin {
    fn default() -> DirectMin {
        DirectMin(AtomicU64::new(DIRECT_WRITE_BYTES_DEFAULT))
    }
}

impl Engine {
    /// Data blocks of the direct segment a write of `blocks` blocks of
    /// volume `vol` from `lba0` takes now, if it goes direct (writes of
    /// `min_bytes` or more, 0: none): whole units, header included, within
    /// the volume's open band (the rest goes through the log); 0 if it goes
    /// through the log whole. With no open band, one is opened, as
    /// compaction would (GC first if bands run short), unless that could
    /// relocate a block a record in flight rewrites.
    pub(super) fn direct_blocks(
        &self,
        inner: &mut Inner,
        min_bytes: u64,
        vol: u32,
        lba0: u64,
        blocks: u64,
    ) -> Result<u64, VolumeError> {
        if min_bytes == 0 || blocks * BS < min_bytes || inner.in_place() || inner.geo.zoned {
            return Ok(0);
        }
        // Never beside a record in flight of the same blocks.
        let end = lba0 + blocks;
        let overlaps = (inner.log.inflight().values())
            .any(|f| f.vol == vol && f.entries.iter().any(|e| (lba0..end).contains(&e.lba)));
        if overlaps {
            return Ok(0);
        }
        let s = inner.user_stream(vol, 1);
        if !band_has_room(inner, s) {
            if !inner.relocations_clear() {
                return Ok(0);
            }
            match self.open_band(inner, s) {
                Ok(_) => {}
                Err(VolumeError::NoSpace) => return Ok(0),
                Err(e) => return Err(e),
            }
        }
        let band = inner.stream_band(s).0.expect("an open band with room");
        let unit = inner.cfg.write_unit_bytes / BS;
        let room = inner.band_usable() - inner.bands[band].written();
        let most = (1 + blocks.min(RECORD_BLOCKS_MAX as u64)).min(room);
        Ok((most / unit * unit).saturating_sub(1))
    }

    /// Set the size from which writes go direct (0: never; default
    /// `DIRECT_WRITE_BYTES_DEFAULT`).
    pub fn set_direct_write_bytes(&self, bytes: u64) {
        self.direct_min.0.store(bytes, Ordering::Relaxed);
    }

    /// The size from which writes go direct (0: never).
    pub fn direct_write_bytes(&self) -> u64 {
        self.direct_min.0.load(Ordering::Relaxed)
    }

    /// Write the first `n` blocks of `buf` — a header block's room, then
    /// the data of LBAs `lba0`.. with `crcs` — as one segment of volume
    /// `vol` at the write pointer of its open band (`Inner::direct_blocks`
    /// chose `n`), remap them, and give `buf` back (its data unchanged).
    pub(super) fn write_direct(
        &self,
        inner: &mut Inner,
        vol: u32,
        lba0: u64,
        n: u64,
        mut buf: IoBuf,
        crcs: &[u32],
    ) -> (Result<(), VolumeError>, IoBuf) {
        let s = inner.user_stream(vol, 1);
        let band = inner.stream_band(s).0.expect("direct_blocks found the open band");
        let blocks = 1 + n;
        let (bpb, usable) = (inner.blocks_per_band(), inner.band_usable());
        let born = inner.user_clock();
        let wp = inner.bands.append(band, blocks, 0, born, usable);
        let seq = inner.seq.next();
        let entries = (0..n).map(|i| Entry { lba: lba0 + i, crc: crcs[i as usize], tombstone: false }).collect();
        let h = inner.segment_header(band, s, vol, seq, entries);
        encode_header(&mut buf[..BLOCK_BYTES], &h);
        let full = buf.len();
        buf.set_len((blocks * BS) as usize);
        let first = band.0 as u64 * bpb + wp;
        inner.reuse_wait(None, Some(band));
        // Counted before the write: should it fail, the device may hold
        // part of it, and the next flush must still come first.
        inner.cap.wrote_direct();
        let c = sync_io(&*self.capacity, IoRequest::write(first * BS, buf, 0));
        let mut buf = c.buf;
        buf.set_len(full);
        if let Err(e) = c.result {
            return (Err(e.into()), buf);
        }
        inner.stats.segment_written(blocks, n);
        let r = (|| {
            for i in 0..n {
                let lba = lba0 + i;
                let old = inner.vols[vol as usize].l2p.get(lba as usize)?;
                inner.vols[vol as usize].l2p.set(lba as usize, Loc::capacity(first + 1 + i), crcs[i as usize])?;
                inner.invalidate(old);
                inner.bands.add_valid(band);
            }
            Ok(())
        })();
        inner.stats.user_wrote(n * BS);
        inner.vols[vol as usize].moved.direct(n * BS);
        if inner.bands[band].written() == usable {
            inner.bands.close(band, s, seq);
        }
        (r, buf)
    }

    /// After direct writes, what a FLUSH or FUA needs besides the cache
    /// device's flush: the capacity device flushed and a mark of the
    /// bands' pointers written and flushed, so recovery takes the direct
    /// segments as durable (module doc).
    pub(super) fn mark_direct_writes(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        if !inner.cap.unmarked() {
            return Ok(());
        }
        self.flush_capacity(inner)?;
        self.write_mark(inner, None, None)?;
        self.flush_cache(inner)
    }
}

#[cfg(test)]
mod tests {
    use crate::testkit::*;
    use crate::Volume;
    use sluice_media::memory::MemoryDevice;
    use sluice_media::BlockDevice;
    use std::sync::Arc;

    const BS: usize = 4096;

    /// Writes of 16 blocks (4 write units) go direct from 64 KiB: 15
    /// blocks as a segment of 4 units, header included, the last block
    /// through the log; smaller writes through the log whole. Everything
    /// reads back, before and after a reopen, and a FLUSH after direct
    /// writes flushes the capacity device (and writes a mark: marks.rs);
    /// with direct writes off, nothing goes direct.
    #[test]
    fn large_writes_go_direct_in_whole_units_and_a_flush_makes_them_durable() {
        for min in [64 << 10, 0] {
            let (c, p) = small_device_bytes(&[256]);
            let cache: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(c, 4096));
            let capacity: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(p, 4096));
            let w = small_world_on(cache.clone(), capacity.clone(), &[256]);
            w.engine.set_direct_write_bytes(min);
            let mut model = vec![vec![0u64; 256]];
            let mut gen = 0;
            for first in (0..256u64).step_by(16) {
                gen += 1;
                let data: Vec<u8> = (first..first + 16).flat_map(|lba| pattern(0, lba, gen)).collect();
                w.volumes[0].write(first * BS as u64, &data, false).unwrap();
                (first..first + 16).for_each(|lba| model[0][lba as usize] = gen);
            }
            gen += 1;
            w.volumes[0].write(5 * BS as u64, &pattern(0, 5, gen), false).unwrap();
            model[0][5] = gen;
            let s = w.engine.snapshot();
            let direct = s.volumes[0].direct_bytes;
            let flushes = capacity.stats().flushes;
            w.volumes[0].flush().unwrap();
            if min == 0 {
                assert_eq!(direct, 0);
            } else {
                assert_eq!(direct, 16 * 15 * BS as u64, "15 of each 16 blocks");
                // The log took one block (and its header) per write, and the 4 KiB write.
                assert_eq!(s.stats.cache_write_bytes, 17 * 2 * BS as u64, "{:?}", s.stats);
                assert_eq!(s.stats.capacity_write_bytes, 16 * 16 * BS as u64, "whole units, no padding");
                assert!(capacity.stats().flushes > flushes, "the FLUSH flushed the capacity device");
            }
            assert_reads_as(&w, &model);
            w.engine.check_invariants();
            let e = flushed_and_reopened(w);
            let w = World { volumes: vec![e.volume("v0").unwrap()], engine: e };
            assert_reads_as(&w, &model);
        }
    }
}
