//! The engine's behaviour seen through its volumes, in small worlds
//! (testkit.rs): compaction and GC at work, placement, ZNS, identity.

use crate::engine::Engine;
use crate::engine::EngineError;
use crate::testkit::{
    assert_reads_as, device_image, pattern, small_config, small_device_bytes, small_specs, small_world, small_world_on,
    small_world_zns, World,
};
use crate::volume::Volume;
use crate::volume::VolumeError;
use crate::{EngineConfig, VolumeSpec};
use sluice_media::rng::SplitMix64 as Rng;
use sluice_media::ZoneState;
use sluice_media::{zns_device, BlockDevice, MemoryDevice, VirtualClock, ZnsProfile};
use std::collections::HashMap;
use std::sync::Arc;

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
        w.engine.band_tenancy().unwrap()
    };
    let own = tenancy(BandPlacement::PerVolume);
    assert!(own[0] >= 3 && own[1..].iter().all(|&n| n == 0), "per-volume bands: {own:?}");
    let shared = tenancy(BandPlacement::Shared);
    assert!(shared[1..].iter().sum::<u64>() >= 2, "shared bands: {shared:?}");
}

/// Placement may change mid-life: the old streams' open bands are closed,
/// none is left open with no writer, and every block reads back.
#[test]
fn band_placement_changes_mid_life_without_stranding_a_band() {
    use crate::engine::BandPlacement;
    let w = small_world(&[256, 256, 256]);
    let mut model = vec![vec![0u64; 256]; 3];
    let mut rng = Rng(5);
    for (round, placement) in
        [BandPlacement::Lifetime, BandPlacement::Shared, BandPlacement::PerVolume, BandPlacement::Lifetime]
            .into_iter()
            .enumerate()
    {
        w.engine.set_band_placement(placement).unwrap();
        w.engine.check_invariants();
        for i in 0..1500u64 {
            let (v, lba) = (rng.below(3) as usize, rng.below(256));
            let version = round as u64 * 10_000 + i + 1;
            w.volumes[v].write(lba * 4096, &pattern(v, lba, version), false).unwrap();
            model[v][lba as usize] = version;
        }
        w.engine.check_invariants();
    }
    assert!(w.engine.stats().bands_reclaimed > 0);
    assert_reads_as(&w, &model);
    // Lifetime placement needs 6 active zones; small_world_zns has them.
    let z = small_world_zns(&[64, 64]);
    z.engine.set_band_placement(BandPlacement::Lifetime).unwrap();
}

/// Compaction reads only record headers and current blocks of a chunk whose
/// headers it knows, not the whole chunk; after a reopen (headers unknown)
/// it reads whole windows. Either way every block moves intact.
#[test]
fn compaction_reads_only_what_is_current() {
    let w = small_world(&[256]);
    // Every chunk is left for the steps below.
    w.engine.set_writer_steps(false);
    let v = &w.volumes[0];
    let mut model = vec![vec![0u64; 256]];
    // Each round writes an 8-block stripe four times: of the 36 blocks its
    // records take, the last record (9 blocks) and three headers are
    // current or needed, the rest superseded.
    for round in 1..=40u64 {
        let lba = round * 8 % 256;
        for k in 0..4u64 {
            let version = round * 10 + k;
            let data: Vec<u8> = (0..8).flat_map(|i| pattern(0, lba + i, version)).collect();
            v.write(lba * 4096, &data, false).unwrap();
            (0..8).for_each(|i| model[0][(lba + i) as usize] = version);
        }
    }
    let (cache, _) = w.engine.devices();
    let before = (cache.stats().host_read_bytes, w.engine.stats().chunks_compacted);
    while w.engine.compact_some(u64::MAX).unwrap() {}
    let read = cache.stats().host_read_bytes - before.0;
    let chunks = w.engine.stats().chunks_compacted - before.1;
    assert!(chunks >= 3, "{chunks} chunks compacted");
    let chunk_bytes = 64 * 4096;
    assert!(read * 4 <= chunks * chunk_bytes * 3, "read {read} bytes for {chunks} chunks of {chunk_bytes}");
    assert_reads_as(&w, &model);
    w.engine.check_invariants();
}

