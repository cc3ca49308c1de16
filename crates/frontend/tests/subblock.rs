//! Clients that never negotiated block sizes are served at any byte offset
//! (read-modify-write of the covering blocks, ordered against every other
//! write of the export); clients that did are held to whole blocks.

mod common;

use std::io::Read;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::raw::{Raw, Reply};
use common::*;
use sluice_frontend::proto::{self, Chunk, ClientOption, Command};
use sluice_volume::Volume;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 4 * MIB;
/// Where the random requests land: a few dozen blocks, so they overlap.
const SPAN: u64 = 96 * 1024;
const READ: u16 = Command::Read as u16;
const WRITE: u16 = Command::Write as u16;

/// splitmix64: the seed is printed with every failure.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Sends a request (and a write's payload); returns its errno.
fn call(c: &mut Raw, command: u16, flags: u16, cookie: u64, off: u64, len: u64, payload: &[u8]) -> u32 {
    c.request(command, flags, cookie, off, len as u32);
    c.send(payload);
    let (r, _) = c.reply(0);
    Raw::errno_of(&r)
}

/// Reads `[off, off + len)` with either reply style.
fn read(c: &mut Raw, structured: bool, cookie: u64, off: u64, len: u64) -> Vec<u8> {
    c.request(READ, 0, cookie, off, len as u32);
    let (r, data) = c.reply(if structured { 0 } else { len as usize });
    match r {
        Reply::Simple { error: 0, .. } => data,
        Reply::Chunk { done: true, chunk: Chunk::OffsetData { offset, data }, .. } if offset == off => data,
        other => panic!("read {off}+{len}: {other:?}"),
    }
}

/// A byte-granular session: GO without asking for block sizes. The server
/// says the minimum is 1.
fn byte_granular(port: u16, structured: bool, meta: bool) -> Raw {
    let (c, size, _, sizes) = Raw::go_asking(port, "default", structured, meta, &[]);
    assert_eq!(size, SIZE);
    let (min, preferred, _) = sizes.expect("block sizes are always sent");
    assert_eq!((min, preferred), (1, 4096), "the minimum offered to a client that did not ask");
    c
}

/// Random writes, zeroes, trims and reads at byte offsets and lengths,
/// checked against a model after every read and against the volume at the
/// end. Trimmed whole blocks become unknown (a trim is a hint).
#[test]
fn a_client_that_never_asked_for_block_sizes_is_served_at_any_byte_offset() {
    for (structured, seed) in [(false, 0x5b1c_e001u64), (true, 0x5b1c_e002)] {
        let vol = MemVolume::new("default", SIZE);
        let prefill = pattern(seed, SPAN as usize);
        vol.write(0, &prefill, false).expect("prefill");
        let mut model: Vec<Option<u8>> = prefill.into_iter().map(Some).collect();
        let h = start(vec![vol.clone()]);
        let mut c = byte_granular(h.port().expect("tcp"), structured, false);
        let mut rng = Rng(seed);
        let ctx = |i: usize, what: &str| format!("seed {seed:#x} op {i} ({what}), structured {structured}");
        for i in 0..400 {
            let off = rng.below(SPAN - 1);
            let len = 1 + rng.below((SPAN - off).min(9000));
            let (o, n) = (off as usize, len as usize);
            let cookie = i as u64;
            match rng.below(10) {
                0..=4 => {
                    let data = pattern(rng.next(), n);
                    let flags = if rng.below(4) == 0 { proto::CMD_FLAG_FUA } else { 0 };
                    assert_eq!(call(&mut c, WRITE, flags, cookie, off, len, &data), 0, "{}", ctx(i, "write"));
                    for (m, b) in model[o..o + n].iter_mut().zip(data) {
                        *m = Some(b);
                    }
                }
                5 => {
                    let flags = if rng.below(2) == 0 { proto::CMD_FLAG_NO_HOLE } else { 0 };
                    let zeroes = Command::WriteZeroes as u16;
                    assert_eq!(call(&mut c, zeroes, flags, cookie, off, len, &[]), 0, "{}", ctx(i, "zeroes"));
                    model[o..o + n].fill(Some(0));
                }
                6 => {
                    assert_eq!(call(&mut c, Command::Trim as u16, 0, cookie, off, len, &[]), 0, "{}", ctx(i, "trim"));
                    let first = off.div_ceil(4096) * 4096;
                    let end = (off + len) / 4096 * 4096;
                    if end > first {
                        model[first as usize..end as usize].fill(None);
                    }
                }
                _ => {
                    let got = read(&mut c, structured, cookie, off, len);
                    for (k, (g, m)) in got.iter().zip(&model[o..o + n]).enumerate() {
                        if let Some(m) = m {
                            assert_eq!(g, m, "{}: byte {}", ctx(i, "read"), off + k as u64);
                        }
                    }
                }
            }
        }
        let whole = vol.snapshot(0, SPAN as usize);
        for (k, (g, m)) in whole.iter().zip(&model).enumerate() {
            if let Some(m) = m {
                assert_eq!(g, m, "seed {seed:#x}: the volume's byte {k} at the end");
            }
        }
        assert_eq!(vol.snapshot(SPAN, 4096), vec![0u8; 4096], "seed {seed:#x}: bytes past the span changed");
        h.shutdown().expect("shutdown");
    }
}

