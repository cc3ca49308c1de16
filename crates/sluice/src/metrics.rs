//! The metrics endpoint (Prometheus text format 0.0.4 over HTTP/1.x) and the
//! `sluice stats` client that reads it.
//!
//! `GET /metrics` renders one [`EngineSnapshot`] plus the NBD servers'
//! connection counters. Every counter only grows (`_total`); rates are left to
//! the reader: `sluice stats` scrapes twice, `--interval` apart, and divides.
//!
//! The listener is deliberately small and bounded: one request at a time, a
//! request head of at most `REQUEST_BYTES_MAX`, a `IO_TIMEOUT` on every read
//! and write, so a stuck or hostile scraper costs a bounded wait and never
//! memory. Anything but `GET /metrics` gets 404 or 400.

use serde::Serialize;
use sluice_engine::metrics::QUANTILES;
use sluice_engine::{CacheReport, Engine, EngineSnapshot};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

const REQUEST_BYTES_MAX: usize = 8192;
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// Connection counters of the NBD listeners, summed.
#[derive(Clone, Copy, Debug, Default)]
pub struct NbdCounters {
    pub connections_open: u64,
    pub connections_accepted: u64,
    pub connections_refused: u64,
    pub connections_failed: u64,
    pub requests: u64,
    pub request_errors: u64,
}

/// Flatten a serializable struct of numbers into (field, value).
fn fields(v: &impl Serialize) -> Vec<(String, f64)> {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(m)) => m.into_iter().filter_map(|(k, v)| v.as_f64().map(|x| (k, x))).collect(),
        _ => Vec::new(),
    }
}

