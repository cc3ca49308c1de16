//! The fault suite: what an operator gets wrong, and what breaks, against a
//! real `sluice serve`. Every case ends in a refusal or a clear error with
//! nothing lost (issue "Never lose or invent data"; docs/serve.md,
//! "Refusals"). scripts/faults.sh runs this file by name.

mod common;

use common::{device_config, need, qemu_io, small_config, small_config_logged, start, stop};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

/// Run `sluice serve` expecting it to refuse to start: its output.
fn refused_start(config: &Path) -> Output {
    let mut child = common::serve_command(config).spawn().expect("spawn sluice serve");
    // A start that is not refused serves until told to stop: do not wait forever.
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("sluice serve started instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "the refused start exits non-zero");
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn data_file(dir: &Path, name: &str) -> PathBuf {
    dir.join("data").join(name)
}

/// Bytes of a file, for "nothing changed" checks.
fn contents(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_default()
}

/// Start a server, write a pattern over the first 80 MiB (more than the
/// 64 MiB cache: compaction moves data to the capacity device), flush, stop
/// cleanly.
fn engine_with_data(name: &str) -> (PathBuf, PathBuf) {
    let (dir, config) = small_config(name);
    let (server, port) = start(&config);
    qemu_io(port, &["write -P 0x3c 0 80M", "flush"]);
    stop(server);
    (dir, config)
}

fn reads_back(config: &Path) {
    let (server, port) = start(config);
    qemu_io(port, &["read -P 0x3c 0 80M"]);
    stop(server);
}

#[test]
fn a_second_server_on_the_same_data_directory_is_refused() {
    need("qemu-io");
    let (dir, config) = small_config("faults-two");
    let (first, port) = start(&config);
    qemu_io(port, &["write -P 0x11 0 8M", "flush"]);
    let out = refused_start(&config);
    let err = stderr(&out);
    assert!(err.contains("in use by another sluice process") && err.contains(&first.id().to_string()), "{err}");
    // Another data directory naming the same device file: the device is
    // locked too.
    let cache = data_file(&dir, "cache.img");
    let (other_dir, other) = device_config(
        "faults-two-b",
        &format!("size = \"64m\"\npath = {:?}", cache.display().to_string()),
        "size = \"1g\"",
    );
    let err = stderr(&refused_start(&other));
    assert!(err.contains("is in use by another process") && err.contains("cache.img"), "{err}");
    let _ = std::fs::remove_dir_all(&other_dir);
    // The first server never noticed.
    qemu_io(port, &["read -P 0x11 0 8M", "write -P 0x12 8M 1M", "flush", "read -P 0x12 8M 1M"]);
    stop(first);
    let (server, port) = start(&config);
    qemu_io(port, &["read -P 0x11 0 8M", "read -P 0x12 8M 1M"]);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn truncated_or_missing_devices_are_refused_and_nothing_changes() {
    need("qemu-io");
    let (dir, config) = engine_with_data("faults-trunc");
    let (cache, capacity) = (data_file(&dir, "cache.img"), data_file(&dir, "capacity.img"));
    let saved = (contents(&cache), contents(&capacity));
    // Each device truncated to zero, to half, or removed.
    for (path, len) in [(&cache, Some(0)), (&cache, Some(32 << 20)), (&capacity, Some(0)), (&cache, None)] {
        match len {
            Some(l) => std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(l).unwrap(),
            None => std::fs::remove_file(path).unwrap(),
        }
        let before = (contents(&cache), contents(&capacity));
        let err = stderr(&refused_start(&config));
        let why = match len {
            Some(_) => "never resized",
            None => "holds no Sluice superblock",
        };
        assert!(err.contains(why), "{} at {len:?}: {err}", path.display());
        assert!((contents(&cache), contents(&capacity)) == before, "a refused start changed a device");
        assert_eq!(len.is_some(), cache.exists(), "a cache file created by the refused start is removed");
        std::fs::write(&cache, &saved.0).unwrap();
        std::fs::write(&capacity, &saved.1).unwrap();
    }
    // Restored, the engine opens cleanly (the refusals did not mark it
    // unclean) with every block.
    let (server, port) = start(&config);
    qemu_io(port, &["read -P 0x3c 0 80M"]);
    let pid = server.id();
    stop(server);
    let _ = pid;
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cache_truncated_after_kill_9_is_refused() {
    need("qemu-io");
    let (dir, config) = small_config("faults-kill-trunc");
    let (mut server, port) = start(&config);
    qemu_io(port, &["write -P 0x3c 0 80M", "flush"]);
    server.kill().unwrap();
    let _ = server.into_child().wait();
    let cache = data_file(&dir, "cache.img");
    let saved = contents(&cache);
    std::fs::OpenOptions::new().write(true).open(&cache).unwrap().set_len(32 << 20).unwrap();
    let err = stderr(&refused_start(&config));
    assert!(err.contains("never resized"), "{err}");
    std::fs::write(&cache, &saved).unwrap();
    let (server, port) = start(&config);
    qemu_io(port, &["read -P 0x3c 0 80M"]);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn config_changes_the_engine_cannot_apply_are_refused_with_what_differs() {
    need("qemu-io");
    let (dir, config) = engine_with_data("faults-config");
    let text = std::fs::read_to_string(&config).unwrap();
    let cases = [
        (text.replace("size = \"256m\"", "size = \"512m\""), "volume \"default\": the config says 536870912 bytes"),
        (text.replace("band_size = \"32m\"", "band_size = \"64m\""), "engine.band_size"),
        (text.clone() + "[[volume]]\nname = \"more\"\nsize = \"64m\"\n", "volume \"more\" is in the config"),
    ];
    let (cache, capacity) = (data_file(&dir, "cache.img"), data_file(&dir, "capacity.img"));
    let before = (contents(&cache), contents(&capacity));
    for (changed, want) in cases {
        std::fs::write(&config, changed).unwrap();
        let err = stderr(&refused_start(&config));
        assert!(err.contains("the config differs from the engine") && err.contains(want), "{want}: {err}");
    }
    assert!((contents(&cache), contents(&capacity)) == before, "a refused start changed a device");
    std::fs::write(&config, text).unwrap();
    let (server, port) = start(&config);
    qemu_io(port, &["read -P 0x3c 0 80M"]);
    // Reopened cleanly: the refusals did not mark the engine unclean.
    let child = server.into_child();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(stderr(&out).contains("reopened the engine"), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn format_refuses_existing_engines_and_data_unless_forced() {
    need("qemu-io");
    let (dir, config) = engine_with_data("faults-format");
    let format = |force: bool| {
        let mut c = sluice();
        c.args(["format", "--config"]).arg(&config);
        if force {
            c.arg("--force");
        }
        c.output().unwrap()
    };
    let out = format(false);
    assert!(!out.status.success() && stderr(&out).contains("holds engine"), "{}", stderr(&out));
    reads_back(&config);
    // A device with other data on it: `serve` will not create an engine on
    // it, `format` needs --force.
    let (cache, capacity) = (data_file(&dir, "cache.img"), data_file(&dir, "capacity.img"));
    std::fs::remove_file(&cache).unwrap();
    std::fs::remove_file(&capacity).unwrap();
    std::fs::write(&cache, vec![0x5au8; 64 << 20]).unwrap();
    let err = stderr(&refused_start(&config));
    assert!(err.contains("holds no Sluice engine") && err.contains("sluice format"), "{err}");
    assert!(!capacity.exists(), "the capacity file the refused start created is removed");
    let out = format(false);
    assert!(!out.status.success() && stderr(&out).contains("holds data"), "{}", stderr(&out));
    let out = format(true);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("formatted engine"));
    let (server, port) = start(&config);
    qemu_io(port, &["read -P 0 0 8M"]);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_panic_ends_the_server_at_once() {
    need("qemu-io");
    let (dir, config) = small_config_logged("faults-panic");
    let mut child = common::serve_command(&config).env("SLUICE_FAULTS", "compactor-panic").spawn().unwrap();
    let port = {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        line.trim().rsplit(':').next().unwrap().parse::<u16>().unwrap()
    };
    // Enough writes to give the compactor work: it panics, and the process
    // must end (so a supervisor restarts it) rather than hang half alive.
    let _ = Command::new("qemu-io")
        .args(["-f", "raw", &format!("nbd://127.0.0.1:{port}/default"), "-c", "write -P 1 0 64M", "-c", "flush"])
        .output();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(120), "the server outlived its panic");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("injected fault compactor-panic") && stderr(&out).contains("a bug stopped"));
    // The next start recovers.
    let (server, port) = start(&config);
    qemu_io(port, &["read -P 0 64M 1M"]);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_device_that_is_not_a_file_or_cannot_be_created_gets_a_clear_error() {
    let (dir, config) =
        device_config("faults-perm", "size = \"64m\"\npath = \"/proc/nope/cache.img\"", "size = \"1g\"");
    let err = stderr(&refused_start(&config));
    assert!(err.contains("opening the cache device") && err.contains("/proc/nope/cache.img"), "{err}");
    assert!(err.contains("No such file or directory"), "the OS error in words: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Byte offsets of the 4 KiB blocks of `data` that start a Sluice log
/// record header (magic "SLRC", kind 1 = write).
fn record_headers(data: &[u8]) -> Vec<usize> {
    (0..data.len() / 4096)
        .map(|b| b * 4096)
        .filter(|&o| data[o..o + 4] == 0x534c_5243u32.to_le_bytes() && data[o + 6] == 1)
        .collect()
}

fn check(config: &Path, args: &[&str]) -> Output {
    sluice().args(["check", "--config"]).arg(config).args(args).output().unwrap()
}

#[test]
fn a_damaged_durable_log_record_is_refused_reported_and_salvaged() {
    need("qemu-io");
    let (dir, config) = small_config_logged("faults-logdamage");
    let (mut server, port) = start(&config);
    // Three 4 MiB chunks of log, flushed, then one more write (whose header
    // carries the watermark); then kill -9: recovery reads the log.
    qemu_io(port, &["write -P 0x3c 0 12M", "flush", "write -P 0x3d 20M 64k"]);
    server.kill().unwrap();
    let _ = server.into_child().wait();
    let cache = data_file(&dir, "cache.img");
    let mut img = std::fs::read(&cache).unwrap();
    // A record in the middle of the first log chunk (a sealed one).
    let chunk1 = record_headers(&img).into_iter().filter(|&o| (4 << 20..8 << 20).contains(&o)).collect::<Vec<_>>();
    let victim = chunk1[chunk1.len() / 2];
    img[victim + 100] ^= 0x01;
    std::fs::write(&cache, &img).unwrap();
    let err = stderr(&refused_start(&config));
    assert!(err.contains("recovery found damage") && err.contains("headers are damaged"), "{err}");
    // `sluice check` says the same (exit 1), as text and as JSON.
    let out = check(&config, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("log records"), "{}", String::from_utf8_lossy(&out.stdout));
    let out = check(&config, &["--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["damage"][0]["kind"], "log_records", "{report}");
    assert_eq!(report["clean"], false);
    // Salvage accepts it; the engine then serves, and checks clean.
    let out = check(&config, &["--salvage"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("accepted: log records") && said.contains("now finds no damage"), "{said}");
    let out = check(&config, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let (server, port) = start(&config);
    qemu_io(port, &["read -P 0x3d 20M 64k"]);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The issue's case: the newest log record, which a completed FLUSH
/// covered and no later record names, damaged at rest, then kill -9. It was
/// taken for a torn tail and its 64 blocks read back their previous
/// version; the flushed watermark's claim now makes it damage: the start
/// is refused and `sluice check` reports it.
#[test]
fn the_newest_flushed_record_damaged_is_refused_not_rolled_back() {
    need("qemu-io");
    let (dir, config) = small_config("faults-newest");
    let (mut server, port) = start(&config);
    qemu_io(port, &["write -P 0x41 0 256k", "flush", "write -P 0x42 0 256k", "flush"]);
    server.kill().unwrap();
    let _ = server.into_child().wait();
    let cache = data_file(&dir, "cache.img");
    let mut img = std::fs::read(&cache).unwrap();
    let lsn = |o: usize| u64::from_le_bytes(img[o + 48..o + 56].try_into().unwrap());
    let newest = record_headers(&img).into_iter().max_by_key(|&o| lsn(o)).expect("a write record");
    img[newest + 100] ^= 0x01;
    std::fs::write(&cache, &img).unwrap();
    let err = stderr(&refused_start(&config));
    assert!(err.contains("recovery found damage") && err.contains("headers are damaged"), "{err}");
    let out = check(&config, &[]);
    assert_eq!(out.status.code(), Some(1), "sluice check found nothing: {}", String::from_utf8_lossy(&out.stdout));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same for a direct write (docs/engine.md, "Direct writes"): 256 KiB
/// writes go to the capacity device as segments of their own, and the
/// newest, which a FLUSH covered, damaged at rest, then kill -9. Nothing
/// else holds its data and no later segment names it: the mark the FLUSH
/// wrote makes it damage, refused, not a torn tail whose blocks quietly
/// read back their previous version.
#[test]
fn the_newest_flushed_direct_segment_damaged_is_refused_not_rolled_back() {
    need("qemu-io");
    let (dir, config) = small_config("faults-direct");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("[engine]\n", "[engine]\ndirect_write = \"128k\"\n")).unwrap();
    let (mut server, port) = start(&config);
    qemu_io(port, &["write -P 0x41 0 256k", "flush", "write -P 0x42 0 256k", "flush"]);
    server.kill().unwrap();
    let _ = server.into_child().wait();
    let capacity = data_file(&dir, "capacity.img");
    let mut img = std::fs::read(&capacity).unwrap();
    let seq = |o: usize| u64::from_le_bytes(img[o + 8..o + 16].try_into().unwrap());
    let segments: Vec<usize> = (0..img.len() / 4096)
        .map(|b| b * 4096)
        .filter(|&o| img[o..o + 4] == 0x534c_5243u32.to_le_bytes() && img[o + 6] == 3)
        .collect();
    assert_eq!(segments.len(), 2, "each write a direct segment");
    let newest = segments.into_iter().max_by_key(|&o| seq(o)).unwrap();
    assert!(img[newest + 4096..newest + 8192].iter().all(|&b| b == 0x42), "the newest holds the second write");
    img[newest + 100] ^= 0x01;
    std::fs::write(&capacity, &img).unwrap();
    let err = stderr(&refused_start(&config));
    assert!(err.contains("recovery found damage"), "{err}");
    let out = check(&config, &[]);
    assert_eq!(out.status.code(), Some(1), "sluice check found nothing: {}", String::from_utf8_lossy(&out.stdout));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_block_damaged_at_rest_fails_its_read_is_counted_and_checked() {
    need("qemu-io");
    let (dir, config) = engine_with_data("faults-rest");
    // A block of the pattern on the capacity device (compaction put it there).
    let capacity = data_file(&dir, "capacity.img");
    let mut img = std::fs::read(&capacity).unwrap();
    let at = (0..img.len() / 4096).map(|b| b * 4096).find(|&o| img[o..o + 4096].iter().all(|&x| x == 0x3c)).unwrap();
    img[at + 7] ^= 0x20;
    std::fs::write(&capacity, &img).unwrap();
    let out = check(&config, &[]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("data damaged (capacity device, byte"), "{text}");
    let (server, port, metrics) = common::start_with_metrics(&config);
    let out = Command::new("qemu-io")
        .args(["-f", "raw", &format!("nbd://127.0.0.1:{port}/default"), "-c", "read -P 0x3c 0 80M"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("Input/output error"), "the damaged block is an error, never data: {said}");
    let body = scrape(&metrics);
    assert!(body.contains("sluice_volume_checksum_errors_total{volume=\"default\"} 1"), "{body}");
    let child = server.into_child();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(stderr(&out).contains("checksum mismatch reading LBA"), "logged: {}", stderr(&out));
    // Salvage acts on exactly what check found: the block is trimmed (and
    // named), check is clean afterwards, every other block reads back.
    let out = check(&config, &["--salvage"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{said}{}", stderr(&out));
    assert!(said.contains("trimmed (now reads as zeros): volume \"default\" LBA"), "{said}");
    assert!(said.contains("now finds no damage"), "{said}");
    let out = check(&config, &[]);
    assert!(out.status.success(), "check after salvage: {}", String::from_utf8_lossy(&out.stdout));
    let lba: u64 = said
        .split("LBA ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no LBA in {said}"));
    let (server, port) = start(&config);
    let at = lba * 4096;
    qemu_io(port, &[&format!("read -P 0 {at} 4k")]);
    if at > 0 {
        qemu_io(port, &[&format!("read -P 0x3c 0 {at}")]);
    }
    qemu_io(port, &[&format!("read -P 0x3c {} {}", at + 4096, (80 << 20) - at - 4096)]);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The text of one GET /metrics on `addr`.
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut t = String::new();
    c.read_to_string(&mut t).unwrap();
    t
}

/// In place, a byte flipped in a home Sluice wrote (issue 37 item 2): the
/// read is an I/O error, never the damaged bytes; `sluice check` names it
/// and counts the verified homes; `--salvage` zeroes it and check is clean.
#[test]
fn a_damaged_home_in_place_is_an_error_a_finding_and_salvaged() {
    need("qemu-io");
    let (dir, config) = common::config_of(
        "faults-home",
        "[cache]\nsize = \"64m\"\n[capacity]\nsize = \"512m\"\n\
         [engine]\nlayout = \"in-place\"\nchunk_size = \"4m\"\n\
         [[volume]]\nname = \"default\"\nsize = \"256m\"\nmode = \"pt\"\n",
    );
    let (server, port) = start(&config);
    qemu_io(port, &["write -P 0x5a 0 16M", "flush"]);
    stop(server);
    // Pass-through: every block went home, at its own LBA from byte 0.
    let capacity = data_file(&dir, "capacity.img");
    let mut img = std::fs::read(&capacity).unwrap();
    assert!(img[100 * 4096..101 * 4096].iter().all(|&x| x == 0x5a), "block 100's home holds it");
    img[100 * 4096 + 9] ^= 0x01;
    std::fs::write(&capacity, &img).unwrap();
    let out = check(&config, &[]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("LBA 100: data damaged (capacity device, byte 409600)"), "{text}");
    assert!(text.contains("4096 homes verified"), "{text}");
    let (server, port, metrics) = common::start_with_metrics(&config);
    let out = Command::new("qemu-io")
        .args(["-f", "raw", &format!("nbd://127.0.0.1:{port}/default"), "-c", "read -P 0x5a 0 16M"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("Input/output error"), "the damaged home is an error, never data: {said}");
    qemu_io(port, &["read -P 0x5a 0 400k", "read -P 0x5a 404k 1M"]);
    let body = scrape(&metrics);
    assert!(body.contains("sluice_volume_checksum_errors_total{volume=\"default\"} 1"), "{body}");
    let logged = stop(server);
    assert!(logged.contains("checksum mismatch reading LBA 100"), "logged: {logged}");
    let out = check(&config, &["--salvage"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{said}{}", stderr(&out));
    assert!(said.contains("volume \"default\" LBA 100"), "{said}");
    let out = check(&config, &[]);
    assert!(out.status.success(), "check after salvage: {}", String::from_utf8_lossy(&out.stdout));
    let (server, port) = start(&config);
    qemu_io(port, &["read -P 0 400k 4k", "read -P 0x5a 0 400k", "read -P 0x5a 404k 15956k"]);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A byte flipped in the clean-shutdown checkpoint: the start refuses and
/// names the commands that help; `sluice check` reports it; `--salvage`
/// rebuilds the maps from the media and says so; then check is clean and
/// every block reads back.
#[test]
fn a_damaged_checkpoint_is_refused_with_the_fix_and_salvaged_from_the_media() {
    need("qemu-io");
    let (dir, config) = engine_with_data("faults-checkpoint");
    let sb = contents(&data_file(&dir, "cache.img"))[..4096].to_vec();
    let offset = u64::from_le_bytes(sb[64..72].try_into().unwrap()) as usize;
    let len = u64::from_le_bytes(sb[72..80].try_into().unwrap()) as usize;
    assert!(len > 64, "a checkpoint was written ({len} bytes at {offset})");
    let capacity = data_file(&dir, "capacity.img");
    let mut img = std::fs::read(&capacity).unwrap();
    img[offset + len / 2] ^= 0x04;
    std::fs::write(&capacity, &img).unwrap();
    let err = stderr(&refused_start(&config));
    assert!(err.contains("checkpoint") && err.contains("sluice check --salvage"), "{err}");
    let out = check(&config, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    let out = check(&config, &["--salvage"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success() && said.contains("rebuilt every map from the media"), "{said}{}", stderr(&out));
    let out = check(&config, &[]);
    assert!(out.status.success(), "check after salvage: {}", String::from_utf8_lossy(&out.stdout));
    reads_back(&config);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_device_the_filesystem_has_no_room_for_is_refused_at_creation() {
    // Files are allocated in full when created: a filesystem without the
    // room fails the start at once, in words, not a workload later.
    let (dir, config) = device_config("faults-full", "size = \"64m\"", "size = \"12t\"");
    let err = stderr(&refused_start(&config));
    assert!(err.contains("allocating the file") && err.contains("capacity.img"), "{err}");
    assert!(err.contains("No space left on device") || err.contains("File too large"), "the OS error in words: {err}");
    assert!(!data_file(&dir, "capacity.img").exists() && !data_file(&dir, "cache.img").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn protocol_violations_get_an_error_reply_and_a_log_line_with_the_peer() {
    use std::io::{Read, Write};
    let (dir, config) = small_config("faults-proto");
    let (server, port) = start(&config);
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let local = c.local_addr().unwrap().to_string();
    let mut greeting = [0u8; 18];
    c.read_exact(&mut greeting).unwrap();
    c.write_all(&3u32.to_be_bytes()).unwrap(); // fixed newstyle, no zeroes
                                               // An option whose data is beyond any bound (1 GiB).
    let mut opt = 0x4948_4156_454f_5054u64.to_be_bytes().to_vec(); // IHAVEOPT
    opt.extend_from_slice(&7u32.to_be_bytes());
    opt.extend_from_slice(&(1u32 << 30).to_be_bytes());
    c.write_all(&opt).unwrap();
    let mut reply = [0u8; 20];
    c.read_exact(&mut reply).unwrap();
    let reply_type = u32::from_be_bytes(reply[12..16].try_into().unwrap());
    assert_eq!(reply_type, (1 << 31) + 9, "NBD_REP_ERR_TOO_BIG before the close");
    let child = server.into_child();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(err.contains(&format!("NBD client {local}")) && err.contains("option data"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A start refused for a value that is wrong only when serving (a duration
/// in the wrong unit, an unknown cache mode, a listen port in use) writes
/// nothing: no data directory, no device file, no engine marked unclean.
/// `--print-config` refuses the same values.
#[test]
fn a_refused_start_writes_nothing() {
    let dir = std::env::temp_dir().join(format!("sluice-refused-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_port = busy.local_addr().unwrap().port();
    let data = dir.join("data");
    let devices = "[cache]\nsize = \"64m\"\n[capacity]\nsize = \"256m\"\n";
    let in_place = "[engine]\nlayout = \"in-place\"\n";
    let free = "127.0.0.1:0".to_string();
    for (name, listen, tables, expect) in [
        (
            "cleaning_idle",
            free.clone(),
            format!("{in_place}cleaning = \"alru\"\ncleaning_idle = \"200ms\"\n"),
            "cleaning_idle",
        ),
        (
            "mode",
            free.clone(),
            format!("{in_place}[[volume]]\nname = \"v\"\nsize = \"64m\"\nmode = \"writeback\"\n"),
            "writeback",
        ),
        ("port", format!("127.0.0.1:{busy_port}"), String::new(), "127.0.0.1"),
    ] {
        let config = dir.join(format!("{name}.toml"));
        let top = format!("data_dir = {data:?}\nmetrics_listen = \"\"\nlisten = [{listen:?}]\n");
        std::fs::write(&config, format!("{top}{devices}{tables}")).unwrap();
        let out = sluice().args(["serve", "--config"]).arg(&config).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(expect), "{name}: {err}");
        assert!(!data.exists(), "{name}: a refused start created {}", data.display());
        if name != "port" {
            let out = sluice().args(["serve", "--print-config", "--config"]).arg(&config).output().unwrap();
            assert!(!out.status.success(), "{name}: --print-config accepted what serve refuses");
        }
    }
    drop(busy);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sizes in the config read as their units say (docs/serve.md, "Sizes"):
/// `MiB` is 2^20 (it was read as 10^6, and "1GiB" refused as not a
/// multiple of the block).
#[test]
fn iec_sizes_in_the_config_are_powers_of_two() {
    need("qemu-io");
    let (dir, config) = device_config("sizes", "size = \"64MiB\"", "size = \"1GiB\"");
    let (server, port) = start(&config);
    qemu_io(port, &["write -P 0x4c 0 1M", "flush"]);
    stop(server);
    assert_eq!(std::fs::metadata(data_file(&dir, "cache.img")).unwrap().len(), 64 << 20);
    assert_eq!(std::fs::metadata(data_file(&dir, "capacity.img")).unwrap().len(), 1 << 30);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A read-only file system holding the data directory (a snapshot, a
/// recovery mount): `sluice check`, a read-only scan, works there, and so
/// does `sluice serve --read-only`, which opens the engine read-only (shared
/// claims, nothing written: every file is byte for byte as it was); a
/// read-write start is refused with the file system's error. Needs root
/// (mount), as CI has.
#[test]
fn check_and_read_only_serve_work_on_a_read_only_file_system() {
    need("qemu-io");
    let (dir, config) = device_config("rofs", "size = \"64m\"", "size = \"512m\"");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mount = |args: &[&str]| {
        let out = Command::new("mount").args(args).output().unwrap();
        assert!(out.status.success(), "mount {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let d = data.to_str().unwrap();
    mount(&["-t", "tmpfs", "-o", "size=1g", "tmpfs", d]);
    struct Unmount(String);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(d.to_string());
    let (server, port) = start(&config);
    qemu_io(port, &["write -P 0x6b 0 2M", "write -P 0x6c 100M 64k", "flush"]);
    stop(server);
    // The kernel closes a stopped server's io_uring files asynchronously:
    // the file system may stay busy (open for writing) a moment longer.
    let t = Instant::now();
    while !Command::new("mount").args(["-o", "remount,ro", d]).status().unwrap().success() {
        assert!(t.elapsed() < Duration::from_secs(30), "{d} stayed busy after the server stopped");
        std::thread::sleep(Duration::from_millis(100));
    }
    let files = ["cache.img", "capacity.img", "sluice.lock"];
    let before: Vec<Vec<u8>> = files.iter().map(|f| contents(&data.join(f))).collect();
    let out = check(&config, &[]);
    assert!(
        out.status.success(),
        "check on a read-only file system: {}{}",
        stderr(&out),
        String::from_utf8_lossy(&out.stdout)
    );
    let mut cmd = common::serve_command(&config);
    cmd.arg("--read-only");
    let (server, port, _) = common::start_command(cmd);
    let io = |args: &[&str]| Command::new("qemu-io").args(args).output().unwrap();
    let uri = format!("nbd://127.0.0.1:{port}/default");
    let read = io(&[
        "-r",
        "-f",
        "raw",
        &uri,
        "-c",
        "read -P 0x6b 0 2M",
        "-c",
        "read -P 0x6c 100M 64k",
        "-c",
        "read -P 0 200M 1M",
    ]);
    let said = String::from_utf8_lossy(&read.stdout).to_string();
    assert!(read.status.success() && !said.contains("Pattern verification failed"), "{said}");
    let log = stop(server);
    assert!(log.contains("read-only"), "{log}");
    let after: Vec<Vec<u8>> = files.iter().map(|f| contents(&data.join(f))).collect();
    assert!(before == after, "a read-only check or serve changed a file");
    // A read-write start is refused, and says why.
    let out = refused_start(&config);
    assert!(stderr(&out).contains("Read-only file system"), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Refusals are logged, rate-limited, with the peer: an OPT_GO for an
/// export that does not exist, a request the server answers with an error,
/// and a client that disconnects in the middle of a write's payload (the
/// write is not done: the data before it reads back unchanged).
#[test]
fn refusals_and_cut_payloads_are_logged_with_the_peer() {
    use std::io::Write;
    need("nbdinfo");
    let (dir, config) = small_config("refusal-log");
    let (server, port) = start(&config);
    let out = Command::new("nbdinfo").arg(format!("nbd://127.0.0.1:{port}/nosuch")).output().unwrap();
    assert!(!out.status.success(), "nbdinfo on an unknown export");
    // A read past the end, with libnbd's own checks off.
    let (ok, text) = common::libnbd(
        &format!("nbd://127.0.0.1:{port}/default"),
        "",
        "h.set_strict_mode(0)\ntry:\n    h.pread(4096, h.get_size())\n    check(False, 'a read past the end succeeded')\nexcept nbd.Error:\n    pass",
    );
    assert!(ok, "{text}");
    // A 64 KiB write whose payload stops after 1,000 bytes.
    let mut s = raw_client(port);
    let mut req = write_request(7, 1 << 20, 64 << 10);
    req.extend_from_slice(&[0x5a; 1000]);
    s.write_all(&req).unwrap();
    drop(s);
    qemu_io(port, &["read -P 0 1M 64k"]);
    let log = stop(server);
    for want in [
        "no export named \"nosuch\"",
        "Read of 4096 bytes at byte",
        "in the middle of a write's payload (65536 bytes at byte 1048576)",
    ] {
        assert!(log.contains(want), "the log lacks {want:?}:\n{log}");
    }
    assert!(log.contains("NBD client 127.0.0.1:"), "the peer is named:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client negotiated by hand (old-style: NBD_OPT_EXPORT_NAME "default",
/// no zeroes), ready for requests.
fn raw_client(port: u16) -> std::net::TcpStream {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap(); // FIXED_NEWSTYLE | NO_ZEROES
    let name = b"default";
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
    opt.extend_from_slice(&(name.len() as u32).to_be_bytes());
    opt.extend_from_slice(name);
    s.write_all(&opt).unwrap();
    let mut export = [0u8; 10];
    s.read_exact(&mut export).unwrap();
    s
}

/// An NBD_CMD_WRITE request header (its payload to follow).
fn write_request(cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut req = 0x2560_9513u32.to_be_bytes().to_vec();
    req.extend_from_slice(&0u16.to_be_bytes()); // flags
    req.extend_from_slice(&1u16.to_be_bytes()); // NBD_CMD_WRITE
    req.extend_from_slice(&cookie.to_be_bytes());
    req.extend_from_slice(&offset.to_be_bytes());
    req.extend_from_slice(&len.to_be_bytes());
    req
}

/// The simple reply to request `cookie`: its error (0: done).
fn simple_reply(s: &mut std::net::TcpStream, cookie: u64) -> u32 {
    use std::io::Read;
    let mut r = [0u8; 16];
    s.read_exact(&mut r).unwrap();
    assert_eq!(&r[..4], &0x6744_6698u32.to_be_bytes(), "a simple reply");
    assert_eq!(u64::from_be_bytes(r[8..16].try_into().unwrap()), cookie, "the reply's cookie");
    u32::from_be_bytes(r[4..8].try_into().unwrap())
}

/// SIGTERM while clients are connected: requests they send as the stop
/// begins are still answered (on several connections at once), written and
/// flushed before the connections close, and the stop is clean; the data
/// reads back after a restart.
#[test]
fn a_stop_answers_what_clients_sent_as_it_began() {
    use std::io::{Read, Write};
    need("qemu-io");
    let (dir, config) = small_config("stop-drain");
    let (mut server, port) = start(&config);
    let mut log = common::Log::take(&mut server);
    let mut clients: Vec<std::net::TcpStream> = (0..4).map(|_| raw_client(port)).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        let mut req = write_request(i as u64, i as u64 * 65536, 4096);
        req.extend_from_slice(&[0x10 + i as u8; 4096]);
        c.write_all(&req).unwrap();
        assert_eq!(simple_reply(c, i as u64), 0);
    }
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    // Sent once the server no longer reads new requests as usual (its
    // read sides are shut): they are still answered.
    log.wait_for("stopped accepting");
    for (i, c) in clients.iter_mut().enumerate() {
        let mut req = write_request(100 + i as u64, i as u64 * 65536 + 4096, 4096);
        req.extend_from_slice(&[0x20 + i as u8; 4096]);
        c.write_all(&req).unwrap();
    }
    for (i, c) in clients.iter_mut().enumerate() {
        assert_eq!(simple_reply(c, 100 + i as u64), 0, "connection {i}: the write sent as the stop began");
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
        assert!(rest.is_empty(), "connection {i}: nothing more after the last reply");
    }
    log.wait_for("clean shutdown");
    let status = server.into_child().wait().unwrap();
    assert!(status.success(), "{status:?}");
    log.join();
    let (server, port) = start(&config);
    for i in 0..4u64 {
        qemu_io(
            port,
            &[
                &format!("read -P {} {} 4k", 0x10 + i, i * 65536),
                &format!("read -P {} {} 4k", 0x20 + i, i * 65536 + 4096),
            ],
        );
    }
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
