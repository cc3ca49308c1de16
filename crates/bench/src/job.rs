//! Run any fio-style job file against an emulated system in virtual time.
//!
//! This is the one path every media experiment takes (`sluice bench job` and
//! `sluice bench media` alike): build the system's device on a virtual clock,
//! resolve the job file against its capacity, precondition, then measure.
//!
//! Preconditioning follows the job's `precondition=` option (none, seq,
//! seq+rand). On a device that reports NAND programming, the random part of
//! seq+rand runs until the medium has programmed `steady_state_drive_writes`
//! × its physical capacity beyond the fill, however many host bytes that
//! takes: steady state is a property of the NAND (every block rewritten by GC
//! at least once). A 4 KiB write on a 64 KiB IU gets there 16× sooner than
//! host bytes suggest; a skewed workload the buffer absorbs, much later.
//!
//! The measured phase honours `io_size`/`size` (per instance) and `runtime`
//! (virtual seconds, `time_based`). Reported bandwidth is per job instance,
//! as fio reports per-job numbers and the CSAL paper quotes them.

pub use crate::error::BenchError;
pub use crate::runner::Built;
use crate::runner::{self, Dir, Io, IoSource, Job, Limits, RunResult};
use serde::Serialize;
use sluice_engine::{BandPlacement, Engine, EngineConfig};
use sluice_media::ssd::{ssd_device, SsdProfile};
use sluice_media::{
    hdd_device, scm_device, zns_device, BlockDevice, ClockRef, DeviceStats, HddProfile, MemoryDevice, ScmProfile,
    VirtualClock, ZnsProfile,
};
use sluice_workload::job::{parse_job_file, ResolvedJob};
use sluice_workload::rng::mix_seed;
use sluice_workload::{GenParams, IoGen, Op, Precondition, PreconditionGen, RwKind};
use std::str::FromStr;
use std::sync::Arc;

/// An emulated system a job can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum System {
    Qlc,
    Tlc,
    Scm,
    Zns,
    Hdd,
    /// Sluice over SCM and QLC.
    #[serde(rename = "sluice+qlc")]
    SluiceQlc,
    /// The same with lifetime placement (`BandPlacement::Lifetime`, after
    /// SepBIT): compaction and GC streams by inferred block lifetime instead
    /// of by volume.
    #[serde(rename = "sluice+qlc-lifetime")]
    SluiceQlcLifetime,
    /// Sluice over SCM and ZNS.
    #[serde(rename = "sluice+zns")]
    SluiceZns,
    /// Sluice over SCM and ZNS with every volume in one shared open zone
    /// (`BandPlacement::Shared`): the tenant-blind baseline of the ZNS
    /// isolation experiment.
    #[serde(rename = "sluice+zns-shared")]
    SluiceZnsShared,
    /// A set-associative write-back cache (4 KiB lines, LRU) over SCM and QLC.
    #[serde(rename = "setassoc+qlc")]
    SetAssocQlc,
}

