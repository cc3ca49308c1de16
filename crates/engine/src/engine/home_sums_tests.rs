//! Tests of home checksums (home_sums.rs) through the engine: a damaged
//! home is an error on read and a finding of `check`, never data; the sums
//! survive a clean restart; a crash never leaves a sum that its home does
//! not match; an attached disk's data is unverified until scrubbed.

use super::*;
use crate::testkit::{in_place_device_bytes, in_place_world_on, pattern, World};
use sluice_media::{CrashDevice, MemoryDevice};

fn pass_through(w: &World) {
    let p = CachePolicy { mode: CacheMode::PassThrough, ..CachePolicy::default() };
    w.engine.set_cache_policy("v0", p).unwrap();
}

/// Flip one byte of capacity block `b`.
fn flip(dev: &dyn BlockDevice, b: u64) {
    let mut d = read_at(dev, b * BS, BLOCK_BYTES).unwrap().to_vec();
    d[77] ^= 0x10;
    write_at(dev, b * BS, &d).unwrap();
}

fn read(w: &World, lba: u64) -> Result<Vec<u8>, VolumeError> {
    let mut b = vec![0u8; BLOCK_BYTES];
    w.volumes[0].read(lba * BS, &mut b).map(|()| b)
}

/// A home Sluice wrote and then found changed under it is EIO (Corrupt,
/// naming the capacity device) and counted, on the running engine and
/// after a clean restart; `check` reports it; rewriting it heals it.
#[test]
fn a_damaged_home_is_an_error_and_a_finding_never_data() {
    let (c, p) = in_place_device_bytes(&[256]);
    let cache: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(c, 4096));
    let capacity: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(p, 4096));
    let w = in_place_world_on(cache.clone(), capacity.clone(), &[256]);
    assert_eq!(w.engine.lock().sb.version, crate::persist::SUPERBLOCK_VERSION_HOME_SUMS);
    pass_through(&w);
    for lba in 0..32 {
        w.volumes[0].write(lba * BS, &pattern(0, lba, 1), false).unwrap();
    }
    w.volumes[0].flush().unwrap();
    let home = w.engine.home_offset("v0").unwrap() / BS;
    assert_eq!(read(&w, 5).unwrap(), pattern(0, 5, 1));
    flip(&*capacity, home + 5);
    match read(&w, 5) {
        Err(VolumeError::Corrupt { device: "capacity", offset, device_offset }) => {
            assert_eq!((offset, device_offset), (5 * BS, (home + 5) * BS));
        }
        r => panic!("a damaged home read back as {:?}", r.map(|_| "data")),
    }
    // A multi-block read with the damaged block in it fails too; its
    // neighbours alone read.
    let mut b = vec![0u8; 8 * BLOCK_BYTES];
    assert!(w.volumes[0].read(2 * BS, &mut b).is_err());
    assert_eq!(read(&w, 4).unwrap(), pattern(0, 4, 1));
    assert_eq!(w.engine.snapshot().volumes[0].checksum_errors, 2, "each failed read counted");
    w.engine.shutdown().unwrap();
    drop(w);
    let r = Engine::check(cache.clone(), capacity.clone()).unwrap();
    let homes = r.homes.unwrap();
    assert_eq!(homes.verified, 32, "{r:?}");
    assert!(
        matches!(&r.damage[..], [Damage::Block { lba: 5, device: "capacity", .. }]),
        "check finds the damaged home: {r:?}"
    );
    let e = Engine::open(cache.clone(), capacity.clone()).unwrap();
    let v = e.volume("v0").unwrap();
    let mut b = vec![0u8; BLOCK_BYTES];
    assert!(matches!(v.read(5 * BS, &mut b), Err(VolumeError::Corrupt { device: "capacity", .. })));
    // Written again (home: pass-through), it reads (and checks) again.
    e.set_cache_policy("v0", CachePolicy { mode: CacheMode::PassThrough, ..CachePolicy::default() }).unwrap();
    v.write(5 * BS, &pattern(0, 5, 2), false).unwrap();
    v.flush().unwrap();
    v.read(5 * BS, &mut b).unwrap();
    assert_eq!(b, pattern(0, 5, 2));
    e.check_clean_copies().unwrap();
    e.shutdown().unwrap();
    let r = Engine::check(cache, capacity).unwrap();
    assert!(r.damage.is_empty(), "{r:?}");
}

