//! `sluice cache …`: a running server's in-place cache, commanded through
//! its control socket (`control`), as `casadm` commands Open CAS. Each
//! subcommand prints a table, or with `--json` the server's answer as it
//! came; docs/operate.md maps casadm and bcache habits to these.

use crate::control::{self, Request};
use crate::{serve, CliError};
use serde_json::Value;
use std::path::PathBuf;

/// Where the server is: its socket, or the config (or data directory)
/// whose `control_socket` it listens on.
#[derive(clap::Args)]
pub struct Target {
    /// The server's config: its data directory's `control_socket`.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// The server's data directory (instead of the config's `data_dir`).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// The control socket itself.
    #[arg(long, global = true, conflicts_with_all = ["config", "data_dir"])]
    socket: Option<PathBuf>,
    /// Print the server's answer as JSON.
    #[arg(long, global = true)]
    json: bool,
}

impl Target {
    fn socket(&self) -> Result<PathBuf, CliError> {
        if let Some(s) = &self.socket {
            return Ok(s.clone());
        }
        let mut cfg = serve::Config::load(self.config.as_deref())?;
        if let Some(d) = &self.data_dir {
            cfg.data_dir = d.clone();
        }
        control::socket_of(&cfg).map_err(CliError)
    }
}

#[derive(clap::Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    cmd: CacheCmd,
    #[command(flatten)]
    target: Target,
}

#[derive(clap::Subcommand)]
enum CacheCmd {
    /// Devices, layout, each volume's mode, cached, dirty and clean bytes,
    /// occupancy of the cache, cleaning policy (casadm -L).
    Status,
    /// Totals since the server started, per volume and per I/O class: read
    /// hits and misses, writes cached, writes past the cache by reason
    /// (mode, cutoff, class share 0, spill), promoted, cleaned, discarded
    /// dirty, retained and evicted bytes; with --interval, rates too.
    Stats {
        /// Seconds between two samples, for rates (0: totals only).
        #[arg(long, default_value_t = 0.0)]
        interval: f64,
    },
    /// Set a volume's cache mode: wb, wt, wa, wi or pt (casadm -Q). Dirty
    /// data stays and is cleaned as usual. Lasts until a restart or a
    /// reload, which apply the config.
    SetMode { volume: String, mode: String },
    /// Set the share of the cache an I/O class of a volume may hold, in
    /// [0, 1] (0: never cached). Lasts until a restart or a reload.
    SetClass {
        volume: String,
        class: String,
        #[arg(long)]
        share: f64,
    },
    /// Write every dirty block home, showing progress (casadm -F). Ctrl-C
    /// stops it after the step in flight; run it again to resume.
    Clean {
        /// Bytes written home per step (sizes as in the config).
        #[arg(long, default_value = "16MiB")]
        step: String,
    },
    /// Make every volume pass-through, then clean: the disk alone holds
    /// every volume when it ends (casadm -T: stop caching, flushing).
    Detach {
        /// Bytes written home per step (sizes as in the config).
        #[arg(long, default_value = "16MiB")]
        step: String,
    },
    /// Every volume back to the mode its config gives it (after a detach
    /// or set-mode).
    Attach,
}