/// Lifetime placement (placement.rs): a block whose last copy was still in
/// the log goes to the short-lived band, a block never written before to
/// the long-lived one; GC learns ℓ from reclaimed short-lived bands.
#[test]
fn lifetime_placement_separates_blocks_rewritten_young() {
    use crate::engine::BandPlacement;
    let w = small_world(&[512, 512]);
    w.engine.set_band_placement(BandPlacement::Lifetime).unwrap();
    let v = &w.volumes[0];
    for lba in (0..48).chain(0..48).chain(48..200) {
        v.write(lba * 4096, &pattern(0, lba, 1), false).unwrap();
    }
    while w.engine.compact_some(u64::MAX).unwrap() {}
    let inner = w.engine.lock();
    let bpb = inner.blocks_per_band();
    let (mut short, mut long) = (0, 0);
    for lba in 0..200u64 {
        let Some(pb) = inner.vols[0].l2p.get(lba as usize).unwrap().capacity_block() else { continue };
        let band = &inner.bands[(pb / bpb) as usize];
        assert!(!band.by_gc(), "nothing was collected yet");
        assert_eq!(band.short(), lba < 48, "block {lba}");
        if lba < 48 {
            short += 1;
        } else {
            long += 1;
        }
    }
    assert!(short >= 32 && long >= 100, "compacted: {short} rewritten young, {long} once");
    assert_eq!(inner.lifespans.ell(), None);
    drop(inner);
    // Rewriting at random makes GC reclaim short-lived bands: ℓ is learned,
    // and GC uses its streams past the first.
    let mut rng = Rng(3);
    let mut used = [false; 3];
    for i in 0..20_000u64 {
        let lba = if rng.below(4) == 0 { rng.below(512) } else { rng.below(64) };
        v.write(lba * 4096, &pattern(0, lba, i), false).unwrap();
        let inner = w.engine.lock();
        for (k, u) in used.iter_mut().enumerate() {
            *u |= inner.stream_band(crate::engine::bands::Stream::Gc(k)).0.is_some();
        }
    }
    let inner = w.engine.lock();
    assert!(inner.lifespans.ell().is_some(), "no short-lived band reclaimed");
    assert!(used.iter().all(|&u| u), "GC streams used: {used:?}");
    drop(inner);
    w.engine.check_invariants();
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
    // Reads too, though they take no lock (read.rs).
    assert_eq!(w.volumes[0].read(0, &mut [0u8; 4096]), Err(VolumeError::ReadOnly));
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

/// Opened read-only (a read-only file system, `serve --read-only`), an
/// engine serves every block, refuses every change, writes nothing — not at
/// open, not at a FLUSH, not at shutdown — and refuses an engine that was
/// not shut down cleanly (recovery writes).
#[test]
fn a_read_only_open_serves_reads_refuses_changes_and_writes_nothing() {
    let w = small_world(&[200, 120]);
    let mut rng = Rng(5);
    let mut model: Vec<HashMap<u64, u64>> = vec![HashMap::new(); 2];
    for i in 0..1200u64 {
        let v = (i % 2) as usize;
        let lba = rng.below([200, 120][v]);
        w.volumes[v].write(lba * 4096, &pattern(v, lba, i), false).unwrap();
        model[v].insert(lba, i);
    }
    w.volumes[0].flush().unwrap();
    let (cache, capacity) = w.engine.devices();
    let image = |d: &Arc<dyn BlockDevice>| device_image(&**d);
    // Not shut down: refused, and nothing written.
    let (c0, k0) = (image(&cache), image(&capacity));
    let ro = crate::OpenOptions { read_only: true, ..Default::default() };
    match Engine::open_with(cache.clone(), capacity.clone(), ro.clone()) {
        Err(EngineError::ReadOnlyNeedsRecovery) => {}
        other => panic!("an unclean engine opened read-only: {:?}", other.map(|_| ())),
    }
    assert!(image(&cache) == c0 && image(&capacity) == k0, "a refused read-only open wrote");
    w.engine.shutdown().unwrap();
    drop(w);
    let (c1, k1) = (image(&cache), image(&capacity));
    let e = Engine::open_with(cache.clone(), capacity.clone(), ro).unwrap();
    assert!(e.is_read_only());
    for (v, blocks) in [200u64, 120].iter().enumerate() {
        let vol = e.volume(&format!("v{v}")).unwrap();
        for lba in 0..*blocks {
            let mut b = vec![0u8; 4096];
            vol.read(lba * 4096, &mut b).unwrap();
            let want = model[v].get(&lba).map_or(vec![0u8; 4096], |&ver| pattern(v, lba, ver));
            assert!(b == want, "volume {v} block {lba} read-only");
        }
    }
    let v0 = e.volume("v0").unwrap();
    assert_eq!(v0.write(0, &[1u8; 4096], false), Err(VolumeError::ReadOnly));
    assert_eq!(v0.write(0, &[1u8; 4096], true), Err(VolumeError::ReadOnly));
    assert_eq!(v0.trim(0, 4096), Err(VolumeError::ReadOnly));
    assert_eq!(v0.write_zeroes(0, 4096, false), Err(VolumeError::ReadOnly));
    assert_eq!(v0.flush(), Ok(()));
    e.shutdown().unwrap();
    assert!(image(&cache) == c1 && image(&capacity) == k1, "a read-only engine wrote");
    // And it opens read-write as before.
    let e = Engine::open(cache, capacity).unwrap();
    e.volume("v1").unwrap().write(0, &pattern(1, 0, 7), true).unwrap();
    e.check_invariants();
}

/// The file system holding the cache device fills (a write fails with
/// ENOSPC): the client gets ENOSPC for that write and for every change
/// after it (never EIO), reads go on, and once room was made a restart
/// recovers every flushed write.
#[test]
fn a_full_host_file_system_is_enospc_to_the_client_until_a_restart() {
    crate::report::quiet();
    let (c, p) = small_device_bytes(&[128]);
    let cache = Arc::new(sluice_media::CrashDevice::new(c, 4096));
    let capacity = Arc::new(sluice_media::CrashDevice::new(p, 4096));
    let w = small_world_on(cache.clone(), capacity.clone(), &[128]);
    let v = &w.volumes[0];
    for lba in 0..64u64 {
        v.write(lba * 4096, &pattern(0, lba, 1), false).unwrap();
    }
    v.flush().unwrap();
    let full = sluice_media::FaultPlan { errno: 28, ..sluice_media::FaultPlan::nth_write(1) };
    cache.inject(full);
    let first = v.write(64 * 4096, &pattern(0, 64, 1), false).unwrap_err();
    assert_eq!(first.errno(), 28, "{first}");
    cache.inject(sluice_media::FaultPlan::none());
    let later = v.write(65 * 4096, &pattern(0, 65, 1), false).unwrap_err();
    assert_eq!((later.clone(), later.errno()), (VolumeError::StoppedFull, 28));
    assert_eq!(v.trim(0, 4096).unwrap_err().errno(), 28);
    let mut b = vec![0u8; 4096];
    v.read(3 * 4096, &mut b).unwrap();
    assert!(b == pattern(0, 3, 1), "reads go on");
    drop(w);
    let e = Engine::open(cache, capacity).unwrap();
    let v = e.volume("v0").unwrap();
    for lba in 0..64u64 {
        v.read(lba * 4096, &mut b).unwrap();
        assert!(b == pattern(0, lba, 1), "block {lba} after the restart");
    }
    v.write(64 * 4096, &pattern(0, 64, 2), true).unwrap();
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
    let sb = crate::persist::Superblock::decode(&sluice_media::device::read_at(&*cache, 4096, 4096).unwrap()).unwrap();
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

/// A volume whose map does not fit the DRAM budget: the map is paged
/// through the cache device's map region (4 pages of 64 in DRAM). Random
/// writes over the whole volume, with compaction and GC, read back live;
/// after a crash (recovery rebuilds the map through the pager, never
/// trusting the region); after a clean shutdown (the checkpoint says which
/// pages the region holds); and `sluice check` finds nothing. Recovery
/// faults each page in once.
#[test]
fn a_paged_map_serves_recovers_and_reopens_within_its_budget() {
    use crate::engine::l2p::PAGE_ENTRIES;
    let blocks = 64 * PAGE_ENTRIES as u64;
    let cfg = EngineConfig {
        chunk_bytes: 64 * 4096,
        band_bytes: 256 * 4096,
        write_unit_bytes: 16 * 4096,
        log_free_chunks_min: 2,
        gc_free_bands_min: 2,
        l2p_dram_bytes: 4 * 8192,
        layout: Default::default(),
        attached: false,
        home_sums: true,
    };
    let cache: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(12 * cfg.chunk_bytes, 4096));
    let capacity: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(blocks * 4096 * 3 / 2, 4096));
    let specs = [VolumeSpec { name: "v".into(), size_bytes: blocks * 4096 }];
    let e = Engine::create(cache.clone(), capacity.clone(), cfg, &specs).unwrap();
    assert!(e.lock().vols[0].l2p.is_paged());
    let dram = e.lock().vols[0].l2p.bytes();
    assert!(dram < 64 << 10, "the map takes {dram} bytes of DRAM");
    let mut model = vec![0u64; blocks as usize];
    let mut rng = Rng(17);
    let v = e.volume("v").unwrap();
    for version in 1..=20_000u64 {
        let lba = rng.below(blocks);
        v.write(lba * 4096, &pattern(0, lba, version), false).unwrap();
        model[lba as usize] = version;
        if version % 1000 == 0 {
            e.collect_some(256).unwrap();
            let lba = rng.below(blocks - 8);
            v.trim(lba * 4096, 8 * 4096).unwrap();
            model[lba as usize..lba as usize + 8].fill(0);
        }
    }
    let verify = |e: &Arc<Engine>, model: &[u64]| {
        let v = e.volume("v").unwrap();
        let mut b = vec![0u8; 4096];
        for (lba, &want) in model.iter().enumerate() {
            v.read(lba as u64 * 4096, &mut b).unwrap();
            let ok = if want == 0 { b == vec![0u8; 4096] } else { b == pattern(0, lba as u64, want) };
            assert!(ok, "block {lba} does not read back as version {want}");
        }
    };
    verify(&e, &model);
    e.check_invariants();
    assert!(e.lock().vols[0].l2p.page_traffic().1 > 0, "no page was ever written back");
    v.flush().unwrap();
    drop(v);
    drop(e);
    let e = Engine::open(cache.clone(), capacity.clone()).unwrap();
    assert!(e.recovered_in().is_some());
    // Recovery applies its offers page by page as step 5 walks them: each
    // of the map's 64 pages is faulted in once (in log order, with 4 in
    // DRAM, nearly every one of ~20,000 offers faulted its page).
    let (faults, _) = e.lock().vols[0].l2p.page_traffic();
    assert!(faults <= 64, "recovery faulted {faults} pages of a 64-page map");
    e.check_invariants();
    verify(&e, &model);
    e.shutdown().unwrap();
    drop(e);
    let r = Engine::check(cache.clone(), capacity.clone()).unwrap();
    assert!(r.damage.is_empty(), "{}", r.text());
    let e = Engine::open(cache, capacity).unwrap();
    assert!(e.recovered_in().is_none());
    e.check_invariants();
    verify(&e, &model);
}