/// NBD_OPT_EXPORT_NAME cannot negotiate block sizes: byte-granular too.
#[test]
fn an_export_name_client_is_served_at_any_byte_offset() {
    let vol = MemVolume::new("default", SIZE);
    let h = start(vec![vol.clone()]);
    let mut c = Raw::connect(h.port().expect("tcp"), proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES);
    c.option(&ClientOption::ExportName("default".into()));
    let mut reply = [0u8; 10];
    c.s.read_exact(&mut reply).expect("export name reply");
    assert_eq!(u64::from_be_bytes(reply[..8].try_into().unwrap()), SIZE);
    assert_eq!(call(&mut c, WRITE, 0, 1, 4095, 2, &[0xaa, 0xbb]), 0);
    assert_eq!(call(&mut c, WRITE, proto::CMD_FLAG_FUA, 2, 1, 1, &[0xcc]), 0);
    assert_eq!(read(&mut c, false, 3, 0, 4098), [&[0, 0xcc][..], &[0; 4093], &[0xaa, 0xbb, 0]].concat());
    assert_eq!(vol.snapshot(4096, 4096)[..2], [0xbb, 0]);
    h.shutdown().expect("shutdown");
}

/// A client that asked for block sizes gets the volume's minimum and is
/// held to it: a misaligned request is refused and changes nothing.
#[test]
fn a_client_that_asked_for_block_sizes_is_held_to_them() {
    let vol = MemVolume::new("default", SIZE);
    let h = start(vec![vol.clone()]);
    let (mut c, _, _, sizes) =
        Raw::go_asking(h.port().expect("tcp"), "default", false, false, &[proto::INFO_BLOCK_SIZE]);
    assert_eq!(sizes.map(|s| s.0), Some(4096));
    assert_eq!(call(&mut c, WRITE, 0, 1, 512, 512, &[0xee; 512]), proto::EINVAL);
    assert_eq!(vol.snapshot(0, 4096), vec![0u8; 4096]);
    h.shutdown().expect("shutdown");
}

/// Block status at a byte offset answers from that offset, never beyond.
#[test]
fn block_status_at_a_byte_offset_starts_there() {
    let vol = MemVolume::new("default", SIZE);
    vol.write(8192, &[1u8; 4096], false).expect("allocate block 2");
    let h = start(vec![vol.clone()]);
    let mut c = byte_granular(h.port().expect("tcp"), true, true);
    c.request(Command::BlockStatus as u16, 0, 1, 100, 10000);
    match c.reply(0).0 {
        Reply::Chunk { chunk: Chunk::BlockStatus { descriptors, .. }, done: true, .. } => {
            let hole = proto::STATE_HOLE | proto::STATE_ZERO;
            assert_eq!(descriptors, vec![(8092, hole), (1908, 0)]);
        }
        other => panic!("{other:?}"),
    }
    h.shutdown().expect("shutdown");
}

