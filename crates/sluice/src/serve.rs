//! `sluice serve`: engine volumes over NBD.
//!
//! Startup steps, in order: read the config (TOML, every key optional) →
//! create the data directory → open the cache and capacity devices (files,
//! raw block devices or memory) → reopen the engine from its superblock, or
//! create it on blank devices → bind the listeners (TCP and a Unix socket in
//! the data directory) → serve until SIGTERM or SIGINT. Shutdown steps: stop
//! accepting, finish in-flight requests and flush (the server does that), then
//! checkpoint the engine and mark it clean, so the next start reopens fast.
//!
//! The signal mask is set before any thread starts, and the main thread waits
//! in `sigwait`: no handler runs on an arbitrary thread.

use crate::metrics::NbdCounters;
use crate::recorder::{TraceSlot, TraceTarget, TracedVolume};
use serde::{Deserialize, Serialize};
use sluice_engine::persist::Superblock;
use sluice_engine::{CompactorConfig, Engine, EngineConfig, EngineError, Volume, VolumeSpec};
use sluice_frontend::access::ExportAccess;
use sluice_frontend::{raise_open_files_limit, Listener, Server, ServerMonitor, ServerOptions, FDS_PER_CONNECTION};
use sluice_media::ssd::{ssd_device, SsdProfile};
use sluice_media::{
    hdd_device, scm_device, zns_device, BlockDevice, CacheMode, ClockRef, FileDevice, FileOptions, HddProfile,
    MemoryDevice, RealClock, ScmProfile, StripedDevice, ZnsProfile,
};
use sluice_workload::parse_bytes;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `sluice serve` flags that override the config file, as qemu-nbd's and
/// nbdkit's do; applied again to the file on every SIGHUP reload, so a
/// reload sees the same effective config.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Overrides {
    /// Listen on this TCP address instead of the config's `listen` (repeat
    /// for several).
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<String>,
    /// Unix socket instead of the config's `unix_socket` ("" for none).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<String>,
    /// Data directory instead of the config's `data_dir`.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The export's name, for a config with one volume.
    #[arg(long, value_name = "NAME")]
    pub export: Option<String>,
    /// Serve every export read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Write the server's process id here once it serves; removed on a
    /// clean stop.
    #[arg(long, value_name = "FILE")]
    pub pidfile: Option<PathBuf>,
}

impl Overrides {
    /// The config with these flags applied.
    pub fn apply(&self, mut cfg: Config) -> Result<Config, ServeError> {
        if !self.listen.is_empty() {
            cfg.listen = self.listen.clone();
        }
        if let Some(s) = &self.socket {
            cfg.unix_socket = s.clone();
        }
        if let Some(d) = &self.data_dir {
            cfg.data_dir = d.clone();
        }
        if let Some(name) = &self.export {
            let [v] = cfg.volumes.as_mut_slice() else {
                let msg = format!("--export names the one volume; the config has {}", cfg.volumes.len());
                return Err(ServeError::Config { path: "--export".into(), msg });
            };
            v.name = name.clone();
        }
        if self.read_only {
            cfg.volumes.iter_mut().for_each(|v| v.read_only = true);
        }
        Ok(cfg)
    }
}

/// The whole config file; docs/serve.md documents every key.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub data_dir: PathBuf,
    /// TCP addresses to listen on.
    pub listen: Vec<String>,
    /// Unix socket path (relative paths are inside `data_dir`); "" for none.
    pub unix_socket: String,
    /// Address of the Prometheus metrics endpoint (`GET /metrics`); "" for none.
    pub metrics_listen: String,
    pub cache: DeviceConfig,
    pub capacity: DeviceConfig,
    pub engine: EngineSection,
    pub server: ServerSection,
    pub tls: TlsSection,
    #[serde(rename = "volume")]
    pub volumes: Vec<VolumeConfig>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// "file" (a regular file, created if missing, or a raw block device) or "memory".
    #[serde(default = "default_kind")]
    pub kind: String,
    /// Path for kind = "file"; relative paths are inside `data_dir`. Empty
    /// or absent: `cache.img` / `capacity.img`, whatever else the table says.
    #[serde(default)]
    pub path: String,
    /// Size (fio syntax, e.g. "8g"); ignored for block devices.
    pub size: String,
    /// Emulated medium in front of the storage, timed in real time so the
    /// server feels it: "" (none), "scm", "qlc", "tlc", or "zns" (memory
    /// only: the emulator's zone write pointers do not survive a restart).
    #[serde(default)]
    pub emulate: String,
    /// emulate = "hdd", kind = "memory" only: this many emulated disks,
    /// striped in 1 MiB units (0 or 1: one disk).
    #[serde(default)]
    pub disks: usize,
    /// kind = "memory" only: allocate and touch all of it at start, so writes
    /// never wait for the kernel to fault in fresh pages (benchmarks).
    #[serde(default)]
    pub prealloc: bool,
}

fn default_kind() -> String {
    "file".into()
}

