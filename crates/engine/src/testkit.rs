//! Worlds for tests and simulations: small engines on memory (or zoned)
//! devices, the block pattern every test writes, and checks against it.
//!
//! Compiled into the engine's own unit tests (`#[cfg(test)]`) and, from the
//! same file, into the simulation crate (sluice-sim), so that neither keeps
//! a copy and the engine's public API carries no test helpers. It names
//! engine types from the crate root (`crate::Engine`), which both crates
//! provide.
#![allow(dead_code)]

use crate::{Engine, EngineConfig, EngineVolume, Volume, VolumeError, VolumeSpec};
use sluice_media::{zns_device, BlockDevice, MemoryDevice, VirtualClock, ZnsProfile};
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

/// Block `lba` of `v`, as it reads now.
pub fn read_block(v: &EngineVolume, lba: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    v.read(lba * BS as u64, &mut b).unwrap();
    b
}

/// Every byte device `d` holds now.
pub fn device_image(d: &dyn BlockDevice) -> Vec<u8> {
    sluice_media::device::read_at(d, 0, d.info().capacity_bytes as usize).unwrap().to_vec()
}

/// `w`'s engine after a FLUSH (of its first volume: a round flushes them
/// all) and an unclean stop: opened again on the same devices, so it
/// replays its log.
pub fn flushed_and_reopened(w: World) -> Arc<Engine> {
    w.volumes[0].flush().unwrap();
    let (cache, capacity) = w.engine.devices();
    drop(w);
    Engine::open(cache, capacity).unwrap()
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
        l2p_dram_bytes: 0,
        layout: Default::default(),
        attached: false,
        home_sums: true,
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
    small_world_with(cache, capacity, volume_blocks, small_config())
}

/// `small_world_on` with another configuration.
pub fn small_world_with(
    cache: Arc<dyn BlockDevice>,
    capacity: Arc<dyn BlockDevice>,
    volume_blocks: &[u64],
    cfg: EngineConfig,
) -> World {
    let specs = small_specs(volume_blocks);
    let engine = Engine::create(cache, capacity, cfg, &specs).expect("world fits");
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

/// Device sizes (cache, capacity) of an in-place world: an 8-chunk log,
/// and the volumes' homes plus room for the checkpoint and the label.
pub fn in_place_device_bytes(volume_blocks: &[u64]) -> (u64, u64) {
    let cfg = small_config();
    let total: u64 = volume_blocks.iter().sum();
    (8 * cfg.chunk_bytes, (total + 256) * BS as u64 + (1 << 20))
}

/// A fresh in-place engine (`Layout::InPlace`, write-back) on the given
/// devices (sized by `in_place_device_bytes`).
pub fn in_place_world_on(cache: Arc<dyn BlockDevice>, capacity: Arc<dyn BlockDevice>, volume_blocks: &[u64]) -> World {
    small_world_with(cache, capacity, volume_blocks, EngineConfig { layout: crate::Layout::InPlace, ..small_config() })
}

pub fn in_place_world(volume_blocks: &[u64]) -> World {
    let (c, p) = in_place_device_bytes(volume_blocks);
    in_place_world_on(Arc::new(MemoryDevice::new(c, 4096)), Arc::new(MemoryDevice::new(p, 4096)), volume_blocks)
}
