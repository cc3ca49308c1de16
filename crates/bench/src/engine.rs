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

use serde::Serialize;
use sluice_engine::{Engine, EngineConfig, EngineVolume, Volume, VolumeError, VolumeSpec};
use sluice_media::{BlockDevice, MemoryDevice};
use std::sync::Arc;

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
    pub write_iops_per_core: f64,
    pub read_iops_per_core: f64,
    pub dram_bytes_per_block: f64,
    pub ios: u64,
    pub iodepth: usize,
    pub host_waf: f64,
    pub chunks_compacted: u64,
    pub bands_reclaimed: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineBenchError {
    #[error("engine: {0}")]
    Engine(#[from] sluice_engine::EngineError),
    #[error("volume: {0}")]
    Volume(#[from] VolumeError),
}

fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// An engine with one volume "bench" of `volume_bytes` on memory devices: a
/// cache of `cache_bytes`, a capacity of the volume plus 25 % spare, the
/// reserve bands and the checkpoint region; default geometry.
/// `prealloc`: devices fully resident from the start (see
/// `MemoryDevice::preallocated`).
fn bench_engine(
    volume_bytes: u64,
    cache_bytes: u64,
    prealloc: bool,
) -> Result<(Arc<Engine>, EngineVolume), EngineBenchError> {
    let cfg = EngineConfig::default();
    let cap_bytes = (volume_bytes * 5 / 4).div_ceil(cfg.band_bytes) * cfg.band_bytes + 6 * cfg.band_bytes;
    let memory =
        |bytes| if prealloc { MemoryDevice::preallocated(bytes, 4096) } else { MemoryDevice::new(bytes, 4096) };
    let cache: Arc<dyn BlockDevice> = Arc::new(memory(cache_bytes));
    let capacity: Arc<dyn BlockDevice> = Arc::new(memory(cap_bytes));
    let engine =
        Engine::create(cache, capacity, cfg, &[VolumeSpec { name: "bench".into(), size_bytes: volume_bytes }])?;
    let vol = engine.volume("bench")?;
    Ok((engine, vol))
}

/// Uniformly random block numbers below `blocks` (xorshift64, seeded).
fn random_blocks(seed: u64, blocks: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % blocks
    }
}

pub fn run(opts: &EngineBenchOpts) -> Result<EngineBenchReport, EngineBenchError> {
    let (engine, vol) = bench_engine(opts.volume_bytes, opts.cache_bytes, true)?;
    let mut next = random_blocks(opts.seed, opts.volume_bytes / 4096);
    let qd = opts.iodepth.max(1);
    let mut bufs = vec![0u8; 4096 * qd];
    let t0 = cpu_seconds();
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
    let t1 = cpu_seconds();
    let mut buf = vec![0u8; 4096];
    for _ in 0..opts.ios {
        vol.read(next() * 4096, &mut buf)?;
    }
    let t2 = cpu_seconds();
    let s = engine.stats();
    Ok(EngineBenchReport {
        write_iops_per_core: opts.ios as f64 / (t1 - t0),
        read_iops_per_core: opts.ios as f64 / (t2 - t1),
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
}

pub fn recovery(opts: &RecoveryBenchOpts) -> Result<RecoveryReport, EngineBenchError> {
    let (engine, vol) = bench_engine(opts.volume_bytes, opts.cache_bytes, false)?;
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
    let t = std::time::Instant::now();
    let engine = Engine::open(cache.clone(), capacity.clone())?;
    let crash_reopen_s = t.elapsed().as_secs_f64();
    engine.shutdown()?;
    drop(engine);
    let t = std::time::Instant::now();
    let engine = Engine::open(cache, capacity)?;
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
        // L2P 4 B per block + the chunk P2L, 16 B per cache block (twice the volume here).
        let expect = 4.0 + 16.0 * 2.0;
        assert!((r.dram_bytes_per_block - expect).abs() < 0.5, "{} vs {expect}", r.dram_bytes_per_block);
        assert!(r.chunks_compacted > 0, "the log wrapped and compacted");
    }
}