impl DeviceConfig {
    /// The file's path as configured (relative to `data_dir` unless absolute).
    pub fn file_path(&self, which: &str) -> String {
        if self.path.is_empty() {
            format!("{which}.img")
        } else {
            self.path.clone()
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSection {
    pub chunk_size: String,
    pub band_size: String,
    pub write_unit: String,
    /// Compact in a background thread, pacing writes to it (docs/engine.md).
    pub background_compaction: bool,
    /// Share of the log's chunks below which the background compactor works
    /// (default 0.5 with bands; 0.1 in place, where reclaiming cleans and
    /// evicts data that should stay cached until it dies).
    pub compaction_start: Option<f64>,
    /// Share of free chunks below which writes are paced to compaction
    /// (default 0.25 with bands, 0.05 in place).
    pub compaction_setpoint: Option<f64>,
    /// DRAM the L2P may take, fio size syntax ("" or "0": no limit). Set
    /// when the engine is created: beyond it the map is paged through a
    /// region at the end of the cache device (docs/engine.md).
    pub l2p_dram: String,
    /// "bands" (default: write shaping for QLC/ZNS) or "in-place" (caching
    /// over a plain disk: each volume block at its own LBA, volume after
    /// volume from byte 0). Set when the engine is created (docs/caching.md).
    pub layout: String,
    /// In-place engines: background cleaning, "none" (default), "alru" or
    /// "acp"; ALRU's dirty set point (share of the cache), age, idle time
    /// and the set-point controller's response time.
    pub cleaning: String,
    pub cleaning_setpoint: f64,
    pub cleaning_age: String,
    pub cleaning_idle: String,
    pub cleaning_response: String,
}

/// `[server]`: bounds of the NBD server (per listener).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// Connections served at once on each listener; more are closed at once.
    pub connections_max: usize,
    /// Threads executing requests for all connections; they start on
    /// demand and leave when idle.
    pub workers_max: usize,
    /// Request and read-buffer bytes one connection may hold (fio size syntax).
    pub inflight_bytes_max: String,
}

impl Default for ServerSection {
    fn default() -> ServerSection {
        let d = ServerOptions::default();
        ServerSection {
            connections_max: d.connections_max,
            workers_max: d.workers_max,
            inflight_bytes_max: format!("{}m", d.inflight_bytes_max >> 20),
        }
    }
}

/// `[tls]`: NBD over TLS 1.3 or 1.2 (STARTTLS).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSection {
    /// "off" (default): no TLS; "allow": clients may STARTTLS; "require":
    /// clients must (plaintext option haggling is refused).
    pub mode: String,
    /// PEM certificate chain (server first); relative to `data_dir`.
    pub cert: String,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1); relative to `data_dir`.
    pub key: String,
    /// The oldest protocol version accepted: "1.2" (default) or "1.3".
    pub min_version: String,
    /// PEM CA certificate(s): clients must present a certificate it issued
    /// (mutual TLS); its names are what `[[volume]] allow` lists match.
    pub client_ca: String,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeConfig {
    pub name: String,
    pub size: String,
    /// In-place engines: the cache mode (wb, wt, wa, wi, pt; default wb).
    #[serde(default)]
    pub mode: String,
    /// In-place engines: sequential cutoff policy (always, full, never) and
    /// threshold (fio size syntax; default 1m).
    #[serde(default)]
    pub seq_cutoff: String,
    #[serde(default)]
    pub seq_cutoff_size: String,
    /// In-place engines: promote a block read from the disk on its n-th
    /// miss (default 1; 0: never).
    #[serde(default)]
    pub promote_after: Option<u32>,
    /// In-place engines: keep blocks read since they were cached when their
    /// chunk is reclaimed (a second chance; default true; false: evict
    /// oldest-first).
    #[serde(default)]
    pub retain_hot: Option<bool>,
    /// In-place engines: I/O classes, first match wins (`[[volume.class]]`).
    #[serde(default)]
    pub class: Vec<ClassConfig>,
    /// Record the volume's I/O to this CSV trace file (relative to
    /// `data_dir`) while the key is set; read again on SIGHUP.
    #[serde(default)]
    pub trace: String,
    /// Stop recording before the trace file exceeds this size (default 1g).
    #[serde(default)]
    pub trace_max: String,
    /// Every client is refused writes (EPERM) and told the export is
    /// read-only.
    #[serde(default)]
    pub read_only: bool,
    /// Client certificate names (subject CN or DNS name) with full access;
    /// with `allow_read_only`, every other client is refused. Needs
    /// `[tls] client_ca`.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Client certificate names with read-only access.
    #[serde(default)]
    pub allow_read_only: Vec<String>,
}

/// `[[volume.class]]`: one I/O class of an in-place volume (docs/caching.md).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    pub name: String,
    /// Requests starting in [start, end) of the volume (fio size syntax).
    #[serde(default)]
    pub start: String,
    #[serde(default)]
    pub end: String,
    /// Request size bounds (fio size syntax).
    #[serde(default)]
    pub size_min: String,
    #[serde(default)]
    pub size_max: String,
    /// "read" or "write" (both if empty).
    #[serde(default)]
    pub direction: String,
    /// Share of the cache the class may hold: 0 never cached, 1 no limit.
    pub share: f64,
    /// A directory of the ext4 file system on the volume: requests to the
    /// blocks of the files under it (found by reading the file system's
    /// metadata, refreshed every `refresh`) belong to the class.
    #[serde(default)]
    pub directory: String,
    /// How often a directory class is refreshed (default "5s").
    #[serde(default)]
    pub refresh: String,
    /// Keep the class's blocks cached when their chunk is reclaimed.
    #[serde(default)]
    pub pinned: bool,
    /// Among blocks a reclaim could keep, higher priorities go first.
    #[serde(default)]
    pub priority: u8,
}

impl ClassConfig {
    fn to_class(&self, volume: &str) -> Result<sluice_engine::IoClass, ServeError> {
        let path = format!("volume {volume} class {}", self.name);
        let size = |key: &str, v: &str, default: u64| -> Result<u64, ServeError> {
            if v.is_empty() {
                Ok(default)
            } else {
                size_of(&format!("{path} {key}"), v)
            }
        };
        let mut c = sluice_engine::IoClass::new(&self.name, self.share);
        (c.pinned, c.priority) = (self.pinned, self.priority);
        if !self.directory.is_empty() {
            // Nothing belongs to it until the first refresh has read the
            // file system.
            c.extents = Some(Arc::new(Vec::new()));
        }
        if !self.start.is_empty() || !self.end.is_empty() {
            c.range = Some((size("start", &self.start, 0)?, size("end", &self.end, u64::MAX)?));
        }
        c.size_min = size("size_min", &self.size_min, 0)?;
        c.size_max = size("size_max", &self.size_max, u64::MAX)?;
        c.direction = match self.direction.as_str() {
            "" => None,
            "read" => Some(sluice_engine::ClassDirection::Read),
            "write" => Some(sluice_engine::ClassDirection::Write),
            other => {
                return Err(ServeError::Config { path, msg: format!("direction {other:?}: read, write or empty") })
            }
        };
        Ok(c)
    }
}