/// Cleaning (write-back, then `clean`) records the sums of what it wrote:
/// `check` finds a home damaged after it, though reads are answered by the
/// clean cached copy.
#[test]
fn cleaned_homes_carry_sums() {
    let (c, p) = in_place_device_bytes(&[256]);
    let cache: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(c, 4096));
    let capacity: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(p, 4096));
    let w = in_place_world_on(cache.clone(), capacity.clone(), &[256]);
    for lba in 0..64 {
        w.volumes[0].write(lba * BS, &pattern(0, lba, 1), false).unwrap();
    }
    w.engine.clean(true).unwrap();
    assert_eq!(w.engine.check_clean_copies().unwrap(), 64 + 64, "64 clean copies and 64 sums");
    w.engine.shutdown().unwrap();
    drop(w);
    flip(&*capacity, 40); // (v0's homes start at block 0)
    let r = Engine::check(cache.clone(), capacity.clone()).unwrap();
    assert_eq!(r.homes.unwrap().verified, 64);
    assert!(matches!(&r.damage[..], [Damage::Block { lba: 40, .. }]), "{r:?}");
    // Salvage acts on it: the home is zeroed (not merely the cached copy
    // dropped, which would leave the block reading its damaged home), and
    // check is clean afterwards.
    let e = Engine::open(cache.clone(), capacity.clone()).unwrap();
    assert_eq!(e.salvage_found(&r.damage).unwrap(), r.damage);
    let v = e.volume("v0").unwrap();
    let mut b = vec![0u8; BLOCK_BYTES];
    v.read(40 * BS, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0), "a salvaged block reads as zeros");
    v.read(41 * BS, &mut b).unwrap();
    assert_eq!(b, pattern(0, 41, 1));
    e.shutdown().unwrap();
    drop((v, e));
    let r = Engine::check(cache, capacity).unwrap();
    assert!(r.damage.is_empty(), "{r:?}");
    assert_eq!(r.homes.unwrap().verified, 64, "the zeroed home carries a sum");
}

/// Crashes anywhere in a run of rewrites (pass-through and write-back),
/// cleaning steps and flushes: the device's table never holds a sum its
/// home does not match, and no read fails after recovery (each seed
/// replays).
#[test]
fn a_crash_never_leaves_a_false_sum() {
    for seed in 0..40u64 {
        let mut rng = sluice_media::rng::SplitMix64(seed);
        let (c, p) = in_place_device_bytes(&[128]);
        let (cache, capacity) = (Arc::new(CrashDevice::new(c, 4096)), Arc::new(CrashDevice::new(p, 4096)));
        let mut w = in_place_world_on(cache.clone(), capacity.clone(), &[128]);
        let ops = 30 + rng.below(150);
        let restart = rng.below(ops);
        for i in 0..ops {
            if i == restart {
                // A clean restart writes the table: from here on the
                // device holds sums, which rewrites must zero first.
                w.engine.shutdown().unwrap();
                let (cd, pd): (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) = (cache.clone(), capacity.clone());
                let engine = Engine::open(cd, pd).unwrap();
                w = World { volumes: vec![engine.volume("v0").unwrap()], engine };
            }
            let lba = rng.below(24);
            let mode = if rng.below(2) == 0 { CacheMode::PassThrough } else { CacheMode::WriteBack };
            w.engine.set_cache_policy("v0", CachePolicy { mode, ..CachePolicy::default() }).unwrap();
            w.volumes[0].write(lba * BS, &pattern(0, lba, i + 1), rng.below(8) == 0).unwrap();
            match rng.below(10) {
                0 => w.volumes[0].flush().unwrap(),
                1 => {
                    w.engine.clean_step(8).unwrap();
                }
                _ => {}
            }
        }
        let crash = rng.next_u64();
        let (c2, p2) = (Arc::new(cache.crash(crash)), Arc::new(capacity.crash(crash)));
        drop(w);
        let e = Engine::open(c2, p2).unwrap_or_else(|err| panic!("seed {seed}: reopen: {err}"));
        e.check_clean_copies().unwrap_or_else(|err| panic!("seed {seed}: {err}"));
        let v = e.volume("v0").unwrap();
        let mut b = vec![0u8; BLOCK_BYTES];
        for lba in 0..128 {
            v.read(lba * BS, &mut b).unwrap_or_else(|err| panic!("seed {seed}: block {lba}: {err}"));
        }
    }
}

