//! Tests of the in-place layout (cleaning.rs) and its cache policy
//! (caching.rs): the disk as a plain copy, modes, promotion, cutoff,
//! trims, reopen and crashes.

use super::*;
use crate::testkit::{in_place_device_bytes, in_place_world, in_place_world_on, pattern, World};
use sluice_media::{CrashDevice, MemoryDevice};

fn policy(mode: CacheMode) -> CachePolicy {
    CachePolicy { mode, ..CachePolicy::default() }
}

/// Block `lba` of volume `v` as the capacity device holds it at its home.
fn at_home(w: &World, v: usize, lba: u64) -> Vec<u8> {
    let home = w.engine.home_offset(&format!("v{v}")).expect("in place");
    read_at(&*w.engine.devices().1, home + lba * BS, BLOCK_BYTES).unwrap().to_vec()
}

fn read(w: &World, v: usize, lba: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_BYTES];
    w.volumes[v].read(lba * BS, &mut b).unwrap();
    b
}

/// A directory class not yet refreshed: it matches nothing until its
/// extents arrive.
fn directory_class(name: &str, share: f64) -> IoClass {
    IoClass { extents: Some(Arc::new(Vec::new())), ..IoClass::new(name, share) }
}

/// Volume v0 write-back with no cutoff and no spill (`retain_hot` as
/// given), and one class `name` of share 1 over `range` (all if None).
fn one_class(w: &World, retain_hot: bool, name: &str, range: Option<(u64, u64)>, pinned: bool) {
    let p = CachePolicy { retain_hot, seq_cutoff: SeqCutoff::Never, spill: false, ..CachePolicy::default() };
    w.engine.set_cache_policy("v0", p).unwrap();
    let mut c = IoClass::new(name, 1.0);
    c.range = range;
    c.pinned = pinned;
    w.engine.set_io_classes("v0", vec![c]).unwrap();
}

fn stats(w: &World, v: usize) -> CacheStats {
    w.engine.cache_report()[v].stats
}

/// Version 0 is zeros (never written, or zeroed).
fn want(v: usize, lba: u64, ver: u64) -> Vec<u8> {
    if ver == 0 {
        vec![0u8; BLOCK_BYTES]
    } else {
        pattern(v, lba, ver)
    }
}

/// Write-back over a log far smaller than the volumes: every block reads
/// back its last version throughout; cleaning writes homes in runs; after
/// `clean(detach)` the capacity device alone, read at each volume's home,
/// is the volumes; and detached, writes go straight home.
#[test]
fn after_a_detach_the_disk_alone_is_every_volume() {
    let sizes = [300u64, 200];
    let w = in_place_world(&sizes);
    let mut model: Vec<Vec<u64>> = sizes.iter().map(|&n| vec![0; n as usize]).collect();
    let mut rng = sluice_media::rng::SplitMix64(7);
    for ver in 1..=2000u64 {
        let v = rng.below(2) as usize;
        let lba = rng.below(sizes[v]);
        let n = (1 + rng.below(4)).min(sizes[v] - lba);
        if ver % 97 == 0 {
            w.volumes[v].write_zeroes(lba * BS, n * BS, false).unwrap();
            (lba..lba + n).for_each(|l| model[v][l as usize] = 0);
            continue;
        }
        let data: Vec<u8> = (lba..lba + n).flat_map(|l| pattern(v, l, ver)).collect();
        w.volumes[v].write(lba * BS, &data, false).unwrap();
        (lba..lba + n).for_each(|l| model[v][l as usize] = ver);
    }
    for (v, m) in model.iter().enumerate() {
        for (lba, &ver) in m.iter().enumerate() {
            assert!(read(&w, v, lba as u64) == want(v, lba as u64, ver), "volume {v} block {lba}");
        }
    }
    w.engine.lock().check_invariants();
    let before = w.engine.cache_report();
    assert!(before.iter().all(|r| r.stats.cleaned_bytes > 0), "the log is smaller than the data: {before:?}");
    assert!(before.iter().any(|r| r.dirty_bytes > 0));
    let wrote = w.engine.clean(true).unwrap();
    assert_eq!(wrote, before.iter().map(|r| r.dirty_bytes).sum::<u64>(), "exactly the dirty blocks went home");
    assert!(w.engine.cache_report().iter().all(|r| r.dirty_bytes == 0 && r.policy.mode == CacheMode::PassThrough));
    for (v, m) in model.iter().enumerate() {
        for (lba, &ver) in m.iter().enumerate() {
            assert!(at_home(&w, v, lba as u64) == want(v, lba as u64, ver), "home of volume {v} block {lba}");
        }
    }
    // Detached: a write is on the disk at once, and not in the log (a
    // cached block's copy is dropped by a tombstone, header only).
    let is_cached = |lba: u64| w.engine.lock().vols[1].l2p.get(lba as usize).unwrap().cache_block().is_some();
    let cached = (0..200).find(|&l| is_cached(l)).expect("clean copies stay cached");
    let uncached = (0..200).find(|&l| !is_cached(l)).expect("some blocks are at home");
    for (lba, logged) in [(cached, BS), (uncached, 0)] {
        let cache_before = w.engine.stats().cache_write_bytes;
        w.volumes[1].write(lba * BS, &pattern(1, lba, 9999), false).unwrap();
        assert!(at_home(&w, 1, lba) == pattern(1, lba, 9999));
        assert!(read(&w, 1, lba) == pattern(1, lba, 9999));
        assert_eq!(w.engine.stats().cache_write_bytes - cache_before, logged);
    }
    w.engine.lock().check_invariants();
}

/// Each mode sends writes where Open CAS does, and reads of any cached
/// block come from the log whatever the mode.
#[test]
fn each_mode_routes_writes_and_a_mode_change_keeps_dirty_data() {
    let w = in_place_world(&[64]);
    let (e, v) = (&w.engine, &w.volumes[0]);
    // Write-back: in the log, the home untouched.
    v.write(0, &pattern(0, 0, 1), false).unwrap();
    assert!(at_home(&w, 0, 0) == vec![0u8; BLOCK_BYTES]);
    assert_eq!(e.cache_report()[0].dirty_bytes, BS);
    // Write-through: home and log, clean.
    e.set_cache_policy("v0", policy(CacheMode::WriteThrough)).unwrap();
    v.write(BS, &pattern(0, 1, 1), false).unwrap();
    assert!(at_home(&w, 0, 1) == pattern(0, 1, 1));
    assert_eq!((e.cache_report()[0].cached_bytes, e.cache_report()[0].dirty_bytes), (2 * BS, BS));
    // Write-around: an uncached block goes home only; a cached one is
    // updated in both places.
    e.set_cache_policy("v0", policy(CacheMode::WriteAround)).unwrap();
    let cached_before = e.cache_report()[0].cached_bytes;
    v.write(2 * BS, &pattern(0, 2, 1), false).unwrap();
    assert!(at_home(&w, 0, 2) == pattern(0, 2, 1));
    assert_eq!(e.cache_report()[0].cached_bytes, cached_before);
    v.write(0, &pattern(0, 0, 2), false).unwrap();
    assert!(at_home(&w, 0, 0) == pattern(0, 0, 2));
    assert!(read(&w, 0, 0) == pattern(0, 0, 2));
    assert_eq!(e.cache_report()[0].dirty_bytes, 0, "the dirty copy was replaced by a clean one");
    // Write-invalidate: home, the cached copy dropped.
    e.set_cache_policy("v0", policy(CacheMode::WriteInvalidate)).unwrap();
    v.write(BS, &pattern(0, 1, 2), false).unwrap();
    assert!(at_home(&w, 0, 1) == pattern(0, 1, 2) && read(&w, 0, 1) == pattern(0, 1, 2));
    // A mode change leaves dirty data where it is, and reads find it.
    e.set_cache_policy("v0", policy(CacheMode::WriteBack)).unwrap();
    v.write(3 * BS, &pattern(0, 3, 1), false).unwrap();
    e.set_cache_policy("v0", policy(CacheMode::PassThrough)).unwrap();
    assert!(read(&w, 0, 3) == pattern(0, 3, 1), "pass-through reads the dirty copy");
    assert!(at_home(&w, 0, 3) == vec![0u8; BLOCK_BYTES]);
    let s = stats(&w, 0);
    assert_eq!((s.write_back_bytes, s.write_through_bytes, s.write_past_bytes), (2 * BS, 2 * BS, 2 * BS), "{s:?}");
    // Bands engines have no cache policy.
    let bands = crate::testkit::small_world(&[64]);
    assert!(matches!(bands.engine.set_cache_policy("v0", CachePolicy::default()), Err(EngineError::Config(_))));
    assert!(matches!(bands.engine.clean(false), Err(EngineError::Config(_))));
    e.lock().check_invariants();
}

