//! `sluice serve`: engine volumes over NBD.
//!
//! Startup steps, in order: read the config (TOML, every key optional) →
//! check every value (`preflight`) and bind the TCP listeners, so that a
//! refused start writes nothing → create and lock the data directory →
//! bind the Unix socket in it → open the cache and capacity devices (files,
//! raw block devices or memory) → reopen the engine from its superblock, or
//! create it on blank devices → serve until SIGTERM or SIGINT. Shutdown steps: stop
//! accepting, finish in-flight requests and flush (the server does that), then
//! checkpoint the engine and mark it clean, so the next start reopens fast.
//!
//! The signal mask is set before any thread starts, and the main thread waits
//! in `sigwait`: no handler runs on an arbitrary thread.
//!
//! Layout: `config.rs` is the configuration (file sections, defaults, flags);
//! `devices.rs` opens the devices and the engine on them (and `format`,
//! `clean`, `check`); this file runs the server: access rules, reload on
//! SIGHUP, systemd notification, the pidfile, and the start and stop.

use crate::metrics::NbdCounters;
use crate::recorder::{TraceSlot, TraceTarget, TracedVolume};
use serde::{Deserialize, Serialize};
use sluice_engine::persist::Superblock;
use sluice_engine::{CompactorConfig, Engine, EngineConfig, EngineError, Volume, VolumeSpec};
use sluice_frontend::access::ExportAccess;
use sluice_frontend::{raise_open_files_limit, Listener, Server, ServerMonitor, ServerOptions, FDS_PER_CONNECTION};
use sluice_media::ssd::{ssd_device, SsdProfile};
use sluice_media::{
    hdd_device, scm_device, zns_device, BlockDevice, CacheMode, ClockRef, FileDevice, FileOptions, MemoryDevice,
    RealClock, ScmProfile, StripedDevice, ZnsProfile,
};
use sluice_workload::parse_bytes;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod config;
mod devices;
pub use config::*;
pub use devices::*;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("config {path}: {msg}")]
    Config { path: String, msg: String },
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    /// A device file could not be opened (its path and the file's error).
    #[error("opening the {which} device{}: {source}", if *.read_only { " read-only" } else { "" })]
    DeviceOpen { which: &'static str, read_only: bool, source: sluice_media::FileError },
    /// A device request failed (what was being done, the device's error).
    #[error("{what}: {source}")]
    DeviceIo { what: String, source: sluice_media::DeviceError },
    #[error("the {which} device {} does not exist", path.display())]
    DeviceMissing { which: &'static str, path: PathBuf },
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("server: {0}")]
    Server(#[from] sluice_frontend::ServerError),
    #[error("encoding the report: {0}")]
    Report(#[from] serde_json::Error),
    #[error(
        "data directory {} is in use by another sluice process (PID {holder}); stop it first, or give this one another data_dir",
        dir.display()
    )]
    Locked { dir: PathBuf, holder: String },
    #[error(
        "the config differs from the engine on the devices; nothing was changed:\n  {}",
        .0.join("\n  ")
    )]
    ConfigDiffers(Vec<String>),
    #[error("refusing to format; `sluice format --force` destroys what is there:\n  {}", .0.join("\n  "))]
    FormatRefused(Vec<String>),
    #[error(
        "the {which} device {path} existed before this start and holds no Sluice engine: \
         `sluice format` creates one on it (destroying what it holds)"
    )]
    NotFresh { which: &'static str, path: String },
}

