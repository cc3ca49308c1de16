//! Deterministic simulation of the engine against an exact model.
//!
//! One seed draws a mix of operations (ops.rs) over three volumes of 64 to
//! 255 blocks on small memory devices (testkit.rs), so compaction and GC run
//! constantly. Nothing crashes, so every read must return exactly the last
//! version written (zeros if never written, trimmed or zeroed); the map's
//! invariants are checked as the run goes, and block status against the
//! model at the end. A failure names its seed; the same seed replays it
//! exactly.

use crate::ops::{expect, new_versions, Op};
use crate::testkit::{small_world, write_owned, World};
use crate::Volume;
use sluice_media::rng::SplitMix64 as Rng;

const BS: u64 = 4096;

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
    // Per volume and block: the version it holds (0: zeros).
    let mut model: Vec<Vec<u64>> = sizes.iter().map(|&n| vec![0; n as usize]).collect();
    let mut version = 0u64;
    for op in 0..ops {
        let fail = |what: String| format!("seed {seed} op {op}: {what}");
        match Op::draw(&mut rng, &sizes) {
            Op::Write { vol: v, writes, fua, owned } => {
                let mut data = Vec::with_capacity(writes.len());
                for &(lba, len) in &writes {
                    let (d, versions) = new_versions(&mut version, v, lba, len);
                    for (i, ver) in versions.into_iter().enumerate() {
                        model[v][lba as usize + i] = ver;
                    }
                    data.push((lba * BS, d));
                }
                let vol = &w.volumes[v];
                let r = match &data[..] {
                    [(at, d)] if owned => write_owned(vol, *at, d, fua),
                    [(at, d)] => vol.write(*at, d, fua),
                    _ => vol.write_batch(&data.iter().map(|(at, d)| (*at, &d[..])).collect::<Vec<_>>(), fua),
                };
                r.map_err(|e| fail(format!("write: {e}")))?;
            }
            Op::Read { vol: v, lba, len } => {
                let mut buf = vec![0u8; (len * BS) as usize];
                w.volumes[v].read(lba * BS, &mut buf).map_err(|e| fail(format!("read: {e}")))?;
                for (i, got) in buf.chunks(BS as usize).enumerate() {
                    let b = lba + i as u64;
                    if got != &expect(v, b, model[v][b as usize])[..] {
                        return Err(fail(format!("volume {v} block {b} read back wrong")));
                    }
                }
            }
            Op::Trim { vol: v, lba, len } => {
                w.volumes[v].trim(lba * BS, len * BS).map_err(|e| fail(format!("trim: {e}")))?;
                model[v][lba as usize..(lba + len) as usize].fill(0);
            }
            Op::Zero { vol: v, lba, len, fua } => {
                w.volumes[v].write_zeroes(lba * BS, len * BS, fua).map_err(|e| fail(format!("zero: {e}")))?;
                model[v][lba as usize..(lba + len) as usize].fill(0);
            }
            Op::Flush { vol: v } => w.volumes[v].flush().map_err(|e| fail(format!("flush: {e}")))?,
            Op::Gc { blocks } => {
                w.engine.collect_some(blocks).map_err(|e| fail(format!("gc step: {e}")))?;
            }
            Op::Compact { blocks, leave_remaps } => {
                let step = if leave_remaps {
                    w.engine.compact_some_leaving_remaps(blocks)
                } else {
                    w.engine.compact_some(blocks)
                };
                step.map_err(|e| fail(format!("compaction step: {e}")))?;
            }
        }
        if op % 97 == 0 {
            w.engine.check_invariants();
        }
    }
    w.engine.check_invariants();
    // Block status agrees with the model.
    for (v, vol) in w.volumes.iter().enumerate() {
        let ext = vol.block_status(0, sizes[v] * BS).map_err(|e| format!("seed {seed}: status: {e}"))?;
        let mut lba = 0;
        for e in ext {
            for b in lba..lba + e.len / BS {
                if (model[v][b as usize] != 0) != e.allocated {
                    return Err(format!("seed {seed}: block status of volume {v} block {b}"));
                }
            }
            lba += e.len / BS;
        }
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::small_world_zns;

    #[test]
    fn random_mixes_match_the_model() {
        for seed in 1..=60 {
            if let Err(e) = run_seed(seed, 3000) {
                panic!("{e} (replay: sim::run_seed({seed}, 3000))");
            }
        }
    }

    #[test]
    fn shared_bands_on_zns_match_the_model_with_no_rejections() {
        for seed in 1..=8u64 {
            let w = run_seed_with(seed, 3000, |sizes| {
                let w = small_world_zns(sizes);
                w.engine.set_band_placement(sluice_engine::BandPlacement::Shared).unwrap();
                w
            })
            .unwrap_or_else(|e| panic!("{e}"));
            let (_, cap) = w.engine.devices();
            assert_eq!(cap.stats().errors, 0, "seed {seed}: the ZNS device rejected requests");
            assert!(w.engine.stats().bands_reclaimed > 0, "seed {seed}: GC ran");
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
}
