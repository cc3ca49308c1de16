//! The job runner: keeps every job's queue depth full against one device and
//! measures what came back.
//!
//! Jobs are I/O sources (fio job instances, trace replays). Each job has up to
//! `iodepth` requests in flight; when one completes the job submits its next.
//! Completions come back in device-clock order, so under a `VirtualClock` the
//! run is a deterministic discrete-event simulation and per-job bandwidth is
//! bytes / virtual time. Buffers are recycled per job: no allocation per I/O.
//!
//! A run stops when any `Limits` bound is reached (host bytes, media bytes
//! programmed, device time, I/O count) or every source is exhausted; requests
//! already in flight are drained and counted. Any failed request aborts the
//! run with a typed error: a benchmark never hides an I/O error.

use sluice_media::{BlockDevice, DeviceError, DeviceStats, IoBuf, IoCompletion, IoOp, IoRequest};

/// A system's device, ready to run on.
pub struct Built {
    pub dev: Box<dyn BlockDevice>,
    /// NAND capacity, on devices that model NAND; on stacks, the capacity
    /// device's size. Random preconditioning runs until the medium has
    /// programmed this × `steady_state_drive_writes` beyond the fill.
    pub physical_bytes: Option<u64>,
    /// The device's (virtual) clock.
    pub clock: sluice_media::ClockRef,
    /// On stacked systems: (cache, capacity) devices underneath.
    pub tiers: Option<(std::sync::Arc<dyn BlockDevice>, std::sync::Arc<dyn BlockDevice>)>,
    /// On Sluice stacks: the engine, for its own counters.
    pub engine: Option<std::sync::Arc<sluice_engine::Engine>>,
}

/// Direction of one generated I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Read,
    Write,
    Trim,
    Flush,
}

/// One generated I/O: absolute device byte offset and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Io {
    pub dir: Dir,
    pub offset: u64,
    pub len: u64,
}

/// Anything that yields I/Os for one job.
pub trait IoSource {
    fn next_io(&mut self) -> Option<Io>;
}

/// A job: a source and how many of its I/Os may be in flight.
pub struct Job {
    pub name: String,
    pub source: Box<dyn IoSource>,
    pub iodepth: usize,
}

/// When to stop a run (all optional; the first reached ends it).
#[derive(Clone, Copy, Debug, Default)]
pub struct Limits {
    pub host_bytes_max: Option<u64>,
    pub media_program_bytes_max: Option<u64>,
    pub device_ns_max: Option<u64>,
    pub ios_max: Option<u64>,
}

/// Latency histogram: an HDR histogram (3 significant digits: any value is
/// reported within 0.1 %), growing to whatever it records.
#[derive(Clone, Debug)]
pub struct Histogram(hdrhistogram::Histogram<u64>);

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram(hdrhistogram::Histogram::new(3).expect("3 significant digits is a valid precision"))
    }
}

impl Histogram {
    pub fn record(&mut self, v: u64) {
        // `record` grows the range; only values past i64::MAX / 2 fail, and
        // those are clamped.
        if self.0.record(v).is_err() {
            self.0.saturating_record(v);
        }
    }

    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// Add another histogram's samples to this one.
    pub fn merge(&mut self, other: &Histogram) {
        // Both auto-resize, so adding cannot run out of range.
        self.0.add(&other.0).expect("auto-resizing histograms add");
    }

    /// Value at quantile `q` in [0, 1] (the highest value equivalent to it
    /// at the histogram's precision); 0 if empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.0.is_empty() {
            return 0;
        }
        self.0.value_at_quantile(q)
    }
}

/// What one job did during the run.
#[derive(Clone, Debug, Default)]
pub struct JobResult {
    pub name: String,
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_lat_ns: Histogram,
    pub write_lat_ns: Histogram,
    /// Device time of the job's first submission and last completion.
    pub first_ns: Option<u64>,
    pub last_ns: u64,
}

impl JobResult {
    /// Device time from the job's first submission to its last completion.
    pub fn span_ns(&self) -> u64 {
        self.first_ns.map_or(0, |f| self.last_ns.saturating_sub(f))
    }
}

/// The outcome of a run.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub jobs: Vec<JobResult>,
    /// Device time from the first submission to the last completion.
    pub elapsed_ns: u64,
    /// Device counters over the run.
    pub device: DeviceStats,
}