/// A label value escaped as the text exposition format requires
/// (backslash, double quote and line feed).
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A metric family's HELP and TYPE lines.
fn family(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// The Prometheus text for one snapshot.
pub fn render(s: &EngineSnapshot, nbd: &NbdCounters) -> String {
    let mut o = String::new();
    family(&mut o, "sluice_volume_size_bytes", "gauge", "Size of the volume.");
    for v in &s.volumes {
        let _ = writeln!(o, "sluice_volume_size_bytes{{volume=\"{}\"}} {}", esc(&v.name), v.size_bytes);
    }
    for (metric, help) in [
        ("ops_total", "Requests completed (ok or not)."),
        ("bytes_total", "Bytes of successful requests."),
        ("errors_total", "Requests that failed."),
    ] {
        let name = format!("sluice_volume_{metric}");
        family(&mut o, &name, "counter", help);
        for v in &s.volumes {
            for op in &v.ops {
                let x = match metric {
                    "ops_total" => op.count,
                    "bytes_total" => op.bytes,
                    _ => op.errors,
                };
                let _ = writeln!(o, "{name}{{volume=\"{}\",op=\"{}\"}} {x}", esc(&v.name), op.op);
            }
        }
    }
    family(
        &mut o,
        "sluice_volume_checksum_errors_total",
        "counter",
        "Reads that found a block not matching its CRC32C (failed with EIO).",
    );
    for v in &s.volumes {
        let _ = writeln!(o, "sluice_volume_checksum_errors_total{{volume=\"{}\"}} {}", esc(&v.name), v.checksum_errors);
    }
    family(&mut o, "sluice_volume_latency_seconds", "summary", "Request latency since start (log-linear, ±12.5 %).");
    for v in &s.volumes {
        for op in &v.ops {
            for (q, us) in QUANTILES.iter().zip(op.latency_us) {
                let _ = writeln!(
                    o,
                    "sluice_volume_latency_seconds{{volume=\"{}\",op=\"{}\",quantile=\"{q}\"}} {}",
                    esc(&v.name),
                    op.op,
                    us / 1e6
                );
            }
            let _ = writeln!(
                o,
                "sluice_volume_latency_seconds_sum{{volume=\"{}\",op=\"{}\"}} {}",
                esc(&v.name),
                op.op,
                op.latency_sum_s
            );
            let _ = writeln!(
                o,
                "sluice_volume_latency_seconds_count{{volume=\"{}\",op=\"{}\"}} {}",
                esc(&v.name),
                op.op,
                op.count
            );
        }
    }
    for (k, x) in fields(&s.stats) {
        let name = format!("sluice_engine_{k}_total");
        family(&mut o, &name, "counter", "Engine counter (docs/engine.md).");
        let _ = writeln!(o, "{name} {x}");
    }
    let gauges = [
        ("sluice_engine_host_waf", "Bytes written to both devices / bytes users wrote.", s.host_waf),
        ("sluice_cache_log_chunks", "Chunks of the write log.", s.log_chunks as f64),
        ("sluice_cache_log_chunks_free", "Free chunks of the write log.", s.log_chunks_free as f64),
        ("sluice_cache_log_chunk_bytes", "Size of one log chunk.", s.log_chunk_bytes as f64),
        ("sluice_cache_valid_bytes", "Current (not yet compacted) data in the log.", s.cache_valid_bytes as f64),
        (
            "sluice_cache_occupancy_ratio",
            "Share of the log's chunks in use.",
            (s.log_chunks - s.log_chunks_free) as f64 / s.log_chunks.max(1) as f64,
        ),
        ("sluice_capacity_bands", "Bands of the capacity device.", s.bands as f64),
        ("sluice_capacity_bands_free", "Free bands of the capacity device.", s.bands_free as f64),
        ("sluice_capacity_band_bytes", "Size of one band.", s.band_bytes as f64),
        ("sluice_engine_failed", "1 if a device error stopped changes until reopen.", s.failed as u8 as f64),
        ("sluice_nbd_connections", "NBD connections open now.", nbd.connections_open as f64),
        ("sluice_compactor_running", "1 while the background compactor runs.", s.compactor.running as u8 as f64),
        (
            "sluice_cache_cleaning_rate_bytes_per_second",
            "In place: the rate ALRU cleaning is paced to past its dirty set point (0 when not paced).",
            s.compactor.cleaning_rate_bytes_per_s,
        ),
        (
            "sluice_compactor_bandwidth_bytes_per_second",
            "Log bytes the compactor frees per second of work (moving average): the rate writes are paced to at the set point.",
            s.compactor.bandwidth_bytes_per_s,
        ),
    ];
    for (name, help, x) in gauges {
        family(&mut o, name, "gauge", help);
        let _ = writeln!(o, "{name} {x}");
    }
    for (name, help, x) in [
        ("sluice_nbd_connections_accepted_total", "NBD connections accepted.", nbd.connections_accepted),
        ("sluice_nbd_connections_refused_total", "NBD connections refused (over the bound).", nbd.connections_refused),
        ("sluice_nbd_connections_failed_total", "NBD connections ended by an error.", nbd.connections_failed),
        ("sluice_nbd_requests_total", "NBD requests answered.", nbd.requests),
        ("sluice_nbd_request_errors_total", "NBD requests answered with an error.", nbd.request_errors),
        (
            "sluice_compactor_chunks_total",
            "Log chunks compacted by the background compactor (the rest of sluice_engine_chunks_compacted_total were compacted inline).",
            s.compactor.compactions,
        ),
        ("sluice_compactor_throttled_writes_total", "Writes the set-point controller delayed.", s.compactor.throttled_writes),
        (
            "sluice_compactor_windows_read_unlocked_total",
            "Compaction and GC windows read without the engine lock.",
            s.compactor.windows_read_unlocked,
        ),
        (
            "sluice_compactor_windows_reread_total",
            "Windows read without the lock, then again under it (their chunk or band moved on meanwhile).",
            s.compactor.windows_reread,
        ),
        (
            "sluice_compactor_copies_superseded_total",
            "Blocks background compaction/GC copied to the capacity device but did not remap: rewritten or trimmed while the copy was in flight (counted in the compaction/GC bytes written).",
            s.compactor.copies_superseded,
        ),
        (
            "sluice_gc_victims_unread_total",
            "GC victims reclaimed without being read (nothing valid and no tombstone left in them).",
            s.compactor.victims_unread,
        ),
    ] {
        family(&mut o, name, "counter", help);
        let _ = writeln!(o, "{name} {x}");
    }
    for (name, help, x) in [
        (
            "sluice_compactor_seconds_total",
            "Time the background compactor spent compacting.",
            s.compactor.compaction_seconds,
        ),
        (
            "sluice_compactor_throttle_seconds_total",
            "Time writes were delayed by the set-point controller.",
            s.compactor.throttle_seconds,
        ),
    ] {
        family(&mut o, name, "counter", help);
        let _ = writeln!(o, "{name} {x}");
    }
    let devices = [("cache", &s.cache_device), ("capacity", &s.capacity_device)];
    let (cache_fields, capacity_fields) = (fields(&s.cache_device), fields(&s.capacity_device));
    // Both are the same struct: the same fields in the same order.
    for ((k, cache_x), (_, capacity_x)) in cache_fields.iter().zip(&capacity_fields) {
        let name = format!("sluice_device_{k}_total");
        family(&mut o, &name, "counter", "Device counter (docs/media.md).");
        for (dev, x) in [("cache", cache_x), ("capacity", capacity_x)] {
            let _ = writeln!(o, "{name}{{device=\"{dev}\"}} {x}");
        }
    }
    family(&mut o, "sluice_device_waf", "gauge", "Media bytes programmed / host bytes written (1 for plain files).");
    for (dev, st) in devices {
        let waf = if st.media_program_bytes == 0 && st.host_write_bytes > 0 { 1.0 } else { st.device_waf() };
        let _ = writeln!(o, "sluice_device_waf{{device=\"{dev}\"}} {waf}");
    }
    render_cache(&mut o, s);
    o
}

/// The in-place cache's per-volume families (docs/caching.md): the mode,
/// cached and dirty bytes, and every `CacheStats` counter.
fn render_cache(o: &mut String, s: &EngineSnapshot) {
    if s.cache.is_empty() {
        return;
    }
    family(o, "sluice_cache_mode", "gauge", "1 for the volume's cache mode (wb, wt, wa, wi, pt).");
    for c in &s.cache {
        let mode = c.policy.mode.short_name();
        let _ = writeln!(o, "sluice_cache_mode{{volume=\"{}\",mode=\"{mode}\"}} 1", esc(&c.volume));
    }
    for (name, help, get) in [
        (
            "sluice_cache_cached_bytes",
            "Bytes of the volume current in the log.",
            (|c: &CacheReport| c.cached_bytes) as fn(&CacheReport) -> u64,
        ),
        ("sluice_cache_dirty_bytes", "Bytes in the log not yet written home.", |c: &CacheReport| c.dirty_bytes),
    ] {
        family(o, name, "gauge", help);
        for c in &s.cache {
            let _ = writeln!(o, "{name}{{volume=\"{}\"}} {}", esc(&c.volume), get(c));
        }
    }
    for (k, help) in [
        ("cached_bytes", "Bytes of the I/O class current in the log."),
        ("write_bytes", "Bytes the I/O class wrote."),
        ("read_bytes", "Bytes the I/O class read."),
        ("bypass_bytes", "Writes of the class sent past the cache (share 0)."),
        ("spill_bytes", "Writes of the class sent past the cache (it held its share)."),
        ("cutoff_bytes", "Writes of the class sent past the cache by the sequential cutoff."),
        (
            "reclassified_bytes",
            "Cached blocks found to be the class's only after they were written (directory classes: recognised late).",
        ),
        (
            "class_in_time_bytes",
            "The class's bytes admitted as the class when written (directory classes: known or predicted right).",
        ),
        ("class_missed_bytes", "The class's bytes predicted to be another's when written (directory classes)."),
        ("other_kept_out_bytes", "Other bytes kept out of the class when written (directory classes)."),
        ("other_admitted_bytes", "Other bytes predicted to be the class's when written (directory classes)."),
        ("unresolved_bytes", "Predicted bytes the file system never named (freed first; directory classes)."),
    ] {
        let name = format!("sluice_cache_class_{k}");
        family(o, &name, if k == "cached_bytes" { "gauge" } else { "counter" }, help);
        for c in &s.cache {
            for cl in &c.classes {
                let x = match k {
                    "cached_bytes" => cl.cached_bytes,
                    "write_bytes" => cl.write_bytes,
                    "read_bytes" => cl.read_bytes,
                    "bypass_bytes" => cl.bypass_bytes,
                    "spill_bytes" => cl.spill_bytes,
                    "cutoff_bytes" => cl.cutoff_bytes,
                    "class_in_time_bytes" => cl.prediction.class_in_time_bytes,
                    "class_missed_bytes" => cl.prediction.class_missed_bytes,
                    "other_kept_out_bytes" => cl.prediction.other_kept_out_bytes,
                    "other_admitted_bytes" => cl.prediction.other_admitted_bytes,
                    "unresolved_bytes" => cl.prediction.unresolved_bytes,
                    _ => cl.reclassified_bytes,
                };
                let _ = writeln!(o, "{name}{{volume=\"{}\",class=\"{}\"}} {x}", esc(&c.volume), esc(&cl.class));
            }
        }
    }
    let per_volume: Vec<Vec<(String, f64)>> = s.cache.iter().map(|c| fields(&c.stats)).collect();
    for (i, (k, _)) in per_volume.first().map(|f| f.as_slice()).unwrap_or(&[]).iter().enumerate() {
        let name = format!("sluice_cache_{k}_total");
        family(o, &name, "counter", "Cache counter (docs/caching.md).");
        for (c, f) in s.cache.iter().zip(&per_volume) {
            let _ = writeln!(o, "{name}{{volume=\"{}\"}} {}", esc(&c.volume), f[i].1);
        }
    }
}

/// Serve `GET /metrics` on `listener` from a background thread.
pub fn spawn(
    listener: TcpListener,
    engine: Arc<Engine>,
    nbd: impl Fn() -> NbdCounters + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new().name("metrics".into()).spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = answer(&mut conn, &engine, &nbd);
        }
    })?;
    Ok(())
}

