//! io_uring baseline: 4 KiB random writes at a fixed queue depth on a file through
//! `FileDevice`, for a fixed wall-clock time — the same job as
//! `fio --ioengine=io_uring --direct=1 --rw=randwrite --bs=4k --iodepth=N`, so the
//! two can be compared on the same file in the same run (scripts/bench-uring.sh).
//!
//! The loop keeps exactly `iodepth` writes in flight: reap at least one, resubmit
//! each completed buffer at a new offset. Buffers are allocated once and cycled,
//! offsets come from an inline xorshift, so the measured cost is the device path
//! itself. I/O errors abort the run: a benchmark that hides errors measures nothing.
//! The device is opened with `single_reaper` (this loop is its only reaping
//! thread), the counterpart of fio's SINGLE_ISSUER|DEFER_TASKRUN ring.

use serde::Serialize;
use sluice_media::{BlockDevice, DeviceError, DeviceStats, FileDevice, FileError, FileOptions, IoBuf, IoRequest};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct UringBenchOpts {
    /// File (created/extended to `file_bytes`) or block device.
    pub path: PathBuf,
    pub file_bytes: u64,
    /// Bytes per write (and device block size).
    pub block_bytes: u64,
    pub iodepth: usize,
    pub seconds: f64,
    pub seed: u64,
}

impl Default for UringBenchOpts {
    fn default() -> UringBenchOpts {
        UringBenchOpts {
            path: PathBuf::from("/dev/shm/sluice-uring-bench"),
            file_bytes: 1 << 30,
            block_bytes: 4096,
            iodepth: 32,
            seconds: 10.0,
            seed: 1,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct UringBenchReport {
    pub path: String,
    pub file_bytes: u64,
    pub block_bytes: u64,
    pub iodepth: usize,
    /// O_DIRECT was used (false only if the filesystem refused it).
    pub direct: bool,
    /// Device options that matter for speed (see `FileOptions`).
    pub single_reaper: bool,
    pub spin_us: u32,
    /// Wall-clock seconds from the first submit to the last completion.
    pub seconds: f64,
    pub ios: u64,
    pub iops: f64,
    pub mib_per_s: f64,
    /// Submit-to-reap latency, as seen by this loop.
    pub lat_mean_us: f64,
    pub lat_max_us: f64,
    /// The device's own counters for the run.
    pub device: DeviceStats,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UringBenchError {
    #[error("bad options: {0}")]
    BadOpts(&'static str),
    #[error(transparent)]
    Open(#[from] FileError),
    #[error("write at offset {offset} failed: {error}")]
    Io { offset: u64, error: DeviceError },
}

/// xorshift64: tiny, fast, good enough for uniform offsets.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in `0..n` (multiply-high, no modulo bias worth the name).
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 as u128 * n as u128) >> 64) as u64
    }
}

pub fn run(opts: &UringBenchOpts) -> Result<UringBenchReport, UringBenchError> {
    if opts.iodepth == 0 || opts.iodepth > 32768 {
        return Err(UringBenchError::BadOpts("iodepth must be within 1..=32768"));
    }
    if opts.seconds.is_nan() || opts.seconds <= 0.0 {
        return Err(UringBenchError::BadOpts("seconds must be positive"));
    }
    let bs = opts.block_bytes;
    let dev = FileDevice::open(
        &opts.path,
        &FileOptions {
            capacity_bytes: Some(opts.file_bytes),
            block_bytes: bs,
            queue_depth: opts.iodepth as u32,
            // This loop is the only thread that reaps, as fio's job is (fio uses SINGLE_ISSUER|DEFER_TASKRUN).
            single_reaper: true,
            ..FileOptions::default()
        },
    )?;
    let blocks = dev.info().capacity_bytes / bs;
    let mut rng = XorShift::new(opts.seed);
    // Offsets of in-flight writes by slot (user_data), for error reports.
    let mut offsets = vec![0u64; opts.iodepth];
    let mut out = Vec::with_capacity(opts.iodepth);
    let (mut ios, mut lat_sum_ns, mut lat_max_ns) = (0u64, 0u128, 0u64);
    let before = dev.stats();

    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(opts.seconds);
    for (slot, offset) in offsets.iter_mut().enumerate() {
        let mut buf = IoBuf::zeroed(bs as usize);
        buf.fill(0x5a ^ slot as u8);
        *offset = rng.below(blocks) * bs;
        dev.submit(IoRequest::write(*offset, buf, slot as u64));
    }
    let mut in_flight = opts.iodepth;
    let mut running = true;
    while in_flight > 0 {
        dev.reap(1, &mut out);
        running = running && Instant::now() < deadline;
        for c in out.drain(..) {
            let slot = c.user_data as usize;
            if let Err(error) = c.result {
                return Err(UringBenchError::Io { offset: offsets[slot], error });
            }
            ios += 1;
            let lat = c.completed_ns.saturating_sub(c.submitted_ns);
            lat_sum_ns += lat as u128;
            lat_max_ns = lat_max_ns.max(lat);
            if running {
                offsets[slot] = rng.below(blocks) * bs;
                dev.submit(IoRequest::write(offsets[slot], c.buf, c.user_data));
            } else {
                in_flight -= 1;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(UringBenchReport {
        path: opts.path.display().to_string(),
        file_bytes: dev.info().capacity_bytes,
        block_bytes: bs,
        iodepth: opts.iodepth,
        direct: dev.is_direct(),
        single_reaper: true,
        spin_us: FileOptions::default().spin_us,
        seconds,
        ios,
        iops: ios as f64 / seconds,
        mib_per_s: (ios * bs) as f64 / seconds / (1024.0 * 1024.0),
        lat_mean_us: if ios == 0 { 0.0 } else { lat_sum_ns as f64 / ios as f64 / 1000.0 },
        lat_max_us: lat_max_ns as f64 / 1000.0,
        device: dev.stats().since(&before),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_run_writes_what_it_reports() {
        let path = std::env::temp_dir().join(format!("sluice-uring-bench-test-{}", std::process::id()));
        let opts =
            UringBenchOpts { path: path.clone(), file_bytes: 8 << 20, iodepth: 8, seconds: 0.2, ..Default::default() };
        let r = run(&opts);
        let _ = std::fs::remove_file(&path);
        let r = r.unwrap();
        assert!(r.ios > 0 && r.iops > 0.0);
        assert_eq!(r.device.writes, r.ios);
        assert_eq!(r.device.host_write_bytes, r.ios * 4096);
        assert_eq!(r.device.errors, 0);
    }

    #[test]
    fn offsets_are_uniform_enough() {
        let mut rng = XorShift::new(7);
        let mut hist = [0u32; 16];
        for _ in 0..160_000 {
            hist[rng.below(16) as usize] += 1;
        }
        assert!(hist.iter().all(|&h| (9_000..11_000).contains(&h)), "{hist:?}");
    }
}
