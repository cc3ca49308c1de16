//! `sluice advise`: how big a cache a recorded workload needs, and what it
//! does to each device's endurance.
//!
//! Owns: the live-data profile of a trace ([`LiveProfile`]), the cache-size
//! curve (the trace replayed in virtual time through an in-place engine at
//! several cache sizes, [`CurvePoint`]), the recommendation and the
//! endurance projection ([`Advice`]).
//!
//! - **Live data** is what was written and not trimmed since the trace
//!   began (block-granular: writes round out to 4 KiB blocks, trims round
//!   in). Its level is sampled per 100 ms of trace time (the highest level
//!   in each interval); the peak and the 95th percentile are over those
//!   samples. Twitter sized their temp-data SSD at the p95 of the peak
//!   temporary data; that figure is reported beside the recommendation.
//! - **The curve**: at each cache size the trace is replayed open loop at
//!   its own timestamps on a fresh in-place engine (SCM cache of that size,
//!   write-back with the volume's policy, over the chosen capacity device),
//!   counting the capacity device's bytes written and read, the bytes that
//!   spilled past a full cache, the read hit ratio and the cache device's
//!   bytes written. Data still dirty at the end counts as written home
//!   (write-back would clean it eventually); without a cache every write
//!   goes to the capacity device.
//! - **The recommendation** is the knee of the curve: the smallest measured
//!   size that keeps 90 % of the largest size's reduction in capacity bytes
//!   written, and, if the trace reads, a hit ratio within 5 points of the
//!   best. If no size saves 5 % of the capacity writes or improves the hit
//!   ratio by 5 points, no cache is recommended.
//! - **Endurance**: each device's bytes per day at the trace's own rate,
//!   against its rating (`sluice_media::endurance`): years until a flash
//!   device's rated bytes written are used, or the share of a disk's annual
//!   workload rate.
//!
//! Invariants: the replay is deterministic (virtual time, no RNG), so the
//! same trace gives the same advice; a trace is streamed, never loaded
//! whole, and read once per cache size.
//!
//! Its own crate, apart from the benchmarks (`sluice-bench`), whose
//! emulated stacks and trace replay it drives: the advisor is a product
//! an operator runs on their own trace, the benchmarks are the lab's.
//!
//! Why replay rather than a model: the engine's reclaim, retention,
//! sequential cutoff and spill shape the curve, and the only faithful model
//! of them is the engine itself.

use serde::Serialize;
use sluice_bench::caching::{in_place_stack, read_hit_fraction, report_sum};
use sluice_bench::error::BenchError;
use sluice_bench::stacked::CallTime;
use sluice_bench::trace::{replay, whole_blocks, TraceReport};
use sluice_engine::CachePolicy;
use sluice_media::endurance::{Endurance, Projection};
use sluice_media::ssd::{ssd_device, SsdProfile};
use sluice_media::{hdd_device, BlockDevice, HddProfile, MemoryDevice, ScmProfile};
use sluice_workload::{TraceError, TraceOp, TraceReader, TraceRecord};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;

const BLOCK: u64 = 4096;
/// Live data is sampled per this much trace time.
const SAMPLE_US: u64 = 100_000;

/// The capacity device the cache sits in front of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CapacityKind {
    Hdd,
    Qlc,
    Tlc,
}

impl std::str::FromStr for CapacityKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hdd" => Ok(CapacityKind::Hdd),
            "qlc" => Ok(CapacityKind::Qlc),
            "tlc" => Ok(CapacityKind::Tlc),
            _ => Err(format!("capacity {s:?}: hdd, qlc or tlc")),
        }
    }
}

impl CapacityKind {
    /// The real device a projection assumes (the emulated profile's drive).
    fn device_bytes(self) -> u64 {
        match self {
            CapacityKind::Hdd => HddProfile::hdd_7200().capacity_bytes,
            CapacityKind::Qlc => 15_360_000_000_000,
            CapacityKind::Tlc => 7_680_000_000_000,
        }
    }

    fn endurance(self) -> Endurance {
        match self {
            CapacityKind::Hdd => HddProfile::hdd_7200().endurance(),
            CapacityKind::Qlc => SsdProfile::qlc(1 << 30).endurance(),
            CapacityKind::Tlc => SsdProfile::tlc(1 << 30).endurance(),
        }
    }

