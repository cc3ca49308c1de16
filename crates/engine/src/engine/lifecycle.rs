//! An engine's life on its devices: created on blank devices, opened (from
//! its checkpoint after a clean shutdown, by recovery after a crash, refusing
//! damage unless told to salvage), and shut down cleanly (a flush, the
//! final flush record, the paged maps' pages, the checkpoint, then the
//! superblock marked clean, in that order).

use super::disk_identity::DiskIdentity;
use super::{
    checkpoint_bytes_max, checkpoint_page_bytes, checkpoint_room, crc32c, decode_checkpoint, encode_checkpoint, flush,
    home_sums_of, label_present, marks, new_maps, on_media_config, recovery, superblock_present, write_at, write_label,
    zoned, Arc, BandId, BandState, BlockDevice, CapGeometry, CapacityLabel, Damage, Engine, EngineConfig, EngineError,
    Inner, L2p, Layout, OpenOptions, RegionReader, Runtime, SharedDevice, Superblock, VolumeError, VolumeSpec, Width,
    BLOCK_BYTES, BS, CAPACITY_BYTES_MAX, RECORD_BLOCKS_MAX,
};

impl Engine {
    /// Create a fresh engine on the two devices with these volumes.
    pub fn create(
        cache: Arc<dyn BlockDevice>,
        capacity: Arc<dyn BlockDevice>,
        cfg: EngineConfig,
        volumes: &[VolumeSpec],
    ) -> Result<Arc<Engine>, EngineError> {
        Engine::create_on(Runtime::default(), cache, capacity, cfg, volumes)
    }

