//! Recovery's own tests: damage told from torn writes, sequence restarts.

use super::*;
use crate::engine::*;
use crate::layout::{decode_header, Header, RecordKind};
use crate::testkit::{pattern, small_world};

/// (block, header) of every record or segment header on `dev` (a scan
/// of the raw device, as an attacker flipping bits would see it).
fn headers(dev: &dyn BlockDevice, tag: u32) -> Vec<(u64, Header)> {
    let blocks = dev.info().capacity_bytes / BS;
    let all = read_at(dev, 0, (blocks * BS) as usize).unwrap();
    (0..blocks)
        .filter_map(|b| decode_header(&all[(b * BS) as usize..((b + 1) * BS) as usize], tag).ok().map(|h| (b, h)))
        .collect()
}

fn flip(dev: &dyn BlockDevice, block: u64, byte: usize) {
    let mut b = read_at(dev, block * BS, BLOCK_BYTES).unwrap().to_vec();
    b[byte] ^= 0x40;
    write_at(dev, block * BS, &b).unwrap();
}

/// An engine with 40 one-block records in its log, all flushed (a
/// later record carries the watermark), stopped without a shutdown.
fn logged() -> (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>, u32) {
    let w = small_world(&[256]);
    for lba in 0..40 {
        w.volumes[0].write(lba * BS, &pattern(0, lba, 1), false).unwrap();
    }
    w.volumes[0].flush().unwrap();
    w.volumes[0].write(100 * BS, &pattern(0, 100, 1), false).unwrap();
    let tag = crate::persist::engine_tag(&w.engine.uuid());
    let (c, p) = w.engine.devices();
    (c, p, tag)
}

fn damage_of(r: Result<Arc<Engine>, EngineError>) -> Vec<Damage> {
    match r {
        Err(EngineError::Damaged(d)) => d,
        Err(e) => panic!("expected damage, got {e}"),
        Ok(_) => panic!("expected damage, the engine opened"),
    }
}

/// Found by the crash simulation (held-out seed 1000007): writes after
/// a recovery were lost in a second crash, so the second recovery found
/// the same newest sequence as the first, restarted at the same number,
/// and reopened a chunk with the epoch a torn leftover of the lost
/// writes carried — which then read back as one of its records. A
/// recovery restarts above the previous one's restart (kept in the
/// superblock), so numbers are never handed out twice.
#[test]
fn a_recovery_that_finds_nothing_newer_never_reissues_sequence_numbers() {
    let (cache, capacity, _) = logged();
    let e = Engine::open(cache.clone(), capacity.clone()).unwrap();
    let first = e.lock().seq.last();
    // Dropped with nothing written since: the next recovery finds
    // nothing newer, as if what was written had been lost.
    drop(e);
    let e = Engine::open(cache.clone(), capacity.clone()).unwrap();
    let second = e.lock().seq.last();
    assert!(second >= first + SEQ_RESTART_GAP, "restarted at {second}, the previous recovery at {first}");
    drop(e);
    let e = Engine::open(cache, capacity).unwrap();
    assert!(e.lock().seq.last() >= second + SEQ_RESTART_GAP);
}

