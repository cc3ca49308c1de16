//! `sluice bench engine --threads N`: how the engine's write and read paths
//! scale across threads, in process, on memory devices (issue "The write
//! path on every core" measures its goals with it).
//!
//! Owns: the threaded phases. One engine, one volume; each phase runs the
//! same number of 4 KiB random requests, first on one thread, then split
//! across N threads (each with its own volume handle and random stream),
//! and reports requests per wall-clock second: total, per thread, and the
//! N-thread total over the 1-thread one measured in the same run. Writes go
//! in batches of `iodepth` (one group commit each), reads one per call.
//! Unmeasured writes come first, until GC has reclaimed a band and once
//! more, so that both write phases run in steady state (the log and the
//! capacity device turned over); the report gives the bytes compaction and
//! GC moved in each, which should be close.
//!
//! `compactor`: a background compactor runs beside the writers (as in
//! `sluice serve`) instead of the writer that finds the log full compacting
//! inline. Either way compaction is one thread's work at a time, which is
//! what bounds write scaling once the log turns over (docs/engine.md).
//!
//! Why wall time, not CPU time: scaling is what more cores buy, so the
//! measure is throughput with the threads running at once; on a machine
//! whose cores are busy with something else the ratio says so too (read it
//! with the machine idle).

use crate::engine::{bench_engine, random_blocks, EngineBenchError, EngineBenchOpts};
use serde::Serialize;
use sluice_engine::Volume;
use std::time::Instant;

#[derive(Clone, Debug, Serialize)]
pub struct ThreadsReport {
    pub threads: usize,
    pub iodepth: usize,
    /// A background compactor ran (else compaction was inline).
    pub compactor: bool,
    /// Requests of each phase (split evenly across its threads).
    pub ios: u64,
    pub write_iops_total: f64,
    pub read_iops_total: f64,
    pub write_iops_per_thread: Vec<f64>,
    pub read_iops_per_thread: Vec<f64>,
    /// Bytes compaction and GC moved during the N-thread write phase and
    /// during the 1-thread one (equal work makes the ratio fair).
    pub moved_bytes: u64,
    pub one_thread_moved_bytes: u64,
    /// The same work on one thread, in the same run.
    pub one_thread_write_iops: f64,
    pub one_thread_read_iops: f64,
    /// `*_iops_total` over `one_thread_*_iops`.
    pub write_scaling: f64,
    pub read_scaling: f64,
}

/// One phase: `threads` threads share `ios` requests; (total IOPS, per
/// thread IOPS).
fn phase(
    engine: &std::sync::Arc<sluice_engine::Engine>,
    opts: &EngineBenchOpts,
    threads: usize,
    write: bool,
    seed: u64,
) -> Result<(f64, Vec<f64>), EngineBenchError> {
    let blocks = opts.volume_bytes / 4096;
    let each = opts.ios / threads as u64;
    let qd = opts.iodepth.max(1);
    let t0 = Instant::now();
    let per: Vec<Result<f64, EngineBenchError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                s.spawn(move || -> Result<f64, EngineBenchError> {
                    let vol = engine.volume("bench")?;
                    let mut next = random_blocks(seed + i as u64 * 7919, blocks);
                    let t = Instant::now();
                    let mut done = 0u64;
                    if write {
                        // Not zeros: a memory device keeps a zero write to
                        // a page never written a hole (a real device stores it).
                        let bufs = vec![1 + i as u8; 4096 * qd];
                        while done < each {
                            let n = (each - done).min(qd as u64) as usize;
                            let writes: Vec<(u64, &[u8])> =
                                bufs.chunks(4096).take(n).map(|b| (next() * 4096, b)).collect();
                            vol.write_batch(&writes, false)?;
                            done += n as u64;
                        }
                    } else {
                        let mut buf = sluice_media::IoBuf::zeroed(4096);
                        while done < each {
                            vol.read(next() * 4096, &mut buf)?;
                            done += 1;
                        }
                    }
                    Ok(each as f64 / t.elapsed().as_secs_f64())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a bench thread panicked")).collect()
    });
    let wall = t0.elapsed().as_secs_f64();
    let per = per.into_iter().collect::<Result<Vec<f64>, _>>()?;
    Ok((each as f64 * threads as f64 / wall, per))
}

/// The 1-thread and N-thread phases on one engine: writes, then reads of
/// the written volume.
pub fn run_threads(opts: &EngineBenchOpts, threads: usize, compactor: bool) -> Result<ThreadsReport, EngineBenchError> {
    let threads = threads.max(1);
    let (engine, _vol) = bench_engine(opts.volume_bytes, opts.cache_bytes, true, None)?;
    let _compactor = match compactor {
        true => Some(engine.start_compactor(Default::default())?),
        false => None,
    };
    // Unmeasured, the same writes first, until GC has reclaimed a band and
    // once more: the log and the capacity device turned over, so that both
    // measured phases compact and collect as much per write (steady state).
    // Measured from an empty engine, the 1-thread phase wrote its first
    // cache-full free and collected nothing, where the N-thread phase
    // compacted 30 % more and collected: the ratio understated the scaling.
    let mut warm = 0;
    while warm < 2 || (engine.stats().bands_reclaimed == 0 && warm < 8) {
        phase(&engine, opts, 1, true, opts.seed + 4 + warm)?;
        warm += 1;
    }
    let moved = || {
        let s = engine.stats();
        s.compaction_bytes + s.gc_bytes
    };
    let m0 = moved();
    let (one_w, _) = phase(&engine, opts, 1, true, opts.seed)?;
    let m1 = moved();
    let (total_w, per_w) = phase(&engine, opts, threads, true, opts.seed + 1)?;
    let m2 = moved();
    let (one_r, _) = phase(&engine, opts, 1, false, opts.seed + 2)?;
    let (total_r, per_r) = phase(&engine, opts, threads, false, opts.seed + 3)?;
    Ok(ThreadsReport {
        threads,
        iodepth: opts.iodepth.max(1),
        compactor,
        ios: opts.ios,
        write_iops_total: total_w,
        read_iops_total: total_r,
        write_iops_per_thread: per_w,
        read_iops_per_thread: per_r,
        one_thread_moved_bytes: m1 - m0,
        moved_bytes: m2 - m1,
        one_thread_write_iops: one_w,
        one_thread_read_iops: one_r,
        write_scaling: total_w / one_w,
        read_scaling: total_r / one_r,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two threads complete their share of both phases and the report adds
    /// up (no ratio is asserted: it depends on the machine).
    #[test]
    fn two_threads_share_the_work_and_the_report_adds_up() {
        let opts =
            EngineBenchOpts { volume_bytes: 64 << 20, cache_bytes: 128 << 20, ios: 20_000, iodepth: 16, seed: 9 };
        for compactor in [false, true] {
            let r = run_threads(&opts, 2, compactor).unwrap();
            assert_eq!((r.threads, r.write_iops_per_thread.len(), r.read_iops_per_thread.len()), (2, 2, 2));
            assert_eq!(r.compactor, compactor);
            for v in [r.write_iops_total, r.read_iops_total, r.one_thread_write_iops, r.one_thread_read_iops] {
                assert!(v > 0.0 && v.is_finite(), "{r:?}");
            }
            assert!((r.write_scaling - r.write_iops_total / r.one_thread_write_iops).abs() < 1e-9);
            // After the warm-up both measured phases compact (the log is
            // larger than the volume here: it turns over only past it).
            assert!(r.moved_bytes > 0 && r.one_thread_moved_bytes > 0, "{r:?}");
        }
    }
}
