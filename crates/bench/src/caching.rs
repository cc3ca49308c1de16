//! `sluice bench caching`: caching over an emulated 7200 rpm HDD, in
//! virtual time — the experiment behind Twitter's Hadoop result (temporary
//! data on a fast cache, HDFS data on the disk).
//!
//! The workload runs two jobs at once on the same disk:
//! - **temp** (YARN's temporary data: sort spills, shuffle files): files of
//!   64 KiB–1 MiB written sequentially in 64 KiB requests into a temp
//!   region, read back once or twice in 64 KiB requests, then deleted
//!   (trimmed, as ext4 with `discard` does) while at most `live_files`
//!   other files are alive — so the peak of live temporary data is known;
//! - **hdfs**: 128 MiB block files written sequentially in 1 MiB requests
//!   into a data region, every third one read back once later.
//!
//! Cases (each a fresh world):
//! - `no-cache`: the HDD alone;
//! - `scm-only`: everything on an SCM device (the "fast SSD" bound);
//! - `cache-all`: one in-place volume, write-back, no sequential cutoff —
//!   HDFS data occupies the cache too;
//! - `selective-cutoff`: one in-place volume, write-back with the 1 MiB
//!   sequential cutoff: the streams of HDFS files bypass the cache;
//! - `selective-volume`: the temp region is its own cached volume
//!   (write-back), the data region a pass-through volume;
//! - `selective-half`: as `selective-volume` with a cache half the peak of
//!   live temporary data (spill).
//!
//! - `selective-half-retain`: as `selective-half`, the volume keeping hot
//!   blocks when their chunk is reclaimed (`CachePolicy::retain_hot`).
//!
//! Directory classes (the paper's selection by directory) need a file
//! system on the volume; the cutoff and the per-volume cases stand in for
//! them here (the filesystem test runs them over ext4).
//!
//! Eviction (`evict-fifo`, `evict-retain`) is a workload of its own, one
//! job on one write-back volume: each random 64 KiB write of long-lived
//! data to a region 8× the cache is followed by two random 64 KiB reads of a
//! hot set 0.4× the cache. Oldest-first eviction drops the hot set every lap
//! of the log and reads it from the disk again; `evict-retain` keeps blocks
//! read since they were cached (a second chance). The table's temp column
//! is this job's MiB/s.

use crate::error::BenchError;
use crate::runner::{run, Dir, Io, IoSource, Job, JobResult, Limits};
use crate::stacked::{sluice_stack, CallTime};
use serde::Serialize;
use sluice_engine::{BandPlacement, CacheMode, CachePolicy, EngineConfig, IoClass, Layout, SeqCutoff};
use sluice_media::rng::SplitMix64;
use sluice_media::{
    hdd_device, scm_device, BlockDevice, HddProfile, MemoryDevice, ScmProfile, StripedDevice, VirtualClock,
};
use std::collections::VecDeque;
use std::sync::Arc;

/// The experiment's sizes.
#[derive(Clone, Debug, Serialize)]
pub struct CachingOpts {
    /// Bytes of temporary files written in all.
    pub temp_bytes: u64,
    /// Files alive at once (the peak of live temporary data is about
    /// `live_files` × 544 KiB, the mean file size).
    pub live_files: usize,
    /// HDFS block files written (128 MiB each).
    pub hdfs_files: u64,
    pub hdfs_file_bytes: u64,
    /// Requests each job keeps in flight.
    pub iodepth: usize,
    pub seed: u64,
    /// Emulated HDDs the disk capacity is striped over (1 MiB units).
    pub disks: usize,
}

impl CachingOpts {
    pub fn quick() -> CachingOpts {
        CachingOpts {
            temp_bytes: 1 << 30,
            live_files: 256,
            hdfs_files: 6,
            hdfs_file_bytes: 128 << 20,
            iodepth: 4,
            seed: 1,
            disks: 1,
        }
    }

    pub fn full() -> CachingOpts {
        CachingOpts { temp_bytes: 4 << 30, live_files: 512, hdfs_files: 24, ..CachingOpts::quick() }
    }

    /// The data region (HDFS files) and the temp region (a ring the temp
    /// files are allocated from), 1 MiB aligned.
    fn regions(&self) -> (u64, u64) {
        let data = self.hdfs_files * self.hdfs_file_bytes;
        let temp = (self.live_files as u64 + 2) * (1 << 20) * 2;
        (data, temp)
    }
}