fn answer(conn: &mut TcpStream, engine: &Engine, nbd: &dyn Fn() -> NbdCounters) -> std::io::Result<()> {
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = conn.read(&mut buf)?;
        if n == 0 || head.len() + n > REQUEST_BYTES_MAX {
            return reply(conn, "400 Bad Request", "bad request\n");
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut words = line.split_whitespace();
    match (words.next(), words.next()) {
        (Some("GET"), Some("/metrics")) => reply(conn, "200 OK", &render(&engine.snapshot(), &nbd())),
        (Some("GET"), Some(_)) => reply(conn, "404 Not Found", "try /metrics\n"),
        _ => reply(conn, "400 Bad Request", "bad request\n"),
    }
}

fn reply(conn: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(body.as_bytes())
}

/// Fetch and parse `http://addr/metrics`: metric name with labels → value.
pub fn scrape(addr: &str) -> Result<BTreeMap<String, f64>, String> {
    let mut c = TcpStream::connect(addr).map_err(|e| format!("metrics endpoint {addr}: {e}"))?;
    c.set_read_timeout(Some(IO_TIMEOUT * 5)).map_err(|e| e.to_string())?;
    c.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).map_err(|e| e.to_string())?;
    let mut text = String::new();
    c.read_to_string(&mut text).map_err(|e| format!("metrics endpoint {addr}: {e}"))?;
    let (head, body) = text.split_once("\r\n\r\n").ok_or("metrics endpoint: no HTTP header")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("metrics endpoint {addr}: {}", head.lines().next().unwrap_or("")));
    }
    parse(body)
}

