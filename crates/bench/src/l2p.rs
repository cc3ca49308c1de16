//! `sluice bench l2p`: a huge volume served with its L2P paged within a
//! DRAM budget, against a small volume whose map is wholly in DRAM.
//!
//! Each case creates an engine, writes `writes` 4 KiB blocks at random
//! LBAs spread over the whole volume (group commits of `iodepth`), reads
//! every written block back and checks it, drops the engine without a
//! shutdown (kill -9), recovers, checks every block again, shuts down
//! cleanly and reopens from the checkpoint. Reported per case: write and
//! read IOPS (wall clock, one thread), recovery and clean-reopen seconds,
//! the L2P's DRAM, page faults and write-backs.
//!
//! Devices, the same in both cases so that only the map differs: the cache
//! device is a sparse file (it holds the log and, paged, the map region:
//! 192 GiB of address space for a 64 TiB volume, of which only the pages
//! written back take disk space); the capacity device is a `CrashDevice`,
//! a sparse image in memory that stores only the blocks written (never
//! crashed here), since a 64 TiB device fits neither a memory device's
//! page table nor an ext4 file.

use serde::Serialize;
use sluice_engine::{Engine, EngineConfig, L2pStats, Volume, VolumeSpec};
use sluice_media::{BlockDevice, CacheMode, CrashDevice, FileDevice, FileOptions};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct L2pBenchOpts {
    /// The paged case's volume and DRAM budget.
    pub volume_bytes: u64,
    pub budget_bytes: u64,
    /// The resident case's volume (no budget).
    pub resident_volume_bytes: u64,
    pub writes: u64,
    pub iodepth: usize,
    /// Log bytes on the cache device (besides the map region).
    pub log_bytes: u64,
    /// Where the cache devices' sparse files go (removed afterwards).
    pub dir: PathBuf,
    pub seed: u64,
}