/// A block read from home is promoted into the log (clean) on its n-th
/// miss, then hits; pass-through never promotes; a home written between
/// the read and its promotion voids it.
#[test]
fn reads_promote_blocks_from_home_after_their_misses() {
    let w = in_place_world(&[64]);
    let e = &w.engine;
    // The disk already holds data (as a plain disk would).
    let home = e.home_offset("v0").unwrap();
    for lba in 0..64 {
        write_at(&*e.devices().1, home + lba * BS, &pattern(0, lba, 5)).unwrap();
    }
    assert!(read(&w, 0, 1) == pattern(0, 1, 5));
    assert_eq!((stats(&w, 0).read_miss_bytes, stats(&w, 0).promoted_bytes), (BS, BS));
    assert!(read(&w, 0, 1) == pattern(0, 1, 5));
    assert_eq!(stats(&w, 0).read_hit_bytes, BS);
    assert_eq!(e.cache_report()[0].dirty_bytes, 0, "promoted blocks are clean");
    e.set_cache_policy("v0", CachePolicy { promote_after_misses: 2, ..CachePolicy::default() }).unwrap();
    read(&w, 0, 2);
    assert_eq!(stats(&w, 0).promoted_bytes, BS, "one miss is not enough");
    read(&w, 0, 2);
    assert_eq!(stats(&w, 0).promoted_bytes, 2 * BS);
    e.set_cache_policy("v0", policy(CacheMode::PassThrough)).unwrap();
    read(&w, 0, 3);
    assert_eq!(stats(&w, 0).promoted_bytes, 2 * BS, "pass-through promotes nothing");
    // A stale promotion is dropped.
    e.set_cache_policy("v0", CachePolicy::default()).unwrap();
    let gen = e.lock().vols[0].cache.home_gen();
    e.change(|e, inner| e.write_past_log(inner, 0, 4, 1, Some(&pattern(0, 4, 6)))).unwrap();
    e.change(|e, inner| e.promote(inner, 0, 4, &pattern(0, 4, 5), gen, 1)).unwrap();
    assert!(read(&w, 0, 4) == pattern(0, 4, 6), "the old bytes were not promoted over the new home");
    e.lock().check_invariants();
}

/// Trimmed dirty blocks are never written home, and counted; zeroed
/// blocks read as zeros (written home).
#[test]
fn a_trim_frees_dirty_blocks_without_touching_the_disk() {
    let w = in_place_world(&[128]);
    let (e, v) = (&w.engine, &w.volumes[0]);
    let data: Vec<u8> = (0..16).flat_map(|l| pattern(0, l, 1)).collect();
    v.write(0, &data, false).unwrap();
    v.trim(0, 8 * BS).unwrap();
    assert_eq!(stats(&w, 0).discarded_dirty_bytes, 8 * BS);
    v.write_zeroes(8 * BS, 4 * BS, false).unwrap();
    assert!(read(&w, 0, 9) == vec![0u8; BLOCK_BYTES]);
    let cap = e.devices().1.stats().host_write_bytes;
    assert_eq!(e.clean(false).unwrap(), 4 * BS, "only the four blocks neither trimmed nor zeroed");
    assert!(e.devices().1.stats().host_write_bytes - cap == 4 * BS);
    assert!(at_home(&w, 0, 12) == pattern(0, 12, 1) && at_home(&w, 0, 2) == vec![0u8; BLOCK_BYTES]);
}

/// A stream longer than the cutoff goes home past the log (stale cached
/// copies dropped); random writes stay cached.
#[test]
fn a_long_sequential_stream_bypasses_the_cache() {
    let w = in_place_world(&[1024]);
    let (e, v) = (&w.engine, &w.volumes[0]);
    e.set_cache_policy("v0", CachePolicy { seq_cutoff_bytes: 256 << 10, ..CachePolicy::default() }).unwrap();
    v.write(100 * BS, &pattern(0, 100, 1), false).unwrap();
    for i in 0..32u64 {
        let data: Vec<u8> = (i * 16..i * 16 + 16).flat_map(|l| pattern(0, l, 2)).collect();
        v.write(i * 16 * BS, &data, false).unwrap();
    }
    let s = stats(&w, 0);
    assert_eq!(s.write_back_bytes, BS + (256 << 10), "{s:?}");
    assert_eq!(s.cutoff_bypass_bytes, (2 << 20) - (256 << 10));
    assert!(read(&w, 0, 100) == pattern(0, 100, 2) && at_home(&w, 0, 100) == pattern(0, 100, 2));
    e.set_cache_policy("v0", CachePolicy { seq_cutoff: SeqCutoff::Never, ..CachePolicy::default() }).unwrap();
    v.write(500 * BS, &vec![1u8; 1 << 20], false).unwrap();
    v.write((500 + 256) * BS, &vec![1u8; 1 << 20], false).unwrap();
    assert_eq!(stats(&w, 0).cutoff_bypass_bytes, s.cutoff_bypass_bytes);
    e.lock().check_invariants();
}

/// The hazard the head mark guards: a block cached, cleaned and its chunk
/// freed, then written home past the log (no tombstone: nothing cached)
/// and flushed. A crash must not bring the freed chunk's old copy back.
#[test]
fn a_home_write_after_its_cached_copy_was_freed_survives_a_crash() {
    let (c, p) = in_place_device_bytes(&[256]);
    let (cache, capacity) = (Arc::new(CrashDevice::new(c, 4096)), Arc::new(CrashDevice::new(p, 4096)));
    let w = in_place_world_on(cache.clone(), capacity.clone(), &[256]);
    let v = &w.volumes[0];
    v.write(7 * BS, &pattern(0, 7, 1), false).unwrap();
    // Enough other writes that block 7's chunk is cleaned and freed.
    for i in 0..600u64 {
        v.write((100 + i % 150) * BS, &pattern(0, 100 + i % 150, 2), false).unwrap();
    }
    assert!(w.engine.lock().vols[0].l2p.get(7).unwrap().is_none(), "block 7 is at home");
    w.engine.set_cache_policy("v0", policy(CacheMode::WriteAround)).unwrap();
    v.write(7 * BS, &pattern(0, 7, 3), false).unwrap();
    v.flush().unwrap();
    for seed in 0..8 {
        let (c2, p2) = (Arc::new(cache.crash(seed)), Arc::new(capacity.crash(seed)));
        let e = Engine::open(c2, p2).unwrap();
        let mut b = vec![0u8; BLOCK_BYTES];
        e.volume("v0").unwrap().read(7 * BS, &mut b).unwrap();
        assert!(b == pattern(0, 7, 3), "seed {seed}: the flushed home write survives");
    }
}

