//! `sluice bench connections`: how many NBD connections a running `sluice
//! serve` holds, and what each idle one costs it.
//!
//! Opens `count` connections to a server, each through the full fixed-newstyle
//! handshake (NBD_OPT_GO) into the transmission phase, keeps them all open,
//! and then proves every one of them is still served: one 4 KiB READ per
//! connection, answered with the right cookie. Before and after, it reads the
//! server process's resident memory and thread count from `/proc/PID/status`
//! and the machine's available memory from `/proc/meminfo`, so the report
//! says bytes per idle connection in user space (RSS) and in all (kernel
//! socket and thread state included).
//!
//! Why a separate process: the server's own counters are what matter, and a
//! client in the same process would blur them. The client side holds one
//! descriptor per connection and no thread.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_frontend::proto::{self, ClientOption, OptionReply, RequestHeader, SimpleReply};

/// What the run measured; also written as JSON.
#[derive(Debug, Serialize)]
pub struct ConnectionsReport {
    pub connections: usize,
    pub connect_seconds: f64,
    pub server_rss_before_bytes: u64,
    pub server_rss_after_bytes: u64,
    pub server_threads_before: u64,
    pub server_threads_after: u64,
    /// Server RSS growth per idle connection.
    pub rss_bytes_per_connection: u64,
    /// Machine-wide drop in MemAvailable per connection (both ends' kernel
    /// socket state, the server's thread stacks and kernel stacks).
    pub machine_bytes_per_connection: u64,
    /// Connections that answered a READ after all were open.
    pub answered: usize,
    /// Server RSS growth per connection once each has served that read
    /// (its thread's stack now reaches as deep as a request goes).
    pub rss_bytes_per_connection_after_read: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectionsError {
    #[error("connection {index}: {source}")]
    Io { index: usize, source: io::Error },
    #[error("connection {index}: {what}")]
    Protocol { index: usize, what: String },
    #[error("reading /proc for pid {pid}: {source}")]
    Proc { pid: u32, source: io::Error },
}

/// A status field of `/proc/PID/status` (kB values come back in bytes).
fn proc_status(pid: u32, field: &str) -> Result<u64, ConnectionsError> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|source| ConnectionsError::Proc { pid, source })?;
    status_field(&text, field).ok_or_else(|| ConnectionsError::Proc {
        pid,
        source: io::Error::other(format!("no {field} in /proc/{pid}/status")),
    })
}

/// `Name:   123 kB` → 123 * 1024; `Name: 7` → 7.
fn status_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.split(':').next() == Some(field))?;
    let mut words = line.split(':').nth(1)?.split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    Some(if words.next() == Some("kB") { n * 1024 } else { n })
}

fn mem_available() -> Result<u64, ConnectionsError> {
    let text = std::fs::read_to_string("/proc/meminfo").map_err(|source| ConnectionsError::Proc { pid: 0, source })?;
    status_field(&text, "MemAvailable")
        .ok_or_else(|| ConnectionsError::Proc { pid: 0, source: io::Error::other("no MemAvailable") })
}

/// Handshake to transmission with NBD_OPT_GO on `export`.
fn open_one(addr: &str, export: &str, index: usize) -> Result<TcpStream, ConnectionsError> {
    let io_err = |source| ConnectionsError::Io { index, source };
    let proto_err = |what: String| ConnectionsError::Protocol { index, what };
    let mut s = TcpStream::connect(addr).map_err(io_err)?;
    s.set_read_timeout(Some(Duration::from_secs(30))).map_err(io_err)?;
    s.set_nodelay(true).map_err(io_err)?;
    let mut g = [0u8; proto::GREETING_BYTES];
    s.read_exact(&mut g).map_err(io_err)?;
    proto::decode_greeting(&g).map_err(|e| proto_err(e.to_string()))?;
    let flags = proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES;
    s.write_all(&flags.to_be_bytes()).map_err(io_err)?;
    let go = ClientOption::Info { go: true, name: export.into(), requests: vec![] };
    s.write_all(&go.encode()).map_err(io_err)?;
    loop {
        let mut h = [0u8; proto::OPTION_REPLY_HEADER_BYTES];
        s.read_exact(&mut h).map_err(io_err)?;
        let (_, reply_type, len) = OptionReply::decode_header(&h).map_err(|e| proto_err(e.to_string()))?;
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data).map_err(io_err)?;
        match reply_type {
            proto::REP_ACK => return Ok(s),
            proto::REP_INFO => continue,
            other => return Err(proto_err(format!("NBD_OPT_GO answered with reply type {other:#x}"))),
        }
    }
}