#[test]
fn a_damaged_header_of_a_durable_log_record_is_damage_not_a_torn_tail() {
    let (cache, capacity, tag) = logged();
    let (at, _) = headers(&*cache, tag).into_iter().find(|(_, h)| h.lsn == 5).unwrap();
    flip(&*cache, at, 200);
    let d = damage_of(Engine::open(cache.clone(), capacity.clone()));
    assert!(
        matches!(d[..], [Damage::LogRecords { from_lsn: 5, to_lsn: 5, .. }]),
        "the one damaged record, not the records after it: {d:?}"
    );
    // `check` reports the same, and the refusal changed nothing.
    assert_eq!(Engine::check(cache.clone(), capacity.clone()).unwrap().damage, d);
    let before = read_at(&*cache, 0, cache.info().capacity_bytes as usize).unwrap().to_vec();
    assert!(Engine::open(cache.clone(), capacity.clone()).is_err());
    assert!(read_at(&*cache, 0, cache.info().capacity_bytes as usize).unwrap()[..] == before[..]);
    // Salvaged: it opens, what the damaged record held is gone (block
    // 4 was its only write), every other block is there.
    let e = Engine::open_with(cache.clone(), capacity.clone(), OpenOptions { salvage: true, ..Default::default() })
        .unwrap();
    assert_eq!(e.salvaged(), &d[..]);
    let v = e.volume("v0").unwrap();
    let mut b = vec![0u8; BLOCK_BYTES];
    for lba in (0..40).filter(|&l| l != 4) {
        v.read(lba * BS, &mut b).unwrap();
        assert!(b == pattern(0, lba, 1), "block {lba}");
    }
    v.read(4 * BS, &mut b).unwrap();
    assert!(b == vec![0u8; BLOCK_BYTES]);
    // The damage accepted stays accepted: a crash now reopens cleanly.
    drop((v, e));
    let e = Engine::open(cache, capacity).unwrap();
    assert!(e.recovered_in().is_some());
}

#[test]
fn a_damaged_data_block_of_a_durable_log_record_is_named_and_salvage_trims_it() {
    let (cache, capacity, tag) = logged();
    let (at, h) = headers(&*cache, tag).into_iter().find(|(_, h)| h.lsn == 7).unwrap();
    assert_eq!(h.entries[0].lba, 6);
    flip(&*cache, at + 1, 3000);
    let d = damage_of(Engine::open(cache.clone(), capacity.clone()));
    assert!(matches!(&d[..], [Damage::LogBlock { lba: 6, .. }]), "{d:?}");
    let e = Engine::open_with(cache.clone(), capacity.clone(), OpenOptions { salvage: true, ..Default::default() })
        .unwrap();
    let v = e.volume("v0").unwrap();
    let mut b = vec![0u8; BLOCK_BYTES];
    v.read(6 * BS, &mut b).unwrap();
    assert!(b == vec![0u8; BLOCK_BYTES], "salvage trims a damaged block: never its bad bytes");
    e.shutdown().unwrap();
    drop((v, e));
    let r = Engine::check(cache, capacity).unwrap();
    assert!(r.clean && r.damage.is_empty(), "{}", r.text());
}

#[test]
fn a_damaged_segment_header_followed_by_durable_segments_is_damage() {
    let w = small_world(&[256]);
    // Several passes over the volume: compaction fills bands.
    for pass in 1..=4 {
        for lba in 0..256 {
            w.volumes[0].write(lba * BS, &pattern(0, lba, pass), false).unwrap();
        }
    }
    w.volumes[0].flush().unwrap();
    let tag = crate::persist::engine_tag(&w.engine.uuid());
    let (cache, capacity) = w.engine.devices();
    drop(w);
    let segs: Vec<(u64, Header)> =
        headers(&*capacity, tag).into_iter().filter(|(_, h)| h.kind == RecordKind::Segment).collect();
    // A band's first segment, with a later segment of its generation.
    let bpb = 32;
    let (at, _) = segs
        .iter()
        .find(|(b, h)| b % bpb == 0 && segs.iter().any(|(o, g)| o / bpb == b / bpb && o > b && g.epoch == h.epoch))
        .unwrap();
    flip(&*capacity, *at, 100);
    let d = damage_of(Engine::open(cache.clone(), capacity.clone()));
    assert!(d.iter().any(|x| matches!(x, Damage::Segments { band, from: 0, .. } if *band as u64 == at / bpb)), "{d:?}");
}

