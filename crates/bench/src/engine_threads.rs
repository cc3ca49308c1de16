//! `sluice bench engine --threads N`: how the engine's write and read paths
//! scale across threads, in process, on memory devices (issue "The write
//! path on every core" measures its goals with it).
//!
//! Owns: the threaded phases. One engine, one volume; each phase runs the
//! same number of 4 KiB random requests, first on one thread, then split
//! across N threads (each with its own volume handle and random stream),
//! and reports requests per wall-clock second: total, per thread, and the
//! N-thread total over the 1-thread one measured in the same run. For
//! writes it also reports the threads' CPU time per write in each kind of
//! phase and how much of the N-thread phases' time they were on the CPU:
//! a ratio short of N is then either waiting or costlier writes. Writes go
//! in batches of `iodepth` (one group commit each), reads one per call.
//! Unmeasured writes come first, until GC has reclaimed a band and once
//! more, so that both write phases run in steady state (the log and the
//! capacity device turned over); the report gives the bytes compaction and
//! GC moved in each, which should be close.
//!
//! Between the write rounds it also measures the machine itself: one
//! thread and then N copying chunk-sized windows out of DRAM
//! (`copy_scaling`). On memory devices the engine copies every byte it
//! logs, compacts and collects, so where memory bandwidth does not grow
//! with cores (a small VM) that ratio is the ceiling of write scaling once
//! the log turns over, and the report puts the two side by side.
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

use crate::engine::{bench_engine, cpu_seconds, random_blocks, EngineBenchError, EngineBenchOpts};
use serde::Serialize;
use sluice_engine::Volume;
use std::time::Instant;

#[derive(Clone, Debug, Serialize)]
pub struct ThreadsReport {
    pub threads: usize,
    pub iodepth: usize,
    /// A background compactor ran (else compaction was inline).
    pub compactor: bool,
    /// Requests of each kind of phase (split evenly across its threads
    /// and `ROUNDS` rounds).
    pub ios: u64,
    pub write_iops_total: f64,
    pub read_iops_total: f64,
    pub write_iops_per_thread: Vec<f64>,
    pub read_iops_per_thread: Vec<f64>,
    /// Bytes compaction and GC moved during the N-thread write phase and
    /// during the 1-thread one (equal work makes the ratio fair).
    pub moved_bytes: u64,
    pub one_thread_moved_bytes: u64,
    /// Of those, what GC moved (it comes in bursts: a few GB in one round,
    /// a few hundred MB in the next, so the two kinds of phase may differ
    /// by chance; a longer run evens them out).
    pub gc_bytes: u64,
    pub one_thread_gc_bytes: u64,
    /// The same work on one thread, in the same run.
    pub one_thread_write_iops: f64,
    pub one_thread_read_iops: f64,
    /// `*_iops_total` over `one_thread_*_iops`.
    pub write_scaling: f64,
    pub read_scaling: f64,
    /// CPU time the writing threads took per write (their own CPU clocks,
    /// ns), in the N-thread and in the 1-thread phases: what sharing one
    /// engine costs each write, apart from any waiting.
    pub write_cpu_ns: f64,
    pub one_thread_write_cpu_ns: f64,
    /// The share of the N-thread write phases' thread time that was CPU
    /// time (1: no thread ever waited off the CPU).
    pub write_cpu_busy: f64,
    /// The machine's own scaling for copying memory, measured in the same
    /// run between the write rounds (`copy_phase`): N threads copying
    /// chunk-sized windows out of DRAM over one thread doing the same.
    /// The engine on memory devices copies every byte it logs, compacts
    /// and collects, so its write scaling cannot go past this for long;
    /// on a machine whose memory bandwidth one core nearly fills it is
    /// well under N.
    pub copy_scaling: f64,
}

/// What a phase did: requests, wall seconds, each thread's (wall, CPU)
/// seconds.
type Done = (u64, f64, Vec<(f64, f64)>);

