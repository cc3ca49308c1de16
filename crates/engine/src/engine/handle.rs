//! The handle frontends hold to a volume (`EngineVolume`, the `Volume`
//! trait on top of the engine) and the operator's view of the whole engine
//! (`Engine::snapshot`).
//!
//! Every request through a handle is timed and counted in its volume's
//! `VolumeMetrics`; every change runs under the engine lock through
//! `change`, which stops all further changes after a device error. Reads do
//! their device I/O outside the lock, bounded by read permits and checked
//! afterwards against the generation of each place they read (docs/engine.md).

use super::caching::CacheCount;
use super::{
    check, crc32c, pool, write_at, writers, Arc, CacheReport, CompactorSnapshot, DeviceStats, Engine, EngineError,
    EngineStats, Extent, Inner, IoBuf, Op, OpSnapshot, Serialize, StagedWrite, Volume, VolumeError, VolumeMetrics,
    WriteBuf, BLOCK_BYTES, BS,
};

impl Engine {
    /// A handle to a volume by name.
    pub fn volume(self: &Arc<Engine>, name: &str) -> Result<EngineVolume, EngineError> {
        let inner = self.lock();
        let id = inner.vols.iter().position(|v| v.name == name).ok_or_else(|| EngineError::NoVolume(name.into()))?;
        let size_bytes = inner.vols[id].l2p.len() as u64 * BS;
        Ok(EngineVolume {
            engine: self.clone(),
            id: id as u32,
            name: name.to_string(),
            size_bytes,
            record_blocks_max: inner.record_blocks_max(),
            metrics: self.metrics[id].clone(),
            in_place: inner.in_place(),
        })
    }

    /// Everything an operator watches, copied at one moment: counters, log
    /// and band occupancy, both devices' counters, per-volume requests.
    pub fn snapshot(&self) -> EngineSnapshot {
        let mut inner = self.lock();
        self.fold_read_bytes(&mut inner);
        let chunks = inner.log.chunk_count() as u64 - 1; // chunk 0: superblock
        let cache_valid: u64 = inner.log.chunks().map(|(_, c)| c.valid() as u64).sum();
        let volumes = inner
            .vols
            .iter()
            .zip(&self.metrics)
            .map(|(v, m)| VolumeSnapshot {
                name: v.name.clone(),
                size_bytes: v.l2p.len() as u64 * BS,
                ops: m.snapshot(),
                compaction_bytes: v.moved.get().0,
                gc_bytes: v.moved.get().1,
                direct_bytes: v.moved.get().2,
                checksum_errors: m.checksum_errors(),
            })
            .collect();
        EngineSnapshot {
            stats: inner.stats.get(),
            host_waf: inner.stats.get().host_waf(),
            log_chunks: chunks,
            log_chunks_free: inner.log.free_len() as u64,
            log_chunk_bytes: inner.cfg.chunk_bytes,
            cache_valid_bytes: cache_valid * BS,
            bands: inner.bands.len() as u64,
            bands_free: inner.bands.free_len() as u64,
            band_bytes: inner.cfg.band_bytes,
            failed: inner.health.is_stopped(),
            stopped_by: inner.health.cause().map(|e| e.to_string()),
            cache_device: self.cache.stats(),
            capacity_device: self.capacity.stats(),
            volumes,
            compactor: self.compactor_snapshot(),
            cache: inner.cache_report(),
        }
    }
}

/// Whether a write buffer with `head` bytes of room and `len` of data can
/// be logged as it is: room for a header, whole blocks, one record of at
/// most `blocks_max` data blocks.
fn owned_fits(head: usize, len: usize, blocks_max: usize) -> bool {
    head == BLOCK_BYTES && len > 0 && len.is_multiple_of(BLOCK_BYTES) && len / BLOCK_BYTES <= blocks_max
}

/// Idle write buffers kept (`Engine::write_bufs`): a QD32 stream of
/// 1 MiB writes.
const WRITE_BUFS_BYTES_MAX: usize = 64 << 20;

impl Engine {
    /// A write buffer back to the pool.
    fn give_write_buf(&self, rec: IoBuf) {
        self.write_bufs.lock().unwrap_or_else(|p| p.into_inner()).give(rec, WRITE_BUFS_BYTES_MAX);
    }