    /// An emulated device of this kind holding `bytes`.
    fn device(self, bytes: u64, clock: sluice_media::ClockRef) -> Arc<dyn BlockDevice> {
        let backend = |n| Box::new(MemoryDevice::null(n, BLOCK));
        match self {
            CapacityKind::Hdd => {
                let p = HddProfile { capacity_bytes: bytes, ..HddProfile::hdd_7200() };
                Arc::new(hdd_device(p, backend(bytes), clock))
            }
            CapacityKind::Qlc | CapacityKind::Tlc => {
                let p = if self == CapacityKind::Qlc { SsdProfile::qlc(bytes) } else { SsdProfile::tlc(bytes) };
                Arc::new(ssd_device(p, backend(bytes), clock))
            }
        }
    }
}

/// What the advisor is asked.
#[derive(Clone, Debug)]
pub struct AdviseOpts {
    pub capacity: CapacityKind,
    /// Cache sizes to replay; `None`: multiples of the peak of live data.
    pub sizes: Option<Vec<u64>>,
    /// The volume's size; `None`: from the trace's header, else its
    /// highest byte rounded up to 1 GiB.
    pub volume_bytes: Option<u64>,
    pub policy: CachePolicy,
    /// Requests in flight at most during a replay.
    pub inflight_max: usize,
    /// The cache device the endurance projection assumes; `None`: the
    /// recommended size.
    pub cache_device_bytes: Option<u64>,
}

impl Default for AdviseOpts {
    fn default() -> AdviseOpts {
        AdviseOpts {
            capacity: CapacityKind::Hdd,
            sizes: None,
            volume_bytes: None,
            policy: CachePolicy::default(),
            inflight_max: 32,
            cache_device_bytes: None,
        }
    }
}

/// Block-granular byte extents, with their total.
#[derive(Default)]
struct Extents {
    map: BTreeMap<u64, u64>,
    total: u64,
}

impl Extents {
    fn insert(&mut self, mut s: u64, mut e: u64) {
        if s >= e {
            return;
        }
        if let Some((&ps, &pe)) = self.map.range(..=s).next_back() {
            if pe >= s {
                self.map.remove(&ps);
                self.total -= pe - ps;
                (s, e) = (ps, e.max(pe));
            }
        }
        while let Some((&ns, &ne)) = self.map.range(s..=e).next() {
            self.map.remove(&ns);
            self.total -= ne - ns;
            e = e.max(ne);
        }
        self.map.insert(s, e);
        self.total += e - s;
    }

    fn remove(&mut self, s: u64, e: u64) {
        if s >= e {
            return;
        }
        if let Some((&ps, &pe)) = self.map.range(..s).next_back() {
            if pe > s {
                self.map.insert(ps, s);
                self.total -= pe - s;
                if pe > e {
                    self.map.insert(e, pe);
                    self.total += pe - e;
                }
            }
        }
        while let Some((&ns, &ne)) = self.map.range(s..e).next() {
            self.map.remove(&ns);
            self.total -= ne - ns;
            if ne > e {
                self.map.insert(e, ne);
                self.total += ne - e;
            }
        }
    }
}

/// The trace's shape: volumes of traffic and of live data.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LiveProfile {
    pub records: u64,
    pub duration_s: f64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub trim_bytes: u64,
    /// The highest byte addressed.
    pub footprint_bytes: u64,
    pub peak_live_bytes: u64,
    pub p95_live_bytes: u64,
    pub peak_at_s: f64,
    /// (seconds, live bytes): at most ~200 points, for a chart.
    pub timeline: Vec<(f64, u64)>,
}

