//! Compares our zipf/pareto generator with the real `fio` binary.
//!
//! Each test writes one fio job file, runs fio on it (`ioengine=null`, so no data is moved) with
//! `write_iolog`, parses the iolog, and runs *the same job file* through our parser and generator.
//! The comparison is on the share of all I/O absorbed by the top 1, 10, 100 and 1000 blocks (blocks
//! sorted by hit count): that is the distribution's shape, independent of where fio's scatter hash and
//! its file-name-seeded `rand_off` put the hot blocks. With a fixed center (`zipf:θ:center`) fio's
//! `rand_off` is deterministic, so there we also compare the hot blocks' exact positions.
//!
//! fio is required: if it is not on PATH the tests fail and say how to install it.

use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_workload::{parse_job_file, Op};

const BS: u64 = 4096;
const SIZE: u64 = 256 * 1024 * 1024;
const NBLOCKS: usize = (SIZE / BS) as usize;

fn require_fio() {
    match Command::new("fio").arg("--version").output() {
        Ok(out) if out.status.success() => {}
        _ => panic!(
            "the `fio` binary is required for this test but was not found on PATH; \
             install it (Debian/Ubuntu: `apt-get install -y fio`)"
        ),
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-fio-{}-{}", tag, std::process::id()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn job_text(name: &str, dist: &str, io_bytes: u64, iolog: Option<&Path>) -> String {
    let mut s = format!(
        "[global]\nioengine=null\nrw=randwrite\nbs=4k\nsize=256m\nio_size={io_bytes}\n\n[{name}]\nrandom_distribution={dist}\n"
    );
    if let Some(p) = iolog {
        s.push_str(&format!("write_iolog={}\n", p.display()));
    }
    s
}

/// Per-block write counts from an fio iolog (version 2 or 3).
fn fio_counts(tag: &str, dist: &str, io_bytes: u64) -> Vec<u32> {
    require_fio();
    let dir = TempDir::new(tag);
    let iolog = dir.0.join("iolog");
    let jobfile = dir.0.join("job.fio");
    std::fs::write(&jobfile, job_text(tag, dist, io_bytes, Some(&iolog))).expect("write job file");
    let out = Command::new("fio")
        .arg("--output-format=terse")
        .arg(format!("--output={}", dir.0.join("out").display()))
        .arg(&jobfile)
        .output()
        .expect("run fio");
    assert!(out.status.success(), "fio failed: {}", String::from_utf8_lossy(&out.stderr));
    let log = std::fs::read_to_string(&iolog).expect("read fio iolog");
    let mut lines = log.lines();
    let version = match lines.next() {
        Some("fio version 2 iolog") => 2,
        Some("fio version 3 iolog") => 3,
        other => panic!("unexpected iolog header {other:?}"),
    };
    let mut counts = vec![0u32; NBLOCKS];
    for line in lines {
        let f: Vec<&str> = line.split_whitespace().collect();
        // v2: `file action [offset len]`; v3: `time_ms file action [offset len]`.
        let f = if version == 3 { &f[1..] } else { &f[..] };
        match f {
            [_, "write", off, len] => {
                let off: u64 = off.parse().expect("iolog offset");
                assert_eq!(len.parse::<u64>().expect("iolog len"), BS);
                assert_eq!(off % BS, 0);
                counts[(off / BS) as usize] += 1;
            }
            [_, "add" | "open" | "close"] => {}
            _ => panic!("unexpected iolog line {line:?}"),
        }
    }
    counts
}

fn our_counts(tag: &str, dist: &str, io_bytes: u64) -> Vec<u32> {
    let file = parse_job_file(&job_text(tag, dist, io_bytes, None)).expect("parse job");
    let job = file.jobs[0].resolve(SIZE).expect("resolve");
    let mut counts = vec![0u32; NBLOCKS];
    for io in job.generator(0).expect("generator") {
        assert_eq!((io.op, io.len), (Op::Write, BS));
        counts[(io.offset / BS) as usize] += 1;
    }
    counts
}

fn top_shares(counts: &[u32]) -> [f64; 4] {
    let mut sorted = counts.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let total: u64 = sorted.iter().map(|&c| u64::from(c)).sum();
    [1, 10, 100, 1000].map(|k| sorted[..k].iter().map(|&c| u64::from(c)).sum::<u64>() as f64 / total as f64)
}

fn compare(tag: &str, dist: &str) {
    let io_bytes = 1_000_000 * BS;
    let fio = fio_counts(tag, dist, io_bytes);
    let ours = our_counts(tag, dist, io_bytes);
    assert_eq!(fio.iter().map(|&c| u64::from(c)).sum::<u64>(), 1_000_000, "fio I/O count");
    assert_eq!(ours.iter().map(|&c| u64::from(c)).sum::<u64>(), 1_000_000, "our I/O count");
    let (f, o) = (top_shares(&fio), top_shares(&ours));
    let mut report = format!("{dist}: top-k share (ours vs fio)");
    for (i, k) in [1, 10, 100, 1000].iter().enumerate() {
        report.push_str(&format!("  top{k}: {:.2}% vs {:.2}%", o[i] * 100.0, f[i] * 100.0));
    }
    println!("{report}");
    for i in 0..4 {
        assert!((o[i] - f[i]).abs() <= 0.01, "{report}");
    }
}

#[test]
fn zipf_0_8_matches_fio() {
    compare("zipf08", "zipf:0.8");
}

#[test]
fn zipf_1_2_matches_fio() {
    compare("zipf12", "zipf:1.2");
}

#[test]
fn pareto_0_9_matches_fio() {
    compare("pareto09", "pareto:0.9");
}

/// With a fixed center, fio's `rand_off = n × center`, so the hottest blocks are at known positions:
/// this checks the scatter hash and the rank order exactly, not just the shape.
#[test]
fn zipf_with_center_puts_hot_blocks_where_fio_does() {
    let dist = "zipf:1.2:0.5";
    let io_bytes = 100_000 * BS;
    let hottest = |counts: &[u32]| {
        let mut idx: Vec<usize> = (0..counts.len()).collect();
        idx.sort_by(|&a, &b| counts[b].cmp(&counts[a]).then(a.cmp(&b)));
        idx.truncate(5);
        idx
    };
    let fio = hottest(&fio_counts("center", dist, io_bytes));
    let ours = hottest(&our_counts("center", dist, io_bytes));
    assert_eq!(fio, vec![32768, 1003, 34774, 3009, 36780]);
    assert_eq!(ours, fio);
}
