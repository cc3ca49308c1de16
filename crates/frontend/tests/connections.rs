//! Connection scaling: many idle connections cost one server thread each
//! and no worker, every one of them is still served, and the worker pool
//! stays bounded when all of them send at once. Its own test binary, so no
//! other test's threads blur the thread counts. (`sluice bench connections`
//! measures 10,000 against a real `sluice serve` process.)

mod common;

use std::time::{Duration, Instant};

use common::raw::{Raw, Reply};
use common::*;
use sluice_frontend::proto::Command;
use sluice_frontend::ServerOptions;

const CONNECTIONS: usize = 2000;
const WORKERS_MAX: usize = 8;

fn threads_now() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("Threads:")).expect("Threads line");
    line["Threads:".len()..].trim().parse().expect("thread count")
}

#[test]
fn thousands_of_idle_connections_cost_one_thread_each_and_are_all_served() {
    sluice_frontend::raise_open_files_limit(3 * CONNECTIONS as u64 + 256).expect("open-file limit");
    let vol = MemVolume::new("default", 16 << 20);
    vol.write_prefill(1 << 20);
    let opts = ServerOptions { workers_max: WORKERS_MAX, ..ServerOptions::default() };
    let h = start_with(vec![vol.clone()], opts);
    let port = h.port().expect("tcp");
    let before = threads_now();

    let mut conns: Vec<Raw> = (0..CONNECTIONS).map(|_| Raw::go(port, "default", false, false).0).collect();
    assert_eq!(h.connections(), CONNECTIONS);
    let idle = threads_now() - before;
    assert!(idle <= CONNECTIONS, "{idle} threads for {CONNECTIONS} idle connections");

    // Every connection sends a read before any reply is read: the pool
    // serves them all with at most WORKERS_MAX threads.
    let expected = vol.snapshot(4096, 4096);
    for (i, c) in conns.iter_mut().enumerate() {
        c.request(Command::Read as u16, 0, i as u64, 4096, 4096);
    }
    let busy = threads_now() - before;
    assert!(busy <= CONNECTIONS + WORKERS_MAX, "{busy} threads: the pool grew past {WORKERS_MAX}");
    for (i, c) in conns.iter_mut().enumerate() {
        let (reply, data) = c.reply(4096);
        assert_eq!(reply, Reply::Simple { error: 0, cookie: i as u64 });
        assert_eq!(data, expected, "connection {i}");
    }

    // Closing the clients ends every server connection and its thread.
    drop(conns);
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.connections() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(h.connections(), 0);
    let stats = h.shutdown().expect("shutdown");
    assert_eq!(stats.connections_accepted, CONNECTIONS as u64);
    assert_eq!(stats.requests, CONNECTIONS as u64);
    assert_eq!(stats.connections_failed, 0);
}
