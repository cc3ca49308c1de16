//! `sluice bench engine`: the engine's own cost per I/O, in process, on
//! memory devices with no emulated timing — 4 KiB random writes, then 4 KiB
//! random reads, over one volume.
//!
//! The engine serves requests synchronously under one lock, so a queue depth
//! of N is N writes submitted together: one `write_batch` (group commit), as
//! the NBD server does with the writes it finds buffered. `--iodepth 1` is
//! one write per call. Reads go one per call. IOPS per core is requests /
//! CPU seconds of the calling thread. The devices are preallocated memory,
//! so the kernel's first-touch page faults are not counted as engine cost.
//! DRAM per block is the L2P entry plus the chunk P2L share.
//!
//! Where the time goes: both devices are wrapped in a `TimedDevice` that
//! adds up the wall time spent inside their `submit`/`reap` calls — on a
//! memory device that is the memcpy to or from "the media", which a real
//! device does with DMA, not with the engine's CPU. The report gives the
//! whole cost per I/O and the part of it that is the engine's own
//! (`*_engine_ns_per_io`): the total minus the device's share.

use crate::heap;
use serde::Serialize;
use sluice_engine::{Engine, EngineConfig, EngineVolume, Volume, VolumeError, VolumeSpec};
use sluice_media::{BlockDevice, MemoryDevice};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct EngineBenchOpts {
    pub volume_bytes: u64,
    pub cache_bytes: u64,
    pub ios: u64,
    /// Writes submitted together (one group commit).
    pub iodepth: usize,
    pub seed: u64,
}