/// One pass over the records: the live-data profile.
pub fn live_profile(records: impl Iterator<Item = Result<TraceRecord, TraceError>>) -> Result<LiveProfile, TraceError> {
    let mut p = LiveProfile::default();
    let mut live = Extents::default();
    let mut samples: Vec<u64> = Vec::new();
    let mut t0 = None;
    let mut last_us = 0;
    for rec in records {
        let r = rec?;
        let t = r.timestamp_us.saturating_sub(*t0.get_or_insert(r.timestamp_us));
        last_us = last_us.max(t);
        let bucket = (t / SAMPLE_US) as usize;
        // Idle intervals hold the level the last one ended with.
        while samples.len() <= bucket {
            samples.push(live.total);
        }
        p.records += 1;
        p.footprint_bytes = p.footprint_bytes.max(r.offset + r.size);
        // Writes cover the blocks they touch, trims only those they cover
        // whole (`whole_blocks`).
        let blocks = whole_blocks(r, BLOCK).map(|b| (b.offset, b.offset + b.size));
        match (r.op, blocks) {
            (TraceOp::Write, Some((s, e))) => live.insert(s, e),
            (TraceOp::Trim, Some((s, e))) => live.remove(s, e),
            _ => {}
        }
        match r.op {
            TraceOp::Write => p.write_bytes += r.size,
            TraceOp::Trim => p.trim_bytes += r.size,
            TraceOp::Read => p.read_bytes += r.size,
            TraceOp::Flush => {}
        }
        if live.total > p.peak_live_bytes {
            p.peak_live_bytes = live.total;
            p.peak_at_s = t as f64 / 1e6;
        }
        samples[bucket] = samples[bucket].max(live.total);
    }
    p.duration_s = last_us as f64 / 1e6;
    let step = samples.len().div_ceil(200).max(1);
    p.timeline = samples
        .chunks(step)
        .enumerate()
        .map(|(i, c)| ((i * step) as f64 * SAMPLE_US as f64 / 1e6, c.iter().copied().max().unwrap_or(0)))
        .collect();
    let mut sorted = samples;
    sorted.sort_unstable();
    p.p95_live_bytes = sorted.get((sorted.len() * 95 / 100).min(sorted.len().saturating_sub(1))).copied().unwrap_or(0);
    Ok(p)
}

/// One cache size's replay.
#[derive(Clone, Debug, Serialize)]
pub struct CurvePoint {
    pub cache_bytes: u64,
    /// Bytes written to the capacity device, with the data still dirty at
    /// the end (which write-back cleans home later).
    pub capacity_write_bytes: u64,
    pub capacity_read_bytes: u64,
    pub dirty_end_bytes: u64,
    pub spill_bytes: u64,
    /// Read bytes served by the cache, of all read bytes.
    pub read_hit_fraction: f64,
    pub cache_write_bytes: u64,
    pub discarded_dirty_bytes: u64,
    pub cleaned_bytes: u64,
    pub write_p99_us: f64,
    pub read_p99_us: f64,
    pub replay_s: f64,
    pub error: Option<String>,
}

/// A device's traffic and what it means for its rating.
#[derive(Clone, Debug, Serialize)]
pub struct EnduranceRow {
    pub device: String,
    pub device_bytes: u64,
    pub endurance: Endurance,
    pub projection: Projection,
}

/// Everything `sluice advise` reports.
#[derive(Clone, Debug, Serialize)]
pub struct Advice {
    pub capacity: CapacityKind,
    pub volume_bytes: u64,
    pub profile: LiveProfile,
    /// Without a cache: every write and read goes to the capacity device.
    pub no_cache_write_bytes: u64,
    pub no_cache_read_bytes: u64,
    pub curve: Vec<CurvePoint>,
    /// `None`: no measured size pays (see `reason`).
    pub recommended_bytes: Option<u64>,
    pub reason: String,
    /// Twitter's rule: the p95 of the live data.
    pub p95_rule_bytes: u64,
    /// Per device at the recommended size (without a cache if none).
    pub endurance: Vec<EnduranceRow>,
}