/// `y` with its last four bytes changed so that its CRC32C is `target`
/// (a CRC is affine in the message: the 32 bits of the last four bytes
/// reach every value, solved over GF(2)).
fn forge_crc(mut y: Vec<u8>, target: u32) -> Vec<u8> {
    use crate::layout::crc32c;
    let n = y.len();
    let zero = crc32c(&vec![0u8; n]);
    let flip = |d: &mut [u8], bit: usize| d[n - 4 + bit / 8] ^= 1 << (bit % 8);
    // Per pivot bit: (the linear part's value, which bits make it).
    let mut basis: [Option<(u32, u32)>; 32] = [None; 32];
    for bit in 0..32 {
        let mut d = vec![0u8; n];
        flip(&mut d, bit);
        let (mut v, mut c) = (crc32c(&d) ^ zero, 1u32 << bit);
        for p in (0..32).rev() {
            if v >> p & 1 == 0 {
                continue;
            }
            match basis[p] {
                Some((bv, bc)) => (v, c) = (v ^ bv, c ^ bc),
                None => {
                    basis[p] = Some((v, c));
                    break;
                }
            }
        }
    }
    let (mut v, mut c) = (crc32c(&y) ^ target, 0u32);
    for p in (0..32).rev() {
        if v >> p & 1 == 1 {
            let (bv, bc) = basis[p].expect("the last 32 bits reach every CRC");
            (v, c) = (v ^ bv, c ^ bc);
        }
    }
    (0..32).filter(|b| c >> b & 1 == 1).for_each(|b| flip(&mut y, b));
    assert_eq!(crc32c(&y), target);
    y
}

