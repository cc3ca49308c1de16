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
use sluice_engine::{Engine, EngineSnapshot};
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

/// The Prometheus text for one snapshot.
pub fn render(s: &EngineSnapshot, nbd: &NbdCounters) -> String {
    let mut o = String::new();
    let family = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    family(&mut o, "sluice_volume_size_bytes", "gauge", "Size of the volume.");
    for v in &s.volumes {
        let _ = writeln!(o, "sluice_volume_size_bytes{{volume=\"{}\"}} {}", v.name, v.size_bytes);
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
                let _ = writeln!(o, "{name}{{volume=\"{}\",op=\"{}\"}} {x}", v.name, op.op);
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
        let _ = writeln!(o, "sluice_volume_checksum_errors_total{{volume=\"{}\"}} {}", v.name, v.checksum_errors);
    }
    family(&mut o, "sluice_volume_latency_seconds", "summary", "Request latency since start (log-linear, ±12.5 %).");
    for v in &s.volumes {
        for op in &v.ops {
            for (q, us) in QUANTILES.iter().zip(op.latency_us) {
                let _ = writeln!(
                    o,
                    "sluice_volume_latency_seconds{{volume=\"{}\",op=\"{}\",quantile=\"{q}\"}} {}",
                    v.name,
                    op.op,
                    us / 1e6
                );
            }
            let _ = writeln!(
                o,
                "sluice_volume_latency_seconds_count{{volume=\"{}\",op=\"{}\"}} {}",
                v.name, op.op, op.count
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
    o
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