/// The samples of an exposition: metric name with labels → value.
fn parse(body: &str) -> Result<BTreeMap<String, f64>, String> {
    let mut out = BTreeMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (k, v) = line.rsplit_once(' ').ok_or_else(|| format!("metrics line {line:?}"))?;
        out.insert(k.to_string(), v.parse::<f64>().map_err(|_| format!("metrics line {line:?}"))?);
    }
    Ok(out)
}

/// One volume's rates and latencies over a `sluice stats` interval.
#[derive(Clone, Debug, Serialize)]
pub struct VolumeStats {
    pub volume: String,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_mib_per_s: f64,
    pub write_mib_per_s: f64,
    pub user_read_bytes: f64,
    pub user_write_bytes: f64,
    /// Since start: p50, p99 of reads and writes, microseconds.
    pub read_p50_us: f64,
    pub read_p99_us: f64,
    pub write_p50_us: f64,
    pub write_p99_us: f64,
    /// In-place engines: the cache's view of the volume over the interval.
    pub cache: Option<CacheVolumeStats>,
}

/// One in-place volume's cache over a `sluice stats` interval (rates in
/// MiB/s; occupancy now). The `casadm -P` report is the model.
#[derive(Clone, Debug, Serialize)]
pub struct CacheVolumeStats {
    pub mode: String,
    pub cached_mib: f64,
    pub dirty_mib: f64,
    /// Share of the interval's read bytes found in the log (0 without
    /// reads: `reads`).
    pub read_hit_ratio: f64,
    /// Whether the volume was read in the interval.
    pub reads: bool,
    pub write_back_mib_per_s: f64,
    pub write_through_mib_per_s: f64,
    pub write_past_mib_per_s: f64,
    pub cutoff_bypass_mib_per_s: f64,
    pub spill_mib_per_s: f64,
    pub promoted_mib_per_s: f64,
    pub cleaning_mib_per_s: f64,
    pub discarded_dirty_mib_per_s: f64,
    /// Per I/O class: cached MiB now, and MiB/s written, bypassed and
    /// spilled over the interval.
    pub classes: Vec<ClassRates>,
}

