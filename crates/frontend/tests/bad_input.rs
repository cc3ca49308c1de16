//! Malformed and hostile input over raw sockets: the server answers per the
//! NBD spec or closes just the offending connection, while a second client
//! keeps working and the data stays unchanged.

mod common;

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::raw::{Raw, Reply};
use common::*;
use sluice_frontend::proto::{self, Chunk, ClientOption, Command, OptionHeader};
use sluice_frontend::ServerOptions;

const MIB: u64 = 1 << 20;
const SIZE: u64 = 16 * MIB;
const READ: u16 = Command::Read as u16;
const WRITE: u16 = Command::Write as u16;

/// A well-behaved client: writes `seed`'s pattern at `off`, reads it back.
fn healthy_round_trip(port: u16, off: u64, seed: u64) {
    let (mut c, size, _) = Raw::go(port, "default", true, false);
    assert_eq!(size, SIZE);
    let data = pattern(seed, 64 * 1024);
    c.request(WRITE, proto::CMD_FLAG_FUA, 1, off, data.len() as u32);
    c.send(&data);
    assert_eq!(c.reply(0).0, Reply::Simple { error: 0, cookie: 1 });
    c.request(READ, 0, 2, off, data.len() as u32);
    let (r, _) = c.reply(0);
    assert_eq!(r, Reply::Chunk { cookie: 2, done: true, chunk: Chunk::OffsetData { offset: off, data } });
    c.request(Command::Disc as u16, 0, 3, 0, 0);
    assert!(c.closed_by_server());
}

/// Starts a server with known data at [0, 1M) and returns it.
fn setup() -> (std::sync::Arc<MemVolume>, sluice_frontend::ServerHandle) {
    setup_with(ServerOptions::default())
}

fn setup_with(opts: ServerOptions) -> (std::sync::Arc<MemVolume>, sluice_frontend::ServerHandle) {
    let vol = MemVolume::new("default", SIZE);
    use sluice_volume::Volume;
    vol.write(0, &pattern(99, MIB as usize), false).expect("prefill");
    let h = start_with(vec![vol.clone()], opts);
    (vol, h)
}

fn assert_prefill_intact(vol: &MemVolume) {
    assert_eq!(vol.snapshot(0, MIB as usize), pattern(99, MIB as usize), "data changed");
}

#[test]
fn bad_request_magic_closes_only_that_connection() {
    let (vol, h) = setup();
    let port = h.port().expect("tcp");
    let (mut bad, _, _) = Raw::go(port, "default", true, false);
    let (mut good, _, _) = Raw::go(port, "default", false, false);
    let mut hdr = proto::RequestHeader { flags: 0, command: WRITE, cookie: 1, offset: 0, len: 4096 }.encode();
    hdr[0] ^= 0xff;
    bad.send(&hdr);
    bad.send(&[0u8; 4096]);
    assert!(bad.closed_by_server());
    // The other connection, opened before, still works.
    good.request(READ, 0, 7, 0, 4096);
    let (r, data) = good.reply(4096);
    assert_eq!(r, Reply::Simple { error: 0, cookie: 7 });
    assert_eq!(data, pattern(99, MIB as usize)[..4096]);
    healthy_round_trip(port, 2 * MIB, 1);
    assert_prefill_intact(&vol);
    assert!(h.stats().connections_failed >= 1);
    h.shutdown().expect("shutdown");
}

#[test]
fn bad_option_magic_and_bad_client_flags_close_the_connection() {
    let (vol, h) = setup();
    let port = h.port().expect("tcp");
    let mut c = Raw::connect(port, proto::FLAG_C_FIXED_NEWSTYLE);
    let mut o = OptionHeader { option: 7, len: 0 }.encode();
    o[0] = b'X';
    c.send(&o);
    assert!(c.closed_by_server());
    let mut c = Raw::connect(port, proto::FLAG_C_FIXED_NEWSTYLE | 0x80);
    assert!(c.closed_by_server());
    // Option data beyond the bound: a denial of service, refused with
    // NBD_REP_ERR_TOO_BIG (the client learns why), then closed.
    let mut c = Raw::connect(port, proto::FLAG_C_FIXED_NEWSTYLE);
    c.send(&OptionHeader { option: 7, len: 1 << 30 }.encode());
    let r = c.option_reply();
    assert_eq!((r.option, r.reply_type), (7, proto::REP_ERR_TOO_BIG));
    assert!(c.closed_by_server());
    healthy_round_trip(port, 2 * MIB, 2);
    assert_prefill_intact(&vol);
    h.shutdown().expect("shutdown");
}