    /// `create`, running on `runtime`'s clock and schedule (runtime.rs).
    pub fn create_on(
        runtime: Runtime,
        cache: Arc<dyn BlockDevice>,
        capacity: Arc<dyn BlockDevice>,
        mut cfg: EngineConfig,
        volumes: &[VolumeSpec],
    ) -> Result<Arc<Engine>, EngineError> {
        // Shared from the start: a paged map does its I/O through it.
        let (cache, capacity) = (SharedDevice::wrap(cache), SharedDevice::wrap(capacity));
        // On a zoned capacity device, bands are its zones.
        let geo = CapGeometry::of(&*capacity, cfg.band_bytes);
        cfg.band_bytes = geo.band_bytes;
        // Partially written zones: one open band per volume, the GC band, and
        // (briefly, at shutdown) the checkpoint's last zone.
        if geo.max_active != 0 && volumes.len() as u64 + 2 > geo.max_active as u64 {
            return Err(EngineError::Config(
                "more volumes than the zoned device's active-zone limit allows (volumes + 2)",
            ));
        }
        // Chunk 0 holds the superblock and the capacity marks (blocks 0-3).
        if !cfg.chunk_bytes.is_multiple_of(BS) || cfg.chunk_bytes < 4 * BS {
            return Err(EngineError::Config("chunk_bytes must be ≥ 4 blocks and a multiple of 4 KiB"));
        }
        if !cfg.write_unit_bytes.is_multiple_of(BS)
            || cfg.write_unit_bytes == 0
            || !cfg.band_bytes.is_multiple_of(cfg.write_unit_bytes)
        {
            return Err(EngineError::Config("band_bytes must be a multiple of write_unit_bytes, itself of 4 KiB"));
        }
        // Paged maps take a region at the end of the cache device.
        let vols_blocks: u64 = volumes.iter().map(|v| v.size_bytes / BS).sum();
        let width = Width::for_devices(cache.info().capacity_bytes / BS, capacity.info().capacity_bytes / BS);
        let paged = cfg.l2p_dram_bytes != 0 && vols_blocks * (width.bytes() + 4) > cfg.l2p_dram_bytes;
        let region: u64 = if paged {
            let pages: u64 = volumes.iter().map(|v| L2p::region_bytes(v.size_bytes / BS, width)).sum();
            pages.div_ceil(cfg.chunk_bytes) * cfg.chunk_bytes
        } else {
            0
        };
        // In place, the home-sum table's whole chunks before it (home_sums.rs).
        let home_sums = cfg.layout == Layout::InPlace && cfg.home_sums;
        let sums_region = match home_sums {
            true => super::home_sums::HomeSums::region_bytes(vols_blocks).div_ceil(cfg.chunk_bytes) * cfg.chunk_bytes,
            false => 0,
        };
        let mut chunk_count = cache.info().capacity_bytes.saturating_sub(region + sums_region) / cfg.chunk_bytes;
        // Chunk 0 holds the superblock; the log needs its reserve plus two.
        if chunk_count < cfg.log_free_chunks_min as u64 + 3 {
            return Err(EngineError::Config("cache device too small for the log"));
        }
        if volumes.len() > crate::persist::VOLUMES_MAX
            || volumes.iter().any(|v| v.name.is_empty() || v.name.len() > crate::persist::NAME_BYTES_MAX)
        {
            return Err(EngineError::Config("too many volumes, or a name empty or over 63 bytes"));
        }
        let capacity_bytes = capacity.info().capacity_bytes;
        if capacity_bytes > CAPACITY_BYTES_MAX {
            return Err(EngineError::CapacityTooLarge(capacity_bytes));
        }
        if let Some(v) = volumes.iter().find(|v| v.size_bytes % BS != 0 || v.size_bytes == 0) {
            return Err(EngineError::TooBig(v.name.clone()));
        }
        let map_bytes = if paged { checkpoint_page_bytes(vols_blocks, volumes.len() as u64) } else { 12 * vols_blocks };
        let (band_count, checkpoint_offset) = match cfg.layout {
            Layout::Bands => {
                let all_bands = capacity_bytes / cfg.band_bytes;
                if all_bands >= u32::MAX as u64 || chunk_count >= u32::MAX as u64 {
                    return Err(EngineError::Config("more than 2^32 - 1 bands or chunks: make them larger"));
                }
                let band_count = bands_for(&cfg, &geo, chunk_count, all_bands, volumes, map_bytes)?;
                (band_count, band_count * cfg.band_bytes)
            }
            Layout::InPlace => {
                // The volumes' homes from byte 0, the checkpoint after them,
                // the label in the last two blocks.
                if geo.zoned {
                    return Err(EngineError::Config(
                        "a zoned capacity device cannot hold blocks in place: use the bands layout",
                    ));
                }
                if chunk_count >= u32::MAX as u64 {
                    return Err(EngineError::Config("more than 2^32 - 1 chunks: make them larger"));
                }
                let homes = vols_blocks * BS;
                let ckpt_bytes = checkpoint_bytes_max(&cfg, chunk_count, 0, volumes.len() as u64, map_bytes);
                if cfg.attached {
                    // Attached to a disk with its data: nothing of Sluice's
                    // on the disk. The checkpoint region is whole chunks of
                    // the cache device, after the log (before the map region).
                    if homes > capacity_bytes {
                        return Err(EngineError::TooBig(volumes.last().map(|v| v.name.clone()).unwrap_or_default()));
                    }
                    chunk_count = chunk_count.saturating_sub(ckpt_bytes.div_ceil(cfg.chunk_bytes));
                    if chunk_count < cfg.log_free_chunks_min as u64 + 3 {
                        return Err(EngineError::Config("cache device too small for the log and the checkpoint"));
                    }
                    (0, chunk_count * cfg.chunk_bytes)
                } else if homes + ckpt_bytes.div_ceil(BS) * BS + 2 * BS > capacity_bytes {
                    return Err(EngineError::TooBig(volumes.last().map(|v| v.name.clone()).unwrap_or_default()));
                } else {
                    (0, homes)
                }
            }
        };
        if cfg.attached && cfg.layout != Layout::InPlace {
            return Err(EngineError::Config("only an in-place engine attaches to a disk that holds data"));
        }
        // Never over another engine: `sluice format --force` wipes first.
        if let Some(uuid) = superblock_present(&*cache)? {
            return Err(EngineError::AlreadyFormatted { device: "cache", uuid });
        }
        if let Some(uuid) = label_present(&*capacity)? {
            return Err(EngineError::AlreadyFormatted { device: "capacity", uuid });
        }
        let uuid = crate::persist::new_uuid();
        let sb = Superblock {
            uuid,
            generation: 1,
            clean: false,
            chunk_bytes: cfg.chunk_bytes,
            band_bytes: cfg.band_bytes,
            write_unit_bytes: cfg.write_unit_bytes,
            log_free_chunks_min: cfg.log_free_chunks_min as u32,
            gc_free_bands_min: cfg.gc_free_bands_min as u32,
            cache_bytes: cache.info().capacity_bytes,
            capacity_bytes: capacity.info().capacity_bytes,
            checkpoint_offset,
            checkpoint_bytes: 0,
            checkpoint_crc: 0,
            seq_floor: 0,
            l2p_dram_bytes: if paged { cfg.l2p_dram_bytes } else { 0 },
            layout: if cfg.attached { crate::persist::LAYOUT_ATTACHED } else { cfg.layout.on_media() },
            volumes: volumes.iter().map(|v| (v.name.clone(), v.size_bytes)).collect(),
            home_sums,
            version: full_version(cfg.layout == Layout::InPlace, home_sums),
        };
        let label = CapacityLabel {
            uuid,
            capacity_bytes: capacity.info().capacity_bytes,
            cache_bytes: cache.info().capacity_bytes,
            band_bytes: cfg.band_bytes,
        };
        let maps = new_maps(&sb, &cache);
        let sums = home_sums_of(&sb, &cache);
        let mut inner = Inner::empty(cfg, geo, sb, chunk_count, band_count, maps);
        inner.home_sums = sums;
        inner.run_on(runtime);
        if inner.cfg.attached {
            // The disk's identity, then the superblock: nothing is written
            // to the disk.
            let mut id = DiskIdentity::of(&*capacity, uuid)?;
            id.save(&*cache)?;
            inner.disk_id = Some(id);
        } else {
            // The label first: a crash between the two leaves a capacity
            // device that names an engine whose cache device is blank, which
            // opening refuses (`CacheUnlabelled`) rather than mistaking for
            // a new engine.
            write_label(&*capacity, &geo, &label)?;
        }
        inner.sb.write_to(&*cache)?;
        Ok(Engine::assemble(cache, capacity, inner, None))
    }