/// A band whose stream went on to a later band that is durable holds
/// nothing torn, even once the band its stream filled next is gone (GC
/// reclaims it, which ends the chain naming how far this one reached) and
/// no mark lists it: a damaged header at its end is damage, not a torn
/// tail. (`sluice sim --flips` seed 153, once writers took compaction
/// steps: the flipped header was accepted as torn, and a block whose log
/// copy was long freed read back as zeros.)
#[test]
fn a_damaged_last_header_of_a_band_its_stream_moved_on_from_is_damage() {
    use sluice_media::rng::SplitMix64 as Rng;
    let w = small_world(&[256]);
    let mut rng = Rng(11);
    for i in 0..6000u64 {
        let lba = rng.below(256);
        w.volumes[0].write(lba * BS, &pattern(0, lba, i), false).unwrap();
    }
    w.volumes[0].flush().unwrap();
    let tag = crate::persist::engine_tag(&w.engine.uuid());
    let (cache, capacity) = w.engine.devices();
    drop(w);
    let bpb = 32;
    let segs: Vec<(u64, Header)> =
        headers(&*capacity, tag).into_iter().filter(|(_, h)| h.kind == RecordKind::Segment).collect();
    // Per band: (epoch, stream, prev_epoch) of its first segment, and its
    // segments of that generation.
    let mut bands: std::collections::BTreeMap<u64, (u64, u32, u64, Vec<u64>)> = Default::default();
    for (b, h) in segs.iter().filter(|(b, _)| b % bpb == 0) {
        bands.insert(b / bpb, (h.epoch, h.stream, h.prev_epoch, Vec::new()));
    }
    for (b, h) in &segs {
        if let Some(e) = bands.get_mut(&(b / bpb)).filter(|e| e.0 == h.epoch) {
            e.3.push(*b);
        }
    }
    let watermark = segs.iter().map(|(_, h)| h.flushed_seq).max().unwrap();
    let (mark, _) = crate::engine::marks::read_mark(&*cache, tag).unwrap();
    let marked = |band: u64| mark.as_ref().is_some_and(|m| m.bands.iter().any(|mb| mb.band as u64 == band));
    // Band P (more than one segment, not in the mark), the band Q its
    // stream filled next (naming P), and a later band R of the stream
    // opened before the watermark.
    let (p, q) = bands
        .iter()
        .filter(|(&p, (_, _, _, at))| at.len() > 1 && !marked(p))
        .find_map(|(&p, &(pe, ps, _, _))| {
            let (&q, &(qe, ..)) = bands.iter().find(|(&q, (_, s, prev, _))| *s == ps && *prev == pe && !marked(q))?;
            bands.values().any(|(e, s, ..)| *s == ps && *e > qe && *e <= watermark).then_some((p, q))
        })
        .expect("a band, its successor and a later durable band of the stream");
    // Q gone, as after GC reclaimed it; P's last header damaged at rest.
    write_at(&*capacity, q * bpb * BS, &vec![0u8; (bpb * BS) as usize]).unwrap();
    flip(&*capacity, *bands[&p].3.iter().max().unwrap(), 100);
    let d = damage_of(Engine::open(cache.clone(), capacity.clone()));
    assert!(d.iter().any(|x| matches!(x, Damage::Segments { band, .. } if *band as u64 == p)), "band {p}: {d:?}");
}