impl FromStr for System {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<System, BenchError> {
        Ok(match s {
            "qlc" => System::Qlc,
            "tlc" => System::Tlc,
            "scm" => System::Scm,
            "zns" => System::Zns,
            "hdd" => System::Hdd,
            "sluice+qlc" => System::SluiceQlc,
            "sluice+qlc-lifetime" => System::SluiceQlcLifetime,
            "sluice+zns" => System::SluiceZns,
            "sluice+zns-shared" => System::SluiceZnsShared,
            "setassoc+qlc" => System::SetAssocQlc,
            other => return Err(BenchError::UnknownSystem(other.to_string())),
        })
    }
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::Qlc => "qlc",
            System::Tlc => "tlc",
            System::Scm => "scm",
            System::Zns => "zns",
            System::Hdd => "hdd",
            System::SluiceQlc => "sluice+qlc",
            System::SluiceQlcLifetime => "sluice+qlc-lifetime",
            System::SluiceZns => "sluice+zns",
            System::SluiceZnsShared => "sluice+zns-shared",
            System::SetAssocQlc => "setassoc+qlc",
        }
    }

    /// Bytes the system exposes to jobs on a (capacity) device of `capacity_bytes`.
    pub fn exposed_bytes(self, capacity_bytes: u64) -> u64 {
        match self {
            System::SluiceQlc | System::SluiceQlcLifetime | System::SluiceZns | System::SluiceZnsShared => {
                stack_volume_bytes(capacity_bytes) * STACK_VOLUMES
            }
            _ => capacity_bytes,
        }
    }

    /// Every system, in table order.
    pub const ALL: [System; 10] = [
        System::Qlc,
        System::Tlc,
        System::Scm,
        System::Zns,
        System::Hdd,
        System::SetAssocQlc,
        System::SluiceQlc,
        System::SluiceQlcLifetime,
        System::SluiceZns,
        System::SluiceZnsShared,
    ];

    /// Default emulated capacity (bytes) when the user gives none.
    pub fn default_capacity_bytes(self) -> u64 {
        match self {
            System::Qlc => 64 << 30,
            System::Tlc => 16 << 30,
            System::SluiceQlc
            | System::SluiceQlcLifetime
            | System::SluiceZns
            | System::SluiceZnsShared
            | System::SetAssocQlc => 16 << 30,
            System::Scm | System::Hdd => 16 << 30,
            System::Zns => ZnsProfile::zn540_scaled(64).zone_size_bytes * 64,
        }
    }

    /// Build the device on a fresh virtual clock; data is not stored (null
    /// backend), only timing and wear are modelled. On stacked systems
    /// `capacity_bytes` is the capacity device's (usable) size; the cache is
    /// `stack_cache_bytes` of it, and Sluice keeps metadata (sparse memory
    /// backends, zeros unstored) because it reads its own records back.
    pub fn build(self, capacity_bytes: u64) -> Result<Built, BenchError> {
        self.build_with_cache(capacity_bytes, None)
    }

    /// `build`, with the cache of a stacked system `cache_bytes` instead of
    /// `stack_cache_bytes(capacity_bytes)` (ignored by bare devices).
    pub fn build_with_cache(self, capacity_bytes: u64, cache_bytes: Option<u64>) -> Result<Built, BenchError> {
        if let Some(b) = self.build_stack(capacity_bytes, cache_bytes)? {
            return Ok(b);
        }
        let clock: ClockRef = VirtualClock::new();
        let c = clock.clone();
        let null = || Box::new(MemoryDevice::null(capacity_bytes, 4096));
        Ok(match self {
            System::Qlc | System::Tlc => {
                let p =
                    if self == System::Qlc { SsdProfile::qlc(capacity_bytes) } else { SsdProfile::tlc(capacity_bytes) };
                if !capacity_bytes.is_multiple_of(p.iu_bytes)
                    || capacity_bytes < 256 * p.erase_block_ius as u64 * p.iu_bytes / 8
                {
                    return Err(BenchError::BadCapacity { system: self.name(), capacity_bytes });
                }
                let phys = p.physical_blocks() as u64 * p.erase_block_ius as u64 * p.iu_bytes;
                Built {
                    dev: Box::new(ssd_device(p, null(), c)),
                    physical_bytes: Some(phys),
                    clock,
                    tiers: None,
                    engine: None,
                }
            }
            System::Scm => {
                let mut p = ScmProfile::p5800x();
                p.capacity_bytes = capacity_bytes;
                Built {
                    dev: Box::new(scm_device(p, null(), c)),
                    physical_bytes: None,
                    clock,
                    tiers: None,
                    engine: None,
                }
            }
            System::Hdd => {
                let mut p = HddProfile::hdd_7200();
                p.capacity_bytes = capacity_bytes;
                Built {
                    dev: Box::new(hdd_device(p, null(), c)),
                    physical_bytes: None,
                    clock,
                    tiers: None,
                    engine: None,
                }
            }
            System::Zns => {
                let zone = ZnsProfile::zn540_scaled(1).zone_size_bytes;
                if !capacity_bytes.is_multiple_of(zone) || capacity_bytes == 0 {
                    return Err(BenchError::BadCapacity { system: self.name(), capacity_bytes });
                }
                let p = ZnsProfile::zn540_scaled(capacity_bytes / zone);
                Built {
                    dev: Box::new(zns_device(p, null(), c)),
                    physical_bytes: None,
                    clock,
                    tiers: None,
                    engine: None,
                }
            }
            System::SluiceQlc
            | System::SluiceQlcLifetime
            | System::SluiceZns
            | System::SluiceZnsShared
            | System::SetAssocQlc => {
                unreachable!("built as stacks")
            }
        })
    }

    /// Stacked systems: SCM cache over a QLC or ZNS capacity device.
    fn build_stack(self, capacity_bytes: u64, cache_bytes: Option<u64>) -> Result<Option<Built>, BenchError> {
        use crate::stacked::{setassoc_stack, sluice_stack, CallTime};
        let capacity_device = match self {
            System::SluiceQlc | System::SluiceQlcLifetime | System::SetAssocQlc => System::Qlc,
            System::SluiceZns | System::SluiceZnsShared => System::Zns,
            _ => return Ok(None),
        };
        let call = CallTime::new();
        let inner = call.device_clock();
        let bad = || BenchError::BadCapacity { system: self.name(), capacity_bytes };
        let cache_bytes = cache_bytes.unwrap_or_else(|| stack_cache_bytes(capacity_bytes));
        let keep_data = self != System::SetAssocQlc;
        let backend = |bytes: u64| -> Box<dyn BlockDevice> {
            if keep_data {
                Box::new(MemoryDevice::new(bytes, 4096))
            } else {
                Box::new(MemoryDevice::null(bytes, 4096))
            }
        };
        // Stacks precondition until their capacity device has been written
        // `steady_state_drive_writes` times beyond the fill, whatever it is
        // (QLC or ZNS), so both start alike and past the GC transient a
        // skewed workload causes (cold fill data relocated once); a host
        // bound in `run_job_text` ends it if the cache absorbs everything.
        let mut scm = ScmProfile::p5800x();
        scm.capacity_bytes = cache_bytes;
        let cache: Arc<dyn BlockDevice> = Arc::new(scm_device(scm, backend(cache_bytes), inner.clone()));
        let (capacity, band_bytes): (Arc<dyn BlockDevice>, _) = if capacity_device == System::Qlc {
            let p = SsdProfile::qlc(capacity_bytes);
            let erase_block = p.erase_block_ius as u64 * p.iu_bytes;
            if !capacity_bytes.is_multiple_of(erase_block) || capacity_bytes < 64 * erase_block {
                return Err(bad());
            }
            // A band is one erase block (a superblock over every die): the
            // smallest unit whose trim leaves the drive's own GC nothing to
            // copy, and as many bands as the drive has (1024 at 16 GiB), so
            // that open streams hold little of the spare and GC collects in
            // fine units (docs/csal.md, "Bands").
            let band = erase_block;
            (Arc::new(ssd_device(p, backend(capacity_bytes), inner.clone())), band)
        } else {
            // Zones 64× smaller than ZN540's, so a scaled-down drive has as many.
            let p0 = ZnsProfile::zn540_small_zones(1, ZNS_ZONE_SHRINK);
            // One zone more for the engine's label (a zone of its own), so
            // the engine has the space it had before the label existed.
            let zones = capacity_bytes.div_ceil(p0.zone_capacity_bytes) + 1;
            let p = ZnsProfile::zn540_small_zones(zones, ZNS_ZONE_SHRINK);
            let bytes = zones * p.zone_size_bytes;
            let band = p.zone_size_bytes;
            (Arc::new(zns_device(p, backend(bytes), inner.clone())), band)
        };
        if cache_bytes < 16 << 20 {
            return Err(bad());
        }
        let (dev, clock, engine): (Box<dyn BlockDevice>, ClockRef, _) = if self == System::SetAssocQlc {
            let s = setassoc_stack(cache.clone(), capacity.clone(), call, SETASSOC_WAYS);
            let c = s.clock();
            (Box::new(s), c, None)
        } else {
            let cfg = EngineConfig {
                chunk_bytes: (cache_bytes / 32).clamp(4 << 20, 16 << 20),
                band_bytes,
                ..EngineConfig::default()
            };
            let vb = stack_volume_bytes(capacity_bytes);
            let placement = if self == System::SluiceZnsShared {
                BandPlacement::Shared
            } else if self == System::SluiceQlcLifetime {
                BandPlacement::Lifetime
            } else {
                BandPlacement::PerVolume
            };
            let s = sluice_stack(cache.clone(), capacity.clone(), call, cfg, placement, STACK_VOLUMES, vb)?;
            let (c, e) = (s.clock(), s.engine());
            (Box::new(s), c, Some(e))
        };
        Ok(Some(Built { dev, physical_bytes: Some(capacity_bytes), clock, tiers: Some((cache, capacity)), engine }))
    }
}

