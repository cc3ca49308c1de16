//! `sluice cache …` against a real server through its control socket:
//! every command, its refusals, a clean stopped by its client and resumed,
//! `stats --json` against the metrics endpoint, and a warm, clean restart.

mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

const BLOCK: u64 = 64 * 1024;
/// Scattered 64 KiB writes, 1 MiB apart: no sequential stream, all cached.
const WRITES: u64 = 96;

fn config(name: &str) -> (PathBuf, PathBuf) {
    config_of(
        &format!("control-{name}"),
        "[cache]\nsize = \"64m\"\n[capacity]\nsize = \"256m\"\n\
         [engine]\nlayout = \"in-place\"\nchunk_size = \"1m\"\n\
         [[volume]]\nname = \"default\"\nsize = \"128m\"\n\
         [[volume.class]]\nname = \"small\"\nsize_max = \"64k\"\nshare = 0.5\n",
    )
}

/// `start`, then wait until the control socket accepts: the server binds
/// it after the lines `start` reads (listeners, metrics), so a command
/// sent at once may find no socket yet.
fn start_served(config: &Path) -> (Served, u16) {
    let (served, port) = start(config);
    wait_for_control(config);
    (served, port)
}

fn wait_for_control(config: &Path) {
    let socket = config.parent().expect("a config in a directory").join("data").join("sluice.ctl");
    // Generous: the socket comes right after the metrics line.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(std::time::Instant::now() < deadline, "no control socket at {} after 120 s", socket.display());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// `sluice cache ARGS --config CONFIG`: (success, stdout, stderr).
fn cache(config: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("cache")
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .expect("sluice cache");
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

fn cache_json(config: &Path, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (ok, out, err) = cache(config, &all);
    assert!(ok, "sluice cache {args:?}: {err}");
    // A clean's progress lines come first; the answer is the rest.
    let answer: String = out.lines().filter(|l| !l.starts_with("{\"progress\"")).collect::<Vec<_>>().join("\n");
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn write_scattered(port: u16, pattern: u8) {
    let cmds: Vec<String> = (0..WRITES).map(|i| format!("write -P {pattern} {} {BLOCK}", i << 20)).collect();
    let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
    qemu_io(port, &refs);
}

fn read_scattered(port: u16, pattern: u8) {
    let cmds: Vec<String> = (0..WRITES).map(|i| format!("read -P {pattern} {} {BLOCK}", i << 20)).collect();
    let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
    qemu_io(port, &refs);
}

fn volume<'a>(status: &'a Value, name: &str) -> &'a Value {
    (status["volumes"].as_array().expect("volumes").iter().find(|v| v["name"] == name)).expect("the volume")
}

/// Prometheus text: the value of `name{volume="default"}`.
fn metric(body: &str, name: &str) -> u64 {
    let key = format!("{name}{{volume=\"default\"}} ");
    (body.lines().find_map(|l| l.strip_prefix(&key)))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or_else(|| panic!("no {key} in the metrics"))
}

fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("metrics");
    write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    std::io::Read::read_to_string(&mut s, &mut body).unwrap();
    body
}