    /// The engine's state for a request, unless it was shut down.
    pub(super) fn live(&self) -> Result<std::sync::MutexGuard<'_, Inner>, VolumeError> {
        Ok(self.drained(self.live_raw()?))
    }

    /// `live`, records in flight or not (the read path: a read sees what is
    /// published, and waits for no record's device write; writers.rs).
    pub(super) fn live_raw(&self) -> Result<std::sync::MutexGuard<'_, Inner>, VolumeError> {
        let inner = self.lock_for_request();
        if inner.health.is_closed() {
            return Err(VolumeError::ReadOnly);
        }
        Ok(inner)
    }

    /// Run a change under the lock; a device error during it stops all
    /// further changes (`Inner::health`) until the engine is reopened.
    pub(super) fn change<T>(
        &self,
        f: impl FnOnce(&Engine, &mut Inner) -> Result<T, VolumeError>,
    ) -> Result<T, VolumeError> {
        self.change_under(self.live()?, f)
    }

    /// `change` for a relocation step (compaction, GC): beside the records
    /// in flight when it may run beside them (`Engine::lock_for_relocation`).
    /// `remaps_only` (settling a step's remaps, each applied only if its
    /// block did not move meanwhile): beside them always.
    pub(super) fn relocate<T>(
        &self,
        remaps_only: bool,
        f: impl FnOnce(&Engine, &mut Inner) -> Result<T, VolumeError>,
    ) -> Result<T, VolumeError> {
        let inner = if remaps_only { self.lock_raw() } else { self.lock_for_relocation() };
        if inner.health.is_closed() {
            return Err(VolumeError::ReadOnly);
        }
        self.change_under(inner, f)
    }

    fn change_under<T>(
        &self,
        mut inner: std::sync::MutexGuard<'_, Inner>,
        f: impl FnOnce(&Engine, &mut Inner) -> Result<T, VolumeError>,
    ) -> Result<T, VolumeError> {
        // Stopped, or opened read-only.
        inner.taking_changes()?;
        let r = f(self, &mut inner);
        let r = inner.stop_on_device_error(r);
        self.after_change(&inner);
        r
    }
}

impl EngineVolume {
    fn live(&self) -> Result<std::sync::MutexGuard<'_, Inner>, VolumeError> {
        self.engine.live()
    }

    fn change<T>(&self, f: impl FnOnce(&Engine, &mut Inner) -> Result<T, VolumeError>) -> Result<T, VolumeError> {
        self.engine.change(f)
    }
}

/// A volume of an engine: what frontends serve.
pub struct EngineVolume {
    engine: Arc<Engine>,
    id: u32,
    name: String,
    size_bytes: u64,
    /// Most data blocks one log record holds (`Inner::record_blocks_max`).
    record_blocks_max: usize,
    metrics: Arc<VolumeMetrics>,
    /// The engine holds its volumes in place (caching.rs routes writes).
    in_place: bool,
}

/// One volume in an [`EngineSnapshot`].
#[derive(Clone, Debug, Serialize)]
pub struct VolumeSnapshot {
    pub name: String,
    pub size_bytes: u64,
    /// read, write, trim (incl. write-zeroes), flush.
    pub ops: Vec<OpSnapshot>,
    /// This volume's data bytes compaction and GC wrote to the capacity
    /// device since the engine was opened (GC's band is shared by all
    /// volumes, but every relocated block is counted to its own volume).
    pub compaction_bytes: u64,
    pub gc_bytes: u64,
    /// Bytes of the volume's writes that went to the capacity device
    /// directly, as segments of their own (direct.rs).
    pub direct_bytes: u64,
    /// Reads that found a block not matching its CRC (each failed with EIO).
    pub checksum_errors: u64,
}

/// See [`Engine::snapshot`].
#[derive(Clone, Debug, Serialize)]
pub struct EngineSnapshot {
    pub stats: EngineStats,
    pub host_waf: f64,
    pub log_chunks: u64,
    pub log_chunks_free: u64,
    pub log_chunk_bytes: u64,
    /// Bytes of current data in the cache log (the rest is stale or free).
    pub cache_valid_bytes: u64,
    pub bands: u64,
    pub bands_free: u64,
    pub band_bytes: u64,
    /// A device failed under a change: writes are refused until reopen.
    pub failed: bool,
    /// Why (the first error), if it did.
    pub stopped_by: Option<String>,
    pub cache_device: DeviceStats,
    pub capacity_device: DeviceStats,
    pub volumes: Vec<VolumeSnapshot>,
    pub compactor: CompactorSnapshot,
    /// In place: each volume's cache policy and counters (empty with bands).
    pub cache: Vec<CacheReport>,
}

