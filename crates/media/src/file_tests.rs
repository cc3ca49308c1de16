//! Tests of `file`, kept apart so the module itself stays readable.

use super::*;
use crate::buf::IoBuf;
use crate::device::{discard, flush, read_at, sync_io, write_at, ZoneAction};
use std::sync::atomic::{AtomicU64, Ordering};

const BS: u64 = 4096;

/// A file path removed on drop.
struct TempPath(PathBuf);
impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn temp_path(dir: &Path, tag: &str) -> TempPath {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    TempPath(dir.join(format!("sluice-file-test-{}-{tag}-{n}", std::process::id())))
}

/// tmpfs and the default temp dir (a disk filesystem here).
fn dirs() -> Vec<PathBuf> {
    let mut v = vec![];
    if Path::new("/dev/shm").is_dir() {
        v.push(PathBuf::from("/dev/shm"));
    }
    v.push(std::env::temp_dir());
    v
}

/// Open with O_DIRECT; where the filesystem refuses it, say so and use the page cache.
fn open_dev(path: &Path, capacity_bytes: u64, queue_depth: u32) -> FileDevice {
    open_dev_with(path, FileOptions { capacity_bytes: Some(capacity_bytes), queue_depth, ..Default::default() })
}

fn open_dev_with(path: &Path, opts: FileOptions) -> FileDevice {
    match FileDevice::open(path, &opts) {
        Ok(d) => d,
        Err(FileError::DirectUnsupported { .. }) => {
            eprintln!("{}: O_DIRECT refused, testing through the page cache", path.display());
            FileDevice::open(path, &FileOptions { cache: CacheMode::Buffered, ..opts }).expect("buffered open")
        }
        Err(e) => panic!("open {}: {e}", path.display()),
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// Contents of block `block` written in generation `gen`: unique per 8-byte word.
fn fill(buf: &mut [u8], first_block: u64, gen: u64) {
    for (i, w) in buf.chunks_mut(8).enumerate() {
        let word = (first_block * BS / 8 + i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (gen << 56);
        w.copy_from_slice(&word.to_le_bytes());
    }
}

fn patterned(first_block: u64, blocks: u64, gen: u64) -> IoBuf {
    let mut b = IoBuf::zeroed((blocks * BS) as usize);
    fill(&mut b, first_block, gen);
    b
}

/// Run `reqs` keeping up to `qd` in flight; returns completions in completion order.
fn run_at_qd(dev: &FileDevice, reqs: Vec<IoRequest>, qd: usize) -> Vec<IoCompletion> {
    let total = reqs.len();
    let mut reqs = reqs.into_iter();
    let mut out = Vec::with_capacity(total);
    let mut max_in_flight = 0;
    while out.len() < total {
        while dev.in_flight() < qd {
            match reqs.next() {
                Some(r) => dev.submit(r),
                None => break,
            }
        }
        max_in_flight = max_in_flight.max(dev.in_flight());
        dev.reap(1, &mut out);
    }
    assert_eq!(dev.in_flight(), 0);
    assert!(total < qd || max_in_flight == qd, "queue kept full");
    out
}

/// Extents of 1..=8 blocks covering the device, in random order.
fn extents(rng: &mut Rng, blocks: u64) -> Vec<(u64, u64)> {
    let mut v = vec![];
    let mut b = 0;
    while b < blocks {
        let n = (1 + rng.below(8)).min(blocks - b);
        v.push((b, n));
        b += n;
    }
    rng.shuffle(&mut v);
    v
}

fn random_round_trip_at_qd32(dir: &Path) {
    let p = temp_path(dir, "qd32");
    let blocks = 4096; // 16 MiB
    let dev = open_dev(&p.0, blocks * BS, 64);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut ext = extents(&mut rng, blocks);
    let mut gen = vec![1u64; ext.len()];

    let writes = ext.iter().enumerate().map(|(i, &(b, n))| IoRequest::write(b * BS, patterned(b, n, 1), i as u64));
    for c in run_at_qd(&dev, writes.collect(), 32) {
        assert_eq!(c.result, Ok(c.buf.len() as u64), "write {}", c.user_data);
        assert!(c.completed_ns >= c.submitted_ns);
    }
    // Overwrite a random half with a new generation.
    let mut rewrites = vec![];
    for (i, &(b, n)) in ext.iter().enumerate() {
        if rng.below(2) == 0 {
            gen[i] = 2;
            rewrites.push(IoRequest::write(b * BS, patterned(b, n, 2), i as u64));
        }
    }
    let rewritten = rewrites.len() as u64;
    for c in run_at_qd(&dev, rewrites, 32) {
        assert!(c.result.is_ok(), "rewrite {}: {:?}", c.user_data, c.result);
    }
    // Read everything back in another random order and check every byte.
    let mut order: Vec<usize> = (0..ext.len()).collect();
    rng.shuffle(&mut order);
    let reads = order.iter().map(|&i| IoRequest::read(ext[i].0 * BS, (ext[i].1 * BS) as usize, i as u64)).collect();
    let mut expect = IoBuf::zeroed(8 * BS as usize);
    for c in run_at_qd(&dev, reads, 32) {
        let i = c.user_data as usize;
        let (b, n) = ext[i];
        assert_eq!(c.result, Ok(n * BS));
        let expect = &mut expect[..(n * BS) as usize];
        fill(expect, b, gen[i]);
        assert!(c.buf[..] == expect[..], "extent at block {b} ({n} blocks) differs");
    }
    let s = dev.stats();
    assert_eq!(s.writes, ext.len() as u64 + rewritten);
    assert_eq!(s.reads, ext.len() as u64);
    assert_eq!(s.host_read_bytes, blocks * BS);
    assert_eq!(s.errors, 0);
    assert!(s.busy_ns > 0);
    ext.clear();
}

#[test]
fn random_round_trip_at_qd32_tmpfs() {
    random_round_trip_at_qd32(Path::new("/dev/shm"));
}

#[test]
fn random_round_trip_at_qd32_temp_dir() {
    random_round_trip_at_qd32(&std::env::temp_dir());
}

#[test]
fn random_round_trip_with_single_reaper_and_without_spin() {
    let p = temp_path(Path::new("/dev/shm"), "modes");
    for (single_reaper, spin_us) in [(true, DEFAULT_SPIN_US), (false, 0), (true, 0)] {
        let opts = FileOptions {
            capacity_bytes: Some(1024 * BS),
            queue_depth: 32,
            spin_us,
            single_reaper,
            cache: CacheMode::DirectOrBuffered,
            ..Default::default()
        };
        let dev = FileDevice::open(&p.0, &opts).unwrap();
        let mut rng = Rng(0x1234_5678 + spin_us as u64);
        let ext = extents(&mut rng, 1024);
        let gen = 10 + spin_us as u64 + single_reaper as u64;
        let writes = ext.iter().map(|&(b, n)| IoRequest::write(b * BS, patterned(b, n, gen), b)).collect();
        assert!(run_at_qd(&dev, writes, 32).iter().all(|c| c.result.is_ok()));
        let got = read_at(&dev, 0, (1024 * BS) as usize).unwrap();
        assert!(got[..] == patterned(0, 1024, gen)[..], "single_reaper {single_reaper} spin {spin_us}");
    }
}

#[test]
fn single_reaper_rejects_a_second_reaping_thread() {
    let p = temp_path(Path::new("/dev/shm"), "reaper");
    let opts = FileOptions { capacity_bytes: Some(64 * BS), single_reaper: true, ..Default::default() };
    let dev = std::sync::Arc::new(open_dev_with(&p.0, opts));
    write_at(&*dev, 0, &patterned(0, 1, 1)).unwrap();
    let other = std::sync::Arc::clone(&dev);
    let r = std::thread::spawn(move || other.reap(0, &mut Vec::new())).join();
    assert!(r.is_err(), "a second reaping thread must panic");
    write_at(&*dev, BS, &patterned(1, 1, 1)).unwrap(); // the first thread carries on
}

#[test]
fn tmpfs_and_temp_dir_accept_o_direct() {
    // Documents the environment: on kernels ≥ 6.6 tmpfs accepts O_DIRECT.
    for dir in dirs() {
        let p = temp_path(&dir, "direct");
        let opts = FileOptions { capacity_bytes: Some(1 << 20), ..Default::default() };
        match FileDevice::open(&p.0, &opts) {
            Ok(d) => assert!(d.is_direct() && !d.is_block_device()),
            Err(FileError::DirectUnsupported { path }) => {
                eprintln!("{}: O_DIRECT refused (typed error)", path.display());
                let opts = FileOptions { cache: CacheMode::DirectOrBuffered, ..opts };
                assert!(!FileDevice::open(&p.0, &opts).expect("fallback").is_direct());
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn fua_writes_and_flush_persist_across_reopen() {
    for dir in dirs() {
        let p = temp_path(&dir, "fua");
        {
            let dev = open_dev(&p.0, 64 * BS, 16);
            let reqs = (0..16)
                .map(|i| {
                    let mut r = IoRequest::write(i * 4 * BS, patterned(i * 4, 2, 7), i);
                    r.fua = i % 2 == 0;
                    r
                })
                .collect();
            for c in run_at_qd(&dev, reqs, 16) {
                assert_eq!(c.result, Ok(2 * BS));
            }
            flush(&dev).unwrap();
            let s = dev.stats();
            assert_eq!((s.writes, s.flushes, s.host_write_bytes), (16, 1, 32 * BS));
        }
        // Reopen from the file's own size.
        let dev =
            FileDevice::open(&p.0, &FileOptions { cache: CacheMode::DirectOrBuffered, ..Default::default() }).unwrap();
        assert_eq!(dev.info().capacity_bytes, 64 * BS);
        for i in 0..16 {
            let got = read_at(&dev, i * 4 * BS, (4 * BS) as usize).unwrap();
            assert!(got[..(2 * BS) as usize] == patterned(i * 4, 2, 7)[..]);
            assert!(got[(2 * BS) as usize..].iter().all(|&b| b == 0));
        }
    }
}

#[test]
fn discard_reads_back_zeros_and_keeps_neighbours() {
    for dir in dirs() {
        let p = temp_path(&dir, "discard");
        let dev = open_dev(&p.0, 256 * BS, 8);
        write_at(&dev, 0, &patterned(0, 256, 3)).unwrap();
        discard(&dev, 64 * BS, 32 * BS).unwrap();
        discard(&dev, 200 * BS, BS).unwrap();
        let all = read_at(&dev, 0, (256 * BS) as usize).unwrap();
        let want = {
            let mut w = patterned(0, 256, 3);
            w[(64 * BS) as usize..(96 * BS) as usize].fill(0);
            w[(200 * BS) as usize..(201 * BS) as usize].fill(0);
            w
        };
        assert!(all[..] == want[..]);
        assert_eq!(std::fs::metadata(&p.0).unwrap().len(), 256 * BS, "discard keeps the size");
        let s = dev.stats();
        assert_eq!((s.discards, s.host_discard_bytes), (2, 33 * BS));
    }
}

#[test]
fn bad_requests_get_typed_errors_and_change_nothing() {
    let p = temp_path(Path::new("/dev/shm"), "bad");
    let cap = 64 * BS;
    let dev = open_dev(&p.0, cap, 8);
    write_at(&dev, 0, &patterned(0, 64, 1)).unwrap();
    let before = dev.stats();
    type IsExpected = fn(&DeviceError) -> bool;
    let cases: Vec<(IoRequest, IsExpected)> = vec![
        (IoRequest::write(100, patterned(0, 1, 9), 1), |e| matches!(e, DeviceError::Misaligned { .. })),
        (IoRequest::write(0, IoBuf::from_slice(&[9; 100]), 2), |e| matches!(e, DeviceError::Misaligned { .. })),
        (IoRequest::write(cap, patterned(0, 1, 9), 3), |e| matches!(e, DeviceError::OutOfRange { .. })),
        (IoRequest::write(cap - BS, patterned(0, 2, 9), 4), |e| matches!(e, DeviceError::OutOfRange { .. })),
        (IoRequest::read(u64::MAX - (BS - 1), BS as usize, 5), |e| matches!(e, DeviceError::OutOfRange { .. })),
        (IoRequest::read(512, BS as usize, 6), |e| matches!(e, DeviceError::Misaligned { .. })),
        (IoRequest::discard(cap - BS, 2 * BS, 7), |e| matches!(e, DeviceError::OutOfRange { .. })),
        (IoRequest::discard(0, 0, 8), |e| matches!(e, DeviceError::Misaligned { .. })),
        (
            IoRequest { op: IoOp::Write, offset: 0, len: 2 * BS, buf: patterned(0, 1, 9), fua: false, user_data: 9 },
            |e| matches!(e, DeviceError::BadBuffer { .. }),
        ),
    ];
    let n = cases.len() as u64;
    for (req, is_expected) in cases {
        let buf_len = req.buf.len();
        let c = sync_io(&dev, req);
        let e = c.result.expect_err("bad request must fail");
        assert!(is_expected(&e), "request {} got {e:?}", c.user_data);
        assert_eq!(c.buf.len(), buf_len, "buffer comes back");
    }
    assert!(read_at(&dev, 0, cap as usize).unwrap()[..] == patterned(0, 64, 1)[..]);
    let d = dev.stats().since(&before);
    assert_eq!((d.errors, d.writes, d.discards, d.host_write_bytes), (n, 0, 0, 0));
}

#[test]
fn excess_over_queue_depth_gets_queue_full() {
    let p = temp_path(Path::new("/dev/shm"), "qfull");
    let dev = open_dev(&p.0, 64 * BS, 8);
    assert_eq!(dev.info().queue_depth_max, 8);
    for i in 0..12 {
        dev.submit(IoRequest::write(i * BS, patterned(i, 1, 5), i));
    }
    assert_eq!(dev.in_flight(), 12);
    let mut out = vec![];
    while dev.in_flight() > 0 {
        dev.reap(1, &mut out);
    }
    out.sort_by_key(|c| c.user_data);
    for c in &out {
        if c.user_data < 8 {
            assert_eq!(c.result, Ok(BS));
        } else {
            assert_eq!(c.result, Err(DeviceError::QueueFull { queue_depth_max: 8 }));
            assert_eq!(c.buf.len(), BS as usize);
        }
    }
    let got = read_at(&dev, 0, (12 * BS) as usize).unwrap();
    assert!(got[..(8 * BS) as usize] == patterned(0, 8, 5)[..]);
    assert!(got[(8 * BS) as usize..].iter().all(|&b| b == 0), "rejected writes wrote nothing");
    assert_eq!(dev.stats().errors, 4);
}

#[test]
fn reap_min_waits_and_zero_min_only_collects() {
    let p = temp_path(Path::new("/dev/shm"), "reap");
    let dev = open_dev(&p.0, 64 * BS, 32);
    for i in 0..20 {
        dev.submit(IoRequest::write(i * BS, patterned(i, 1, 1), i));
    }
    let mut out = vec![];
    let n = dev.reap(20, &mut out);
    assert_eq!((n, out.len(), dev.in_flight()), (20, 20, 0));
    assert_eq!(dev.reap(5, &mut out), 0, "nothing in flight: returns at once");
}

#[test]
fn zone_requests_are_unsupported() {
    let p = temp_path(Path::new("/dev/shm"), "zone");
    let dev = open_dev(&p.0, 64 * BS, 8);
    let c = sync_io(&dev, IoRequest::zone_append(0, patterned(0, 1, 1), 1));
    assert_eq!(c.result, Err(DeviceError::Unsupported(IoOp::ZoneAppend)));
    let c = sync_io(&dev, IoRequest::zone(ZoneAction::Reset, 0, 2));
    assert_eq!(c.result, Err(DeviceError::Unsupported(IoOp::Zone(ZoneAction::Reset))));
    assert!(read_at(&dev, 0, BS as usize).unwrap().iter().all(|&b| b == 0));
}

#[test]
fn short_transfers_continue_and_stalls_fail() {
    let mut done = 0;
    assert_eq!(advance(IoOp::Write, 3 * BS, &mut done, BS as i32), Step::Continue);
    assert_eq!(advance(IoOp::Write, 3 * BS, &mut done, BS as i32), Step::Continue);
    assert_eq!(done, 2 * BS);
    assert_eq!(advance(IoOp::Write, 3 * BS, &mut done, BS as i32), Step::Complete(Ok(3 * BS)));
    let mut done = 0;
    assert_eq!(advance(IoOp::Read, 2 * BS, &mut done, 100), Step::Continue);
    assert_eq!(advance(IoOp::Read, 2 * BS, &mut done, 0), Step::Complete(Err(DeviceError::Io { errno: libc::EIO })));
    let mut done = 0;
    assert_eq!(
        advance(IoOp::Write, BS, &mut done, -libc::ENOSPC),
        Step::Complete(Err(DeviceError::Io { errno: libc::ENOSPC }))
    );
    assert_eq!(advance(IoOp::Flush, 0, &mut 0, 0), Step::Complete(Ok(0)));
    assert_eq!(advance(IoOp::Discard, BS, &mut 0, 0), Step::Complete(Ok(BS)));
}

#[test]
fn read_past_a_truncated_end_is_an_error_not_a_short_success() {
    for dir in dirs() {
        let p = temp_path(&dir, "trunc");
        let dev = open_dev(&p.0, 16 * BS, 8);
        write_at(&dev, 0, &patterned(0, 16, 1)).unwrap();
        // Somebody shrinks the file behind the device's back, mid-block.
        std::fs::OpenOptions::new().write(true).open(&p.0).unwrap().set_len(4 * BS + 1000).unwrap();
        let c = sync_io(&dev, IoRequest::read(4 * BS, (2 * BS) as usize, 1));
        assert!(matches!(c.result, Err(DeviceError::Io { .. })), "{}: got {:?}", dir.display(), c.result);
        let c = sync_io(&dev, IoRequest::read(8 * BS, BS as usize, 2));
        assert_eq!(c.result, Err(DeviceError::Io { errno: libc::EIO }), "entirely past the end");
        assert_eq!(read_at(&dev, 0, (4 * BS) as usize).unwrap()[..], patterned(0, 4, 1)[..]);
    }
}

#[test]
fn open_rejects_bad_options_with_typed_errors() {
    let p = temp_path(Path::new("/dev/shm"), "opts");
    let with = |o: FileOptions| FileDevice::open(&p.0, &o).map(|_| ()).unwrap_err();
    let cap = Some(1 << 20);
    assert!(matches!(
        with(FileOptions { block_bytes: 1000, capacity_bytes: cap, ..Default::default() }),
        FileError::BadBlockSize { block_bytes: 1000, .. }
    ));
    assert!(matches!(
        with(FileOptions { block_bytes: 256, capacity_bytes: cap, ..Default::default() }),
        FileError::BadBlockSize { .. }
    ));
    assert!(matches!(
        with(FileOptions { capacity_bytes: Some(5000), ..Default::default() }),
        FileError::BadCapacity { capacity_bytes: 5000, .. }
    ));
    assert!(matches!(
        with(FileOptions { queue_depth: 0, capacity_bytes: cap, ..Default::default() }),
        FileError::BadQueueDepth(0)
    ));
    assert!(
        matches!(with(FileOptions::default()), FileError::Open { errno: libc::ENOENT, .. }),
        "missing file and no capacity to create it"
    );
    let null = FileDevice::open("/dev/null", &FileOptions { cache: CacheMode::Buffered, ..Default::default() });
    assert!(matches!(null.map(|_| ()), Err(FileError::NotFileOrBlockDevice { .. })));
    // An existing file grows to the requested capacity and keeps its data; a smaller request uses a prefix.
    std::fs::write(&p.0, vec![7u8; 8192]).unwrap();
    let dev = open_dev(&p.0, 16 * BS, 4);
    assert_eq!(std::fs::metadata(&p.0).unwrap().len(), 16 * BS);
    assert!(read_at(&dev, 0, 8192).unwrap().iter().all(|&b| b == 7));
    drop(dev);
    assert_eq!(open_dev(&p.0, BS, 4).info().capacity_bytes, BS);
}

/// Needs root and util-linux `losetup`: `cargo test -p sluice-media --lib file -- --ignored`.
#[test]
#[ignore]
fn block_device_via_loop() {
    use std::process::Command;
    let p = temp_path(Path::new("/dev/shm"), "loop");
    std::fs::write(&p.0, vec![0u8; (256 * BS) as usize]).unwrap();
    let out = Command::new("losetup").args(["-f", "--show", "--direct-io=on"]).arg(&p.0).output().unwrap();
    assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
    let loopdev = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let result = std::panic::catch_unwind(|| {
        let dev = FileDevice::open(&loopdev, &FileOptions::default()).expect("open loop device");
        assert!(dev.is_block_device());
        assert_eq!(dev.info().capacity_bytes, 256 * BS);
        let too_big = FileOptions { capacity_bytes: Some(512 * BS), ..Default::default() };
        assert!(matches!(FileDevice::open(&loopdev, &too_big), Err(FileError::CapacityTooLarge { .. })));
        write_at(&dev, 0, &patterned(0, 256, 4)).unwrap();
        flush(&dev).unwrap();
        discard(&dev, 16 * BS, 16 * BS).unwrap();
        let got = read_at(&dev, 0, (256 * BS) as usize).unwrap();
        assert!(got[..(16 * BS) as usize] == patterned(0, 16, 4)[..]);
        assert!(got[(16 * BS) as usize..(32 * BS) as usize].iter().all(|&b| b == 0));
        assert!(got[(32 * BS) as usize..] == patterned(0, 256, 4)[(32 * BS) as usize..]);
    });
    let _ = Command::new("losetup").arg("-d").arg(&loopdev).status();
    result.unwrap();
}

/// `zero_fill` leaves no unwritten (reserved only) extent in a new file,
/// where `allocate` alone leaves them all unwritten (the case the option
/// exists for), as `filefrag -v` reports the extents. On a filesystem
/// without unwritten extents (tmpfs) or without filefrag there is nothing
/// to tell apart, and the test says so.
#[test]
fn zero_fill_leaves_no_unwritten_extent() {
    let dir = std::env::temp_dir();
    let extents = |zero_fill: bool| -> Option<String> {
        let p = temp_path(&dir, if zero_fill { "zeroed" } else { "reserved" });
        let opts = FileOptions {
            capacity_bytes: Some(4 << 20),
            cache: CacheMode::DirectOrBuffered,
            allocate: true,
            zero_fill,
            ..Default::default()
        };
        let dev = FileDevice::open(&p.0, &opts).expect("create");
        let b = read_at(&dev, (4 << 20) - 4096, 4096).expect("read");
        assert!(b.iter().all(|&x| x == 0), "reads zeros");
        let out = std::process::Command::new("filefrag").arg("-v").arg(&p.0).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).to_string())
    };
    match (extents(false), extents(true)) {
        (Some(reserved), Some(zeroed)) if reserved.contains("unwritten") => {
            assert!(!zeroed.contains("unwritten"), "zero_fill left unwritten extents:\n{zeroed}");
        }
        other => eprintln!(
            "no unwritten extents to tell apart here ({:?}); nothing checked",
            other.0.map(|_| "filefrag ran")
        ),
    }
}
