//! The operator's commands on a data directory and a running server:
//! `sluice serve`, `format`, `check`, `clean` and `stats` — each one's
//! arguments and what it does (the work itself is in `serve` and
//! `metrics`).

use crate::{metrics, serve, CliError};
use std::path::PathBuf;
use std::time::Instant;

/// `sluice serve`'s arguments (the command's help is on `Cmd::Serve`).
#[derive(clap::Args)]
pub struct ServeArgs {
    /// TOML config (docs/serve.md); every key is optional.
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    flags: serve::Overrides,
    /// Print the effective config (the file with these flags applied)
    /// as TOML and exit without starting.
    #[arg(long)]
    print_config: bool,
}

impl ServeArgs {
    pub fn run(self) -> Result<(), CliError> {
        let ServeArgs { config, flags, print_config, .. } = self;
        let cfg = flags.apply(serve::Config::load(config.as_deref())?)?;
        if print_config {
            // Refused as a start would refuse it (nothing is opened).
            serve::preflight(&cfg)?;
            print!("{}", toml::to_string(&cfg)?);
            return Ok(());
        }
        Ok(serve::run(cfg, config.as_deref(), &flags)?)
    }
}

/// `sluice format`'s arguments (the command's help is on `Cmd::Format`).
#[derive(clap::Args)]
pub struct FormatArgs {
    /// TOML config (docs/serve.md), as for `serve`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Destroy whatever the devices hold.
    #[arg(long)]
    force: bool,
}

impl FormatArgs {
    pub fn run(self) -> Result<(), CliError> {
        let FormatArgs { config, force, .. } = self;
        println!("{}", serve::format(&serve::Config::load(config.as_deref())?, force)?);
        Ok(())
    }
}

/// `sluice check`'s arguments (the command's help is on `Cmd::Check`).
#[derive(clap::Args)]
pub struct CheckArgs {
    /// TOML config (docs/serve.md), as for `serve`.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Open the engine accepting the damage recovery finds (damaged
    /// blocks are trimmed and listed), then shut it down cleanly.
    #[arg(long)]
    salvage: bool,
}

impl CheckArgs {
    pub fn run(self) -> Result<(), CliError> {
        let CheckArgs { config, json, salvage, .. } = self;
        let (text, damaged) = serve::check(&serve::Config::load(config.as_deref())?, json, salvage)?;
        print!("{text}");
        if damaged {
            use std::io::Write;
            let _ = std::io::stdout().flush();
            std::process::exit(1);
        }
        Ok(())
    }
}

/// `sluice clean`'s arguments (the command's help is on `Cmd::Clean`).
#[derive(clap::Args)]
pub struct CleanArgs {
    /// TOML config (docs/serve.md), as for `serve`.
    #[arg(long)]
    config: Option<PathBuf>,
}

impl CleanArgs {
    pub fn run(self) -> Result<(), CliError> {
        let CleanArgs { config, .. } = self;
        print!("{}", serve::clean(&serve::Config::load(config.as_deref())?)?);
        Ok(())
    }
}

/// `sluice scrub`'s arguments (the command's help is on `Cmd::Scrub`).
#[derive(clap::Args)]
pub struct ScrubArgs {
    /// TOML config (docs/serve.md), as for `serve`.
    #[arg(long)]
    config: Option<PathBuf>,
}

impl ScrubArgs {
    pub fn run(self) -> Result<(), CliError> {
        let ScrubArgs { config, .. } = self;
        print!("{}", serve::scrub(&serve::Config::load(config.as_deref())?)?);
        Ok(())
    }
}

/// `sluice stats`'s arguments (the command's help is on `Cmd::Stats`).
#[derive(clap::Args)]
pub struct StatsArgs {
    /// The server's `metrics_listen` address (default: the config's, or
    /// 127.0.0.1:10810 without one).
    #[arg(long, conflicts_with = "config")]
    addr: Option<String>,
    /// The server's config: its `metrics_listen` address is scraped.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// The server's data directory: the running server says where its
    /// metrics are, through its control socket (`sluice cache`).
    #[arg(long, conflicts_with_all = ["addr", "config"])]
    data_dir: Option<std::path::PathBuf>,
    /// Seconds between the two scrapes the rates come from.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
}

impl StatsArgs {
    pub fn run(self) -> Result<(), CliError> {
        let StatsArgs { addr, config, data_dir, interval, json, .. } = self;
        if !(interval > 0.0 && interval <= 3600.0) {
            return Err(CliError("--interval must be in (0, 3600] seconds".into()));
        }
        let addr = match (addr, config) {
            (Some(a), _) => a,
            (None, None) if data_dir.is_some() => {
                let dir = data_dir.expect("checked");
                let mut cfg = serve::Config::load(None)?;
                cfg.data_dir = dir.clone();
                let socket = crate::control::socket_of(&cfg).map_err(CliError)?;
                let status = crate::control::request(&socket, &crate::control::Request::Status, &mut |_| {})
                    .map_err(CliError)?;
                match status["metrics"].as_str() {
                    Some(a) => a.to_string(),
                    None => {
                        return Err(CliError(format!(
                            "the server with data directory {} serves no metrics (metrics_listen = \"\")",
                            dir.display()
                        )))
                    }
                }
            }
            (None, Some(path)) => {
                let cfg = serve::Config::load(Some(&path))?;
                if cfg.metrics_listen.is_empty() {
                    return Err(CliError(format!(
                        "{}: metrics_listen is \"\": the server serves no metrics to read",
                        path.display()
                    )));
                }
                cfg.metrics_listen
            }
            (None, None) => "127.0.0.1:10810".into(),
        };
        let a = metrics::scrape(&addr).map_err(CliError)?;
        let t = Instant::now();
        std::thread::sleep(std::time::Duration::from_secs_f64(interval));
        let b = metrics::scrape(&addr).map_err(CliError)?;
        let s = metrics::stats(&a, &b, t.elapsed().as_secs_f64());
        if json {
            println!("{}", serde_json::to_string_pretty(&s)?);
        } else {
            metrics::print_table(&s);
        }
        Ok(())
    }
}