/// Crash simulation of the in-place layout: random writes (every mode,
/// with mode changes, hot-block retention and pinned classes), zeroing,
/// trims, flushes, reads and cleaning, then a
/// crash at a random point and a reopen. Every block must read as its last
/// flushed version or a version written after it; reopening cleanly after
/// that must change nothing. Seeds replay exactly (printed on failure);
/// `SLUICE_IN_PLACE_SEEDS` runs more than the default 400.
#[test]
fn in_place_crash_simulation() {
    let seeds: u64 = std::env::var("SLUICE_IN_PLACE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(400);
    for seed in 0..seeds {
        in_place_crash_seed(seed);
    }
}

fn in_place_crash_seed(seed: u64) {
    let mut rng = sluice_media::rng::SplitMix64(seed);
    let sizes = [96u64, 160];
    let (c, p) = in_place_device_bytes(&sizes);
    let (cache, capacity) = (Arc::new(CrashDevice::new(c, 4096)), Arc::new(CrashDevice::new(p, 4096)));
    let w = in_place_world_on(cache.clone(), capacity.clone(), &sizes);
    // Per block: the version a flush made durable, and every version since
    // (u64::MAX: trimmed, anything goes).
    let mut ok: Vec<Vec<Vec<u64>>> = sizes.iter().map(|&n| vec![vec![0]; n as usize]).collect();
    let modes = [CacheMode::WriteBack, CacheMode::WriteThrough, CacheMode::WriteAround, CacheMode::WriteInvalidate];
    let ops = 20 + rng.below(400);
    for ver in 1..=ops {
        let v = rng.below(2) as usize;
        let lba = rng.below(sizes[v]);
        let n = (1 + rng.below(8)).min(sizes[v] - lba);
        match rng.below(100) {
            0..=5 => {
                let mode = modes[rng.below(4) as usize];
                let cutoff = [4096, 64 << 10, 1 << 20][rng.below(3) as usize];
                let retain_hot = rng.below(2) == 0;
                let p = CachePolicy { mode, seq_cutoff_bytes: cutoff, retain_hot, ..CachePolicy::default() };
                w.engine.set_cache_policy(&format!("v{v}"), p).unwrap();
                if rng.below(2) == 0 {
                    let mut c = IoClass::new("c", [0.0, 0.1, 0.5][rng.below(3) as usize]);
                    c.range = Some((lba * BS, (lba + 32) * BS));
                    c.pinned = rng.below(2) == 0;
                    w.engine.set_io_classes(&format!("v{v}"), vec![c]).unwrap();
                }
            }
            6..=7 => {
                w.volumes[v].trim(lba * BS, n * BS).unwrap();
                (lba..lba + n).for_each(|l| ok[v][l as usize] = vec![u64::MAX]);
            }
            8..=9 => {
                w.volumes[v].write_zeroes(lba * BS, n * BS, false).unwrap();
                (lba..lba + n).for_each(|l| ok[v][l as usize].push(0));
            }
            10..=14 => {
                w.volumes[v].flush().unwrap();
                for m in ok.iter_mut() {
                    for b in m.iter_mut() {
                        let last = *b.last().unwrap();
                        *b = vec![last];
                    }
                }
            }
            15..=16 => {
                w.engine.clean(false).unwrap();
            }
            17..=24 => {
                let mut b = vec![0u8; (n * BS) as usize];
                w.volumes[v].read(lba * BS, &mut b).unwrap();
                for (i, got) in b.chunks(BLOCK_BYTES).enumerate() {
                    let l = lba + i as u64;
                    let last = *ok[v][l as usize].last().unwrap();
                    assert!(last == u64::MAX || got == want(v, l, last), "seed {seed}: read of volume {v} block {l}");
                }
            }
            _ => {
                let data: Vec<u8> = (lba..lba + n).flat_map(|l| pattern(v, l, ver)).collect();
                w.volumes[v].write(lba * BS, &data, rng.below(20) == 0).unwrap();
                (lba..lba + n).for_each(|l| ok[v][l as usize].push(ver));
            }
        }
    }
    w.engine.lock().check_invariants();
    let crash = rng.next_u64();
    let (c2, p2) = (Arc::new(cache.crash(crash)), Arc::new(capacity.crash(crash)));
    let e = Engine::open(c2.clone(), p2.clone()).unwrap_or_else(|err| panic!("seed {seed}: reopen: {err}"));
    e.lock().check_invariants();
    // (Clean copies match their homes; every home with a sum matches it.)
    e.check_clean_copies().unwrap_or_else(|err| panic!("seed {seed}: {err}"));
    let check = |e: &Arc<Engine>, when: &str| {
        for (v, m) in ok.iter().enumerate() {
            let vol = e.volume(&format!("v{v}")).unwrap();
            for (lba, vers) in m.iter().enumerate() {
                let mut b = vec![0u8; BLOCK_BYTES];
                vol.read(lba as u64 * BS, &mut b).unwrap();
                if vers[0] == u64::MAX {
                    continue;
                }
                assert!(
                    vers.iter().any(|&ver| ver != u64::MAX && b == want(v, lba as u64, ver)),
                    "seed {seed} {when}: volume {v} block {lba} reads none of versions {vers:?}"
                );
            }
        }
    };
    check(&e, "after the crash");
    // What the reopened engine serves, it keeps through a clean restart and
    // a detach.
    let snap: Vec<Vec<u8>> = (0..2)
        .map(|v| {
            let mut b = vec![0u8; (sizes[v] * BS) as usize];
            e.volume(&format!("v{v}")).unwrap().read(0, &mut b).unwrap();
            b
        })
        .collect();
    e.shutdown().unwrap();
    drop(e);
    let e = Engine::open(c2, p2.clone()).unwrap();
    e.clean(true).unwrap();
    for (v, want) in snap.iter().enumerate() {
        let home = e.home_offset(&format!("v{v}")).unwrap();
        let got = read_at(&*p2, home, want.len()).unwrap();
        assert!(got[..] == want[..], "seed {seed}: volume {v} on the disk after the detach");
    }
}

/// A log full of dirty data that lives on: writes spill home instead of
/// waiting for cleaning, each spilled write cleans its share of the oldest
/// chunk (no background compactor here), so the log drains and writes are
/// cached again; every block reads its last version. Without spill, the
/// same writes are cleaned into the log instead.
#[test]
fn a_full_log_spills_writes_home_and_drains() {
    let blocks = 2048u64;
    let w = in_place_world(&[blocks]);
    let (e, v) = (&w.engine, &w.volumes[0]);
    let mut model = vec![0u64; blocks as usize];
    let mut rng = sluice_media::rng::SplitMix64(3);
    for ver in 1..=3000u64 {
        let lba = rng.below(blocks);
        v.write(lba * BS, &pattern(0, lba, ver), false).unwrap();
        model[lba as usize] = ver;
    }
    let s = stats(&w, 0);
    assert!(s.spill_bytes > 0 && s.write_back_bytes > 0, "{s:?}");
    assert!(s.cleaned_bytes > 0, "spilled writes cleaned the oldest chunk");
    for (lba, &ver) in model.iter().enumerate() {
        assert!(read(&w, 0, lba as u64) == want(0, lba as u64, ver), "block {lba}");
    }
    e.lock().check_invariants();
    e.set_cache_policy("v0", CachePolicy { spill: false, ..CachePolicy::default() }).unwrap();
    let spilled = stats(&w, 0).spill_bytes;
    for ver in 3001..=3500u64 {
        let lba = rng.below(blocks);
        v.write(lba * BS, &pattern(0, lba, ver), false).unwrap();
    }
    assert_eq!(stats(&w, 0).spill_bytes, spilled, "no spill when it is off");
}

/// Two sequential writers interleaved on one volume each keep their
/// stream: both pass the cutoff.
#[test]
fn interleaved_streams_are_each_cut_off() {
    let w = in_place_world(&[2048]);
    let (e, v) = (&w.engine, &w.volumes[0]);
    e.set_cache_policy("v0", CachePolicy { seq_cutoff_bytes: 128 << 10, ..CachePolicy::default() }).unwrap();
    for i in 0..32u64 {
        for base in [0u64, 1024] {
            let lba = base + i * 16;
            let data: Vec<u8> = (lba..lba + 16).flat_map(|l| pattern(0, l, 1)).collect();
            v.write(lba * BS, &data, false).unwrap();
        }
    }
    let s = stats(&w, 0);
    assert_eq!(s.write_back_bytes, 2 * (128 << 10), "{s:?}");
    assert_eq!(s.cutoff_bypass_bytes, 2 * ((2 << 20) - (128 << 10)));
}

/// I/O classes: a range at share 0 is never cached (its writes go home,
/// its reads are not promoted); a class at share 1/4 holds at most a
/// quarter of the log and spills the rest; the rest is unclassified and
/// cached as usual; every class's occupancy matches its cached blocks.
#[test]
fn io_classes_bypass_cap_and_count_their_requests() {
    let w = in_place_world(&[2048]);
    let (e, v) = (&w.engine, &w.volumes[0]);
    let log_blocks = {
        let inner = e.lock();
        inner.log.chunk_count() as u64 * inner.blocks_per_chunk()
    };
    let mut never = IoClass::new("bulk", 0.0);
    never.range = Some((1024 * BS, 2048 * BS));
    let mut quarter = IoClass::new("temp", 0.25);
    quarter.range = Some((0, 512 * BS));
    quarter.direction = Some(ClassDirection::Write);
    e.set_io_classes("v0", vec![never, quarter]).unwrap();
    for lba in 0..512u64 {
        v.write(lba * BS, &pattern(0, lba, 1), false).unwrap();
    }
    for lba in (512..1024u64).step_by(4) {
        v.write(lba * BS, &pattern(0, lba, 1), false).unwrap();
    }
    for lba in (1024..1100u64).step_by(3) {
        v.write(lba * BS, &pattern(0, lba, 1), false).unwrap();
    }
    let rep = &e.cache_report()[0];
    let by = |name: &str| rep.classes.iter().find(|c| c.class == name).unwrap().clone();
    let (bulk, temp, rest) = (by("bulk"), by("temp"), by("unclassified"));
    assert_eq!(bulk.bypass_bytes, 26 * BS, "{bulk:?}");
    assert_eq!(bulk.cached_bytes, 0);
    assert!(temp.spill_bytes > 0 && temp.cached_bytes <= log_blocks * BS / 4, "{temp:?}");
    assert_eq!(temp.write_bytes, 512 * BS);
    assert_eq!(rest.write_bytes, 128 * BS);
    assert_eq!(rep.stats.class_bypass_bytes, 26 * BS);
    e.lock().check_invariants();
    // A bulk read is served from home and not promoted.
    let promoted = rep.stats.promoted_bytes;
    assert!(read(&w, 0, 1500) == vec![0u8; BLOCK_BYTES]);
    assert_eq!(stats(&w, 0).promoted_bytes, promoted);
    for lba in (0..1100u64).filter(|l| *l < 512 || (*l < 1024 && l % 4 == 0) || (*l >= 1024 && (l - 1024) % 3 == 0)) {
        assert!(read(&w, 0, lba) == pattern(0, lba, 1), "block {lba}");
    }
    // Classes are an in-place setting, bounded.
    assert!(e.set_io_classes("v0", vec![IoClass::new("x", 1.5)]).is_err());
    let bands = crate::testkit::small_world(&[64]);
    assert!(matches!(bands.engine.set_io_classes("v0", vec![]), Err(EngineError::Config(_))));
}

/// `sluice check` reads an in-place engine after a crash and finds no
/// damage; a flipped bit in a cached block is found, named by its LBA.
#[test]
fn check_reads_an_in_place_engine_and_finds_damage_in_the_log() {
    let (c, p) = in_place_device_bytes(&[256]);
    let (cache, capacity) = (Arc::new(CrashDevice::new(c, 4096)), Arc::new(CrashDevice::new(p, 4096)));
    let w = in_place_world_on(cache.clone(), capacity.clone(), &[256]);
    for lba in 0..100u64 {
        w.volumes[0].write(lba * BS, &pattern(0, lba, 1), false).unwrap();
    }
    w.volumes[0].flush().unwrap();
    // A later record carries the flush's watermark: block 99's record is
    // then known durable, so a bad byte in it is damage, not a torn write.
    w.volumes[0].write(100 * BS, &pattern(0, 100, 1), false).unwrap();
    let cb = w.engine.lock().vols[0].l2p.get(99).unwrap().cache_block().expect("block 99 is cached");
    let (c2, p2): (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) =
        (Arc::new(cache.crash(1)), Arc::new(capacity.crash(1)));
    let report = Engine::check(c2.clone(), p2.clone()).unwrap();
    assert!(report.damage.is_empty(), "{:?}", report.damage);
    let mut b = read_at(&*c2, cb * BS, BLOCK_BYTES).unwrap().to_vec();
    b[100] ^= 1;
    write_at(&*c2, cb * BS, &b).unwrap();
    let report = Engine::check(c2, p2).unwrap();
    assert!(report.damage.iter().any(|d| d.to_string().contains("99")), "{:?}", report.damage);
}

/// A directory class: an ext4 image written onto an in-place volume, the
/// blocks of `/yarn`'s files found by reading the file system through the
/// volume; writes to them are that class's (here never cached), writes
/// elsewhere are unclassified and cached; a block cached before the class
/// knew its file is re-classified when the extents arrive.
#[test]
fn a_directory_class_selects_the_blocks_of_its_files() {
    let dir = std::env::temp_dir().join(format!("sluice-dirclass-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = dir.join("src");
    for (path, len) in [("yarn/spill0", 200_000usize), ("yarn/sub/spill1", 70_000), ("hdfs/blk_1", 300_000)] {
        let p = src.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, vec![path.len() as u8; len]).unwrap();
    }
    let img = dir.join("fs.img");
    let out = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-d"])
        .arg(&src)
        .arg(&img)
        .arg("8M")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let image = std::fs::read(&img).unwrap();
    let w = in_place_world(&[2048]);
    let (e, v) = (&w.engine, &w.volumes[0]);
    v.write(0, &image, false).unwrap();
    let yarn = sluice_ext4::volume_directory_extents(v, "/yarn").unwrap();
    assert!(!yarn.is_empty());
    e.set_io_classes("v0", vec![directory_class("yarn", 0.0)]).unwrap();
    let (first, _) = yarn[0];
    // Not yet refreshed: nothing belongs to the class.
    v.write(first, &pattern(0, first / BS, 2), false).unwrap();
    assert_eq!(stats(&w, 0).class_bypass_bytes, 0);
    // Lazily: the blocks of /yarn files cached before the refresh (that
    // one, and any the image's first, cached MiB holds) are the class's now.
    let cached_in_yarn = (yarn.iter().flat_map(|&(a, b)| a / BS..b.div_ceil(BS)))
        .filter(|&l| e.lock().vols[0].l2p.get(l as usize).unwrap().cache_block().is_some())
        .count() as u64;
    assert!(cached_in_yarn >= 1);
    e.set_class_extents("v0", "yarn", yarn.clone()).unwrap();
    let yarn_stats = || e.cache_report()[0].classes[1].clone();
    assert_eq!(
        (yarn_stats().reclassified_bytes, yarn_stats().cached_bytes),
        (cached_in_yarn * BS, cached_in_yarn * BS)
    );
    e.set_class_extents("v0", "yarn", yarn.clone()).unwrap();
    assert_eq!(yarn_stats().reclassified_bytes, cached_in_yarn * BS, "counted once");
    e.lock().check_invariants();
    v.write(first, &pattern(0, first / BS, 3), false).unwrap();
    assert_eq!(stats(&w, 0).class_bypass_bytes, BS, "a block of a /yarn file is the class's");
    let outside = (0..2048u64).map(|l| l * BS).find(|&o| !yarn.iter().any(|&(a, b)| (a..b).contains(&o))).unwrap();
    v.write(outside, &pattern(0, outside / BS, 3), false).unwrap();
    assert_eq!(stats(&w, 0).class_bypass_bytes, BS, "other blocks are unclassified");
    assert!(read(&w, 0, first / BS) == pattern(0, first / BS, 3));
    e.lock().check_invariants();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Background cleaning: with ACP the compactor writes every dirty block
/// home ahead of need (the home then holds it, the copy stays cached and
/// clean); with ALRU, chunks sealed longer than the age are cleaned and
/// younger ones are not while the log is under the dirty set point, and
/// aged ones wait until requests have paused for `idle`; with
/// none, nothing is cleaned ahead. Bands engines refuse a policy.
#[test]
fn background_cleaning_follows_its_policy() {
    let run = |cleaning: Cleaning| -> (World, CacheReport) {
        let w = in_place_world(&[512]);
        w.engine.set_cleaning(cleaning).unwrap();
        // A chunk and a half of 4-block writes (seals one chunk), under the
        // compactor's start level: nothing is reclaimed.
        for i in 0..20u64 {
            let data: Vec<u8> = (i * 4..i * 4 + 4).flat_map(|l| pattern(0, l, 1)).collect();
            w.volumes[0].write(i * 4 * BS, &data, false).unwrap();
        }
        let c = w.engine.start_compactor(CompactorConfig::default()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let want_clean = cleaning.mode == CleaningMode::Acp
            || cleaning.mode == CleaningMode::Alru && cleaning.age.is_zero() && cleaning.idle.as_secs() < 60;
        while want_clean && w.engine.cache_report()[0].stats.cleaned_bytes == 0 && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // Give a wrong policy time to act before looking.
        std::thread::sleep(std::time::Duration::from_millis(200));
        drop(c);
        let rep = w.engine.cache_report()[0].clone();
        (w, rep)
    };
    let dirty0 = 80 * BS;
    let (w, acp) = run(Cleaning { mode: CleaningMode::Acp, age: std::time::Duration::ZERO, ..Cleaning::default() });
    // Every sealed chunk is cleaned; the open one is not (it is still taking writes).
    assert!(acp.dirty_bytes < dirty0 && acp.stats.cleaned_bytes > 0, "{acp:?}");
    assert!(acp.cached_bytes == dirty0, "cleaned copies stay cached: {acp:?}");
    assert!(at_home(&w, 0, 0) == pattern(0, 0, 1));
    let (_, young) = run(Cleaning {
        mode: CleaningMode::Alru,
        age: std::time::Duration::from_secs(3600),
        dirty_setpoint: 1.0,
        ..Cleaning::default()
    });
    assert_eq!(
        (young.dirty_bytes, young.stats.cleaned_bytes),
        (dirty0, 0),
        "young chunks under the set point stay dirty"
    );
    let (_, old) = run(Cleaning { mode: CleaningMode::Alru, age: std::time::Duration::ZERO, ..Cleaning::default() });
    assert!(old.stats.cleaned_bytes > 0, "{old:?}");
    let (_, busy) = run(Cleaning {
        mode: CleaningMode::Alru,
        age: std::time::Duration::ZERO,
        idle: std::time::Duration::from_secs(3600),
        dirty_setpoint: 1.0,
        ..Cleaning::default()
    });
    assert_eq!(busy.stats.cleaned_bytes, 0, "aged chunks wait for requests to pause for `idle`");
    let (_, none) = run(Cleaning::default());
    assert_eq!((none.dirty_bytes, none.stats.cleaned_bytes), (dirty0, 0));
    let bands = crate::testkit::small_world(&[64]);
    assert!(bands.engine.set_cleaning(Cleaning::default()).is_err());
}

/// ALRU past its dirty set point (chunks far younger than its age): the
/// controller cleans the log down to the set point, oldest chunk first,
/// and then stops — it does not clean what is under the set point.
#[test]
fn alru_past_its_set_point_cleans_down_to_it_and_no_further() {
    let w = in_place_world(&[512]);
    let setpoint = 0.1;
    w.engine
        .set_cleaning(Cleaning {
            mode: CleaningMode::Alru,
            dirty_setpoint: setpoint,
            age: std::time::Duration::from_secs(3600),
            response: std::time::Duration::from_millis(50),
            ..Cleaning::default()
        })
        .unwrap();
    // Three chunks and a bit of 4-block writes: 30 % of the log dirty, and
    // the log above the compactor's start level (nothing is reclaimed).
    for i in 0..38u64 {
        let data: Vec<u8> = (i * 4..i * 4 + 4).flat_map(|l| pattern(0, l, 1)).collect();
        w.volumes[0].write(i * 4 * BS, &data, false).unwrap();
    }
    let (dirty0, total) = w.engine.lock().dirty_blocks();
    assert!(dirty0 as f64 > 2.5 * setpoint * total as f64, "{dirty0} of {total}");
    let target = (setpoint * total as f64) as u64;
    let c = w.engine.start_compactor(CompactorConfig::default()).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while w.engine.lock().dirty_blocks().0 > target && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Under the set point, cleaning stops (the paced rate reads 0 again).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while w.engine.compactor_snapshot().cleaning_rate_bytes_per_s != 0.0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(w.engine.compactor_snapshot().cleaning_rate_bytes_per_s, 0.0, "paced cleaning stopped");
    drop(c);
    let dirty = w.engine.lock().dirty_blocks().0;
    let step = w.engine.lock().blocks_per_chunk() / 16;
    assert!(dirty <= target && dirty + step >= target, "dirty {dirty} blocks, set point {target} (step {step})");
    assert_eq!(w.engine.cache_report()[0].stats.cleaned_bytes, (dirty0 - dirty) * BS);
    assert!(at_home(&w, 0, 0) == pattern(0, 0, 1), "the oldest blocks were cleaned first");
    w.engine.lock().check_invariants();
}

/// Eviction: a reclaim keeps the blocks reads found since they were logged
/// when the volume retains hot blocks (a second chance), and a pinned
/// class's blocks always; otherwise it evicts oldest-first. Cold writes
/// wrap the log several times; the hot blocks are read once per lap of
/// about half the log (so FIFO evicts a promoted copy every other lap).
#[test]
fn reclaim_keeps_hot_and_pinned_blocks_and_evicts_the_rest() {
    let run = |retain_hot: bool, pinned: bool| -> (CacheStats, u64) {
        let w = in_place_world(&[2048]);
        let v = &w.volumes[0];
        one_class(&w, retain_hot, "hot", Some((0, 8 * BS)), pinned);
        let hot: Vec<u8> = (0..8).flat_map(|l| pattern(0, l, 1)).collect();
        v.write(0, &hot, false).unwrap();
        let log_blocks = w.engine.lock().dirty_blocks().1;
        let mut lba = 100;
        for lap in 0..8u64 {
            let mut b = vec![0u8; hot.len()];
            v.read(0, &mut b).unwrap();
            assert!(b == hot, "lap {lap}");
            while lba < 100 + (lap + 1) * (log_blocks * 35 / 100) {
                let data: Vec<u8> = (lba..lba + 4).flat_map(|l| pattern(0, l, 2)).collect();
                v.write(lba * BS, &data, false).unwrap();
                lba += 4;
            }
        }
        let mut b = vec![0u8; hot.len()];
        v.read(0, &mut b).unwrap();
        assert!(b == hot);
        let (st, cached) = (stats(&w, 0), w.engine.cache_report()[0].classes[1].cached_bytes);
        // No block is written twice: every block that entered the log
        // (written or promoted; a retained one moves, it does not enter) is
        // still cached or was evicted.
        let in_log = w.engine.cache_report()[0].cached_bytes;
        assert_eq!(st.write_back_bytes + st.promoted_bytes, in_log + st.evicted_bytes, "{st:?}");
        assert!(read(&w, 0, 100) == pattern(0, 100, 2));
        w.engine.lock().check_invariants();
        (st, cached)
    };
    let hot_bytes = 8 * BS;
    let (fifo, _) = run(false, false);
    assert_eq!(fifo.retained_bytes, 0);
    assert!(fifo.read_miss_bytes >= 3 * hot_bytes, "FIFO: reads miss every other lap: {fifo:?}");
    assert!(fifo.evicted_bytes >= 3 * hot_bytes, "FIFO evicts the hot blocks too: {fifo:?}");
    let (hot, hot_cached) = run(true, false);
    assert_eq!(hot.read_miss_bytes, 0, "second chance: every read hits: {hot:?}");
    assert!(hot.retained_bytes >= 3 * hot_bytes, "{hot:?}");
    assert_eq!(hot_cached, hot_bytes, "the hot blocks are cached at the end");
    let (pin, pin_cached) = run(false, true);
    assert_eq!(pin.read_miss_bytes, 0, "pinned: never evicted: {pin:?}");
    assert_eq!(pin_cached, hot_bytes);
}

/// Lazy re-classification finds the same blocks whether it walks the
/// class's extents (smaller than the log) or the log (extents larger).
#[test]
fn reclassification_walks_the_extents_or_the_log_alike() {
    for extents in [vec![(0, 2048 * BS)], vec![(10 * BS, 11 * BS), (1500 * BS, 1600 * BS)]] {
        let w = in_place_world(&[2048]);
        w.engine.set_io_classes("v0", vec![directory_class("late", 1.0)]).unwrap();
        for lba in [10u64, 500, 1500] {
            w.volumes[0].write(lba * BS, &pattern(0, lba, 1), false).unwrap();
        }
        let log_blocks = w.engine.lock().dirty_blocks().1;
        let covered = extents.iter().map(|&(a, b)| (b - a) / BS).sum::<u64>();
        let want = if covered > log_blocks { 3 } else { 2 };
        w.engine.set_class_extents("v0", "late", extents).unwrap();
        let late = w.engine.cache_report()[0].classes[1].clone();
        assert_eq!((late.reclassified_bytes, late.cached_bytes), (want * BS, want * BS), "{covered} blocks of extents");
        w.engine.lock().check_invariants();
    }
}

/// A clean stop keeps the cache warm and clean: the blocks cleaning wrote
/// home stay cached and clean across the reopen (the checkpoint keeps
/// their clean bits, superblock version 7), so cleaning again writes only
/// what was written since. Before, every reopen counted every cached block
/// dirty, and `sluice clean` run twice around a restart wrote everything
/// home twice.
#[test]
fn a_clean_restart_keeps_cleaned_blocks_clean() {
    let sizes = [200u64];
    let (c, p) = in_place_device_bytes(&sizes);
    let (cache, capacity): (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) =
        (Arc::new(sluice_media::MemoryDevice::new(c, 4096)), Arc::new(sluice_media::MemoryDevice::new(p, 4096)));
    let w = in_place_world_on(cache.clone(), capacity.clone(), &sizes);
    for lba in 0..100 {
        w.volumes[0].write(lba * BS, &pattern(0, lba, 1), false).unwrap();
    }
    let cleaned = w.engine.clean(false).unwrap();
    let before = w.engine.cache_report()[0].clone();
    assert!(cleaned > 0 && before.dirty_bytes == 0 && before.cached_bytes > 0, "{before:?}");
    w.volumes[0].write(150 * BS, &pattern(0, 150, 2), false).unwrap();
    w.engine.shutdown().unwrap();
    drop(w);
    let e = Engine::open(cache, capacity).unwrap();
    let after = e.cache_report()[0].clone();
    assert_eq!((after.cached_bytes, after.dirty_bytes), (before.cached_bytes + BS, BS), "{after:?}");
    assert_eq!(e.clean(false).unwrap(), BS, "only the block written since the last clean goes home");
    e.lock().check_invariants();
    let v = e.volume("v0").unwrap();
    let mut b = vec![0u8; BLOCK_BYTES];
    for lba in (0..100).chain([150]) {
        v.read(lba * BS, &mut b).unwrap();
        assert!(b == pattern(0, lba, if lba == 150 { 2 } else { 1 }), "block {lba}");
    }
}

/// An engine created before superblock version 7 sized its checkpoint
/// region for version 6's checkpoint, which has no clean bits. When
/// version 7's does not fit, the shutdown writes version 6's (the cache is
/// all dirty after the restart, as before), never past the region into the
/// capacity device's label.
#[test]
fn a_region_sized_before_version_7_gets_a_version_6_checkpoint() {
    // Many small chunks: the clean bits take more than a block. (As an
    // older Sluice made it: without home checksums, version 8.)
    let cfg = crate::EngineConfig {
        layout: crate::Layout::InPlace,
        chunk_bytes: 8 * BS,
        home_sums: false,
        ..crate::testkit::small_config()
    };
    let (cache, capacity): (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) = (
        Arc::new(sluice_media::MemoryDevice::new(800 * cfg.chunk_bytes, 4096)),
        Arc::new(sluice_media::MemoryDevice::new(4 << 20, 4096)),
    );
    let w = crate::testkit::small_world_with(cache.clone(), capacity.clone(), &[200], cfg);
    for lba in 0..100 {
        w.volumes[0].write(lba * BS, &pattern(0, lba, 1), false).unwrap();
    }
    w.engine.clean(false).unwrap();
    {
        let mut inner = w.engine.lock();
        let blocks = |len: usize| (len as u64).div_ceil(BS) * BS;
        let (body, v6_len) = encode_checkpoint(&inner);
        let (v6, v7) = (blocks(v6_len), blocks(body.len()));
        assert!(v7 > v6, "the clean bits take a block more: {v6} {v7}");
        assert_eq!(
            super::lifecycle::checkpoint_for_room(&inner, v7).1,
            crate::persist::SUPERBLOCK_VERSION_IN_PLACE,
            "in place: 8"
        );
        assert_eq!(super::lifecycle::checkpoint_for_room(&inner, v7 - BS).1, 6);
        // As an older Sluice would have laid it out: room for version 6's only.
        inner.sb.checkpoint_offset = label_offset(&*capacity) - v6;
    }
    w.engine.shutdown().unwrap();
    drop(w);
    let e = Engine::open(cache, capacity).unwrap();
    // (Version 8 from this open on: in place, its log may hold Clean
    // records. The checkpoint it read was version 6's: all dirty, below.)
    assert_eq!(e.lock().sb.version, crate::persist::SUPERBLOCK_VERSION_IN_PLACE);
    let r = e.cache_report()[0].clone();
    assert!(r.cached_bytes > 0 && r.dirty_bytes == r.cached_bytes, "a version 6 checkpoint: all dirty: {r:?}");
    let mut b = vec![0u8; BLOCK_BYTES];
    e.volume("v0").unwrap().read(5 * BS, &mut b).unwrap();
    assert!(b == pattern(0, 5, 1));
}

/// A disk of `blocks` blocks that holds data before any cache: block `b`
/// holds `pattern(9, b, 1)`.
fn disk_with_data(blocks: u64) -> Arc<dyn BlockDevice> {
    let d = MemoryDevice::new(blocks * BS, 4096);
    for b in 0..blocks {
        write_at(&d, b * BS, &pattern(9, b, 1)).unwrap();
    }
    Arc::new(d)
}

fn image(d: &dyn BlockDevice) -> Vec<u8> {
    read_at(d, 0, d.info().capacity_bytes as usize).unwrap().to_vec()
}

/// A cache attached to `disk` (the whole disk one volume, "disk").
fn attach(cache: Arc<dyn BlockDevice>, disk: Arc<dyn BlockDevice>) -> Result<Arc<Engine>, EngineError> {
    let cfg = EngineConfig { layout: Layout::InPlace, attached: true, ..crate::testkit::small_config() };
    let size_bytes = disk.info().capacity_bytes;
    Engine::create(cache, disk, cfg, &[VolumeSpec { name: "disk".into(), size_bytes }])
}

/// Attaching writes nothing to the disk, serves what it holds, keeps
/// writes in the cache until they are cleaned, and a clean restart and a
/// detach leave exactly the data written on the disk.
#[test]
fn a_cache_attaches_to_a_disk_with_data_and_writes_it_only_by_cleaning() {
    let blocks = 600;
    let (disk, cache): (_, Arc<dyn BlockDevice>) =
        (disk_with_data(blocks), Arc::new(MemoryDevice::new(16 << 20, 4096)));
    let before = image(&*disk);
    let e = attach(cache.clone(), disk.clone()).unwrap();
    let v = e.volume("disk").unwrap();
    let mut b = vec![0u8; BLOCK_BYTES];
    for lba in [0, 1, 299, blocks - 1] {
        v.read(lba * BS, &mut b).unwrap();
        assert_eq!(b, pattern(9, lba, 1), "block {lba} as the disk held it");
    }
    for lba in (0..blocks).step_by(3) {
        v.write(lba * BS, &pattern(9, lba, 2), false).unwrap();
    }
    v.flush().unwrap();
    assert!(image(&*disk) == before, "nothing reaches the disk before cleaning");
    e.shutdown().unwrap();
    assert!(image(&*disk) == before, "nor at a clean shutdown (the checkpoint is on the cache device)");
    let e = Engine::open(cache.clone(), disk.clone()).unwrap();
    assert!(e.disk_changed().is_none());
    let v = e.volume("disk").unwrap();
    for lba in 0..blocks {
        v.read(lba * BS, &mut b).unwrap();
        assert_eq!(b, pattern(9, lba, if lba % 3 == 0 { 2 } else { 1 }), "block {lba} after the restart");
    }
    e.clean(true).unwrap();
    e.shutdown().unwrap();
    let after = image(&*disk);
    for lba in 0..blocks {
        let want = pattern(9, lba, if lba % 3 == 0 { 2 } else { 1 });
        assert!(after[(lba * BS) as usize..][..BLOCK_BYTES] == want[..], "block {lba} on the detached disk");
    }
    // The engine's own writes of sampled blocks (0 and 1 above) are not a
    // change behind its back.
    let e = Engine::open(cache, disk).unwrap();
    assert!(e.disk_changed().is_none());
}

/// A disk written behind the back of a cache that holds dirty data is
/// refused, before anything is written to either device.
#[test]
fn a_dirty_cache_never_attaches_to_a_disk_changed_behind_its_back() {
    let (disk, cache): (_, Arc<dyn BlockDevice>) = (disk_with_data(300), Arc::new(MemoryDevice::new(16 << 20, 4096)));
    let e = attach(cache.clone(), disk.clone()).unwrap();
    e.volume("disk").unwrap().write(5 * BS, &pattern(9, 5, 2), false).unwrap();
    e.shutdown().unwrap();
    // Mounted without Sluice: its superblock (block 0) changed.
    write_at(&*disk, 0, &pattern(1, 0, 7)).unwrap();
    let (c0, d0) = (image(&*cache), image(&*disk));
    match Engine::open(cache.clone(), disk.clone()) {
        Err(EngineError::DiskChanged { changed, dirty_blocks, .. }) => {
            assert_eq!((changed.len(), changed[0].offset, dirty_blocks), (1, 0, 1));
        }
        other => panic!("opened a dirty cache over a changed disk: {:?}", other.map(|_| ())),
    }
    assert!(image(&*cache) == c0 && image(&*disk) == d0, "a refused open writes nothing");
    // A different disk of the same size: refused as well.
    let other = disk_with_data(300);
    write_at(&*other, 299 * BS, &[1; BLOCK_BYTES]).unwrap();
    assert!(matches!(Engine::open(cache, other), Err(EngineError::DiskChanged { .. })));
}

/// A cache holding only clean copies, re-attached to a disk that changed,
/// drops its copies and says so: every read is the disk's.
#[test]
fn a_clean_cache_reattached_to_a_changed_disk_drops_its_copies() {
    let (disk, cache): (_, Arc<dyn BlockDevice>) = (disk_with_data(300), Arc::new(MemoryDevice::new(16 << 20, 4096)));
    let e = attach(cache.clone(), disk.clone()).unwrap();
    let v = e.volume("disk").unwrap();
    for lba in 0..20 {
        v.write(lba * BS, &pattern(9, lba, 2), false).unwrap();
    }
    e.clean(false).unwrap();
    assert!(e.cache_report()[0].cached_bytes > 0, "the copies stay cached, clean");
    e.shutdown().unwrap();
    for lba in [0, 10] {
        write_at(&*disk, lba * BS, &pattern(9, lba, 3)).unwrap();
    }
    let e = Engine::open(cache.clone(), disk.clone()).unwrap();
    let (changed, dropped) = e.disk_changed().expect("the change is reported");
    assert_eq!((changed.len(), *dropped), (1, 20), "block 0 is sampled, block 10 is not");
    let v = e.volume("disk").unwrap();
    let mut b = vec![0u8; BLOCK_BYTES];
    for lba in 0..20 {
        v.read(lba * BS, &mut b).unwrap();
        let ver = if lba == 0 || lba == 10 { 3 } else { 2 };
        assert_eq!(b, pattern(9, lba, ver), "block {lba} reads what the disk holds");
    }
    drop(v);
    // After a crash the copies stay dropped, and the disk is this one now.
    drop(e);
    let e = Engine::open(cache, disk).unwrap();
    assert!(e.disk_changed().is_none());
    e.volume("disk").unwrap().read(10 * BS, &mut b).unwrap();
    assert_eq!(b, pattern(9, 10, 3));
}

/// A crash right after the engine cleaned a sampled block home (its new
/// CRC recorded as pending) reopens as the same disk.
#[test]
fn the_engine_own_write_of_a_sampled_block_survives_a_crash() {
    let (disk, cache): (_, Arc<dyn BlockDevice>) = (disk_with_data(300), Arc::new(MemoryDevice::new(16 << 20, 4096)));
    let e = attach(cache.clone(), disk.clone()).unwrap();
    let v = e.volume("disk").unwrap();
    v.write(0, &pattern(9, 0, 2), false).unwrap();
    v.write(299 * BS, &pattern(9, 299, 2), false).unwrap();
    e.clean(false).unwrap();
    v.write(0, &pattern(9, 0, 3), false).unwrap();
    drop(v);
    drop(e);
    let e = Engine::open(cache, disk).expect("its own writes are not a change");
    assert!(e.disk_changed().is_none());
    let mut b = vec![0u8; BLOCK_BYTES];
    e.volume("disk").unwrap().read(0, &mut b).unwrap();
    assert_eq!(b, pattern(9, 0, 3));
}

/// Write-time prediction: a directory class given the file system's
/// blocks in use takes a write to a free block of a group its files hold
/// and keeps out one in a group others' hold (here sent home by a share-0
/// class after it); a guess the next refresh shows wrong leaves the class
/// (its cached block takes the class its request has now), and both are
/// scored.
#[test]
fn a_directory_class_predicts_a_new_files_blocks_at_write_time() {
    const M: u64 = 1 << 20;
    let w = in_place_world(&[2048]);
    let (e, v) = (&w.engine, &w.volumes[0]);
    let mut temp = directory_class("temp", 1.0);
    (temp.pinned, temp.predict) = (true, true);
    e.set_io_classes("v0", vec![temp, IoClass::new("rest", 0.0)]).unwrap();
    // Groups of 2 MiB: group 0 holds others' files, group 1 the class's.
    let class = vec![(2 * M, 2 * M + 256 * 1024)];
    let alloc = |extra: &[(u64, u64)]| {
        let mut allocated = vec![(0, M), (2 * M, 2 * M + 256 * 1024)];
        allocated.extend_from_slice(extra);
        allocated.sort_unstable();
        Allocation { allocated, first_byte: 0, group_bytes: 2 * M }
    };
    e.set_class_layout("v0", "temp", class.clone(), Some(alloc(&[]))).unwrap();
    let bad = Allocation { allocated: vec![(0, 10), (5, 20)], first_byte: 0, group_bytes: 2 * M };
    assert!(matches!(e.set_class_layout("v0", "temp", class.clone(), Some(bad)), Err(EngineError::Config(_))));
    let report = || e.cache_report()[0].classes.clone();
    v.write(3 * M, &pattern(0, 3 * M / BS, 1), false).unwrap();
    v.write(M + M / 2, &pattern(0, (M + M / 2) / BS, 1), false).unwrap();
    let r = report();
    assert_eq!((r[1].cached_bytes, r[2].bypass_bytes), (BS, BS), "taken in by its group; kept out by its group");
    assert!(e.lock().vols[0].l2p.get((3 * M / BS) as usize).unwrap().cache_block().is_some());
    // The next refresh names both blocks another file's.
    e.set_class_layout("v0", "temp", class, Some(alloc(&[(M + M / 2, M + M / 2 + BS), (3 * M, 3 * M + BS)]))).unwrap();
    let r = report();
    assert_eq!((r[1].cached_bytes, r[2].cached_bytes), (0, BS), "the wrong guess left the class");
    let p = r[1].prediction;
    assert_eq!((p.other_admitted_bytes, p.other_kept_out_bytes, p.class_in_time_bytes), (BS, BS, 0));
    e.lock().check_invariants();
    // Re-read intact.
    let mut back = vec![0u8; BS as usize];
    v.read(3 * M, &mut back).unwrap();
    assert_eq!(back, pattern(0, 3 * M / BS, 1));
}

/// `clean_others`: of the unclassified dirty cached blocks, those the
/// metadata names another's are written home (the lowest LBAs first, at
/// most the bound per step) and stay cached clean; the class's and blocks
/// in no known file stay dirty; without `clean_others` nothing is cleaned.
#[test]
fn a_directory_class_cleans_home_what_the_metadata_names_others() {
    const M: u64 = 1 << 20;
    let w = in_place_world(&[2048]);
    let (e, v) = (&w.engine, &w.volumes[0]);
    let mut temp = directory_class("temp", 1.0);
    e.set_io_classes("v0", vec![temp.clone()]).unwrap();
    // Blocks 0-3 another's, 256-257 nobody's yet, 512-513 the class's.
    for lba in (0..4).chain(256..258).chain(512..514) {
        v.write(lba * BS, &pattern(0, lba, 1), false).unwrap();
    }
    let class = vec![(2 * M, 2 * M + 2 * BS)];
    let alloc = Allocation { allocated: vec![(0, 4 * BS), (2 * M, 2 * M + 2 * BS)], first_byte: 0, group_bytes: 2 * M };
    e.set_class_layout("v0", "temp", class.clone(), Some(alloc.clone())).unwrap();
    assert_eq!(e.clean_others("v0", 100).unwrap().cleaned_bytes, 0, "not asked to");
    temp.clean_others = true;
    e.set_io_classes("v0", vec![temp]).unwrap();
    e.set_class_layout("v0", "temp", class, Some(alloc)).unwrap();
    let dirty0 = e.cache_report()[0].dirty_bytes;
    assert_eq!(dirty0, 8 * BS);
    assert_eq!(e.clean_others("v0", 3).unwrap().cleaned_bytes, 3 * BS, "bounded per step");
    assert_eq!(at_home(&w, 0, 2), pattern(0, 2, 1), "lowest LBAs first");
    assert_eq!(e.clean_others("v0", 3).unwrap().cleaned_bytes, BS);
    assert_eq!(e.clean_others("v0", 3).unwrap().cleaned_bytes, 0);
    assert_eq!(e.cache_report()[0].dirty_bytes, 4 * BS, "the class's and nobody's stay dirty");
    for lba in 0..4 {
        assert_eq!(at_home(&w, 0, lba), pattern(0, lba, 1));
        assert_eq!(read(&w, 0, lba), pattern(0, lba, 1));
    }
    assert_ne!(at_home(&w, 0, 256), pattern(0, 256, 1));
    e.lock().check_invariants();
}

/// A pinned class's dirty blocks move forward in the log, still dirty, when
/// a reclaim with room to spare reaches their chunk (the background
/// compactor's), so temporary data deleted later never reaches the disk;
/// the other dirty blocks are cleaned home as before.
#[test]
fn a_reclaim_moves_pinned_dirty_blocks_forward_and_never_writes_them_home() {
    let w = in_place_world(&[2048]);
    let v = &w.volumes[0];
    one_class(&w, CachePolicy::default().retain_hot, "temp", Some((0, 16 * BS)), true);
    let temp: Vec<u8> = (0..16).flat_map(|l| pattern(0, l, 1)).collect();
    v.write(0, &temp, false).unwrap();
    let log_blocks = w.engine.lock().dirty_blocks().1;
    // Three laps of the log in cold writes, a reclaim step after each.
    for n in (0..3 * log_blocks).step_by(4) {
        let lba = 100 + n % 1900;
        let data: Vec<u8> = (lba..lba + 4).flat_map(|l| pattern(0, l, 2)).collect();
        v.write(lba * BS, &data, false).unwrap();
        w.engine.compact_some(u64::MAX).unwrap();
    }
    let mut b = vec![0u8; temp.len()];
    v.read(0, &mut b).unwrap();
    assert!(b == temp, "the pinned blocks read back");
    let st = stats(&w, 0);
    assert!(st.relogged_bytes >= 3 * 16 * BS, "moved once per lap at least: {st:?}");
    assert!(st.cleaned_bytes > 0, "cold blocks are cleaned home: {st:?}");
    for l in 0..16 {
        assert!(at_home(&w, 0, l) == vec![0u8; BLOCK_BYTES], "block {l} was written home");
    }
    assert_eq!(w.engine.cache_report()[0].classes[1].cached_bytes, 16 * BS);
    // Deleted: never written home.
    v.trim(0, 16 * BS).unwrap();
    let st = stats(&w, 0);
    assert!(st.discarded_dirty_bytes >= 16 * BS, "{st:?}");
    w.engine.lock().check_invariants();
}

/// A cleaning step whose disk writes run without the lock
/// (home_flight.rs): requests go on meanwhile, and when the step ends only
/// blocks still holding the copy it wrote are marked clean - one
/// overwritten meanwhile stays dirty with its new bytes, one trimmed stays
/// gone - and every block reads back what it should, from the log or home.
#[test]
fn a_cleaning_step_without_the_lock_marks_clean_only_what_it_wrote() {
    let w = in_place_world(&[256]);
    let (e, v) = (&w.engine, &w.volumes[0]);
    let p = CachePolicy { seq_cutoff: SeqCutoff::Never, ..CachePolicy::default() };
    e.set_cache_policy("v0", p).unwrap();
    let data: Vec<u8> = (0..8).flat_map(|l| pattern(0, l, 1)).collect();
    v.write(0, &data, false).unwrap();
    let todo: Vec<(u32, u64, u64)> = {
        let inner = e.lock();
        let mut t: Vec<_> =
            (0..8).map(|l| (0, l, inner.vols[0].l2p.get(l as usize).unwrap().cache_block().unwrap())).collect();
        t.sort_unstable_by_key(|t| t.2);
        t
    };
    let (job, n) = match e.clean_ahead(&mut e.lock(), &todo, true).unwrap() {
        home_flight::Ahead::Unlocked(job, n) => (job, n),
        home_flight::Ahead::Done(_) => panic!("a real-time engine with a permit cleans without the lock"),
    };
    {
        let inner = e.lock();
        assert!(inner.home_flight.overlapping(inner.home(0, 3), 1).is_some());
    }
    // Meanwhile (the lock is free): block 1 rewritten, block 2 trimmed.
    v.write(BS, &pattern(0, 1, 2), false).unwrap();
    v.trim(2 * BS, BS).unwrap();
    let written = e.write_unlocked(&job, n);
    let cleaned = e.finish_unlocked(&mut e.lock(), job, n, written).unwrap();
    assert_eq!(cleaned, 6, "every block but the rewritten and the trimmed one");
    assert_eq!(e.lock().home_flight.in_flight(), None);
    let st = stats(&w, 0);
    assert_eq!(st.cleaned_bytes, 8 * BS, "all eight went home: {st:?}");
    assert!(read(&w, 0, 1) == pattern(0, 1, 2), "the rewrite wins");
    assert!(at_home(&w, 0, 1) == pattern(0, 1, 1), "its home has the older bytes");
    for l in [0u64, 3, 4, 5, 6, 7] {
        assert!(read(&w, 0, l) == pattern(0, l, 1) && at_home(&w, 0, l) == pattern(0, l, 1), "block {l}");
    }
    // Dirty: only the rewritten block (the trimmed one is gone).
    assert_eq!(e.lock().dirty_blocks().0, 1);
    e.lock().check_invariants();
    // A detach still cleans the rest home: the disk alone is the volume.
    e.clean(true).unwrap();
    assert!(at_home(&w, 0, 1) == pattern(0, 1, 2));
}

/// Writers, readers and trims racing the background compactor whose
/// cleaning writes the disk without the lock (ACP: it cleans all the
/// time; a small log: reclaims and spills too): every read sees the last
/// write of its block, and after a detach the disk alone holds every
/// block's last version.
#[test]
fn requests_racing_cleaning_without_the_lock_see_their_writes() {
    let w = in_place_world(&[3072]);
    let p = CachePolicy { seq_cutoff: SeqCutoff::Never, ..CachePolicy::default() };
    w.engine.set_cache_policy("v0", p).unwrap();
    w.engine
        .set_cleaning(Cleaning { mode: CleaningMode::Acp, age: std::time::Duration::ZERO, ..Cleaning::default() })
        .unwrap();
    let c = w.engine.start_compactor(CompactorConfig::default()).unwrap();
    let wr = &w;
    let models: Vec<Vec<u64>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..3u64)
            .map(|t| {
                let v = &wr.volumes[0];
                s.spawn(move || {
                    let (base, n) = (t * 1024, 1024u64);
                    let mut model = vec![0u64; n as usize];
                    let mut rng = sluice_media::rng::SplitMix64(t + 1);
                    for ver in 1..=2500u64 {
                        let lba = rng.below(n - 4);
                        let len = 1 + rng.below(4);
                        match rng.below(10) {
                            0 => {
                                v.trim((base + lba) * BS, len * BS).unwrap();
                                (lba..lba + len).for_each(|l| model[l as usize] = u64::MAX);
                            }
                            1..=3 => {
                                let l = rng.below(n);
                                let ver = model[l as usize];
                                if ver != u64::MAX {
                                    let got = read(wr, 0, base + l);
                                    assert!(
                                        got == want(0, base + l, ver),
                                        "thread {t}: block {} not version {ver}",
                                        base + l
                                    );
                                }
                            }
                            _ => {
                                let data: Vec<u8> = (lba..lba + len).flat_map(|l| pattern(0, base + l, ver)).collect();
                                v.write((base + lba) * BS, &data, false).unwrap();
                                (lba..lba + len).for_each(|l| model[l as usize] = ver);
                            }
                        }
                    }
                    model
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    drop(c);
    assert!(stats(&w, 0).cleaned_bytes > 0, "{:?}", stats(&w, 0));
    w.engine.clean(true).unwrap();
    for (t, model) in models.iter().enumerate() {
        for (l, &ver) in model.iter().enumerate() {
            let lba = t as u64 * 1024 + l as u64;
            if ver != u64::MAX {
                assert!(read(&w, 0, lba) == want(0, lba, ver), "block {lba}");
                assert!(at_home(&w, 0, lba) == want(0, lba, ver), "home of block {lba}");
            }
        }
    }
    w.engine.lock().check_invariants();
}

/// Ahead of need, a log full of a pinned class's dirty data is left as it
/// is and new writes spill home (the cache keeps what it was told to keep,
/// and nothing of it goes home); once trims free the oldest chunk, the
/// background step reclaims it again; and a writer that cannot spill still
/// gets room, its reclaim cleaning what cannot move.
#[test]
fn a_log_full_of_pinned_data_spills_new_writes_instead_of_cleaning_it() {
    let w = in_place_world(&[4096]);
    let v = &w.volumes[0];
    let p = CachePolicy { seq_cutoff: SeqCutoff::Never, spill: true, ..CachePolicy::default() };
    w.engine.set_cache_policy("v0", p).unwrap();
    let mut c = IoClass::new("all", 1.0);
    c.pinned = true;
    w.engine.set_io_classes("v0", vec![c]).unwrap();
    let log_blocks = w.engine.lock().dirty_blocks().1;
    assert!(3 * log_blocks < 4000, "the volume outgrows the log");
    // The log's size in new blocks, 4 at a time, a background step after
    // each: what the reserve and the superblock leave is cached, the rest
    // spills (less than a log's worth: with no compactor running, spilling
    // more makes spilled writes clean, caching.rs).
    let written = log_blocks / 4 * 4;
    for lba in (0..written).step_by(4) {
        let data: Vec<u8> = (lba..lba + 4).flat_map(|l| pattern(0, l, 1)).collect();
        v.write(lba * BS, &data, false).unwrap();
        w.engine.compact_some(u64::MAX).unwrap();
    }
    let st = stats(&w, 0);
    assert_eq!(st.cleaned_bytes, 0, "no pinned block went home: {st:?}");
    assert!(st.spill_bytes >= written * BS / 4, "new writes spilled: {st:?}");
    assert!(!w.engine.compact_some(u64::MAX).unwrap(), "the full log is left alone ahead of need");
    for lba in 0..16 {
        assert!(at_home(&w, 0, lba) == vec![0u8; BLOCK_BYTES], "the oldest block {lba} stays cached only");
    }
    for lba in 0..written {
        assert!(read(&w, 0, lba) == pattern(0, lba, 1), "block {lba}");
    }
    // The oldest data deleted: its chunks are reclaimed ahead of need again.
    let bpc = w.engine.lock().blocks_per_chunk();
    v.trim(0, 2 * bpc * BS).unwrap();
    assert!(w.engine.compact_some(u64::MAX).unwrap(), "a chunk of deleted data is reclaimed");
    // A writer that may not spill waits for a reclaim, which cleans.
    w.engine.set_cache_policy("v0", CachePolicy { spill: false, ..p }).unwrap();
    for lba in (written..written + log_blocks).step_by(4) {
        let data: Vec<u8> = (lba..lba + 4).flat_map(|l| pattern(0, l, 2)).collect();
        v.write(lba * BS, &data, false).unwrap();
    }
    assert!(stats(&w, 0).cleaned_bytes > 0, "{:?}", stats(&w, 0));
    for lba in 2 * bpc..written {
        assert!(read(&w, 0, lba) == pattern(0, lba, 1), "block {lba}");
    }
    for lba in written..written + log_blocks {
        assert!(read(&w, 0, lba) == pattern(0, lba, 2), "block {lba}");
    }
    w.engine.lock().check_invariants();
}

/// A reclaim that moves pinned dirty blocks forward makes their new copies
/// durable before the mark that frees their old chunk: whichever of its
/// cache flushes fails, power lost then loses no flushed block. (Without
/// the flush after the move, a failed mark flush could leave the mark
/// durable and the moved copies not: the blocks would read as zeros.)
#[test]
fn a_failed_flush_in_a_reclaim_that_moves_pinned_blocks_loses_nothing() {
    for k in 1..=3 {
        let (c, p) = in_place_device_bytes(&[2048]);
        let (cache, capacity) = (Arc::new(CrashDevice::new(c, 4096)), Arc::new(CrashDevice::new(p, 4096)));
        let w = in_place_world_on(cache.clone(), capacity.clone(), &[2048]);
        let v = &w.volumes[0];
        one_class(&w, true, "temp", Some((0, 16 * BS)), true);
        let temp: Vec<u8> = (0..16).flat_map(|l| pattern(0, l, 1)).collect();
        v.write(0, &temp, false).unwrap();
        // Cold writes until the temp blocks' chunk is full (the oldest).
        let mut lba = 100;
        while w.engine.lock().log.oldest_full().is_none() {
            let data: Vec<u8> = (lba..lba + 4).flat_map(|l| pattern(0, l, 2)).collect();
            v.write(lba * BS, &data, false).unwrap();
            lba += 4;
        }
        v.flush().unwrap();
        cache.inject(sluice_media::FaultPlan::nth_flush(k));
        let moved = w.engine.compact_some(u64::MAX).map(|_| stats(&w, 0).relogged_bytes);
        assert!(moved.as_ref().map_or(true, |&m| m == 16 * BS), "k {k}: {moved:?}");
        for seed in 0..16 {
            let (c2, p2) = (Arc::new(cache.crash(seed)), Arc::new(capacity.crash(seed)));
            let e = Engine::open(c2, p2).unwrap();
            let vol = e.volume("v0").unwrap();
            let mut b = vec![0u8; BLOCK_BYTES];
            for l in (0..16).chain(100..lba) {
                vol.read(l * BS, &mut b).unwrap();
                let ver = if l < 16 { 1 } else { 2 };
                assert!(b == pattern(0, l, ver), "flush {k} failed, seed {seed}: block {l} lost");
            }
        }
    }
}

/// A log whose data blocks are more than `PINNED_SHARE_MAX` a pinned
/// class's, dirty: the head's reclaim moves at most half a chunk
/// forward (`Inner::move_budget`) and cleans the rest home, so it frees
/// room; then random overwrites that wrap the log many times, with
/// reclaims forced after every third write, go on and lose nothing.
#[test]
fn moving_pinned_blocks_forward_is_bounded_so_reclaims_free_room() {
    // A longer log than the other tests' (24 chunks, 2 kept free), so that
    // dirty blocks can fill most of it before the writes must reclaim.
    let (_, p) = in_place_device_bytes(&[2048]);
    let cache = Arc::new(MemoryDevice::new(24 * crate::testkit::small_config().chunk_bytes, 4096));
    let w = in_place_world_on(cache, Arc::new(MemoryDevice::new(p, 4096)), &[2048]);
    let v = &w.volumes[0];
    one_class(&w, false, "all", None, true);
    let (log_blocks, bpc) = {
        let inner = w.engine.lock();
        (inner.dirty_blocks().1, inner.blocks_per_chunk())
    };
    // Distinct blocks, all dirty, until the log's chunks are mostly full.
    let mut model = vec![0u64; 2048];
    let mut lba = 0;
    while w.engine.lock().log.free_len() > 6 {
        assert!(lba + 8 <= 2048, "the log never filled");
        let data: Vec<u8> = (lba..lba + 8).flat_map(|l| pattern(0, l, 1)).collect();
        v.write(lba * BS, &data, false).unwrap();
        model[lba as usize..lba as usize + 8].fill(1);
        lba += 8;
    }
    {
        let inner = w.engine.lock();
        let pinned = inner.vols[0].cache.classes().pinned_blocks();
        let share = pinned as f64 / inner.log.data_blocks() as f64;
        assert!(share > 0.9 && inner.residency.dirty_total() == pinned, "pinned share {share}");
    }
    let free_before = w.engine.lock().log.free_len();
    w.engine.compact_some(1).unwrap();
    let moved = stats(&w, 0).relogged_bytes / BS;
    assert!(moved > 0 && moved <= bpc / 2, "moved {moved} of a chunk of {bpc} from a mostly dirty log");
    while w.engine.lock().log.free_len() <= free_before {
        assert!(w.engine.compact_some(u64::MAX).unwrap(), "the reclaim stopped before it freed its chunk");
    }
    assert!(stats(&w, 0).cleaned_bytes > 0);

    let mut rng = sluice_media::rng::SplitMix64(11);
    for ver in 2..=(6 * log_blocks / 8) {
        let lba = rng.below(2048 - 8);
        let data: Vec<u8> = (lba..lba + 8).flat_map(|l| pattern(0, l, ver)).collect();
        v.write(lba * BS, &data, false).unwrap();
        model[lba as usize..lba as usize + 8].fill(ver);
        if ver % 3 == 0 {
            w.engine.compact_some(u64::MAX).unwrap();
        }
    }
    for (lba, &ver) in model.iter().enumerate() {
        assert!(read(&w, 0, lba as u64) == want(0, lba as u64, ver), "block {lba}");
    }
    let st = stats(&w, 0);
    assert!(st.relogged_bytes > moved * BS && st.cleaned_bytes > 0, "{st:?}");
    w.engine.lock().check_invariants();
}

/// Twitter's case on one volume: a chunk of a pinned class's dirty data at
/// the log's head and clean data behind it. The head's reclaim moves every
/// pinned block forward — more than half a chunk, since the log is mostly
/// clean — instead of leaving the log full (new writes would spill) or
/// writing the temporary data home; the clean chunks behind it then free
/// without a write to the disk.
#[test]
fn a_pinned_chunk_at_the_head_moves_forward_whole_while_the_log_is_mostly_clean() {
    let w = in_place_world(&[2048, 2048]);
    one_class(&w, true, "temp", Some((0, 1024 * BS)), true);
    let through = CachePolicy { seq_cutoff: SeqCutoff::Never, ..policy(CacheMode::WriteThrough) };
    w.engine.set_cache_policy("v1", through).unwrap();
    let bpc = w.engine.lock().blocks_per_chunk();
    let temp_blocks = bpc * 3 / 4;
    assert!(temp_blocks <= 1024);
    let temp: Vec<u8> = (0..temp_blocks).flat_map(|l| pattern(0, l, 1)).collect();
    w.volumes[0].write(0, &temp, false).unwrap();
    // Clean data (written through) until the log is near its reserve.
    let mut lba = 0;
    let near_reserve = |w: &World| {
        let inner = w.engine.lock();
        inner.log.free_len() <= inner.cfg.log_free_chunks_min + 2
    };
    while !near_reserve(&w) {
        let data: Vec<u8> = (lba..lba + 4).flat_map(|l| pattern(1, l, 1)).collect();
        w.volumes[1].write(lba * BS, &data, false).unwrap();
        lba = (lba + 4) % 2044;
    }
    let head = w.engine.lock().log.oldest_full().unwrap();
    let home_writes = w.engine.devices().1.stats().host_write_bytes;
    assert!(w.engine.compact_some(u64::MAX).unwrap(), "the pinned chunk is reclaimed");
    let st = stats(&w, 0);
    assert_eq!(st.relogged_bytes, temp_blocks * BS, "every pinned block moved forward: {st:?}");
    assert_eq!(st.cleaned_bytes, 0, "{st:?}");
    assert_ne!(w.engine.lock().log.oldest_full(), Some(head), "the head passed it");
    // The clean chunks behind it freed too, writing nothing home.
    assert!(stats(&w, 1).evicted_bytes > 0, "{:?}", stats(&w, 1));
    assert_eq!(w.engine.devices().1.stats().host_write_bytes, home_writes, "nothing was written home");
    for l in 0..temp_blocks {
        assert!(read(&w, 0, l) == pattern(0, l, 1), "block {l}");
        assert!(at_home(&w, 0, l) == vec![0u8; BLOCK_BYTES], "block {l} was written home");
    }
    w.engine.lock().check_invariants();
}
