//! A real filesystem on a Sluice volume: nbdfuse exposes the NBD export as a
//! file, losetup turns it into a block device, mkfs.ext4 formats it, files
//! are written; everything is unmounted and the server restarted (clean
//! shutdown), and the files read back identical.
//!
//! Needs root (losetup, mount) and /dev/fuse, as CI has on this machine kind;
//! it fails, never skips, without them. Every external command runs under
//! `timeout`, and a guard undoes mounts and loop devices even when an
//! assertion fails, so a broken run cannot leave a hung mount behind.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Runs `cmd args` under `timeout 60`; panics with its output on failure.
fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new("timeout")
        .arg("60")
        .arg(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Best effort, for cleanup: ignores failure.
fn try_sh(cmd: &str, args: &[&str]) {
    let _ = Command::new("timeout").arg("20").arg(cmd).args(args).stdin(Stdio::null()).output();
}

/// The volume as a mounted ext4 filesystem; dropping it unmounts, detaches
/// the loop device and ends nbdfuse, in that order.
struct Mounted {
    fuse_dir: PathBuf,
    mnt: PathBuf,
    loop_dev: Option<String>,
    nbdfuse: Option<Child>,
    mounted: bool,
}

impl Mounted {
    /// nbdfuse + losetup (+ mkfs.ext4 when `format`) + mount.
    fn new(dir: &Path, port: u16, format: bool) -> Mounted {
        Mounted::with_options(dir, port, format, "defaults")
    }

    /// `new`, mounting with `options` (`mount -o`).
    fn with_options(dir: &Path, port: u16, format: bool, options: &str) -> Mounted {
        let (fuse_dir, mnt) = (dir.join("fuse"), dir.join("mnt"));
        std::fs::create_dir_all(&fuse_dir).unwrap();
        std::fs::create_dir_all(&mnt).unwrap();
        let nbdfuse = Command::new("nbdfuse")
            .arg(&fuse_dir)
            .arg(format!("nbd://127.0.0.1:{port}/default"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nbdfuse");
        let mut m = Mounted { fuse_dir, mnt, loop_dev: None, nbdfuse: Some(nbdfuse), mounted: false };
        let file = m.fuse_dir.join("nbd");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::fs::metadata(&file).map(|md| md.len()).unwrap_or(0) != 256 << 20 {
            assert!(Instant::now() < deadline, "nbdfuse did not expose {}", file.display());
            std::thread::sleep(Duration::from_millis(50));
        }
        // 4 KiB sectors: the volume's minimum block. With the default 512
        // the loop device turns a 512-byte-aligned zeroing into an unaligned
        // NBD WRITE_ZEROES, which the server refuses (EINVAL, as the spec
        // allows), and the kernel then fails the filesystem's writes.
        let args = ["-f", "--show", "--sector-size", "4096", file.to_str().unwrap()];
        m.loop_dev = Some(sh("losetup", &args));
        let dev = m.loop_dev.clone().unwrap();
        if format {
            sh("mkfs.ext4", &["-q", "-F", &dev]);
        }
        sh("mount", &["-o", options, &dev, m.mnt.to_str().unwrap()]);
        m.mounted = true;
        m
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }

    /// Unmount and detach, checking each step; the server then holds
    /// every byte the filesystem wrote.
    fn close(mut self) {
        sh("umount", &[self.mnt.to_str().unwrap()]);
        self.mounted = false;
        let dev = self.loop_dev.take().unwrap();
        sh("losetup", &["-d", &dev]);
        // The loop device lets go of the file asynchronously: a moment of
        // "target is busy" is expected, a lasting one is not.
        let deadline = Instant::now() + Duration::from_secs(10);
        let fuse = self.fuse_dir.to_str().unwrap().to_string();
        while Command::new("umount")
            .arg(&fuse)
            .stdin(Stdio::null())
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            assert!(Instant::now() < deadline, "umount {fuse} stayed busy");
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut child = self.nbdfuse.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().expect("nbdfuse status").is_none() {
            assert!(Instant::now() < deadline, "nbdfuse did not exit after its unmount");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.mounted {
            try_sh("umount", &["-l", self.mnt.to_str().unwrap()]);
        }
        if let Some(dev) = self.loop_dev.take() {
            try_sh("losetup", &["-d", &dev]);
        }
        if let Some(mut child) = self.nbdfuse.take() {
            try_sh("umount", &["-l", self.fuse_dir.to_str().unwrap()]);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A file (or its first `bytes`) mounted read-only through a loop device
/// of its own; dropping it unmounts and detaches.
struct Direct {
    mnt: PathBuf,
    loop_dev: Option<String>,
    mounted: bool,
}

impl Direct {
    fn new(file: &Path, bytes: u64, mnt: &Path) -> Direct {
        std::fs::create_dir_all(mnt).unwrap();
        let size = bytes.to_string();
        let args = ["-f", "--show", "-r", "--sizelimit", &size, "--sector-size", "4096", file.to_str().unwrap()];
        let mut d = Direct { mnt: mnt.to_path_buf(), loop_dev: Some(sh("losetup", &args)), mounted: false };
        let dev = d.loop_dev.clone().unwrap();
        sh("mount", &["-o", "ro", &dev, mnt.to_str().unwrap()]);
        d.mounted = true;
        d
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        if self.mounted {
            try_sh("umount", &[self.mnt.to_str().unwrap()]);
        }
        if let Some(dev) = self.loop_dev.take() {
            try_sh("losetup", &["-d", &dev]);
        }
    }
}

/// A metrics sample (name with labels) from the server's endpoint.
fn metric(addr: &str, key: &str) -> f64 {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    let line = text.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key} in the metrics"));
    line.rsplit_once(' ').unwrap().1.parse().unwrap()
}

/// The tests here share the machine's loop devices and FUSE: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds the machine's loop devices and FUSE for one test, once the tools,
/// root and /dev/fuse are there (fails, never skips, without them).
fn prerequisites() -> std::sync::MutexGuard<'static, ()> {
    let one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for bin in ["nbdfuse", "losetup", "mkfs.ext4", "mount", "umount", "timeout"] {
        need(bin);
    }
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root (losetup, mount)");
    assert!(Path::new("/dev/fuse").exists(), "this test needs /dev/fuse");
    one
}

/// Twelve files in three directories, 1 byte to 5 MiB.
fn sample_files() -> Vec<(String, Vec<u8>)> {
    (0..12u64)
        .map(|i| (format!("dir{}/file{i}", i % 3), contents(i, [5 << 20, 4096, 100_000, 1][i as usize % 4])))
        .collect()
}

/// Start the server again, mount the filesystem and find every file as
/// written; then stop and remove the test's directory.
fn assert_served_after_restart(config: &Path, dir: &Path, files: &[(String, Vec<u8>)]) {
    let (server, port) = start(config);
    let fs = Mounted::new(dir, port, false);
    for (name, data) in files {
        let got = std::fs::read(fs.path(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(got == *data, "{name}: {} bytes read back differ from the {} written", got.len(), data.len());
    }
    fs.close();
    stop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// Deterministic file contents.
fn contents(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = sluice_media::rng::SplitMix64(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

#[test]
fn ext4_on_nbdfuse_and_a_loop_device_survives_a_server_restart() {
    let _one = prerequisites();
    let (dir, config) = small_config("ext4");
    let files = sample_files();

    let (server, port) = start(&config);
    let fs = Mounted::new(&dir, port, true);
    for (name, data) in &files {
        let p = fs.path(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    }
    sh("sync", &[]);
    fs.close();
    stop(server);

    assert_served_after_restart(&config, &dir, &files);
}

/// Caching over a plain disk, end to end: an in-place engine serves ext4
/// mounted with `discard`. Big files go past the cache (sequential
/// cutoff), small ones stay in it, deleted files' dirty blocks are dropped
/// (trims) — each visible in the metrics. With the server stopped, `sluice
/// clean` writes every dirty block home, and the capacity file alone,
/// mounted through a loop device of its own, holds every file. The engine
/// then still serves them.
#[test]
fn ext4_on_an_in_place_volume_is_on_the_disk_alone_after_sluice_clean() {
    let _one = prerequisites();
    let (dir, config) = small_config("ext4-in-place");
    let text = std::fs::read_to_string(&config).unwrap().replace("[engine]\n", "[engine]\nlayout = \"in-place\"\n");
    // A directory class: the blocks of the files under /spills.
    let text = text + "[[volume.class]]\nname = \"spills\"\ndirectory = \"/spills\"\nrefresh = \"0.2s\"\nshare = 1.0\n";
    std::fs::write(&config, text).unwrap();
    let files = sample_files();

    let (server, port, metrics) = start_with_metrics(&config);
    let fs = Mounted::with_options(&dir, port, true, "discard");
    for (name, data) in &files {
        let p = fs.path(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    }
    // Temporary files: written, synced, deleted (ext4 sends the trims).
    for i in 0..8u64 {
        std::fs::write(fs.path(&format!("tmp{i}")), contents(100 + i, 256 << 10)).unwrap();
    }
    sh("sync", &[]);
    for i in 0..8u64 {
        std::fs::remove_file(fs.path(&format!("tmp{i}"))).unwrap();
    }
    sh("sync", &[]);
    // A file under /spills: unknown to the class when first written (its
    // metadata is committed after its data); once a refresh has read the
    // committed metadata, rewriting it in place is the class's traffic.
    let spill = contents(200, 256 << 10);
    std::fs::create_dir_all(fs.path("spills")).unwrap();
    std::fs::write(fs.path("spills/s0"), &spill).unwrap();
    sh("sync", &[]);
    // Its blocks are the class's: predicted at write time from where ext4
    // allocates the class's files (scored once the metadata names them),
    // or, cached unclassified, after a refresh (lazy re-classification),
    // counted as recognised late.
    let late_key = "sluice_cache_class_reclassified_bytes{volume=\"default\",class=\"spills\"}";
    let in_time_key = "sluice_cache_class_class_in_time_bytes{volume=\"default\",class=\"spills\"}";
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&metrics, late_key) + metric(&metrics, in_time_key) < (256 << 10) as f64 {
        assert!(Instant::now() < deadline, "the /spills file's blocks were never the class's");
        std::thread::sleep(Duration::from_millis(100));
    }
    let cached_key = "sluice_cache_class_cached_bytes{volume=\"default\",class=\"spills\"}";
    assert!(metric(&metrics, cached_key) >= (256 << 10) as f64);
    let class_key = "sluice_cache_class_write_bytes{volume=\"default\",class=\"spills\"}";
    let in_time = metric(&metrics, class_key);
    eprintln!(
        "/spills: {in_time} bytes written as the class's, {} predicted in time, {} late",
        metric(&metrics, in_time_key),
        metric(&metrics, late_key)
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&metrics, class_key) < (256 << 10) as f64 {
        assert!(Instant::now() < deadline, "the rewritten /spills file never counted as the class's");
        std::thread::sleep(Duration::from_millis(300));
        let mut f = std::fs::OpenOptions::new().write(true).open(fs.path("spills/s0")).unwrap();
        std::io::Write::write_all(&mut f, &spill).unwrap();
        f.sync_all().unwrap();
    }
    let key = |k: &str| format!("sluice_cache_{k}{{volume=\"default\"}}");
    assert!(metric(&metrics, &key("cutoff_bypass_bytes_total")) >= (4 << 20) as f64, "big files bypass the cache");
    assert!(metric(&metrics, &key("write_back_bytes_total")) > 0.0);
    assert!(metric(&metrics, &key("discarded_dirty_bytes_total")) > 0.0, "deleted files were never written home");
    fs.close();
    stop(server);

    let out = Command::new(env!("CARGO_BIN_EXE_sluice")).args(["clean", "--config"]).arg(&config).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.contains("default at byte 0"), "sluice clean: {said}");
    {
        let disk = Direct::new(&dir.join("data").join("capacity.img"), 256 << 20, &dir.join("direct"));
        for (name, data) in &files {
            let got = std::fs::read(disk.mnt.join(name)).unwrap_or_else(|e| panic!("{name} on the disk alone: {e}"));
            assert!(
                got == *data,
                "{name} on the disk alone: {} bytes differ from the {} written",
                got.len(),
                data.len()
            );
        }
    }

    assert_served_after_restart(&config, &dir, &files);
}

/// The ext4 reader replays the journal of a mounted file system: with the
/// committed transactions of a written and synced file overlaid (here
/// `sync` also wrote them in place), the file is found under its directory
/// by reading the image directly while it is still mounted, and the
/// journal held blocks to replay.
#[test]
fn the_ext4_reader_replays_the_journal_of_a_mounted_file_system() {
    let _one = prerequisites();
    let dir = std::env::temp_dir().join(format!("sluice-journal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("mnt")).unwrap();
    let img = dir.join("fs.img");
    std::fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
    sh("mkfs.ext4", &["-q", "-F", "-b", "4096", img.to_str().unwrap()]);
    let mnt = dir.join("mnt");
    sh("mount", &["-o", "loop", img.to_str().unwrap(), mnt.to_str().unwrap()]);
    let data = contents(300, 256 << 10);
    std::fs::create_dir_all(mnt.join("spills/deep")).unwrap();
    std::fs::write(mnt.join("spills/deep/s0"), &data).unwrap();
    sh("sync", &[]);
    let image = std::fs::read(&img).unwrap();
    let read = |offset: u64, len: usize| -> Result<Vec<u8>, sluice_ext4::ReadError> {
        image.get(offset as usize..offset as usize + len).map(|b| b.to_vec()).ok_or_else(|| "past the end".into())
    };
    let found =
        sluice_ext4::Ext4::open(read).and_then(|fs| Ok((fs.journal_blocks(), fs.directory_extents("/spills")?)));
    try_sh("umount", &[mnt.to_str().unwrap()]);
    let (journal, extents) = found.unwrap();
    assert!(journal > 0, "a mounted, synced file system has committed transactions in its journal");
    let held: Vec<u8> = extents.iter().flat_map(|&(a, b)| image[a as usize..b as usize].to_vec()).collect();
    assert!(held.windows(4096).any(|w| w == &data[..4096]), "the file's first block is in /spills' extents");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The operator's case (docs/operate.md): an ext4 disk made and filled
/// without Sluice gets a cache attached; mounted through NBD, every file
/// reads back as it was; files are written and deleted; `sluice cache
/// detach` on the running server sends everything home; then the disk
/// alone passes `e2fsck -fn` and, mounted directly, holds every file as
/// expected.
#[test]
fn an_ext4_disk_with_files_gets_a_cache_and_is_handed_back_whole_by_a_live_detach() {
    let _one = prerequisites();
    need("e2fsck");
    let dir = std::env::temp_dir().join(format!("sluice-attach-mount-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let seed = dir.join("seed");
    let mut files = sample_files();
    for (name, data) in &files {
        let p = seed.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
    }
    let image = dir.join("disk.img");
    std::fs::File::create(&image).unwrap().set_len(256 << 20).unwrap();
    // 4 KiB blocks: the loop device has 4 KiB sectors (a 256 MiB image
    // would get 1 KiB blocks otherwise).
    sh("mkfs.ext4", &["-q", "-F", "-b", "4096", "-d", seed.to_str().unwrap(), image.to_str().unwrap()]);
    let config = attached_config(&dir, &image, "32m");

    let (server, port) = start(&config);
    let fs = Mounted::new(&dir, port, false);
    for (name, data) in &files {
        let got = std::fs::read(fs.path(name)).unwrap_or_else(|e| panic!("{name} through the cache: {e}"));
        assert!(got == *data, "{name} through the cache differs from what the disk held");
    }
    // Written and deleted through Sluice: more than the cache holds.
    for i in 0..6u64 {
        let name = format!("new/file{i}");
        let data = contents(300 + i, 8 << 20);
        std::fs::create_dir_all(fs.path("new")).unwrap();
        std::fs::write(fs.path(&name), &data).unwrap();
        files.push((name, data));
    }
    let gone = files.remove(0).0;
    std::fs::remove_file(fs.path(&gone)).unwrap();
    sh("sync", &[]);
    fs.close();
    // The live detach: everything home while the server runs.
    let out =
        Command::new(env!("CARGO_BIN_EXE_sluice")).args(["cache", "detach", "--config"]).arg(&config).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.contains("the disk alone holds every volume"), "sluice cache detach: {said}");
    stop(server);

    sh("e2fsck", &["-fn", image.to_str().unwrap()]);
    let disk = Direct::new(&image, 256 << 20, &dir.join("direct"));
    for (name, data) in &files {
        let got = std::fs::read(disk.mnt.join(name)).unwrap_or_else(|e| panic!("{name} on the disk alone: {e}"));
        assert!(got == *data, "{name} on the disk alone: {} bytes differ from the {} written", got.len(), data.len());
    }
    assert!(!disk.mnt.join(&gone).exists(), "{gone} was deleted through the cache");
    drop(disk);
    let _ = std::fs::remove_dir_all(&dir);
}