impl VolumeConfig {
    /// Where this volume's I/O is recorded, if anywhere (`trace`, `trace_max`).
    pub fn trace_target(&self, data_dir: &Path) -> Result<Option<TraceTarget>, ServeError> {
        let max = match self.trace_max.as_str() {
            "" => 1 << 30,
            v => size_of(&format!("volume {} trace_max", self.name), v)?,
        };
        if max < 4096 {
            return Err(ServeError::Config {
                path: format!("volume {} trace_max", self.name),
                msg: format!("{max} bytes: a trace needs at least 4k"),
            });
        }
        Ok(crate::recorder::target(&self.trace, max, data_dir))
    }

    /// The cache policy this volume asks for (in-place engines).
    pub fn cache_policy(&self) -> Result<sluice_engine::CachePolicy, ServeError> {
        let bad = |msg: String| ServeError::Config { path: format!("volume {}", self.name), msg };
        let mut p = sluice_engine::CachePolicy::default();
        if !self.mode.is_empty() {
            p.mode = self.mode.parse().map_err(|e: EngineError| bad(e.to_string()))?;
        }
        if !self.seq_cutoff.is_empty() {
            p.seq_cutoff = self.seq_cutoff.parse().map_err(|e: EngineError| bad(e.to_string()))?;
        }
        if !self.seq_cutoff_size.is_empty() {
            p.seq_cutoff_bytes = size_of(&format!("volume {} seq_cutoff_size", self.name), &self.seq_cutoff_size)?;
        }
        if let Some(n) = self.promote_after {
            p.promote_after_misses = n;
        }
        if let Some(r) = self.retain_hot {
            p.retain_hot = r;
        }
        Ok(p)
    }
}

impl Default for EngineSection {
    fn default() -> EngineSection {
        EngineSection {
            chunk_size: "16m".into(),
            band_size: "256m".into(),
            write_unit: "64k".into(),
            background_compaction: true,
            compaction_start: None,
            compaction_setpoint: None,
            l2p_dram: String::new(),
            layout: "bands".into(),
            cleaning: "none".into(),
            cleaning_setpoint: 0.1,
            cleaning_age: "10s".into(),
            cleaning_idle: "1s".into(),
            cleaning_response: "10s".into(),
        }
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            data_dir: PathBuf::from("sluice-data"),
            listen: vec!["127.0.0.1:10809".into()],
            unix_socket: "sluice.sock".into(),
            metrics_listen: "127.0.0.1:10810".into(),
            cache: DeviceConfig {
                kind: "file".into(),
                path: "cache.img".into(),
                size: "1g".into(),
                emulate: String::new(),
                disks: 0,
                prealloc: false,
            },
            capacity: DeviceConfig {
                kind: "file".into(),
                path: "capacity.img".into(),
                size: "8g".into(),
                emulate: String::new(),
                disks: 0,
                prealloc: false,
            },
            engine: EngineSection::default(),
            server: ServerSection::default(),
            tls: TlsSection::default(),
            volumes: vec![VolumeConfig { name: "default".into(), size: "4g".into(), ..Default::default() }],
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("config {path}: {msg}")]
    Config { path: String, msg: String },
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("{0}")]
    Device(String),
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("server: {0}")]
    Server(String),
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

/// A memory device of `size` bytes, every page touched up front if `prealloc`.
fn memory(size: u64, prealloc: bool) -> Box<dyn BlockDevice> {
    match prealloc {
        true => Box::new(MemoryDevice::preallocated(size, 4096)),
        false => Box::new(MemoryDevice::new(size, 4096)),
    }
}

/// A duration in seconds, as "5s" (or "5").
pub(crate) fn seconds_of(field: &str, v: &str) -> Result<f64, ServeError> {
    (v.trim_end_matches('s').parse())
        .map_err(|_| ServeError::Config { path: field.into(), msg: format!("{v:?}: seconds, as \"5s\"") })
}

fn size_of(field: &str, v: &str) -> Result<u64, ServeError> {
    parse_bytes(v).map_err(|e| ServeError::Config { path: field.into(), msg: e.to_string() })
}

impl Config {
    pub fn load(path: Option<&Path>) -> Result<Config, ServeError> {
        let Some(path) = path else { return Ok(Config::default()) };
        let text = std::fs::read_to_string(path)
            .map_err(|source| ServeError::Io { what: path.display().to_string(), source })?;
        toml::from_str(&text).map_err(|e| ServeError::Config { path: path.display().to_string(), msg: e.to_string() })
    }

    /// A new engine on these devices with this config's geometry and volumes.
    fn create_engine(
        &self,
        cache: Arc<dyn BlockDevice>,
        capacity: Arc<dyn BlockDevice>,
    ) -> Result<Arc<Engine>, ServeError> {
        let ecfg = EngineConfig {
            chunk_bytes: size_of("engine.chunk_size", &self.engine.chunk_size)?,
            band_bytes: size_of("engine.band_size", &self.engine.band_size)?,
            write_unit_bytes: size_of("engine.write_unit", &self.engine.write_unit)?,
            l2p_dram_bytes: match self.engine.l2p_dram.as_str() {
                "" | "0" => 0,
                s => size_of("engine.l2p_dram", s)?,
            },
            layout: self.layout()?,
            ..Default::default()
        };
        let specs = self
            .volumes
            .iter()
            .map(|v| {
                Ok(VolumeSpec { name: v.name.clone(), size_bytes: size_of(&format!("volume {}", v.name), &v.size)? })
            })
            .collect::<Result<Vec<_>, ServeError>>()?;
        Ok(Engine::create(cache, capacity, ecfg, &specs)?)
    }

    /// Both devices, for messages.
    fn devices_text(&self) -> String {
        format!("cache {} and capacity {}", self.device_label("cache"), self.device_label("capacity"))
    }

    /// The `which` device as an operator names it: its path, or "(memory)".
    fn device_label(&self, which: &str) -> String {
        let d = if which == "cache" { &self.cache } else { &self.capacity };
        if d.kind == "file" {
            self.in_data_dir(&d.file_path(which)).display().to_string()
        } else {
            format!("({})", d.kind)
        }
    }