/// Waits until `n` writes are parked in the volume (hold_writes).
fn wait_parked(vol: &MemVolume, n: u64) {
    while vol.writes_waiting.load(Ordering::SeqCst) < n {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// While one read-modify-write is between its read and its write back, a
/// second one on the same block (another connection) and an aligned write
/// of that block wait for it: neither reverts the first's bytes, nor is
/// reverted by it. (A server without the ordering lets them reach the
/// volume, which the parked-write count shows.)
#[test]
fn a_read_modify_write_is_ordered_against_other_writes_to_its_block() {
    let vol = MemVolume::new("default", SIZE);
    let h = start(vec![vol.clone()]);
    let port = h.port().expect("tcp");
    let (a_data, b_data, y) = (pattern(1, 512), pattern(2, 512), pattern(3, 4096));
    for aligned_second in [false, true] {
        vol.hold_writes(true);
        let parked = vol.writes_waiting.load(Ordering::SeqCst);
        let mut a = byte_granular(port, false, false);
        a.request(WRITE, 0, 1, 0, 512);
        a.send(&a_data);
        wait_parked(&vol, parked + 1);
        let mut b =
            if aligned_second { Raw::go(port, "default", false, false).0 } else { byte_granular(port, false, false) };
        let (off, data) = if aligned_second { (0, &y) } else { (512, &b_data) };
        b.request(WRITE, 0, 2, off, data.len() as u32);
        b.send(data);
        // Correct code keeps it waiting on the ordering however long this is.
        std::thread::sleep(Duration::from_millis(100));
        let reached = vol.writes_waiting.load(Ordering::SeqCst) - parked;
        vol.hold_writes(false);
        assert_eq!(reached, 1, "a second write reached the volume while a patch was in progress");
        assert_eq!(a.reply(0).0, Reply::Simple { error: 0, cookie: 1 });
        assert_eq!(b.reply(0).0, Reply::Simple { error: 0, cookie: 2 });
        if aligned_second {
            assert_eq!(vol.snapshot(0, 4096), y, "the aligned write, ordered after, wins whole");
        } else {
            assert_eq!(
                vol.snapshot(0, 4096)[..1024],
                [a_data.clone(), b_data.clone()].concat(),
                "both patches survive"
            );
        }
    }
    h.shutdown().expect("shutdown");
}

/// Four connections patch their own 512-byte sectors of the same blocks at
/// once: no sector is ever reverted by another's patch, and every sector
/// ends with its owner's last write.
#[test]
fn concurrent_patches_of_one_block_from_many_connections_all_survive() {
    const CONNS: u64 = 4;
    const ROUNDS: u64 = 150;
    // Each read takes a millisecond: a patch's read-to-write window is wide.
    let vol = MemVolume::new("default", SIZE).with_slow_reads();
    let h = start(vec![vol.clone()]);
    let port = h.port().expect("tcp");
    let threads: Vec<_> = (0..CONNS)
        .map(|k| {
            std::thread::spawn(move || {
                let mut c = byte_granular(port, false, false);
                for round in 0..ROUNDS {
                    // Sector k of block (round % 2): both blocks are shared.
                    let off = (round % 2) * 4096 + k * 512;
                    // Nobody else writes this sector: it still holds what
                    // this connection wrote there last.
                    let before = read(&mut c, false, 2 * round, off, 512);
                    let last = if round >= 2 { pattern(k * 1000 + round - 2, 512) } else { vec![0; 512] };
                    assert!(before == last, "connection {k}, round {round}: its sector was reverted");
                    let data = pattern(k * 1000 + round, 512);
                    assert_eq!(call(&mut c, WRITE, 0, 2 * round + 1, off, 512, &data), 0);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer");
    }
    for k in 0..CONNS {
        for block in 0..2 {
            let last = (ROUNDS - 2..ROUNDS).find(|r| r % 2 == block).unwrap();
            let got = vol.snapshot(block * 4096, 4096)[(k * 512) as usize..][..512].to_vec();
            assert_eq!(got, pattern(k * 1000 + last, 512), "connection {k}'s sector in block {block}");
        }
    }
    h.shutdown().expect("shutdown");
}