impl Default for EngineBenchOpts {
    fn default() -> EngineBenchOpts {
        EngineBenchOpts { volume_bytes: 4 << 30, cache_bytes: 1 << 30, ios: 1_000_000, iodepth: 32, seed: 1 }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct EngineBenchReport {
    /// Requests per CPU second of the calling thread, all costs included
    /// (device memcpy, and for writes the compaction and GC they trigger).
    pub write_iops_per_core: f64,
    pub read_iops_per_core: f64,
    /// Fraction of that CPU time spent inside the memory devices' calls.
    pub write_device_share: f64,
    pub read_device_share: f64,
    /// What the engine itself adds per request: CPU time less device time.
    pub write_engine_ns_per_io: f64,
    pub read_engine_ns_per_io: f64,
    pub dram_bytes_per_block: f64,
    pub ios: u64,
    pub iodepth: usize,
    pub host_waf: f64,
    pub chunks_compacted: u64,
    pub bands_reclaimed: u64,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineBenchError {
    #[error("engine: {0}")]
    Engine(#[from] sluice_engine::EngineError),
    #[error("volume: {0}")]
    Volume(#[from] VolumeError),
}

pub(crate) fn cpu_seconds() -> f64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// A device wrapper that adds up the wall time spent inside the wrapped
/// device's `submit` and `reap` (single-threaded use: nanoseconds of the
/// calling thread's time that belong to the device, not the engine).
struct TimedDevice {
    dev: Arc<dyn BlockDevice>,
    ns: Arc<AtomicU64>,
}

impl TimedDevice {
    fn timed<T>(&self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        self.ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }
}

impl BlockDevice for TimedDevice {
    fn info(&self) -> &sluice_media::DeviceInfo {
        self.dev.info()
    }
    fn submit(&self, req: sluice_media::IoRequest) {
        self.timed(|| self.dev.submit(req))
    }
    fn reap(&self, min: usize, out: &mut Vec<sluice_media::IoCompletion>) -> usize {
        self.timed(|| self.dev.reap(min, out))
    }
    fn in_flight(&self) -> usize {
        self.dev.in_flight()
    }
    fn stats(&self) -> sluice_media::DeviceStats {
        self.dev.stats()
    }
}

/// An engine with one volume "bench" of `volume_bytes` on memory devices: a
/// cache of `cache_bytes`, a capacity of the volume plus 25 % spare, the
/// reserve bands and the checkpoint region; default geometry.
/// `prealloc`: devices fully resident from the start (see
/// `MemoryDevice::preallocated`). `device_ns` (if given) adds up the time
/// spent inside both devices' calls.
pub(crate) fn bench_engine(
    volume_bytes: u64,
    cache_bytes: u64,
    prealloc: bool,
    device_ns: Option<&Arc<AtomicU64>>,
) -> Result<(Arc<Engine>, EngineVolume), EngineBenchError> {
    let cfg = EngineConfig::default();
    let cap_bytes = (volume_bytes * 5 / 4).div_ceil(cfg.band_bytes) * cfg.band_bytes + 6 * cfg.band_bytes;
    let memory =
        |bytes| if prealloc { MemoryDevice::preallocated(bytes, 4096) } else { MemoryDevice::new(bytes, 4096) };
    let timed = |dev: MemoryDevice| -> Arc<dyn BlockDevice> {
        match device_ns {
            Some(ns) => Arc::new(TimedDevice { dev: Arc::new(dev), ns: ns.clone() }),
            None => Arc::new(dev),
        }
    };
    let cache = timed(memory(cache_bytes));
    let capacity = timed(memory(cap_bytes));
    let engine =
        Engine::create(cache, capacity, cfg, &[VolumeSpec { name: "bench".into(), size_bytes: volume_bytes }])?;
    let vol = engine.volume("bench")?;
    Ok((engine, vol))
}

/// Uniformly random block numbers below `blocks` (xorshift64, seeded).
pub(crate) fn random_blocks(seed: u64, blocks: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % blocks
    }
}

pub fn run(opts: &EngineBenchOpts) -> Result<EngineBenchReport, EngineBenchError> {
    let device_ns = Arc::new(AtomicU64::new(0));
    let (engine, vol) = bench_engine(opts.volume_bytes, opts.cache_bytes, true, Some(&device_ns))?;
    let dev_s = || device_ns.load(Ordering::Relaxed) as f64 / 1e9;
    let mut next = random_blocks(opts.seed, opts.volume_bytes / 4096);
    let qd = opts.iodepth.max(1);
    let mut bufs = vec![0u8; 4096 * qd];
    let (t0, d0) = (cpu_seconds(), dev_s());
    let mut done = 0u64;
    while done < opts.ios {
        let n = (opts.ios - done).min(qd as u64) as usize;
        for (i, b) in bufs.chunks_mut(4096).take(n).enumerate() {
            b[..8].copy_from_slice(&(done + i as u64).to_le_bytes());
        }
        if n == 1 {
            vol.write(next() * 4096, &bufs[..4096], false)?;
        } else {
            let writes: Vec<(u64, &[u8])> = bufs.chunks(4096).take(n).map(|b| (next() * 4096, b)).collect();
            vol.write_batch(&writes, false)?;
        }
        done += n as u64;
    }
    let (t1, d1) = (cpu_seconds(), dev_s());
    // Page-aligned, as a server's receive buffers are: a heap vector's
    // start (16 bytes past a page boundary, say) makes the copy into it
    // alias the 4 KiB-aligned read buffer and run at half speed, which
    // varied with the allocator's state from build to build.
    let mut buf = sluice_media::IoBuf::zeroed(4096);
    for _ in 0..opts.ios {
        vol.read(next() * 4096, &mut buf)?;
    }
    let (t2, d2) = (cpu_seconds(), dev_s());
    let s = engine.stats();
    let (w, r, ios) = (t1 - t0, t2 - t1, opts.ios as f64);
    Ok(EngineBenchReport {
        write_iops_per_core: ios / w,
        read_iops_per_core: ios / r,
        write_device_share: (d1 - d0) / w,
        read_device_share: (d2 - d1) / r,
        write_engine_ns_per_io: (w - (d1 - d0)).max(0.0) / ios * 1e9,
        read_engine_ns_per_io: (r - (d2 - d1)).max(0.0) / ios * 1e9,
        dram_bytes_per_block: engine.dram_bytes_per_block(),
        ios: opts.ios,
        iodepth: qd,
        host_waf: s.host_waf(),
        chunks_compacted: s.chunks_compacted,
        bands_reclaimed: s.bands_reclaimed,
    })
}

/// What `sluice bench recovery` does: fill a cache of `cache_bytes` with
/// 4 KiB random writes, lose the process (drop the engine without shutdown,
/// devices intact — kill -9), time the crash reopen; then shut down cleanly
/// and time the clean reopen.
#[derive(Clone, Debug)]
pub struct RecoveryBenchOpts {
    pub cache_bytes: u64,
    pub volume_bytes: u64,
    /// Fraction of the log to fill before the crash.
    pub fill: f64,
    pub seed: u64,
}

impl Default for RecoveryBenchOpts {
    fn default() -> RecoveryBenchOpts {
        RecoveryBenchOpts { cache_bytes: 8 << 30, volume_bytes: 16 << 30, fill: 0.95, seed: 1 }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct RecoveryReport {
    pub cache_bytes: u64,
    pub volume_bytes: u64,
    /// 4 KiB writes before the crash, and the bytes of log they filled.
    pub writes: u64,
    pub log_bytes_used: u64,
    pub chunks_compacted: u64,
    pub crash_reopen_s: f64,
    pub clean_reopen_s: f64,
    /// Heap the engine holds once open (steady state), and the most the
    /// crash reopen (recovery) and the clean reopen (checkpoint) held at
    /// once; 0 where the counting allocator is not installed (`heap`).
    pub steady_heap_bytes: u64,
    pub recovery_peak_heap_bytes: u64,
    pub clean_open_peak_heap_bytes: u64,
}

impl RecoveryReport {
    /// `bytes` over the steady state.
    pub fn over_steady(&self, bytes: u64) -> f64 {
        bytes as f64 / self.steady_heap_bytes.max(1) as f64
    }
}

pub fn recovery(opts: &RecoveryBenchOpts) -> Result<RecoveryReport, EngineBenchError> {
    let (engine, vol) = bench_engine(opts.volume_bytes, opts.cache_bytes, false, None)?;
    let (cache, capacity) = engine.devices();
    // Each 4 KiB write is a 2-block record (header + data).
    let chunk_bytes = EngineConfig::default().chunk_bytes;
    let log_blocks = (opts.cache_bytes / chunk_bytes - 1) * (chunk_bytes / 4096);
    let writes = (log_blocks as f64 * opts.fill / 2.0) as u64;
    let mut next = random_blocks(opts.seed, opts.volume_bytes / 4096);
    let mut buf = vec![0u8; 4096];
    for i in 0..writes {
        buf[..8].copy_from_slice(&i.to_le_bytes());
        vol.write(next() * 4096, &buf, false)?;
    }
    let stats = engine.stats();
    drop(vol);
    drop(engine);
    // Heap measured above what the devices (and the rest) hold without an engine.
    let t = std::time::Instant::now();
    let (engine, recovery) = heap::measure(|| Engine::open(cache.clone(), capacity.clone()));
    let engine = engine?;
    let crash_reopen_s = t.elapsed().as_secs_f64();
    engine.shutdown()?;
    drop(engine);
    let t = std::time::Instant::now();
    let (engine, clean) = heap::measure(|| Engine::open(cache, capacity));
    let engine = engine?;
    let clean_reopen_s = t.elapsed().as_secs_f64();
    engine.shutdown()?;
    Ok(RecoveryReport {
        cache_bytes: opts.cache_bytes,
        volume_bytes: opts.volume_bytes,
        writes,
        log_bytes_used: stats.cache_write_bytes,
        chunks_compacted: stats.chunks_compacted,
        crash_reopen_s,
        clean_reopen_s,
        steady_heap_bytes: recovery.left as u64,
        recovery_peak_heap_bytes: recovery.peak as u64,
        clean_open_peak_heap_bytes: clean.peak as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_reopens_a_filled_cache_after_a_crash() {
        let r = recovery(&RecoveryBenchOpts { cache_bytes: 256 << 20, volume_bytes: 512 << 20, fill: 0.9, seed: 5 })
            .unwrap();
        assert!(r.writes > 20_000, "{r:?}");
        assert!(r.crash_reopen_s > 0.0 && r.clean_reopen_s > 0.0, "{r:?}");
    }

    #[test]
    fn small_run_reports_positive_rates() {
        let r =
            run(&EngineBenchOpts { volume_bytes: 64 << 20, cache_bytes: 128 << 20, ios: 40_000, iodepth: 32, seed: 3 })
                .unwrap();
        assert!(r.write_iops_per_core > 0.0 && r.read_iops_per_core > 0.0);
        // Device time was measured. Its share of the thread's CPU time is
        // not bounded here: it is wall time inside the device calls, which
        // exceeds CPU time whenever the machine is busy (no test depends on
        // the machine's speed).
        for share in [r.write_device_share, r.read_device_share] {
            assert!(share > 0.0 && share.is_finite(), "{r:?}");
        }
        // L2P 4 B and CRC 4 B per block + the chunk P2L, 16 B per cache
        // block (twice the volume here).
        let expect = 8.0 + 16.0 * 2.0;
        assert!((r.dram_bytes_per_block - expect).abs() < 0.5, "{} vs {expect}", r.dram_bytes_per_block);
        assert!(r.chunks_compacted > 0, "the log wrapped and compacted");
    }
}