#[test]
fn unknown_and_malformed_options_get_errors_and_the_session_continues() {
    let (_vol, h) = setup();
    let port = h.port().expect("tcp");
    let mut c = Raw::connect(port, proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES);
    // Unknown option with data: ERR_UNSUP.
    c.send(&OptionHeader { option: 0x1234, len: 3 }.encode());
    c.send(b"abc");
    let r = c.option_reply();
    assert_eq!((r.option, r.reply_type), (0x1234, proto::REP_ERR_UNSUP));
    // STARTTLS and extended headers: not supported.
    c.option(&ClientOption::StartTls);
    assert_eq!(c.option_reply().reply_type, proto::REP_ERR_UNSUP);
    c.option(&ClientOption::ExtendedHeaders);
    assert_eq!(c.option_reply().reply_type, proto::REP_ERR_UNSUP);
    // LIST with data: ERR_INVALID.
    c.send(&OptionHeader { option: 3, len: 1 }.encode());
    c.send(b"x");
    assert_eq!(c.option_reply().reply_type, proto::REP_ERR_INVALID);
    // GO with a name length beyond the payload: ERR_INVALID.
    c.send(&OptionHeader { option: 7, len: 6 }.encode());
    c.send(&[0, 0, 0, 99, 0, 0]);
    assert_eq!(c.option_reply().reply_type, proto::REP_ERR_INVALID);
    // SET_META_CONTEXT before structured replies: ERR_INVALID.
    c.option(&ClientOption::MetaContext {
        set: true,
        export: "default".into(),
        queries: vec!["base:allocation".into()],
    });
    assert_eq!(c.option_reply().reply_type, proto::REP_ERR_INVALID);
    // INFO on an unknown export: ERR_UNKNOWN.
    c.option(&ClientOption::Info { go: false, name: "nope".into(), requests: vec![] });
    assert_eq!(c.option_reply().reply_type, proto::REP_ERR_UNKNOWN);
    // Still negotiating: EXPORT_NAME with NO_ZEROES gives exactly size + flags.
    c.option(&ClientOption::ExportName("default".into()));
    let mut b = [0u8; 10];
    std::io::Read::read_exact(&mut c.s, &mut b).expect("export name reply");
    assert_eq!(u64::from_be_bytes(b[..8].try_into().expect("8 bytes")), SIZE);
    let flags = u16::from_be_bytes([b[8], b[9]]);
    assert_eq!(flags & proto::FLAG_SEND_DF, 0, "DF without structured replies");
    assert_ne!(flags & proto::FLAG_CAN_MULTI_CONN, 0);
    c.request(READ, 0, 1, 0, 4096);
    let (r, data) = c.reply(4096);
    assert_eq!(r, Reply::Simple { error: 0, cookie: 1 });
    assert_eq!(data, pattern(99, MIB as usize)[..4096]);
    h.shutdown().expect("shutdown");
}

#[test]
fn export_name_for_unknown_export_closes_and_abort_is_acked() {
    let (_vol, h) = setup();
    let port = h.port().expect("tcp");
    let mut c = Raw::connect(port, proto::FLAG_C_FIXED_NEWSTYLE);
    c.option(&ClientOption::ExportName("missing".into()));
    assert!(c.closed_by_server());
    let mut c = Raw::connect(port, proto::FLAG_C_FIXED_NEWSTYLE);
    c.option(&ClientOption::Abort);
    assert_eq!(c.option_reply().reply_type, proto::REP_ACK);
    assert!(c.closed_by_server());
    h.shutdown().expect("shutdown");
}

