//! `sluice advise`: the cache advisor over a recorded trace (its policy
//! taken from a config or the flags; the work is the sluice-advise crate's).

use crate::{serve, write_json, CliError};
use sluice_workload::parse_bytes;
use std::path::PathBuf;

/// `sluice advise`'s arguments (the command's help is on `Cmd::Advise`).
#[derive(clap::Args)]
pub struct AdviseArgs {
    /// The CSV trace (timestamp_us,op,offset,size).
    #[arg(long)]
    trace: PathBuf,
    /// The device behind the cache: hdd, qlc or tlc.
    #[arg(long, default_value = "hdd")]
    capacity: String,
    /// Cache sizes to replay, comma-separated (fio size syntax; each
    /// 64m or more); default 1/8 to 3 times the peak of live data.
    #[arg(long)]
    sizes: Option<String>,
    /// The volume's size (default: the trace header's, else its highest
    /// byte rounded up to 1 GiB).
    #[arg(long)]
    volume_size: Option<String>,
    /// Take the volume's cache policy from this `sluice serve` config
    /// (the volume named by --volume, else by the trace's header).
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    volume: Option<String>,
    /// Cache policy keys as in `[[volume]]`, over the config's (or the
    /// defaults: wb, always, 1m, 1).
    #[arg(long)]
    mode: Option<String>,
    #[arg(long)]
    seq_cutoff: Option<String>,
    #[arg(long)]
    seq_cutoff_size: Option<String>,
    #[arg(long)]
    promote_after: Option<u32>,
    /// The cache device the endurance projection assumes (default: the
    /// recommended size).
    #[arg(long)]
    cache_device_size: Option<String>,
    /// Where to write the JSON.
    #[arg(long, default_value = "target/bench/advise.json")]
    json: PathBuf,
}

impl AdviseArgs {
    pub fn run(self) -> Result<(), CliError> {
        let AdviseArgs {
            trace,
            capacity,
            sizes,
            volume_size,
            config,
            volume,
            mode,
            seq_cutoff,
            seq_cutoff_size,
            promote_after,
            cache_device_size,
            json,
            ..
        } = self;
        use sluice_advise as advise;
        let size = |what: &str, v: &str| parse_bytes(v).map_err(|e| CliError(format!("{what} {v:?}: {e}")));
        let engine_err = |e: sluice_engine::EngineError| CliError(e.to_string());
        let mut policy = sluice_engine::CachePolicy::default();
        if let Some(path) = &config {
            let cfg = serve::Config::load(Some(path))?;
            let name = volume
                .or_else(|| advise::trace_header(&trace).map(|h| h.0))
                .ok_or_else(|| CliError("--config needs --volume (the trace has no sluice header naming it)".into()))?;
            let v = cfg
                .volumes
                .iter()
                .find(|v| v.name == name)
                .ok_or_else(|| CliError(format!("{}: no volume {name:?}", path.display())))?;
            policy = v.cache_policy()?;
        }
        if let Some(m) = mode {
            policy.mode = m.parse().map_err(engine_err)?;
        }
        if let Some(c) = seq_cutoff {
            policy.seq_cutoff = c.parse().map_err(engine_err)?;
        }
        if let Some(b) = seq_cutoff_size {
            policy.seq_cutoff_bytes = size("--seq-cutoff-size", &b)?;
        }
        if let Some(n) = promote_after {
            policy.promote_after_misses = n;
        }
        let opts = advise::AdviseOpts {
            capacity: capacity.parse().map_err(CliError)?,
            sizes: match sizes {
                Some(list) => Some(list.split(',').map(|v| size("--sizes", v.trim())).collect::<Result<_, _>>()?),
                None => None,
            },
            volume_bytes: volume_size.as_deref().map(|v| size("--volume-size", v)).transpose()?,
            policy,
            cache_device_bytes: cache_device_size.as_deref().map(|v| size("--cache-device-size", v)).transpose()?,
            ..Default::default()
        };
        let a = advise::advise(&trace, &opts)?;
        print!("{}", advise::report(&a));
        write_json(&json, &a)?;
        println!("JSON: {}", json.display());
        Ok(())
    }
}