impl EngineVolume {
    /// `write_batch(writes, fua)` as a [`StagedWrite`], whose
    /// steps the caller takes one at a time (the simulation's scheduler).
    /// Every range is checked first. None in place, where writes do not
    /// take the concurrent path.
    pub fn stage_write(&self, writes: &[(u64, &[u8])], fua: bool) -> Result<Option<StagedWrite>, VolumeError> {
        let (blocks, crcs) = self.blocks_of(writes)?;
        if self.in_place {
            return Ok(None);
        }
        Ok(Some(self.engine.stage_write(self.id, &blocks, &crcs, self.record_blocks_max, fua)))
    }

    /// `trim(offset, len)` as a [`StagedWrite`] (the simulation's
    /// scheduler takes its steps). The range is checked first. None in
    /// place, where trims do not take the concurrent path.
    pub fn stage_trim(&self, offset: u64, len: u64) -> Result<Option<StagedWrite>, VolumeError> {
        check(self, offset, len)?;
        if self.in_place {
            return Ok(None);
        }
        Ok(Some(self.engine.stage_trim(self.id, offset / BS..(offset + len) / BS)))
    }

    /// Writes (offset, data), every range checked, as (first LBA, data)
    /// and every block's CRC.
    #[allow(clippy::type_complexity)]
    fn blocks_of<'a>(&self, writes: &[(u64, &'a [u8])]) -> Result<(Vec<(u64, &'a [u8])>, Vec<u32>), VolumeError> {
        for &(offset, data) in writes {
            check(self, offset, data.len() as u64)?;
        }
        let blocks = writes.iter().map(|&(o, d)| (o / BS, d)).collect();
        let crcs = writes.iter().flat_map(|w| w.1.chunks(BLOCK_BYTES).map(crc32c)).collect();
        Ok((blocks, crcs))
    }

    /// The direct part of a write of `crcs.len()` blocks from `lba0`
    /// whose data follows a header block's room in `buf` (direct.rs): how
    /// many leading blocks went direct (0: none), and `buf` back.
    fn write_direct_part(&self, lba0: u64, buf: IoBuf, crcs: &[u32], fua: bool) -> Result<(usize, IoBuf), VolumeError> {
        let mut buf = Some(buf);
        let n = self.engine.change_under(self.engine.live_raw()?, |e, inner| {
            let n = e.direct_blocks(inner, e.direct_write_bytes(), self.id, lba0, crcs.len() as u64)?;
            if n == 0 {
                return Ok(0);
            }
            let (r, b) = e.write_direct(inner, self.id, lba0, n, buf.take().expect("the buffer"), crcs);
            buf = Some(b);
            r?;
            if fua {
                e.mark_direct_writes(inner)?;
            }
            Ok(n as usize)
        });
        n.map(|n| (n, buf.expect("the buffer, given back")))
    }

    fn write_batch_inner(&self, writes: &[(u64, &[u8])], fua: bool) -> Result<(), VolumeError> {
        // One write large enough: its leading whole units as a segment of
        // their own, copied into a buffer with room for the header (a batch
        // of several keeps its order through the log).
        if let [(offset, data)] = writes {
            if !self.in_place && (1..=data.len() as u64).contains(&self.engine.direct_write_bytes()) {
                check(self, *offset, data.len() as u64)?;
                let crcs: Vec<u32> = data.chunks(BLOCK_BYTES).map(crc32c).collect();
                let mut buf =
                    self.engine.write_bufs.lock().unwrap_or_else(|p| p.into_inner()).take(BLOCK_BYTES + data.len());
                buf[BLOCK_BYTES..].copy_from_slice(data);
                let (n, buf) = self.write_direct_part(offset / BS, buf, &crcs, fua)?;
                self.engine.give_write_buf(buf);
                if n > 0 {
                    if n == crcs.len() {
                        return Ok(());
                    }
                    return self.write_batch_inner(&[(offset + n as u64 * BS, &data[n * BLOCK_BYTES..])], fua);
                }
            }
        }
        let (blocks, crcs) = self.blocks_of(writes)?;
        let bytes: u64 = writes.iter().map(|w| w.1.len() as u64).sum();
        self.engine.pace_write(bytes);
        if !self.in_place {
            // Reserved, written and published without holding the lock
            // across the device write (writers.rs).
            let recs = writers::records_of(&blocks, &crcs, self.record_blocks_max);
            let (r, bufs) = self.engine.write_concurrent(self.id, recs, fua);
            bufs.into_iter().for_each(pool::give_thread_buf);
            return r;
        }
        let mut deferred = Vec::new();
        self.change(|e, inner| {
            if self.in_place {
                e.write_in_place(inner, self.id, &blocks, &crcs, fua, &mut deferred)?;
            } else {
                e.append(inner, self.id, &blocks, &crcs, fua)?;
            }
            inner.stats.user_wrote(bytes);
            Ok(())
        })?;
        if deferred.is_empty() {
            return Ok(());
        }
        // Home writes past the log, without the lock (`write_in_place`)
        // when a permit leaves the device queue room, else under it.
        let homes: Vec<(u64, &[u8])> = deferred.iter().map(|d| (d.at, blocks[d.index].1)).collect();
        // (How many were written, and the bytes or the first error.)
        let write = || -> (usize, Result<u64, VolumeError>) {
            let mut n = 0;
            for (i, &(at, data)) in homes.iter().enumerate() {
                if let Err(e) = write_at(&*self.engine.capacity, at, data) {
                    return (i, Err(e.into()));
                }
                n += data.len() as u64;
            }
            (homes.len(), Ok(n))
        };
        match self.engine.unlocked_read_permit() {
            Some(_permit) => {
                let (done, result) = write();
                self.change(|e, inner| e.finish_home_writes(inner, self.id as usize, (&homes, done), result, fua))
            }
            None => self.change(|e, inner| {
                let (done, result) = write();
                e.finish_home_writes(inner, self.id as usize, (&homes, done), result, fua)
            }),
        }
    }

    /// A read that found a block whose data does not match its CRC: counted
    /// in the volume's metrics and logged (at most a few lines a second,
    /// with how many were not), then answered as it is (EIO for NBD).
    fn report_corruption<T>(&self, r: Result<T, VolumeError>) -> Result<T, VolumeError> {
        if let Err(VolumeError::Corrupt { offset, device, device_offset }) = &r {
            self.metrics.count_checksum_error();
            static LIMIT: crate::report::LogLimit = crate::report::LogLimit::new();
            if let Some(left_out) = LIMIT.admit() {
                let also = crate::report::LogLimit::also(left_out);
                crate::report::say(format_args!(
                    "sluice: volume {:?}: checksum mismatch reading LBA {} ({device} device, byte {device_offset}); \
                     the request fails with EIO{also}",
                    self.name,
                    offset / BS
                ));
            }
        }
        r
    }

    /// Run one request and count it (latency, bytes, error) in the metrics.
    fn timed<T>(&self, op: Op, bytes: u64, f: impl FnOnce() -> Result<T, VolumeError>) -> Result<T, VolumeError> {
        let t = self.engine.clock.now_ns();
        let r = f();
        self.metrics.record(op, bytes, self.engine.clock.now_ns().saturating_sub(t), r.is_ok());
        r
    }

    fn trim_blocks(&self, offset: u64, len: u64) -> Result<(), VolumeError> {
        check(self, offset, len)?;
        if !self.in_place {
            // Logged and unmapped without a drain (trims.rs).
            self.engine.trim_concurrent(self.id, offset / BS..(offset + len) / BS)?;
            self.engine.lock_raw().stats.user_trimmed(len);
            return Ok(());
        }
        self.change(|e, inner| {
            e.trim_logged(inner, self.id, offset / BS..(offset + len) / BS, true)?;
            inner.stats.user_trimmed(len);
            Ok(())
        })
    }

    /// In place, after a read that found `at_home` blocks at home: count
    /// hits and misses, and promote what is due (a failed promotion leaves
    /// the read answered; the engine stops changes as after any device
    /// error). `gen`: the volume's home generation when the read looked.
    fn after_read_in_place(&self, offset: u64, data: &[u8], at_home: u64, gen: u64) {
        let bytes = data.len() as u64;
        let _ = self.change(|e, inner| {
            let vc = &mut inner.vols[self.id as usize].cache;
            vc.count(CacheCount::ReadMiss, at_home * BS);
            vc.count(CacheCount::ReadHit, bytes - at_home * BS);
            e.promote(inner, self.id, offset / BS, data, gen, at_home)?;
            Ok(())
        });
    }

    /// Read as `Volume::read` does, but outside the cache policy and the
    /// metrics: no promotion, no hit or miss counted, no stream seen, no
    /// activity for ALRU's idle time — for the engine's own look at the data
    /// (a directory class reading the file system's metadata).
    pub fn read_unaccounted(&self, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        check(self, offset, buf.len() as u64)?;
        let e = &self.engine;
        let (vol, lba0, n) = (self.id as usize, (offset / BS) as usize, buf.len() / BLOCK_BYTES);
        let permit = e.unlocked_read_permit();
        // Not a request: it does not count as activity (ALRU's idle time).
        let inner = e.lock();
        if inner.health.is_closed() {
            return Err(VolumeError::ReadOnly);
        }
        e.read_volume(inner, permit, vol, lba0..lba0 + n, offset, buf).map(|_| ())
    }

    fn flush_both(&self) -> Result<(), VolumeError> {
        self.change(|e, inner| {
            e.flush_cache_for_client(inner)?;
            e.flush_capacity(inner)
        })
    }
}