/// Volumes (tenants) Sluice serves in a stacked system: one per job of the
/// CSAL experiments.
pub const STACK_VOLUMES: u64 = 8;
/// The capacity Sluice keeps spare for its own GC (SPDK FTL's default
/// over-provisioning is 20 %).
pub const ENGINE_SPARE: f64 = 0.20;
/// Ways of the set-associative baseline.
pub const SETASSOC_WAYS: usize = 8;
/// How much smaller than ZN540's our emulated zones are.
pub const ZNS_ZONE_SHRINK: u64 = 64;

/// Each of Sluice's `STACK_VOLUMES` volumes on a capacity device of
/// `capacity_bytes`: what remains after `ENGINE_SPARE`, 1 MiB aligned.
pub fn stack_volume_bytes(capacity_bytes: u64) -> u64 {
    (capacity_bytes as f64 * (1.0 - ENGINE_SPARE)) as u64 / STACK_VOLUMES / (1 << 20) * (1 << 20)
}

/// The SCM cache of a stacked system: 1/19.2 of the capacity device, the
/// CSAL paper's own drives (an 800 GB Optane P5800X in front of a 15.36 TB
/// Solidigm P5316, from its drive summary), 1 MiB aligned.
pub fn stack_cache_bytes(capacity_bytes: u64) -> u64 {
    capacity_bytes / 96 * 5 / (1 << 20) * (1 << 20)
}

