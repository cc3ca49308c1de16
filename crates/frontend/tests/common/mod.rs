//! Test support: a sparse in-memory `Volume`, an in-process server on
//! 127.0.0.1:0, and checks that the real NBD client binaries are installed.
//! Test code only: the server ships no volume of its own.
#![allow(dead_code)]

pub mod raw;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use sluice_frontend::{Listener, Server, ServerHandle, ServerOptions};
use sluice_volume::check;
use sluice_volume::{Extent, Volume, VolumeError};

pub const BLOCK: u64 = 4096;

/// Sparse memory volume: blocks never written (or trimmed / zeroed) are
/// absent from the map, read as zeros and report as unallocated.
pub struct MemVolume {
    name: String,
    size_bytes: u64,
    blocks: Mutex<BTreeMap<u64, Box<[u8]>>>,
    pub flushes: AtomicU64,
    pub fua_writes: AtomicU64,
    pub writes: AtomicU64,
    /// While true, writes block (to hold requests in flight).
    held: Mutex<bool>,
    released: Condvar,
    pub writes_waiting: AtomicU64,
    /// Event log: "w" per completed write, "f" per flush (in order).
    pub log: Mutex<String>,
    /// `write_batch` calls, and the most writes one of them carried.
    pub batches: AtomicU64,
    pub batch_writes_max: AtomicU64,
    /// Each read takes a millisecond (the server should then overlap a
    /// connection's reads on its workers); the most reads in flight at once
    /// is recorded.
    pub slow_reads: std::sync::atomic::AtomicBool,
    /// Each write takes 200 µs (the server should then run a connection's
    /// writes on its workers, never batched on the reader).
    pub slow_writes: std::sync::atomic::AtomicBool,
    reads_in_flight: AtomicU64,
    pub reads_in_flight_max: AtomicU64,
}

impl MemVolume {
    pub fn new(name: &str, size_bytes: u64) -> Arc<MemVolume> {
        Arc::new(MemVolume {
            name: name.to_owned(),
            size_bytes,
            blocks: Mutex::new(BTreeMap::new()),
            flushes: AtomicU64::new(0),
            fua_writes: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            held: Mutex::new(false),
            released: Condvar::new(),
            writes_waiting: AtomicU64::new(0),
            log: Mutex::new(String::new()),
            batches: AtomicU64::new(0),
            batch_writes_max: AtomicU64::new(0),
            slow_reads: std::sync::atomic::AtomicBool::new(false),
            slow_writes: std::sync::atomic::AtomicBool::new(false),
            reads_in_flight: AtomicU64::new(0),
            reads_in_flight_max: AtomicU64::new(0),
        })
    }

    /// The same volume, with reads that take a millisecond each.
    pub fn with_slow_reads(self: Arc<Self>) -> Arc<Self> {
        self.slow_reads.store(true, Ordering::Relaxed);
        self
    }

    /// The same volume, with writes that take 200 µs each.
    pub fn with_slow_writes(self: Arc<Self>) -> Arc<Self> {
        self.slow_writes.store(true, Ordering::Relaxed);
        self
    }

    pub fn allocated_blocks(&self) -> usize {
        self.blocks.lock().unwrap().len()
    }

    pub fn hold_writes(&self, hold: bool) {
        *self.held.lock().unwrap() = hold;
        self.released.notify_all();
    }

    /// Writes a non-zero pattern over the first `len` bytes.
    pub fn write_prefill(&self, len: u64) {
        for off in (0..len).step_by(1 << 20) {
            let n = (len - off).min(1 << 20) as usize;
            self.write(off, &vec![0x5a; n], false).unwrap();
        }
    }

    /// A copy of [offset, offset+len) without going through NBD.
    pub fn snapshot(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.read(offset, &mut buf).unwrap();
        buf
    }
}

impl Volume for MemVolume {
    fn name(&self) -> &str {
        &self.name
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        check(self, offset, buf.len() as u64)?;
        if self.slow_reads.load(Ordering::Relaxed) {
            let now = self.reads_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.reads_in_flight_max.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(1));
            self.reads_in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        let blocks = self.blocks.lock().unwrap();
        for (i, chunk) in buf.chunks_mut(BLOCK as usize).enumerate() {
            match blocks.get(&(offset / BLOCK + i as u64)) {
                Some(b) => chunk.copy_from_slice(b),
                None => chunk.fill(0),
            }
        }
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), VolumeError> {
        check(self, offset, data.len() as u64)?;
        {
            let mut held = self.held.lock().unwrap();
            if *held {
                self.writes_waiting.fetch_add(1, Ordering::SeqCst);
                while *held {
                    held = self.released.wait(held).unwrap();
                }
            }
        }
        if self.slow_writes.load(Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        self.log.lock().unwrap().push('w');
        let mut blocks = self.blocks.lock().unwrap();
        for (i, chunk) in data.chunks(BLOCK as usize).enumerate() {
            blocks.insert(offset / BLOCK + i as u64, chunk.to_vec().into_boxed_slice());
        }
        self.writes.fetch_add(1, Ordering::Relaxed);
        if fua {
            self.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), VolumeError> {
        check(self, offset, len)?;
        let mut blocks = self.blocks.lock().unwrap();
        let first = offset / BLOCK;
        let keys: Vec<u64> = blocks.range(first..first + len / BLOCK).map(|(k, _)| *k).collect();
        for k in keys {
            blocks.remove(&k);
        }
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), VolumeError> {
        self.trim(offset, len)?;
        if fua {
            self.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), VolumeError> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.log.lock().unwrap().push('f');
        Ok(())
    }
    fn write_batch(&self, writes: &[(u64, &[u8])], fua: bool) -> Result<(), VolumeError> {
        for &(offset, data) in writes {
            check(self, offset, data.len() as u64)?;
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.batch_writes_max.fetch_max(writes.len() as u64, Ordering::Relaxed);
        for &(offset, data) in writes {
            self.write(offset, data, fua)?;
        }
        Ok(())
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, VolumeError> {
        check(self, offset, len)?;
        let blocks = self.blocks.lock().unwrap();
        let mut out: Vec<Extent> = Vec::new();
        for lba in offset / BLOCK..(offset + len) / BLOCK {
            let allocated = blocks.contains_key(&lba);
            match out.last_mut() {
                Some(e) if e.allocated == allocated => e.len += BLOCK,
                _ => out.push(Extent { len: BLOCK, allocated }),
            }
        }
        Ok(out)
    }
}

/// A server over `vols` on 127.0.0.1 with an OS-chosen port.
pub fn start(vols: Vec<Arc<MemVolume>>) -> ServerHandle {
    start_with(vols, ServerOptions::default())
}

pub fn start_with(vols: Vec<Arc<MemVolume>>, opts: ServerOptions) -> ServerHandle {
    let exports: Vec<Arc<dyn Volume>> = vols.into_iter().map(|v| v as Arc<dyn Volume>).collect();
    let server = Server::new(exports, opts).expect("server options");
    let listener = Listener::bind_tcp("127.0.0.1:0").expect("bind 127.0.0.1:0");
    server.spawn(listener).expect("spawn server")
}

pub fn uri(h: &ServerHandle, export: &str) -> String {
    format!("nbd://127.0.0.1:{}/{}", h.port().expect("tcp listener"), export)
}

/// Fails (does not skip) when a client binary is missing.
pub fn require(binary: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(binary).is_file()))
        .unwrap_or(false)
        || Path::new(binary).is_file();
    assert!(found, "{binary} not found: install it with `apt-get install -y {package}`");
}

/// Runs a command; panics with its output if it fails.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A deterministic pseudo-random byte pattern.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
