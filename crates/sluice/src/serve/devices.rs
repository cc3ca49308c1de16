//! The devices and the engine on them: opening the cache and capacity
//! devices a config names (files, raw block devices, memory, emulated
//! media), the data directory's lock, and the engine operations that run
//! with the server stopped or before it starts: open (reopen, recover or
//! create), `format`, `clean` and `check`.
//!
//! Invariants: nothing is created or changed before the config has been
//! checked against what the devices hold (a config that differs from the
//! engine is refused with what differs); a device that holds data but no
//! engine is never formatted without `--force`; the data directory is held
//! by one process at a time (`DirLock`).

use super::*;

/// A memory device of `size` bytes, every page touched up front if `prealloc`.
pub(super) fn memory(size: u64, prealloc: bool) -> Box<dyn BlockDevice> {
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

pub(super) fn size_of(field: &str, v: &str) -> Result<u64, ServeError> {
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
    pub(super) fn create_engine(
        &self,
        cache: Arc<dyn BlockDevice>,
        capacity: Arc<dyn BlockDevice>,
    ) -> Result<Arc<Engine>, ServeError> {
        let ecfg = self.engine_config()?;
        let disk_bytes = capacity.info().capacity_bytes;
        let specs = (self.volumes.iter())
            .map(|v| Ok(VolumeSpec { name: v.name.clone(), size_bytes: self.volume_bytes(v, disk_bytes)? }))
            .collect::<Result<Vec<_>, ServeError>>()?;
        Ok(Engine::create(cache, capacity, ecfg, &specs)?)
    }

    /// Everything about the devices and the engine's geometry this config
    /// says, checked without opening or creating anything (`preflight`).
    pub(super) fn check_devices(&self) -> Result<(), ServeError> {
        self.device_plan("cache", &self.cache)?;
        self.device_plan("capacity", &self.capacity)?;
        self.engine_config()?;
        for v in self.volumes.iter().filter(|v| v.size != "disk") {
            self.volume_bytes(v, 0)?;
        }
        Ok(())
    }

    /// The engine geometry and layout this config creates.
    fn engine_config(&self) -> Result<EngineConfig, ServeError> {
        let ecfg = EngineConfig {
            chunk_bytes: size_of("engine.chunk_size", &self.engine.chunk_size)?,
            band_bytes: size_of("engine.band_size", &self.engine.band_size)?,
            write_unit_bytes: size_of("engine.write_unit", &self.engine.write_unit)?,
            l2p_dram_bytes: match self.engine.l2p_dram.as_str() {
                "" | "0" => 0,
                s => size_of("engine.l2p_dram", s)?,
            },
            layout: self.layout()?,
            home_sums: self.engine.home_sums,
            ..Default::default()
        };
        Ok(EngineConfig { attached: self.attach()?, ..ecfg })
    }

    /// `[engine] attach`, checked against the rest of the config: an
    /// in-place engine, a capacity device that is a file or a block device,
    /// one volume.
    pub(super) fn attach(&self) -> Result<bool, ServeError> {
        if !self.engine.attach {
            if let Some(v) = self.volumes.iter().find(|v| v.size == "disk") {
                let msg = "size = \"disk\" needs [engine] attach = true".to_string();
                return Err(ServeError::Config { path: format!("volume {}", v.name), msg });
            }
            return Ok(false);
        }
        let bad = |msg: &str| Err(ServeError::Config { path: "engine.attach".into(), msg: msg.into() });
        if self.layout()? != sluice_engine::Layout::InPlace {
            return bad("a cache attaches to a disk in place: set [engine] layout = \"in-place\"");
        }
        if self.capacity.kind != "file" {
            return bad(
                "the disk to attach to is a file or a block device: set [capacity] kind = \"file\" and its path",
            );
        }
        if self.volumes.len() != 1 {
            return bad(
                "an attached cache serves the disk as one volume: list exactly one [[volume]] (size = \"disk\")",
            );
        }
        Ok(true)
    }

    /// Volume `v`'s size: as given, or the whole disk (`size = "disk"`,
    /// rounded down to 4 KiB blocks) of `disk_bytes`.
    pub(super) fn volume_bytes(&self, v: &VolumeConfig, disk_bytes: u64) -> Result<u64, ServeError> {
        match v.size.as_str() {
            "disk" => Ok(disk_bytes / 4096 * 4096),
            s => size_of(&format!("volume {}", v.name), s),
        }
    }

    /// Both devices, for messages.
    pub(super) fn devices_text(&self) -> String {
        format!("cache {} and capacity {}", self.device_label("cache"), self.device_label("capacity"))
    }

    /// The `which` device as an operator names it: its path, or "(memory)".
    pub(super) fn device_label(&self, which: &str) -> String {
        let d = if which == "cache" { &self.cache } else { &self.capacity };
        if d.kind == "file" {
            self.in_data_dir(&d.file_path(which)).display().to_string()
        } else {
            format!("({})", d.kind)
        }
    }

    /// One line per device for the start banner: where it is, its size and
    /// what it emulates.
    pub(super) fn device_lines(&self) -> Vec<String> {
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
    pub(super) fn trace_targets(&self) -> Result<Vec<(&str, Option<TraceTarget>)>, ServeError> {
        self.volumes.iter().map(|v| Ok((v.name.as_str(), v.trace_target(&self.data_dir)?))).collect()
    }

    pub(crate) fn in_data_dir(&self, p: &str) -> PathBuf {
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
    pub(super) fn with_devices<T>(
        &self,
        f: impl FnOnce(&[OpenedDevice]) -> Result<T, ServeError>,
    ) -> Result<T, ServeError> {
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
    pub(super) fn open_device(&self, which: &'static str, d: &DeviceConfig) -> Result<OpenedDevice, ServeError> {
        let attach_disk = which == "capacity" && self.engine.attach;
        let (mut size, zns) = self.device_plan(which, d)?;
        let mut created = None;
        let backend: Box<dyn BlockDevice> = match d.kind.as_str() {
            "memory" => memory(size, d.prealloc),
            "file" => {
                let path = self.in_data_dir(&d.file_path(which));
                let opts = FileOptions {
                    capacity_bytes: (!attach_disk).then_some(size),
                    cache: CacheMode::DirectOrBuffered,
                    allocate: true,
                    // The log: small records and frequent flushes (FileOptions).
                    zero_fill: which == "cache",
                    exclusive: true,
                    ..Default::default()
                };
                let dev = FileDevice::open(&path, &opts).map_err(|source| ServeError::DeviceOpen {
                    which,
                    read_only: false,
                    source,
                })?;
                if attach_disk && size != 0 && size != dev.info().capacity_bytes {
                    return Err(ServeError::Config {
                        path: "capacity.size".into(),
                        msg: format!(
                            "the disk to attach to is {} bytes, not {size} (leave size out to take the disk as it is)",
                            dev.info().capacity_bytes
                        ),
                    });
                }
                size = dev.info().capacity_bytes;
                if dev.created() {
                    created = Some(path);
                }
                Box::new(dev)
            }
            other => unreachable!("kind {other:?} passed device_plan"),
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
                let p = d.hdd_profile(which, each)?;
                let members: Vec<Arc<dyn BlockDevice>> = (0..d.disks)
                    .map(|_| {
                        Arc::new(hdd_device(p.clone(), memory(each, d.prealloc), clock.clone())) as Arc<dyn BlockDevice>
                    })
                    .collect();
                Arc::new(StripedDevice::new(members, 1 << 20))
            }
            "hdd" => Arc::new(hdd_device(d.hdd_profile(which, size / 4096 * 4096)?, backend, clock)),
            "qlc" | "tlc" => {
                // A raw block device's own size decides.
                let p = if d.emulate == "qlc" { SsdProfile::qlc(size) } else { SsdProfile::tlc(size) };
                ssd_fits(which, d, &p, size)?;
                Arc::new(ssd_device(p, backend, clock))
            }
            _ => Arc::new(zns_device(zns.expect("zns profile"), backend, clock)),
        };
        Ok(OpenedDevice { which, dev, fresh, created })
    }

    /// Open the existing file or block device `which` for reading only
    /// (`sluice check`, `serve --read-only`): nothing is created, resized or
    /// allocated, a shared claim (a writer's exclusive one refuses it), and
    /// the medium is not emulated (an emulated device holds its data as
    /// the medium would present it: the file's bytes are the device's). Its
    /// size must be the configured one. Works on a read-only file system.
    pub(super) fn open_device_read_only(
        &self,
        which: &'static str,
        d: &DeviceConfig,
    ) -> Result<Arc<dyn BlockDevice>, ServeError> {
        let attach_disk = which == "capacity" && self.engine.attach;
        let (size, _) = self.device_plan(which, d)?;
        if d.kind != "file" {
            return Err(ServeError::Config {
                path: format!("{which}.kind"),
                msg: "a memory device holds nothing to open read-only".into(),
            });
        }
        let path = self.in_data_dir(&d.file_path(which));
        let opts = FileOptions {
            capacity_bytes: (!(attach_disk && d.size.is_empty())).then_some(size),
            cache: CacheMode::DirectOrBuffered,
            exclusive: true,
            read_only: true,
            ..Default::default()
        };
        let dev = FileDevice::open(&path, &opts).map_err(|source| ServeError::DeviceOpen {
            which,
            read_only: true,
            source,
        })?;
        Ok(Arc::new(dev))
    }

    /// The `which` device's size and ZNS profile as the config gives them,
    /// every value checked (kind, medium, size, prealloc, disks) before
    /// anything is opened or created. The disk a cache attaches to is
    /// opened as it is (never created, resized or allocated): its size may
    /// be left out (0 here), and a size given must be its size.
    fn device_plan(&self, which: &'static str, d: &DeviceConfig) -> Result<(u64, Option<ZnsProfile>), ServeError> {
        let attach_disk = which == "capacity" && self.engine.attach;
        if !matches!(d.kind.as_str(), "memory" | "file") {
            return Err(ServeError::Config {
                path: format!("{which}.kind"),
                msg: format!("unknown kind {:?} (file or memory)", d.kind),
            });
        }
        let mut size = match attach_disk && d.size.is_empty() {
            true => 0,
            false => size_of(&format!("{which}.size"), &d.size)?,
        };
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
        if let Some(p) = &ssd {
            ssd_fits(which, d, p, size)?;
        }
        d.hdd_profile(which, size)?;
        Ok((size, zns))
    }

    /// `[engine] compaction_start` and `compaction_setpoint`, or the
    /// layout's defaults. In place, the compactor's reclaims clean live data
    /// home and evict it: they start only near a full log (a Spark job with
    /// half the cache it needed ran 62.0 s with reclaims from half the log
    /// free, 55.7 s from a tenth; docs/results/2026-11-26-hadoop.md).
    pub(super) fn compactor(&self, layout: sluice_engine::Layout) -> CompactorConfig {
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
    pub(super) fn cleaning(&self) -> Result<sluice_engine::Cleaning, ServeError> {
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
    pub(super) fn layout(&self) -> Result<sluice_engine::Layout, ServeError> {
        (self.engine.layout.parse())
            .map_err(|e: EngineError| ServeError::Config { path: "engine.layout".into(), msg: e.to_string() })
    }

    /// What in this config differs from the engine on the devices, one line
    /// each (empty: nothing).
    pub(super) fn differences(&self, sb: &Superblock, zoned: bool) -> Result<Vec<String>, ServeError> {
        let mut out = Vec::new();
        let in_place = sb.layout != sluice_engine::persist::LAYOUT_BANDS;
        let attached = sb.layout == sluice_engine::persist::LAYOUT_ATTACHED;
        if attached != self.engine.attach {
            let have = if attached { "attached to its disk" } else { "not attached (it owns its capacity device)" };
            out.push(format!(
                "engine.attach: the config says {}, the engine on the devices is {have}",
                self.engine.attach
            ));
        }
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
            let want = self.volume_bytes(v, sb.capacity_bytes)?;
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
pub(super) const SERVE_ZONE_SHRINK: u64 = 64;

/// The data directory's lock: held (an exclusive `flock` on
/// `DATA_DIR/sluice.lock`, which holds the owner's PID) for as long as this
/// value lives. The kernel drops it when the process ends, however it ends,
/// so a stale PID in the file never blocks a start.
pub struct DirLock {
    _file: Option<std::fs::File>,
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
        let path = data_dir.join("sluice.lock");
        let io = |what: &str, source| ServeError::Io { what: format!("{what} {}", path.display()), source };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io("opening the lock file", e))?;
        if let Err(e) = rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            if e != rustix::io::Errno::WOULDBLOCK {
                return Err(io("locking", e.into()));
            }
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Err(ServeError::Locked { dir: data_dir.to_path_buf(), holder: holder.trim().to_string() });
        }
        let pid = format!("{}\n", std::process::id());
        file.set_len(0).map_err(|e| io("writing", e))?;
        file.rewind().map_err(|e| io("writing", e))?;
        file.write_all(pid.as_bytes()).map_err(|e| io("writing", e))?;
        Ok(DirLock { _file: Some(file) })
    }

    /// A reader's lock on `data_dir` (`sluice check`, `serve --read-only`):
    /// shared, so readers run together while a server holding the
    /// exclusive lock refuses them, and taken through a read-only
    /// descriptor, so it works on a read-only file system. No lock file
    /// (never served here, and none can be created): nothing to lock
    /// against, and the devices' own shared claims still refuse a writer.
    pub fn take_shared(data_dir: &Path) -> Result<DirLock, ServeError> {
        use std::io::Read;
        let path = data_dir.join("sluice.lock");
        let io = |what: &str, source| ServeError::Io { what: format!("{what} {}", path.display()), source };
        let mut file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DirLock { _file: None }),
            Err(e) => return Err(io("opening the lock file", e)),
        };
        if let Err(e) = rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockShared) {
            if e != rustix::io::Errno::WOULDBLOCK {
                return Err(io("locking", e.into()));
            }
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Err(ServeError::Locked { dir: data_dir.to_path_buf(), holder: holder.trim().to_string() });
        }
        Ok(DirLock { _file: Some(file) })
    }
}

/// A device as `sluice serve` opened it.
pub(super) struct OpenedDevice {
    which: &'static str,
    pub(super) dev: Arc<dyn BlockDevice>,
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
    /// Reopened read-only from a clean shutdown: nothing is written.
    ReadOnly,
    /// Created on a fresh cache device by this start, attached to a disk
    /// that holds data (not written).
    Attached,
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
/// An emulated SSD of `size` bytes must be whole erase blocks, at least 64.
fn ssd_fits(which: &str, d: &DeviceConfig, p: &SsdProfile, size: u64) -> Result<(), ServeError> {
    let erase_block = p.erase_block_ius as u64 * p.iu_bytes;
    if size.is_multiple_of(erase_block) && size >= 64 * erase_block {
        return Ok(());
    }
    let msg = format!(
        "{} needs a size that is a multiple of {} MiB and at least {} MiB",
        d.emulate,
        erase_block >> 20,
        (64 * erase_block) >> 20
    );
    Err(ServeError::Config { path: format!("{which}.emulate"), msg })
}

/// Whether `serve` opens the engine read-only: every volume is read-only
/// (`--read-only`, or `read_only = true` on each) and both devices are files
/// that exist (an engine to serve). Then nothing is ever written, so it
/// runs on a read-only file system (`open_engine_read_only`).
pub fn serves_read_only(cfg: &Config) -> bool {
    !cfg.volumes.is_empty() && cfg.volumes.iter().all(|v| v.read_only) && existing_devices(cfg, "serve").is_ok()
}

/// The engine on existing devices, opened read-only: the devices opened
/// read-only with shared claims, the config compared with what is on them,
/// and an engine that was not shut down cleanly refused (recovery writes).
pub fn open_engine_read_only(cfg: &Config) -> Result<(Arc<Engine>, Opened), ServeError> {
    let cache = cfg.open_device_read_only("cache", &cfg.cache)?;
    let capacity = cfg.open_device_read_only("capacity", &cfg.capacity)?;
    let sb = Engine::inspect(&*cache, &*capacity)?;
    let diff = cfg.differences(&sb, capacity.info().zoned)?;
    if !diff.is_empty() {
        return Err(ServeError::ConfigDiffers(diff));
    }
    let opts = sluice_engine::OpenOptions { read_only: true, ..Default::default() };
    Ok((Engine::open_with(cache, capacity, opts)?, Opened::ReadOnly))
}

pub fn open_engine(cfg: &Config) -> Result<(Arc<Engine>, Opened), ServeError> {
    cfg.with_devices(|opened| open_engine_on(cfg, opened))
}

pub(super) fn open_engine_on(cfg: &Config, opened: &[OpenedDevice]) -> Result<(Arc<Engine>, Opened), ServeError> {
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
    // Attaching: the disk holds data by design; only the cache device must
    // be fresh.
    let attach = cfg.attach()?;
    if let Some(d) = opened.iter().find(|d| !(d.fresh || attach && d.which == "capacity")) {
        return Err(ServeError::NotFresh { which: d.which, path: cfg.device_label(d.which) });
    }
    let how = if attach { Opened::Attached } else { Opened::Created };
    Ok((cfg.create_engine(cache, capacity)?, how))
}

/// Where a device holds something other than zeros: its first and last
/// 16 MiB and 256 places spread evenly over the rest, 64 KiB each (a sample:
/// reading a whole multi-terabyte device would take hours). The offset of
/// the first non-zero byte found.
pub(super) fn sampled_data(dev: &dyn BlockDevice) -> Result<Option<u64>, ServeError> {
    let bytes = dev.info().capacity_bytes;
    let edge = (16u64 << 20).min(bytes);
    let mut places = vec![(0, edge), (bytes - edge, edge)];
    let step = (bytes / 257).max(64 << 10) / 4096 * 4096;
    places.extend((1..=256u64).map(|i| i * step).filter(|&o| o + (64 << 10) <= bytes).map(|o| (o, 64 << 10)));
    for (at, len) in places {
        let mut off = 0;
        while off < len {
            let n = (len - off).min(4 << 20);
            let b = sluice_media::device::read_at(dev, at + off, n as usize).map_err(|source| {
                ServeError::DeviceIo { what: format!("reading the device at byte {}", at + off), source }
            })?;
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

pub(super) fn format_on(cfg: &Config, force: bool, opened: &[OpenedDevice]) -> Result<String, ServeError> {
    let (cache, capacity) = (opened[0].dev.clone(), opened[1].dev.clone());
    let mut found = Vec::new();
    let engine_err = |e: sluice_media::DeviceError| ServeError::Engine(EngineError::Device(e));
    if let Some(u) = sluice_engine::engine::superblock_present(&*cache).map_err(engine_err)? {
        found.push(format!("the cache device holds engine {}", sluice_engine::persist::uuid_text(&u)));
    }
    if cfg.attach()? {
        return attach_on(cfg, force, opened, found);
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

/// `sluice format` of an attached cache: only the cache device is written
/// (and only it is said to be destroyed); the disk keeps what it holds.
fn attach_on(cfg: &Config, force: bool, opened: &[OpenedDevice], mut found: Vec<String>) -> Result<String, ServeError> {
    let (cache, capacity) = (opened[0].dev.clone(), opened[1].dev.clone());
    if found.is_empty() && !opened[0].fresh {
        if let Some(at) = sampled_data(&*cache)? {
            found.push(format!("the cache device {} holds data (at byte {at})", cfg.device_label("cache")));
        }
    }
    if !found.is_empty() && !force {
        return Err(ServeError::FormatRefused(found));
    }
    if force {
        sluice_engine::engine::wipe_superblock(&*cache).map_err(|e| ServeError::Engine(EngineError::Device(e)))?;
    }
    let disk_bytes = capacity.info().capacity_bytes;
    let engine = cfg.create_engine(cache, capacity)?;
    engine.shutdown()?;
    let uuid = sluice_engine::persist::uuid_text(&engine.uuid());
    let mut text = format!(
        "sluice: attached engine {uuid}: formatted the cache device {}; the disk {} ({disk_bytes} bytes) was not \
         written: volume {:?} serves what it holds",
        cfg.device_label("cache"),
        cfg.device_label("capacity"),
        cfg.volumes[0].name
    );
    if !found.is_empty() {
        text += &format!(" (destroyed on the cache device: {})", found.join("; "));
    }
    Ok(text)
}

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

/// `sluice scrub`: open an in-place engine (the server stopped), record the
/// checksum of every home that has none (an attached disk's existing data,
/// or sums a crash lost), shut it down cleanly; returns what to tell the
/// operator. Reads that meet a home that no longer matches its checksum
/// then fail with EIO instead of returning it.
pub fn scrub(cfg: &Config) -> Result<String, ServeError> {
    let (cache, capacity) = existing_devices(cfg, "sluice scrub")?;
    let _lock = DirLock::take(&cfg.data_dir)?;
    let (cache, capacity) = (cfg.open_device("cache", cache)?.dev, cfg.open_device("capacity", capacity)?.dev);
    let e = Engine::open(cache, capacity)?;
    let r = e.scrub_homes();
    e.shutdown()?;
    let c = r?;
    Ok(format!(
        "sluice: {} homes verified, {} unverified (a home whose checksum happens to be 0), {} table pages unreadable\n",
        c.verified, c.unverified, c.pages_unreadable
    ))
}

/// The config's two devices, which must be files that exist (`what`: the
/// command, for the error).
pub(super) fn existing_devices<'a>(
    cfg: &'a Config,
    what: &str,
) -> Result<(&'a DeviceConfig, &'a DeviceConfig), ServeError> {
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
            return Err(ServeError::DeviceMissing { which, path });
        }
    }
    Ok((&cfg.cache, &cfg.capacity))
}

/// `sluice check --salvage`: act on exactly what `sluice check` finds. The
/// scan first; then a salvaging open, from the media rather than the
/// checkpoint when the scan found the checkpoint damaged or disagreeing
/// (recovery accepts and repairs damaged log records and bands); then every
/// damaged data block the scan found is trimmed; a clean shutdown; and the
/// scan again, which must find nothing. Lists each thing it did.
fn salvage_found(cfg: &Config) -> Result<(String, bool), ServeError> {
    use sluice_engine::Damage;
    let _lock = DirLock::take(&cfg.data_dir)?;
    let cache = cfg.open_device("cache", &cfg.cache)?.dev;
    let capacity = cfg.open_device("capacity", &cfg.capacity)?.dev;
    let before = Engine::check(cache.clone(), capacity.clone())?;
    let checkpoint =
        before.damage.iter().any(|d| matches!(d, Damage::Checkpoint { .. } | Damage::CheckpointUnreadable));
    let opts = sluice_engine::OpenOptions { salvage: true, ignore_checkpoint: checkpoint, ..Default::default() };
    let e = Engine::open_with(cache.clone(), capacity.clone(), opts)?;
    let mut lines: Vec<String> = Vec::new();
    if checkpoint {
        lines.push("  rebuilt every map from the media: the checkpoint did not check or disagreed with them".into());
    }
    lines.extend(e.salvaged().iter().map(|d| format!("  accepted: {d}")));
    let trimmed = match e.salvage_found(&before.damage) {
        Ok(t) => t,
        Err(err) => {
            let _ = e.shutdown();
            return Err(err.into());
        }
    };
    lines.extend(trimmed.iter().map(|d| format!("  trimmed (now reads as zeros): {d}")));
    e.shutdown()?;
    drop(e);
    let after = Engine::check(cache, capacity)?;
    let mut text = if lines.is_empty() {
        "sluice: nothing to salvage (sluice check finds no damage); the engine is shut down cleanly\n".to_string()
    } else {
        format!(
            "sluice: salvaged {} finding(s) (damaged blocks now read as zeros; what damaged log records held \
             reverted to older copies):\n{}\n",
            lines.len(),
            lines.join("\n")
        )
    };
    let damaged = !after.damage.is_empty();
    if damaged {
        text += &format!("sluice: still damaged after salvaging:\n{}", after.text());
    } else {
        text += "sluice: sluice check now finds no damage\n";
    }
    Ok((text, damaged))
}

/// `sluice check`: scan both devices read-only and report (text or JSON);
/// with `salvage`, open accepting the damage (docs/serve.md) and shut down
/// cleanly. Returns the report text and whether damage was found.
pub fn check(cfg: &Config, json: bool, salvage: bool) -> Result<(String, bool), ServeError> {
    existing_devices(cfg, "sluice check")?;
    if salvage {
        return salvage_found(cfg);
    }
    // A read-only scan: a reader's lock, the devices opened read-only (it
    // runs on a read-only file system; a running server refuses it).
    let _lock = DirLock::take_shared(&cfg.data_dir)?;
    let cache = cfg.open_device_read_only("cache", &cfg.cache)?;
    let capacity = cfg.open_device_read_only("capacity", &cfg.capacity)?;
    let report = Engine::check(cache, capacity)?;
    let damaged = !report.damage.is_empty();
    let text = if json { serde_json::to_string_pretty(&report)? + "\n" } else { report.text() };
    Ok((text, damaged))
}