/// Adapts a workload generator (an iterator of workload `Io`) to the runner.
struct Source<I: Iterator<Item = sluice_workload::Io>>(I);

impl<I: Iterator<Item = sluice_workload::Io>> IoSource for Source<I> {
    fn next_io(&mut self) -> Option<Io> {
        self.0.next().map(|io| Io {
            dir: match io.op {
                Op::Read => Dir::Read,
                Op::Write => Dir::Write,
            },
            offset: io.offset,
            len: io.len,
        })
    }
}

/// Knobs of a job run beyond the job file.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub system: System,
    pub capacity_bytes: u64,
    /// NAND drive writes that end preconditioning on devices that report them.
    pub steady_state_drive_writes: f64,
}

/// The measured outcome of a job file on a system.
#[derive(Clone, Debug, Serialize)]
pub struct JobReport {
    pub system: System,
    pub capacity_bytes: u64,
    pub jobs: usize,
    /// Mean per-job write and read bandwidth over the measured phase.
    pub write_mib_per_s: f64,
    pub read_mib_per_s: f64,
    pub write_iops: f64,
    pub read_iops: f64,
    /// WAF over the measured phase: bytes programmed to the (capacity)
    /// device's media / bytes the jobs wrote — the CSAL paper's definition.
    pub waf: f64,
    /// Bytes written to the devices (cache + capacity) / bytes the jobs
    /// wrote; 1 on a plain device.
    pub waf_host: f64,
    /// The capacity device's own WAF (media programmed / its host writes).
    pub waf_device: f64,
    /// On stacked systems: each device's counters.
    pub tiers: Option<TierStats>,
    /// On Sluice stacks: bytes the engine's GC relocated in the measured
    /// phase, per byte the jobs wrote.
    pub gc_ratio: Option<f64>,
    /// On Sluice stacks, at the end: capacity bands (zones) holding valid
    /// blocks of 1, 2, … volumes (`Engine::band_tenancy`).
    pub band_tenancy: Option<Vec<u64>>,
    /// On Sluice stacks: per volume (= job partition), what the measured
    /// phase wrote and what compaction and GC moved for it.
    pub volumes: Option<Vec<VolumeTraffic>>,
    pub write_lat_p50_us: f64,
    pub write_lat_p99_us: f64,
    pub read_lat_p50_us: f64,
    pub read_lat_p99_us: f64,
    pub device_seconds: f64,
    pub precondition_device_seconds: f64,
    /// Share of the measured window in which a device had a request in
    /// flight (`DeviceStats::busy_ns` over the window): the device alone, or
    /// on stacks the busier of the two. In virtual time the busiest device
    /// bounds a row: at 1.0 it never waited for the engine.
    pub busy_share: f64,
    /// On stacks: the cache device's and the capacity device's shares.
    pub cache_busy_share: Option<f64>,
    pub capacity_busy_share: Option<f64>,
    pub device: DeviceStats,
    pub warnings: Vec<String>,
}