/// A lock-free read whose place is reused between its look at the map and
/// its device read must not serve what was written there next, even when
/// that has the very CRC it expects: the reuse counter, not the checksum,
/// is what sends it to the locked path. Staged deterministically: block 0
/// is logged at the first data block of chunk 1; while the read is paused
/// there, block 1 is rewritten (with bytes forged to share block 0's CRC)
/// until chunk 1 is compacted, reopened and holds block 1 at that place.
#[test]
fn a_lock_free_read_of_a_reused_place_is_read_again_under_the_lock() {
    use crate::engine::log::ChunkId;
    let w = small_world(&[256]);
    let a = pattern(0, 0, 1);
    w.volumes[0].write(0, &a, false).unwrap();
    let bpc = w.engine.lock().blocks_per_chunk();
    assert_eq!(w.engine.lock().vols[0].l2p.get(0).unwrap().cache_block(), Some(bpc + 1));
    let b = forge_crc(pattern(0, 1, 1), crate::layout::crc32c(&a));
    assert_ne!(a, b);
    let (engine, vol1) = (w.engine.clone(), w.engine.volume(w.volumes[0].name()).unwrap());
    let reused = std::rc::Rc::new(std::cell::Cell::new(false));
    let flag = reused.clone();
    super::read::BETWEEN_LOAD_AND_READ.with(|h| {
        h.set(Some(Box::new(move || {
            for _ in 0..10_000 {
                vol1.write(4096, &b, false).unwrap();
                if engine.lock().log.open() == Some((ChunkId(1), 2)) {
                    flag.set(true);
                    return;
                }
            }
        })))
    });
    let mut got = vec![0u8; 4096];
    w.volumes[0].read(0, &mut got).unwrap();
    assert!(reused.get(), "the log never came back to chunk 1");
    assert!(got == a, "a read served another block's bytes from a reused place");
    w.engine.check_invariants();
}