#[test]
fn check_finds_blocks_damaged_at_rest_and_a_damaged_checkpoint() {
    let w = small_world(&[256]);
    for pass in 1..=3 {
        for lba in 0..256 {
            w.volumes[0].write(lba * BS, &pattern(0, lba, pass), false).unwrap();
        }
    }
    w.engine.shutdown().unwrap();
    let (cache, capacity) = w.engine.devices();
    drop(w);
    let clean = Engine::check(cache.clone(), capacity.clone()).unwrap();
    assert!(clean.clean && clean.damage.is_empty() && clean.blocks_checked == 256, "{}", clean.text());
    // A data block on the capacity device: read every block to find one.
    let e = Engine::open(cache.clone(), capacity.clone()).unwrap();
    let loc = e.lock().vols[0].l2p.get(10).unwrap();
    e.shutdown().unwrap();
    drop(e);
    let pb = loc.capacity_block().expect("block 10 was compacted");
    flip(&*capacity, pb, 7);
    let r = Engine::check(cache.clone(), capacity.clone()).unwrap();
    assert!(matches!(&r.damage[..], [Damage::Block { lba: 10, device: "capacity", .. }]), "{}", r.text());
    flip(&*capacity, pb, 7);
    // The checkpoint.
    let sb = Engine::inspect(&*cache, &*capacity).unwrap();
    flip(&*capacity, sb.checkpoint_offset / BS, 50);
    let r = Engine::check(cache.clone(), capacity.clone()).unwrap();
    assert_eq!(r.damage, vec![Damage::CheckpointUnreadable], "{}", r.text());
    assert!(matches!(Engine::open(cache.clone(), capacity.clone()), Err(EngineError::CheckpointChecksum)));
    // Salvage recovers from the media instead, every block intact.
    let e = Engine::open_with(cache, capacity, OpenOptions { salvage: true, ..Default::default() }).unwrap();
    let v = e.volume("v0").unwrap();
    let mut b = vec![0u8; BLOCK_BYTES];
    for lba in 0..256 {
        v.read(lba * BS, &mut b).unwrap();
        assert!(b == pattern(0, lba, 3), "block {lba}");
    }
}

/// A torn segment copy that lost is written again by the reopen
/// (`relog`), from the copy that won. Recovery trusts durable segments'
/// data unread, so a winner on the capacity device damaged at rest was
/// met only by that rewrite, which failed the reopen halfway, after it had
/// written (`sluice sim --flips --seed-start 3447269777`: a GC copy torn
/// by the crash, its victim's copy flipped). It is damage found by the
/// scan: the reopen refuses it having written nothing, `check` names it,
/// and salvage trims it.
#[test]
fn a_damaged_winner_of_a_torn_copy_is_refused_before_anything_is_written() {
    let w = small_world(&[256]);
    let mut rng = sluice_media::rng::SplitMix64(5);
    for i in 0..1500 {
        let lba = if i < 256 { i } else { rng.below(256) };
        w.volumes[0].write(lba * BS, &pattern(0, lba, i), false).unwrap();
    }
    w.volumes[0].flush().unwrap();
    // GC steps until one moves a block, its victim left as it was: the
    // copies it wrote are newer than any flush or mark, so a crash may
    // tear them.
    let moved = w.engine.stats().gc_bytes;
    while w.engine.stats().gc_bytes == moved {
        assert!(w.engine.collect_some(1).unwrap(), "a GC step");
    }
    assert!(w.engine.lock().gc_cursor.is_some(), "the victim is not done");
    let tag = crate::persist::engine_tag(&w.engine.uuid());
    let (cache, capacity) = w.engine.devices();
    drop(w);
    let segs: Vec<(u64, Header)> =
        headers(&*capacity, tag).into_iter().filter(|(_, h)| h.kind == RecordKind::Segment).collect();
    let (gc_at, gc) =
        segs.iter().filter(|(_, h)| h.stream == crate::layout::STREAM_GC).max_by_key(|(_, h)| h.seq).unwrap();
    let lba = gc.entries.iter().find(|e| !e.tombstone).expect("GC moved a block").lba;
    // The copy it moved: the newest other one.
    let (won_at, won) = segs
        .iter()
        .filter(|(_, h)| h.seq < gc.seq)
        .filter_map(|(at, h)| {
            let i = h.entries.iter().filter(|e| !e.tombstone).position(|e| e.lba == lba)?;
            Some((at + 1 + i as u64, h.seq))
        })
        .max_by_key(|&(_, seq)| seq)
        .unwrap();
    assert!(won < gc.seq);
    flip(&*capacity, gc_at + 1, 9); // torn by the crash
    flip(&*capacity, won_at, 9); // damaged at rest
    let image = |d: &Arc<dyn BlockDevice>| read_at(&**d, 0, d.info().capacity_bytes as usize).unwrap().to_vec();
    let before = (image(&cache), image(&capacity));
    let d = damage_of(Engine::open(cache.clone(), capacity.clone()));
    let named = Damage::Block { volume: "v0".into(), lba, device: "capacity", offset: won_at * BS };
    assert_eq!(d, vec![named.clone()]);
    assert!(before == (image(&cache), image(&capacity)), "the refused reopen wrote");
    assert_eq!(Engine::check(cache.clone(), capacity.clone()).unwrap().damage, vec![named]);
    let e = Engine::open_with(cache.clone(), capacity.clone(), OpenOptions { salvage: true, ..Default::default() })
        .unwrap();
    let mut b = vec![0u8; BLOCK_BYTES];
    e.volume("v0").unwrap().read(lba * BS, &mut b).unwrap();
    assert!(b == vec![0u8; BLOCK_BYTES], "salvage trims the damaged block");
    drop(e);
    // Accepted for good: the next reopen finds nothing.
    Engine::open(cache, capacity).unwrap().check_invariants();
}