    /// Reopen an engine from its devices: from its checkpoint after a clean
    /// shutdown, by recovery otherwise. Damage recovery finds is refused
    /// (`EngineError::Damaged`) before anything is written.
    pub fn open(cache: Arc<dyn BlockDevice>, capacity: Arc<dyn BlockDevice>) -> Result<Arc<Engine>, EngineError> {
        Engine::open_with(cache, capacity, OpenOptions::default())
    }

    /// `open`, with options: `salvage` accepts damage (see `OpenOptions`).
    pub fn open_with(
        cache: Arc<dyn BlockDevice>,
        capacity: Arc<dyn BlockDevice>,
        opts: OpenOptions,
    ) -> Result<Arc<Engine>, EngineError> {
        // Step 1: the superblock (the valid copy with the higher
        // generation), the capacity device's label, both devices' sizes.
        // Nothing is written until all of them check.
        let sb = Engine::inspect(&*cache, &*capacity)?;
        if opts.read_only && !sb.clean {
            return Err(EngineError::ReadOnlyNeedsRecovery);
        }
        let (cfg, geo) = on_media_config(&sb, &*capacity)?;
        // Attached: the disk must be the one the cache belongs to, as the
        // cache last saw it (checked again below if it changed).
        let mut disk_id = match cfg.attached {
            true => Some(DiskIdentity::read(&*cache, sb.uuid)?.ok_or(EngineError::NoDiskIdentity(sb.uuid))?),
            false => None,
        };
        let disk_changed = match &mut disk_id {
            Some(id) => id.check(&*capacity)?,
            None => Vec::new(),
        };
        // The checkpoint's device: the cache device when attached.
        let region_dev = if cfg.attached { cache.clone() } else { capacity.clone() };
        // Step 2: after a crash, rebuild everything from the media; after a
        // clean shutdown, read the checkpoint, verified (a damaged one is
        // refused, or with `salvage` replaced by recovery from the media).
        let (mut relog, mut gaps, mut voided) = (Vec::new(), Vec::new(), Vec::new());
        let mut lasts = None;
        // Shared before recovery, whose workers read the cache at once.
        let (cache, capacity) = (SharedDevice::wrap(cache), SharedDevice::wrap(capacity));
        let checkpoint = if sb.clean && !(opts.salvage && opts.ignore_checkpoint) {
            match read_checkpoint(&*region_dev, &geo, &sb) {
                Ok(body) => Some(decode_checkpoint(body, cfg.clone(), geo, sb.clone(), new_maps(&sb, &cache))),
                Err(e) => Some(Err(e)),
            }
        } else {
            None
        };
        let (mut inner, recovered_in, salvaged) = match checkpoint {
            Some(Ok(inner)) => (inner, None, Vec::new()),
            Some(Err(e)) if !opts.salvage => return Err(e),
            _ => {
                let t = opts.runtime.clock.now_ns();
                let mut r = recovery::scan(&*cache, &*capacity, &cache, cfg, geo, sb)?;
                if !r.damage.is_empty() && !opts.salvage {
                    return Err(EngineError::Damaged(r.damage));
                }
                (relog, gaps) = (std::mem::take(&mut r.superseded), std::mem::take(&mut r.gaps));
                // (Voided bands nothing won in are free already, and discarded
                // as stale ones.)
                voided = r.voided.iter().map(|&b| BandId(b)).collect();
                voided.retain(|&b| r.inner.bands[b].state() != BandState::Free);
                lasts = Some(r.last_bands);
                // Damaged bands out of reach before anything is written.
                let inner = &mut r.inner;
                inner.bands.quarantine(Damage::bands(&r.damage).into_iter().map(BandId).chain(voided.iter().copied()));
                // Before changing any band: a fresh mark (no band is open
                // now), durable, so that a crash in what follows never
                // leaves the last mark expecting segments of a band reset,
                // discarded or zeroed below.
                marks::write_mark_now(&*cache, inner, r.mark.as_ref())?;
                // On a zoned device: reset zones now free, finish zones now full.
                zoned::reconcile(&*capacity, &r.inner)?;
                for &b in &r.torn_headers {
                    write_at(&*capacity, b * BS, &[0u8; BLOCK_BYTES])?;
                }
                for &b in &r.stale_bands {
                    let start = b as u64 * r.inner.cfg.band_bytes;
                    zoned::reclaim_band(&*capacity, geo.zoned, start, r.inner.cfg.band_bytes)?;
                }
                if !r.torn_headers.is_empty() || !r.stale_bands.is_empty() {
                    flush(&*capacity)?;
                }
                (
                    r.inner,
                    Some(std::time::Duration::from_nanos(opts.runtime.clock.now_ns().saturating_sub(t))),
                    r.damage,
                )
            }
        };
        // A changed disk: only a cache that holds nothing dirty may stay
        // attached to it, after dropping every copy (below).
        if !disk_changed.is_empty() {
            // (After a crash, every cached block no Clean record claims.)
            let dirty_blocks = inner.residency.dirty_total();
            if dirty_blocks > 0 {
                return Err(EngineError::DiskChanged { uuid: inner.sb.uuid, changed: disk_changed, dirty_blocks });
            }
        }
        inner.disk_id = disk_id;
        // The home-sum table needs nothing from recovery: whatever a crash
        // left of it holds only true sums (home_sums.rs).
        inner.home_sums = home_sums_of(&inner.sb, &cache);
        if opts.read_only {
            // Nothing is written, ever: the superblock stays clean, and no
            // cached copy of a changed disk is dropped (refused instead).
            if !disk_changed.is_empty() {
                let dirty_blocks = inner.residency.dirty_total();
                return Err(EngineError::DiskChanged { uuid: inner.sb.uuid, changed: disk_changed, dirty_blocks });
            }
            inner.health.open_read_only();
            inner.run_on(opts.runtime.clone());
            let mut engine = Engine::assemble(cache, capacity, inner, None);
            Arc::get_mut(&mut engine).expect("not shared yet").read_only = true;
            return Ok(engine);
        }
        // Step 3: dirty before the first change. In place, version 8 from
        // now on: the log is about to get Clean records, which a version 7
        // Sluice would take for damage after a crash.
        if inner.in_place() {
            inner.sb.version = inner.sb.version.max(full_version(true, inner.sb.home_sums));
        }
        inner.sb.clean = false;
        inner.sb.generation += 1;
        inner.sb.write_to(&*cache)?;
        inner.run_on(opts.runtime.clone());
        let mut engine = Engine::assemble(cache, capacity, inner, recovered_in);
        Arc::get_mut(&mut engine).expect("not shared yet").salvaged = salvaged;
        // The gap records first: any record logged after them (the dropped
        // copies' tombstones below) carries a watermark over the torn LSNs
        // they accept, which must be durable before such a header is.
        if !gaps.is_empty() {
            engine.log_gaps(&gaps).map_err(EngineError::Recovery)?;
        }
        if !disk_changed.is_empty() {
            let dropped = engine.drop_cached_copies().map_err(EngineError::Recovery)?;
            // The disk changed behind the engine's back: no home's sum is
            // known any more.
            let mut inner = engine.lock();
            inner.home_sums.forget_all().map_err(|e| EngineError::Recovery(e.into()))?;
            drop(inner);
            Arc::get_mut(&mut engine).expect("not shared yet").disk_changed = Some((disk_changed, dropped));
        }
        if !engine.salvaged.is_empty() {
            engine.salvage_repair(&engine.salvaged).map_err(EngineError::Recovery)?;
        }
        if !voided.is_empty() {
            let mut inner = engine.lock();
            engine.empty_bands(&mut inner, &voided).map_err(EngineError::Recovery)?;
            engine.flush_cache(&mut inner).map_err(EngineError::Recovery)?;
        }
        if !relog.is_empty() {
            engine.relog(&relog).map_err(EngineError::Recovery)?;
        }
        // Every torn copy now loses to a newer one, and no voided band is
        // left: watermarks may pass them, and claims name them.
        let mut inner = engine.lock();
        inner.cap.lift_ceiling();
        if let Some(l) = lasts {
            l.apply(&mut inner);
        }
        drop(inner);
        Ok(engine)
    }