/// One I/O class of a volume over a `sluice stats` interval.
#[derive(Clone, Debug, Serialize)]
pub struct ClassRates {
    pub class: String,
    pub cached_mib: f64,
    pub write_mib_per_s: f64,
    pub bypass_mib_per_s: f64,
    pub spill_mib_per_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Stats {
    pub interval_s: f64,
    pub volumes: Vec<VolumeStats>,
    pub cache_occupancy: f64,
    pub host_waf: f64,
    pub cache_device_waf: f64,
    pub capacity_device_waf: f64,
    pub compaction_mib_per_s: f64,
    pub gc_mib_per_s: f64,
    pub nbd_connections: f64,
    /// Share of the interval's compacted chunks done by the background
    /// compactor, and the share of the interval writes spent paced by it.
    pub background_compaction_ratio: f64,
    pub throttled_seconds_per_s: f64,
}

/// The cache's counters of volume `v` over the interval, if it has any.
fn cache_stats(
    a: &BTreeMap<String, f64>,
    b: &BTreeMap<String, f64>,
    v: &str,
    interval_s: f64,
) -> Option<CacheVolumeStats> {
    let mode = ["wb", "wt", "wa", "wi", "pt"]
        .into_iter()
        .find(|m| b.contains_key(&format!("sluice_cache_mode{{volume=\"{v}\",mode=\"{m}\"}}")))?;
    let g = |m: &BTreeMap<String, f64>, k: &str| {
        m.get(&format!("sluice_cache_{k}{{volume=\"{v}\"}}")).copied().unwrap_or(0.0)
    };
    let mib = 1024.0 * 1024.0;
    let delta = |k: &str| g(b, k) - g(a, k);
    let rate = |k: &str| delta(k) / interval_s / mib;
    let (hit, miss) = (delta("read_hit_bytes_total"), delta("read_miss_bytes_total"));
    Some(CacheVolumeStats {
        mode: mode.to_string(),
        cached_mib: g(b, "cached_bytes") / mib,
        dirty_mib: g(b, "dirty_bytes") / mib,
        read_hit_ratio: if hit + miss > 0.0 { hit / (hit + miss) } else { 0.0 },
        reads: hit + miss > 0.0,
        write_back_mib_per_s: rate("write_back_bytes_total"),
        write_through_mib_per_s: rate("write_through_bytes_total"),
        write_past_mib_per_s: rate("write_past_bytes_total"),
        cutoff_bypass_mib_per_s: rate("cutoff_bypass_bytes_total"),
        spill_mib_per_s: rate("spill_bytes_total"),
        promoted_mib_per_s: rate("promoted_bytes_total"),
        cleaning_mib_per_s: rate("cleaned_bytes_total"),
        discarded_dirty_mib_per_s: rate("discarded_dirty_bytes_total"),
        classes: class_rates(a, b, v, interval_s),
    })
}

/// Each I/O class of volume `v` that the second scrape names.
fn class_rates(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>, v: &str, interval_s: f64) -> Vec<ClassRates> {
    let prefix = format!("sluice_cache_class_cached_bytes{{volume=\"{v}\",class=\"");
    let mib = 1024.0 * 1024.0;
    (b.keys().filter_map(|k| k.strip_prefix(&prefix)?.strip_suffix("\"}")))
        .map(|class| {
            let key = |m: &str| format!("sluice_cache_class_{m}{{volume=\"{v}\",class=\"{class}\"}}");
            let g = |m: &BTreeMap<String, f64>, k: &str| m.get(&key(k)).copied().unwrap_or(0.0);
            let rate = |k: &str| (g(b, k) - g(a, k)) / interval_s / mib;
            ClassRates {
                class: class.to_string(),
                cached_mib: g(b, "cached_bytes") / mib,
                write_mib_per_s: rate("write_bytes"),
                bypass_mib_per_s: rate("bypass_bytes"),
                spill_mib_per_s: rate("spill_bytes"),
            }
        })
        .collect()
}

/// Rates from two scrapes `interval_s` apart.
pub fn stats(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>, interval_s: f64) -> Stats {
    let g = |m: &BTreeMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(0.0);
    let rate = |k: &str| (g(b, k) - g(a, k)) / interval_s;
    let mib = 1024.0 * 1024.0;
    let names: Vec<String> = b
        .keys()
        .filter_map(|k| k.strip_prefix("sluice_volume_size_bytes{volume=\"")?.strip_suffix("\"}").map(String::from))
        .collect();
    let volumes = names
        .into_iter()
        .map(|v| {
            let key = |m: &str, op: &str| format!("sluice_volume_{m}{{volume=\"{v}\",op=\"{op}\"}}");
            let lat = |op: &str, q: &str| {
                g(b, &format!("sluice_volume_latency_seconds{{volume=\"{v}\",op=\"{op}\",quantile=\"{q}\"}}")) * 1e6
            };
            VolumeStats {
                read_iops: rate(&key("ops_total", "read")),
                write_iops: rate(&key("ops_total", "write")),
                read_mib_per_s: rate(&key("bytes_total", "read")) / mib,
                write_mib_per_s: rate(&key("bytes_total", "write")) / mib,
                user_read_bytes: g(b, &key("bytes_total", "read")),
                user_write_bytes: g(b, &key("bytes_total", "write")),
                read_p50_us: lat("read", "0.5"),
                read_p99_us: lat("read", "0.99"),
                write_p50_us: lat("write", "0.5"),
                write_p99_us: lat("write", "0.99"),
                cache: cache_stats(a, b, &v, interval_s),
                volume: v,
            }
        })
        .collect();
    Stats {
        interval_s,
        volumes,
        cache_occupancy: g(b, "sluice_cache_occupancy_ratio"),
        host_waf: g(b, "sluice_engine_host_waf"),
        cache_device_waf: g(b, "sluice_device_waf{device=\"cache\"}"),
        capacity_device_waf: g(b, "sluice_device_waf{device=\"capacity\"}"),
        compaction_mib_per_s: rate("sluice_engine_compaction_bytes_total") / mib,
        gc_mib_per_s: rate("sluice_engine_gc_bytes_total") / mib,
        nbd_connections: g(b, "sluice_nbd_connections"),
        background_compaction_ratio: {
            let all = rate("sluice_engine_chunks_compacted_total");
            if all > 0.0 {
                rate("sluice_compactor_chunks_total") / all
            } else {
                0.0
            }
        },
        throttled_seconds_per_s: rate("sluice_compactor_throttle_seconds_total"),
    }
}

/// The human table of `sluice stats`.
pub fn print_table(s: &Stats) {
    println!(
        "{:<16} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "volume", "read IOPS", "write IOPS", "rd MiB/s", "wr MiB/s", "rd p50us", "rd p99us", "wr p50us", "wr p99us"
    );
    for v in &s.volumes {
        println!(
            "{:<16} {:>10.0} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            v.volume,
            v.read_iops,
            v.write_iops,
            v.read_mib_per_s,
            v.write_mib_per_s,
            v.read_p50_us,
            v.read_p99_us,
            v.write_p50_us,
            v.write_p99_us
        );
    }
    if s.volumes.iter().any(|v| v.cache.is_some()) {
        println!(
            "{:<16} {:>4} {:>9} {:>9} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "cache (MiB/s)",
            "mode",
            "cached MiB",
            "dirty MiB",
            "hit %",
            "wr back",
            "wr thru",
            "wr past",
            "cutoff",
            "spill",
            "cleaned",
            "discard"
        );
        for v in &s.volumes {
            let Some(c) = &v.cache else { continue };
            println!(
                "{:<16} {:>4} {:>9.1} {:>9.1} {:>6} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
                v.volume,
                c.mode,
                c.cached_mib,
                c.dirty_mib,
                // No reads in the interval: no ratio to show.
                match c.reads {
                    true => format!("{:.1}", c.read_hit_ratio * 100.0),
                    false => "-".into(),
                },
                c.write_back_mib_per_s,
                c.write_through_mib_per_s,
                c.write_past_mib_per_s,
                c.cutoff_bypass_mib_per_s,
                c.spill_mib_per_s,
                c.cleaning_mib_per_s,
                c.discarded_dirty_mib_per_s
            );
            for k in &c.classes {
                println!(
                    "  class {:<20} cached {:>8.1} MiB, write {:>8.1} MiB/s, bypass {:>8.1} MiB/s, spill {:>8.1} MiB/s",
                    k.class, k.cached_mib, k.write_mib_per_s, k.bypass_mib_per_s, k.spill_mib_per_s
                );
            }
        }
    }
    println!(
        "cache occupancy {:.1} %, host WAF {:.2}, device WAF cache {:.2} capacity {:.2}, \
         compaction {:.1} MiB/s ({:.0} % in the background), writes paced {:.2} s/s, GC {:.1} MiB/s, \
         {} NBD connections (over {:.1} s; latencies since start)",
        s.cache_occupancy * 100.0,
        s.host_waf,
        s.cache_device_waf,
        s.capacity_device_waf,
        s.compaction_mib_per_s,
        s.background_compaction_ratio * 100.0,
        s.throttled_seconds_per_s,
        s.gc_mib_per_s,
        s.nbd_connections,
        s.interval_s
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::{EngineConfig, Layout, Volume, VolumeSpec};
    use sluice_media::{BlockDevice, MemoryDevice};

    /// An in-place engine's cache counters reach the exposition, per volume,
    /// and `sluice stats` turns two scrapes into the cache table's rates.
    #[test]
    fn the_cache_counters_are_exported_and_rated() {
        let cache: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(16 << 20, 4096));
        let capacity: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(80 << 20, 4096));
        let cfg = EngineConfig { chunk_bytes: 1 << 20, layout: Layout::InPlace, ..EngineConfig::default() };
        let e = Engine::create(cache, capacity, cfg, &[VolumeSpec { name: "v".into(), size_bytes: 64 << 20 }]).unwrap();
        let v = e.volume("v").unwrap();
        let a = parse(&render(&e.snapshot(), &NbdCounters::default())).unwrap();
        v.write(0, &vec![7u8; 64 << 10], false).unwrap();
        v.write(1 << 20, &vec![7u8; 2 << 20], false).unwrap();
        v.trim(0, 32 << 10).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        v.read(0, &mut buf).unwrap();
        let text = render(&e.snapshot(), &NbdCounters::default());
        assert!(text.contains("# TYPE sluice_cache_discarded_dirty_bytes_total counter"));
        let b = parse(&text).unwrap();
        assert_eq!(b["sluice_cache_mode{volume=\"v\",mode=\"wb\"}"], 1.0);
        assert_eq!(b["sluice_cache_discarded_dirty_bytes_total{volume=\"v\"}"], (32 << 10) as f64);
        assert_eq!(b["sluice_cache_class_write_bytes{volume=\"v\",class=\"unclassified\"}"], (2112 << 10) as f64);
        let st = stats(&a, &b, 1.0);
        let c = st.volumes[0].cache.as_ref().expect("an in-place volume has cache stats");
        assert_eq!(c.mode, "wb");
        // The 2 MiB write is a stream past the 1 MiB cutoff by itself; the
        // 64 KiB one was cached, half of it then trimmed (and read back
        // from home).
        assert_eq!(c.cutoff_bypass_mib_per_s, 2.0);
        assert_eq!(c.write_back_mib_per_s, 64.0 / 1024.0);
        assert_eq!(c.dirty_mib, 32.0 / 1024.0);
        assert_eq!(c.read_hit_ratio, 0.5);
        assert_eq!(c.classes.len(), 1, "{:?}", c.classes);
        assert_eq!((c.classes[0].class.as_str(), c.classes[0].write_mib_per_s), ("unclassified", 2112.0 / 1024.0));
    }

