//! `sluice bench engine`: the engine's own cost per I/O, in process, on
//! memory devices with no emulated timing — 4 KiB random writes, then 4 KiB
//! random reads, over one volume.
//!
//! The engine currently serves each request synchronously under one lock, so
//! the queue depth is 1 by construction; IOPS per core is requests / CPU
//! seconds of the calling thread. DRAM per block is the L2P entry size.

use serde::Serialize;
use sluice_engine::{Engine, EngineConfig, Volume, VolumeError, VolumeSpec};
use sluice_media::{BlockDevice, MemoryDevice};
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct EngineBenchOpts {
    pub volume_bytes: u64,
    pub cache_bytes: u64,
    pub ios: u64,
    pub seed: u64,
}

impl Default for EngineBenchOpts {
    fn default() -> EngineBenchOpts {
        EngineBenchOpts { volume_bytes: 4 << 30, cache_bytes: 1 << 30, ios: 1_000_000, seed: 1 }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct EngineBenchReport {
    pub write_iops_per_core: f64,
    pub read_iops_per_core: f64,
    pub dram_bytes_per_block: f64,
    pub ios: u64,
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

pub fn run(opts: &EngineBenchOpts) -> Result<EngineBenchReport, EngineBenchError> {
    let cfg = EngineConfig::default();
    // Capacity: the volume plus 25 % spare, the reserve bands and the checkpoint region.
    let cap_bytes = (opts.volume_bytes * 5 / 4).div_ceil(cfg.band_bytes) * cfg.band_bytes + 6 * cfg.band_bytes;
    let cache: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(opts.cache_bytes, 4096));
    let capacity: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(cap_bytes, 4096));
    let engine =
        Engine::create(cache, capacity, cfg, &[VolumeSpec { name: "bench".into(), size_bytes: opts.volume_bytes }])?;
    let vol = engine.volume("bench")?;
    let blocks = opts.volume_bytes / 4096;
    let mut x = opts.seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % blocks
    };
    let mut buf = vec![0u8; 4096];
    let t0 = cpu_seconds();
    for i in 0..opts.ios {
        buf[..8].copy_from_slice(&i.to_le_bytes());
        vol.write(next() * 4096, &buf, false)?;
    }
    let t1 = cpu_seconds();
    for _ in 0..opts.ios {
        vol.read(next() * 4096, &mut buf)?;
    }
    let t2 = cpu_seconds();
    let s = engine.stats();
    Ok(EngineBenchReport {
        write_iops_per_core: opts.ios as f64 / (t1 - t0),
        read_iops_per_core: opts.ios as f64 / (t2 - t1),
        dram_bytes_per_block: engine.l2p_bytes_per_block(),
        ios: opts.ios,
        host_waf: s.host_waf(),
        chunks_compacted: s.chunks_compacted,
        bands_reclaimed: s.bands_reclaimed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_run_reports_positive_rates() {
        let r = run(&EngineBenchOpts { volume_bytes: 64 << 20, cache_bytes: 128 << 20, ios: 40_000, seed: 3 }).unwrap();
        assert!(r.write_iops_per_core > 0.0 && r.read_iops_per_core > 0.0);
        assert_eq!(r.dram_bytes_per_block, 4.0);
        assert!(r.chunks_compacted > 0, "the log wrapped and compacted");
    }
}