    /// Clean shutdown: flush, write the checkpoint, mark the superblock
    /// clean. Later requests fail with `VolumeError::ReadOnly`.
    pub fn shutdown(&self) -> Result<(), EngineError> {
        let mut inner = self.lock();
        if inner.health.is_closed() {
            return Ok(());
        }
        if inner.health.is_read_only() {
            // Opened read-only: nothing to flush, checkpoint or mark.
            self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
            inner.health.close();
            return Ok(());
        }
        // Every path below closes the engine; lock-free reads stop now.
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.fold_read_bytes(&mut inner);
        inner.health.close();
        if inner.health.is_stopped() {
            // The map may not match the media: leave the superblock dirty so
            // the next open recovers from the media instead.
            return Err(EngineError::Failed(inner.health.cause().cloned().unwrap_or(VolumeError::Stopped)));
        }
        // Any step below failing stops the engine (the superblock stays dirty).
        let stop = |inner: &mut Inner, e: VolumeError| {
            inner.health.stop(&e);
            EngineError::Failed(e)
        };
        self.settle(&mut inner).map_err(|e| stop(&mut inner, e))?;
        // No home write of a cleaning step lands after the engine closed
        // (home_flight.rs; the step marks nothing clean once it is).
        if let Some(n) = inner.home_flight.in_flight() {
            self.homes_done.wait(n);
        }
        // Flush, then record that flush in one more (empty) record, flushed
        // too: the watermark otherwise travels only in later records, and a
        // shutdown cut short here would leave the newest records' damage
        // indistinguishable from a torn tail (docs/format.md).
        let watermark = self.flush_cache(&mut inner).and_then(|()| {
            self.log_record(&mut inner, 0, crate::layout::RecordKind::Gap, Vec::new(), &[])?;
            self.flush_cache(&mut inner)
        });
        watermark.map_err(|e| stop(&mut inner, e))?;
        // Paged maps: every dirty page into the cache device's map region,
        // durable before the checkpoint that describes them.
        let pages = (inner.vols.iter_mut().try_for_each(|v| v.l2p.write_pages()))
            .and_then(|()| flush(&*self.cache).map_err(VolumeError::from));
        pages.map_err(|e| stop(&mut inner, e))?;
        // In place: the homes durable, so every home sum waiting for a
        // capacity flush is true, and the table's pages written (the
        // checkpoint needs none of it: the table stands on its own).
        if inner.home_sums.enabled() {
            let sums =
                self.flush_capacity(&mut inner).and_then(|()| inner.home_sums.sync_dirty().map_err(VolumeError::from));
            sums.map_err(|e| stop(&mut inner, e))?;
        }
        // After the last log record (which may have compacted and collected).
        self.close_extra_streams(&mut inner).map_err(|e| stop(&mut inner, e))?;
        // An engine created by a version before 7 sized its region for
        // version 6's checkpoint, which has no clean bits: when version 7's
        // does not fit, version 6's is written (the cache is then all dirty
        // after the restart, as before), never past the region into the label.
        // Attached: the disk durable and its identity saved (the
        // checkpoint, on the cache device, flushes nothing on the disk).
        if inner.cfg.attached {
            let saved = self.flush_capacity(&mut inner).and_then(|()| {
                let id = inner.disk_id.as_mut().expect("attached");
                id.save(&*self.cache).map_err(VolumeError::from)
            });
            saved.map_err(|e| stop(&mut inner, e))?;
        }
        let region_dev = if inner.cfg.attached { &self.cache } else { &self.capacity };
        let room = checkpoint_room(&**region_dev, &inner.geo, &inner.sb);
        let (mut body, version) = checkpoint_for_room(&inner, room);
        let (body_bytes, body_crc) = (body.len(), crc32c(&body));
        body.resize(body_bytes.div_ceil(BLOCK_BYTES) * BLOCK_BYTES, 0);
        assert!(body.len() as u64 <= room, "the checkpoint region is smaller than its bound");
        let at = inner.sb.checkpoint_offset;
        let written = zoned::write_region(&**region_dev, &inner.geo, at, &body).and_then(|()| flush(&**region_dev));
        written.map_err(|e| stop(&mut inner, e.into()))?;
        inner.sb.checkpoint_bytes = body_bytes as u64;
        inner.sb.checkpoint_crc = body_crc;
        inner.sb.clean = true;
        inner.sb.version = version;
        inner.sb.generation += 1;
        let marked = inner.sb.write_to(&*self.cache);
        marked.map_err(|e| stop(&mut inner, e.into()))?;
        Ok(())
    }
}