impl CacheArgs {
    pub fn run(self) -> Result<(), CliError> {
        let CacheArgs { cmd, target } = self;
        if let CacheCmd::Stats { interval } = cmd {
            if !(0.0..=3600.0).contains(&interval) {
                return Err(CliError("--interval must be in [0, 3600] seconds".into()));
            }
        }
        let socket = target.socket()?;
        let json = target.json;
        let req = match &cmd {
            CacheCmd::Status => Request::Status,
            CacheCmd::Stats { .. } => Request::Stats,
            CacheCmd::SetMode { volume, mode } => Request::SetMode { volume: volume.clone(), mode: mode.clone() },
            CacheCmd::SetClass { volume, class, share } => {
                Request::SetClass { volume: volume.clone(), class: class.clone(), share: *share }
            }
            CacheCmd::Clean { step } => Request::Clean { detach: false, step_bytes: Some(step_bytes(step)?) },
            CacheCmd::Detach { step } => Request::Clean { detach: true, step_bytes: Some(step_bytes(step)?) },
            CacheCmd::Attach => Request::Attach,
        };
        let mut last_shown = std::time::Instant::now();
        let mut on_progress = |p: &Value| {
            if json {
                println!("{}", serde_json::json!({ "progress": p }));
            } else if last_shown.elapsed().as_millis() >= 500 {
                last_shown = std::time::Instant::now();
                eprintln!("cleaning: {} written home, {} dirty", mib(&p["cleaned_bytes"]), mib(&p["dirty_bytes"]));
            }
        };
        let answer = control::request(&socket, &req, &mut on_progress).map_err(CliError)?;
        match cmd {
            CacheCmd::Stats { interval } if interval > 0.0 => {
                let t = std::time::Instant::now();
                std::thread::sleep(std::time::Duration::from_secs_f64(interval));
                let later = control::request(&socket, &Request::Stats, &mut |_| {}).map_err(CliError)?;
                let rates = rates(&answer, &later, t.elapsed().as_secs_f64());
                if json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&serde_json::json!({ "totals": later, "rates": rates }))?
                    );
                } else {
                    print!("{}", stats_table(&later, Some(&rates)));
                }
            }
            _ if json => println!("{}", serde_json::to_string_pretty(&answer)?),
            CacheCmd::Status => print!("{}", status_table(&answer)),
            CacheCmd::Stats { .. } => print!("{}", stats_table(&answer, None)),
            CacheCmd::Clean { .. } | CacheCmd::Detach { .. } => println!(
                "sluice: {} written home; {} dirty{}",
                mib(&answer["cleaned_bytes"]),
                mib(&answer["dirty_bytes"]),
                match (answer["stopped"].as_bool(), answer["detached"].as_bool()) {
                    (Some(true), _) => " (stopped: run it again to resume)",
                    (_, Some(true)) => "; every volume is pass-through: the disk alone holds every volume",
                    _ => "",
                }
            ),
            CacheCmd::SetMode { .. } | CacheCmd::SetClass { .. } => {
                println!("sluice: {}", answer["changed"].as_str().unwrap_or(""))
            }
            CacheCmd::Attach => match answer["changed"].as_array() {
                Some(c) if !c.is_empty() => {
                    let lines: Vec<&str> = c.iter().filter_map(Value::as_str).collect();
                    println!("sluice: {}", lines.join("; "))
                }
                _ => println!("sluice: every volume already runs its configured mode"),
            },
        }
        Ok(())
    }
}

fn step_bytes(text: &str) -> Result<u64, CliError> {
    let n = sluice_workload::job::parse_bytes(text).map_err(|e| CliError(format!("--step {text:?}: {e}")))?;
    if n < 4096 {
        return Err(CliError(format!("--step {text:?}: at least one 4 KiB block")));
    }
    Ok(n)
}

fn mib(v: &Value) -> String {
    format!("{:.1} MiB", v.as_u64().unwrap_or(0) as f64 / (1u64 << 20) as f64)
}

fn status_table(s: &Value) -> String {
    let mut o = String::new();
    o += &format!("layout {}; {}\n", s["layout"].as_str().unwrap_or("?"), s["state"].as_str().unwrap_or("?"));
    for d in s["devices"].as_array().into_iter().flatten() {
        o += &format!("{}\n", d.as_str().unwrap_or(""));
    }
    o += &format!(
        "cache {}: {} cached ({:.1} %), {} dirty; log chunks {} ({} free)\n",
        mib(&s["cache_bytes"]),
        mib(&s["cached_bytes"]),
        s["occupancy"].as_f64().unwrap_or(0.0) * 100.0,
        mib(&s["dirty_bytes"]),
        s["log_chunks"],
        s["log_chunks_free"],
    );
    let c = &s["cleaning"];
    o += &format!(
        "cleaning {} (dirty set point {:.0} %, age {} s, idle {} s)\n",
        c["mode"].as_str().unwrap_or("?"),
        c["dirty_setpoint"].as_f64().unwrap_or(0.0) * 100.0,
        c["age_s"],
        c["idle_s"]
    );
    o += &format!("{:<16} {:>5} {:>12} {:>12} {:>12} {:>12}\n", "volume", "mode", "size", "cached", "dirty", "clean");
    for v in s["volumes"].as_array().into_iter().flatten() {
        o += &format!(
            "{:<16} {:>5} {:>12} {:>12} {:>12} {:>12}\n",
            v["name"].as_str().unwrap_or("?"),
            v["mode"].as_str().unwrap_or("?"),
            mib(&v["size_bytes"]),
            mib(&v["cached_bytes"]),
            mib(&v["dirty_bytes"]),
            mib(&v["clean_bytes"]),
        );
        for cl in v["classes"].as_array().into_iter().flatten().filter(|c| c["class"] != "unclassified") {
            o += &format!(
                "  class {:<10} share {:>5.2} {:>12} cached\n",
                cl["class"].as_str().unwrap_or("?"),
                cl["share"].as_f64().unwrap_or(1.0),
                mib(&cl["cached_bytes"])
            );
        }
    }
    o
}