impl RunResult {
    pub fn write_bytes(&self) -> u64 {
        self.jobs.iter().map(|j| j.write_bytes).sum()
    }
    pub fn read_bytes(&self) -> u64 {
        self.jobs.iter().map(|j| j.read_bytes).sum()
    }
    /// Mean per-job MiB/s of `bytes` (the CSAL paper reports per-job numbers).
    pub fn per_job_mib_s(&self, bytes: u64) -> f64 {
        if self.elapsed_ns == 0 || self.jobs.is_empty() {
            return 0.0;
        }
        bytes as f64 / (1 << 20) as f64 / (self.elapsed_ns as f64 / 1e9) / self.jobs.len() as f64
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    #[error("job {job}: {op:?} failed: {source}")]
    Io { job: String, op: IoOp, source: DeviceError },
    #[error("job {job} has iodepth 0")]
    NoDepth { job: String },
}

const JOB_SHIFT: u32 = 40;

/// Run `jobs` against `dev` until `limits` or exhaustion; `progress` gets a
/// fraction in [0, 1] (of the tightest limit) now and then.
pub fn run(
    dev: &dyn BlockDevice,
    jobs: &mut [Job],
    limits: Limits,
    progress: &mut dyn FnMut(f64),
) -> Result<RunResult, RunError> {
    let start_stats = dev.stats();
    let mut results: Vec<JobResult> =
        jobs.iter().map(|j| JobResult { name: j.name.clone(), ..Default::default() }).collect();
    let mut free_bufs: Vec<Vec<IoBuf>> = jobs.iter().map(|_| Vec::new()).collect();
    let mut exhausted = vec![false; jobs.len()];
    let mut in_flight = vec![0usize; jobs.len()];
    let mut submitted_ios = 0u64;
    let mut host_bytes = 0u64;
    let mut first_ns: Option<u64> = None;
    let mut last_ns = 0u64;
    let mut stopping = false;
    let mut out: Vec<IoCompletion> = Vec::with_capacity(256);
    let mut next_report = 0u64;

    let submit_one = |ji: usize,
                      jobs: &mut [Job],
                      free_bufs: &mut [Vec<IoBuf>],
                      exhausted: &mut [bool],
                      in_flight: &mut [usize],
                      host_bytes: &mut u64|
     -> bool {
        let Some(io) = jobs[ji].source.next_io() else {
            exhausted[ji] = true;
            return false;
        };
        let ud = ((ji as u64) << JOB_SHIFT) | (io.len & ((1 << JOB_SHIFT) - 1));
        let take = |pool: &mut Vec<IoBuf>, len: u64| match pool.iter().position(|b| b.len() as u64 == len) {
            Some(i) => pool.swap_remove(i),
            None => IoBuf::zeroed(len as usize),
        };
        let req = match io.dir {
            Dir::Read => {
                let buf = take(&mut free_bufs[ji], io.len);
                IoRequest { op: IoOp::Read, offset: io.offset, len: io.len, buf, fua: false, user_data: ud }
            }
            Dir::Write => {
                let buf = take(&mut free_bufs[ji], io.len);
                *host_bytes += io.len;
                IoRequest::write(io.offset, buf, ud)
            }
            Dir::Trim => IoRequest::discard(io.offset, io.len, ud),
            Dir::Flush => IoRequest::flush(ud),
        };
        dev.submit(req);
        in_flight[ji] += 1;
        true
    };

    for job in jobs.iter() {
        if job.iodepth == 0 {
            return Err(RunError::NoDepth { job: job.name.clone() });
        }
    }
    // Fill every job's queue.
    for ji in 0..jobs.len() {
        while in_flight[ji] < jobs[ji].iodepth
            && !exhausted[ji]
            && submit_one(ji, jobs, &mut free_bufs, &mut exhausted, &mut in_flight, &mut host_bytes)
        {
            submitted_ios += 1;
        }
    }
    while in_flight.iter().any(|&n| n > 0) {
        out.clear();
        dev.reap(1, &mut out);
        for c in out.drain(..) {
            let ji = (c.user_data >> JOB_SHIFT) as usize;
            in_flight[ji] -= 1;
            let result = &mut results[ji];
            if let Err(e) = c.result {
                return Err(RunError::Io { job: result.name.clone(), op: c.op, source: e });
            }
            first_ns = Some(first_ns.map_or(c.submitted_ns, |f| f.min(c.submitted_ns)));
            last_ns = last_ns.max(c.completed_ns);
            result.first_ns = Some(result.first_ns.map_or(c.submitted_ns, |f| f.min(c.submitted_ns)));
            result.last_ns = result.last_ns.max(c.completed_ns);
            let lat = c.completed_ns - c.submitted_ns;
            let len = c.user_data & ((1 << JOB_SHIFT) - 1);
            match c.op {
                IoOp::Read => {
                    result.reads += 1;
                    result.read_bytes += len;
                    result.read_lat_ns.record(lat);
                }
                IoOp::Write => {
                    result.writes += 1;
                    result.write_bytes += len;
                    result.write_lat_ns.record(lat);
                }
                _ => {}
            }
            if !c.buf.is_empty() {
                free_bufs[ji].push(c.buf);
            }
            if !stopping {
                let media = dev.stats().media_program_bytes - start_stats.media_program_bytes;
                let elapsed = last_ns - first_ns.unwrap_or(0);
                let fracs = [
                    limits.host_bytes_max.map(|m| host_bytes as f64 / m as f64),
                    limits.media_program_bytes_max.map(|m| media as f64 / m as f64),
                    limits.device_ns_max.map(|m| elapsed as f64 / m as f64),
                    limits.ios_max.map(|m| submitted_ios as f64 / m as f64),
                ];
                let frac = fracs.iter().flatten().fold(0.0f64, |a, &b| a.max(b));
                if frac >= 1.0 {
                    stopping = true;
                } else if submitted_ios >= next_report {
                    progress(frac);
                    next_report = submitted_ios + 4096;
                }
            }
            if !stopping
                && !exhausted[ji]
                && submit_one(ji, jobs, &mut free_bufs, &mut exhausted, &mut in_flight, &mut host_bytes)
            {
                submitted_ios += 1;
            }
        }
    }
    progress(1.0);
    Ok(RunResult {
        jobs: results,
        elapsed_ns: last_ns - first_ns.unwrap_or(0),
        device: dev.stats().since(&start_stats),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_media::{MemoryDevice, VirtualClock};

    struct Seq {
        next: u64,
        end: u64,
        bs: u64,
        dir: Dir,
    }
    impl IoSource for Seq {
        fn next_io(&mut self) -> Option<Io> {
            if self.next >= self.end {
                return None;
            }
            let io = Io { dir: self.dir, offset: self.next, len: self.bs };
            self.next += self.bs;
            Some(io)
        }
    }

    #[test]
    fn histogram_quantiles_are_close() {
        let mut h = Histogram::default();
        for v in 1..=10_000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        assert!((p50 / 5_000_000.0 - 1.0).abs() < 0.001, "{p50}");
        let p99 = h.quantile(0.99) as f64;
        assert!((p99 / 9_900_000.0 - 1.0).abs() < 0.001, "{p99}");
        assert_eq!(Histogram::default().quantile(0.5), 0);
        // Latencies 3 % apart stay apart (buckets 12.5 % wide merged them).
        let mut two = Histogram::default();
        two.record(4_194_300);
        two.record(4_320_000);
        assert!(two.quantile(0.5) < 4_200_000 && two.quantile(1.0) >= 4_320_000, "{:?}", two.quantile(0.5));
        let mut merged = Histogram::default();
        merged.merge(&two);
        merged.merge(&h);
        assert_eq!(merged.count(), 10_002);
    }

    #[test]
    fn runs_jobs_to_exhaustion_and_counts_bytes() {
        let dev = MemoryDevice::new(8 << 20, 4096);
        let mut jobs = vec![
            Job {
                name: "a".into(),
                source: Box::new(Seq { next: 0, end: 4 << 20, bs: 65536, dir: Dir::Write }),
                iodepth: 4,
            },
            Job {
                name: "b".into(),
                source: Box::new(Seq { next: 4 << 20, end: 8 << 20, bs: 4096, dir: Dir::Read }),
                iodepth: 2,
            },
        ];
        let r = run(&dev, &mut jobs, Limits::default(), &mut |_| {}).unwrap();
        assert_eq!(r.jobs[0].write_bytes, 4 << 20);
        assert_eq!(r.jobs[0].writes, 64);
        assert_eq!(r.jobs[1].read_bytes, 4 << 20);
        assert_eq!(r.device.host_write_bytes, 4 << 20);
        assert_eq!(r.write_bytes(), 4 << 20);
    }

    #[test]
    fn stops_at_limit_and_reports_errors() {
        let dev = MemoryDevice::new(8 << 20, 4096);
        let mut jobs = vec![Job {
            name: "a".into(),
            source: Box::new(Seq { next: 0, end: 8 << 20, bs: 4096, dir: Dir::Write }),
            iodepth: 8,
        }];
        let r = run(&dev, &mut jobs, Limits { ios_max: Some(100), ..Default::default() }, &mut |_| {}).unwrap();
        assert!(r.jobs[0].writes >= 100 && r.jobs[0].writes < 110, "{}", r.jobs[0].writes);

        let mut bad = vec![Job {
            name: "past-end".into(),
            source: Box::new(Seq { next: 8 << 20, end: 9 << 20, bs: 4096, dir: Dir::Write }),
            iodepth: 1,
        }];
        assert!(matches!(
            run(&dev, &mut bad, Limits::default(), &mut |_| {}),
            Err(RunError::Io { source: DeviceError::OutOfRange { .. }, .. })
        ));
    }

    #[test]
    fn virtual_time_bandwidth_reflects_the_device() {
        use sluice_media::ssd::{ssd_device, SsdProfile};
        let clock = VirtualClock::new();
        let mut p = SsdProfile::tlc(256 << 20);
        p.erase_block_ius = 256;
        let dev = ssd_device(p, Box::new(MemoryDevice::null(256 << 20, 4096)), clock);
        let mut jobs = vec![Job {
            name: "seq".into(),
            source: Box::new(Seq { next: 0, end: 128 << 20, bs: 128 << 10, dir: Dir::Write }),
            iodepth: 32,
        }];
        let r = run(&dev, &mut jobs, Limits::default(), &mut |_| {}).unwrap();
        let mib_s = r.per_job_mib_s(r.write_bytes());
        // Bounded by the 3.2 GB/s link and 128 dies × 4 KiB / 160 µs ≈ 3.3 GB/s.
        assert!(mib_s > 1000.0 && mib_s < 3200.0, "{mib_s}");
        assert!(r.jobs[0].write_lat_ns.quantile(0.5) > 0);
    }
}