/// Block SIGINT, SIGTERM and SIGHUP in this thread (and every thread it
/// starts): the main thread takes them with `sigwait`. Through `libc`, the
/// one raw system call left outside the media crate: rustix covers signal
/// masks only in its unsafe runtime module.
fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` is initialised; `sig` is a valid out pointer.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}

/// Every volume's cache policy and classes and the cleaning policy, parsed
/// and checked against the config's layout (nothing opened).
struct Policies {
    in_place: bool,
    /// `[engine] direct_write`, in bytes (0: never).
    direct_write: u64,
    cleaning: sluice_engine::Cleaning,
    volumes: Vec<(String, sluice_engine::CachePolicy, Vec<sluice_engine::IoClass>)>,
}

fn policies(cfg: &Config) -> Result<Policies, ServeError> {
    let in_place = cfg.layout()? == sluice_engine::Layout::InPlace;
    let cleaning = cfg.cleaning()?;
    let direct_write = match cfg.engine.direct_write.as_str() {
        "" | "0" => 0,
        s => devices::size_of("engine.direct_write", s)?,
    };
    if !in_place && cleaning.mode != sluice_engine::CleaningMode::None {
        return Err(ServeError::Config {
            path: "engine.cleaning".into(),
            msg: "cleaning policies apply to an in-place engine ([engine] layout = \"in-place\")".into(),
        });
    }
    let mut volumes = Vec::new();
    for v in &cfg.volumes {
        let policy = v.cache_policy()?;
        let classes = v.class.iter().map(|c| c.to_class(&v.name)).collect::<Result<Vec<_>, _>>()?;
        if !in_place && (policy != sluice_engine::CachePolicy::default() || !classes.is_empty()) {
            return Err(ServeError::Config {
                path: format!("volume {}", v.name),
                msg: "mode, seq_cutoff, promote_after and classes apply to an in-place engine ([engine] layout = \"in-place\")"
                    .into(),
            });
        }
        sluice_engine::engine::check_io_classes(&classes)
            .map_err(|e| ServeError::Config { path: format!("volume {}", v.name), msg: e.to_string() })?;
        volumes.push((v.name.clone(), policy, classes));
    }
    Ok(Policies { in_place, direct_write, cleaning, volumes })
}

/// Set the engine's cleaning and every volume's cache policy and I/O
/// classes from `p` (parsed and checked before, so a bad config changes
/// nothing; every volume checked to exist first).
fn apply_parsed(p: &Policies, engine: &Arc<Engine>) -> Result<(), ServeError> {
    for (name, _, _) in &p.volumes {
        engine.volume(name)?;
    }
    engine.set_direct_write_bytes(p.direct_write);
    if !p.in_place {
        return Ok(());
    }
    engine.set_cleaning(p.cleaning)?;
    for (name, policy, classes) in &p.volumes {
        engine.set_cache_policy(name, *policy)?;
        engine.set_io_classes(name, classes.clone())?;
    }
    Ok(())
}

/// What a reload cannot change, by section, as text to compare: everything
/// but `[engine] cleaning*`, `direct_write` and the volumes' policies and classes.
fn fixed_settings(c: &Config) -> Vec<(&'static str, String)> {
    let e = &c.engine;
    let engine = format!(
        "{:?}",
        (
            &e.chunk_size,
            &e.band_size,
            &e.write_unit,
            &e.background_compaction,
            &e.compaction_start,
            &e.compaction_setpoint
        )
    ) + &format!("{:?}", (&e.l2p_dram, &e.layout));
    let volumes: Vec<_> =
        c.volumes.iter().map(|v| (&v.name, &v.size, v.read_only, &v.allow, &v.allow_read_only)).collect();
    vec![
        ("data_dir", format!("{:?}", c.data_dir)),
        ("listen / unix_socket / metrics_listen", format!("{:?}", (&c.listen, &c.unix_socket, &c.metrics_listen))),
        ("[cache]", format!("{:?}", c.cache)),
        ("[capacity]", format!("{:?}", c.capacity)),
        ("[engine]", engine),
        ("[server]", format!("{:?}", c.server)),
        ("[tls]", format!("{:?}", c.tls)),
        ("volume names, sizes and access", format!("{volumes:?}")),
    ]
}

/// Each volume's access rules for the server. Allow-lists match names of
/// client certificates, which only mutual TLS provides: lists without
/// `[tls] client_ca` (or with TLS not required, so a plaintext client
/// could bypass them) are refused.
fn export_access(cfg: &Config) -> Result<HashMap<String, ExportAccess>, ServeError> {
    let mut out = HashMap::new();
    for v in &cfg.volumes {
        let listed = !v.allow.is_empty() || !v.allow_read_only.is_empty();
        if listed && (cfg.tls.client_ca.is_empty() || cfg.tls.mode != "require") {
            let msg = "allow / allow_read_only need [tls] mode = \"require\" and client_ca (names come from verified client certificates)";
            return Err(ServeError::Config { path: format!("volume {:?}", v.name), msg: msg.into() });
        }
        if listed || v.read_only {
            let access = ExportAccess {
                read_only: v.read_only,
                allow: v.allow.clone(),
                allow_read_only: v.allow_read_only.clone(),
            };
            out.insert(v.name.clone(), access);
        }
    }
    Ok(out)
}

/// `--pidfile`: the process id, written whole (a temporary file renamed
/// over the path) once the server serves; removed when dropped.
struct Pidfile(PathBuf);

impl Pidfile {
    fn write(path: &Path) -> Result<Pidfile, ServeError> {
        let io = |source| ServeError::Io { what: format!("pidfile {}", path.display()), source };
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, format!("{}\n", std::process::id())).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)?;
        Ok(Pidfile(path.to_owned()))
    }
}

impl Drop for Pidfile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Tells systemd (a `Type=notify` unit: `$NOTIFY_SOCKET` is set) the
/// server's state, e.g. `READY=1` once every listener accepts. Without
/// systemd it does nothing; a failure is reported, never fatal.
fn notify_systemd(state: &str) {
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let sent = (|| -> std::io::Result<()> {
        let sock = UnixDatagram::unbound()?;
        let bytes = path.as_encoded_bytes();
        // A leading '@' names a socket in the abstract namespace.
        let addr = match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name)?
            }
            None => SocketAddr::from_pathname(&path)?,
        };
        sock.send_to_addr(state.as_bytes(), &addr)?;
        Ok(())
    })();
    if let Err(e) = sent {
        eprintln!("sluice: warning: telling systemd {state:?} through NOTIFY_SOCKET failed: {e}");
    }
}

/// SIGHUP: read the config file again and apply what can change while the
/// engine runs — cleaning, each volume's cache policy and I/O classes (the
/// directory-class refresher restarts) — or, if anything else differs or
/// it does not parse, change nothing and say why. If every volume of an
/// in-place engine is pass-through afterwards, clean every dirty block
/// home: a live detach (the disk alone then holds every volume).
/// What a reload may change, as text per setting: `[engine] cleaning*`,
/// `direct_write` and every volume's other keys (mode, cutoff, promotion, retention,
/// classes, trace), so a reload says what it changed.
fn policy_view(cfg: &Config) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let text = |v: &serde_json::Value| v.to_string();
    if let Ok(serde_json::Value::Object(e)) = serde_json::to_value(&cfg.engine) {
        for (k, v) in e.iter().filter(|(k, _)| k.starts_with("cleaning") || *k == "direct_write") {
            out.insert(format!("engine.{k}"), text(v));
        }
    }
    for vol in &cfg.volumes {
        if let Ok(serde_json::Value::Object(m)) = serde_json::to_value(vol) {
            for (k, v) in m.iter().filter(|(k, _)| *k != "name") {
                out.insert(format!("volume {}: {k}", vol.name), text(v));
            }
        }
    }
    out
}

/// The changes from `old` to `new` (`policy_view`), one per setting.
fn policy_changes(
    old: &std::collections::BTreeMap<String, String>,
    new: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    let shown = |v: Option<&String>| v.cloned().unwrap_or_else(|| "(unset)".into());
    (keys.into_iter())
        .filter(|k| old.get(*k) != new.get(*k))
        .map(|k| format!("{k} {} -> {}", shown(old.get(k)), shown(new.get(k))))
        .collect()
}

/// SIGHUP: apply the config's reloadable settings (`policy_view`), after
/// checking that nothing else changed; `applied` is what the last start or
/// reload applied, and becomes this one's.
fn reload(
    path: Option<&Path>,
    flags: &Overrides,
    running: &Config,
    applied: &mut std::collections::BTreeMap<String, String>,
    engine: &Arc<Engine>,
    classifier: &mut Option<crate::directories::DirectoryClasses>,
    traces: &[Arc<TraceSlot>],
) -> Result<Policies, ServeError> {
    let cfg = flags.apply(Config::load(path)?)?;
    let targets = cfg.trace_targets()?;
    let fixed = fixed_settings(&cfg);
    let differ: Vec<&str> =
        (fixed.iter().zip(fixed_settings(running))).filter(|(a, b)| a.1 != b.1).map(|(a, _)| a.0).collect();
    if !differ.is_empty() {
        return Err(ServeError::Config {
            path: path.map_or("(defaults)".into(), |p| p.display().to_string()),
            msg: format!(
                "{} changed: only [engine] cleaning*, and each volume's policy and classes, change on reload; restart for the rest",
                differ.join(", ")
            ),
        });
    }
    let parsed = policies(&cfg)?;
    apply_parsed(&parsed, engine)?;
    for (slot, (name, target)) in traces.iter().zip(targets) {
        if let Err(e) = slot.set(target) {
            eprintln!("sluice: volume {name}: cannot record its trace: {e}");
        }
    }
    drop(classifier.take());
    *classifier = crate::directories::DirectoryClasses::start(&cfg, engine)?;
    let view = policy_view(&cfg);
    let changes = policy_changes(applied, &view);
    *applied = view;
    match changes.is_empty() {
        true => eprintln!("sluice: reloaded the config: nothing changed"),
        false => eprintln!("sluice: reloaded the config: {}", changes.join("; ")),
    }
    let report = engine.cache_report();
    if !report.is_empty() && report.iter().all(|r| r.policy.mode == sluice_engine::CacheMode::PassThrough) {
        let bytes = engine.clean(false)?;
        eprintln!(
            "sluice: detached: every volume is pass-through and {} MiB of dirty data went home; the disk alone holds every volume",
            bytes >> 20
        );
    }
    Ok(parsed)
}

/// Each volume's cache mode as `p` gives it (what `sluice cache attach`
/// restores).
fn configured_modes(p: &Policies) -> Vec<(String, sluice_engine::CacheMode)> {
    p.volumes.iter().map(|(name, policy, _)| (name.clone(), policy.mode)).collect()
}

/// A path removed when this goes out of scope (the control socket, at stop).
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Descriptors kept for everything but connections: devices, listeners,
/// trace files, the metrics endpoint (docs/serve.md, `connections_max`).
const FDS_RESERVED: u64 = 256;

/// What to say when the open-file limit (`got`, after raising it as far as
/// this process may) cannot hold `connections_max` on each of `listeners`.
fn open_files_advice(got: u64, connections_max: u64, listeners: u64) -> String {
    let wanted = connections_max * FDS_PER_CONNECTION * listeners + FDS_RESERVED;
    let fit = got.saturating_sub(FDS_RESERVED) / FDS_PER_CONNECTION;
    format!(
        "the open-file limit is {got} and this process may not raise it further; [server] connections_max = \
         {connections_max} on {listeners} listener(s) needs {connections_max} x {listeners} + {FDS_RESERVED} = \
         {wanted} descriptors, so about {fit} connections can be open at once (more wait in the listen queue). \
         Raise the hard limit to {wanted} (systemd: LimitNOFILE={wanted}; a shell as root: ulimit -Hn {wanted}) \
         or lower connections_max to {}",
        fit / listeners.max(1)
    )
}

/// Run the server until SIGTERM/SIGINT; prints one line per listener.
/// SIGHUP reloads the cache policies from `path` (`reload`).
/// What `serve` checks of a config before it opens or creates anything:
/// every value parsed (server, access, TLS, compactor, layout, cleaning,
/// policies and classes, traces, device and engine geometry). `sluice serve
/// --print-config` runs it too, so it refuses what a start would.
pub struct Preflight {
    opts: ServerOptions,
    compactor: Option<CompactorConfig>,
    policies: Policies,
}