/// Which phase to build sources for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Preconditioning; `until_nand_steady` makes the random part endless, to
    /// be ended by the NAND-programmed limit instead of by host bytes.
    Precondition {
        until_nand_steady: bool,
    },
    Measure,
}

fn jobs_of(resolved: &[ResolvedJob], phase: Phase) -> Result<Vec<Job>, BenchError> {
    let mut jobs = Vec::new();
    for r in resolved {
        for i in 0..r.instances.len() {
            let name = format!("{}.{}", r.spec.name, i);
            let iodepth = r.spec.iodepth.max(1) as usize;
            let source: Box<dyn IoSource> = match phase {
                Phase::Measure => Box::new(Source(r.generator(i)?)),
                Phase::Precondition { until_nand_steady: true } if r.spec.precondition == Precondition::SeqRand => {
                    let params = r.params(i)?;
                    let fill = PreconditionGen::new(&params, Precondition::Seq)?.expect("seq precondition");
                    let random = IoGen::new(GenParams {
                        rw: RwKind::RandWrite,
                        io_limit: None,
                        reshuffle_each_pass: true,
                        seed: mix_seed(&[params.seed, 0x005e_ed57_ead7]),
                        ..params
                    })?;
                    Box::new(Source(fill.chain(random)))
                }
                Phase::Precondition { .. } => match r.precondition(i)? {
                    Some(p) => Box::new(Source(p)),
                    None => continue,
                },
            };
            jobs.push(Job { name, source, iodepth });
        }
    }
    Ok(jobs)
}

/// Parse `text`, build the system, precondition, measure. `progress` gets
/// (phase, fraction) with phase "precondition" or "measure".
pub fn run_job_text(
    text: &str,
    opts: &RunOptions,
    progress: &mut dyn FnMut(&str, f64),
) -> Result<JobReport, BenchError> {
    let file = parse_job_file(text)?;
    let Built { dev, physical_bytes, tiers, engine, .. } = opts.system.build(opts.capacity_bytes)?;
    // Jobs address what the system exposes (a stack's volumes, not its devices).
    let exposed = dev.info().capacity_bytes;
    let resolved = file.jobs.iter().map(|j| j.resolve(exposed)).collect::<Result<Vec<_>, _>>()?;

    let mut pre = jobs_of(&resolved, Phase::Precondition { until_nand_steady: physical_bytes.is_some() })?;
    let pre_result = if pre.is_empty() {
        None
    } else {
        let limits = Limits {
            media_program_bytes_max: physical_bytes
                .map(|p| (p as f64 * opts.steady_state_drive_writes) as u64 + opts.capacity_bytes),
            // A stack whose cache absorbs the workload may leave its capacity
            // device idle: stop after the fill plus five times its volumes.
            host_bytes_max: tiers.as_ref().map(|_| exposed * 6),
            ..Default::default()
        };
        Some(runner::run(&*dev, &mut pre, limits, &mut |f| progress("precondition", f))?)
    };

    let mut measured = jobs_of(&resolved, Phase::Measure)?;
    let runtime_ns = resolved.iter().filter_map(|r| r.spec.runtime).map(|d| d.as_nanos() as u64).max();
    let limits = Limits { device_ns_max: runtime_ns, ..Default::default() };
    let before = tiers.as_ref().map(|(c, p)| (c.stats(), p.stats()));
    let traffic_before = engine.as_deref().map(volume_traffic);
    let r = runner::run(&*dev, &mut measured, limits, &mut |f| progress("measure", f))?;
    let mut rep = report(opts, &r, pre_result.as_ref(), file.warnings.iter().map(|w| w.to_string()).collect());
    if let (Some((c, p)), Some((c0, p0))) = (tiers, before) {
        let t = TierStats { cache: c.stats().since(&c0), capacity: p.stats().since(&p0) };
        let user = r.device.host_write_bytes.max(1) as f64;
        rep.waf_host = (t.cache.host_write_bytes + t.capacity.host_write_bytes) as f64 / user;
        rep.waf_device = t.capacity.device_waf();
        let (cache, capacity) = (busy_share(&t.cache, r.elapsed_ns), busy_share(&t.capacity, r.elapsed_ns));
        (rep.cache_busy_share, rep.capacity_busy_share, rep.busy_share) =
            (Some(cache), Some(capacity), cache.max(capacity));
        rep.tiers = Some(t);
    }
    if let (Some(e), Some(v0)) = (engine, traffic_before) {
        let volumes: Vec<VolumeTraffic> = volume_traffic(&e).iter().zip(&v0).map(|(a, b)| a.since(b)).collect();
        let gc: u64 = volumes.iter().map(|v| v.gc_bytes).sum();
        rep.gc_ratio = Some(gc as f64 / r.device.host_write_bytes.max(1) as f64);
        rep.band_tenancy = e.band_tenancy().ok();
        rep.volumes = Some(volumes);
    }
    Ok(rep)
}

