//! `sluice sim`: the engine's crash simulation over a range of seeds
//! (sluice-sim), its options and its summary line.

use crate::CliError;
use std::time::Instant;

/// `sluice sim`'s arguments (the command's help is on `Cmd::Sim`).
#[derive(clap::Args)]
pub struct SimArgs {
    /// How many seeds to run.
    #[arg(long, default_value_t = 500)]
    seeds: u64,
    /// First seed (a failure prints the seed that replays it).
    #[arg(long, default_value_t = 0)]
    seed_start: u64,
    /// Operations per seed.
    #[arg(long, default_value_t = 1200)]
    ops: usize,
    /// The capacity device is an emulated ZNS SSD (zone states through
    /// each power cycle; no request may be rejected by the drive).
    #[arg(long)]
    zns: bool,
    /// Also flip a bit at rest on either device before a quarter of the
    /// reopens: refused as damage (then salvaged), failing the reads of
    /// the blocks it hit, or harmless — never read back as data.
    #[arg(long)]
    flips: bool,
    /// Swarm testing: draw each seed's geometry (chunk, band and write
    /// unit sizes, volume count and sizes) instead of the fixed one.
    #[arg(long)]
    swarm: bool,
    /// Page every volume's L2P through the cache device's map region
    /// (volumes of 1 to 3 map pages, two in DRAM each).
    #[arg(long)]
    paged: bool,
    /// The in-place layout (caching over a plain disk, write-back);
    /// not with --flips or --zns.
    #[arg(long, conflicts_with_all = ["flips", "zns"])]
    in_place: bool,
    /// With --in-place: the cache attached to a disk (`[engine] attach`):
    /// checkpoint on the cache device, the disk's identity checked at
    /// every reopen.
    #[arg(long, requires = "in_place")]
    attached: bool,
    /// Lifetime placement: two compaction and three GC streams by
    /// inferred block lifetime (docs/engine.md); not with --in-place.
    #[arg(long, conflicts_with = "in_place")]
    lifetime: bool,
    /// Writes through the concurrent path under a seeded scheduler:
    /// up to 4 staged writes advance one step at a time (reserve, write,
    /// publish, flush), reads run and power is lost between any two
    /// steps; not with --in-place.
    #[arg(long, conflicts_with = "in_place")]
    concurrent: bool,
    /// Check every invariant of the engine's state (`check_invariants`)
    /// after every operation, not every 101st (slower).
    #[arg(long)]
    strict: bool,
}

impl SimArgs {
    pub fn run(self) -> Result<(), CliError> {
        let s = self;
        let opts = sluice_sim::crashsim::SimOptions {
            flips: s.flips,
            swarm: s.swarm,
            paged: s.paged,
            in_place: s.in_place,
            attached: s.attached,
            lifetime: s.lifetime,
            concurrent: s.concurrent,
            strict: s.strict,
            ..Default::default()
        };
        sim(s.seeds, s.seed_start, s.ops, s.zns, opts)
    }
}

fn sim(
    seeds: u64,
    seed_start: u64,
    ops: usize,
    zns: bool,
    opts: sluice_sim::crashsim::SimOptions,
) -> Result<(), CliError> {
    let t = Instant::now();
    let mut r = sluice_sim::crashsim::CrashReport::default();
    let flag = opts.flags(zns);
    for seed in seed_start..seed_start.saturating_add(seeds) {
        let seed_report = sluice_sim::crashsim::run_crash_seed_with(seed, ops, zns, opts).map_err(|e| {
            CliError(format!("{e}\nreplay: sluice sim{flag} --seed-start {seed} --seeds 1 --ops {ops}"))
        })?;
        r.add(&seed_report);
    }
    if opts.in_place {
        println!(
            "in place: {} cached blocks kept clean by the reopens ({} by recoveries after a crash), each equal to its \
             home; {} KiB of pinned dirty blocks moved forward by reclaims",
            r.clean_after_reopen,
            r.clean_after_crash,
            r.relogged_bytes / 1024
        );
    }
    if !opts.in_place {
        println!("direct writes: {} KiB went to the capacity device as segments of their own", r.direct_bytes / 1024);
    }
    if opts.concurrent {
        println!(
            "scheduler: {} writes and {} trims staged, {} steps ({} found no room while records were in flight, or \
             a trim's blocks in flight), {} compaction and GC steps beside records in flight, {} crashes with a \
             record reserved and not published",
            r.staged_writes, r.staged_trims, r.steps, r.busy_steps, r.relocations_beside, r.crashes_in_flight
        );
    }
    println!(
        "sim{flag}: {seeds} seeds from {seed_start}, {ops} ops each, {} crashes ({} inside an operation, {} more \
         during the reopen; {} after a clean shutdown, {} after one a failed write cut short), every block checked \
         after each: all passed in {:.1} s",
        r.crashes,
        r.crashes_inside_ops,
        r.crashes_in_recovery,
        r.clean_shutdowns,
        r.interrupted_shutdowns,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