#[test]
fn every_cache_command_works_on_a_running_server_and_bad_ones_change_nothing() {
    need("qemu-io");
    let (dir, config) = config("all");
    let (mut served, port, metrics) = start_with_metrics(&config);
    wait_for_control(&config);
    let mut log = Log::take(&mut served);
    write_scattered(port, 7);

    // The socket is the server user's alone.
    use std::os::unix::fs::PermissionsExt;
    let socket = dir.join("data/sluice.ctl");
    let mode = std::fs::metadata(&socket).expect("the control socket").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    let status = cache_json(&config, &["status"]);
    assert_eq!(status["layout"], "in-place");
    assert_eq!(status["state"], "serving");
    let v = volume(&status, "default");
    assert_eq!(v["mode"], "wb");
    assert_eq!(v["dirty_bytes"].as_u64(), Some(WRITES * BLOCK), "{status}");
    assert_eq!(v["cached_bytes"].as_u64(), Some(WRITES * BLOCK));
    assert_eq!(status["dirty_bytes"], v["dirty_bytes"]);
    let (ok, table, _) = cache(&config, &["status"]);
    assert!(ok && table.contains("default") && table.contains("6.0 MiB"), "{table}");

    // stats: totals the metrics endpoint exports too, counter by counter.
    read_scattered(port, 7);
    let stats = cache_json(&config, &["stats"]);
    assert_eq!(stats["total"]["write_back_bytes"].as_u64(), Some(WRITES * BLOCK));
    assert_eq!(stats["total"]["read_hit_bytes"].as_u64(), Some(WRITES * BLOCK));
    let body = scrape(&metrics);
    for (k, v) in stats["volumes"][0]["stats"].as_object().expect("stats") {
        assert_eq!(v.as_u64(), Some(metric(&body, &format!("sluice_cache_{k}_total"))), "{k}");
    }
    let (ok, table, _) = cache(&config, &["stats"]);
    assert!(ok && table.contains("read hit ratio: 100.0 %"), "{table}");
    // `sluice stats` finds the metrics from the data directory alone.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["stats", "--interval", "0.1", "--json", "--data-dir"])
        .arg(dir.join("data"))
        .output()
        .unwrap();
    assert!(out.status.success(), "sluice stats --data-dir: {}", String::from_utf8_lossy(&out.stderr));
    let rates: Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
    assert!(rates.get("volumes").is_some(), "{rates}");

    // set-mode, and its refusals.
    let (ok, out, _) = cache(&config, &["set-mode", "default", "wt"]);
    assert!(ok && out.contains("mode wb -> wt"), "{out}");
    log.wait_for("sluice: control: volume default: mode wb -> wt");
    for (args, why) in [
        (&["set-mode", "nosuch", "wb"][..], "no volume named \"nosuch\""),
        (&["set-mode", "default", "fast"][..], "cache mode is one of"),
        (&["set-class", "default", "nosuch", "--share", "0.2"][..], "no I/O class of that name"),
        (&["set-class", "default", "small", "--share", "1.5"][..], "share is in [0, 1]"),
        (&["clean", "--step", "1k"][..], "at least one 4 KiB block"),
    ] {
        let (ok, _, err) = cache(&config, args);
        assert!(!ok && err.contains(why), "{args:?}: {err}");
    }
    let status = cache_json(&config, &["status"]);
    let v = volume(&status, "default");
    assert_eq!(v["mode"], "wt", "a refused command changed the mode");
    let small = (v["classes"].as_array().unwrap().iter().find(|c| c["class"] == "small")).expect("class small");
    assert_eq!(small["share"].as_f64(), Some(0.5));

    // set-class.
    let (ok, out, _) = cache(&config, &["set-class", "default", "small", "--share", "0.25"]);
    assert!(ok && out.contains("share 0.5 -> 0.25"), "{out}");
    let status = cache_json(&config, &["status"]);
    let small = (volume(&status, "default")["classes"].as_array().unwrap().iter().find(|c| c["class"] == "small"))
        .map(|c| c["share"].as_f64());
    assert_eq!(small, Some(Some(0.25)));

    // A request that is not one: an error, and the server goes on.
    let mut raw = std::os::unix::net::UnixStream::connect(&socket).expect("connect");
    writeln!(raw, "{{\"cmd\":\"format-everything\"}}").unwrap();
    let mut line = String::new();
    BufReader::new(&raw).read_line(&mut line).unwrap();
    assert!(line.contains("\"error\"") && line.contains("bad request"), "{line}");

    // Connections are bounded: the 17th while 16 are open is refused.
    // (Accepted in the order they connect: the 17th is the one refused.)
    let held: Vec<_> = (0..16).map(|_| std::os::unix::net::UnixStream::connect(&socket).expect("connect")).collect();
    let extra = std::os::unix::net::UnixStream::connect(&socket).expect("connect");
    let mut line = String::new();
    BufReader::new(&extra).read_line(&mut line).unwrap();
    assert!(line.contains("control connections are open already"), "{line}");
    drop(held);
    // Served again once the server has seen them close.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !cache(&config, &["status"]).0 {
        assert!(std::time::Instant::now() < deadline, "the closed connections were never let go");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // A clean stopped by its client after the first step, then resumed.
    let mut raw = std::os::unix::net::UnixStream::connect(&socket).expect("connect");
    writeln!(raw, "{{\"cmd\":\"clean\",\"step_bytes\":{BLOCK}}}").unwrap();
    let mut line = String::new();
    BufReader::new(&raw).read_line(&mut line).unwrap();
    let first: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(first["progress"]["cleaned_bytes"].as_u64(), Some(BLOCK), "{line}");
    drop(raw);
    log.wait_for("clean stopped by its client");
    let left = volume(&cache_json(&config, &["status"]), "default")["dirty_bytes"].as_u64().unwrap();
    assert!(left > 0 && left < WRITES * BLOCK, "dirty after the stopped clean: {left}");
    let done = cache_json(&config, &["clean", "--step", "1MiB"]);
    assert_eq!(done["dirty_bytes"].as_u64(), Some(0));
    assert_eq!(done["cleaned_bytes"].as_u64(), Some(left), "the resumed clean wrote what was left");
    let status = cache_json(&config, &["status"]);
    assert_eq!(volume(&status, "default")["dirty_bytes"].as_u64(), Some(0));
    assert_eq!(volume(&status, "default")["cached_bytes"].as_u64(), Some(WRITES * BLOCK), "cleaning evicts nothing");
    read_scattered(port, 7);

    // detach: everything home, every volume pass-through; attach: back.
    write_scattered(port, 9);
    let (ok, out, _) = cache(&config, &["detach"]);
    assert!(ok && out.contains("the disk alone holds every volume"), "{out}");
    let status = cache_json(&config, &["status"]);
    assert_eq!((volume(&status, "default")["mode"].as_str(), status["dirty_bytes"].as_u64()), (Some("pt"), Some(0)));
    let (ok, out, _) = cache(&config, &["attach"]);
    assert!(ok && out.contains("mode pt -> wb"), "{out}");
    assert_eq!(volume(&cache_json(&config, &["status"]), "default")["mode"], "wb");
    read_scattered(port, 9);

    // The disk alone holds the data: every byte home, as written.
    let log_text = {
        log.wait_for("attach: volume default: mode pt -> wb");
        let child = served.into_child();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success());
        log.wait_for("clean shutdown");
        log.said.join("\n")
    };
    assert!(log_text.contains("sluice: control: volume default: class small: share 0.5 -> 0.25"), "{log_text}");
    assert!(!socket.exists(), "the control socket outlived its server");
    let disk = std::fs::read(dir.join("data/capacity.img")).unwrap();
    for i in 0..WRITES as usize {
        let at = i << 20;
        assert!(disk[at..at + BLOCK as usize].iter().all(|&b| b == 9), "block {i} not home");
    }
}