/// A bit flipped in any segment header on the capacity device (in its fixed
/// part, its entries or its checksum) after a crash is either refused as
/// damage or harmless: never a flushed block read back as another version.
#[test]
fn a_flip_in_any_segment_header_is_refused_or_harmless() {
    crate::report::quiet();
    let w = small_world(&[200, 120, 90]);
    let mut rng = Rng(23);
    let sizes = [200u64, 120, 90];
    let mut model: Vec<HashMap<u64, u64>> = vec![HashMap::new(); 3];
    for i in 1..6000u64 {
        let v = rng.below(3) as usize;
        let lba = rng.below(sizes[v]);
        if rng.below(5) == 0 {
            let n = (1 + rng.below(8)).min(sizes[v] - lba);
            w.volumes[v].trim(lba * 4096, n * 4096).unwrap();
            for l in lba..lba + n {
                model[v].remove(&l);
            }
        } else {
            w.volumes[v].write(lba * 4096, &pattern(v, lba, i), false).unwrap();
            model[v].insert(lba, i);
        }
    }
    w.volumes[0].flush().unwrap();
    let (cache, capacity) = w.engine.devices();
    let image = |d: &Arc<dyn BlockDevice>| device_image(&**d);
    let (c_img, k_img) = (image(&cache), image(&capacity));
    drop(w);
    let tag = Engine::inspect(&*cache, &*capacity).unwrap().engine_tag();
    let mut silent = Vec::new();
    let mut headers = 0;
    for blk in 0..k_img.len() / 4096 {
        let b = &k_img[blk * 4096..(blk + 1) * 4096];
        if crate::layout::decode_header(b, tag).is_err() {
            continue;
        }
        headers += 1;
        for at in [0usize, 17, 100, 4095] {
            let mut k = k_img.clone();
            k[blk * 4096 + at] ^= 0x10;
            let c2: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(c_img.len() as u64, 4096));
            let k2: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(k.len() as u64, 4096));
            sluice_media::device::write_at(&*c2, 0, &c_img).unwrap();
            sluice_media::device::write_at(&*k2, 0, &k).unwrap();
            let e = match Engine::open(c2, k2) {
                Ok(e) => e,
                Err(_) => continue,
            };
            for (v, n) in sizes.iter().enumerate() {
                let vol = e.volume(&format!("v{v}")).unwrap();
                for lba in 0..*n {
                    let mut got = vec![0u8; 4096];
                    if vol.read(lba * 4096, &mut got).is_err() {
                        continue;
                    }
                    let want = model[v].get(&lba).map_or(vec![0u8; 4096], |&ver| pattern(v, lba, ver));
                    if got != want {
                        silent.push((blk, at, v, lba));
                        break;
                    }
                }
            }
        }
    }
    assert!(headers > 10, "{headers} headers");
    assert!(
        silent.is_empty(),
        "{} of {headers} header flips read back wrong data: {:?}",
        silent.len(),
        &silent[..silent.len().min(10)]
    );
}

