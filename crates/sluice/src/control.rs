//! The control socket: a running server's operator commands, as `casadm`
//! gives Open CAS (`sluice cache status`, `stats`, `set-mode`,
//! `set-class`, `clean`, `detach`, `attach`; docs/operate.md).
//!
//! Owns: the Unix socket in the data directory (`control_socket`, mode
//! 0600: only the server's user may command it), its accept thread and
//! one thread per connection, and the wire format — one JSON request per
//! connection, on one line; the answer is JSON lines: `{"progress": …}`
//! lines while a clean runs, then one `{"ok": …}` or `{"error": "…"}`.
//!
//! Invariants:
//! - A request that does not parse, names no volume or class the engine
//!   has, or asks for a value out of range changes nothing and is answered
//!   with an error saying why.
//! - Every change is logged on the server's stderr with what it was
//!   before and after (`sluice: control: …`).
//! - At most `CONNECTIONS_MAX` connections are served at once; one more
//!   gets an error line and is closed.
//! - A clean runs in steps (`Engine::clean_step`), the engine lock let go
//!   between them, so requests go on; a client that goes away (Ctrl-C)
//!   stops it after the step in flight, and the next clean resumes it:
//!   what went home is clean, the rest is still dirty.
//!
//! Why a socket and not signals or the config: an operator asks questions
//! (status, stats) and gets answers, and a clean reports progress and can
//! be stopped; SIGHUP can do neither. Why JSON lines: every answer is also
//! the `--json` output, so scripts and the table read the same numbers.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sluice_engine::{CacheMode, CachePolicy, Engine};

/// Bytes written home per clean step by default: small enough that
/// progress shows and a stop is prompt, large enough that runs stay long.
pub const CLEAN_STEP_BYTES: u64 = 16 << 20;

/// Longest request line accepted.
const REQUEST_BYTES_MAX: u64 = 64 * 1024;

/// Control connections served at once; more are answered with an error
/// and closed (a clean holds its connection for as long as it runs).
const CONNECTIONS_MAX: usize = 16;

/// A request on the control socket.
#[derive(Debug, Deserialize, Serialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    Status,
    Stats,
    SetMode {
        volume: String,
        mode: String,
    },
    SetClass {
        volume: String,
        class: String,
        share: f64,
    },
    /// Write every dirty block home (`detach`: after making every volume
    /// pass-through, so nothing new is cached).
    Clean {
        #[serde(default)]
        detach: bool,
        /// Bytes written home per step (whole blocks; default
        /// `CLEAN_STEP_BYTES`).
        #[serde(default)]
        step_bytes: Option<u64>,
    },
    /// Every volume back to the mode the server's config gives it.
    Attach,
}

/// What the control socket needs of the running server.
pub struct Control {
    pub engine: Arc<Engine>,
    /// Each volume's mode as the config gives it (what `attach` restores);
    /// a reload sets it again.
    pub configured: std::sync::Mutex<Vec<(String, CacheMode)>>,
    /// The devices, one line each, as the start printed them.
    pub devices: Vec<String>,
    /// The metrics endpoint's address, if it serves one (`sluice stats
    /// --data-dir` finds it here).
    pub metrics: Option<String>,
    pub layout: String,
}

/// Listen on `path` (a stale socket left by a server that was killed is
/// replaced: the caller holds the data directory's lock, so no live server
/// uses it).
pub fn spawn(path: &Path, control: Arc<Control>) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if m.file_type().is_socket() {
            std::fs::remove_file(path)?;
        }
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::Builder::new().name("control".into()).spawn(move || {
        use std::sync::atomic::Ordering::SeqCst;
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            if open.fetch_add(1, SeqCst) >= CONNECTIONS_MAX {
                open.fetch_sub(1, SeqCst);
                let busy = json!({ "error": format!("{CONNECTIONS_MAX} control connections are open already") });
                let _ = writeln!(conn, "{busy}");
                continue;
            }
            let (control, mine) = (control.clone(), open.clone());
            let spawned = std::thread::Builder::new().name("control-conn".into()).spawn(move || {
                let _ = serve(conn, &control);
                mine.fetch_sub(1, SeqCst);
            });
            if spawned.is_err() {
                open.fetch_sub(1, SeqCst);
            }
        }
    })?;
    Ok(path.to_path_buf())
}

fn serve(conn: UnixStream, c: &Control) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = String::new();
    BufReader::new((&conn).take(REQUEST_BYTES_MAX)).read_line(&mut line)?;
    let mut out = &conn;
    let answer = match serde_json::from_str::<Request>(line.trim()) {
        Err(e) => Err(format!("bad request: {e}")),
        Ok(req) => answer(c, req, &mut |progress| {
            // A client that went away stops the clean.
            writeln!(out, "{}", json!({ "progress": progress })).is_ok()
        }),
    };
    let reply = match answer {
        Ok(v) => json!({ "ok": v }),
        Err(e) => json!({ "error": e }),
    };
    writeln!(out, "{reply}")
}