/// One case's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct CachingRow {
    pub case: String,
    /// Bytes written to the HDD (all disks) and its busy time (the busiest
    /// disk's) during the run.
    pub hdd_bytes_written: u64,
    pub hdd_busy_s: f64,
    /// Average HDD write rate over the run, MB/s.
    pub hdd_write_mb_per_s: f64,
    /// The temp job's bytes (read and written) over its own run time.
    pub temp_mib_per_s: f64,
    pub temp_write_p99_us: f64,
    pub temp_read_p99_us: f64,
    /// The HDFS job's bytes over its own run time.
    pub hdfs_mib_per_s: f64,
    /// The HDD alone's p99 for the temp job's 64 KiB writes (from the
    /// no-cache case), for comparison with spilling cases.
    pub spill_bytes: u64,
    /// Share of the HDFS bytes written that went past the cache.
    pub cutoff_bypass_fraction: f64,
    /// Share of the temporary files' bytes written that the sequential
    /// cutoff sent past the cache (one-volume cases: the two jobs' regions
    /// are I/O classes of share 1, which only count).
    pub temp_cutoff_fraction: f64,
    pub discarded_dirty_bytes: u64,
    pub cleaned_bytes: u64,
    /// Bytes read from the HDD (all disks) during the run.
    pub hdd_bytes_read: u64,
    /// Engine cases: read bytes found in the cache, of all read bytes.
    pub read_hit_fraction: f64,
    /// Engine cases: bytes kept when their chunk was reclaimed.
    pub retained_bytes: u64,
    pub cache_bytes: u64,
    pub peak_temp_bytes: u64,
    pub run_s: f64,
    pub errors: Vec<String>,
    /// The engine's per-volume cache counters at the end (engine cases).
    pub volumes: Vec<sluice_engine::CacheReport>,
}

/// Temporary files: written, read back once or twice, deleted.
struct TempSource {
    rng: SplitMix64,
    base: u64,
    region: u64,
    /// Next byte of the ring the next file is allocated at.
    next: u64,
    left: u64,
    live: VecDeque<(u64, u64)>,
    live_max: usize,
    queue: VecDeque<Io>,
    live_bytes: u64,
    peak_bytes: u64,
    /// Delete files with a trim (the device supports discard, as a Sluice
    /// volume does; a bare HDD does not, and a file system sends none).
    trims: bool,
}

const TEMP_IO: u64 = 64 << 10;

impl TempSource {
    fn refill(&mut self) {
        if self.left > 0 {
            let len = ((1 + self.rng.below(16)) * TEMP_IO).min(self.left);
            // Files are not allocated back to back: a file system leaves
            // free space between them (1-3 × 64 KiB here).
            self.next += (1 + self.rng.below(3)) * TEMP_IO;
            if self.next + len > self.region {
                self.next = 0;
            }
            let at = self.base + self.next;
            self.next += len;
            self.left -= len;
            for o in (0..len).step_by(TEMP_IO as usize) {
                self.queue.push_back(Io { dir: Dir::Write, offset: at + o, len: TEMP_IO.min(len - o) });
            }
            self.live.push_back((at, len));
            self.live_bytes += len;
            self.peak_bytes = self.peak_bytes.max(self.live_bytes);
        }
        if self.live.len() > self.live_max || (self.left == 0 && !self.live.is_empty()) {
            let (at, len) = self.live.pop_front().expect("a live file");
            for _ in 0..1 + self.rng.below(2) {
                for o in (0..len).step_by(TEMP_IO as usize) {
                    self.queue.push_back(Io { dir: Dir::Read, offset: at + o, len: TEMP_IO.min(len - o) });
                }
            }
            if self.trims {
                self.queue.push_back(Io { dir: Dir::Trim, offset: at, len });
            }
            self.live_bytes -= len;
        }
    }
}

impl IoSource for TempSource {
    fn next_io(&mut self) -> Option<Io> {
        while self.queue.is_empty() && (self.left > 0 || !self.live.is_empty()) {
            self.refill();
        }
        self.queue.pop_front()
    }
}

/// The temp job's source over the region at `base`.
fn temp_source(o: &CachingOpts, base: u64, region: u64, trims: bool) -> TempSource {
    TempSource {
        rng: SplitMix64(o.seed),
        base,
        region,
        next: 0,
        left: o.temp_bytes,
        live: VecDeque::new(),
        live_max: o.live_files,
        queue: VecDeque::new(),
        live_bytes: 0,
        peak_bytes: 0,
        trims,
    }
}