/// Eight blocks written and flushed, then rewritten in one record (the
/// newest), `before_flush` run, and a FLUSH with nothing logged after it;
/// the engine dropped without a shutdown and one byte of the newest
/// record's header flipped. Returns the devices.
fn newest_record_flipped(before_flush: impl FnOnce(&crate::testkit::World)) -> DevicePair {
    let w = small_world(&[256]);
    for lba in 0..8 {
        w.volumes[0].write(lba * BS, &pattern(0, lba, 1), false).unwrap();
    }
    w.volumes[0].flush().unwrap();
    let data: Vec<u8> = (0..8).flat_map(|lba| pattern(0, lba, 2)).collect();
    w.volumes[0].write(0, &data, false).unwrap();
    before_flush(&w);
    w.volumes[0].flush().unwrap();
    let tag = crate::persist::engine_tag(&w.engine.uuid());
    let (cache, capacity) = w.engine.devices();
    drop(w);
    let newest = headers(&*cache, tag).into_iter().max_by_key(|(_, h)| h.lsn).map(|(b, _)| b).unwrap();
    flip(&*cache, newest, 100);
    (cache, capacity)
}

type DevicePair = (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>);

/// The newest records a FLUSH covered, with nothing logged after them: a
/// header damaged there used to be taken for a torn tail, and its blocks
/// silently read back their previous versions (issue: "a flushed write can
/// be rolled back silently"). The watermark's claim on the cache device
/// (watermark.rs) proves them durable: the damage is refused and named.
/// Without the claim (its slots zeroed: the old behaviour), the same flip
/// reads back the previous version.
#[test]
fn a_damaged_newest_record_a_flush_covered_is_damage_not_a_torn_tail() {
    let (cache, capacity) = newest_record_flipped(|_| {});
    let d = damage_of(Engine::open(cache, capacity));
    assert!(d.iter().any(|x| matches!(x, Damage::LogRecords { .. })), "the flipped newest header: {d:?}");
    let (cache, capacity) = newest_record_flipped(|_| {});
    for slot in super::super::watermark::WATERMARK_SLOTS {
        write_at(&*cache, slot * BS, &[0u8; BLOCK_BYTES]).unwrap();
    }
    let e = Engine::open(cache, capacity).expect("without the claim the flip looks torn");
    let v = e.volume("v0").unwrap();
    assert_eq!(crate::testkit::read_block(&v, 0), pattern(0, 0, 1), "rolled back to the previous version");
}

/// The same when the engine's own flush made the newest record durable
/// first (compaction's, say, which claims nothing) and the client's FLUSH
/// then had no device flush to do: the FLUSH still claims what it answers
/// for, so the damaged header is refused, not rolled back.
#[test]
fn a_flush_with_nothing_left_to_flush_still_claims_what_it_answers_for() {
    let (cache, capacity) = newest_record_flipped(|w| {
        let mut inner = w.engine.lock();
        w.engine.flush_cache(&mut inner).unwrap();
    });
    let d = damage_of(Engine::open(cache, capacity));
    assert!(d.iter().any(|x| matches!(x, Damage::LogRecords { .. })), "rolled back silently: {d:?}");
}