#[test]
fn bad_requests_get_errors_and_the_connection_stays_in_sync() {
    let (vol, h) = setup();
    let port = h.port().expect("tcp");
    for structured in [false, true] {
        let (mut c, _, _) = Raw::go(port, "default", structured, false);
        let expect = |c: &mut Raw, cookie: u64, errno: u32| {
            let (r, _) = c.reply(0);
            assert_eq!(Raw::errno_of(&r), errno, "cookie {cookie}: {r:?} (structured {structured})");
            match r {
                Reply::Simple { cookie: got, .. } | Reply::Chunk { cookie: got, .. } => assert_eq!(got, cookie),
            }
        };
        // Unknown command.
        c.request(42, 0, 1, 0, 4096);
        expect(&mut c, 1, proto::EINVAL);
        // Read past the end and across it.
        c.request(READ, 0, 2, SIZE, 4096);
        expect(&mut c, 2, proto::EINVAL);
        c.request(READ, 0, 3, SIZE - 4096, 8192);
        expect(&mut c, 3, proto::EINVAL);
        // Offset + length overflowing u64.
        c.request(READ, 0, 4, u64::MAX - 4095, 4096);
        expect(&mut c, 4, proto::EINVAL);
        // Write past the end: ENOSPC, and its payload is consumed.
        c.request(WRITE, 0, 5, SIZE, 4096);
        c.send(&[0xee; 4096]);
        expect(&mut c, 5, proto::ENOSPC);
        // Misaligned read and write.
        c.request(READ, 0, 6, 512, 4096);
        expect(&mut c, 6, proto::EINVAL);
        c.request(WRITE, 0, 7, 0, 512);
        c.send(&[0xee; 512]);
        expect(&mut c, 7, proto::EINVAL);
        // Larger than the maximum block size (64 MiB).
        c.request(READ, 0, 8, 0, 65 << 20);
        expect(&mut c, 8, proto::EINVAL);
        c.request(Command::Cache as u16, 0, 9, 0, 33 << 20);
        expect(&mut c, 9, proto::EINVAL);
        // A flag not valid for the command (NO_HOLE on a write): payload skipped.
        c.request(WRITE, proto::CMD_FLAG_NO_HOLE, 10, 0, 4096);
        c.send(&[0xee; 4096]);
        expect(&mut c, 10, proto::EINVAL);
        // Unknown flag bits on a read.
        c.request(READ, 1 << 9, 11, 0, 4096);
        expect(&mut c, 11, proto::EINVAL);
        // BLOCK_STATUS without a negotiated context.
        c.request(Command::BlockStatus as u16, 0, 12, 0, 4096);
        expect(&mut c, 12, proto::EINVAL);
        // Trim past the end; write zeroes past the end.
        c.request(Command::Trim as u16, 0, 13, SIZE - 4096, 8192);
        expect(&mut c, 13, proto::EINVAL);
        c.request(Command::WriteZeroes as u16, 0, 14, SIZE, 4096);
        expect(&mut c, 14, proto::ENOSPC);
        // Zero-length requests are harmless successes.
        c.request(Command::Trim as u16, 0, 15, 0, 0);
        expect(&mut c, 15, 0);
        // Still in sync: a normal read returns the original data.
        c.request(READ, 0, 16, 0, 4096);
        let (r, data) = c.reply(4096);
        let data = match r {
            Reply::Simple { error: 0, cookie: 16 } => data,
            Reply::Chunk { cookie: 16, done: true, chunk: Chunk::OffsetData { offset: 0, data } } => data,
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(data, pattern(99, MIB as usize)[..4096]);
    }
    assert_prefill_intact(&vol);
    assert!(h.stats().request_errors >= 28, "{:?}", h.stats());
    h.shutdown().expect("shutdown");
}

/// Zeroes carry no payload: a request longer than the maximum block size
/// is served (nbdcopy zeroes a whole hole at once), reads are not.
#[test]
fn zeroes_longer_than_the_maximum_block_size_are_served() {
    let (vol, h) = setup_with(ServerOptions { request_bytes_max: 1 << 20, ..ServerOptions::default() });
    let port = h.port().expect("tcp");
    let (mut c, _, _) = Raw::go(port, "default", false, false);
    let expect = |c: &mut Raw, cookie: u64, errno: u32| {
        let (r, _) = c.reply(0);
        assert_eq!(Raw::errno_of(&r), errno, "cookie {cookie}: {r:?}");
    };
    c.request(Command::WriteZeroes as u16, proto::CMD_FLAG_NO_HOLE, 1, 0, 4 << 20);
    expect(&mut c, 1, 0);
    c.request(Command::WriteZeroes as u16, 0, 2, 4 << 20, 4 << 20);
    expect(&mut c, 2, 0);
    c.request(READ, 0, 3, 0, 2 << 20);
    expect(&mut c, 3, proto::EINVAL);
    assert_eq!(vol.snapshot(0, 8 << 20), vec![0u8; 8 << 20]);
    h.shutdown().expect("shutdown");
}

#[test]
fn oversized_write_payload_closes_only_that_connection() {
    let (vol, h) = setup();
    let port = h.port().expect("tcp");
    let (mut c, _, _) = Raw::go(port, "default", true, false);
    c.request(WRITE, 0, 1, 0, u32::MAX - 4095);
    // The server refuses to buffer 4 GiB: it answers EOVERFLOW, as the NBD
    // spec allows, and hangs up rather than reading it.
    let _ = c.s.write_all(&[0xee; 65536]);
    match c.reply(0).0 {
        Reply::Chunk { cookie: 1, done: true, chunk: Chunk::Error { error, .. } } => {
            assert_eq!(error, proto::EOVERFLOW)
        }
        r => panic!("expected an EOVERFLOW error reply, got {r:?}"),
    }
    assert!(c.closed_by_server());
    healthy_round_trip(port, 3 * MIB, 3);
    assert_prefill_intact(&vol);
    h.shutdown().expect("shutdown");
}

#[test]
fn client_vanishing_mid_request_leaves_data_and_others_alone() {
    let (vol, h) = setup();
    let port = h.port().expect("tcp");
    let before = vol.writes.load(Ordering::Relaxed);
    {
        // Header then half a payload, then gone.
        let (mut c, _, _) = Raw::go(port, "default", true, false);
        c.request(WRITE, 0, 1, 0, 65536);
        c.send(&[0xee; 30000]);
    }
    {
        // Half a request header, then gone.
        let (mut c, _, _) = Raw::go(port, "default", false, false);
        c.send(&proto::RequestHeader { flags: 0, command: READ, cookie: 1, offset: 0, len: 4096 }.encode()[..11]);
    }
    {
        // Gone in the middle of the option haggling.
        let mut c = Raw::connect(port, proto::FLAG_C_FIXED_NEWSTYLE);
        c.send(&OptionHeader { option: 7, len: 100 }.encode());
        c.send(&[0; 10]);
    }
    healthy_round_trip(port, 4 * MIB, 4);
    assert_eq!(vol.writes.load(Ordering::Relaxed), before + 1, "a partial write reached the volume");
    assert_prefill_intact(&vol);
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.connections() > 0 {
        assert!(Instant::now() < deadline, "connections not reaped: {}", h.connections());
        std::thread::sleep(Duration::from_millis(10));
    }
    h.shutdown().expect("shutdown");
}

#[test]
fn block_status_reports_holes_and_respects_req_one() {
    let (_vol, h) = setup();
    let port = h.port().expect("tcp");
    let (mut c, _, flags) = Raw::go(port, "default", true, true);
    assert_ne!(flags & proto::FLAG_SEND_DF, 0);
    c.request(Command::BlockStatus as u16, 0, 1, 0, (2 * MIB) as u32);
    let (r, _) = c.reply(0);
    let want = vec![(MIB as u32, 0), (MIB as u32, proto::STATE_HOLE | proto::STATE_ZERO)];
    assert_eq!(
        r,
        Reply::Chunk { cookie: 1, done: true, chunk: Chunk::BlockStatus { context_id: 1, descriptors: want } }
    );
    c.request(Command::BlockStatus as u16, proto::CMD_FLAG_REQ_ONE, 2, MIB - 4096, (2 * MIB) as u32);
    let (r, _) = c.reply(0);
    let want = vec![(4096, 0)];
    assert_eq!(
        r,
        Reply::Chunk { cookie: 2, done: true, chunk: Chunk::BlockStatus { context_id: 1, descriptors: want } }
    );
    c.request(Command::BlockStatus as u16, 0, 3, SIZE - 4096, 8192);
    assert_eq!(Raw::errno_of(&c.reply(0).0), proto::EINVAL);
    c.request(Command::BlockStatus as u16, 0, 4, 0, 0);
    assert_eq!(Raw::errno_of(&c.reply(0).0), proto::EINVAL);
    h.shutdown().expect("shutdown");
}

#[test]
fn connections_beyond_the_maximum_are_refused() {
    let opts = ServerOptions { connections_max: 2, ..ServerOptions::default() };
    let (_vol, h) = setup_with(opts);
    let port = h.port().expect("tcp");
    let (_a, _, _) = Raw::go(port, "default", false, false);
    let (_b, _, _) = Raw::go(port, "default", false, false);
    let s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut b = [0u8; 1];
    assert!(matches!(std::io::Read::read(&mut &s, &mut b), Ok(0) | Err(_)), "third connection served");
    assert_eq!(h.stats().connections_refused, 1);
    h.shutdown().expect("shutdown");
}

#[test]
fn idle_handshake_times_out() {
    let opts = ServerOptions { handshake_timeout: Duration::from_millis(200), ..ServerOptions::default() };
    let (_vol, h) = setup_with(opts);
    let mut c = Raw::connect(h.port().expect("tcp"), proto::FLAG_C_FIXED_NEWSTYLE);
    let t = Instant::now();
    assert!(c.closed_by_server());
    assert!(t.elapsed() < Duration::from_secs(5));
    h.shutdown().expect("shutdown");
}

#[test]
fn shutdown_finishes_in_flight_requests_then_flushes() {
    let (vol, h) = setup();
    let port = h.port().expect("tcp");
    let (mut c, _, _) = Raw::go(port, "default", true, false);
    // Queue writes without reading replies, then shut down.
    for i in 0..16u64 {
        c.request(WRITE, 0, i, 8 * MIB + i * 65536, 65536);
        c.send(&pattern(i, 65536));
    }
    // Make sure the server has read them all (the 16th reply arrives).
    let mut seen = std::collections::HashSet::new();
    for _ in 0..16 {
        match c.reply(0).0 {
            Reply::Simple { error: 0, cookie } => assert!(seen.insert(cookie)),
            other => panic!("unexpected {other:?}"),
        }
    }
    let flushes = vol.flushes.load(Ordering::Relaxed);
    let (_idle, _, _) = Raw::go(port, "default", false, false);
    let t = Instant::now();
    h.shutdown().expect("shutdown");
    assert!(t.elapsed() < Duration::from_secs(5), "shutdown took {:?}", t.elapsed());
    assert!(vol.flushes.load(Ordering::Relaxed) > flushes, "no flush at shutdown");
    assert!(c.closed_by_server());
    for i in 0..16u64 {
        assert_eq!(vol.snapshot(8 * MIB + i * 65536, 65536), pattern(i, 65536));
    }
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "still accepting");
}