/// HDFS block files: written sequentially; every third read back later.
struct HdfsSource {
    base: u64,
    file_bytes: u64,
    files: u64,
    written: u64,
    queue: VecDeque<Io>,
}

const HDFS_IO: u64 = 1 << 20;

impl IoSource for HdfsSource {
    fn next_io(&mut self) -> Option<Io> {
        if self.queue.is_empty() && self.written < self.files {
            let f = self.written;
            let at = self.base + f * self.file_bytes;
            for o in (0..self.file_bytes).step_by(HDFS_IO as usize) {
                self.queue.push_back(Io { dir: Dir::Write, offset: at + o, len: HDFS_IO });
            }
            if f >= 2 && (f - 2).is_multiple_of(3) {
                let old = self.base + (f - 2) * self.file_bytes;
                for o in (0..self.file_bytes).step_by(HDFS_IO as usize) {
                    self.queue.push_back(Io { dir: Dir::Read, offset: old + o, len: HDFS_IO });
                }
            }
            self.written += 1;
        }
        self.queue.pop_front()
    }
}

pub const CASES: [&str; 9] = [
    "no-cache",
    "scm-only",
    "cache-all",
    "selective-cutoff",
    "selective-volume",
    "selective-half",
    "selective-half-retain",
    "evict-fifo",
    "evict-retain",
];

/// The eviction workload: a long-lived random write, then `EVICT_READS`
/// reads of the hot set (module doc).
struct EvictSource {
    rng: SplitMix64,
    hot: u64,
    cold_at: u64,
    cold: u64,
    left: u64,
    queue: VecDeque<Io>,
}

const EVICT_READS: usize = 2;

impl IoSource for EvictSource {
    fn next_io(&mut self) -> Option<Io> {
        if self.queue.is_empty() && self.left > 0 {
            self.left -= 1;
            let at = self.cold_at + self.rng.below(self.cold / TEMP_IO) * TEMP_IO;
            self.queue.push_back(Io { dir: Dir::Write, offset: at, len: TEMP_IO });
            for _ in 0..EVICT_READS {
                let at = self.rng.below(self.hot / TEMP_IO) * TEMP_IO;
                self.queue.push_back(Io { dir: Dir::Read, offset: at, len: TEMP_IO });
            }
        }
        self.queue.pop_front()
    }
}

/// An eviction case (`evict-fifo`, `evict-retain`): the cache is a quarter
/// of the temp workload's regions' worth, at least 128 MiB; the writes are
/// 4× the cache (quick) or 8× (full: `temp_bytes` ≥ 4 GiB).
fn run_eviction(case: &str, o: &CachingOpts, mut row: CachingRow) -> Result<CachingRow, BenchError> {
    let call = CallTime::new();
    let cache_bytes = ((o.temp_bytes / 8).max(128 << 20)).div_ceil(16 << 20) * (16 << 20);
    let (hot, cold) = ((cache_bytes * 2 / 5).div_ceil(TEMP_IO) * TEMP_IO, 8 * cache_bytes);
    let vol = hot + cold;
    let mut hdd = HddProfile::hdd_7200();
    hdd.capacity_bytes = vol + (256 << 20);
    let s = in_place_stack(cache_bytes, call, |clock| disk(&hdd, o.disks, clock), 1, vol)?;
    let capacity = s.tiers().1;
    let e = s.engine();
    let p = CachePolicy { retain_hot: case == "evict-retain", spill: false, ..CachePolicy::default() };
    e.set_cache_policy("job0", p).map_err(BenchError::Engine)?;
    let writes = if o.temp_bytes >= 4 << 30 { 8 } else { 4 } * cache_bytes / TEMP_IO;
    let src = EvictSource { rng: SplitMix64(o.seed), hot, cold_at: hot, cold, left: writes, queue: VecDeque::new() };
    let before = capacity.stats();
    let mut jobs = vec![Job { name: "mix".into(), source: Box::new(src), iodepth: o.iodepth }];
    let r = match run(&s, &mut jobs, Limits::default(), &mut |_| {}) {
        Ok(r) => r,
        Err(err) => {
            row.errors.push(err.to_string());
            return Ok(row);
        }
    };
    row.cache_bytes = cache_bytes;
    row.temp_mib_per_s = mib_s(&r.jobs[0]);
    row.temp_write_p99_us = r.jobs[0].write_lat_ns.quantile(0.99) as f64 / 1e3;
    row.temp_read_p99_us = r.jobs[0].read_lat_ns.quantile(0.99) as f64 / 1e3;
    row.run_s = r.elapsed_ns as f64 / 1e9;
    engine_counters(&mut row, &e, &capacity.stats().since(&before));
    Ok(row)
}