/// One volume's writes and the capacity traffic they caused.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct VolumeTraffic {
    pub user_write_bytes: u64,
    pub compaction_bytes: u64,
    pub gc_bytes: u64,
}

impl VolumeTraffic {
    fn since(&self, earlier: &VolumeTraffic) -> VolumeTraffic {
        VolumeTraffic {
            user_write_bytes: self.user_write_bytes - earlier.user_write_bytes,
            compaction_bytes: self.compaction_bytes - earlier.compaction_bytes,
            gc_bytes: self.gc_bytes - earlier.gc_bytes,
        }
    }
}

fn volume_traffic(e: &Engine) -> Vec<VolumeTraffic> {
    e.snapshot()
        .volumes
        .iter()
        .map(|v| VolumeTraffic {
            user_write_bytes: v.ops.iter().filter(|o| o.op == "write").map(|o| o.bytes).sum(),
            compaction_bytes: v.compaction_bytes,
            gc_bytes: v.gc_bytes,
        })
        .collect()
}

/// What a stacked system's two devices did over the measured phase.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct TierStats {
    pub cache: DeviceStats,
    pub capacity: DeviceStats,
}

/// The share of a window of `window_ns` a device was busy in.
fn busy_share(d: &DeviceStats, window_ns: u64) -> f64 {
    if window_ns == 0 {
        return 0.0;
    }
    (d.busy_ns as f64 / window_ns as f64).min(1.0)
}