pub fn preflight(cfg: &Config) -> Result<Preflight, ServeError> {
    let mut opts = ServerOptions {
        connections_max: cfg.server.connections_max,
        workers_max: cfg.server.workers_max,
        inflight_bytes_max: size_of("server.inflight_bytes_max", &cfg.server.inflight_bytes_max)?,
        ..ServerOptions::default()
    };
    opts.access = export_access(cfg)?;
    match cfg.tls.mode.as_str() {
        "" | "off" => {}
        mode @ ("allow" | "require") => {
            if cfg.tls.cert.is_empty() || cfg.tls.key.is_empty() {
                return Err(ServeError::Config {
                    path: "tls".into(),
                    msg: format!("mode {mode:?} needs cert and key"),
                });
            }
            let (cert, key) = (cfg.in_data_dir(&cfg.tls.cert), cfg.in_data_dir(&cfg.tls.key));
            let min = match cfg.tls.min_version.as_str() {
                "" => Default::default(),
                v => v.parse().map_err(|msg| ServeError::Config { path: "tls.min_version".into(), msg })?,
            };
            let client_ca = (!cfg.tls.client_ca.is_empty()).then(|| cfg.in_data_dir(&cfg.tls.client_ca));
            let tls = sluice_frontend::tls::server_config(&cert, &key, min, client_ca.as_deref())
                .map_err(|e| ServeError::Config { path: "tls".into(), msg: e.to_string() })?;
            opts.tls = Some(tls);
            opts.tls_required = mode == "require";
        }
        other => {
            let msg = format!("mode {other:?}: expected \"off\", \"allow\" or \"require\"");
            return Err(ServeError::Config { path: "tls".into(), msg });
        }
    }
    let compactor = cfg.engine.background_compaction.then_some(cfg.compactor(cfg.layout()?));
    if let Some(c) = &compactor {
        c.check().map_err(|e| ServeError::Config { path: "engine".into(), msg: e.to_string() })?;
    }
    let policies = policies(cfg)?;
    cfg.trace_targets()?;
    cfg.check_devices()?;
    Ok(Preflight { opts, compactor, policies })
}