    /// One line per device for the start banner: where it is, its size and
    /// what it emulates.
    fn device_lines(&self) -> Vec<String> {
        ["cache", "capacity"]
            .iter()
            .map(|&which| {
                let d = if which == "cache" { &self.cache } else { &self.capacity };
                let on_disk = (d.kind == "file")
                    .then(|| std::fs::metadata(self.in_data_dir(&d.file_path(which))).ok())
                    .flatten()
                    .map(|m| m.len())
                    .filter(|&n| n > 0);
                let size = match (on_disk, size_of("size", &d.size)) {
                    (Some(n), _) | (None, Ok(n)) => format!("{} MiB", n >> 20),
                    (None, Err(_)) => "size from the device".into(),
                };
                let media = match (d.emulate.as_str(), d.disks) {
                    ("", _) => "not emulated".to_string(),
                    (m, n) if n > 1 => format!("emulated {m}, striped over {n} disks"),
                    (m, _) => format!("emulated {m}"),
                };
                match d.kind.as_str() {
                    "file" => format!("{which}: {} (file, {size}, {media})", self.device_label(which)),
                    kind => format!("{which}: {kind}, {size}, {media}"),
                }
            })
            .collect()
    }

    /// Each volume's name and trace target, all checked.
    fn trace_targets(&self) -> Result<Vec<(&str, Option<TraceTarget>)>, ServeError> {
        self.volumes.iter().map(|v| Ok((v.name.as_str(), v.trace_target(&self.data_dir)?))).collect()
    }

    fn in_data_dir(&self, p: &str) -> PathBuf {
        let p = PathBuf::from(p);
        if p.is_absolute() {
            p
        } else {
            self.data_dir.join(p)
        }
    }

    /// Open both devices (cache, then capacity) and run `f` on them. If
    /// opening or `f` fails, the files this call created are removed again:
    /// a refused start or format leaves nothing behind.
    fn with_devices<T>(&self, f: impl FnOnce(&[OpenedDevice]) -> Result<T, ServeError>) -> Result<T, ServeError> {
        let mut opened = Vec::new();
        let r = self
            .open_device("cache", &self.cache)
            .map(|d| opened.push(d))
            .and_then(|()| self.open_device("capacity", &self.capacity))
            .map(|d| opened.push(d))
            .and_then(|()| f(&opened));
        if r.is_err() {
            for d in opened {
                if let Some(p) = d.created {
                    drop(d.dev);
                    let _ = std::fs::remove_file(p);
                }
            }
        }
        r
    }

    /// Open (creating a missing file, fully allocated) the `which` device.
    fn open_device(&self, which: &'static str, d: &DeviceConfig) -> Result<OpenedDevice, ServeError> {
        let mut size = size_of(&format!("{which}.size"), &d.size)?;
        let bad = |msg: String| ServeError::Config { path: format!("{which}.emulate"), msg };
        if d.prealloc && d.kind != "memory" {
            let msg = format!("prealloc needs kind = \"memory\", not {:?}", d.kind);
            return Err(ServeError::Config { path: format!("{which}.prealloc"), msg });
        }
        let zns = (d.emulate == "zns").then(|| {
            let zone = ZnsProfile::zn540_small_zones(1, SERVE_ZONE_SHRINK).zone_size_bytes;
            ZnsProfile::zn540_small_zones(size / zone, SERVE_ZONE_SHRINK)
        });
        if let Some(p) = &zns {
            if d.kind != "memory" {
                return Err(bad("zns emulation needs kind = \"memory\" (zone state is not persisted)".into()));
            }
            if p.zone_count < 8 {
                return Err(bad(format!("zns needs at least 8 zones of {} MiB", p.zone_size_bytes >> 20)));
            }
            size = p.zone_count * p.zone_size_bytes;
        }
        // Check the medium before anything is created.
        let ssd = match d.emulate.as_str() {
            "qlc" => Some(SsdProfile::qlc(size)),
            "tlc" => Some(SsdProfile::tlc(size)),
            "" | "scm" | "zns" | "hdd" => None,
            other => return Err(bad(format!("unknown medium {other:?} (scm, qlc, tlc, zns or hdd)"))),
        };
        if d.disks > 1 && (d.emulate != "hdd" || d.kind != "memory") {
            return Err(ServeError::Config {
                path: format!("{which}.disks"),
                msg: "several disks are emulated HDDs on memory (emulate = \"hdd\", kind = \"memory\")".into(),
            });
        }
        let ssd_fits = |p: &SsdProfile, size: u64| {
            let erase_block = p.erase_block_ius as u64 * p.iu_bytes;
            if size.is_multiple_of(erase_block) && size >= 64 * erase_block {
                Ok(())
            } else {
                Err(bad(format!(
                    "{} needs a size that is a multiple of {} MiB and at least {} MiB",
                    d.emulate,
                    erase_block >> 20,
                    (64 * erase_block) >> 20
                )))
            }
        };
        if let Some(p) = &ssd {
            ssd_fits(p, size)?;
        }
        let mut created = None;
        let backend: Box<dyn BlockDevice> = match d.kind.as_str() {
            "memory" => memory(size, d.prealloc),
            "file" => {
                let path = self.in_data_dir(&d.file_path(which));
                let opts = FileOptions {
                    capacity_bytes: Some(size),
                    cache: CacheMode::DirectOrBuffered,
                    allocate: true,
                    // The log: small records and frequent flushes (FileOptions).
                    zero_fill: which == "cache",
                    exclusive: true,
                    ..Default::default()
                };
                let dev = FileDevice::open(&path, &opts)
                    .map_err(|e| ServeError::Device(format!("opening the {which} device: {e}")))?;
                size = dev.info().capacity_bytes;
                if dev.created() {
                    created = Some(path);
                }
                Box::new(dev)
            }
            other => {
                return Err(ServeError::Config {
                    path: format!("{which}.kind"),
                    msg: format!("unknown kind {other:?} (file or memory)"),
                })
            }
        };
        let clock: ClockRef = RealClock::new();
        let fresh = d.kind == "memory" || created.is_some();
        let dev: Arc<dyn BlockDevice> = match d.emulate.as_str() {
            "" => Arc::from(backend),
            "scm" => {
                let mut p = ScmProfile::p5800x();
                p.capacity_bytes = size;
                Arc::new(scm_device(p, backend, clock))
            }
            "hdd" if d.disks > 1 => {
                // Each disk its own memory; the striped device the engine sees.
                drop(backend);
                let each = (size / d.disks as u64) / (1 << 20) * (1 << 20);
                let members: Vec<Arc<dyn BlockDevice>> = (0..d.disks)
                    .map(|_| {
                        let p = HddProfile { capacity_bytes: each, ..HddProfile::hdd_7200() };
                        Arc::new(hdd_device(p, memory(each, d.prealloc), clock.clone())) as Arc<dyn BlockDevice>
                    })
                    .collect();
                Arc::new(StripedDevice::new(members, 1 << 20))
            }
            "hdd" => {
                let p = HddProfile { capacity_bytes: size / 4096 * 4096, ..HddProfile::hdd_7200() };
                Arc::new(hdd_device(p, backend, clock))
            }
            "qlc" | "tlc" => {
                // A raw block device's own size decides.
                let p = if d.emulate == "qlc" { SsdProfile::qlc(size) } else { SsdProfile::tlc(size) };
                ssd_fits(&p, size)?;
                Arc::new(ssd_device(p, backend, clock))
            }
            _ => Arc::new(zns_device(zns.expect("zns profile"), backend, clock)),
        };
        Ok(OpenedDevice { which, dev, fresh, created })
    }