fn report(opts: &RunOptions, r: &RunResult, pre: Option<&RunResult>, warnings: Vec<String>) -> JobReport {
    let secs = r.elapsed_ns as f64 / 1e9;
    let writes: u64 = r.jobs.iter().map(|j| j.writes).sum();
    let reads: u64 = r.jobs.iter().map(|j| j.reads).sum();
    // Bandwidth per job that did that kind of I/O (a mixed row has writers and readers).
    let writers = r.jobs.iter().filter(|j| j.writes > 0).count().max(1) as f64;
    let readers = r.jobs.iter().filter(|j| j.reads > 0).count().max(1) as f64;
    let per = |bytes: u64, k: f64| if secs > 0.0 { bytes as f64 / (1 << 20) as f64 / secs / k } else { 0.0 };
    let mut wl = runner::Histogram::default();
    let mut rl = runner::Histogram::default();
    for j in &r.jobs {
        wl.merge(&j.write_lat_ns);
        rl.merge(&j.read_lat_ns);
    }
    JobReport {
        system: opts.system,
        capacity_bytes: opts.capacity_bytes,
        jobs: r.jobs.len(),
        write_mib_per_s: per(r.write_bytes(), writers),
        read_mib_per_s: per(r.read_bytes(), readers),
        write_iops: if secs > 0.0 { writes as f64 / secs } else { 0.0 },
        read_iops: if secs > 0.0 { reads as f64 / secs } else { 0.0 },
        waf: r.device.device_waf(),
        waf_host: 1.0,
        waf_device: r.device.device_waf(),
        tiers: None,
        gc_ratio: None,
        band_tenancy: None,
        volumes: None,
        write_lat_p50_us: wl.quantile(0.5) as f64 / 1e3,
        write_lat_p99_us: wl.quantile(0.99) as f64 / 1e3,
        read_lat_p50_us: rl.quantile(0.5) as f64 / 1e3,
        read_lat_p99_us: rl.quantile(0.99) as f64 / 1e3,
        device_seconds: secs,
        precondition_device_seconds: pre.map_or(0.0, |p| p.elapsed_ns as f64 / 1e9),
        busy_share: busy_share(&r.device, r.elapsed_ns),
        cache_busy_share: None,
        capacity_busy_share: None,
        device: r.device,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::RunError;
    use sluice_workload::job::JobError;

    #[test]
    fn runs_a_job_file_on_every_system() {
        let text = "[global]\nbs=64k\niodepth=8\nsize=64m\n[w]\nrw=write\n[r]\nrw=randread\noffset=64m\n";
        for sys in [System::Qlc, System::Tlc, System::Scm, System::Hdd] {
            let opts = RunOptions { system: sys, capacity_bytes: 1 << 30, steady_state_drive_writes: 1.0 };
            let r = run_job_text(text, &opts, &mut |_, _| {}).unwrap();
            assert_eq!(r.device.host_write_bytes, 64 << 20, "{sys:?}");
            assert_eq!(r.device.host_read_bytes, 64 << 20, "{sys:?}");
            assert!(r.write_mib_per_s > 0.0 && r.read_mib_per_s > 0.0, "{sys:?}");
        }
    }

    #[test]
    fn zns_accepts_sequential_and_rejects_random_writes() {
        let cap = System::Zns.default_capacity_bytes();
        let opts = RunOptions { system: System::Zns, capacity_bytes: cap, steady_state_drive_writes: 1.0 };
        let seq = "[w]\nrw=write\nbs=128k\niodepth=1\nsize=256m\n";
        let r = run_job_text(seq, &opts, &mut |_, _| {}).unwrap();
        assert_eq!(r.device.host_write_bytes, 256 << 20);
        let rand = "[w]\nrw=randwrite\nbs=4k\niodepth=4\nsize=256m\n";
        let err = run_job_text(rand, &opts, &mut |_, _| {}).unwrap_err();
        assert!(matches!(err, BenchError::Run(RunError::Io { .. })), "{err}");
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        let opts = RunOptions { system: System::Qlc, capacity_bytes: 1 << 30, steady_state_drive_writes: 1.0 };
        assert!(matches!(run_job_text("[w]\nrw=sideways\n", &opts, &mut |_, _| {}), Err(BenchError::Job(_))));
        assert!(matches!(run_job_text("; nothing\n", &opts, &mut |_, _| {}), Err(BenchError::Job(JobError::NoJobs))));
        assert!(matches!("floppy".parse::<System>(), Err(BenchError::UnknownSystem(_))));
        let tiny = RunOptions { capacity_bytes: 1 << 20, ..opts };
        assert!(matches!(run_job_text("[w]\nrw=write\n", &tiny, &mut |_, _| {}), Err(BenchError::BadCapacity { .. })));
    }

    #[test]
    fn precondition_reaches_steady_state_on_qlc() {
        // 4 KiB random writes after a seq fill: WAF must rise far above the
        // fresh-drive value, to the IU × GC regime.
        let text = "[w]\nrw=randwrite\nbs=4k\niodepth=16\nprecondition=seq+rand\nio_size=8m\n";
        let opts = RunOptions { system: System::Qlc, capacity_bytes: 1 << 30, steady_state_drive_writes: 2.0 };
        let r = run_job_text(text, &opts, &mut |_, _| {}).unwrap();
        assert!(r.waf > 30.0, "steady-state 4 KiB WAF on a 64 KiB IU QLC: {}", r.waf);
    }
}
