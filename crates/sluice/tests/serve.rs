//! `sluice serve` with a real NBD client: write with qemu-io, stop the server
//! with SIGTERM, start it again on the same files, read the data back.

mod common;

use common::{
    device_config, libnbd_byte_granular, need, qemu_io, serve_command, small_config, small_config_logged, start,
    start_command, start_with_metrics, stop,
};
use std::path::Path;
use std::process::Command;

#[test]
fn data_survives_a_clean_restart() {
    need("qemu-io");
    let (dir, config) = small_config("serve");
    let (server, port) = start(&config);
    // More than the 64 MiB cache holds: compaction runs while we write.
    qemu_io(port, &["write -P 0xab 0 96M", "write -P 0xcd 200M 64k", "write -z 4M 4M", "flush"]);
    qemu_io(port, &["read -P 0xab 0 4M", "read -P 0 4M 4M", "read -P 0xab 8M 88M", "read -P 0xcd 200M 64k"]);
    // The banner: created or reopened, each device, each export.
    let log = stop(server);
    for line in [
        "created a new engine",
        "sluice: cache: ",
        "(file, 64 MiB, not emulated)",
        "export \"default\": 256 MiB, write-shaping log",
    ] {
        assert!(log.contains(line), "{line:?} missing from the start banner: {log}");
    }

    let (server, port) = start(&config);
    qemu_io(port, &["read -P 0xab 0 4M", "read -P 0 4M 4M", "read -P 0xab 8M 88M", "read -P 0xcd 200M 64k"]);
    qemu_io(port, &["read -P 0 201M 1M"]);
    assert!(stop(server).contains("reopened the engine"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn flushed_data_survives_kill_9() {
    need("qemu-io");
    let (dir, config) = small_config("kill9");
    let (mut server, port) = start(&config);
    // More than the cache holds, so compaction has moved data to capacity
    // bands; then a trim, then a flush; then more writes nobody flushed.
    qemu_io(port, &["write -P 0x5a 0 80M", "write -z 8M 1M", "discard 16M 1M", "flush"]);
    // Sub-block writes from a client that never negotiated block sizes: one
    // with FUA, one covered by the flush. Acknowledged, so durable.
    libnbd_byte_granular(port, SUB_BLOCK_WRITES);
    qemu_io(port, &["write -P 0x77 32M 1M"]);
    server.kill().unwrap(); // SIGKILL: no shutdown, no checkpoint
    let out = server.into_child().wait_with_output().unwrap();
    assert!(!out.status.success());

    let (server, port) = start(&config);
    qemu_io(port, &["read -P 0x5a 0 8M", "read -P 0 8M 1M", "read -P 0x5a 9M 7M", "read -P 0 16M 1M"]);
    qemu_io(port, &["read -P 0x5a 17M 15M", "read -P 0x5a 33M 39M", "read -P 0x5a 73736192 1040384"]);
    qemu_io(port, &["read -P 0x5a 73M 7M"]);
    libnbd_byte_granular(port, SUB_BLOCK_READS);
    // The unflushed write reached the file devices before the kill (a
    // process crash, not a power loss), so recovery finds it whole.
    qemu_io(port, &["read -P 0x77 32M 1M"]);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let out = server.into_child().wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("recovered from the devices") && err.contains("clean shutdown"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

const SUB_BLOCK_WRITES: &str = "\
h.pwrite(b'\\x11' * 100, (72 << 20) + 7, flags=nbd.CMD_FLAG_FUA)
h.pwrite(b'\\x22\\x33\\x44', (72 << 20) + 4095)
h.flush()";

/// What `SUB_BLOCK_WRITES` left over the 0x5a pattern.
const SUB_BLOCK_READS: &str = "\
want = bytearray(b'\\x5a' * 8192)
want[7:107] = b'\\x11' * 100
want[4095:4098] = b'\\x22\\x33\\x44'
check(h.pread(8192, 72 << 20) == want, 'the sub-block writes after kill -9')";

/// GET `path` from the metrics endpoint: (status line, body).
fn http_get(addr: &str, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

#[test]
fn metrics_endpoint_and_sluice_stats_report_the_traffic() {
    need("qemu-io");
    let (dir, config) = small_config_logged("metrics");
    let (server, port, metrics) = start_with_metrics(&config);
    qemu_io(port, &["write -P 0x11 0 8M", "read -P 0x11 0 4M", "discard 4M 1M", "flush"]);
    let (status, body) = http_get(&metrics, "/metrics");
    assert!(status.contains("200"), "{status}");
    for want in [
        "# TYPE sluice_volume_ops_total counter",
        "sluice_volume_bytes_total{volume=\"default\",op=\"write\"} 8388608",
        "sluice_volume_bytes_total{volume=\"default\",op=\"read\"} 4194304",
        "sluice_volume_bytes_total{volume=\"default\",op=\"trim\"} 1048576",
        "sluice_volume_latency_seconds{volume=\"default\",op=\"write\",quantile=\"0.99\"}",
        "sluice_engine_user_write_bytes_total 8388608",
        "sluice_device_host_write_bytes_total{device=\"cache\"}",
        "sluice_nbd_connections_accepted_total",
        "sluice_compactor_running 1",
        "# TYPE sluice_compactor_throttle_seconds_total counter",
    ] {
        assert!(body.contains(want), "missing {want:?} in\n{body}");
    }
    assert!(http_get(&metrics, "/nope").0.contains("404"));
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["stats", "--json", "--interval", "0.2", "--addr", &metrics])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["volumes"][0]["volume"], "default");
    assert_eq!(v["volumes"][0]["user_write_bytes"], 8388608.0);
    assert!(v["volumes"][0]["write_p99_us"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["host_waf"].as_f64().unwrap() >= 1.0, "{v}");
    let table = Command::new(env!("CARGO_BIN_EXE_sluice")).args(["stats", "--addr", &metrics]).output().unwrap();
    assert!(String::from_utf8_lossy(&table.stdout).contains("cache occupancy"));
    // Found from a config: its metrics_listen (here the address the server
    // took); a config that serves no metrics is a clear error.
    let text = std::fs::read_to_string(&config).unwrap();
    let with_addr = dir.join("stats.toml");
    std::fs::write(
        &with_addr,
        text.replace("metrics_listen = \"127.0.0.1:0\"", &format!("metrics_listen = {metrics:?}")),
    )
    .unwrap();
    let by_config = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["stats", "--json", "--config"])
        .arg(&with_addr)
        .output()
        .unwrap();
    assert!(by_config.status.success(), "{}", String::from_utf8_lossy(&by_config.stderr));
    assert!(String::from_utf8_lossy(&by_config.stdout).contains("\"volume\": \"default\""));
    let none = dir.join("none.toml");
    std::fs::write(&none, text.replace("metrics_listen = \"127.0.0.1:0\"", "metrics_listen = \"\"")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice")).args(["stats", "--config"]).arg(&none).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("serves no metrics"));
    // Fill most of the 64 MiB log; then, with no client writing, the
    // background compactor brings it back below half full.
    qemu_io(port, &["write -P 0x22 16M 40M"]);
    let metric = |name: &str| -> f64 {
        let body = http_get(&metrics, "/metrics").1;
        let line = body.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let t = std::time::Instant::now();
    while metric("sluice_compactor_chunks_total") == 0.0 || metric("sluice_cache_occupancy_ratio") > 0.5 {
        assert!(t.elapsed().as_secs() < 30, "the compactor did not drain the log");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    qemu_io(port, &["read -P 0x11 0 4M", "read -P 0x22 16M 40M"]);
    stop(server);
    // No server there: a clear error, not a hang or a panic.
    let dead = Command::new(env!("CARGO_BIN_EXE_sluice")).args(["stats", "--addr", &metrics]).output().unwrap();
    assert!(!dead.status.success());
    assert!(String::from_utf8_lossy(&dead.stderr).contains("metrics endpoint"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_config_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("sluice-badcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("bad.toml");
    std::fs::write(&config, "listen = [\"127.0.0.1:0\"]\nno_such_key = 1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice")).args(["serve", "--config"]).arg(&config).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no_such_key"), "{}", String::from_utf8_lossy(&out.stderr));
    // A set point above the compactor's start level: refused before anything is created.
    let data = dir.join("data");
    std::fs::write(
        &config,
        format!(
            "data_dir = {data:?}\nlisten = [\"127.0.0.1:0\"]\n[engine]\ncompaction_start = 0.2\ncompaction_setpoint = 0.4\n"
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice")).args(["serve", "--config"]).arg(&config).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("setpoint"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!data.exists(), "nothing created");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serves_on_emulated_scm_and_qlc_and_reopens() {
    need("qemu-io");
    let (dir, config) =
        device_config("emu-qlc", "size = \"64m\"\nemulate = \"scm\"", "size = \"1g\"\nemulate = \"qlc\"");
    let (server, port) = start(&config);
    // More than the cache holds, so compaction writes to the emulated QLC.
    qemu_io(port, &["write -P 0x5a 0 80M", "write -P 0x33 100M 4k", "flush"]);
    qemu_io(port, &["read -P 0x5a 0 80M", "read -P 0x33 100M 4k"]);
    stop(server);
    let (server, port) = start(&config);
    qemu_io(port, &["read -P 0x5a 0 80M", "read -P 0x33 100M 4k", "read -P 0 101M 1M"]);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serves_on_emulated_scm_and_zns_in_memory() {
    need("qemu-io");
    let (dir, config) = device_config(
        "emu-zns",
        "kind = \"memory\"\nsize = \"64m\"\nemulate = \"scm\"",
        "kind = \"memory\"\nsize = \"1g\"\nemulate = \"zns\"",
    );
    let (server, port) = start(&config);
    qemu_io(port, &["write -P 0x71 0 80M", "write -z 8M 1M", "flush"]);
    qemu_io(port, &["read -P 0x71 0 8M", "read -P 0 8M 1M", "read -P 0x71 9M 71M"]);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_emulation_is_a_clear_error() {
    for (capacity, expect) in [
        ("size = \"1g\"\nemulate = \"zns\"", "kind = \"memory\""),
        ("size = \"1g\"\nemulate = \"floppy\"", "unknown medium"),
        ("size = \"100m\"\nemulate = \"qlc\"", "multiple of 16 MiB"),
    ] {
        let (dir, config) = device_config("emu-bad", "size = \"64m\"", capacity);
        let out = Command::new(env!("CARGO_BIN_EXE_sluice")).args(["serve", "--config"]).arg(&config).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("capacity.emulate") && err.contains(expect), "{err}");
        assert!(!dir.join("data").join("capacity").exists(), "nothing created on a bad config");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// SIGHUP reloads the cache policies of a running in-place engine: a config
/// that changes anything else (or does not parse) is refused and changes
/// nothing; one that makes every volume pass-through detaches live — the
/// dirty data goes home while the server keeps serving, and later writes
/// go straight to the disk.
#[test]
fn sighup_reloads_cache_policies_and_a_pass_through_config_detaches_live() {
    need("qemu-io");
    let (dir, config) = small_config("reload");
    let text = std::fs::read_to_string(&config).unwrap().replace("[engine]\n", "[engine]\nlayout = \"in-place\"\n");
    std::fs::write(&config, &text).unwrap();
    let (mut server, port) = start(&config);
    let mut log = common::Log::take(&mut server);
    let mut await_line = |what: &str| log.wait_for(what);
    qemu_io(port, &["write -P 0xab 0 256k", "flush"]);
    let disk = dir.join("data").join("capacity.img");
    let home = |at: u64, len: usize| -> Vec<u8> {
        use std::io::{Read, Seek};
        let mut f = std::fs::File::open(&disk).unwrap();
        f.seek(std::io::SeekFrom::Start(at)).unwrap();
        let mut b = vec![0u8; len];
        f.read_exact(&mut b).unwrap();
        b
    };
    assert!(home(0, 4096) != vec![0xab; 4096], "written back: the data is in the cache only");
    let hup = |server: &common::Served| unsafe { libc::kill(server.id() as i32, libc::SIGHUP) };
    // Refused: a volume size changes; and a mode that does not parse.
    std::fs::write(&config, text.replace("size = \"256m\"", "size = \"512m\"")).unwrap();
    hup(&server);
    let refused = await_line("reload refused, nothing changed");
    assert!(refused.contains("volume names, sizes and access changed"), "{refused}");
    std::fs::write(&config, text.replace("size = \"256m\"\n", "size = \"256m\"\nmode = \"fast\"\n")).unwrap();
    hup(&server);
    let refused = await_line("reload refused, nothing changed");
    assert!(refused.contains("mode"), "{refused}");
    qemu_io(port, &["read -P 0xab 0 256k"]);
    assert!(home(0, 4096) != vec![0xab; 4096], "a refused reload changes nothing");
    // A reload says what it changed, and that nothing did.
    std::fs::write(&config, text.replace("size = \"256m\"\n", "size = \"256m\"\nmode = \"wt\"\n")).unwrap();
    hup(&server);
    let said = await_line("reloaded the config");
    assert!(said.contains("volume default: mode \"\" -> \"wt\""), "{said}");
    hup(&server);
    await_line("reloaded the config: nothing changed");
    // Every volume pass-through: a live detach.
    std::fs::write(&config, text.replace("size = \"256m\"\n", "size = \"256m\"\nmode = \"pt\"\n")).unwrap();
    hup(&server);
    await_line("detached: every volume is pass-through");
    assert!(home(0, 256 << 10) == vec![0xab; 256 << 10], "the dirty data went home");
    qemu_io(port, &["read -P 0xab 0 256k", "write -P 0xcd 1M 64k", "flush"]);
    assert!(home(1 << 20, 64 << 10) == vec![0xcd; 64 << 10], "pass-through: writes go to the disk");
    let child = server.into_child();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait_with_output().unwrap().status;
    await_line("clean shutdown");
    assert!(status.success());
    log.join();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `[[volume]] trace` records the volume's requests from the reload that
/// sets it to the reload that removes it; a bad `trace_max` refuses the
/// reload.
#[test]
fn a_volume_trace_is_recorded_on_demand_between_reloads() {
    need("qemu-io");
    let (dir, config) = small_config("trace");
    let text = std::fs::read_to_string(&config).unwrap();
    let (mut server, port) = start(&config);
    let mut log = common::Log::take(&mut server);
    let hup = |server: &common::Served| unsafe { libc::kill(server.id() as i32, libc::SIGHUP) };
    qemu_io(port, &["write -P 1 0 64k"]);
    let traced = |extra: &str| text.replace("size = \"256m\"\n", &format!("size = \"256m\"\n{extra}"));
    std::fs::write(&config, traced("trace = \"io.csv\"\ntrace_max = \"1k\"\n")).unwrap();
    hup(&server);
    let refused = log.wait_for("reload refused, nothing changed");
    assert!(refused.contains("trace_max"), "{refused}");
    std::fs::write(&config, traced("trace = \"io.csv\"\n")).unwrap();
    hup(&server);
    log.wait_for("recording its I/O to");
    qemu_io(port, &["write -P 2 1M 128k", "read -P 2 1M 128k", "discard 1M 64k", "flush"]);
    std::fs::write(&config, &text).unwrap();
    hup(&server);
    log.wait_for("stopped the trace");
    qemu_io(port, &["write -P 3 2M 4k"]);
    let recs =
        sluice_workload::parse_trace(&std::fs::read_to_string(dir.join("data").join("io.csv")).unwrap()).unwrap();
    use sluice_workload::TraceOp;
    let has = |op: TraceOp, at: u64| recs.iter().any(|r| r.op == op && r.offset == at);
    assert!(has(TraceOp::Write, 1 << 20) && has(TraceOp::Read, 1 << 20) && has(TraceOp::Trim, 1 << 20), "{recs:?}");
    assert!(recs.iter().any(|r| r.op == TraceOp::Flush));
    assert!(!has(TraceOp::Write, 0) && !has(TraceOp::Write, 2 << 20), "only while the key was set: {recs:?}");
    assert_eq!(recs.iter().filter(|r| r.op == TraceOp::Write).map(|r| r.size).sum::<u64>(), 128 << 10);
    let child = server.into_child();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait_with_output().unwrap().status.success());
    log.wait_for("clean shutdown");
    log.join();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The effective config of a file plus flags, printed as TOML, parses back
/// to itself and starts nothing; --export on a config with two volumes is
/// a clear error.
#[test]
fn print_config_shows_the_flags_applied_and_round_trips() {
    let (dir, config) = small_config("printcfg");
    let data = dir.join("elsewhere");
    let print = |config: &Path, extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--print-config", "--config"])
            .arg(config)
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let flags = ["--listen", "127.0.0.1:7", "--listen", "[::1]:7", "--socket", "", "--export", "vm1", "--read-only"];
    let (ok, text, err) = print(&config, &[&flags[..], &["--data-dir", data.to_str().unwrap()]].concat());
    assert!(ok, "{err}");
    for want in [
        "listen = [\"127.0.0.1:7\", \"[::1]:7\"]",
        "unix_socket = \"\"",
        "name = \"vm1\"",
        "read_only = true",
        "size = \"256m\"",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    assert!(text.contains(&format!("data_dir = {:?}", data.display().to_string())), "{text}");
    let printed = dir.join("printed.toml");
    std::fs::write(&printed, &text).unwrap();
    let (ok, again, err) = print(&printed, &[]);
    assert!(ok && again == text, "the printed config does not round-trip: {err}\n{again}");
    assert!(!data.exists(), "--print-config created the data directory");
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap() + "[[volume]]\nname = \"b\"\nsize = \"64m\"\n")
        .unwrap();
    let (ok, _, err) = print(&config, &["--export", "x"]);
    assert!(!ok && err.contains("--export names the one volume; the config has 2"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Started as a systemd `Type=notify` service would be, with the flags a
/// unit file passes: READY=1 once it serves, the pidfile holds its pid,
/// the export answers on the flag's socket under the flag's name,
/// read-only; STOPPING=1 and the pidfile removed on SIGTERM.
#[test]
fn flags_pidfile_and_systemd_notification() {
    need("qemu-io");
    let (dir, config) = small_config("flags");
    let notify = std::os::unix::net::UnixDatagram::bind(dir.join("notify.sock")).unwrap();
    notify.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let (sock, pidfile) = (dir.join("nbd.sock"), dir.join("sluice.pid"));
    let mut cmd = serve_command(&config);
    cmd.args(["--export", "vm", "--read-only", "--socket"]).arg(&sock).arg("--pidfile").arg(&pidfile);
    cmd.env("NOTIFY_SOCKET", dir.join("notify.sock"));
    let (server, _, _) = start_command(cmd);
    let mut buf = [0u8; 64];
    let n = notify.recv(&mut buf).expect("READY=1 from the server");
    assert_eq!(&buf[..n], b"READY=1");
    assert_eq!(std::fs::read_to_string(&pidfile).unwrap().trim(), server.id().to_string());
    let uri = format!("nbd+unix:///vm?socket={}", sock.display());
    let io = |args: &[&str]| Command::new("qemu-io").args(args).output().unwrap();
    let read = io(&["-r", "-f", "raw", &uri, "-c", "read -P 0 0 64k"]);
    assert!(read.status.success(), "{}", String::from_utf8_lossy(&read.stdout));
    let write = io(&["-f", "raw", &uri, "-c", "write 0 4k"]);
    let text = String::from_utf8_lossy(&write.stdout).to_string() + &String::from_utf8_lossy(&write.stderr);
    // qemu sees the read-only flag and will not open the export for writing.
    assert!(!write.status.success() && text.contains("Permission denied"), "{text}");
    stop(server);
    let n = notify.recv(&mut buf).expect("STOPPING=1 from the server");
    assert_eq!(&buf[..n], b"STOPPING=1");
    assert!(!pidfile.exists(), "the pidfile outlived a clean stop");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Requests larger than the spec's 32 MiB, from a client that never
/// negotiates block sizes: reads, writes, write-zeroes and trims of up to
/// 64 MiB, overlapping, every read checked against a model
/// (scripts/nbd-huge.py; upstream's integrityhuge goes to ~48 MiB), on a
/// bands engine and an in-place one, each with a 64 MiB cache — smaller
/// than one request — and `nbdkit memory` as the checker's control.
#[test]
fn requests_up_to_64_mib_are_served_and_read_back_as_written() {
    need("/usr/bin/python3");
    need("nbdkit");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/nbd-huge.py");
    let run = |uri: &str, extra: &[&str]| {
        let out =
            Command::new("/usr/bin/python3").arg(&script).arg(uri).args(["5", "14"]).args(extra).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("OK"), "{uri}: {text}");
        text
    };
    // The control: nbdkit serves requests of this size.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut nbdkit = Command::new("nbdkit")
        .args(["--exit-with-parent", "-f", "-p", &port.to_string(), "-i", "127.0.0.1", "memory", "256M"])
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t.elapsed() < std::time::Duration::from_secs(30), "nbdkit did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    run(&format!("nbd://127.0.0.1:{port}/"), &[]);
    let _ = nbdkit.kill();
    let _ = nbdkit.wait();
    for (name, layout, extra) in
        [("huge-bands", "", vec![]), ("huge-inplace", "layout = \"in-place\"\n", vec!["no-trims"])]
    {
        let (dir, config) = small_config(name);
        let text = std::fs::read_to_string(&config).unwrap().replace("[engine]\n", &format!("[engine]\n{layout}"));
        std::fs::write(&config, text).unwrap();
        let (server, port) = start(&config);
        let said = run(&format!("nbd://127.0.0.1:{port}/default"), &extra);
        assert!(said.contains("max block size 67108864"), "the advertised maximum is what is served: {said}");
        stop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