    /// `[engine] compaction_start` and `compaction_setpoint`, or the
    /// layout's defaults. In place, the compactor's reclaims clean live data
    /// home and evict it: they start only near a full log (a Spark job with
    /// half the cache it needed ran 62.0 s with reclaims from half the log
    /// free, 55.7 s from a tenth; docs/results/2026-11-26-hadoop.md).
    fn compactor(&self, layout: sluice_engine::Layout) -> CompactorConfig {
        let (start, setpoint) = match layout {
            sluice_engine::Layout::InPlace => (0.1, 0.05),
            _ => (CompactorConfig::default().start_free, CompactorConfig::default().setpoint_free),
        };
        CompactorConfig {
            start_free: self.engine.compaction_start.unwrap_or(start),
            setpoint_free: self.engine.compaction_setpoint.unwrap_or(setpoint),
            ..Default::default()
        }
    }

    /// `[engine] cleaning`, `cleaning_setpoint`, `cleaning_age`,
    /// `cleaning_idle`, `cleaning_response`, parsed.
    fn cleaning(&self) -> Result<sluice_engine::Cleaning, ServeError> {
        let e = &self.engine;
        let bad = |path: &str, msg: String| ServeError::Config { path: path.into(), msg };
        let mode = match e.cleaning.as_str() {
            "none" => sluice_engine::CleaningMode::None,
            "alru" => sluice_engine::CleaningMode::Alru,
            "acp" => sluice_engine::CleaningMode::Acp,
            other => return Err(bad("engine.cleaning", format!("{other:?}: none, alru or acp"))),
        };
        let duration = |path: &str, text: &str, zero_ok: bool| {
            let secs = seconds_of(path, text)?;
            match secs.is_finite() && (secs > 0.0 || zero_ok && secs == 0.0) {
                true => Ok(std::time::Duration::from_secs_f64(secs)),
                false => Err(bad(path, format!("{text:?}: a duration{}", if zero_ok { " ≥ 0" } else { " > 0" }))),
            }
        };
        if !(0.0..=1.0).contains(&e.cleaning_setpoint) {
            return Err(bad("engine.cleaning_setpoint", "a share of the cache, in [0, 1]".into()));
        }
        Ok(sluice_engine::Cleaning {
            mode,
            dirty_setpoint: e.cleaning_setpoint,
            age: duration("engine.cleaning_age", &e.cleaning_age, true)?,
            idle: duration("engine.cleaning_idle", &e.cleaning_idle, true)?,
            response: duration("engine.cleaning_response", &e.cleaning_response, false)?,
        })
    }

    /// `[engine] layout`, parsed.
    fn layout(&self) -> Result<sluice_engine::Layout, ServeError> {
        (self.engine.layout.parse())
            .map_err(|e: EngineError| ServeError::Config { path: "engine.layout".into(), msg: e.to_string() })
    }

    /// What in this config differs from the engine on the devices, one line
    /// each (empty: nothing).
    fn differences(&self, sb: &Superblock, zoned: bool) -> Result<Vec<String>, ServeError> {
        let mut out = Vec::new();
        let in_place = sb.layout == sluice_engine::persist::LAYOUT_IN_PLACE;
        if in_place != (self.layout()? == sluice_engine::Layout::InPlace) {
            let have = if in_place { "in-place" } else { "bands" };
            out.push(format!(
                "engine.layout: the config says {:?}, the engine on the devices is {have:?}",
                self.engine.layout
            ));
        }
        let e = &self.engine;
        let mut geometry = vec![
            ("engine.chunk_size", size_of("engine.chunk_size", &e.chunk_size)?, sb.chunk_bytes),
            ("engine.write_unit", size_of("engine.write_unit", &e.write_unit)?, sb.write_unit_bytes),
        ];
        // On a zoned device bands are its zones, whatever the config says.
        if !zoned {
            geometry.push(("engine.band_size", size_of("engine.band_size", &e.band_size)?, sb.band_bytes));
        }
        for (key, want, have) in geometry {
            if want != have {
                out.push(format!("{key}: the config says {want} bytes, the engine on the devices has {have}"));
            }
        }
        let on_media: Vec<&str> = sb.volumes.iter().map(|(n, _)| n.as_str()).collect();
        for v in &self.volumes {
            let want = size_of(&format!("volume {}", v.name), &v.size)?;
            match sb.volumes.iter().find(|(n, _)| *n == v.name) {
                None => out.push(format!(
                    "volume {:?} is in the config but not on the devices (volumes are fixed when the engine is created)",
                    v.name
                )),
                Some((_, have)) if *have != want => out.push(format!(
                    "volume {:?}: the config says {want} bytes, the engine on the devices has {have} (volumes are not resized)",
                    v.name
                )),
                Some(_) => {}
            }
        }
        for name in on_media.iter().filter(|n| !self.volumes.iter().any(|v| v.name == **n)) {
            out.push(format!(
                "volume {name:?} is on the devices but not in the config (its data is kept; list it again)"
            ));
        }
        Ok(out)
    }
}