#[test]
fn shutdown_waits_for_requests_held_in_the_volume() {
    let (vol, h) = setup();
    let port = h.port().expect("tcp");
    let (mut c, _, _) = Raw::go(port, "default", false, false);
    vol.hold_writes(true);
    vol.log.lock().expect("log").clear();
    // As many writes as there are workers: all four execute at once.
    for i in 0..4u64 {
        c.request(WRITE, 0, i, 8 * MIB + i * 65536, 65536);
        c.send(&pattern(i + 10, 65536));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while vol.writes_waiting.load(Ordering::SeqCst) < 4 {
        assert!(Instant::now() < deadline, "writes never reached the volume");
        std::thread::sleep(Duration::from_millis(5));
    }
    let stopper = std::thread::spawn(move || h.shutdown());
    std::thread::sleep(Duration::from_millis(200));
    assert!(!stopper.is_finished(), "shutdown returned with writes in flight");
    vol.hold_writes(false);
    stopper.join().expect("shutdown thread").expect("shutdown");
    // Every held write was answered, then the connection closed...
    let mut cookies: Vec<u64> = (0..4)
        .map(|_| match c.reply(0).0 {
            Reply::Simple { error: 0, cookie } => cookie,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    cookies.sort();
    assert_eq!(cookies, vec![0, 1, 2, 3]);
    assert!(c.closed_by_server());
    // ...and the flush came after all of them.
    assert_eq!(*vol.log.lock().expect("log"), "wwwwf");
    for i in 0..4u64 {
        assert_eq!(vol.snapshot(8 * MIB + i * 65536, 65536), pattern(i + 10, 65536));
    }
}

#[test]
fn replies_come_out_of_order_when_a_request_is_slow() {
    let (vol, h) = setup();
    let port = h.port().expect("tcp");
    let (mut c, _, _) = Raw::go(port, "default", true, false);
    vol.hold_writes(true);
    c.request(WRITE, 0, 1, 8 * MIB, 4096);
    c.send(&[0x77; 4096]);
    c.request(READ, 0, 2, 0, 4096);
    let (r, _) = c.reply(0);
    assert_eq!(
        r,
        Reply::Chunk {
            cookie: 2,
            done: true,
            chunk: Chunk::OffsetData { offset: 0, data: pattern(99, MIB as usize)[..4096].to_vec() }
        }
    );
    vol.hold_writes(false);
    assert_eq!(c.reply(0).0, Reply::Simple { error: 0, cookie: 1 });
    h.shutdown().expect("shutdown");
}

#[test]
fn random_garbage_after_the_handshake_never_hurts_the_server() {
    // Garbage may parse as a valid write anywhere, so data is not compared;
    // the server must stay up and the other connection unaffected.
    let (_vol, h) = setup();
    let port = h.port().expect("tcp");
    let (mut good, _, _) = Raw::go(port, "default", true, false);
    for seed in 0..20u64 {
        let (mut c, _, _) = Raw::go(port, "default", seed % 2 == 0, false);
        // Garbage, sometimes behind a valid request magic so it gets parsed.
        let mut junk = pattern(seed + 1000, 4096);
        if seed % 3 != 0 {
            junk[..4].copy_from_slice(&proto::REQUEST_MAGIC.to_be_bytes());
            junk[6..8].copy_from_slice(&[0, (seed % 9) as u8]);
        }
        let _ = c.s.write_all(&junk);
        let _ = c.s.shutdown(std::net::Shutdown::Write);
        // Whatever it answers, it must end this connection in bounded time.
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut c.s, &mut sink);
        // The well-behaved connection still works.
        good.request(READ, 0, seed, 0, 4096);
        match good.reply(0).0 {
            Reply::Chunk { cookie, done: true, chunk: Chunk::OffsetData { data, .. } } => {
                assert_eq!(cookie, seed);
                assert_eq!(data, pattern(99, MIB as usize)[..4096]);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    healthy_round_trip(port, 5 * MIB, 5);
    h.shutdown().expect("shutdown");
}

/// A server whose connections run every measured request on the reader
/// thread, however long it took: the tests of batching on the reader do
/// not depend on how busy the machine is (with the default bound, one
/// first write preempted for 20 µs sends the writes to the pool).
fn start_inline(vols: Vec<std::sync::Arc<MemVolume>>) -> sluice_frontend::ServerHandle {
    start_with(vols, ServerOptions { slow_request_ns: u64::MAX, ..ServerOptions::default() })
}

/// One write answered: the server has measured the volume's writes and
/// runs the next ones on the reader thread, batched.
fn writes_measured(c: &mut Raw) {
    c.request(WRITE, 0, 999, SIZE - 4096, 4096);
    c.send(&[0xee; 4096]);
    assert_eq!(c.reply(0).0, Reply::Simple { error: 0, cookie: 999 });
}

/// FLUSHes among buffered writes run on the reader thread are taken with
/// the batch and run after it on a worker: each is answered, and each
/// comes after every write sent before it.
#[test]
fn flushes_inside_a_write_batch_run_after_the_writes_before_them() {
    let vol = MemVolume::new("default", SIZE);
    let h = start_inline(vec![vol.clone()]);
    let (mut c, _, _) = Raw::go(h.port().expect("tcp"), "default", false, false);
    writes_measured(&mut c);
    vol.log.lock().expect("log").clear();
    let flush = Command::Flush as u16;
    let reqs: [(u64, u16, u64); 6] =
        [(1, WRITE, 0), (2, WRITE, 4096), (3, flush, 0), (4, WRITE, 8192), (5, flush, 0), (6, WRITE, 12288)];
    let mut wire = Vec::new();
    for &(cookie, command, offset) in &reqs {
        let len = if command == WRITE { 4096 } else { 0 };
        wire.extend_from_slice(&proto::RequestHeader { flags: 0, command, cookie, offset, len }.encode());
        wire.extend_from_slice(&pattern(cookie, len as usize));
    }
    c.send(&wire);
    let mut answered: Vec<u64> = (0..reqs.len())
        .map(|_| match c.reply(0).0 {
            Reply::Simple { error: 0, cookie } => cookie,
            other => panic!("{other:?}"),
        })
        .collect();
    answered.sort();
    assert_eq!(answered, vec![1, 2, 3, 4, 5, 6]);
    let log = vol.log.lock().expect("log").clone();
    assert_eq!(log.matches('f').count(), 2, "{log}");
    assert_eq!(
        log.find('f').map(|i| log[..i].matches('w').count() >= 2),
        Some(true),
        "flush 3 before writes 1-2: {log}"
    );
    assert!(log.rfind('f').map(|i| log[..i].matches('w').count() >= 3) == Some(true), "flush 5 before write 4: {log}");
    for (cookie, offset) in [(1, 0), (2, 4096), (4, 8192), (6, 12288)] {
        assert_eq!(vol.snapshot(offset, 4096), pattern(cookie, 4096));
    }
    h.shutdown().expect("shutdown");
}

#[test]
fn inline_write_batches_stop_at_refused_and_fua_writes_and_answer_each() {
    let vol = MemVolume::new("default", SIZE);
    let h = start_inline(vec![vol.clone()]);
    let (mut c, _, _) = Raw::go(h.port().expect("tcp"), "default", false, false);
    writes_measured(&mut c);
    // (cookie, flags, offset): plain, plain, misaligned, FUA, plain, plain,
    // past the end, plain — sent in one go so they arrive buffered together.
    let reqs: [(u64, u16, u64); 8] = [
        (1, 0, 0),
        (2, 0, 8192),
        (3, 0, 100),
        (4, proto::CMD_FLAG_FUA, 16384),
        (5, 0, 24576),
        (6, 0, 32768),
        (7, 0, SIZE),
        (8, 0, 40960),
    ];
    let mut wire = Vec::new();
    for &(cookie, flags, offset) in &reqs {
        let header = proto::RequestHeader { flags, command: WRITE, cookie, offset, len: 4096 };
        wire.extend_from_slice(&header.encode());
        wire.extend_from_slice(&pattern(cookie, 4096));
    }
    // The first write is held in the volume until every request is in the
    // server's socket buffer: then the reader finds the rest buffered
    // together however busy the machine is (a loopback send returns once
    // its bytes are in the receiver's buffer).
    vol.hold_writes(true);
    c.send(&wire);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while vol.writes_waiting.load(Ordering::SeqCst) < 1 {
        assert!(std::time::Instant::now() < deadline, "the first write never reached the volume");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    vol.hold_writes(false);
    for &(cookie, _, offset) in &reqs {
        let expected = match cookie {
            3 => proto::EINVAL,
            7 => proto::ENOSPC,
            _ => 0,
        };
        assert_eq!(c.reply(0).0, Reply::Simple { error: expected, cookie }, "request {cookie}");
        if expected == 0 {
            assert_eq!(vol.snapshot(offset, 4096), pattern(cookie, 4096), "data of request {cookie}");
        }
    }
    assert_eq!(vol.fua_writes.load(Ordering::Relaxed), 1);
    assert!(vol.batch_writes_max.load(Ordering::Relaxed) >= 2, "the plain writes were not batched");
    assert_eq!(vol.snapshot(4096, 4096), vec![0u8; 4096], "the misaligned write changed data");
    h.shutdown().expect("shutdown");
}