/// The HDD's and the engine's counters into `row`.
fn engine_counters(row: &mut CachingRow, e: &sluice_engine::Engine, hdd: &sluice_media::DeviceStats) {
    row.hdd_bytes_written = hdd.host_write_bytes;
    row.hdd_bytes_read = hdd.host_read_bytes;
    row.hdd_busy_s = hdd.busy_ns as f64 / 1e9;
    row.hdd_write_mb_per_s = if row.run_s > 0.0 { hdd.host_write_bytes as f64 / 1e6 / row.run_s } else { 0.0 };
    let rep = e.cache_report();
    row.spill_bytes = report_sum(&rep, |s| s.spill_bytes);
    row.discarded_dirty_bytes = report_sum(&rep, |s| s.discarded_dirty_bytes);
    row.cleaned_bytes = report_sum(&rep, |s| s.cleaned_bytes);
    row.retained_bytes = report_sum(&rep, |s| s.retained_bytes);
    row.read_hit_fraction = read_hit_fraction(&rep);
    row.volumes = rep;
}

/// Bytes per second of a job over its own span.
fn mib_s(j: &JobResult) -> f64 {
    let secs = j.span_ns() as f64 / 1e9;
    if secs == 0.0 {
        return 0.0;
    }
    (j.read_bytes + j.write_bytes) as f64 / (1 << 20) as f64 / secs
}