/// How much smaller than ZN540's (2 GiB) the zones of an emulated ZNS drive are.
const SERVE_ZONE_SHRINK: u64 = 64;

/// The data directory's lock: held (an exclusive `flock` on
/// `DATA_DIR/sluice.lock`, which holds the owner's PID) for as long as this
/// value lives. The kernel drops it when the process ends, however it ends,
/// so a stale PID in the file never blocks a start.
pub struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    /// `take`, creating the directory first if it is missing.
    pub fn take_creating(data_dir: &Path) -> Result<DirLock, ServeError> {
        std::fs::create_dir_all(data_dir).map_err(|source| ServeError::Io {
            what: format!("creating the data directory {}", data_dir.display()),
            source,
        })?;
        DirLock::take(data_dir)
    }

    pub fn take(data_dir: &Path) -> Result<DirLock, ServeError> {
        use std::io::{Read, Seek, Write};
        use std::os::fd::AsRawFd;
        let path = data_dir.join("sluice.lock");
        let io = |what: &str, source| ServeError::Io { what: format!("{what} {}", path.display()), source };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io("opening the lock file", e))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io("locking", e));
            }
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Err(ServeError::Locked { dir: data_dir.to_path_buf(), holder: holder.trim().to_string() });
        }
        let pid = format!("{}\n", std::process::id());
        file.set_len(0).map_err(|e| io("writing", e))?;
        file.rewind().map_err(|e| io("writing", e))?;
        file.write_all(pid.as_bytes()).map_err(|e| io("writing", e))?;
        Ok(DirLock { _file: file })
    }
}

/// A device as `sluice serve` opened it.
struct OpenedDevice {
    which: &'static str,
    dev: Arc<dyn BlockDevice>,
    /// Holds nothing anyone wrote before this start: memory, or a file this
    /// start created.
    fresh: bool,
    /// The file this start created, removed again if the start is refused.
    created: Option<PathBuf>,
}

/// How the engine came to be running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opened {
    /// Created on fresh devices by this start.
    Created,
    /// Reopened after a clean shutdown.
    Reopened,
    /// Reopened after an unclean stop: recovered from the devices.
    Recovered,
}

/// Open the engine on the configured devices, or create it when both are
/// fresh (memory, or files this start created). A refused start changes
/// nothing: files it created are removed, and the engine on the devices is
/// not touched (not even marked unclean). The caller holds the data
/// directory's lock (`DirLock`).
pub fn open_engine(cfg: &Config) -> Result<(Arc<Engine>, Opened), ServeError> {
    cfg.with_devices(|opened| open_engine_on(cfg, opened))
}

fn open_engine_on(cfg: &Config, opened: &[OpenedDevice]) -> Result<(Arc<Engine>, Opened), ServeError> {
    let (cache, capacity) = (opened[0].dev.clone(), opened[1].dev.clone());
    match Engine::inspect(&*cache, &*capacity) {
        Ok(sb) => {
            let diff = cfg.differences(&sb, capacity.info().zoned)?;
            if !diff.is_empty() {
                return Err(ServeError::ConfigDiffers(diff));
            }
            let e = Engine::open(cache, capacity)?;
            let how = if e.recovered_in().is_some() { Opened::Recovered } else { Opened::Reopened };
            return Ok((e, how));
        }
        Err(EngineError::NoEngine) => {}
        Err(e) => return Err(e.into()),
    }
    if let Some(d) = opened.iter().find(|d| !d.fresh) {
        return Err(ServeError::NotFresh { which: d.which, path: cfg.device_label(d.which) });
    }
    Ok((cfg.create_engine(cache, capacity)?, Opened::Created))
}

/// Where a device holds something other than zeros: its first and last
/// 16 MiB and 256 places spread evenly over the rest, 64 KiB each (a sample:
/// reading a whole multi-terabyte device would take hours). The offset of
/// the first non-zero byte found.
fn sampled_data(dev: &dyn BlockDevice) -> Result<Option<u64>, ServeError> {
    let bytes = dev.info().capacity_bytes;
    let edge = (16u64 << 20).min(bytes);
    let mut places = vec![(0, edge), (bytes - edge, edge)];
    let step = (bytes / 257).max(64 << 10) / 4096 * 4096;
    places.extend((1..=256u64).map(|i| i * step).filter(|&o| o + (64 << 10) <= bytes).map(|o| (o, 64 << 10)));
    for (at, len) in places {
        let mut off = 0;
        while off < len {
            let n = (len - off).min(4 << 20);
            let b = sluice_media::device::read_at(dev, at + off, n as usize)
                .map_err(|e| ServeError::Device(format!("reading the device at byte {}: {e}", at + off)))?;
            if let Some(i) = b.iter().position(|&x| x != 0) {
                return Ok(Some(at + off + i as u64));
            }
            off += n;
        }
    }
    Ok(None)
}

/// `sluice format`: create a new, empty engine on the configured devices
/// (missing files are created). Refuses a device that holds a Sluice engine
/// or other data unless `force`, which destroys it. Leaves the engine shut
/// down cleanly, so the next `sluice serve` reopens it. Returns what it did.
pub fn format(cfg: &Config, force: bool) -> Result<String, ServeError> {
    let _lock = DirLock::take_creating(&cfg.data_dir)?;
    cfg.with_devices(|opened| format_on(cfg, force, opened))
}

