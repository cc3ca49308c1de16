//! The `sluice` command: Sluice's server, experiments and tools.
//!
//! This file parses the command line and hands each command to its own
//! module, which holds the command's arguments (a `clap::Args` struct) and
//! what it does:
//! - `operate`: `serve`, `format`, `check`, `clean`, `stats` — the
//!   operator's commands (the server itself is `serve/`, the metrics
//!   scraper `metrics`);
//! - `bench`: `bench media|csal|caching|job|trace|engine|recovery|l2p|
//!   connections|nbd-load|tls-records|uring`, every experiment, each with
//!   its table and JSON;
//! - `simulate`: `sim`, the engine's crash simulation over any range of
//!   seeds;
//! - `advise`: `advise`, the cache advisor over a recorded trace.
//!
//! Errors print as one clear line (`CliError`); a panic ends the process
//! at once (`abort_on_panic`).

mod connections;
mod control;
mod directories;
mod metrics;
mod nbdload;
mod recorder;
mod serve;

mod advise;
mod bench;
mod cache_cmd;
mod operate;
mod simulate;

use clap::{Parser, Subcommand};

/// Counted, so that `sluice bench recovery` can report recovery's peak heap
/// against the engine's steady state (`sluice_bench::heap`).
#[cfg(feature = "heap-count")]
#[global_allocator]
static HEAP: sluice_bench::heap::Counting = sluice_bench::heap::Counting;

use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "sluice", version, about = "Sluice: a media-aware storage acceleration layer")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the engine's volumes over NBD (defaults: ./sluice-data, 127.0.0.1:10809, volume "default").
    Serve(operate::ServeArgs),
    /// Create a new, empty engine on the configured devices (files are
    /// created if missing). Refuses devices that hold an engine or other
    /// data unless --force.
    Format(operate::FormatArgs),
    /// Scan the engine's devices read-only: superblock and label, every
    /// log record and segment header, every block's data against its CRC,
    /// the checkpoint against the media. Exits 1 if it finds damage.
    Check(operate::CheckArgs),
    /// In-place engines (docs/caching.md), with the server stopped: write
    /// every dirty block home and shut down cleanly, so that the capacity
    /// device alone holds every volume (each from the byte it prints).
    Clean(operate::CleanArgs),
    /// In-place engines, with the server stopped: read every home that has
    /// no checksum yet (an attached disk's existing data) and record one, so
    /// that damage to it is found on read and by `check` (docs/caching.md).
    Scrub(operate::ScrubArgs),
    /// A running server's in-place cache, through its control socket, as
    /// casadm: status, stats, set-mode, set-class, clean, detach, attach
    /// (docs/operate.md).
    Cache(cache_cmd::CacheArgs),
    /// Reproducible experiments.
    Bench {
        #[command(subcommand)]
        what: bench::Bench,
    },
    /// A running server's per-volume IOPS, bandwidth, latency, cache
    /// occupancy, WAF and compaction/GC rates (from its metrics endpoint).
    Stats(operate::StatsArgs),
    /// Crash simulation of the engine: random I/O, power lost at random
    /// moments, reopen, every block checked. Stops at the first failing seed.
    Sim(simulate::SimArgs),
    /// How big a cache a recorded trace needs (`[[volume]] trace`): its
    /// live data, the trace replayed in virtual time at several cache sizes
    /// (capacity-device writes, spill, hits), the size at the knee and each
    /// device's endurance at the trace's rate (docs/advise.md).
    Advise(advise::AdviseArgs),
}

#[derive(Debug)]
struct CliError(String);

impl<E: std::fmt::Display> From<E> for CliError {
    fn from(e: E) -> CliError {
        CliError(e.to_string())
    }
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), CliError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(value)? + "\n")?;
    Ok(())
}

fn progress_bar(label: &str) -> ProgressBar {
    let pb = ProgressBar::new(1000);
    pb.set_style(
        ProgressStyle::with_template("{prefix:>22} {msg:<13} [{bar:30}] {elapsed}")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.set_prefix(label.to_string());
    pb
}

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.cmd {
        Cmd::Serve(a) => a.run(),
        Cmd::Format(a) => a.run(),
        Cmd::Check(a) => a.run(),
        Cmd::Clean(a) => a.run(),
        Cmd::Scrub(a) => a.run(),
        Cmd::Stats(a) => a.run(),
        Cmd::Cache(a) => a.run(),
        Cmd::Bench { what } => what.run(),
        Cmd::Sim(a) => a.run(),
        Cmd::Advise(a) => a.run(),
    }
}

/// A panic is a bug: whatever thread it hits, the whole process ends at once
/// (after the usual message), so a supervisor restarts it and the next start
/// recovers from the media. Unwinding instead would leave a half-alive
/// server: a poisoned engine lock, handshakes that time out, requests that
/// hang.
fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        eprintln!("sluice: a bug stopped the process (the panic above); the next start recovers from the devices");
        std::process::abort();
    }));
}

fn main() -> ExitCode {
    abort_on_panic();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError(msg)) => {
            eprintln!("sluice: {msg}");
            ExitCode::FAILURE
        }
    }
}
