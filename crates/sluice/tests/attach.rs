//! A cache attached to a disk that already holds an ext4 file system
//! (`[engine] attach = true`): the disk is served as it is, written only by
//! cleaning, and after `sluice clean` it alone holds the file system; a
//! cache holding dirty data refuses the disk once it was written behind its
//! back. ext4 is written and read with e2fsprogs (`mkfs.ext4`, `debugfs`,
//! `e2fsck`) and the volume copied with `nbdcopy`: no mount is needed.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd} {args:?} failed: {text}");
    text
}

/// `debugfs -w` on `image`: one request.
fn debugfs(image: &Path, request: &str) {
    run("debugfs", &["-w", "-R", request, image.to_str().unwrap()]);
}

fn cat(image: &Path, file: &str) -> Vec<u8> {
    let out = Command::new("debugfs").args(["-R", &format!("cat {file}"), image.to_str().unwrap()]).output().unwrap();
    out.stdout
}

fn contents(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed).collect()
}

/// A directory with a 64 MiB ext4 image holding `/data/a` and `/b`, written
/// without Sluice, and a config attaching a 16 MiB cache to it.
fn setup(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    for bin in ["mkfs.ext4", "debugfs", "e2fsck", "nbdcopy", "qemu-io"] {
        need(bin);
    }
    let dir = std::env::temp_dir().join(format!("sluice-attach-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("disk.img");
    std::fs::File::create(&image).unwrap().set_len(64 << 20).unwrap();
    run("mkfs.ext4", &["-q", "-F", image.to_str().unwrap()]);
    std::fs::write(dir.join("a"), contents(1, 3 << 20)).unwrap();
    std::fs::write(dir.join("b"), contents(2, 100_000)).unwrap();
    debugfs(&image, "mkdir data");
    debugfs(&image, &format!("write {} data/a", dir.join("a").display()));
    debugfs(&image, &format!("write {} b", dir.join("b").display()));
    let config = attached_config(&dir, &image, "16m");
    (dir, image, config)
}

#[test]
fn an_ext4_disk_with_data_gets_a_cache_and_is_whole_again_after_sluice_clean() {
    let (dir, image, config) = setup("ext4");
    let before = std::fs::read(&image).unwrap();
    let (server, port) = start(&config);
    let uri = format!("nbd://127.0.0.1:{port}/default");
    // Served as it is, and not written by attaching.
    let read = dir.join("read.img");
    run("nbdcopy", &[&uri, read.to_str().unwrap()]);
    assert!(std::fs::read(&read).unwrap() == before, "the volume is the disk as it was");
    assert!(std::fs::read(&image).unwrap() == before, "attaching wrote nothing to the disk");
    // Files written and deleted through Sluice: the new image, made with
    // debugfs on a copy, written over the volume (more than the cache holds).
    let changed = dir.join("changed.img");
    std::fs::copy(&image, &changed).unwrap();
    std::fs::write(dir.join("c"), contents(3, 5 << 20)).unwrap();
    debugfs(&changed, &format!("write {} data/c", dir.join("c").display()));
    debugfs(&changed, "rm b");
    run("nbdcopy", &[changed.to_str().unwrap(), &uri]);
    run("nbdcopy", &[&uri, read.to_str().unwrap()]);
    assert!(std::fs::read(&read).unwrap() == std::fs::read(&changed).unwrap(), "the volume reads what was written");
    stop(server);
    // Detach: every dirty block home; the disk alone is the file system.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice")).args(["clean", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "sluice clean: {}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read(&image).unwrap() == std::fs::read(&changed).unwrap(), "the disk is the image written");
    run("e2fsck", &["-fn", image.to_str().unwrap()]);
    assert_eq!(cat(&image, "data/a"), contents(1, 3 << 20));
    assert_eq!(cat(&image, "data/c"), contents(3, 5 << 20));
    assert!(cat(&image, "b").is_empty(), "b was deleted");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cache_with_dirty_data_refuses_a_disk_written_behind_its_back() {
    let (dir, image, config) = setup("behind");
    let (server, port) = start(&config);
    qemu_io(port, &["write -P 0x5a 40M 1M"]);
    stop(server);
    // Mounted without Sluice: a file written with debugfs.
    debugfs(&image, &format!("write {} behind", dir.join("b").display()));
    let disk = std::fs::read(&image).unwrap();
    let cache = std::fs::read(dir.join("cache.img")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice")).args(["serve", "--config"]).arg(&config).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("changed behind the cache's back"), "{said}");
    assert!(said.contains("256 dirty blocks"), "{said}");
    assert!(std::fs::read(&image).unwrap() == disk, "a refused start writes nothing to the disk");
    assert!(std::fs::read(dir.join("cache.img")).unwrap() == cache, "nor to the cache");
    let _ = std::fs::remove_dir_all(&dir);
}