fn format_on(cfg: &Config, force: bool, opened: &[OpenedDevice]) -> Result<String, ServeError> {
    let (cache, capacity) = (opened[0].dev.clone(), opened[1].dev.clone());
    let mut found = Vec::new();
    let engine_err = |e: sluice_media::DeviceError| ServeError::Engine(EngineError::Device(e));
    if let Some(u) = sluice_engine::engine::superblock_present(&*cache).map_err(engine_err)? {
        found.push(format!("the cache device holds engine {}", sluice_engine::persist::uuid_text(&u)));
    }
    if let Some(u) = sluice_engine::engine::label_present(&*capacity).map_err(engine_err)? {
        found.push(format!("the capacity device holds engine {}", sluice_engine::persist::uuid_text(&u)));
    }
    if found.is_empty() {
        for d in opened.iter().filter(|d| !d.fresh) {
            if let Some(at) = sampled_data(&*d.dev)? {
                found.push(format!("the {} device {} holds data (at byte {at})", d.which, cfg.device_label(d.which)));
            }
        }
    }
    if !found.is_empty() && !force {
        return Err(ServeError::FormatRefused(found));
    }
    if force {
        sluice_engine::engine::wipe_labels(&*cache, &*capacity).map_err(engine_err)?;
    }
    let engine = cfg.create_engine(cache, capacity)?;
    engine.shutdown()?;
    let uuid = sluice_engine::persist::uuid_text(&engine.uuid());
    let mut text = format!("sluice: formatted engine {uuid} on {}", cfg.devices_text());
    if !found.is_empty() {
        text += &format!(" (destroyed: {})", found.join("; "));
    }
    Ok(text)
}

/// `sluice check`: scan both devices read-only and report (text or JSON);
/// with `salvage`, open accepting the damage (docs/serve.md) and shut down
/// cleanly. Returns the report text and whether damage was found.
/// `sluice clean`: open an in-place engine (the server stopped), write every
/// dirty block home, shut it down cleanly. The capacity device alone then
/// holds every volume (docs/caching.md); returns what to tell the operator.
pub fn clean(cfg: &Config) -> Result<String, ServeError> {
    let (cache, capacity) = existing_devices(cfg, "sluice clean")?;
    let _lock = DirLock::take(&cfg.data_dir)?;
    let (cache, capacity) = (cfg.open_device("cache", cache)?.dev, cfg.open_device("capacity", capacity)?.dev);
    let e = Engine::open(cache, capacity)?;
    let wrote = match e.clean(true) {
        Ok(n) => n,
        Err(err) => {
            // Leave it as found: shut down cleanly before reporting.
            e.shutdown()?;
            return Err(err.into());
        }
    };
    let snap = e.snapshot();
    e.shutdown()?;
    let homes: Vec<String> = (snap.volumes.iter())
        .map(|v| format!("{} at byte {} ({} bytes)", v.name, e.home_offset(&v.name).unwrap_or(0), v.size_bytes))
        .collect();
    Ok(format!(
        "sluice: wrote {} bytes home; the capacity device {} alone now holds every volume: {}\n",
        wrote,
        cfg.device_label("capacity"),
        homes.join(", ")
    ))
}

/// The config's two devices, which must be files that exist (`what`: the
/// command, for the error).
fn existing_devices<'a>(cfg: &'a Config, what: &str) -> Result<(&'a DeviceConfig, &'a DeviceConfig), ServeError> {
    for which in ["cache", "capacity"] {
        let d = if which == "cache" { &cfg.cache } else { &cfg.capacity };
        if d.kind != "file" {
            return Err(ServeError::Config {
                path: format!("{which}.kind"),
                msg: format!("{what} reads file or block devices (a memory device holds nothing between runs)"),
            });
        }
        let path = cfg.in_data_dir(&d.file_path(which));
        if !path.exists() {
            return Err(ServeError::Device(format!("the {which} device {} does not exist", path.display())));
        }
    }
    Ok((&cfg.cache, &cfg.capacity))
}

pub fn check(cfg: &Config, json: bool, salvage: bool) -> Result<(String, bool), ServeError> {
    existing_devices(cfg, "sluice check")?;
    let _lock = DirLock::take(&cfg.data_dir)?;
    let cache = cfg.open_device("cache", &cfg.cache)?.dev;
    let capacity = cfg.open_device("capacity", &cfg.capacity)?.dev;
    if salvage {
        let e = Engine::open_with(cache, capacity, sluice_engine::OpenOptions { salvage: true })?;
        let lines: Vec<String> = e.salvaged().iter().map(|d| format!("  {d}")).collect();
        e.shutdown()?;
        let text = if lines.is_empty() {
            "sluice: nothing to salvage; the engine is shut down cleanly\n".to_string()
        } else {
            format!(
                "sluice: salvaged, accepting {} finding(s) (damaged blocks now read as zeros; what damaged log \
                 records held reverted to older copies):\n{}\n",
                lines.len(),
                lines.join("\n")
            )
        };
        return Ok((text, false));
    }
    let report = Engine::check(cache, capacity)?;
    let damaged = !report.damage.is_empty();
    let text = if json {
        serde_json::to_string_pretty(&report).map_err(|e| ServeError::Server(e.to_string()))? + "\n"
    } else {
        report.text()
    };
    Ok((text, damaged))
}

/// Block SIGINT, SIGTERM and SIGHUP in this thread (and every thread it
/// starts): the main thread takes them with `sigwait`.
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

/// Set the engine's cleaning and every volume's cache policy and I/O
/// classes from `cfg`: all parsed and checked first, so a bad config
/// changes nothing.
fn apply_policies(cfg: &Config, engine: &Arc<Engine>) -> Result<(), ServeError> {
    let in_place = cfg.layout()? == sluice_engine::Layout::InPlace;
    let cleaning = cfg.cleaning()?;
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
        engine.volume(&v.name)?;
        sluice_engine::engine::check_io_classes(&classes)
            .map_err(|e| ServeError::Config { path: format!("volume {}", v.name), msg: e.to_string() })?;
        volumes.push((v.name.as_str(), policy, classes));
    }
    if !in_place {
        return Ok(());
    }
    engine.set_cleaning(cleaning)?;
    for (name, policy, classes) in volumes {
        engine.set_cache_policy(name, policy)?;
        engine.set_io_classes(name, classes)?;
    }
    Ok(())
}