/// One READ of 4 KiB at offset 0; checks the reply's cookie and error.
fn read_once(s: &mut TcpStream, index: usize) -> Result<(), ConnectionsError> {
    let io_err = |source| ConnectionsError::Io { index, source };
    let cookie = 0x5100_0000_0000 + index as u64;
    let req = RequestHeader { flags: 0, command: proto::Command::Read as u16, cookie, offset: 0, len: 4096 };
    s.write_all(&req.encode()).map_err(io_err)?;
    let mut h = [0u8; proto::SIMPLE_REPLY_BYTES];
    s.read_exact(&mut h).map_err(io_err)?;
    let rep = SimpleReply::decode(&h).map_err(|e| ConnectionsError::Protocol { index, what: e.to_string() })?;
    if rep.cookie != cookie || rep.error != 0 {
        let what = format!("reply cookie {:#x} error {} to read {cookie:#x}", rep.cookie, rep.error);
        return Err(ConnectionsError::Protocol { index, what });
    }
    let mut data = [0u8; 4096];
    s.read_exact(&mut data).map_err(io_err)
}

/// Opens `count` connections to `addr`, keeps them, then reads on each.
pub fn run(
    addr: &str,
    export: &str,
    count: usize,
    server_pid: u32,
    settle: Duration,
) -> Result<ConnectionsReport, ConnectionsError> {
    sluice_frontend::raise_open_files_limit(count as u64 + 64)
        .map_err(|source| ConnectionsError::Io { index: 0, source })?;
    let rss_before = proc_status(server_pid, "VmRSS")?;
    let threads_before = proc_status(server_pid, "Threads")?;
    let avail_before = mem_available()?;
    let start = Instant::now();
    let mut conns = Vec::with_capacity(count);
    for i in 0..count {
        conns.push(open_one(addr, export, i)?);
    }
    let connect_seconds = start.elapsed().as_secs_f64();
    // Let connection threads reach their idle wait before measuring.
    std::thread::sleep(settle);
    let rss_after = proc_status(server_pid, "VmRSS")?;
    let threads_after = proc_status(server_pid, "Threads")?;
    let avail_after = mem_available()?;
    let mut answered = 0;
    for (i, s) in conns.iter_mut().enumerate() {
        read_once(s, i)?;
        answered += 1;
    }
    std::thread::sleep(settle);
    let rss_after_read = proc_status(server_pid, "VmRSS")?;
    let per = |d: u64| d / count.max(1) as u64;
    Ok(ConnectionsReport {
        connections: count,
        connect_seconds,
        server_rss_before_bytes: rss_before,
        server_rss_after_bytes: rss_after,
        server_threads_before: threads_before,
        server_threads_after: threads_after,
        rss_bytes_per_connection: per(rss_after.saturating_sub(rss_before)),
        machine_bytes_per_connection: per(avail_before.saturating_sub(avail_after)),
        answered,
        rss_bytes_per_connection_after_read: per(rss_after_read.saturating_sub(rss_before)),
    })
}

/// The human summary.
pub fn print(r: &ConnectionsReport, json: Option<&Path>) {
    println!(
        "{} connections open in {:.2} s, all {} answered a 4 KiB read",
        r.connections, r.connect_seconds, r.answered
    );
    println!(
        "server: RSS {:.1} → {:.1} MiB ({} B per idle connection), threads {} → {}",
        r.server_rss_before_bytes as f64 / 1048576.0,
        r.server_rss_after_bytes as f64 / 1048576.0,
        r.rss_bytes_per_connection,
        r.server_threads_before,
        r.server_threads_after
    );
    println!("server: {} B per connection once each has served a read", r.rss_bytes_per_connection_after_read);
    println!(
        "machine: MemAvailable fell by {} B per connection (kernel sockets and stacks included)",
        r.machine_bytes_per_connection
    );
    if let Some(p) = json {
        println!("wrote {}", p.display());
    }
}

#[cfg(test)]
mod tests {
    use super::status_field;

    #[test]
    fn status_fields_parse_with_and_without_units() {
        let text = "Name:\tsluice\nVmRSS:\t   1234 kB\nThreads:\t17\n";
        assert_eq!(status_field(text, "VmRSS"), Some(1234 * 1024));
        assert_eq!(status_field(text, "Threads"), Some(17));
        assert_eq!(status_field(text, "VmSwap"), None);
    }
}