/// Carry out one request; `progress` is told each clean step and returns
/// false when the client is gone.
fn answer(c: &Control, req: Request, progress: &mut dyn FnMut(Value) -> bool) -> Result<Value, String> {
    let e = &c.engine;
    let err = |x: sluice_engine::EngineError| x.to_string();
    match req {
        Request::Status => Ok(status(c)),
        Request::Stats => Ok(stats(e)),
        Request::SetMode { volume, mode } => {
            let new: CacheMode = mode.parse().map_err(err)?;
            let old = policy_of(e, &volume)?;
            e.set_cache_policy(&volume, CachePolicy { mode: new, ..old }).map_err(err)?;
            let line =
                format!("volume {volume}: mode {} -> {}", CacheMode::short_name(old.mode), CacheMode::short_name(new));
            eprintln!("sluice: control: {line}");
            Ok(json!({ "changed": line }))
        }
        Request::SetClass { volume, class, share } => {
            let old = e.set_class_share(&volume, &class, share).map_err(err)?;
            let line = format!("volume {volume}: class {class}: share {old} -> {share}");
            eprintln!("sluice: control: {line}");
            Ok(json!({ "changed": line }))
        }
        Request::Attach => {
            let mut changed = Vec::new();
            let configured = c.configured.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            for (volume, mode) in &configured {
                let old = policy_of(e, volume)?;
                if old.mode != *mode {
                    e.set_cache_policy(volume, CachePolicy { mode: *mode, ..old }).map_err(err)?;
                    changed.push(format!(
                        "volume {volume}: mode {} -> {}",
                        CacheMode::short_name(old.mode),
                        CacheMode::short_name(*mode)
                    ));
                }
            }
            match changed.is_empty() {
                true => eprintln!("sluice: control: attach: every volume already runs its configured mode"),
                false => eprintln!("sluice: control: attach: {}", changed.join("; ")),
            }
            Ok(json!({ "changed": changed }))
        }
        Request::Clean { detach, step_bytes } => {
            let blocks = step_bytes.unwrap_or(CLEAN_STEP_BYTES) / 4096;
            if blocks == 0 {
                return Err("step_bytes is at least one 4 KiB block".into());
            }
            clean(c, detach, blocks, progress)
        }
    }
}

fn policy_of(e: &Engine, volume: &str) -> Result<CachePolicy, String> {
    let report = e.cache_report();
    if report.is_empty() {
        return Err("cache commands apply to an in-place engine ([engine] layout = \"in-place\")".into());
    }
    (report.into_iter().find(|r| r.volume == volume))
        .map(|r| r.policy)
        .ok_or_else(|| format!("no volume named {volume:?}"))
}

fn clean(
    c: &Control,
    detach: bool,
    step_blocks: u64,
    progress: &mut dyn FnMut(Value) -> bool,
) -> Result<Value, String> {
    let e = &c.engine;
    let err = |x: sluice_engine::EngineError| x.to_string();
    let report = e.cache_report();
    if report.is_empty() {
        return Err("cleaning applies to an in-place engine ([engine] layout = \"in-place\")".into());
    }
    if detach {
        let mut changed = Vec::new();
        for r in report.iter().filter(|r| r.policy.mode != CacheMode::PassThrough) {
            e.set_cache_policy(&r.volume, CachePolicy { mode: CacheMode::PassThrough, ..r.policy }).map_err(err)?;
            changed.push(format!("volume {}: mode {} -> pt", r.volume, CacheMode::short_name(r.policy.mode)));
        }
        if !changed.is_empty() {
            eprintln!("sluice: control: detach: {}", changed.join("; "));
        }
    }
    let dirty_at_start: u64 = report.iter().map(|r| r.dirty_bytes).sum();
    eprintln!("sluice: control: clean started: {} MiB dirty", dirty_at_start >> 20);
    let mut cleaned = 0u64;
    loop {
        let step = e.clean_step(step_blocks).map_err(err)?;
        cleaned += step.cleaned_bytes;
        let done = step.dirty_bytes == 0 || step.cleaned_bytes == 0;
        if done {
            eprintln!(
                "sluice: control: clean done: {} MiB written home, {} MiB dirty{}",
                cleaned >> 20,
                step.dirty_bytes >> 20,
                if detach { "; every volume pass-through: the disk alone holds every volume" } else { "" }
            );
            return Ok(json!({ "cleaned_bytes": cleaned, "dirty_bytes": step.dirty_bytes, "detached": detach }));
        }
        if !progress(json!({ "cleaned_bytes": cleaned, "dirty_bytes": step.dirty_bytes })) {
            eprintln!(
                "sluice: control: clean stopped by its client after {} MiB written home; {} MiB still dirty (a \
                 new clean resumes)",
                cleaned >> 20,
                step.dirty_bytes >> 20
            );
            return Ok(json!({ "cleaned_bytes": cleaned, "dirty_bytes": step.dirty_bytes, "stopped": true }));
        }
    }
}