/// Run one case.
pub fn run_case(case: &str, o: &CachingOpts) -> Result<CachingRow, BenchError> {
    let (data, temp) = o.regions();
    let call = CallTime::new();
    let mut hdd = HddProfile::hdd_7200();
    // Volumes' homes, then the checkpoint and the label.
    let vb = data.max(temp);
    hdd.capacity_bytes = 2 * vb + (256 << 20);
    // The peak of live temporary data, from a dry run of the source.
    let mut dry = temp_source(o, 0, temp, true);
    while dry.next_io().is_some() {}
    let peak = dry.peak_bytes;
    let half = case.starts_with("selective-half");
    let cache_bytes = if half { peak / 2 } else { (peak * 3).max(256 << 20) };
    let cache_bytes = cache_bytes.div_ceil(16 << 20) * (16 << 20);
    let mut row = CachingRow {
        case: case.into(),
        hdd_bytes_written: 0,
        hdd_busy_s: 0.0,
        hdd_write_mb_per_s: 0.0,
        temp_mib_per_s: 0.0,
        temp_write_p99_us: 0.0,
        temp_read_p99_us: 0.0,
        hdfs_mib_per_s: 0.0,
        spill_bytes: 0,
        cutoff_bypass_fraction: 0.0,
        temp_cutoff_fraction: 0.0,
        discarded_dirty_bytes: 0,
        cleaned_bytes: 0,
        hdd_bytes_read: 0,
        read_hit_fraction: 0.0,
        retained_bytes: 0,
        cache_bytes: 0,
        peak_temp_bytes: 0,
        run_s: 0.0,
        errors: Vec::new(),
        volumes: Vec::new(),
    };
    if case.starts_with("evict-") {
        return run_eviction(case, o, row);
    }
    // (device the jobs run on, the HDD if any, the engine if any; the data
    // and temp regions' first bytes on the device)
    let (dev, hdd_dev, engine, data_at, temp_at): World = match case {
        "no-cache" => {
            let clock = VirtualClock::new();
            let d = disk(&hdd, o.disks, clock);
            (Box::new(ArcDev(d.clone())), Some(d), None, 0, vb)
        }
        "scm-only" => {
            let mut p = ScmProfile::p5800x();
            p.capacity_bytes = 2 * vb;
            let clock = VirtualClock::new();
            (Box::new(scm_device(p, Box::new(MemoryDevice::null(2 * vb, 4096)), clock)), None, None, 0, vb)
        }
        _ => {
            let one = matches!(case, "cache-all" | "selective-cutoff");
            let (vols, size) = if one { (1, 2 * vb) } else { (2, vb) };
            let s = in_place_stack(cache_bytes, call, |clock| disk(&hdd, o.disks, clock), vols, size)?;
            let capacity = s.tiers().1;
            let e = s.engine();
            let wb = CachePolicy::default();
            let set = |name: &str, p: CachePolicy| e.set_cache_policy(name, p).map_err(BenchError::Engine);
            match case {
                "cache-all" => set("job0", CachePolicy { seq_cutoff: SeqCutoff::Never, spill: false, ..wb })?,
                "selective-cutoff" => set("job0", wb)?,
                _ => {}
            }
            if one {
                // The jobs' regions as classes that admit everything: they
                // only count, so each job's cutoff bypass shows.
                let region = |name: &str, range| IoClass { range: Some(range), ..IoClass::new(name, 1.0) };
                let classes = vec![region("hdfs", (0, vb)), region("temp", (vb, 2 * vb))];
                e.set_io_classes("job0", classes).map_err(BenchError::Engine)?;
            }
            match case {
                "cache-all" | "selective-cutoff" => {}
                _ => {
                    set("job0", CachePolicy { mode: CacheMode::PassThrough, ..wb })?;
                    let retain_hot = case.ends_with("-retain");
                    set(
                        "job1",
                        CachePolicy { seq_cutoff: SeqCutoff::Never, promote_after_misses: 0, retain_hot, ..wb },
                    )?;
                }
            }
            row.cache_bytes = cache_bytes;
            (Box::new(s), Some(capacity), Some(e), 0, vb)
        }
    };
    let temp_src = temp_source(o, temp_at, temp, engine.is_some());
    let hdfs_src = HdfsSource {
        base: data_at,
        file_bytes: o.hdfs_file_bytes,
        files: o.hdfs_files,
        written: 0,
        queue: VecDeque::new(),
    };
    let hdd_before = hdd_dev.as_ref().map(|d| d.stats()).unwrap_or_default();
    let mut jobs = vec![
        Job { name: "temp".into(), source: Box::new(temp_src), iodepth: o.iodepth },
        Job { name: "hdfs".into(), source: Box::new(hdfs_src), iodepth: o.iodepth },
    ];
    let r = match run(&*dev, &mut jobs, Limits::default(), &mut |_| {}) {
        Ok(r) => r,
        Err(e) => {
            row.errors.push(e.to_string());
            return Ok(row);
        }
    };
    let (t, h) = (&r.jobs[0], &r.jobs[1]);
    row.temp_mib_per_s = mib_s(t);
    row.hdfs_mib_per_s = mib_s(h);
    row.temp_write_p99_us = t.write_lat_ns.quantile(0.99) as f64 / 1e3;
    row.temp_read_p99_us = t.read_lat_ns.quantile(0.99) as f64 / 1e3;
    row.run_s = r.elapsed_ns as f64 / 1e9;
    row.peak_temp_bytes = peak;
    let hdd = hdd_dev.as_ref().map(|d| d.stats().since(&hdd_before)).unwrap_or_default();
    if let Some(e) = &engine {
        engine_counters(&mut row, e, &hdd);
        let rep = &row.volumes;
        // HDFS bytes that went past the cache: the cutoff on one volume, the
        // data volume's pass-through on two.
        let class = |name: &str| rep[0].classes.iter().find(|c| c.class == name).map_or(0, |c| c.cutoff_bytes);
        let past = match rep.len() {
            1 => class("hdfs"),
            _ => rep[0].stats.write_past_bytes + rep[0].stats.cutoff_bypass_bytes,
        };
        row.cutoff_bypass_fraction = past as f64 / h.write_bytes.max(1) as f64;
        if rep.len() == 1 {
            row.temp_cutoff_fraction = class("temp") as f64 / t.write_bytes.max(1) as f64;
        }
    } else {
        row.hdd_bytes_written = hdd.host_write_bytes;
        row.hdd_bytes_read = hdd.host_read_bytes;
        row.hdd_busy_s = hdd.busy_ns as f64 / 1e9;
        row.hdd_write_mb_per_s = if row.run_s > 0.0 { hdd.host_write_bytes as f64 / 1e6 / row.run_s } else { 0.0 };
    }
    Ok(row)
}