/// One phase: `threads` threads share `ios` requests.
fn phase(
    engine: &std::sync::Arc<sluice_engine::Engine>,
    opts: &EngineBenchOpts,
    (threads, ios): (usize, u64),
    write: bool,
    seed: u64,
) -> Result<Done, EngineBenchError> {
    let blocks = opts.volume_bytes / 4096;
    let each = ios / threads as u64;
    let qd = opts.iodepth.max(1);
    let t0 = Instant::now();
    let per: Vec<Result<(f64, f64), EngineBenchError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                s.spawn(move || -> Result<(f64, f64), EngineBenchError> {
                    let vol = engine.volume("bench")?;
                    let mut next = random_blocks(seed + i as u64 * 7919, blocks);
                    let (t, cpu) = (Instant::now(), cpu_seconds());
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
                    Ok((t.elapsed().as_secs_f64(), cpu_seconds() - cpu))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a bench thread panicked")).collect()
    });
    let wall = t0.elapsed().as_secs_f64();
    let per = per.into_iter().collect::<Result<Vec<(f64, f64)>, _>>()?;
    Ok((each * threads as u64, wall, per))
}

/// Bytes each copying thread copies from (past any L3 cache: the copies
/// come from DRAM, as the engine's of a large log do), and the window one
/// copy moves (a chunk, as compaction reads it).
const COPY_SOURCE_BYTES: usize = 256 << 20;
const COPY_WINDOW_BYTES: usize = 16 << 20;
/// Windows one copy phase moves, split across its threads.
const COPY_WINDOWS: usize = 32;

/// Each copying thread's (source, window).
type CopyBufs = Vec<(Vec<u8>, Vec<u8>)>;

/// The peer of the write phases: `threads` threads share `COPY_WINDOWS`
/// window copies from their sources at random offsets. Returns the wall
/// seconds.
fn copy_phase(bufs: &mut CopyBufs, threads: usize, seed: u64) -> f64 {
    let each = COPY_WINDOWS / threads;
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for (i, (src, dst)) in bufs.iter_mut().take(threads).enumerate() {
            s.spawn(move || {
                let mut next = random_blocks(seed + i as u64, (COPY_SOURCE_BYTES / COPY_WINDOW_BYTES) as u64);
                for _ in 0..each {
                    let at = next() as usize * COPY_WINDOW_BYTES;
                    dst.copy_from_slice(&src[at..at + COPY_WINDOW_BYTES]);
                    std::hint::black_box(&mut *dst);
                }
            });
        }
    });
    t0.elapsed().as_secs_f64()
}

/// Rounds each measured kind of phase is cut into, the 1-thread and the
/// N-thread phases taking turns: GC comes in bursts (a few GB in one
/// million writes, a few hundred MB in the next), which one phase of each
/// would give to one of the two by chance.
const ROUNDS: u64 = 4;

/// What the rounds of one kind added up to.
#[derive(Default)]
struct Tally {
    ios: u64,
    wall: f64,
    /// Each thread's wall seconds.
    per: Vec<f64>,
    /// All threads' CPU seconds.
    cpu: f64,
    moved: u64,
    gc: u64,
}

impl Tally {
    fn add(&mut self, (ios, wall, per): Done, (moved, gc): (u64, u64)) {
        self.ios += ios;
        self.wall += wall;
        self.per.resize(per.len(), 0.0);
        self.per.iter_mut().zip(&per).for_each(|(a, b)| *a += b.0);
        self.cpu += per.iter().map(|p| p.1).sum::<f64>();
        self.moved += moved;
        self.gc += gc;
    }

    fn cpu_ns_per_io(&self) -> f64 {
        self.cpu * 1e9 / self.ios as f64
    }

    /// CPU seconds over the threads' wall seconds.
    fn busy(&self) -> f64 {
        self.cpu / self.per.iter().sum::<f64>()
    }

    fn iops(&self) -> f64 {
        self.ios as f64 / self.wall
    }

    fn per_thread(&self) -> Vec<f64> {
        let each = self.ios as f64 / self.per.len() as f64;
        self.per.iter().map(|s| each / s).collect()
    }
}