impl Volume for EngineVolume {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        self.timed(Op::Read, buf.len() as u64, || {
            check(self, offset, buf.len() as u64)?;
            let e = &self.engine;
            let (vol, lba0, n) = (self.id as usize, (offset / BS) as usize, buf.len() / BLOCK_BYTES);
            if let Some(r) = e.read_lockless(vol, lba0..lba0 + n, offset, buf) {
                return r;
            }
            let permit = e.unlocked_read_permit();
            let mut inner = e.live_raw()?;
            inner.stats.user_read(buf.len() as u64);
            let gen = inner.vols[vol].cache.home_gen();
            let r = e.read_volume(inner, permit, vol, lba0..lba0 + n, offset, buf);
            let at_home = self.report_corruption(r)?;
            if self.in_place {
                self.after_read_in_place(offset, buf, at_home, gen);
            }
            Ok(())
        })
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), VolumeError> {
        self.timed(Op::Write, data.len() as u64, || self.write_batch_inner(&[(offset, data)], fua))
    }

    /// Room for a record header in front, from the engine's pool, when the
    /// write fits one record.
    fn write_buffer(&self, len: usize) -> WriteBuf {
        // In place a write may go home instead of into the log.
        if self.in_place || !owned_fits(BLOCK_BYTES, len, self.record_blocks_max) {
            return WriteBuf::plain(len);
        }
        let buf = self.engine.write_bufs.lock().unwrap_or_else(|p| p.into_inner()).take(BLOCK_BYTES + len);
        WriteBuf::with_head(buf, BLOCK_BYTES, len)
    }

    /// Logs the buffer as it is (header written into its first block): no
    /// copy of the data, and CRCs computed before the lock is taken.
    fn write_owned(&self, offset: u64, data: WriteBuf, fua: bool) -> Result<(), VolumeError> {
        if self.in_place || !owned_fits(data.head(), data.len(), self.record_blocks_max) {
            return self.write(offset, data.data(), fua);
        }
        let len = data.len() as u64;
        self.timed(Op::Write, len, || {
            check(self, offset, len)?;
            let crcs: Vec<u32> = data.data().chunks(BLOCK_BYTES).map(crc32c).collect();
            // The leading whole units as a segment of their own (direct.rs),
            // the rest through the log.
            let (n, buf) = self.write_direct_part(offset / BS, data.into_inner(), &crcs, fua)?;
            if n == crcs.len() {
                self.engine.give_write_buf(buf);
                return Ok(());
            }
            if n > 0 {
                let rest = (offset + n as u64 * BS, &buf[BLOCK_BYTES * (1 + n)..BLOCK_BYTES * (1 + crcs.len())]);
                let r = self.write_batch_inner(&[rest], fua);
                self.engine.give_write_buf(buf);
                return r;
            }
            let data = WriteBuf::with_head(buf, BLOCK_BYTES, len as usize);
            self.engine.pace_write(len);
            let lba0 = offset / BS;
            let entries = (crcs.iter().enumerate())
                .map(|(i, &crc)| crate::layout::Entry { lba: lba0 + i as u64, crc, tombstone: false })
                .collect();
            let rec = writers::Record { entries, buf: data.into_inner() };
            let (r, bufs) = self.engine.write_concurrent(self.id, vec![rec], fua);
            bufs.into_iter().for_each(|b| self.engine.give_write_buf(b));
            r
        })
    }

    fn trim(&self, offset: u64, len: u64) -> Result<(), VolumeError> {
        self.timed(Op::Trim, len, || self.trim_blocks(offset, len))
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), VolumeError> {
        if self.in_place {
            // An unmapped block reads from home: zeros are written there.
            return self.timed(Op::Trim, len, || {
                check(self, offset, len)?;
                self.change(|e, inner| {
                    e.write_past_log(inner, self.id, offset / BS, len / BS, None)?;
                    inner.stats.user_trimmed(len);
                    if fua {
                        e.flush_cache_for_client(inner)?;
                        e.flush_capacity(inner)?;
                    }
                    Ok(())
                })
            });
        }
        // Unmapped blocks read as zeros, so zeroing is deallocation.
        self.timed(Op::Trim, len, || {
            self.trim_blocks(offset, len)?;
            if fua {
                self.flush_both()?;
            }
            Ok(())
        })
    }

    fn flush(&self) -> Result<(), VolumeError> {
        if self.engine.read_only {
            // Nothing was written: nothing to make durable.
            return self.timed(Op::Flush, 0, || Ok(()));
        }
        self.timed(Op::Flush, 0, || self.engine.flush_grouped())
    }

    /// Several writes (offset, data) as one group commit: they share log
    /// records (one header block and one device write per up to 253 blocks)
    /// instead of a record each. Every range is checked first; on a bad one
    /// nothing is written. Counted in the metrics as one request per write,
    /// each with the batch's latency. Later writes win over earlier ones to
    /// the same block, as if applied in order.
    fn write_batch(&self, writes: &[(u64, &[u8])], fua: bool) -> Result<(), VolumeError> {
        let t = self.engine.clock.now_ns();
        let r = self.write_batch_inner(writes, fua);
        let ns = self.engine.clock.now_ns().saturating_sub(t);
        for (_, d) in writes {
            self.metrics.record(Op::Write, d.len() as u64, ns, r.is_ok());
        }
        r
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, VolumeError> {
        check(self, offset, len)?;
        if self.in_place {
            // Every block reads from the log or from its home.
            return Ok(vec![Extent { len, allocated: true }]);
        }
        let inner = self.live()?;
        let l2p = &inner.vols[self.id as usize].l2p;
        let mut out: Vec<Extent> = Vec::new();
        for lba in offset / BS..(offset + len) / BS {
            let allocated = !l2p.get(lba as usize)?.is_none();
            match out.last_mut() {
                Some(e) if e.allocated == allocated => e.len += BS,
                _ => out.push(Extent { len: BS, allocated }),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::*;
    use crate::testkit::{pattern, small_device_bytes, small_world, small_world_on};
    use sluice_media::{DeviceInfo, IoCompletion, MemoryDevice};

    /// A memory device that admits only `depth` requests at once.
    struct Shallow {
        dev: MemoryDevice,
        info: DeviceInfo,
    }

    impl Shallow {
        fn device(bytes: u64, depth: usize) -> Arc<dyn BlockDevice> {
            let dev = MemoryDevice::new(bytes, 4096);
            let info = DeviceInfo { queue_depth_max: depth, ..dev.info().clone() };
            Arc::new(Shallow { dev, info })
        }
    }

    impl BlockDevice for Shallow {
        fn info(&self) -> &DeviceInfo {
            &self.info
        }
        fn submit(&self, req: sluice_media::IoRequest) {
            self.dev.submit(req)
        }
        fn reap(&self, min: usize, out: &mut Vec<IoCompletion>) -> usize {
            self.dev.reap(min, out)
        }
        fn in_flight(&self) -> usize {
            self.dev.in_flight()
        }
        fn stats(&self) -> sluice_media::DeviceStats {
            self.dev.stats()
        }
    }

    #[test]
    fn reads_go_outside_the_lock_only_while_the_devices_have_room() {
        // Room: permits up to the depth left beside the lock holder's queue.
        let w = small_world(&[64]);
        let max = w.engine.unlocked_reads_max;
        assert!(max > 0);
        let held: Vec<_> = (0..max).map(|_| w.engine.unlocked_read_permit().expect("room")).collect();
        assert!(w.engine.unlocked_read_permit().is_none(), "no permit beyond the devices' depth");
        drop(held);
        assert!(w.engine.unlocked_read_permit().is_some());
        // A device too shallow for any: every read runs under the lock, and
        // still returns the data.
        let (c, p) = small_device_bytes(&[64]);
        let depth = CAP_QUEUE_DEPTH + 2;
        let w = small_world_on(Shallow::device(c, depth), Shallow::device(p, depth), &[64]);
        assert_eq!(w.engine.unlocked_reads_max, 0);
        for lba in 0..64 {
            w.volumes[0].write(lba * 4096, &pattern(0, lba, lba + 1), false).unwrap();
        }
        let mut b = vec![0u8; 4096];
        for lba in 0..64 {
            w.volumes[0].read(lba * 4096, &mut b).unwrap();
            assert_eq!(b, pattern(0, lba, lba + 1), "block {lba}");
        }
        assert_eq!(w.engine.stats().user_read_bytes, 64 * 4096);
    }

    /// A write handed over in the engine's own buffer is logged from it:
    /// bad ranges are refused with the same typed errors as `write` and
    /// change nothing; a buffer without room for a header, or a write
    /// larger than one record, still goes through (as `write`); after a
    /// clean reopen every block reads back; and the buffer goes back to
    /// the pool for the next write.
    #[test]
    fn writes_in_the_engines_own_buffer_are_logged_without_a_copy() {
        use crate::testkit::write_owned;
        let w = small_world(&[512]);
        let v = &w.volumes[0];
        let mut want = vec![0u8; 512 * BLOCK_BYTES];
        let mut put = |lba: u64, blocks: u64, ver: u64| -> Vec<u8> {
            let data: Vec<u8> = (lba..lba + blocks).flat_map(|b| pattern(0, b, ver)).collect();
            want[lba as usize * BLOCK_BYTES..][..data.len()].copy_from_slice(&data);
            data
        };
        let before = w.engine.stats();
        // Misaligned, past the end: typed errors, nothing logged.
        let mut b = v.write_buffer(4096);
        assert_eq!(b.head(), BLOCK_BYTES, "room for the header in front");
        b.data_mut().fill(7);
        assert!(matches!(v.write_owned(100, b, false), Err(VolumeError::Misaligned { .. })));
        let b = v.write_buffer(8192);
        assert!(matches!(v.write_owned(511 * 4096, b, false), Err(VolumeError::OutOfRange { .. })));
        assert_eq!(w.engine.stats().cache_write_bytes, before.cache_write_bytes);
        // One record each, the data not copied: header + data on the cache.
        write_owned(v, 0, &put(0, 3, 1), false).unwrap();
        write_owned(v, 10 * 4096, &put(10, 1, 2), true).unwrap();
        assert_eq!(w.engine.stats().cache_write_bytes - before.cache_write_bytes, (4 + 2) * BS);
        assert_eq!(w.engine.stats().user_write_bytes - before.user_write_bytes, 4 * BS);
        // Larger than a record (and than a chunk of this small log), and a
        // plain buffer: written all the same.
        let big = 3 * w.engine.lock().blocks_per_chunk() + 5;
        assert_eq!(v.write_buffer(big as usize * BLOCK_BYTES).head(), 0, "no room: a plain buffer");
        write_owned(v, 20 * 4096, &put(20, big, 3), false).unwrap();
        let mut plain = WriteBuf::plain(2 * BLOCK_BYTES);
        plain.data_mut().copy_from_slice(&put(1, 2, 4));
        v.write_owned(4096, plain, false).unwrap();
        // The buffer of a logged write is reused.
        let held = w.engine.write_bufs.lock().unwrap().len();
        assert!(held > 0, "buffers came back to the pool");
        let _b = v.write_buffer(4096);
        assert_eq!(w.engine.write_bufs.lock().unwrap().len(), held - 1);
        let mut got = vec![0u8; want.len()];
        v.read(0, &mut got).unwrap();
        assert!(got == want, "read back before reopening");
        w.engine.shutdown().unwrap();
        let (cache, capacity) = w.engine.devices();
        let e = Engine::open(cache, capacity).unwrap();
        e.volume("v0").unwrap().read(0, &mut got).unwrap();
        assert!(got == want, "read back after reopening");
    }

    /// A flipped bit at rest, in the cache log or in a capacity band, is
    /// never returned as data: the read fails (EIO), names the block and
    /// where it is stored, and is counted; the other blocks read fine, and
    /// a rewrite of the block heals it.
    #[test]
    fn a_block_damaged_at_rest_is_reported_never_served() {
        let w = small_world(&[256]);
        let (v, e) = (&w.volumes[0], &w.engine);
        let (cache, capacity) = e.devices();
        for lba in 0..256 {
            v.write(lba * BS, &pattern(0, lba, 1), false).unwrap();
        }
        v.flush().unwrap();
        // Flip one bit of block `lba` where it lives; returns the device.
        let flip = |lba: u64| -> &'static str {
            let loc = e.lock().vols[0].l2p.get(lba as usize).unwrap();
            let (dev, at, name) = match (loc.cache_block(), loc.capacity_block()) {
                (Some(b), _) => (&cache, b * BS, "cache"),
                (_, Some(b)) => (&capacity, b * BS, "capacity"),
                _ => panic!("block {lba} unmapped"),
            };
            let mut b = read_at(&**dev, at, BLOCK_BYTES).unwrap().to_vec();
            b[1234] ^= 0x10;
            write_at(&**dev, at, &b).unwrap();
            name
        };
        // The last blocks written are still in the log, the first ones
        // were compacted to the capacity device.
        let cached =
            (0..256).rev().find(|&l| e.lock().vols[0].l2p.get(l as usize).unwrap().cache_block().is_some()).unwrap();
        let moved =
            (0..256).find(|&l| e.lock().vols[0].l2p.get(l as usize).unwrap().capacity_block().is_some()).unwrap();
        let mut buf = vec![0u8; 2 * BLOCK_BYTES];
        for (lba, want) in [(cached, "cache"), (moved, "capacity")] {
            assert_eq!(flip(lba), want);
            let first = lba.min(254);
            match v.read(first * BS, &mut buf) {
                Err(VolumeError::Corrupt { offset, device, .. }) => {
                    assert_eq!((offset, device), (lba * BS, want));
                }
                r => panic!("block {lba} on the {want} device: {r:?}"),
            }
            assert_eq!(VolumeError::Corrupt { offset: 0, device: want, device_offset: 0 }.errno(), 5);
            let mut one = vec![0u8; BLOCK_BYTES];
            let next = if lba > 0 { lba - 1 } else { lba + 1 };
            v.read(next * BS, &mut one).unwrap();
            assert!(one == pattern(0, next, 1), "the neighbour reads fine");
        }
        assert_eq!(e.snapshot().volumes[0].checksum_errors, 2);
        // Rewritten, the block reads again.
        v.write(cached * BS, &pattern(0, cached, 2), false).unwrap();
        let mut one = vec![0u8; BLOCK_BYTES];
        v.read(cached * BS, &mut one).unwrap();
        assert!(one == pattern(0, cached, 2));
        // And it stays damaged through a clean restart (the CRCs are in
        // the checkpoint) and through a crash (recovery takes them from the
        // headers).
        e.shutdown().unwrap();
        drop(w);
        let e = Engine::open(cache.clone(), capacity.clone()).unwrap();
        let v = e.volume("v0").unwrap();
        assert!(matches!(v.read(moved * BS, &mut one), Err(VolumeError::Corrupt { .. })));
        drop((v, e));
        let e = Engine::open(cache, capacity).unwrap();
        let v = e.volume("v0").unwrap();
        drop(e.lock()); // nothing held
        assert!(matches!(v.read(moved * BS, &mut one), Err(VolumeError::Corrupt { .. })));
    }
}