/// A cache holding only clean data, stopped cleanly, comes back warm and
/// clean: its blocks are still cached, none dirty, and cleaning writes
/// nothing home.
#[test]
fn a_clean_cache_restarts_warm_and_writes_nothing_home() {
    need("qemu-io");
    let (_dir, config) = config("warm");
    let (served, port) = start_served(&config);
    write_scattered(port, 5);
    let done = cache_json(&config, &["clean"]);
    assert_eq!(done["cleaned_bytes"].as_u64(), Some(WRITES * BLOCK));
    stop(served);
    let (served, port) = start_served(&config);
    let status = cache_json(&config, &["status"]);
    let v = volume(&status, "default");
    assert_eq!((v["cached_bytes"].as_u64(), v["dirty_bytes"].as_u64()), (Some(WRITES * BLOCK), Some(0)), "{status}");
    let done = cache_json(&config, &["clean"]);
    assert_eq!(done["cleaned_bytes"].as_u64(), Some(0), "a clean cache wrote home after a restart");
    read_scattered(port, 5);
    let stats = cache_json(&config, &["stats"]);
    assert_eq!(stats["total"]["read_hit_bytes"].as_u64(), Some(WRITES * BLOCK), "the restart lost the cache");
    stop(served);
}

/// Without a server, a command says where it looked.
#[test]
fn a_command_without_a_server_says_where_it_looked() {
    let (dir, config) = config("none");
    let (ok, _, err) = cache(&config, &["status"]);
    assert!(!ok && err.contains("control socket") && err.contains(&dir.join("data").display().to_string()), "{err}");
}