/// The 1-thread and N-thread phases on one engine, in alternating rounds:
/// writes, then reads of the written volume.
pub fn run_threads(opts: &EngineBenchOpts, threads: usize, compactor: bool) -> Result<ThreadsReport, EngineBenchError> {
    let threads = threads.max(1);
    let (engine, _vol) = bench_engine(opts.volume_bytes, opts.cache_bytes, true, None)?;
    let _compactor = match compactor {
        true => Some(engine.start_compactor(Default::default())?),
        false => None,
    };
    // Unmeasured, the same writes first, until GC has reclaimed a band and
    // once more: the log and the capacity device turned over, so that the
    // measured rounds compact and collect in steady state. Measured from an
    // empty engine, the 1-thread phase wrote its first cache-full free and
    // collected nothing, where the N-thread phase compacted 30 % more and
    // collected: the ratio understated the scaling.
    let mut warm = 0;
    while warm < 2 || (engine.stats().bands_reclaimed == 0 && warm < 8) {
        phase(&engine, opts, (1, opts.ios), true, opts.seed + 100 + warm)?;
        warm += 1;
    }
    let moved = || {
        let s = engine.stats();
        (s.compaction_bytes + s.gc_bytes, s.gc_bytes)
    };
    let share = (opts.ios / ROUNDS).max(threads as u64);
    let (mut one_w, mut all_w, mut one_r, mut all_r) =
        (Tally::default(), Tally::default(), Tally::default(), Tally::default());
    // Not zeros (the pages are then really there), one pair per thread.
    let mut copy: CopyBufs =
        (0..threads).map(|_| (vec![7u8; COPY_SOURCE_BYTES], vec![0u8; COPY_WINDOW_BYTES])).collect();
    let (mut copy_one, mut copy_all) = (0.0, 0.0);
    for round in 0..ROUNDS {
        let seed = opts.seed + 10 * round;
        for (n, t) in [(1, &mut one_w), (threads, &mut all_w)] {
            let m = moved();
            let done = phase(&engine, opts, (n, share), true, seed + n as u64)?;
            let now = moved();
            t.add(done, (now.0 - m.0, now.1 - m.1));
        }
        copy_one += copy_phase(&mut copy, 1, seed);
        copy_all += copy_phase(&mut copy, threads, seed);
    }
    drop(copy);
    // Both phases copy the same windows (each a whole share of them).
    let copy_scaling = copy_one / copy_all * (COPY_WINDOWS / threads * threads) as f64 / COPY_WINDOWS as f64;
    for round in 0..ROUNDS {
        let seed = opts.seed + 10 * round + 5;
        for (n, t) in [(1, &mut one_r), (threads, &mut all_r)] {
            let done = phase(&engine, opts, (n, share), false, seed + n as u64)?;
            t.add(done, (0, 0));
        }
    }
    Ok(ThreadsReport {
        threads,
        iodepth: opts.iodepth.max(1),
        compactor,
        ios: all_w.ios,
        write_iops_total: all_w.iops(),
        read_iops_total: all_r.iops(),
        write_iops_per_thread: all_w.per_thread(),
        read_iops_per_thread: all_r.per_thread(),
        one_thread_moved_bytes: one_w.moved,
        moved_bytes: all_w.moved,
        one_thread_gc_bytes: one_w.gc,
        gc_bytes: all_w.gc,
        one_thread_write_iops: one_w.iops(),
        one_thread_read_iops: one_r.iops(),
        write_scaling: all_w.iops() / one_w.iops(),
        read_scaling: all_r.iops() / one_r.iops(),
        write_cpu_ns: all_w.cpu_ns_per_io(),
        one_thread_write_cpu_ns: one_w.cpu_ns_per_io(),
        write_cpu_busy: all_w.busy(),
        copy_scaling,
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
            // CPU time is counted, and no thread had more CPU than wall time.
            assert!(r.write_cpu_ns > 0.0 && r.one_thread_write_cpu_ns > 0.0, "{r:?}");
            assert!(r.write_cpu_busy > 0.0 && r.write_cpu_busy <= 1.0 + 1e-6, "{r:?}");
            // After the warm-up both measured phases compact (the log is
            // larger than the volume here: it turns over only past it).
            assert!(r.moved_bytes > 0 && r.one_thread_moved_bytes > 0, "{r:?}");
            assert!(r.gc_bytes <= r.moved_bytes && r.one_thread_gc_bytes <= r.one_thread_moved_bytes, "{r:?}");
            assert!(r.copy_scaling > 0.0 && r.copy_scaling.is_finite(), "{r:?}");
        }
    }
}