/// The counters a stats table shows, in order, with their labels.
const COUNTERS: [(&str, &str); 14] = [
    ("read_hit_bytes", "read hits"),
    ("read_miss_bytes", "read misses"),
    ("write_back_bytes", "writes cached (write-back)"),
    ("write_through_bytes", "writes cached (write-through)"),
    ("write_past_bytes", "writes past: mode"),
    ("cutoff_bypass_bytes", "writes past: sequential cutoff"),
    ("class_bypass_bytes", "writes past: class share 0"),
    ("spill_bytes", "writes past: spill (cache full of dirty data)"),
    ("promoted_bytes", "promoted from home"),
    ("cleaned_bytes", "cleaned home"),
    ("discarded_dirty_bytes", "dirty discarded (trimmed first)"),
    ("retained_bytes", "retained at reclaim"),
    ("relogged_bytes", "moved forward dirty at reclaim (pinned)"),
    ("evicted_bytes", "evicted at reclaim"),
];

/// Per-second rates of every counter between two `stats` answers.
fn rates(a: &Value, b: &Value, secs: f64) -> Value {
    let mut out = serde_json::Map::new();
    for (k, _) in COUNTERS {
        let d = b["total"][k].as_u64().unwrap_or(0).saturating_sub(a["total"][k].as_u64().unwrap_or(0));
        out.insert(k.to_string(), serde_json::json!(d as f64 / secs.max(1e-9)));
    }
    Value::Object(out)
}

fn stats_table(s: &Value, rates: Option<&Value>) -> String {
    let vols: Vec<&Value> = s["volumes"].as_array().map(|v| v.iter().collect()).unwrap_or_default();
    let mut o = format!("{:<46} {:>14}", "bytes since the start", "total");
    for v in &vols {
        o += &format!(" {:>14}", v["volume"].as_str().unwrap_or("?"));
    }
    if rates.is_some() {
        o += &format!(" {:>12}", "MiB/s");
    }
    o += "\n";
    for (k, label) in COUNTERS {
        o += &format!("{label:<46} {:>14}", s["total"][k].as_u64().unwrap_or(0));
        for v in &vols {
            o += &format!(" {:>14}", v["stats"][k].as_u64().unwrap_or(0));
        }
        if let Some(r) = rates {
            o += &format!(" {:>12.2}", r[k].as_f64().unwrap_or(0.0) / (1u64 << 20) as f64);
        }
        o += "\n";
    }
    let reads =
        s["total"]["read_hit_bytes"].as_u64().unwrap_or(0) + s["total"]["read_miss_bytes"].as_u64().unwrap_or(0);
    match reads {
        0 => o += "read hit ratio: - (no reads)\n",
        n => {
            let hits = s["total"]["read_hit_bytes"].as_u64().unwrap_or(0);
            o += &format!("read hit ratio: {:.1} %\n", hits as f64 * 100.0 / n as f64)
        }
    }
    for v in &vols {
        for c in v["classes"].as_array().into_iter().flatten() {
            o += &format!(
                "volume {} class {}: cached {}, written {}, read {}, past (share 0) {}, spilled (share held) {}, past by the cutoff {}, recognised late {}\n",
                v["volume"].as_str().unwrap_or("?"),
                c["class"].as_str().unwrap_or("?"),
                c["cached_bytes"],
                c["write_bytes"],
                c["read_bytes"],
                c["bypass_bytes"],
                c["spill_bytes"],
                c["cutoff_bytes"],
                c["reclassified_bytes"]
            );
            let n = |k: &str| c[k].as_u64().unwrap_or(0);
            let (mine, theirs) = (
                n("class_in_time_bytes") + n("class_missed_bytes"),
                n("other_kept_out_bytes") + n("other_admitted_bytes"),
            );
            if mine + theirs > 0 {
                let pct = |a: u64, b: u64| if b == 0 { 100.0 } else { a as f64 * 100.0 / b as f64 };
                o += &format!(
                    "  at write time: {:.1} % of the class's bytes taken in, {:.1} % of others' kept out ({} bytes never named)\n",
                    pct(n("class_in_time_bytes"), mine),
                    pct(n("other_kept_out_bytes"), theirs),
                    n("unresolved_bytes")
                );
            }
        }
    }
    o
}