    /// The exposition parses with Prometheus' own Python parser, label
    /// values with quotes, backslashes and line feeds come back as named,
    /// and the latency summary has its `_sum` and `_count`.
    #[test]
    fn the_exposition_parses_with_the_prometheus_client_parser() {
        let cache: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(16 << 20, 4096));
        let capacity: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(80 << 20, 4096));
        let cfg = EngineConfig { chunk_bytes: 1 << 20, layout: Layout::InPlace, ..EngineConfig::default() };
        let name = "a \"quoted\" \\ name\nwith a line feed";
        let e =
            Engine::create(cache, capacity, cfg, &[VolumeSpec { name: name.into(), size_bytes: 64 << 20 }]).unwrap();
        let v = e.volume(name).unwrap();
        for i in 0..10 {
            v.write(i * 4096, &[1; 4096], false).unwrap();
        }
        let text = render(&e.snapshot(), &NbdCounters::default());
        let dir = std::env::temp_dir().join(format!("sluice-prom-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("metrics.txt"), &text).unwrap();
        let script = r#"
import sys, json
from prometheus_client.parser import text_string_to_metric_families
out = {"volumes": set(), "sum": None, "count": None}
for fam in text_string_to_metric_families(open(sys.argv[1]).read()):
    for s in fam.samples:
        if "volume" in s.labels:
            out["volumes"].add(s.labels["volume"])
        if s.name == "sluice_volume_latency_seconds_sum" and s.labels.get("op") == "write":
            out["sum"] = s.value
        if s.name == "sluice_volume_latency_seconds_count" and s.labels.get("op") == "write":
            out["count"] = s.value
out["volumes"] = sorted(out["volumes"])
print(json.dumps(out))
"#;
        let out = std::process::Command::new("/usr/bin/python3")
            .arg("-c")
            .arg(script)
            .arg(dir.join("metrics.txt"))
            .output()
            .expect("python3 (scripts/setup.sh installs python3-prometheus-client)");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(out.status.success(), "the parser refused the exposition: {}", String::from_utf8_lossy(&out.stderr));
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(got["volumes"], serde_json::json!([name]));
        assert_eq!(got["count"], 10.0);
        assert!(got["sum"].as_f64().unwrap() > 0.0, "{got}");
    }
}