/// An attached disk's data is unverified until `scrub_homes` records it;
/// then a block changed behind the engine's back is an error, and a disk
/// the engine finds changed at open forgets every sum.
#[test]
fn an_attached_disk_is_unverified_until_scrubbed() {
    let blocks = 600u64;
    let disk = MemoryDevice::new(blocks * BS, 4096);
    for b in 0..blocks {
        write_at(&disk, b * BS, &pattern(9, b, 1)).unwrap();
    }
    let disk: Arc<dyn BlockDevice> = Arc::new(disk);
    let cache: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(16 << 20, 4096));
    let cfg = EngineConfig { layout: Layout::InPlace, attached: true, ..crate::testkit::small_config() };
    let e = Engine::create(
        cache.clone(),
        disk.clone(),
        cfg,
        &[VolumeSpec { name: "disk".into(), size_bytes: blocks * BS }],
    )
    .unwrap();
    e.shutdown().unwrap();
    let r = Engine::check(cache.clone(), disk.clone()).unwrap();
    assert_eq!(r.homes.unwrap(), HomeSumCounts { verified: 0, unverified: blocks, pages_unreadable: 0 });
    // Unverified: a change is not seen (what the disk holds is served).
    flip(&*disk, 300);
    let e = Engine::open(cache.clone(), disk.clone()).unwrap();
    let v = e.volume("disk").unwrap();
    let mut b = vec![0u8; BLOCK_BYTES];
    v.read(300 * BS, &mut b).unwrap();
    flip(&*disk, 300);
    let c = e.scrub_homes().unwrap();
    assert_eq!((c.verified, c.unverified), (blocks, 0));
    e.shutdown().unwrap();
    // (Block 300 was read, so promoted: its cached copy answers. Block
    // 400 was not.)
    flip(&*disk, 400);
    let e = Engine::open(cache.clone(), disk.clone()).unwrap();
    let v = e.volume("disk").unwrap();
    assert!(matches!(v.read(400 * BS, &mut b), Err(VolumeError::Corrupt { device: "capacity", .. })));
    e.shutdown().unwrap();
    let r = Engine::check(cache.clone(), disk.clone()).unwrap();
    assert!(matches!(&r.damage[..], [Damage::Block { lba: 400, .. }]), "{r:?}");
    // A change the disk's identity sees (block 0 is sampled): every sum
    // forgotten, nothing refused.
    write_at(&*disk, 0, &pattern(7, 0, 7)).unwrap();
    let e = Engine::open(cache.clone(), disk.clone()).unwrap();
    assert!(e.disk_changed().is_some());
    let v = e.volume("disk").unwrap();
    v.read(400 * BS, &mut b).unwrap();
    e.shutdown().unwrap();
    assert_eq!(Engine::check(cache, disk).unwrap().homes.unwrap().verified, 0);
}

/// An engine made without home checksums (as before version 9) stays
/// version 8, verifies nothing and refuses a scrub.
#[test]
fn without_home_sums_nothing_is_verified() {
    let (c, p) = in_place_device_bytes(&[64]);
    let cache: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(c, 4096));
    let capacity: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(p, 4096));
    let cfg = EngineConfig { layout: Layout::InPlace, home_sums: false, ..crate::testkit::small_config() };
    let w = crate::testkit::small_world_with(cache.clone(), capacity.clone(), &[64], cfg);
    pass_through(&w);
    w.volumes[0].write(0, &pattern(0, 0, 1), false).unwrap();
    w.volumes[0].flush().unwrap();
    assert!(w.engine.scrub_homes().is_err());
    w.engine.shutdown().unwrap();
    drop(w);
    let sb = Engine::inspect(&*cache, &*capacity).unwrap();
    assert_eq!((sb.version, sb.home_sums), (crate::persist::SUPERBLOCK_VERSION_IN_PLACE, false));
    flip(&*capacity, 0); // (v0's homes start at block 0)
    let r = Engine::check(cache, capacity).unwrap();
    assert_eq!(r.homes.unwrap().verified, 0);
    assert!(r.damage.is_empty());
}