/// Errors of the advisor.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdviseError {
    #[error("{path}: {source}")]
    Open { path: String, source: std::io::Error },
    #[error("{0}")]
    Trace(#[from] TraceError),
    #[error("the trace has no writes or reads")]
    Empty,
    #[error("cache size {0} bytes: the advisor replays caches of 64 MiB or more")]
    TooSmall(u64),
    #[error("{0}")]
    Bench(#[from] BenchError),
}

fn open(path: &Path) -> Result<TraceReader<std::io::BufReader<std::fs::File>>, AdviseError> {
    let f =
        std::fs::File::open(path).map_err(|source| AdviseError::Open { path: path.display().to_string(), source })?;
    Ok(TraceReader::new(std::io::BufReader::with_capacity(1 << 20, f)))
}

/// The volume's name and size a trace recorded by `sluice serve` states
/// in its first line (`# sluice trace: volume "v", size N bytes, ...`).
pub fn trace_header(path: &Path) -> Option<(String, u64)> {
    let f = std::fs::File::open(path).ok()?;
    let mut first = String::new();
    std::io::BufReader::new(f).read_line(&mut first).ok()?;
    let rest = first.strip_prefix("# sluice trace: volume ")?;
    let (name, rest) = rest.split_once(", size ")?;
    let name = name.strip_prefix('"')?.strip_suffix('"')?.to_string();
    Some((name, rest.split(' ').next()?.parse().ok()?))
}

/// What the disk alone would be asked to write and read: the trace's
/// writes and reads clamped to the volume and widened to whole blocks, as
/// the curve's replays count them (so the "none" row and the curve compare
/// like with like; the trace's own byte counts can be smaller).
fn disk_bytes_without_cache(path: &Path, volume_bytes: u64) -> Result<(u64, u64), AdviseError> {
    let (mut w, mut r) = (0, 0);
    for rec in open(path)? {
        let rec = rec?;
        match (rec.op, aligned(rec, volume_bytes)) {
            (TraceOp::Write, Some(b)) => w += b.size,
            (TraceOp::Read, Some(b)) => r += b.size,
            _ => {}
        }
    }
    Ok((w, r))
}

/// A record clamped to the volume, in whole blocks (`whole_blocks`).
fn aligned(r: TraceRecord, volume_bytes: u64) -> Option<TraceRecord> {
    let (s, e) = (r.offset.min(volume_bytes), (r.offset + r.size).min(volume_bytes));
    whole_blocks(TraceRecord { offset: s, size: e - s, ..r }, BLOCK)
}

/// Replay the trace at one cache size.
fn replay_at(path: &Path, o: &AdviseOpts, volume_bytes: u64, cache_bytes: u64) -> Result<CurvePoint, AdviseError> {
    // The volume's home, then the checkpoint and the label.
    let capacity_bytes = (volume_bytes + (256 << 20)).div_ceil(1 << 30) << 30;
    let s = in_place_stack(
        cache_bytes,
        CallTime::new(),
        |clock| o.capacity.device(capacity_bytes, clock),
        1,
        volume_bytes,
    )?;
    let (cache, capacity) = s.tiers();
    let e = s.engine();
    e.set_cache_policy("job0", o.policy).map_err(BenchError::Engine)?;
    let records = open(path)?.filter_map(|r| r.map(|r| aligned(r, volume_bytes)).transpose());
    let clock = s.clock();
    let result = replay(&s, &*clock, records, o.inflight_max);
    let (cap, cached) = (capacity.stats(), cache.stats());
    let rep = e.cache_report();
    let sum = |f| report_sum(&rep, f);
    let dirty_end: u64 = rep.iter().map(|v| v.dirty_bytes).sum();
    let (report, error): (Option<TraceReport>, _) = match result {
        Ok(r) => (Some(r), None),
        Err(err) => (None, Some(err.to_string())),
    };
    Ok(CurvePoint {
        cache_bytes,
        capacity_write_bytes: cap.host_write_bytes + dirty_end,
        capacity_read_bytes: cap.host_read_bytes,
        dirty_end_bytes: dirty_end,
        spill_bytes: sum(|s| s.spill_bytes),
        read_hit_fraction: read_hit_fraction(&rep),
        cache_write_bytes: cached.host_write_bytes,
        discarded_dirty_bytes: sum(|s| s.discarded_dirty_bytes),
        cleaned_bytes: sum(|s| s.cleaned_bytes),
        write_p99_us: report.as_ref().map_or(0.0, |r| r.write_lat_p99_us),
        read_p99_us: report.as_ref().map_or(0.0, |r| r.read_lat_p99_us),
        replay_s: report.as_ref().map_or(0.0, |r| r.device_seconds),
        error,
    })
}

/// The smallest replayed cache, and the grain sizes are rounded up to.
pub const MIN_CACHE: u64 = 64 << 20;
const GRAIN: u64 = 16 << 20;

/// Default sizes: 1/8 to 3 times the peak of live data.
fn default_sizes(peak: u64) -> Vec<u64> {
    let mut v: Vec<u64> = [0.125, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0]
        .iter()
        .map(|f| ((peak as f64 * f) as u64).div_ceil(GRAIN).max(1) * GRAIN)
        .map(|b| b.max(MIN_CACHE))
        .collect();
    v.dedup();
    v
}

/// The knee of the curve (module doc): the index of the recommended point
/// and why.
fn knee(curve: &[CurvePoint], no_cache_writes: u64, reads: bool) -> (Option<usize>, String) {
    let ok: Vec<&CurvePoint> = curve.iter().filter(|p| p.error.is_none()).collect();
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let saved = |p: &CurvePoint| no_cache_writes.saturating_sub(p.capacity_write_bytes);
    let Some(best_saved) = ok.iter().map(|p| saved(p)).max() else {
        return (None, "no cache size replayed without an error".into());
    };
    let best_hits = ok.iter().map(|p| p.read_hit_fraction).fold(0.0, f64::max);
    let pays_writes = best_saved as f64 >= 0.05 * no_cache_writes as f64;
    let pays_reads = reads && best_hits >= 0.05;
    if !pays_writes && !pays_reads {
        return (
            None,
            format!(
                "no size pays: the largest saves {:.1} % of the {:.2} GiB written to the capacity device and serves {:.1} % of reads",
                100.0 * best_saved as f64 / no_cache_writes.max(1) as f64,
                gib(no_cache_writes),
                100.0 * best_hits
            ),
        );
    }
    let good = |p: &CurvePoint| {
        (!pays_writes || saved(p) as f64 >= 0.9 * best_saved as f64)
            && (!pays_reads || p.read_hit_fraction >= best_hits - 0.05)
    };
    let i = curve.iter().position(|p| p.error.is_none() && good(p)).expect("the best point is good");
    let p = &curve[i];
    let mut why = format!(
        "{:.0} MiB is the smallest size that keeps 90 % of the largest size's saving in capacity writes ({:.2} of {:.2} GiB saved, of {:.2} GiB written without a cache)",
        mib(p.cache_bytes),
        gib(saved(p)),
        gib(best_saved),
        gib(no_cache_writes)
    );
    if pays_reads {
        why += &format!(
            " with a hit ratio within 5 points of the best ({:.1} % vs {:.1} %)",
            100.0 * p.read_hit_fraction,
            100.0 * best_hits
        );
    }
    if let Some(prev) = curve[..i].iter().rev().find(|q| q.error.is_none()) {
        why += &format!(
            "; {:.0} MiB saves {:.2} GiB, spills {:.0} MiB and hits {:.1} %",
            mib(prev.cache_bytes),
            gib(saved(prev)),
            mib(prev.spill_bytes),
            100.0 * prev.read_hit_fraction
        );
    }
    (Some(i), why)
}

/// Profile the trace, replay it at each cache size, and advise.
pub fn advise(path: &Path, o: &AdviseOpts) -> Result<Advice, AdviseError> {
    let profile = live_profile(open(path)?)?;
    if profile.write_bytes + profile.read_bytes == 0 {
        return Err(AdviseError::Empty);
    }
    let volume_bytes = o
        .volume_bytes
        .or_else(|| trace_header(path).map(|h| h.1))
        .unwrap_or_else(|| profile.footprint_bytes.div_ceil(1 << 30).max(1) << 30)
        / BLOCK
        * BLOCK;
    let sizes = o.sizes.clone().unwrap_or_else(|| default_sizes(profile.peak_live_bytes));
    if let Some(&s) = sizes.iter().find(|&&s| s < MIN_CACHE) {
        return Err(AdviseError::TooSmall(s));
    }
    let mut curve = Vec::new();
    for &s in &sizes {
        curve.push(replay_at(path, o, volume_bytes, s.div_ceil(GRAIN) * GRAIN)?);
    }
    curve.sort_by_key(|p| p.cache_bytes);
    let (no_cache_write_bytes, no_cache_read_bytes) = disk_bytes_without_cache(path, volume_bytes)?;
    let (pick, reason) = knee(&curve, no_cache_write_bytes, profile.read_bytes > 0);
    let per_day = |b: u64| if profile.duration_s > 0.0 { b as f64 * 86_400.0 / profile.duration_s } else { 0.0 };
    let mut endurance = Vec::new();
    let (cap_w, cap_r) = match pick {
        Some(i) => {
            let p = &curve[i];
            let bytes = o.cache_device_bytes.unwrap_or(p.cache_bytes);
            let e = ScmProfile::p5800x().endurance();
            let projection = e.project(bytes, per_day(p.cache_write_bytes), 0.0);
            endurance.push(EnduranceRow {
                device: "cache (scm)".into(),
                device_bytes: bytes,
                endurance: e,
                projection,
            });
            (p.capacity_write_bytes, p.capacity_read_bytes)
        }
        None => (no_cache_write_bytes, no_cache_read_bytes),
    };
    let e = o.capacity.endurance();
    let bytes = o.capacity.device_bytes();
    let projection = e.project(bytes, per_day(cap_w), per_day(cap_r));
    let device = format!("capacity ({:?})", o.capacity).to_lowercase();
    endurance.push(EnduranceRow {
        device: device.clone() + " with the cache",
        device_bytes: bytes,
        endurance: e.clone(),
        projection,
    });
    let projection = e.project(bytes, per_day(no_cache_write_bytes), per_day(no_cache_read_bytes));
    endurance.push(EnduranceRow { device: device + " alone", device_bytes: bytes, endurance: e, projection });
    let recommended_bytes = pick.map(|i| curve[i].cache_bytes);
    Ok(Advice {
        capacity: o.capacity,
        volume_bytes,
        p95_rule_bytes: profile.p95_live_bytes,
        profile,
        no_cache_write_bytes,
        no_cache_read_bytes,
        curve,
        recommended_bytes,
        reason,
        endurance,
    })
}

/// Bytes in the largest decimal unit that keeps a leading digit.
fn bytes(b: f64) -> String {
    match b {
        b if b >= 1e12 => format!("{:.2} TB", b / 1e12),
        b if b >= 1e9 => format!("{:.1} GB", b / 1e9),
        b => format!("{:.0} MB", b / 1e6),
    }
}

/// The report `sluice advise` prints.
pub fn report(a: &Advice) -> String {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let p = &a.profile;
    let mut s = format!(
        "trace: {} records over {:.1} s; {:.0} MiB written, {:.0} MiB read, {:.0} MiB trimmed; volume {:.0} MiB\n\
         live data (written, not trimmed): peak {:.0} MiB at {:.1} s, p95 {:.0} MiB\n\n",
        p.records,
        p.duration_s,
        mib(p.write_bytes),
        mib(p.read_bytes),
        mib(p.trim_bytes),
        mib(a.volume_bytes),
        mib(p.peak_live_bytes),
        p.peak_at_s,
        mib(p.p95_live_bytes)
    );
    s += &format!(
        "{:>10} {:>12} {:>10} {:>9} {:>8} {:>9} {:>10} {:>10}\n",
        "cache MiB", "cap written", "cap read", "spill", "hits", "dirty end", "cache wr", "w p99 us"
    );
    s += &format!(
        "{:>10} {:>11.0}M {:>9.0}M {:>9} {:>8} {:>9} {:>10} {:>10}\n",
        "none",
        mib(a.no_cache_write_bytes),
        mib(a.no_cache_read_bytes),
        "-",
        "-",
        "-",
        "-",
        "-"
    );
    for c in &a.curve {
        let mark = if Some(c.cache_bytes) == a.recommended_bytes { " <" } else { "" };
        s += &format!(
            "{:>10.0} {:>11.0}M {:>9.0}M {:>8.0}M {:>7.1}% {:>8.0}M {:>9.0}M {:>10.0}{mark}{}\n",
            mib(c.cache_bytes),
            mib(c.capacity_write_bytes),
            mib(c.capacity_read_bytes),
            mib(c.spill_bytes),
            100.0 * c.read_hit_fraction,
            mib(c.dirty_end_bytes),
            mib(c.cache_write_bytes),
            c.write_p99_us,
            c.error.as_ref().map_or(String::new(), |e| format!("  error: {e}"))
        );
    }
    s += &match a.recommended_bytes {
        Some(b) => format!("\nrecommended cache: {:.0} MiB — {}\n", mib(b), a.reason),
        None => format!("\nrecommended cache: none — {}\n", a.reason),
    };
    s += &format!(
        "the p95 of live data (Twitter's sizing rule): {:.0} MiB\n\nendurance at the trace's rate, sustained:\n",
        mib(a.p95_rule_bytes)
    );
    for r in &a.endurance {
        let pr = &r.projection;
        let life = match pr.years {
            Some(y) if y >= 1000.0 => "over 1000 years of rated writes".to_string(),
            Some(y) if y >= 1.0 => format!("{y:.1} years of rated writes"),
            Some(y) => format!("{:.1} days of rated writes", y * 365.0),
            None => format!("{:.1} % of its annual workload rating", 100.0 * pr.share_of_rating),
        };
        let need =
            pr.device_bytes_for_rating.map_or(String::new(), |b| format!("; lasts its rated period from {}", bytes(b)));
        s += &format!(
            "  {:<28} {:>11}/day written, {:>11}/day read, on {}: {life}{need}\n",
            r.device,
            bytes(pr.written_per_day),
            bytes(pr.read_per_day),
            bytes(r.device_bytes as f64)
        );
    }
    s += "ratings: ";
    let mut seen = Vec::new();
    for r in &a.endurance {
        if !seen.contains(&r.endurance.source) {
            seen.push(r.endurance.source);
        }
    }
    s += &seen.join("; ");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_media::rng::SplitMix64;

    fn point(cache_mib: u64, written_mib: u64, hits: f64) -> CurvePoint {
        CurvePoint {
            cache_bytes: cache_mib << 20,
            capacity_write_bytes: written_mib << 20,
            capacity_read_bytes: 0,
            dirty_end_bytes: 0,
            spill_bytes: 0,
            read_hit_fraction: hits,
            cache_write_bytes: 0,
            discarded_dirty_bytes: 0,
            cleaned_bytes: 0,
            write_p99_us: 0.0,
            read_p99_us: 0.0,
            replay_s: 0.0,
            error: None,
        }
    }

    /// The knee: 90 % of the best saving and hits within 5 points; no cache
    /// when nothing saves 5 % or hits 5 %; failed replays never chosen.
    #[test]
    fn the_knee_rule() {
        let curve = [point(64, 900, 0.1), point(128, 500, 0.5), point(256, 150, 0.80), point(512, 100, 0.9)];
        assert_eq!(knee(&curve, 1000 << 20, false).0, Some(2), "850 of 900 saved");
        assert_eq!(knee(&curve, 1000 << 20, true).0, Some(3), "80 % hits is not within 5 points of 90 %");
        let flat = [point(64, 990, 0.0), point(128, 980, 0.01)];
        let (pick, why) = knee(&flat, 1000 << 20, true);
        assert!(pick.is_none() && why.contains("no size pays"), "{why}");
        let mut failed = curve.clone();
        failed[2].error = Some("replay failed".into());
        assert_eq!(knee(&failed, 1000 << 20, false).0, Some(3));
    }

    #[test]
    fn extents_track_their_total() {
        let mut x = Extents::default();
        x.insert(0, 8192);
        x.insert(4096, 16384);
        x.insert(32768, 40960);
        assert_eq!(x.total, 16384 + 8192);
        x.remove(4096, 8192);
        assert_eq!(x.total, 4096 + 8192 + 8192);
        x.remove(0, 1 << 20);
        assert_eq!((x.total, x.map.len()), (0, 0));
        x.insert(8192, 12288);
        x.insert(0, 4096);
        x.insert(4096, 8192);
        assert_eq!((x.total, x.map.len()), (12288, 1));
    }

    /// Temporary files, Spark-like: written in 64 KiB requests, read back,
    /// deleted (trimmed) while at most `live` others exist; one request
    /// per millisecond. Returns the trace and its true peak of live bytes.
    fn temp_trace(files: u64, live: usize, seed: u64) -> (String, u64) {
        let mut rng = SplitMix64(seed);
        let (mut t, mut at) = (0u64, 0u64);
        let mut out = String::from("timestamp_us,op,offset,size\n");
        let mut alive: std::collections::VecDeque<(u64, u64)> = Default::default();
        let (mut cur, mut peak) = (0u64, 0u64);
        let region = 512u64 << 20;
        let mut line = |op: &str, o: u64, n: u64, t: &mut u64| {
            out += &format!("{t},{op},{o},{n}\n");
            *t += 1000;
        };
        for _ in 0..files {
            let len = (1 + rng.below(16)) * 65536;
            if at + len > region {
                at = 0;
            }
            for o in (0..len).step_by(65536) {
                line("W", at + o, 65536, &mut t);
            }
            alive.push_back((at, len));
            at += len + 65536;
            cur += len;
            peak = peak.max(cur);
            if alive.len() > live {
                let (a, l) = alive.pop_front().unwrap();
                for o in (0..l).step_by(65536) {
                    line("R", a + o, 65536, &mut t);
                }
                line("T", a, l, &mut t);
                cur -= l;
            }
        }
        (out, peak)
    }

    #[test]
    fn the_live_profile_of_temporary_files_is_their_peak() {
        let (text, peak) = temp_trace(300, 40, 3);
        let recs = sluice_workload::parse_trace(&text).unwrap();
        let p = live_profile(recs.into_iter().map(Ok)).unwrap();
        assert_eq!(p.peak_live_bytes, peak);
        assert!(p.p95_live_bytes <= peak && p.p95_live_bytes >= peak / 2, "{} vs {peak}", p.p95_live_bytes);
        assert!(p.read_bytes == p.trim_bytes && p.trim_bytes < p.write_bytes, "{p:?}");
        assert!(!p.timeline.is_empty() && p.timeline.len() <= 201);
    }

    /// The "none" row counts what the disk would be asked for: unaligned
    /// writes and reads widened to the blocks they touch, clamped to the
    /// volume, as the replays count them.
    #[test]
    fn the_no_cache_row_counts_whole_blocks_like_the_curve() {
        let dir = std::env::temp_dir().join(format!("sluice-advise-none-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.csv");
        let text = "timestamp_us,op,offset,size\n0,W,100,512\n1000,W,4096,8192\n2000,R,4000,200\n3000,W,8388600,4096\n";
        std::fs::write(&path, text).unwrap();
        // Widened: 4096 (block 0), 8192, a read over blocks 0 and 1, and
        // a write clamped at the end of an 8 MiB volume (8 bytes: one block).
        let (w, r) = disk_bytes_without_cache(&path, 8 << 20).unwrap();
        assert_eq!((w, r), (4096 + 8192 + 4096, 8192));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The recommendation sits at the knee: on temporary files whose live
    /// data peaks at P, it is between P/2 and 2P, and a cache half its
    /// size writes markedly more to the disk.
    #[test]
    fn the_recommendation_sits_at_the_knee_of_the_curve() {
        let (text, peak) = temp_trace(1500, 200, 7);
        let dir = std::env::temp_dir().join(format!("sluice-advise-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.csv");
        std::fs::write(&path, &text).unwrap();
        let o = AdviseOpts { volume_bytes: Some(1 << 30), ..AdviseOpts::default() };
        let a = advise(&path, &o).unwrap();
        let rec = a.recommended_bytes.unwrap_or_else(|| panic!("{}", report(&a)));
        assert!(rec >= peak / 2 && rec <= 2 * peak, "recommended {rec} for a peak of {peak}\n{}", report(&a));
        let at = |b: u64| a.curve.iter().find(|p| p.cache_bytes == b).unwrap();
        let smaller = a.curve.iter().rev().find(|p| p.cache_bytes <= rec / 2).expect("a size at most half");
        assert!(
            smaller.capacity_write_bytes as f64 >= 1.5 * at(rec).capacity_write_bytes.max(1) as f64,
            "{}",
            report(&a)
        );
        assert!(a.curve.iter().all(|p| p.error.is_none()), "{}", report(&a));
        assert!(a.endurance.iter().any(|r| r.projection.years.is_some()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