impl Default for L2pBenchOpts {
    fn default() -> L2pBenchOpts {
        L2pBenchOpts {
            volume_bytes: 64 << 40,
            budget_bytes: 1 << 30,
            resident_volume_bytes: 16 << 30,
            writes: 400_000,
            iodepth: 32,
            log_bytes: 1 << 30,
            dir: std::env::temp_dir(),
            seed: 1,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct L2pCase {
    pub name: String,
    pub volume_bytes: u64,
    pub budget_bytes: u64,
    pub writes: u64,
    pub distinct_blocks: u64,
    pub write_iops: f64,
    pub read_iops: f64,
    pub crash_reopen_s: f64,
    pub clean_reopen_s: f64,
    /// While serving (after the writes and reads).
    pub l2p: L2pStats,
    /// What the recovery left (its faults and write-backs included).
    pub l2p_after_recovery: L2pStats,
}

#[derive(Clone, Debug, Serialize)]
pub struct L2pBenchReport {
    pub cases: Vec<L2pCase>,
}

#[derive(Debug, thiserror::Error)]
pub enum L2pBenchError {
    #[error("engine: {0}")]
    Engine(#[from] sluice_engine::EngineError),
    #[error("volume: {0}")]
    Volume(#[from] sluice_engine::VolumeError),
    #[error("cache file: {0}")]
    File(#[from] sluice_media::FileError),
    #[error("block {lba} read back wrong ({when})")]
    Mismatch { lba: u64, when: &'static str },
}

pub fn run(opts: &L2pBenchOpts) -> Result<L2pBenchReport, L2pBenchError> {
    let paged = run_case("paged", opts.volume_bytes, opts.budget_bytes, opts)?;
    let resident = run_case("resident", opts.resident_volume_bytes, 0, opts)?;
    Ok(L2pBenchReport { cases: vec![paged, resident] })
}

/// Stamp of block `lba` at write `i`: its first 16 bytes.
fn stamp(lba: u64, i: u64) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[..8].copy_from_slice(&lba.to_le_bytes());
    s[8..].copy_from_slice(&i.to_le_bytes());
    s
}

fn run_case(name: &str, volume_bytes: u64, budget: u64, opts: &L2pBenchOpts) -> Result<L2pCase, L2pBenchError> {
    let cfg = EngineConfig { l2p_dram_bytes: budget, ..EngineConfig::default() };
    let blocks = volume_bytes / 4096;
    // Room for the widest map region (12 KiB per 1024 blocks) besides the log.
    let region = if budget == 0 { 0 } else { (blocks.div_ceil(1024) * 12) << 10 };
    let cache_bytes = (opts.log_bytes + region).div_ceil(cfg.chunk_bytes) * cfg.chunk_bytes + cfg.chunk_bytes;
    let cap_bytes = (volume_bytes * 5 / 4).div_ceil(cfg.band_bytes) * cfg.band_bytes + 6 * cfg.band_bytes;
    let path = opts.dir.join(format!("sluice-bench-l2p-{name}-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let file_opts =
        FileOptions { capacity_bytes: Some(cache_bytes), cache: CacheMode::Buffered, ..FileOptions::default() };
    let cache: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&path, &file_opts)?);
    let capacity: Arc<dyn BlockDevice> = Arc::new(CrashDevice::new(cap_bytes, 4096));
    let r = run_on(name, volume_bytes, budget, cfg, cache, capacity, opts);
    let _ = std::fs::remove_file(&path);
    r
}

fn run_on(
    name: &str,
    volume_bytes: u64,
    budget: u64,
    cfg: EngineConfig,
    cache: Arc<dyn BlockDevice>,
    capacity: Arc<dyn BlockDevice>,
    opts: &L2pBenchOpts,
) -> Result<L2pCase, L2pBenchError> {
    let blocks = volume_bytes / 4096;
    let spec = [VolumeSpec { name: "v".into(), size_bytes: volume_bytes }];
    let engine = Engine::create(cache, capacity, cfg, &spec)?;
    let vol = engine.volume("v")?;
    let mut rng = sluice_media::rng::SplitMix64(opts.seed);
    let mut model: HashMap<u64, u64> = HashMap::new();
    let qd = opts.iodepth.max(1);
    let mut bufs = vec![0u8; 4096 * qd];
    let t = Instant::now();
    let mut i = 0u64;
    while i < opts.writes {
        let n = (opts.writes - i).min(qd as u64) as usize;
        let mut writes: Vec<(u64, &[u8])> = Vec::with_capacity(n);
        for (k, b) in bufs.chunks_mut(4096).take(n).enumerate() {
            let lba = rng.below(blocks);
            b[..16].copy_from_slice(&stamp(lba, i + k as u64));
            model.insert(lba, i + k as u64);
            writes.push((lba * 4096, b));
        }
        vol.write_batch(&writes, false)?;
        i += n as u64;
    }
    vol.flush()?;
    let write_iops = opts.writes as f64 / t.elapsed().as_secs_f64();
    let verify = |vol: &dyn Volume, when: &'static str| -> Result<f64, L2pBenchError> {
        let mut buf = sluice_media::IoBuf::zeroed(4096);
        let t = Instant::now();
        for (&lba, &i) in &model {
            vol.read(lba * 4096, &mut buf)?;
            if buf[..16] != stamp(lba, i) {
                return Err(L2pBenchError::Mismatch { lba, when });
            }
        }
        Ok(model.len() as f64 / t.elapsed().as_secs_f64())
    };
    let read_iops = verify(&vol, "served")?;
    let l2p = engine.l2p_stats();
    let (cache, capacity) = engine.devices();
    drop(vol);
    drop(engine);
    let t = Instant::now();
    let engine = Engine::open(cache.clone(), capacity.clone())?;
    let crash_reopen_s = t.elapsed().as_secs_f64();
    let l2p_after_recovery = engine.l2p_stats();
    verify(&engine.volume("v")?, "after recovery")?;
    engine.shutdown()?;
    drop(engine);
    let t = Instant::now();
    let engine = Engine::open(cache, capacity)?;
    let clean_reopen_s = t.elapsed().as_secs_f64();
    verify(&engine.volume("v")?, "after a clean reopen")?;
    engine.shutdown()?;
    Ok(L2pCase {
        name: name.into(),
        volume_bytes,
        budget_bytes: budget,
        writes: opts.writes,
        distinct_blocks: model.len() as u64,
        write_iops,
        read_iops,
        crash_reopen_s,
        clean_reopen_s,
        l2p,
        l2p_after_recovery,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small sizes: a 16 GiB volume paged within 256 KiB against a 64 MiB
    /// one in DRAM; both read back after the writes, a crash and a clean
    /// reopen (every block checked each time).
    #[test]
    fn a_paged_volume_and_a_resident_one_read_back_after_recovery_and_reopen() {
        let opts = L2pBenchOpts {
            volume_bytes: 16 << 30,
            budget_bytes: 256 << 10,
            resident_volume_bytes: 64 << 20,
            writes: 20_000,
            log_bytes: 128 << 20,
            ..L2pBenchOpts::default()
        };
        let r = run(&opts).unwrap();
        let (paged, resident) = (&r.cases[0], &r.cases[1]);
        assert!(paged.l2p.paged && !resident.l2p.paged, "{r:?}");
        assert!(paged.l2p.dram_bytes < 1 << 20 && paged.l2p.page_writebacks > 0, "{r:?}");
        assert!(paged.write_iops > 0.0 && resident.read_iops > 0.0, "{r:?}");
    }
}
