//! The `sluice serve` configuration: the TOML file's sections and keys
//! (docs/serve.md documents every one), their defaults, the command-line
//! flags that override them, and the conversions of a volume's keys into
//! engine policies and classes.
//!
//! Invariants: every struct denies unknown keys, so a typo is an error, not
//! a silently ignored setting; every key has a default, so an empty file
//! (or none) is a valid config; the config serializes back to TOML that
//! parses to the same values (`--print-config`).

use super::*;

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
    /// The control socket `sluice cache` commands a running server through
    /// (relative paths are inside `data_dir`; mode 0600); "" for none.
    pub control_socket: String,
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
    /// emulate = "hdd" only: each disk's media rate in bytes per second
    /// (fio size syntax, e.g. "60m"; default the 7200 rpm profile's
    /// "200m"): a disk whose bandwidth other work shares.
    #[serde(default)]
    pub hdd_rate: String,
    /// kind = "memory" only: allocate and touch all of it at start, so writes
    /// never wait for the kernel to fault in fresh pages (benchmarks).
    #[serde(default)]
    pub prealloc: bool,
}

fn default_kind() -> String {
    "file".into()
}

impl DeviceConfig {
    /// The emulated HDD's profile: the 7200 rpm disk, at `hdd_rate` if set.
    pub fn hdd_profile(&self, which: &str, capacity_bytes: u64) -> Result<sluice_media::HddProfile, ServeError> {
        let mut p = sluice_media::HddProfile { capacity_bytes, ..sluice_media::HddProfile::hdd_7200() };
        if !self.hdd_rate.is_empty() {
            let path = format!("{which}.hdd_rate");
            if self.emulate != "hdd" {
                return Err(ServeError::Config { path, msg: "a media rate is for emulate = \"hdd\"".into() });
            }
            let rate = size_of(&path, &self.hdd_rate)?;
            if !(1 << 20..=1 << 40).contains(&rate) {
                return Err(ServeError::Config { path, msg: format!("{rate} bytes/s: from 1m to 1t") });
            }
            p.outer_bytes_per_s = rate;
            p.name = format!("hdd-7200 at {} MB/s", rate / 1_000_000);
        }
        Ok(p)
    }

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
    /// In-place engines: attach the cache to a capacity device (a file or a
    /// block device) that already holds data, such as a file system: it is
    /// not written until cleaning, nothing of Sluice's is ever put on it,
    /// and one volume (`size = "disk"`) is the whole disk. Set when the
    /// engine is created (docs/caching.md, "Attaching to a disk with data").
    pub attach: bool,
    /// In-place engines: keep a CRC of every home Sluice writes on the
    /// cache device and check it on every read from home (default true;
    /// docs/caching.md, "Home checksums"). Set when the engine is created.
    pub home_sums: bool,
    /// With bands: a write of at least this many bytes goes to the capacity
    /// device directly, as a segment of its own, instead of through the log
    /// (fio size syntax; "0", the default, never; docs/engine.md, "Direct
    /// writes").
    pub direct_write: String,
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
    /// In-place engines, write-back: when the log is full of dirty data,
    /// send new writes home past it (default true) rather than wait for
    /// its oldest chunk to be cleaned.
    #[serde(default)]
    pub spill: Option<bool>,
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
    /// A directory class judges a write to a block no file is known to
    /// hold yet by where the file system allocates the directory's files
    /// (default false: such writes are not the class's until the metadata
    /// names them; docs/caching.md says when it pays).
    #[serde(default)]
    pub predict: bool,
    /// A directory class writes home promptly the unclassified dirty
    /// cached blocks the metadata names another's (default false).
    #[serde(default)]
    pub clean_others: bool,
    /// Keep the class's blocks cached when their chunk is reclaimed.
    #[serde(default)]
    pub pinned: bool,
    /// Among blocks a reclaim could keep, higher priorities go first.
    #[serde(default)]
    pub priority: u8,
}

impl ClassConfig {
    pub(super) fn to_class(&self, volume: &str) -> Result<sluice_engine::IoClass, ServeError> {
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
        if (self.predict || self.clean_others) && self.directory.is_empty() {
            return Err(ServeError::Config { path, msg: "predict and clean_others are for a directory class".into() });
        }
        (c.predict, c.clean_others) = (self.predict, self.clean_others);
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
            p.mode = self.mode.parse().map_err(|e: EngineError| bad(format!("mode {:?}: {e}", self.mode)))?;
        }
        if !self.seq_cutoff.is_empty() {
            p.seq_cutoff = self
                .seq_cutoff
                .parse()
                .map_err(|e: EngineError| bad(format!("seq_cutoff {:?}: {e}", self.seq_cutoff)))?;
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
        if let Some(s) = self.spill {
            p.spill = s;
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
            attach: false,
            home_sums: true,
            direct_write: "0".into(),
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
            control_socket: "sluice.ctl".into(),
            cache: DeviceConfig {
                kind: "file".into(),
                path: "cache.img".into(),
                size: "1g".into(),
                emulate: String::new(),
                disks: 0,
                hdd_rate: String::new(),
                prealloc: false,
            },
            capacity: DeviceConfig {
                kind: "file".into(),
                path: "capacity.img".into(),
                size: "8g".into(),
                emulate: String::new(),
                disks: 0,
                hdd_rate: String::new(),
                prealloc: false,
            },
            engine: EngineSection::default(),
            server: ServerSection::default(),
            tls: TlsSection::default(),
            volumes: vec![VolumeConfig { name: "default".into(), size: "4g".into(), ..Default::default() }],
        }
    }
}