/// What a reload cannot change, by section, as text to compare: everything
/// but `[engine] cleaning*` and the volumes' policies and classes.
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
fn reload(
    path: Option<&Path>,
    flags: &Overrides,
    running: &Config,
    engine: &Arc<Engine>,
    classifier: &mut Option<crate::directories::DirectoryClasses>,
    traces: &[Arc<TraceSlot>],
) -> Result<(), ServeError> {
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
    apply_policies(&cfg, engine)?;
    for (slot, (name, target)) in traces.iter().zip(targets) {
        if let Err(e) = slot.set(target) {
            eprintln!("sluice: volume {name}: cannot record its trace: {e}");
        }
    }
    drop(classifier.take());
    *classifier = crate::directories::DirectoryClasses::start(&cfg, engine)?;
    eprintln!("sluice: reloaded the cache policies from the config");
    let report = engine.cache_report();
    if !report.is_empty() && report.iter().all(|r| r.policy.mode == sluice_engine::CacheMode::PassThrough) {
        let bytes = engine.clean(false)?;
        eprintln!(
            "sluice: detached: every volume is pass-through and {} MiB of dirty data went home; the disk alone holds every volume",
            bytes >> 20
        );
    }
    Ok(())
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
pub fn run(cfg: Config, path: Option<&Path>, flags: &Overrides) -> Result<(), ServeError> {
    let set = block_signals();
    // TLS first: a bad [tls] section must not leave an opened engine behind.
    let mut opts = ServerOptions {
        connections_max: cfg.server.connections_max,
        workers_max: cfg.server.workers_max,
        inflight_bytes_max: size_of("server.inflight_bytes_max", &cfg.server.inflight_bytes_max)?,
        ..ServerOptions::default()
    };
    let listeners = cfg.listen.len() as u64 + u64::from(!cfg.unix_socket.is_empty());
    let fds_wanted = opts.connections_max as u64 * FDS_PER_CONNECTION * listeners + FDS_RESERVED;
    match raise_open_files_limit(fds_wanted) {
        Ok(got) if got >= fds_wanted => {}
        Ok(got) => eprintln!("sluice: warning: {}", open_files_advice(got, opts.connections_max as u64, listeners)),
        Err(e) => eprintln!("sluice: warning: cannot raise the open-file limit: {e}"),
    }
    opts.access = export_access(&cfg)?;
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
    // Checked before the engine opens: bad input changes nothing.
    let compactor_cfg = cfg.engine.background_compaction.then_some(cfg.compactor(cfg.layout()?));
    if let Some(c) = &compactor_cfg {
        c.check().map_err(|e| ServeError::Config { path: "engine".into(), msg: e.to_string() })?;
    }
    let _lock = DirLock::take_creating(&cfg.data_dir)?;
    let (engine, how) = open_engine(&cfg)?;
    // Reads run outside the engine lock; handing them to workers pays where
    // a device has latency to overlap (files, raw devices, emulated media),
    // not on plain memory.
    let instant = |d: &DeviceConfig| d.kind == "memory" && d.emulate.is_empty();
    engine.set_parallel_reads(!(instant(&cfg.cache) && instant(&cfg.capacity)));
    match (how, engine.recovered_in()) {
        (_, Some(t)) => {
            eprintln!("sluice: the last stop was unclean; recovered from the devices in {:.3} s", t.as_secs_f64())
        }
        (Opened::Created, _) => eprintln!("sluice: created a new engine on {}", cfg.devices_text()),
        _ => eprintln!("sluice: reopened the engine on {}", cfg.devices_text()),
    }
    let targets = cfg.trace_targets()?;
    apply_policies(&cfg, &engine)?;
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
    let classifier = crate::directories::DirectoryClasses::start(&cfg, &engine)?;
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
    let server = Server::new(exports, opts).map_err(|e| ServeError::Server(e.to_string()))?;
    let mut handles = Vec::new();
    for addr in &cfg.listen {
        let l = Listener::bind_tcp(addr.as_str()).map_err(|source| ServeError::Io { what: addr.clone(), source })?;
        handles.push(server.spawn(l).map_err(|e| ServeError::Server(e.to_string()))?);
    }
    if !cfg.unix_socket.is_empty() {
        let p = cfg.in_data_dir(&cfg.unix_socket);
        let l = Listener::bind_unix(&p).map_err(|source| ServeError::Io { what: p.display().to_string(), source })?;
        handles.push(server.spawn(l).map_err(|e| ServeError::Server(e.to_string()))?);
    }
    for h in &handles {
        println!(
            "sluice: serving {} on {}",
            cfg.volumes.iter().map(|v| v.name.as_str()).collect::<Vec<_>>().join(","),
            h.local_addr()
        );
    }
    if !cfg.metrics_listen.is_empty() {
        let what = || format!("metrics_listen {}", cfg.metrics_listen);
        let l = std::net::TcpListener::bind(&cfg.metrics_listen)
            .map_err(|source| ServeError::Io { what: what(), source })?;
        let addr = l.local_addr().map_err(|source| ServeError::Io { what: what(), source })?;
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
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // Removed when `run` returns (a clean stop, or an error after this).
    let _pidfile = match &flags.pidfile {
        Some(p) => Some(Pidfile::write(p)?),
        None => None,
    };
    notify_systemd("READY=1");
    let mut classifier = classifier;
    let sig = loop {
        match wait_for_signal(&set) {
            libc::SIGHUP => {
                if let Err(e) = reload(path, flags, &cfg, &engine, &mut classifier, &traces) {
                    eprintln!("sluice: reload refused, nothing changed: {e}");
                }
            }
            sig => break sig,
        }
    };
    eprintln!("sluice: signal {sig}: stopping");
    notify_systemd("STOPPING=1");
    for h in handles {
        h.shutdown().map_err(|e| ServeError::Server(e.to_string()))?;
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
        let text = "[engine]\nlayout = \"in-place\"\nchunk_size = \"1m\"\n\n[[volume]]\nname = \"v\"\nsize = \"64m\"\nmode = \"wt\"\nseq_cutoff_size = \"256k\"\npromote_after = 2\nretain_hot = false\n";
        let cfg: Config = toml::from_str(text).unwrap();
        let p = cfg.volumes[0].cache_policy().unwrap();
        assert_eq!(
            (p.mode, p.seq_cutoff_bytes, p.promote_after_misses, p.retain_hot),
            (sluice_engine::CacheMode::WriteThrough, 256 << 10, 2, false)
        );
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