fn status(c: &Control) -> Value {
    let e = &c.engine;
    let snap = e.snapshot();
    let log_bytes = snap.log_chunks * snap.log_chunk_bytes;
    let volumes: Vec<Value> = (snap.volumes.iter())
        .map(|v| {
            let r = snap.cache.iter().find(|r| r.volume == v.name);
            let classes: Vec<Value> = match (r, e.io_classes(&v.name)) {
                (Some(r), Ok(defs)) => (r.classes.iter())
                    .map(|cl| {
                        let share = defs.iter().find(|d| d.name == cl.class).map_or(1.0, |d| d.share);
                        json!({ "class": cl.class, "share": share, "cached_bytes": cl.cached_bytes })
                    })
                    .collect(),
                _ => Vec::new(),
            };
            match r {
                Some(r) => json!({
                    "name": v.name,
                    "size_bytes": v.size_bytes,
                    "mode": CacheMode::short_name(r.policy.mode),
                    "policy": r.policy,
                    "cached_bytes": r.cached_bytes,
                    "dirty_bytes": r.dirty_bytes,
                    "clean_bytes": r.cached_bytes.saturating_sub(r.dirty_bytes),
                    "classes": classes,
                }),
                None => json!({ "name": v.name, "size_bytes": v.size_bytes, "mode": "log" }),
            }
        })
        .collect();
    let cached: u64 = snap.cache.iter().map(|r| r.cached_bytes).sum();
    let dirty: u64 = snap.cache.iter().map(|r| r.dirty_bytes).sum();
    let cleaning = e.cleaning();
    json!({
        "layout": c.layout,
        "devices": c.devices,
        "metrics": c.metrics,
        "state": match (&snap.stopped_by, snap.failed) {
            (Some(why), _) => format!("stopped: {why}"),
            (None, true) => "stopped".to_string(),
            (None, false) => "serving".to_string(),
        },
        "cache_bytes": log_bytes,
        "cached_bytes": cached,
        "dirty_bytes": dirty,
        "occupancy": if log_bytes > 0 { cached as f64 / log_bytes as f64 } else { 0.0 },
        "log_chunks": snap.log_chunks,
        "log_chunks_free": snap.log_chunks_free,
        "cleaning": {
            "mode": format!("{:?}", cleaning.mode).to_lowercase(),
            "dirty_setpoint": cleaning.dirty_setpoint,
            "age_s": cleaning.age.as_secs_f64(),
            "idle_s": cleaning.idle.as_secs_f64(),
        },
        "volumes": volumes,
    })
}

/// Totals since the engine opened, per volume and per class, and summed:
/// the same counters the metrics endpoint exports (`sluice_cache_*`).
fn stats(e: &Engine) -> Value {
    let report = e.cache_report();
    let mut total = serde_json::Map::new();
    let volumes: Vec<Value> = (report.iter())
        .map(|r| {
            if let Ok(Value::Object(m)) = serde_json::to_value(r.stats) {
                for (k, v) in m {
                    let sum = total.get(&k).and_then(Value::as_u64).unwrap_or(0) + v.as_u64().unwrap_or(0);
                    total.insert(k, json!(sum));
                }
            }
            json!({
                "volume": r.volume,
                "mode": CacheMode::short_name(r.policy.mode),
                "cached_bytes": r.cached_bytes,
                "dirty_bytes": r.dirty_bytes,
                "stats": r.stats,
                "classes": r.classes,
            })
        })
        .collect();
    json!({ "total": total, "volumes": volumes })
}

/// Where the server running with `cfg` listens for control requests.
pub fn socket_of(cfg: &crate::serve::Config) -> Result<PathBuf, String> {
    if cfg.control_socket.is_empty() {
        return Err("the config sets control_socket = \"\": the server listens for no commands".into());
    }
    Ok(cfg.in_data_dir(&cfg.control_socket))
}

/// Client side: send `req` to the socket at `path`; each progress value is
/// handed to `on_progress`; the final answer is returned.
pub fn request(path: &Path, req: &Request, on_progress: &mut dyn FnMut(&Value)) -> Result<Value, String> {
    let conn = UnixStream::connect(path).map_err(|e| {
        format!(
            "cannot reach a server's control socket at {}: {e} (is `sluice serve` running with this data directory? \
             `control_socket` in its config names the socket)",
            path.display()
        )
    })?;
    let mut w = &conn;
    let text = serde_json::to_string(req).map_err(|e| e.to_string())?;
    writeln!(w, "{text}").map_err(|e| format!("sending to {}: {e}", path.display()))?;
    for line in BufReader::new(&conn).lines() {
        let line = line.map_err(|e| format!("reading from {}: {e}", path.display()))?;
        let v: Value = serde_json::from_str(&line).map_err(|e| format!("the server's answer does not parse: {e}"))?;
        if let Some(p) = v.get("progress") {
            on_progress(p);
        } else if let Some(ok) = v.get("ok") {
            return Ok(ok.clone());
        } else if let Some(err) = v.get("error") {
            return Err(err.as_str().unwrap_or("error").to_string());
        }
    }
    Err(format!("the server at {} closed the connection without an answer", path.display()))
}
