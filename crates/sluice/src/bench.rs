//! `sluice bench …`: every experiment the command runs — the CSAL and
//! media tables, job files and traces on emulated media, caching, the
//! engine, recovery, paged maps, connections, NBD load, TLS records and
//! io_uring — with its arguments, its table and its JSON.

use crate::{connections, nbdload, progress_bar, write_json, CliError};
use clap::Subcommand;
use sluice_bench::csal::{self, CsalRow, CsalScale};
use sluice_bench::engine;
use sluice_bench::job::{run_job_text, RunOptions, System};
use sluice_bench::media::{self, MediaRow, Scale, PAPER_ROWS};
use sluice_bench::trace;
use sluice_bench::uring::{self, UringBenchOpts};
use sluice_workload::{parse_bytes, TraceReader};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Subcommand)]
pub enum Bench {
    /// The CSAL white paper's QLC-only and TLC-only rows on the emulators.
    Media {
        /// Same rows at a smaller scale (under a minute).
        #[arg(long)]
        quick: bool,
        /// Where to write the JSON rows.
        #[arg(long, default_value = "target/bench/media.json")]
        json: PathBuf,
        /// Only rows whose workload or device contains this text.
        #[arg(long)]
        only: Option<String>,
    },
    /// The CSAL paper's evaluation: QLC, TLC, a set-associative cache and
    /// Sluice over SCM+QLC and SCM+ZNS, every workload, in virtual time.
    Csal {
        /// Every row at a smaller scale (under two minutes).
        #[arg(long)]
        quick: bool,
        /// Where to write the JSON rows (the SVG chart goes beside it).
        #[arg(long, default_value = "target/bench/csal.json")]
        json: PathBuf,
        /// Only rows whose workload or system contains this text.
        #[arg(long)]
        only: Option<String>,
        /// Bytes each job writes in the measured phase (fio size syntax;
        /// default 256m, 32m with --quick). A longer window averages over
        /// more GC cycles: the capacity's GC runs in bursts about as long as
        /// the default window, so short windows see more or less of it.
        #[arg(long)]
        measure: Option<String>,
    },
    /// Caching over an emulated HDD (the in-place layout): temporary data
    /// and HDFS-like streams, no cache vs cache-all vs selective caching vs
    /// SCM only, in virtual time (docs/caching.md).
    Caching {
        /// A smaller run (about a minute).
        #[arg(long)]
        quick: bool,
        /// Where to write the JSON rows.
        #[arg(long, default_value = "target/bench/caching.json")]
        json: PathBuf,
        /// Only these cases (comma-separated).
        #[arg(long)]
        only: Option<String>,
        /// Emulated HDDs the disk is striped over (1 MiB units).
        #[arg(long, default_value_t = 1)]
        disks: usize,
    },
    /// Run a fio-style job file on an emulated system in virtual time.
    Job {
        /// The job file ([global] and job sections; see docs/workloads.md).
        file: PathBuf,
        /// qlc, tlc, scm, zns, hdd, sluice+qlc, sluice+qlc-lifetime, sluice+zns, sluice+zns-shared or setassoc+qlc.
        #[arg(long)]
        system: String,
        /// Emulated capacity (fio size syntax, e.g. 64g; on stacks the
        /// capacity device's); default per system.
        #[arg(long)]
        capacity: Option<String>,
        /// NAND drive writes that end preconditioning (on NAND devices).
        #[arg(long, default_value_t = 2.0)]
        steady_state_drive_writes: f64,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Replay a CSV block trace (timestamp_us,op,offset,size) open loop on an emulated device.
    Trace {
        file: PathBuf,
        /// qlc, tlc, scm, zns, hdd, sluice+qlc, sluice+qlc-lifetime, sluice+zns, sluice+zns-shared, setassoc+qlc.
        #[arg(long)]
        system: String,
        /// Emulated capacity (fio size syntax); default per system.
        #[arg(long)]
        capacity: Option<String>,
        /// csv (timestamp_us,op,offset,size), msr (MSR Cambridge CSV),
        /// heimdall (ts_ms devno offset size op) or vscsi (CloudPhysics'
        /// binary records); docs/workloads.md.
        #[arg(long, default_value = "csv")]
        format: String,
        /// Replay the trace this many times; the second half of the passes
        /// is the steady-state window.
        #[arg(long, default_value_t = 1)]
        passes: usize,
        /// Write the whole device once, sequentially, before the first pass.
        #[arg(long)]
        precondition: bool,
        /// Stacked systems: the cache device's size (fio size syntax;
        /// default 1/32 of the capacity).
        #[arg(long)]
        cache: Option<String>,
        /// Most requests in flight; the replay stalls beyond it.
        #[arg(long, default_value_t = 256)]
        inflight_max: usize,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The engine's own cost per 4 KiB I/O, in process on memory devices.
    Engine {
        #[arg(long, default_value_t = 1_000_000)]
        ios: u64,
        /// Volume size (fio size syntax).
        #[arg(long, default_value = "4g")]
        volume: String,
        /// Cache device size.
        #[arg(long, default_value = "1g")]
        cache: String,
        /// Writes submitted together, as one group commit (1: one per call).
        #[arg(long, default_value_t = 32)]
        iodepth: usize,
        /// Also run the requests on one thread and then split across this
        /// many, reporting wall-clock IOPS and the scaling (JSON keys
        /// `threads`, `write_iops_total`, `read_iops_total`, `write_scaling`).
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// With --threads: a background compactor runs beside the writers
        /// (as in `sluice serve`) instead of compaction inline in a write.
        #[arg(long)]
        compactor: bool,
        #[arg(long, default_value = "target/bench/engine.json")]
        json: PathBuf,
    },
    /// Crash-reopen time with a full cache: fill the log with 4 KiB random
    /// writes, drop the engine without shutdown (kill -9), time the reopen.
    Recovery {
        /// Cache device size (fio size syntax).
        #[arg(long, default_value = "8g")]
        cache: String,
        /// Volume size.
        #[arg(long, default_value = "16g")]
        volume: String,
        #[arg(long, default_value = "target/bench/recovery.json")]
        json: PathBuf,
    },
    /// A huge volume with its L2P paged within a DRAM budget against a
    /// small one wholly in DRAM: random 4 KiB writes over the whole volume,
    /// read back, crash-recovered, reopened (docs/engine.md).
    L2p {
        /// The paged volume (fio size syntax).
        #[arg(long, default_value = "64t")]
        volume: String,
        /// The paged volume's L2P DRAM budget.
        #[arg(long, default_value = "1g")]
        budget: String,
        /// The volume whose map stays in DRAM.
        #[arg(long, default_value = "16g")]
        resident_volume: String,
        #[arg(long, default_value_t = 400_000)]
        writes: u64,
        /// Where the cache devices' sparse files go.
        #[arg(long, default_value = "/tmp")]
        dir: PathBuf,
        #[arg(long, default_value = "target/bench/l2p.json")]
        json: PathBuf,
    },
    /// Opens COUNT NBD connections to a running `sluice serve` (full
    /// handshake), holds them, reads once on each, and reports the server's
    /// memory and threads per idle connection (scripts/bench-connections.sh).
    Connections {
        /// The server's TCP address.
        #[arg(long, default_value = "127.0.0.1:10809")]
        addr: String,
        #[arg(long, default_value = "default")]
        export: String,
        #[arg(long, default_value_t = 10_000)]
        count: usize,
        /// The server's process id, for /proc/PID/status.
        #[arg(long)]
        server_pid: u32,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Sequential READs or WRITEs at a fixed queue depth against any NBD
    /// server, plaintext or TLS (a lean client: its TLS cost is ring's
    /// AES-GCM, not GnuTLS's); reports MiB/s and the client's CPU per MiB.
    NbdLoad {
        /// The server's TCP address.
        #[arg(long, default_value = "127.0.0.1:10809")]
        addr: String,
        #[arg(long, default_value = "default")]
        export: String,
        /// write or read.
        #[arg(long, default_value = "write")]
        rw: String,
        #[arg(long, default_value = "128k")]
        bs: String,
        #[arg(long, default_value_t = 32)]
        iodepth: usize,
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// The cursor wraps within this many bytes from offset 0.
        #[arg(long, default_value = "1g")]
        span: String,
        /// STARTTLS and verify the server against this CA (PEM).
        #[arg(long)]
        tls_ca: Option<PathBuf>,
        /// The name the certificate must carry.
        #[arg(long, default_value = "localhost")]
        tls_name: String,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The TLS record layer against rustls's own unbuffered API, in one
    /// process: the server opening a client's records and sealing replies
    /// (TLS 1.3, AES-128-GCM), MiB/s each (a test certificate is made with
    /// openssl).
    TlsRecords {
        /// Plaintext each way, MiB.
        #[arg(long, default_value_t = 512)]
        mib: u64,
        /// Request and reply size.
        #[arg(long, default_value = "128k")]
        message: String,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// 4 KiB random writes through the io_uring file backend.
    Uring {
        #[arg(long)]
        path: PathBuf,
        #[arg(long, default_value = "1g")]
        file_bytes: String,
        #[arg(long, default_value_t = 32)]
        iodepth: usize,
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

impl Bench {
    pub fn run(self) -> Result<(), CliError> {
        match self {
            Bench::Media { quick, json, only } => bench_media(quick, &json, only.as_deref()),
            Bench::Csal { quick, json, only, measure } => bench_csal(quick, &json, only.as_deref(), measure.as_deref()),
            Bench::Caching { quick, json, only, disks } => {
                use sluice_bench::caching;
                let o = if quick { caching::CachingOpts::quick() } else { caching::CachingOpts::full() };
                let o = caching::CachingOpts { disks: disks.max(1), ..o };
                let t0 = Instant::now();
                let rows = caching::run_all(&o, only.as_deref())?;
                println!(
                "sluice bench caching ({}): {} MiB of temporary files ({} alive at most), {} HDFS files of {} MiB, \
                 QD{} per job, emulated SCM cache over {} 7200 rpm HDD(s), virtual time\n",
                if quick { "quick" } else { "full" },
                o.temp_bytes >> 20,
                o.live_files,
                o.hdfs_files,
                o.hdfs_file_bytes >> 20,
                o.iodepth,
                o.disks
            );
                print!("{}", caching::table(&rows));
                println!("(wall {:.1} s)", t0.elapsed().as_secs_f64());
                write_json(&json, &rows)
            }
            Bench::Job { file, system, capacity, steady_state_drive_writes, json } => {
                bench_job(&file, &system, capacity.as_deref(), steady_state_drive_writes, json.as_deref())
            }
            Bench::Trace { file, system, capacity, format, passes, precondition, cache, inflight_max, json } => {
                let run = TraceRunOpts {
                    format: format.parse().map_err(CliError)?,
                    passes,
                    precondition,
                    cache_bytes: cache.as_deref().map(parse_bytes).transpose()?,
                    inflight_max,
                };
                bench_trace(&file, &system, capacity.as_deref(), &run, json.as_deref())
            }
            Bench::Engine { ios, volume, cache, iodepth, threads, compactor, json } => {
                let opts = engine::EngineBenchOpts {
                    ios,
                    iodepth,
                    volume_bytes: parse_bytes(&volume)?,
                    cache_bytes: parse_bytes(&cache)?,
                    ..Default::default()
                };
                if threads <= 1 {
                    return engine_bench_one_thread(&opts, &json);
                }
                let r = sluice_bench::engine_threads::run_threads(&opts, threads, compactor)?;
                println!(
                "engine, 4 KiB random in process on {} threads (writes QD{} group commit, reads QD1; compaction {}), wall-clock IOPS:",
                r.threads,
                r.iodepth,
                if r.compactor { "in the background" } else { "inline" }
            );
                let each = |v: &[f64]| v.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" / ");
                println!(
                    "  write: 1 thread {:.0}, {} threads {:.0} total ({} each): {:.2}x",
                    r.one_thread_write_iops,
                    r.threads,
                    r.write_iops_total,
                    each(&r.write_iops_per_thread),
                    r.write_scaling
                );
                println!(
                "         compaction and GC moved {:.2} GB on 1 thread (GC {:.2}), {:.2} GB (GC {:.2}) on {} (after unmeasured warm-up writes)",
                r.one_thread_moved_bytes as f64 / 1e9,
                r.one_thread_gc_bytes as f64 / 1e9,
                r.moved_bytes as f64 / 1e9,
                r.gc_bytes as f64 / 1e9,
                r.threads
            );
                println!(
                    "         CPU per write {:.0} ns on 1 thread, {:.0} ns on {} (on the CPU {:.0} % of their time)",
                    r.one_thread_write_cpu_ns,
                    r.write_cpu_ns,
                    r.threads,
                    r.write_cpu_busy * 100.0
                );
                println!(
                "         the machine's own memory copies in the same run: {:.2}x on {} threads (the ceiling of a copy-bound phase)",
                r.copy_scaling, r.threads
            );
                println!(
                    "  read:  1 thread {:.0}, {} threads {:.0} total ({} each): {:.2}x",
                    r.one_thread_read_iops,
                    r.threads,
                    r.read_iops_total,
                    each(&r.read_iops_per_thread),
                    r.read_scaling
                );
                write_json(&json, &r)?;
                Ok(())
            }
            Bench::Recovery { cache, volume, json } => {
                let opts = engine::RecoveryBenchOpts {
                    cache_bytes: parse_bytes(&cache)?,
                    volume_bytes: parse_bytes(&volume)?,
                    ..Default::default()
                };
                let r = engine::recovery(&opts)?;
                println!(
                "recovery: {} MiB cache, {} 4 KiB writes ({} MiB of log): crash reopen {:.3} s, clean reopen {:.3} s",
                r.cache_bytes >> 20,
                r.writes,
                r.log_bytes_used >> 20,
                r.crash_reopen_s,
                r.clean_reopen_s
            );
                if !cfg!(feature = "heap-count") {
                    println!("heap: not counted (build with `--features heap-count` to count it)");
                    return write_json(&json, &r);
                }
                println!(
                    "heap: engine open {:.1} MiB; peak during recovery {:.1} MiB ({:.2}x), during the clean reopen \
                 {:.1} MiB ({:.2}x)",
                    r.steady_heap_bytes as f64 / (1u64 << 20) as f64,
                    r.recovery_peak_heap_bytes as f64 / (1u64 << 20) as f64,
                    r.over_steady(r.recovery_peak_heap_bytes),
                    r.clean_open_peak_heap_bytes as f64 / (1u64 << 20) as f64,
                    r.over_steady(r.clean_open_peak_heap_bytes)
                );
                write_json(&json, &r)
            }
            Bench::L2p { volume, budget, resident_volume, writes, dir, json } => {
                let opts = sluice_bench::l2p::L2pBenchOpts {
                    volume_bytes: parse_bytes(&volume)?,
                    budget_bytes: parse_bytes(&budget)?,
                    resident_volume_bytes: parse_bytes(&resident_volume)?,
                    writes,
                    dir,
                    ..Default::default()
                };
                let r = sluice_bench::l2p::run(&opts)?;
                for c in &r.cases {
                    println!(
                    "{:>8}: {} GiB volume, L2P {} ({:.1} MiB DRAM): {} random 4 KiB writes ({} blocks) {:.0} IOPS, \
                     read back {:.0} IOPS; page faults {} / write-backs {}; crash reopen {:.2} s (faults {}), \
                     clean reopen {:.2} s; every block checked after each",
                    c.name,
                    c.volume_bytes >> 30,
                    if c.l2p.paged { format!("paged within {} MiB", c.budget_bytes >> 20) } else { "in DRAM".into() },
                    c.l2p.dram_bytes as f64 / (1u64 << 20) as f64,
                    c.writes,
                    c.distinct_blocks,
                    c.write_iops,
                    c.read_iops,
                    c.l2p.page_faults,
                    c.l2p.page_writebacks,
                    c.crash_reopen_s,
                    c.l2p_after_recovery.page_faults,
                    c.clean_reopen_s
                );
                }
                write_json(&json, &r)
            }
            Bench::Connections { addr, export, count, server_pid, json } => {
                let r = connections::run(&addr, &export, count, server_pid, std::time::Duration::from_secs(3))?;
                if let Some(p) = &json {
                    write_json(p, &r)?;
                }
                connections::print(&r, json.as_deref());
                Ok(())
            }
            Bench::NbdLoad { addr, export, rw, bs, iodepth, seconds, span, tls_ca, tls_name, json } => {
                let write = match rw.as_str() {
                    "write" => true,
                    "read" => false,
                    other => return Err(CliError(format!("--rw {other:?}: expected write or read"))),
                };
                let opts = nbdload::LoadOpts {
                    addr,
                    export,
                    tls: tls_ca.map(|ca| sluice_frontend::client::ClientTlsOptions { ca, server_name: tls_name }),
                    write,
                    block_bytes: u32::try_from(parse_bytes(&bs)?)
                        .map_err(|_| CliError(format!("--bs {bs}: too big")))?,
                    iodepth,
                    seconds,
                    span_bytes: parse_bytes(&span)?,
                };
                let r = nbdload::run(&opts)?;
                if let Some(p) = &json {
                    write_json(p, &r)?;
                }
                nbdload::print(&r, json.as_deref());
                Ok(())
            }
            Bench::TlsRecords { mib, message, json } => {
                let message_bytes = parse_bytes(&message)? as usize;
                if message_bytes == 0 || mib == 0 {
                    return Err(CliError("--mib and --message must be positive".into()));
                }
                let dir = std::env::temp_dir().join(format!("sluice-tls-records-{}", std::process::id()));
                std::fs::create_dir_all(&dir).map_err(|e| CliError(format!("{}: {e}", dir.display())))?;
                let made = std::process::Command::new("openssl")
                    .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
                    .args(["-keyout", "key.pem", "-out", "cert.pem", "-subj", "/CN=localhost", "-days", "1"])
                    .current_dir(&dir)
                    .output()
                    .map_err(|e| CliError(format!("openssl (scripts/setup.sh installs it): {e}")))?;
                if !made.status.success() {
                    return Err(CliError(format!("openssl: {}", String::from_utf8_lossy(&made.stderr))));
                }
                let cfg = sluice_frontend::tls::server_config(
                    &dir.join("cert.pem"),
                    &dir.join("key.pem"),
                    sluice_frontend::tls::MinVersion::Tls13,
                    None,
                )
                .map_err(|e| CliError(e.to_string()))?;
                let r = sluice_frontend::tls_bench::compare(&cfg, mib, message_bytes);
                let _ = std::fs::remove_dir_all(&dir);
                let r = r.map_err(|e| CliError(format!("tls-records: {e}")))?;
                println!(
                    "record layer, {} MiB each way in {} B messages (TLS 1.3, AES-128-GCM, server side):",
                    r.mib, r.message_bytes
                );
                println!("  {:<20} {:>12} {:>12}", "", "open MiB/s", "seal MiB/s");
                for (name, s) in [("own (tls_records)", r.own), ("rustls unbuffered", r.rustls_unbuffered)] {
                    println!("  {name:<20} {:>12.0} {:>12.0}", s.open_mib_per_s, s.seal_mib_per_s);
                }
                println!(
                    "  own / rustls: open {:.2}x, seal {:.2}x",
                    r.own.open_mib_per_s / r.rustls_unbuffered.open_mib_per_s,
                    r.own.seal_mib_per_s / r.rustls_unbuffered.seal_mib_per_s
                );
                if let Some(p) = &json {
                    write_json(p, &r)?;
                }
                Ok(())
            }
            Bench::Uring { path, file_bytes, iodepth, seconds, json } => {
                let opts = UringBenchOpts {
                    path,
                    file_bytes: parse_bytes(&file_bytes)?,
                    iodepth,
                    seconds,
                    ..Default::default()
                };
                let r = uring::run(&opts)?;
                println!("io_uring 4 KiB randwrite QD{}: {:.0} IOPS, {:.1} MiB/s", r.iodepth, r.iops, r.mib_per_s);
                if let Some(p) = json {
                    write_json(&p, &r)?;
                }
                Ok(())
            }
        }
    }
}

fn bench_media(quick: bool, json: &Path, only: Option<&str>) -> Result<(), CliError> {
    let scale = if quick { Scale::quick() } else { Scale::full() };
    let jobs_dir = json.parent().unwrap_or(Path::new(".")).join("jobs");
    std::fs::create_dir_all(&jobs_dir)?;
    let t0 = Instant::now();
    let mut rows: Vec<MediaRow> = Vec::new();
    for row in PAPER_ROWS.iter().filter(|r| only.is_none_or(|o| r.workload.contains(o) || r.system.name() == o)) {
        let label = format!("{} {}", row.system.name(), row.workload);
        let (cap, rt) = match row.system {
            System::Qlc => (scale.qlc_bytes, scale.qlc_runtime_s),
            _ => (scale.tlc_bytes, scale.tlc_runtime_s),
        };
        std::fs::write(
            jobs_dir.join(format!("{}-{}.fio", row.system.name(), row.workload)),
            media::job_text(row.workload, cap, rt),
        )?;
        let pb = progress_bar(&label);
        let r = media::run_row(row, &scale, &mut |phase, f| {
            pb.set_message(phase.to_string());
            pb.set_position((f.clamp(0.0, 1.0) * 1000.0) as u64);
        })?;
        pb.finish_and_clear();
        eprintln!("{label:>22}: {:.2} MiB/s/job, WAF {:.3} ({:.1} s)", r.mib_per_s, r.waf, r.wall_seconds);
        rows.push(r);
    }
    println!(
        "\nsluice bench media ({}): QLC {} GiB, TLC {} GiB emulated; paper: 16 TB QLC, 8 jobs x iodepth 32\n",
        if quick { "quick" } else { "full" },
        scale.qlc_bytes >> 30,
        scale.tlc_bytes >> 30
    );
    print!("{}", media::table(&rows));
    write_json(json, &rows)?;
    println!("wrote {} and job files in {} ({:.1} s)", json.display(), jobs_dir.display(), t0.elapsed().as_secs_f64());
    Ok(())
}

fn bench_csal(quick: bool, json: &Path, only: Option<&str>, measure: Option<&str>) -> Result<(), CliError> {
    let mut scale = if quick { CsalScale::quick() } else { CsalScale::full() };
    if let Some(m) = measure {
        scale.io_bytes_per_job = parse_bytes(m)?;
    }
    let jobs_dir = json.parent().unwrap_or(Path::new(".")).join("csal-jobs");
    std::fs::create_dir_all(&jobs_dir)?;
    let t0 = Instant::now();
    let mut rows: Vec<CsalRow> = Vec::new();
    for workload in csal::workloads() {
        for &system in csal::systems_of(workload) {
            if only.is_some_and(|o| !workload.contains(o) && !system.name().contains(o)) {
                continue;
            }
            let label = format!("{} {}", system.name(), workload);
            let exposed = system.exposed_bytes(scale.capacity_bytes);
            let measure = format!("io_size={}\n", csal::io_size(workload, &scale));
            let file = jobs_dir.join(format!("{}-{}.fio", system.name(), workload));
            std::fs::write(file, csal::job_text(workload, exposed, &measure))?;
            let pb = progress_bar(&label);
            let r = csal::run_row(workload, system, &scale, &mut |phase, f| {
                pb.set_message(phase.to_string());
                pb.set_position((f.clamp(0.0, 1.0) * 1000.0) as u64);
            })?;
            pb.finish_and_clear();
            eprintln!("{label:>24}: {:.2} MiB/s/job, WAF {:.3} ({:.1} s)", r.mib_per_s, r.waf, r.wall_seconds);
            rows.push(r);
        }
    }
    csal::add_speedups(&mut rows);
    println!(
        "\nsluice bench csal ({}): {} MiB capacity devices, SCM cache 1/32 of it on stacks, {} MiB per job measured; \
         paper: 16 TB QLC\n",
        if quick { "quick" } else { "full" },
        scale.capacity_bytes >> 20,
        scale.io_bytes_per_job >> 20
    );
    print!("{}", csal::table(&rows));
    print!("{}", csal::tenant_table(&rows));
    write_json(json, &rows)?;
    let svg_path = json.with_extension("svg");
    std::fs::write(&svg_path, csal::svg(&rows))?;
    if let Some(fig) = csal::tenant_svg(&rows) {
        let path = json.with_file_name("zns-isolation.svg");
        std::fs::write(&path, fig)?;
        println!("wrote {} (the ZNS isolation figure)", path.display());
    }
    println!(
        "wrote {}, {} and job files in {} ({:.1} s)",
        json.display(),
        svg_path.display(),
        jobs_dir.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `--system` and `--capacity` (default: the system's own).
fn system_and_capacity(system: &str, capacity: Option<&str>) -> Result<(System, u64), CliError> {
    let system: System = system.parse()?;
    let capacity_bytes = match capacity {
        Some(c) => parse_bytes(c)?,
        None => system.default_capacity_bytes(),
    };
    Ok((system, capacity_bytes))
}

fn bench_job(
    file: &Path,
    system: &str,
    capacity: Option<&str>,
    steady: f64,
    json: Option<&Path>,
) -> Result<(), CliError> {
    let (system, capacity_bytes) = system_and_capacity(system, capacity)?;
    let text = std::fs::read_to_string(file).map_err(|e| CliError(format!("{}: {e}", file.display())))?;
    let pb = progress_bar(&format!("{} on {}", file.display(), system.name()));
    let opts = RunOptions { system, capacity_bytes, steady_state_drive_writes: steady };
    let r = run_job_text(&text, &opts, &mut |phase, f| {
        pb.set_message(phase.to_string());
        pb.set_position((f.clamp(0.0, 1.0) * 1000.0) as u64);
    })?;
    pb.finish_and_clear();
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
    println!(
        "system {} ({} GiB emulated), {} jobs, {:.2} s of device time",
        system.name(),
        capacity_bytes >> 30,
        r.jobs,
        r.device_seconds
    );
    println!(
        "write: {:>10.2} MiB/s/job {:>10.0} IOPS  p50 {:>9.1} us  p99 {:>9.1} us",
        r.write_mib_per_s, r.write_iops, r.write_lat_p50_us, r.write_lat_p99_us
    );
    println!(
        "read:  {:>10.2} MiB/s/job {:>10.0} IOPS  p50 {:>9.1} us  p99 {:>9.1} us",
        r.read_mib_per_s, r.read_iops, r.read_lat_p50_us, r.read_lat_p99_us
    );
    println!("WAF {:.3} (capacity media programmed / bytes the jobs wrote)", r.waf);
    if let Some(t) = &r.tiers {
        println!(
            "stack: cache writes {:.2}x user bytes, host WAF {:.3} (cache + capacity writes), capacity device WAF {:.3}",
            t.cache.host_write_bytes as f64 / r.device.host_write_bytes.max(1) as f64,
            r.waf_host,
            r.waf_device
        );
    }
    match (r.cache_busy_share, r.capacity_busy_share) {
        (Some(c), Some(k)) => println!(
            "busy: cache device {:.1} %, capacity device {:.1} % of the measured window (a request in flight)",
            c * 100.0,
            k * 100.0
        ),
        _ => println!("busy: the device {:.1} % of the measured window (a request in flight)", r.busy_share * 100.0),
    }
    if let Some(path) = json {
        write_json(path, &r)?;
    }
    Ok(())
}

/// `sluice bench trace`'s replay options.
struct TraceRunOpts {
    format: sluice_workload::TraceFormat,
    passes: usize,
    precondition: bool,
    cache_bytes: Option<u64>,
    inflight_max: usize,
}

fn bench_trace(
    file: &Path,
    system: &str,
    capacity: Option<&str>,
    o: &TraceRunOpts,
    json: Option<&Path>,
) -> Result<(), CliError> {
    let (system, capacity_bytes) = system_and_capacity(system, capacity)?;
    // Checked here so that a missing file is reported before the build.
    std::fs::File::open(file).map_err(|e| CliError(format!("{}: {e}", file.display())))?;
    let built = system.build_with_cache(capacity_bytes, o.cache_bytes)?;
    let reopen = || {
        let f = std::fs::File::open(file)?;
        Ok(TraceReader::with_format(std::io::BufReader::new(f), o.format))
    };
    let run = trace::replay_passes(&built, system.name(), reopen, o.passes, o.precondition, o.inflight_max)?;
    if run.precondition_bytes > 0 {
        println!(
            "preconditioned: {} GiB written sequentially in {:.1} s of device time",
            run.precondition_bytes >> 30,
            run.precondition_device_seconds
        );
    }
    let r = &run.passes[run.passes.len() - 1].report;
    println!(
        "{} records ({} reads, {} writes, {} trims, {} flushes; {} unaligned, {} trims ignored) on {} in {:.3} s of device time{}",
        r.records,
        r.reads,
        r.writes,
        r.trims,
        r.flushes,
        r.unaligned_records,
        r.trims_ignored,
        system.name(),
        r.device_seconds,
        if run.passes.len() > 1 { " (last pass)" } else { "" }
    );
    println!("read  latency p50 {:>9.1} us  p99 {:>9.1} us", r.read_lat_p50_us, r.read_lat_p99_us);
    println!("write latency p50 {:>9.1} us  p99 {:>9.1} us", r.write_lat_p50_us, r.write_lat_p99_us);
    if run.passes.len() > 1 {
        println!(
            "{:>5} {:>12} {:>14} {:>12} {:>12}",
            "pass", "written MiB", "programmed MiB", "cache wr MiB", "device s"
        );
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        for (i, p) in run.passes.iter().enumerate() {
            println!(
                "{:>5} {:>12.1} {:>14.1} {:>12} {:>12.1}",
                i + 1,
                mib(p.report.write_bytes),
                mib(p.report.device.media_program_bytes),
                p.cache.map_or("-".into(), |c| format!("{:.1}", mib(c.host_write_bytes))),
                p.report.device_seconds
            );
        }
    }
    println!(
        "steady state (last {} of {} passes): {:.1} MiB programmed to the {} medium for {:.1} MiB written: WAF {:.3}",
        run.steady_passes,
        run.passes.len(),
        run.steady_media_program_bytes as f64 / (1u64 << 20) as f64,
        if built.tiers.is_some() { "capacity" } else { "device's" },
        run.steady_write_bytes as f64 / (1u64 << 20) as f64,
        run.steady_waf
    );
    if let Some(path) = json {
        write_json(path, &run)?;
    }
    Ok(())
}

/// `sluice bench engine` on one thread: IOPS per core and where the time goes.
fn engine_bench_one_thread(opts: &engine::EngineBenchOpts, json: &std::path::Path) -> Result<(), CliError> {
    let r = engine::run(opts)?;
    println!(
        "engine, 4 KiB random in process: write (QD{} group commit) {:.0} IOPS/core, read (QD1) {:.0} \
             IOPS/core, DRAM {:.2} bytes/block (L2P 4 + CRC 4 + chunk P2L 16 per cache block), host WAF {:.2}",
        r.iodepth, r.write_iops_per_core, r.read_iops_per_core, r.dram_bytes_per_block, r.host_waf
    );
    println!(
        "  where the time goes: memory devices' memcpy {:.0} % of write time, {:.0} % of read time; the \
             engine itself adds {:.0} ns per write (incl. the compaction it triggers; {:.0} k IOPS/core) \
             and {:.0} ns per read ({:.0} k IOPS/core)",
        r.write_device_share * 100.0,
        r.read_device_share * 100.0,
        r.write_engine_ns_per_io,
        1e6 / r.write_engine_ns_per_io,
        r.read_engine_ns_per_io,
        1e6 / r.read_engine_ns_per_io
    );
    write_json(json, &r)
}
