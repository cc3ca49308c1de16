//! Deterministic simulation of the engine against an in-memory model.
//!
//! One seed drives a random mix of writes (1–40 blocks), reads, trims,
//! write-zeroes, flushes and bounded GC and compaction steps
//! (`Engine::collect_some`, `compact_some`) over several volumes on small memory devices, so
//! compaction and GC run constantly. Every read is checked against the model
//! (what was last written, zeros if never written or trimmed), and the map's
//! invariants are checked as the run goes. A failure names its seed; the same
//! seed replays it exactly.

use crate::engine::{Engine, EngineConfig, EngineVolume, VolumeSpec};
use crate::volume::{Volume, VolumeError};
use sluice_media::rng::SplitMix64 as Rng;
use sluice_media::{zns_device, BlockDevice, MemoryDevice, VirtualClock, ZnsProfile};
use std::collections::HashMap;
use std::sync::Arc;

const BS: usize = 4096;

/// The content of a block: (volume, lba, version) stamped into its bytes.
pub fn pattern(vol: usize, lba: u64, version: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    for (i, w) in b.chunks_mut(8).enumerate() {
        let v = (vol as u64) << 56 ^ lba << 20 ^ version ^ (i as u64).wrapping_mul(0x9E37_79B9);
        w.copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// Panics unless every block of every volume `v` of `w` reads back as
/// version `models[v][lba]` of its pattern (version 0: never written, zeros).
pub fn assert_reads_as(w: &World, models: &[Vec<u64>]) {
    for (v, model) in models.iter().enumerate() {
        for (lba, &ver) in model.iter().enumerate() {
            let mut b = vec![0u8; BS];
            w.volumes[v].read((lba * BS) as u64, &mut b).unwrap();
            let want = if ver == 0 { vec![0u8; BS] } else { pattern(v, lba as u64, ver) };
            assert!(b == want, "volume {v} block {lba}");
        }
    }
}

/// Configuration of one simulated world.
pub struct World {
    pub engine: Arc<Engine>,
    pub volumes: Vec<EngineVolume>,
}

/// The simulation's engine geometry: tiny chunks and bands, so compaction
/// and GC run all the time.
pub fn small_config() -> EngineConfig {
    EngineConfig {
        chunk_bytes: 64 * 4096,
        band_bytes: 32 * 4096,
        write_unit_bytes: 4 * 4096,
        log_free_chunks_min: 2,
        gc_free_bands_min: 2,
    }
}

/// Device sizes (cache, capacity) for volumes of these many blocks: an
/// 8-chunk log, and the volumes plus ~30 % spare plus the reserve bands.
pub fn small_device_bytes(volume_blocks: &[u64]) -> (u64, u64) {
    let cfg = small_config();
    let total: u64 = volume_blocks.iter().sum();
    let bands = (total * 13 / 10).div_ceil(32) + volume_blocks.len() as u64 + 4;
    (8 * cfg.chunk_bytes, bands * cfg.band_bytes)
}

/// Volume specs `v0`, `v1`, … of these many blocks.
pub fn small_specs(volume_blocks: &[u64]) -> Vec<VolumeSpec> {
    volume_blocks.iter().enumerate().map(|(i, &b)| VolumeSpec { name: format!("v{i}"), size_bytes: b * 4096 }).collect()
}

/// A fresh engine on the given devices (sized by `small_device_bytes`).
pub fn small_world_on(cache: Arc<dyn BlockDevice>, capacity: Arc<dyn BlockDevice>, volume_blocks: &[u64]) -> World {
    let specs = small_specs(volume_blocks);
    let engine = Engine::create(cache, capacity, small_config(), &specs).expect("world fits");
    let volumes = specs.iter().map(|s| engine.volume(&s.name).expect("created")).collect();
    World { engine, volumes }
}

pub fn small_world(volume_blocks: &[u64]) -> World {
    let (c, p) = small_device_bytes(volume_blocks);
    small_world_on(Arc::new(MemoryDevice::new(c, 4096)), Arc::new(MemoryDevice::new(p, 4096)), volume_blocks)
}

/// A small engine whose capacity device is an emulated ZNS SSD (virtual
/// clock) with zones of 32 blocks holding 24, at most 3 open and 6 active:
/// every write off the write pointer, past a zone's capacity or beyond the
/// limits is rejected by the device.
pub fn small_world_zns(volume_blocks: &[u64]) -> World {
    let (cache_bytes, _) = small_device_bytes(volume_blocks);
    let p = small_zns_profile(volume_blocks);
    let backend = Box::new(MemoryDevice::new(p.capacity_bytes(), 4096));
    let zns: Arc<dyn BlockDevice> = Arc::new(zns_device(p, backend, VirtualClock::new()));
    small_world_on(Arc::new(MemoryDevice::new(cache_bytes, 4096)), zns, volume_blocks)
}

/// The ZNS SSD of `small_world_zns`: zones of 32 blocks holding 24, at most
/// 3 open and 6 active, enough zones for the volumes plus ~30 % spare.
pub fn small_zns_profile(volume_blocks: &[u64]) -> ZnsProfile {
    let total: u64 = volume_blocks.iter().sum();
    let zones = (total * 13 / 10).div_ceil(24) + volume_blocks.len() as u64 + 6;
    ZnsProfile {
        zone_size_bytes: 32 * 4096,
        zone_capacity_bytes: 24 * 4096,
        zone_count: zones,
        max_open: 3,
        max_active: 6,
        ..ZnsProfile::tiny()
    }
}

/// `data` written through `write_buffer` and `write_owned`.
pub fn write_owned(vol: &dyn Volume, offset: u64, data: &[u8], fua: bool) -> Result<(), VolumeError> {
    let mut buf = vol.write_buffer(data.len());
    buf.data_mut().copy_from_slice(data);
    vol.write_owned(offset, buf, fua)
}

/// Run one seed on the memory-backed world; Err names what diverged.
pub fn run_seed(seed: u64, ops: usize) -> Result<(), String> {
    run_seed_with(seed, ops, small_world).map(|_| ())
}

/// Run one seed on a world made by `build` (from the volume sizes); returns
/// the world at the end.
pub fn run_seed_with(seed: u64, ops: usize, build: impl FnOnce(&[u64]) -> World) -> Result<World, String> {
    let mut rng = Rng(seed);
    let sizes: Vec<u64> = (0..3).map(|_| 64 + rng.below(192)).collect();
    let w = build(&sizes);
    let mut model: Vec<HashMap<u64, u64>> = vec![HashMap::new(); sizes.len()];
    let mut version = 0u64;
    for op in 0..ops {
        let v = rng.below(sizes.len() as u64) as usize;
        let vol = &w.volumes[v];
        let blocks = sizes[v];
        let len = 1 + rng.below(40.min(blocks));
        let lba = rng.below(blocks - len + 1);
        let fail = |what: String| format!("seed {seed} op {op}: {what}");
        match rng.below(100) {
            k @ 0..=54 => {
                let mut data = Vec::with_capacity((len as usize) * BS);
                for i in 0..len {
                    version += 1;
                    data.extend_from_slice(&pattern(v, lba + i, version));
                    model[v].insert(lba + i, version);
                }
                let fua = rng.below(10) == 0;
                // Half the writes hand over their data in the volume's own
                // buffer, as the NBD server does.
                let r =
                    if k >= 27 { write_owned(vol, lba * 4096, &data, fua) } else { vol.write(lba * 4096, &data, fua) };
                r.map_err(|e| fail(format!("write: {e}")))?;
            }
            80..=84 => {
                // Bounded GC and compaction steps, as the background
                // compactor takes them: victims and chunks stay half done
                // under the requests that follow.
                w.engine.collect_some(len).map_err(|e| fail(format!("gc step: {e}")))?;
                let step = if len.is_multiple_of(2) {
                    w.engine.compact_some(len)
                } else {
                    w.engine.compact_some_leaving_remaps(len)
                };
                step.map_err(|e| fail(format!("compaction step: {e}")))?;
            }
            55..=79 => {
                let mut buf = vec![0u8; len as usize * BS];
                vol.read(lba * 4096, &mut buf).map_err(|e| fail(format!("read: {e}")))?;
                for i in 0..len {
                    let want = match model[v].get(&(lba + i)) {
                        Some(&ver) => pattern(v, lba + i, ver),
                        None => vec![0u8; BS],
                    };
                    if buf[i as usize * BS..(i as usize + 1) * BS] != want[..] {
                        return Err(fail(format!("volume {v} block {} read back wrong", lba + i)));
                    }
                }
            }
            85..=92 => {
                vol.trim(lba * 4096, len * 4096).map_err(|e| fail(format!("trim: {e}")))?;
                (lba..lba + len).for_each(|b| {
                    model[v].remove(&b);
                });
            }
            93..=96 => {
                vol.write_zeroes(lba * 4096, len * 4096, false).map_err(|e| fail(format!("zero: {e}")))?;
                (lba..lba + len).for_each(|b| {
                    model[v].remove(&b);
                });
            }
            _ => vol.flush().map_err(|e| fail(format!("flush: {e}")))?,
        }
        if op % 97 == 0 {
            w.engine.check_invariants();
        }
    }
    w.engine.check_invariants();
    // Block status agrees with the model.
    for (v, vol) in w.volumes.iter().enumerate() {
        let ext = vol.block_status(0, sizes[v] * 4096).map_err(|e| format!("seed {seed}: status: {e}"))?;
        let mut lba = 0;
        for e in ext {
            for b in lba..lba + e.len / 4096 {
                if model[v].contains_key(&b) != e.allocated {
                    return Err(format!("seed {seed}: block status of volume {v} block {b}"));
                }
            }
            lba += e.len / 4096;
        }
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineError;
    use crate::volume::VolumeError;
    use sluice_media::ZoneState;

    #[test]
    fn random_mixes_match_the_model() {
        for seed in 1..=60 {
            if let Err(e) = run_seed(seed, 3000) {
                panic!("{e} (replay: sim::run_seed({seed}, 3000))");
            }
        }
    }

    #[test]
    fn compaction_and_gc_run_and_writes_reach_capacity_in_units() {
        let w = small_world(&[256, 256]);
        let mut rng = Rng(7);
        for i in 0..4000u64 {
            let v = (i % 2) as usize;
            let lba = rng.below(256);
            w.volumes[v].write(lba * 4096, &pattern(v, lba, i), false).unwrap();
        }
        let s = w.engine.stats();
        assert!(s.chunks_compacted > 10, "{s:?}");
        assert!(s.bands_reclaimed > 0, "{s:?}");
        assert_eq!(s.capacity_write_bytes % (4 * 4096), 0, "capacity writes are whole units");
        assert!(s.host_waf() > 1.0, "{s:?}");
        w.engine.check_invariants();
    }

    /// A tenant rewritten sequentially leaves bands with nothing valid and
    /// no tombstone: GC reclaims them without reading them. After a clean
    /// reopen, whose checkpoint does not keep the bands' tombstone counts,
    /// the bands written before it are read when collected. (Skipping bands
    /// that do hold tombstones fails both crash simulations at seed 0.)
    #[test]
    fn dead_bands_without_tombstones_are_reclaimed_unread() {
        let (c, p) = small_device_bytes(&[256]);
        let cache: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(c, 4096));
        let capacity: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(p, 4096));
        let w = small_world_on(cache.clone(), capacity.clone(), &[256]);
        let mut model = vec![vec![0u64; 256]];
        let rewrite = |w: &World, model: &mut Vec<Vec<u64>>, rounds: std::ops::RangeInclusive<u64>| {
            for round in rounds {
                for lba in 0..256 {
                    w.volumes[0].write(lba * 4096, &pattern(0, lba, round), false).unwrap();
                    model[0][lba as usize] = round;
                }
            }
        };
        rewrite(&w, &mut model, 1..=12);
        let unread = |w: &World| w.engine.snapshot().compactor.victims_unread;
        let reclaimed = w.engine.stats().bands_reclaimed;
        assert!(unread(&w) > 0 && unread(&w) <= reclaimed, "{} of {reclaimed}", unread(&w));
        assert_reads_as(&w, &model);
        w.engine.shutdown().unwrap();

        let engine = Engine::open(cache, capacity).unwrap();
        let w = World { volumes: vec![engine.volume("v0").unwrap()], engine };
        let before = w.engine.stats().bands_reclaimed;
        rewrite(&w, &mut model, 13..=16);
        let reclaimed = w.engine.stats().bands_reclaimed - before;
        assert!(reclaimed > unread(&w), "bands of unknown tombstones were read: {} of {reclaimed}", unread(&w));
        assert_reads_as(&w, &model);
        w.engine.check_invariants();
    }

    #[test]
    fn band_placement_keeps_tenants_apart_or_shares_bands() {
        use crate::engine::BandPlacement;
        // Each volume written once, interleaved, with no overwrites: no GC,
        // so only compaction's placement decides who shares a band.
        let tenancy = |placement| {
            let w = small_world(&[256, 256, 256]);
            w.engine.set_band_placement(placement).unwrap();
            for lba in 0..256u64 {
                for v in 0..3 {
                    w.volumes[v].write(lba * 4096, &pattern(v, lba, lba), false).unwrap();
                }
            }
            assert_eq!(w.engine.stats().bands_reclaimed, 0);
            w.engine.check_invariants();
            w.engine.band_tenancy()
        };
        let own = tenancy(BandPlacement::PerVolume);
        assert!(own[0] >= 3 && own[1..].iter().all(|&n| n == 0), "per-volume bands: {own:?}");
        let shared = tenancy(BandPlacement::Shared);
        assert!(shared[1..].iter().sum::<u64>() >= 2, "shared bands: {shared:?}");
        // Placement is chosen before the first write.
        let w = small_world(&[64, 64]);
        w.volumes[0].write(0, &pattern(0, 0, 1), false).unwrap();
        let err = w.engine.set_band_placement(BandPlacement::Shared);
        assert!(matches!(err, Err(EngineError::Config(_))), "{err:?}");
    }

    #[test]
    fn shared_bands_on_zns_match_the_model_with_no_rejections() {
        for seed in 1..=8u64 {
            let w = run_seed_with(seed, 3000, |sizes| {
                let w = small_world_zns(sizes);
                w.engine.set_band_placement(crate::engine::BandPlacement::Shared).unwrap();
                w
            })
            .unwrap_or_else(|e| panic!("{e}"));
            let (_, cap) = w.engine.devices();
            assert_eq!(cap.stats().errors, 0, "seed {seed}: the ZNS device rejected requests");
            assert!(w.engine.stats().bands_reclaimed > 0, "seed {seed}: GC ran");
        }
    }

    #[test]
    fn bad_requests_are_typed_and_change_nothing() {
        let w = small_world(&[64]);
        let v = &w.volumes[0];
        v.write(0, &pattern(0, 0, 1), false).unwrap();
        assert!(matches!(v.write(100, &[0u8; 4096], false), Err(VolumeError::Misaligned { .. })));
        assert!(matches!(v.write(64 * 4096, &[0u8; 4096], false), Err(VolumeError::OutOfRange { .. })));
        assert!(matches!(v.read(u64::MAX - 4095, &mut [0u8; 4096]), Err(VolumeError::OutOfRange { .. })));
        assert!(matches!(v.trim(0, 100), Err(VolumeError::Misaligned { .. })));
        let mut b = vec![0u8; 4096];
        v.read(0, &mut b).unwrap();
        assert_eq!(b, pattern(0, 0, 1));
        assert_eq!(w.engine.stats().user_write_bytes, 4096);
    }

    #[test]
    fn clean_shutdown_reopens_with_every_block_and_the_counters() {
        let w = small_world(&[200, 120]);
        let mut rng = Rng(11);
        let mut model: Vec<HashMap<u64, u64>> = vec![HashMap::new(); 2];
        for i in 0..1500u64 {
            let v = (i % 2) as usize;
            let lba = rng.below([200, 120][v]);
            w.volumes[v].write(lba * 4096, &pattern(v, lba, i), false).unwrap();
            model[v].insert(lba, i);
            if i % 50 == 0 {
                w.volumes[v].trim(lba * 4096, 4096).unwrap();
                model[v].remove(&lba);
            }
        }
        let before = w.engine.stats();
        assert!(before.chunks_compacted > 0 && before.bands_reclaimed > 0, "{before:?}");
        w.engine.shutdown().unwrap();
        assert_eq!(w.volumes[0].write(0, &[0u8; 4096], false), Err(VolumeError::ReadOnly));
        let (cache, capacity) = w.engine.devices();
        let e = Engine::open(cache, capacity).unwrap();
        assert_eq!(e.stats().user_write_bytes, before.user_write_bytes);
        for (v, blocks) in [200u64, 120].iter().enumerate() {
            let vol = e.volume(&format!("v{v}")).unwrap();
            for lba in 0..*blocks {
                let mut b = vec![0u8; 4096];
                vol.read(lba * 4096, &mut b).unwrap();
                let want = model[v].get(&lba).map_or(vec![0u8; 4096], |&ver| pattern(v, lba, ver));
                assert!(b == want, "volume {v} block {lba} after reopen");
            }
        }
        // And it keeps working.
        e.volume("v0").unwrap().write(0, &pattern(0, 0, 99_999), true).unwrap();
        e.check_invariants();
    }

    #[test]
    fn reopen_refuses_unclean_and_corrupt_state() {
        let w = small_world(&[64]);
        w.volumes[0].write(0, &pattern(0, 0, 1), true).unwrap();
        let (cache, capacity) = w.engine.devices();
        w.engine.shutdown().unwrap();
        // One torn superblock copy: the other one still opens.
        sluice_media::device::write_at(&*cache, 0, &[0u8; 4096]).unwrap();
        let e = Engine::open(cache.clone(), capacity.clone()).unwrap();
        e.shutdown().unwrap();
        // A corrupted checkpoint is refused, not trusted.
        let sb =
            crate::persist::Superblock::decode(&sluice_media::device::read_at(&*cache, 4096, 4096).unwrap()).unwrap();
        let mut ck = sluice_media::device::read_at(&*capacity, sb.checkpoint_offset, 4096).unwrap();
        ck[10] ^= 0xff;
        sluice_media::device::write_at(&*capacity, sb.checkpoint_offset, &ck).unwrap();
        assert!(matches!(Engine::open(cache.clone(), capacity.clone()), Err(EngineError::CheckpointChecksum)));
        // A blank cache device in front of this capacity device is refused:
        // the capacity device names its engine.
        let blank: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(cache.info().capacity_bytes, 4096));
        assert!(matches!(Engine::open(blank, capacity), Err(EngineError::CacheUnlabelled(_))));
    }

    /// Devices that do not belong together, or are not what the engine
    /// recorded, are refused before anything is written; `create` never
    /// overwrites an engine; records of a previous engine on wiped devices
    /// are never read as the new engine's.
    #[test]
    fn devices_that_do_not_belong_together_are_refused_and_left_unchanged() {
        let sizes = [64u64];
        let (c, p) = small_device_bytes(&sizes);
        let dev = |bytes: u64| -> Arc<dyn BlockDevice> { Arc::new(MemoryDevice::new(bytes, 4096)) };
        let a = small_world_on(dev(c), dev(p), &sizes);
        for lba in 0..64 {
            a.volumes[0].write(lba * 4096, &pattern(0, lba, 1), false).unwrap();
        }
        a.volumes[0].flush().unwrap();
        let (a_cache, a_cap) = a.engine.devices();
        drop(a); // a crash: the superblock stays dirty
        let b = small_world_on(dev(c), dev(p), &sizes);
        let (_, b_cap) = b.engine.devices();
        b.engine.shutdown().unwrap();
        let image = |d: &Arc<dyn BlockDevice>| {
            sluice_media::device::read_at(&**d, 0, d.info().capacity_bytes as usize).map(|b| b.to_vec())
        };
        let before = (image(&a_cache).unwrap(), image(&a_cap).unwrap());
        // Two engines' devices crossed.
        let r = Engine::open(a_cache.clone(), b_cap.clone());
        assert!(matches!(r, Err(EngineError::Mismatch { .. })), "{:?}", r.err());
        // A blank capacity device behind a cache device with an engine.
        let r = Engine::open(a_cache.clone(), dev(p));
        assert!(matches!(r, Err(EngineError::CapacityUnlabelled(_))), "{:?}", r.err());
        // Devices of other sizes than recorded (a truncated or regrown file).
        let r = Engine::open(a_cache.clone(), dev(p - (1 << 20)));
        assert!(matches!(r, Err(EngineError::DeviceSize { device: "capacity", .. })), "{:?}", r.err());
        let short = dev(c / 2);
        let head = sluice_media::device::read_at(&*a_cache, 0, (c / 2) as usize).unwrap();
        sluice_media::device::write_at(&*short, 0, &head).unwrap();
        let r = Engine::open(short, a_cap.clone());
        assert!(matches!(r, Err(EngineError::DeviceSize { device: "cache", .. })), "{:?}", r.err());
        // Two blank devices are no engine at all.
        assert!(matches!(Engine::open(dev(c), dev(p)), Err(EngineError::NoEngine)));
        // Creating over either device of an engine is refused.
        let r = Engine::create(a_cache.clone(), dev(p), small_config(), &small_specs(&sizes));
        assert!(matches!(r, Err(EngineError::AlreadyFormatted { device: "cache", .. })), "{:?}", r.err());
        let r = Engine::create(dev(c), a_cap.clone(), small_config(), &small_specs(&sizes));
        assert!(matches!(r, Err(EngineError::AlreadyFormatted { device: "capacity", .. })), "{:?}", r.err());
        // None of that changed a byte of engine A.
        assert!((image(&a_cache).unwrap(), image(&a_cap).unwrap()) == before, "a refused open or create wrote");
        // It still opens (recovering from its crash) with every block.
        let e = Engine::open(a_cache.clone(), a_cap.clone()).unwrap();
        assert!(e.recovered_in().is_some());
        let v = e.volume("v0").unwrap();
        let mut buf = vec![0u8; 4096];
        for lba in 0..64 {
            v.read(lba * 4096, &mut buf).unwrap();
            assert!(buf == pattern(0, lba, 1), "block {lba}");
        }
        e.shutdown().unwrap();
        drop((v, e));
        // Wiped and created anew (`sluice format --force`): engine A's
        // records are still on both devices, but a crash of the new engine
        // recovers none of them.
        crate::engine::wipe_labels(&*a_cache, &*a_cap).unwrap();
        let n = Engine::create(a_cache.clone(), a_cap.clone(), small_config(), &small_specs(&sizes)).unwrap();
        drop(n);
        let n = Engine::open(a_cache, a_cap).unwrap();
        assert!(n.recovered_in().is_some());
        let v = n.volume("v0").unwrap();
        for lba in 0..64 {
            v.read(lba * 4096, &mut buf).unwrap();
            assert!(buf == vec![0u8; 4096], "block {lba} of the old engine came back");
        }
    }

    #[test]
    fn on_zns_the_engine_keeps_every_zone_rule() {
        for seed in 1..=25 {
            let w = run_seed_with(seed, 3000, small_world_zns)
                .unwrap_or_else(|e| panic!("{e} (replay: sim::run_seed_with({seed}, 3000, small_world_zns))"));
            let s = w.engine.stats();
            let (_, zns) = w.engine.devices();
            let d = zns.stats();
            assert_eq!(d.errors, 0, "seed {seed}: the ZNS device rejected requests: {d:?}");
            assert!(s.bands_reclaimed > 0 && d.erases > 0, "seed {seed}: GC reset zones: {s:?} {d:?}");
        }
    }

    #[test]
    fn on_zns_clean_and_unclean_reopen_keep_every_block() {
        let sizes = [150u64, 90];
        let w = small_world_zns(&sizes);
        let mut rng = Rng(5);
        let mut model: Vec<HashMap<u64, u64>> = vec![HashMap::new(); 2];
        let check = |e: &Arc<Engine>, model: &[HashMap<u64, u64>]| {
            for (v, &n) in sizes.iter().enumerate() {
                let vol = e.volume(&format!("v{v}")).unwrap();
                for lba in 0..n {
                    let mut b = vec![0u8; 4096];
                    vol.read(lba * 4096, &mut b).unwrap();
                    let want = model[v].get(&lba).map_or(vec![0u8; 4096], |&ver| pattern(v, lba, ver));
                    assert!(b == want, "volume {v} block {lba}");
                }
            }
        };
        let mut write_some = |e: &Arc<Engine>, model: &mut Vec<HashMap<u64, u64>>, from: u64| {
            for i in from..from + 1500 {
                let v = (i % 2) as usize;
                let lba = rng.below(sizes[v]);
                e.volume(&format!("v{v}")).unwrap().write(lba * 4096, &pattern(v, lba, i), false).unwrap();
                model[v].insert(lba, i);
            }
        };
        write_some(&w.engine, &mut model, 0);
        w.engine.shutdown().unwrap();
        let (cache, zns) = w.engine.devices();
        drop(w);
        let e = Engine::open(cache.clone(), zns.clone()).unwrap();
        assert!(e.recovered_in().is_none());
        check(&e, &model);
        // Lose the process again and again: no shutdown. Recovery must finish
        // the zones of the bands it closes, or they stay active and the
        // device's active limit refuses writes within a few rounds.
        let mut e = e;
        for round in 1..=5u64 {
            write_some(&e, &mut model, round * 10_000);
            e.volume("v0").unwrap().flush().unwrap();
            drop(e);
            e = Engine::open(cache.clone(), zns.clone()).unwrap();
            assert!(e.recovered_in().is_some());
            // Nothing is open after recovery, so no zone may be active.
            let zs = zns.as_zoned().unwrap().report_zones(0, usize::MAX);
            let active = zs.iter().filter(|z| !matches!(z.state, ZoneState::Empty | ZoneState::Full)).count();
            assert_eq!(active, 0, "round {round}: zones left active after recovery: {zs:?}");
            check(&e, &model);
        }
        write_some(&e, &mut model, 90_000);
        check(&e, &model);
        e.check_invariants();
        assert_eq!(zns.stats().errors, 0, "{:?}", zns.stats());
    }

    #[test]
    fn more_volumes_than_active_zones_are_refused() {
        let specs = small_specs(&[16, 16, 16, 16, 16]);
        let (c, _) = small_device_bytes(&[16; 5]);
        let p = ZnsProfile { zone_count: 64, ..ZnsProfile::tiny() };
        let zns: Arc<dyn BlockDevice> =
            Arc::new(zns_device(p.clone(), Box::new(MemoryDevice::new(p.capacity_bytes(), 4096)), VirtualClock::new()));
        let r = Engine::create(Arc::new(MemoryDevice::new(c, 4096)), zns, small_config(), &specs);
        assert!(matches!(r, Err(EngineError::Config(m)) if m.contains("active-zone")));
    }

    #[test]
    fn volumes_that_do_not_fit_are_refused() {
        let cache: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(1 << 20, 4096));
        let capacity: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(4 << 20, 4096));
        let cfg = EngineConfig { chunk_bytes: 128 << 10, band_bytes: 256 << 10, ..Default::default() };
        let too_big = [VolumeSpec { name: "big".into(), size_bytes: 4 << 20 }];
        assert!(Engine::create(cache, capacity, cfg, &too_big).is_err());
    }
}
