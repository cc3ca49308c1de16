//! `sluice bench nbd-load`: sequential READs or WRITEs of one size at a fixed
//! queue depth against any NBD server, over plaintext or TLS, reporting
//! throughput and the client's own CPU per MiB (scripts/bench-tls.sh).
//!
//! Owns: one connection (`sluice_frontend::client::Client`), the offset
//! cursor (sequential, wrapping within `span`), and the clock.
//!
//! Invariants: at most `iodepth` requests are outstanding; each reply is
//! checked (an NBD error ends the run with it); a write's data is the byte
//! 0xA5 everywhere, so a test can read it back with `qemu-io -c 'read -P
//! 0xa5 ...'`.
//!
//! Why: the TLS goal compares one server's plaintext and TLS throughput, and
//! with the stock single-threaded clients the client's TLS cost, not the
//! server's, sets the TLS figure on this 2-core machine (docs/serve.md).
//! This client seals and opens records with the server's record layer
//! (ring's AES-GCM), so what it adds for TLS is small and it reports how
//! much; scripts/bench-tls.sh runs it against nbdkit too.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use sluice_frontend::client::{Client, ClientError, ClientTlsOptions};
use sluice_frontend::proto::{self, RequestHeader};

/// The byte every write carries.
pub const WRITE_BYTE: u8 = 0xA5;

#[derive(Clone, Debug)]
pub struct LoadOpts {
    pub addr: String,
    pub export: String,
    pub tls: Option<ClientTlsOptions>,
    pub write: bool,
    pub block_bytes: u32,
    pub iodepth: usize,
    pub seconds: f64,
    /// Bytes from offset 0 the cursor wraps within (capped at the export).
    pub span_bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct LoadReport {
    pub rw: &'static str,
    pub tls: bool,
    /// The cipher suite the server chose (TLS only).
    pub tls_suite: Option<String>,
    pub block_bytes: u32,
    pub iodepth: usize,
    pub ops: u64,
    pub seconds: f64,
    pub mib_per_s: f64,
    /// The client's user + system CPU per MiB moved.
    pub client_cpu_ms_per_mib: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("the server answered request {cookie} (offset {offset}) with error {error}")]
    Nbd { cookie: u64, offset: u64, error: u32 },
    #[error("{0}")]
    Options(String),
}

/// User + system CPU time of this process, in seconds.
fn cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

pub fn run(o: &LoadOpts) -> Result<LoadReport, LoadError> {
    if o.block_bytes == 0 || !o.block_bytes.is_multiple_of(512) || o.iodepth == 0 {
        return Err(LoadError::Options("block size must be a positive multiple of 512, iodepth positive".into()));
    }
    let mut c = Client::connect(&o.addr, &o.export, o.tls.as_ref())?;
    let bs = o.block_bytes as u64;
    let span = o.span_bytes.min(c.size()) / bs * bs;
    if span == 0 {
        return Err(LoadError::Options(format!("the export ({} bytes) holds no {bs}-byte block", c.size())));
    }
    let payload = vec![WRITE_BYTE; o.block_bytes as usize];
    let command = if o.write { proto::Command::Write } else { proto::Command::Read } as u16;
    let read_len = if o.write { 0 } else { o.block_bytes };
    // Request `cookie` is at offset `cookie * bs % span`.
    let mut cookie = 0u64;
    let mut issue = |n: usize, batch: &mut Vec<RequestHeader>| {
        batch.clear();
        for _ in 0..n {
            batch.push(RequestHeader { flags: 0, command, cookie, offset: cookie * bs % span, len: o.block_bytes });
            cookie += 1;
        }
    };
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let mut batch = Vec::with_capacity(o.iodepth);
    issue(o.iodepth, &mut batch);
    c.send_requests(&batch, &payload)?;
    let (mut inflight, mut ops) = (o.iodepth, 0u64);
    let mut done = Vec::with_capacity(o.iodepth);
    let mut stopping = false;
    while inflight > 0 {
        done.clear();
        c.recv_replies(read_len, &mut done)?;
        for r in &done {
            if r.error != 0 {
                return Err(LoadError::Nbd { cookie: r.cookie, offset: r.cookie * bs % span, error: r.error });
            }
        }
        ops += done.len() as u64;
        inflight -= done.len();
        stopping |= t0.elapsed().as_secs_f64() >= o.seconds;
        if !stopping {
            issue(done.len(), &mut batch);
            c.send_requests(&batch, &payload)?;
            inflight += done.len();
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let tls = c.is_tls();
    let tls_suite = c.tls_suite().map(str::to_string);
    c.disconnect()?;
    let mib = (ops * bs) as f64 / 1048576.0;
    Ok(LoadReport {
        rw: if o.write { "write" } else { "read" },
        tls,
        tls_suite,
        block_bytes: o.block_bytes,
        iodepth: o.iodepth,
        ops,
        seconds,
        mib_per_s: mib / seconds,
        client_cpu_ms_per_mib: cpu * 1000.0 / mib.max(f64::MIN_POSITIVE),
    })
}

pub fn print(r: &LoadReport, json: Option<&Path>) {
    println!(
        "{} {} KiB QD{}{}: {:.1} MiB/s ({} ops in {:.2} s), client CPU {:.3} ms/MiB",
        r.rw,
        r.block_bytes / 1024,
        r.iodepth,
        match &r.tls_suite {
            Some(s) => format!(" over TLS ({s})"),
            None if r.tls => " over TLS".to_string(),
            None => String::new(),
        },
        r.mib_per_s,
        r.ops,
        r.seconds,
        r.client_cpu_ms_per_mib
    );
    if let Some(p) = json {
        println!("wrote {}", p.display());
    }
}