/// The checkpoint to write into a region of `room` bytes, and its version:
/// 7's, or 6's (its prefix, without the clean bits) when 7's needs more
/// whole blocks than fit. Encoded once either way.
pub(super) fn checkpoint_for_room(inner: &Inner, room: u64) -> (Vec<u8>, u16) {
    let (mut body, v6) = encode_checkpoint(inner);
    if (body.len() as u64).div_ceil(BS) * BS <= room {
        return (body, full_version(inner.in_place(), inner.sb.home_sums));
    }
    body.truncate(v6);
    (body, 6)
}

/// The superblock version an engine writes with a full checkpoint: 8 in
/// place (its log may hold Clean records, and it may be attached: both
/// version 8's), else 7 (readable by a version 7 Sluice).
fn full_version(in_place: bool, home_sums: bool) -> u16 {
    match (in_place, home_sums) {
        (true, true) => crate::persist::SUPERBLOCK_VERSION_HOME_SUMS,
        (true, false) => crate::persist::SUPERBLOCK_VERSION_IN_PLACE,
        (false, _) => crate::persist::SUPERBLOCK_VERSION_DETACHED,
    }
}

/// The clean-shutdown checkpoint's body, checked against its CRC.
///
/// Read twice, a window at a time: once for its CRC, then by the decoder
/// (`RegionReader`), so that a clean open never holds the whole body
/// beside the state it decodes into, and decodes nothing unchecked.
pub(super) fn read_checkpoint<'a>(
    capacity: &'a dyn BlockDevice,
    geo: &'a CapGeometry,
    sb: &Superblock,
) -> Result<RegionReader<'a>, EngineError> {
    let mut r = RegionReader::new(capacity, geo, sb.checkpoint_offset, sb.checkpoint_bytes as usize);
    let mut crc = crate::layout::Crc32cParts::default();
    while r.at() < r.len() {
        crc.update(r.window()?);
    }
    if crc.value() != sb.checkpoint_crc {
        return Err(EngineError::CheckpointChecksum);
    }
    Ok(RegionReader::new(capacity, geo, sb.checkpoint_offset, sb.checkpoint_bytes as usize))
}