pub fn run(cfg: Config, path: Option<&Path>, flags: &Overrides) -> Result<(), ServeError> {
    let set = block_signals();
    // Every value checked, and every TCP listener bound, before the data
    // directory, a device or the engine is touched: a refused start writes
    // nothing (docs/serve.md).
    let Preflight { opts, compactor: compactor_cfg, policies } = preflight(&cfg)?;
    let listeners = cfg.listen.len() as u64 + u64::from(!cfg.unix_socket.is_empty());
    let fds_wanted = opts.connections_max as u64 * FDS_PER_CONNECTION * listeners + FDS_RESERVED;
    match raise_open_files_limit(fds_wanted) {
        Ok(got) if got >= fds_wanted => {}
        Ok(got) => eprintln!("sluice: warning: {}", open_files_advice(got, opts.connections_max as u64, listeners)),
        Err(e) => eprintln!("sluice: warning: cannot raise the open-file limit: {e}"),
    }
    let mut bound = Vec::new();
    for addr in &cfg.listen {
        bound.push(Listener::bind_tcp(addr.as_str()).map_err(|source| ServeError::Io { what: addr.clone(), source })?);
    }
    let metrics_listener = match cfg.metrics_listen.is_empty() {
        true => None,
        false => Some(
            std::net::TcpListener::bind(&cfg.metrics_listen)
                .map_err(|source| ServeError::Io { what: format!("metrics_listen {}", cfg.metrics_listen), source })?,
        ),
    };
    let read_only = serves_read_only(&cfg);
    let _lock = if read_only { DirLock::take_shared(&cfg.data_dir)? } else { DirLock::take_creating(&cfg.data_dir)? };
    if !cfg.unix_socket.is_empty() {
        let p = cfg.in_data_dir(&cfg.unix_socket);
        match Listener::bind_unix(&p) {
            Ok(l) => bound.push(l),
            Err(e) if read_only && e.raw_os_error() == Some(rustix::io::Errno::ROFS.raw_os_error()) => eprintln!(
                "sluice: warning: no Unix socket at {}: the file system is read-only (TCP listeners only)",
                p.display()
            ),
            Err(source) => return Err(ServeError::Io { what: p.display().to_string(), source }),
        }
    }
    let (engine, how) = if read_only { open_engine_read_only(&cfg)? } else { open_engine(&cfg)? };
    // Nothing in the background writes a read-only engine.
    let compactor_cfg = compactor_cfg.filter(|_| !read_only);
    let started = Started { opts, compactor_cfg, policies, bound, metrics_listener };
    let r = serve_opened(&cfg, path, flags, &set, &engine, how, started);
    if r.is_err() {
        // A start that fails after the open leaves the engine clean (a
        // no-op once it shut down).
        if let Err(e) = engine.shutdown() {
            eprintln!("sluice: after a failed start, shutting the engine down failed too: {e}");
        }
    }
    r
}