/// An in-place engine over an emulated SCM cache of `cache_bytes` and the
/// capacity device `capacity` builds on the stack's device clock, with
/// `vols` volumes of `size` bytes (`Stack::tiers` gives both devices back).
pub fn in_place_stack(
    cache_bytes: u64,
    call: Arc<CallTime>,
    capacity: impl FnOnce(sluice_media::ClockRef) -> Arc<dyn BlockDevice>,
    vols: u64,
    size: u64,
) -> Result<crate::stacked::Stack<crate::stacked::SluiceExec>, BenchError> {
    let clock = call.device_clock();
    let mut scm = ScmProfile::p5800x();
    scm.capacity_bytes = cache_bytes;
    let cache: Arc<dyn BlockDevice> =
        Arc::new(scm_device(scm, Box::new(MemoryDevice::new(cache_bytes, 4096)), clock.clone()));
    let cfg = EngineConfig {
        chunk_bytes: (cache_bytes / 32).clamp(1 << 20, 16 << 20),
        layout: Layout::InPlace,
        ..EngineConfig::default()
    };
    sluice_stack(cache, capacity(clock), call, cfg, BandPlacement::PerVolume, vols, size)
}

/// One cache counter summed over the volumes of a cache report.
pub fn report_sum(rep: &[sluice_engine::CacheReport], f: fn(&sluice_engine::CacheStats) -> u64) -> u64 {
    rep.iter().map(|v| f(&v.stats)).sum()
}

/// Read bytes found in the cache, of all read bytes (0 without reads).
pub fn read_hit_fraction(rep: &[sluice_engine::CacheReport]) -> f64 {
    let (hits, misses) = (report_sum(rep, |s| s.read_hit_bytes), report_sum(rep, |s| s.read_miss_bytes));
    hits as f64 / (hits + misses).max(1) as f64
}

/// What a case runs on: the device the jobs use, the HDD if any, the
/// engine if any, and the data and temp regions' first bytes on the device.
type World = (Box<dyn BlockDevice>, Option<Arc<dyn BlockDevice>>, Option<Arc<sluice_engine::Engine>>, u64, u64);

/// The disk capacity: one emulated HDD of `hdd`'s size, or that size
/// striped over `disks` of them.
fn disk(hdd: &HddProfile, disks: usize, clock: sluice_media::ClockRef) -> Arc<dyn BlockDevice> {
    if disks <= 1 {
        return Arc::new(hdd_device(hdd.clone(), Box::new(MemoryDevice::null(hdd.capacity_bytes, 4096)), clock));
    }
    let each = hdd.capacity_bytes.div_ceil(disks as u64).div_ceil(1 << 20) << 20;
    let members: Vec<Arc<dyn BlockDevice>> = (0..disks)
        .map(|_| {
            let p = HddProfile { capacity_bytes: each, ..hdd.clone() };
            Arc::new(hdd_device(p, Box::new(MemoryDevice::null(each, 4096)), clock.clone())) as Arc<dyn BlockDevice>
        })
        .collect();
    Arc::new(StripedDevice::new(members, 1 << 20))
}

/// A shared device as a boxed one.
struct ArcDev(Arc<dyn BlockDevice>);

impl BlockDevice for ArcDev {
    fn info(&self) -> &sluice_media::DeviceInfo {
        self.0.info()
    }
    fn submit(&self, req: sluice_media::IoRequest) {
        self.0.submit(req)
    }
    fn reap(&self, min: usize, out: &mut Vec<sluice_media::IoCompletion>) -> usize {
        self.0.reap(min, out)
    }
    fn in_flight(&self) -> usize {
        self.0.in_flight()
    }
    fn stats(&self) -> sluice_media::DeviceStats {
        self.0.stats()
    }
}

/// Every case (or those named in `only`).
pub fn run_all(o: &CachingOpts, only: Option<&str>) -> Result<Vec<CachingRow>, BenchError> {
    let mut rows = Vec::new();
    for case in CASES.iter().filter(|c| only.is_none_or(|o| o.split(',').any(|x| x == **c))) {
        rows.push(run_case(case, o)?);
    }
    Ok(rows)
}