/// The mark that frees a compacted chunk is written only once the records
/// that superseded the chunk's dropped entries are durable: with both
/// unflushed, a failed flush (or a power loss during it) could keep the
/// mark and lose the newer record, and a flushed block would read back as
/// an older version. The sim's failed flushes found it (seed 224).
#[test]
fn a_failed_flush_while_a_chunk_is_freed_loses_no_flushed_block() {
    for k in 1..=2 {
        let (c, p) = small_device_bytes(&[256]);
        let cache = Arc::new(sluice_media::CrashDevice::new(c, 4096));
        let capacity = Arc::new(sluice_media::CrashDevice::new(p, 4096));
        let w = small_world_on(cache.clone(), capacity.clone(), &[256]);
        let v = &w.volumes[0];
        v.write(0, &pattern(0, 0, 1), false).unwrap();
        // The first chunk full (the oldest), everything in it flushed.
        let mut lba = 10;
        while w.engine.lock().log.oldest_full().is_none() {
            v.write(lba * 4096, &pattern(0, lba, 1), false).unwrap();
            lba += 1;
        }
        v.flush().unwrap();
        // Block 0 again, not flushed: its copy in the oldest chunk is stale.
        v.write(0, &pattern(0, 0, 2), false).unwrap();
        cache.inject(sluice_media::FaultPlan::nth_flush(k));
        for _ in 0..4 {
            if w.engine.compact_some(u64::MAX).is_err() {
                break;
            }
        }
        let mut b = vec![0u8; 4096];
        for seed in 0..32 {
            let e = Engine::open(Arc::new(cache.crash(seed)), Arc::new(capacity.crash(seed))).unwrap();
            let vol = e.volume("v0").unwrap();
            vol.read(0, &mut b).unwrap();
            assert!(
                b == pattern(0, 0, 1) || b == pattern(0, 0, 2),
                "flush {k} failed, seed {seed}: block 0 rolled back"
            );
            for l in 10..lba {
                vol.read(l * 4096, &mut b).unwrap();
                assert!(b == pattern(0, l, 1), "flush {k} failed, seed {seed}: block {l}");
            }
        }
    }
}