/// What `run` prepared before it opened the engine.
struct Started {
    opts: ServerOptions,
    compactor_cfg: Option<CompactorConfig>,
    policies: Policies,
    bound: Vec<Listener>,
    metrics_listener: Option<std::net::TcpListener>,
}

/// Serve the opened engine until a stop signal, then shut it down.
fn serve_opened(
    cfg: &Config,
    path: Option<&Path>,
    flags: &Overrides,
    set: &libc::sigset_t,
    engine: &Arc<Engine>,
    how: Opened,
    started: Started,
) -> Result<(), ServeError> {
    let Started { opts, compactor_cfg, policies, bound, metrics_listener } = started;
    match (how, engine.recovered_in()) {
        (_, Some(t)) => {
            eprintln!("sluice: the last stop was unclean; recovered from the devices in {:.3} s", t.as_secs_f64())
        }
        (Opened::Created, _) => eprintln!("sluice: created a new engine on {}", cfg.devices_text()),
        (Opened::ReadOnly, _) => {
            eprintln!("sluice: opened the engine read-only on {} (nothing is written)", cfg.devices_text())
        }
        (Opened::Attached, _) => eprintln!(
            "sluice: attached a new cache ({}) to the disk {}, which keeps what it holds (not written until cleaning)",
            cfg.device_label("cache"),
            cfg.device_label("capacity")
        ),
        _ => eprintln!("sluice: reopened the engine on {}", cfg.devices_text()),
    }
    if let Some((changed, dropped)) = engine.disk_changed() {
        eprintln!(
            "sluice: the disk changed since the cache last saw it ({} sampled blocks differ); the cache held only \
             clean copies: dropped all {dropped} of them, every read goes to the disk",
            changed.len()
        );
    }
    let targets = cfg.trace_targets()?;
    apply_parsed(&policies, engine)?;
    for line in cfg.device_lines() {
        eprintln!("sluice: {line}");
    }
    let report = engine.cache_report();
    for v in &cfg.volumes {
        let size = engine.volume(&v.name).map(|h| h.size_bytes()).unwrap_or(0);
        let how = match report.iter().find(|r| r.volume == v.name) {
            Some(r) => format!(
                "cached in place, {}",
                serde_json::to_value(r.policy.mode).ok().and_then(|m| m.as_str().map(String::from)).unwrap_or_default()
            ),
            None => "write-shaping log".to_string(),
        };
        eprintln!("sluice: export {:?}: {} MiB, {how}", v.name, size >> 20);
    }
    let compactor = match compactor_cfg {
        Some(c) => Some(engine.start_compactor(c)?),
        None => None,
    };
    let classifier = crate::directories::DirectoryClasses::start(cfg, engine)?;
    let mut exports: Vec<Arc<dyn Volume>> = Vec::new();
    let mut traces = Vec::new();
    for (v, (_, target)) in cfg.volumes.iter().zip(targets) {
        let traced = TracedVolume::new(engine.volume(&v.name)?);
        traced
            .slot()
            .set(target)
            .map_err(|source| ServeError::Io { what: format!("volume {} trace", v.name), source })?;
        traces.push(traced.slot());
        exports.push(Arc::new(traced));
    }
    let server = Server::new(exports, opts)?;
    let mut handles = Vec::new();
    for l in bound {
        handles.push(server.spawn(l)?);
    }
    for h in &handles {
        println!(
            "sluice: serving {} on {}",
            cfg.volumes.iter().map(|v| v.name.as_str()).collect::<Vec<_>>().join(","),
            h.local_addr()
        );
    }
    let mut metrics_addr = None;
    if let Some(l) = metrics_listener {
        let what = || format!("metrics_listen {}", cfg.metrics_listen);
        let addr = l.local_addr().map_err(|source| ServeError::Io { what: what(), source })?;
        metrics_addr = Some(addr.to_string());
        let monitors: Vec<ServerMonitor> = handles.iter().map(|h| h.monitor()).collect();
        let counters = move || {
            let mut c = NbdCounters::default();
            for m in &monitors {
                let s = m.stats();
                c.connections_open += m.connections() as u64;
                c.connections_accepted += s.connections_accepted;
                c.connections_refused += s.connections_refused;
                c.connections_failed += s.connections_failed;
                c.requests += s.requests;
                c.request_errors += s.request_errors;
            }
            c
        };
        crate::metrics::spawn(l, engine.clone(), counters).map_err(|source| ServeError::Io { what: what(), source })?;
        println!("sluice: metrics on http://{addr}/metrics");
    }
    let control = Arc::new(crate::control::Control {
        engine: engine.clone(),
        configured: std::sync::Mutex::new(configured_modes(&policies)),
        devices: cfg.device_lines(),
        metrics: metrics_addr,
        layout: match cfg.layout()? {
            sluice_engine::Layout::InPlace => "in-place",
            _ => "bands",
        }
        .into(),
    });
    let _control_socket = match cfg.control_socket.is_empty() {
        true => None,
        false => {
            let p = cfg.in_data_dir(&cfg.control_socket);
            match crate::control::spawn(&p, control.clone()) {
                Ok(p) => {
                    // After the lines a supervisor reads (listeners, metrics),
                    // which may close its end after them: not worth a panic.
                    use std::io::Write;
                    let _ = writeln!(std::io::stdout(), "sluice: control socket at {} (sluice cache ...)", p.display());
                    Some(RemoveOnDrop(p))
                }
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::ROFS.raw_os_error()) => {
                    eprintln!("sluice: warning: no control socket at {}: the file system is read-only", p.display());
                    None
                }
                Err(source) => return Err(ServeError::Io { what: format!("control_socket {}", p.display()), source }),
            }
        }
    };
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // Removed when `run` returns (a clean stop, or an error after this).
    let _pidfile = match &flags.pidfile {
        Some(p) => Some(Pidfile::write(p)?),
        None => None,
    };
    notify_systemd("READY=1");
    let mut classifier = classifier;
    let mut applied = policy_view(cfg);
    let sig = loop {
        match wait_for_signal(set) {
            libc::SIGHUP => match reload(path, flags, cfg, &mut applied, engine, &mut classifier, &traces) {
                Ok(p) => {
                    *control.configured.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = configured_modes(&p)
                }
                Err(e) => eprintln!("sluice: reload refused, nothing changed: {e}"),
            },
            sig => break sig,
        }
    };
    eprintln!(
        "sluice: signal {sig}: stopping - answering every request the clients sent, then a clean shutdown (a second \
         signal stops at once)"
    );
    // A second SIGINT or SIGTERM ends the process at once: no checkpoint,
    // so the next start recovers from the devices; every write a completed
    // FLUSH or FUA covered is on them already.
    let second = *set;
    std::thread::Builder::new()
        .name("second-signal".into())
        .spawn(move || loop {
            let sig = wait_for_signal(&second);
            if sig != libc::SIGHUP {
                eprintln!(
                    "sluice: signal {sig} again: stopping at once without a clean shutdown (the next start recovers; \
                     every flushed write is kept)"
                );
                std::process::exit(1);
            }
        })
        .map_err(|source| ServeError::Io { what: "starting the second-signal thread".into(), source })?;
    notify_systemd("STOPPING=1");
    for h in handles {
        h.shutdown()?;
    }
    for t in &traces {
        t.flush();
    }
    drop(classifier);
    drop(compactor);
    engine.shutdown()?;
    eprintln!("sluice: clean shutdown");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The open-file warning explains its number and says what to do.
    #[test]
    fn the_open_file_warning_explains_its_number_and_the_fix() {
        let a = open_files_advice(20_000, 16_384, 2);
        assert!(a.contains("16384 x 2 + 256 = 33024"), "{a}");
        assert!(a.contains("LimitNOFILE=33024") && a.contains("ulimit -Hn 33024"), "{a}");
        assert!(a.contains("about 19744 connections") && a.contains("lower connections_max to 9872"), "{a}");
    }

    #[test]
    fn device_paths_do_not_depend_on_which_keys_a_table_has() {
        let default = Config::default();
        let sized: Config = toml::from_str("[cache]\nsize = \"1g\"\n[capacity]\nsize = \"8g\"\n").unwrap();
        for which in ["cache", "capacity"] {
            assert_eq!(default.device_label(which), sized.device_label(which), "{which}");
        }
        assert!(sized.device_label("cache").ends_with("sluice-data/cache.img"));
    }

    /// `[engine] layout = "in-place"` creates an engine whose volume is at
    /// home on the capacity device; volumes' cache settings parse into a
    /// policy, a bad one is refused, and a config whose layout differs
    /// from the engine's is reported before anything is opened.
    #[test]
    fn an_in_place_layout_and_cache_settings_are_configured() {
        let text = "[engine]\nlayout = \"in-place\"\nchunk_size = \"1m\"\n\n[[volume]]\nname = \"v\"\nsize = \"64m\"\nmode = \"wt\"\nseq_cutoff_size = \"256k\"\npromote_after = 2\nretain_hot = false\nspill = false\n";
        let cfg: Config = toml::from_str(text).unwrap();
        let p = cfg.volumes[0].cache_policy().unwrap();
        assert_eq!(
            (p.mode, p.seq_cutoff_bytes, p.promote_after_misses, p.retain_hot, p.spill),
            (sluice_engine::CacheMode::WriteThrough, 256 << 10, 2, false, false)
        );
        assert!(sluice_engine::CachePolicy::default().spill, "spill is on unless the volume says");
        let cache: Arc<dyn BlockDevice> = Arc::new(sluice_media::MemoryDevice::new(16 << 20, 4096));
        let capacity: Arc<dyn BlockDevice> = Arc::new(sluice_media::MemoryDevice::new(80 << 20, 4096));
        let engine = cfg.create_engine(cache.clone(), capacity.clone()).unwrap();
        assert_eq!(engine.home_offset("v"), Some(0));
        let sb = Engine::inspect(&*cache, &*capacity).unwrap();
        assert!(cfg.differences(&sb, false).unwrap().is_empty());
        let bands: Config = toml::from_str(&text.replace("layout = \"in-place\"\n", "")).unwrap();
        let diff = bands.differences(&sb, false).unwrap();
        assert!(diff.len() == 1 && diff[0].starts_with("engine.layout"), "{diff:?}");
        let bad: Config = toml::from_str(&text.replace("\"wt\"", "\"fast\"")).unwrap();
        assert!(matches!(bad.volumes[0].cache_policy(), Err(ServeError::Config { .. })));
        let bad: Config = toml::from_str(&text.replace("in-place", "sideways")).unwrap();
        assert!(matches!(bad.layout(), Err(ServeError::Config { .. })));
        let alru: Config = toml::from_str(&text.replace(
            "[engine]\n",
            "[engine]\ncleaning = \"alru\"\ncleaning_age = \"2.5s\"\ncleaning_idle = \"0s\"\ncleaning_response = \"40s\"\n",
        ))
        .unwrap();
        let c = alru.cleaning().unwrap();
        let s = std::time::Duration::from_secs;
        assert_eq!(
            (c.mode, c.age, c.idle, c.response),
            (sluice_engine::CleaningMode::Alru, std::time::Duration::from_millis(2500), s(0), s(40))
        );
        engine.set_cleaning(c).unwrap();
        for wrong in ["cleaning_response = \"0s\"", "cleaning_idle = \"-1s\"", "cleaning_setpoint = 1.5"] {
            let bad: Config = toml::from_str(&text.replace("[engine]\n", &format!("[engine]\n{wrong}\n"))).unwrap();
            assert!(matches!(bad.cleaning(), Err(ServeError::Config { .. })), "{wrong}");
        }
        let bad: Config = toml::from_str(&text.replace("[engine]\n", "[engine]\ncleaning = \"eager\"\n")).unwrap();
        assert!(matches!(bad.cleaning(), Err(ServeError::Config { .. })));
        // Emulated HDDs, striped.
        let hdds: Config = toml::from_str(
            "[capacity]\nkind = \"memory\"\nsize = \"64m\"\nemulate = \"hdd\"\ndisks = 4\n[[volume]]\nname = \"v\"\nsize = \"32m\"\n",
        )
        .unwrap();
        let d = hdds.open_device("capacity", &hdds.capacity).unwrap().dev;
        assert!(d.info().name.starts_with("4x") && d.info().capacity_bytes == 64 << 20, "{:?}", d.info());
        let bad: Config = toml::from_str(
            "[capacity]\nkind = \"file\"\nsize = \"64m\"\nemulate = \"hdd\"\ndisks = 2\n[[volume]]\nname = \"v\"\nsize = \"32m\"\n",
        )
        .unwrap();
        assert!(matches!(bad.open_device("capacity", &bad.capacity), Err(ServeError::Config { .. })));
        // I/O classes.
        let classes = format!(
            "{text}[[volume.class]]\nname = \"bulk\"\nstart = \"32m\"\nshare = 0.0\n\
             [[volume.class]]\nname = \"small\"\nsize_max = \"64k\"\ndirection = \"write\"\nshare = 0.5\n\
             pinned = true\npriority = 3\n"
        );
        let cfg: Config = toml::from_str(&classes).unwrap();
        let got: Vec<sluice_engine::IoClass> = cfg.volumes[0].class.iter().map(|c| c.to_class("v").unwrap()).collect();
        assert_eq!(got[0].range, Some((32 << 20, u64::MAX)));
        assert_eq!((got[1].size_max, got[1].direction), (64 << 10, Some(sluice_engine::ClassDirection::Write)));
        assert_eq!((got[0].pinned, got[1].pinned, got[1].priority), (false, true, 3));
        engine.set_io_classes("v", got).unwrap();
        let bad: Config = toml::from_str(&classes.replace("\"write\"", "\"sideways\"")).unwrap();
        assert!(matches!(bad.volumes[0].class[1].to_class("v"), Err(ServeError::Config { .. })));
    }

    /// `[engine] l2p_dram` pages the maps of an engine created with it, and
    /// a size that does not parse is refused before anything is written.
    #[test]
    fn an_l2p_budget_pages_the_maps_and_a_bad_one_is_refused() {
        let text = "[engine]\nl2p_dram = \"64k\"\nchunk_size = \"1m\"\nband_size = \"4m\"\n\n[[volume]]\nname = \"v\"\nsize = \"1g\"\n";
        let cfg: Config = toml::from_str(text).unwrap();
        let cache: Arc<dyn BlockDevice> = Arc::new(sluice_media::MemoryDevice::new(64 << 20, 4096));
        let capacity: Arc<dyn BlockDevice> = Arc::new(sluice_media::MemoryDevice::new(2 << 30, 4096));
        let engine = cfg.create_engine(cache, capacity).unwrap();
        let s = engine.l2p_stats();
        assert!(s.paged && s.dram_bytes < 1 << 20, "{s:?}");
        let bad: Config = toml::from_str(&text.replace("64k", "lots")).unwrap();
        let cache: Arc<dyn BlockDevice> = Arc::new(sluice_media::MemoryDevice::new(64 << 20, 4096));
        let capacity: Arc<dyn BlockDevice> = Arc::new(sluice_media::MemoryDevice::new(2 << 30, 4096));
        assert!(bad.create_engine(cache.clone(), capacity).is_err());
        assert!(sluice_engine::engine::superblock_present(&*cache).unwrap().is_none(), "nothing written");
    }

    /// `[engine] direct_write` sets the size from which writes go to the
    /// capacity device directly ("0", the default, never), applied
    /// with the other policies; a size that does not parse is refused.
    #[test]
    fn direct_writes_are_configured_and_a_bad_size_is_refused() {
        let text = "[engine]\nchunk_size = \"1m\"\nband_size = \"4m\"\ndirect_write = \"64k\"\n\n[[volume]]\nname = \"v\"\nsize = \"64m\"\n";
        for (value, bytes) in [("64k", 64 << 10), ("0", 0), ("1m", 1 << 20)] {
            let cfg: Config = toml::from_str(&text.replace("64k", value)).unwrap();
            let cache: Arc<dyn BlockDevice> = Arc::new(sluice_media::MemoryDevice::new(16 << 20, 4096));
            let capacity: Arc<dyn BlockDevice> = Arc::new(sluice_media::MemoryDevice::new(128 << 20, 4096));
            let engine = cfg.create_engine(cache, capacity).unwrap();
            assert_eq!(engine.direct_write_bytes(), sluice_engine::DIRECT_WRITE_BYTES_DEFAULT, "before the policies");
            apply_parsed(&policies(&cfg).unwrap(), &engine).unwrap();
            assert_eq!(engine.direct_write_bytes(), bytes, "{value}");
        }
        let bad: Config = toml::from_str(&text.replace("64k", "lots")).unwrap();
        let e = policies(&bad).err().expect("refused");
        assert!(e.to_string().contains("engine.direct_write"), "{e}");
    }

    #[test]
    fn every_example_config_parses_and_its_sizes_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let cfg = Config::load(Some(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                for d in [&cfg.cache, &cfg.capacity] {
                    size_of("size", &d.size).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                }
                n += 1;
            }
        }
        assert!(n >= 6, "examples found: {n}");
    }
}