/// The table the command prints.
pub fn table(rows: &[CachingRow]) -> String {
    let mut s = format!(
        "{:<21} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>6} {:>8} {:>7}\n",
        "case",
        "hdd MiB",
        "hdd rd",
        "hdd busy",
        "hdd MB/s",
        "temp MiB/s",
        "temp w p99",
        "hdfs MiB/s",
        "spill MiB",
        "discard",
        "bypass",
        "temp cut",
        "hits",
        "retained",
        "errors"
    );
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    for r in rows {
        s += &format!(
            "{:<21} {:>9.0} {:>8.0}M {:>8.1}s {:>9.1} {:>10.1} {:>8.0}us {:>10.1} {:>9.0} {:>8.0}M {:>8.1}% {:>8.1}% {:>5.1}% {:>7.0}M {:>7}\n",
            r.case,
            mib(r.hdd_bytes_written),
            mib(r.hdd_bytes_read),
            r.hdd_busy_s,
            r.hdd_write_mb_per_s,
            r.temp_mib_per_s,
            r.temp_write_p99_us,
            r.hdfs_mib_per_s,
            mib(r.spill_bytes),
            mib(r.discarded_dirty_bytes),
            r.cutoff_bypass_fraction * 100.0,
            r.temp_cutoff_fraction * 100.0,
            r.read_hit_fraction * 100.0,
            mib(r.retained_bytes),
            r.errors.len()
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The temp source writes every byte once, reads each file back, and
    /// trims it, never holding more than `live_files` + 1 files.
    #[test]
    fn temp_files_are_written_read_and_deleted() {
        let mut src = TempSource {
            rng: SplitMix64(5),
            base: 1 << 30,
            region: 64 << 20,
            next: 0,
            left: 32 << 20,
            live: VecDeque::new(),
            live_max: 8,
            queue: VecDeque::new(),
            live_bytes: 0,
            peak_bytes: 0,
            trims: true,
        };
        let (mut w, mut r, mut t) = (0, 0, 0);
        while let Some(io) = src.next_io() {
            assert!(io.offset >= 1 << 30 && io.offset + io.len <= (1 << 30) + (64 << 20));
            match io.dir {
                Dir::Write => w += io.len,
                Dir::Read => r += io.len,
                Dir::Trim => t += io.len,
                Dir::Flush => {}
            }
        }
        assert_eq!((w, t), (32 << 20, 32 << 20));
        assert!(r >= w && r <= 2 * w);
        assert!(src.peak_bytes <= 9 << 20);
    }

    /// A small run of every case completes without errors, the cases that
    /// keep temporary data off the disk write less to it, and retention
    /// keeps a hot set that FIFO eviction loses.
    #[test]
    fn every_case_runs_and_selective_caching_spares_the_disk() {
        let o = CachingOpts {
            temp_bytes: 32 << 20,
            live_files: 16,
            hdfs_files: 2,
            hdfs_file_bytes: 16 << 20,
            iodepth: 2,
            seed: 1,
            disks: 1,
        };
        let rows = run_all(&o, None).unwrap();
        for r in &rows {
            assert!(r.errors.is_empty(), "{}: {:?}", r.case, r.errors);
            assert!(r.temp_mib_per_s > 0.0, "{}", r.case);
        }
        let by = |c: &str| rows.iter().find(|r| r.case == c).unwrap();
        assert!(by("selective-volume").hdd_bytes_written < by("no-cache").hdd_bytes_written);
        assert!(by("selective-volume").cutoff_bypass_fraction >= 0.99);
        assert_eq!(by("scm-only").hdd_bytes_written, 0);
        // A second chance keeps the hot set: fewer misses, fewer disk reads.
        let (fifo, retain) = (by("evict-fifo"), by("evict-retain"));
        assert!(fifo.retained_bytes == 0 && retain.retained_bytes > 0);
        assert!(
            retain.read_hit_fraction > fifo.read_hit_fraction,
            "{} vs {}",
            retain.read_hit_fraction,
            fifo.read_hit_fraction
        );
        assert!(retain.hdd_bytes_read < fifo.hdd_bytes_read);
        // Striped over two disks, each disk is busy for less of the work
        // (the busiest one's time is reported).
        let (one, two) = (by("no-cache"), run_case("no-cache", &CachingOpts { disks: 2, ..o.clone() }).unwrap());
        assert!(two.errors.is_empty() && two.hdd_busy_s < one.hdd_busy_s, "{} vs {}", two.hdd_busy_s, one.hdd_busy_s);
        assert_eq!(two.hdd_bytes_written, one.hdd_bytes_written);
    }
}