/// Bands of a banded capacity device of `all_bands`: what the checkpoint
/// region at its end leaves, whole bands, checked to hold the volumes.
fn bands_for(
    cfg: &EngineConfig,
    geo: &CapGeometry,
    chunk_count: u64,
    all_bands: u64,
    volumes: &[VolumeSpec],
    map_bytes: u64,
) -> Result<u64, EngineError> {
    let vols_blocks: u64 = volumes.iter().map(|v| v.size_bytes / BS).sum();
    // The checkpoint region at the end of the capacity device, whole
    // bands, and the label after it (`label_offset`): in the last two
    // blocks of a conventional device, in a zone of its own on a zoned one.
    let ckpt_bytes = checkpoint_bytes_max(cfg, chunk_count, all_bands, volumes.len() as u64, map_bytes);
    let ckpt_bands = if geo.zoned {
        ckpt_bytes.div_ceil(geo.usable_blocks * BS) + 1
    } else {
        (ckpt_bytes + 2 * BS).div_ceil(cfg.band_bytes)
    };
    let band_count = all_bands.saturating_sub(ckpt_bands);
    if band_count == 0 {
        return Err(EngineError::Config("capacity device too small for one band and the checkpoint"));
    }
    // Every volume may hold an open band, GC holds one, and GC needs its reserve.
    let reserve = volumes.len() as u64 + 1 + cfg.gc_free_bands_min as u64;
    // A band holds at least one segment header per RECORD_BLOCKS_MAX
    // data blocks: small bands lose a large share to them (a 4-block
    // band holds at most 3 blocks of data).
    let headers = geo.usable_blocks.div_ceil(RECORD_BLOCKS_MAX as u64 + 1);
    let usable_blocks = band_count.saturating_sub(reserve) * geo.usable_blocks.saturating_sub(headers);
    if vols_blocks > usable_blocks {
        return Err(EngineError::TooBig(volumes.last().map(|v| v.name.clone()).unwrap_or_default()));
    }
    Ok(band_count)
}
