//! Per-volume I/O traces recorded while serving, on demand and bounded in
//! size — the input of `sluice advise`.
//!
//! Owns: [`TracedVolume`], the wrapper every export goes through, and its
//! [`TraceSlot`], which holds the recording (if any) of one volume.
//!
//! A volume is traced while its `[[volume]] trace` key names a file; the
//! key is read at start and on every SIGHUP reload, so adding it starts a
//! recording, removing it stops one, and naming another file stops the old
//! one and starts the new. A recording writes the CSV trace format
//! (`timestamp_us,op,offset,size`, docs/advise.md) with timestamps in
//! microseconds since the recording started, one line per request when the
//! request arrives (before it runs: a trace records when clients asked).
//!
//! Invariants:
//! - Recording never changes or fails a request: a trace file that cannot
//!   be written (disk full, removed directory) ends the recording with one
//!   log line, and the request runs as if no trace existed.
//! - A recording stops, with a closing `#` comment, before its file would
//!   exceed `trace_max` bytes; the file is a prefix of the volume's I/O, so
//!   live data computed from it is exact up to that point.
//! - Timestamps grow in file order (taken under the slot's lock).
//! - A write-zeroes request is recorded as a trim: both make the range read
//!   as zeros and neither leaves data in the cache.
//!
//! Why a wrapper: the engine need not know about tracing, and a volume that
//! is not traced pays one relaxed atomic load per request.

use sluice_engine::{Extent, Volume, VolumeError, WriteBuf};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What to record, and where: a volume's `trace` and `trace_max`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceTarget {
    pub path: PathBuf,
    pub max_bytes: u64,
}

/// One open recording.
struct Recording {
    target: TraceTarget,
    out: BufWriter<File>,
    start: Instant,
    bytes: u64,
}

impl Recording {
    fn create(volume: &str, size_bytes: u64, target: TraceTarget) -> io::Result<Recording> {
        let mut out = BufWriter::with_capacity(64 << 10, File::create(&target.path)?);
        let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let head = format!(
            "# sluice trace: volume {volume:?}, size {size_bytes} bytes, started at unix time {unix}\ntimestamp_us,op,offset,size\n"
        );
        out.write_all(head.as_bytes())?;
        Ok(Recording { target, out, start: Instant::now(), bytes: head.len() as u64 })
    }

    /// Append one line; false once the file is full (a closing comment
    /// written instead).
    fn line(&mut self, op: char, offset: u64, len: u64) -> io::Result<bool> {
        let us = self.start.elapsed().as_micros();
        let line = format!("{us},{op},{offset},{len}\n");
        const CLOSING: u64 = 64;
        if self.bytes + line.len() as u64 + CLOSING > self.target.max_bytes {
            let end = format!("# stopped: trace_max {} reached\n", self.target.max_bytes);
            self.out.write_all(end.as_bytes())?;
            self.out.flush()?;
            return Ok(false);
        }
        self.out.write_all(line.as_bytes())?;
        self.bytes += line.len() as u64;
        Ok(true)
    }
}

/// A volume's recording slot, shared by its wrapper and the server's
/// reload.
pub struct TraceSlot {
    volume: String,
    size_bytes: u64,
    on: AtomicBool,
    rec: Mutex<Option<Recording>>,
}

impl TraceSlot {
    fn record(&self, op: char, offset: u64, len: u64) {
        if !self.on.load(Ordering::Relaxed) {
            return;
        }
        let Ok(mut g) = self.rec.lock() else { return };
        let Some(r) = g.as_mut() else { return };
        match r.line(op, offset, len) {
            Ok(true) => return,
            Ok(false) => eprintln!(
                "sluice: volume {}: the trace {} reached trace_max ({} bytes) and stopped",
                self.volume,
                r.target.path.display(),
                r.target.max_bytes
            ),
            Err(e) => eprintln!(
                "sluice: volume {}: the trace {} stopped: cannot write it: {e}",
                self.volume,
                r.target.path.display()
            ),
        }
        self.on.store(false, Ordering::Relaxed);
        // Kept (not recording) so that a reload naming the same file does
        // not start it again and truncate what was recorded.
        let _ = r.out.flush();
    }

    /// Record to `target` from now on (or stop, with `None`). The same
    /// target as now keeps the recording running (or stopped, if it filled
    /// up); a new one truncates its file and starts from time 0.
    pub fn set(&self, target: Option<TraceTarget>) -> io::Result<()> {
        let mut g = self.rec.lock().map_err(|_| io::Error::other("trace lock poisoned"))?;
        if g.as_ref().map(|r| &r.target) == target.as_ref() {
            return Ok(());
        }
        self.on.store(false, Ordering::Relaxed);
        if let Some(mut old) = g.take() {
            old.out.flush()?;
            eprintln!(
                "sluice: volume {}: stopped the trace {} ({} bytes)",
                self.volume,
                old.target.path.display(),
                old.bytes
            );
        }
        if let Some(t) = target {
            let path = t.path.clone();
            *g = Some(Recording::create(&self.volume, self.size_bytes, t)?);
            self.on.store(true, Ordering::Relaxed);
            eprintln!("sluice: volume {}: recording its I/O to {}", self.volume, path.display());
        }
        Ok(())
    }

    /// Write out what is buffered (at shutdown).
    pub fn flush(&self) {
        if let Ok(mut g) = self.rec.lock() {
            if let Some(r) = g.as_mut() {
                let _ = r.out.flush();
            }
        }
    }
}

/// A volume whose requests may be recorded (see the module doc).
pub struct TracedVolume<V> {
    inner: V,
    slot: Arc<TraceSlot>,
}

impl<V: Volume> TracedVolume<V> {
    pub fn new(inner: V) -> TracedVolume<V> {
        let slot = Arc::new(TraceSlot {
            volume: inner.name().to_string(),
            size_bytes: inner.size_bytes(),
            on: AtomicBool::new(false),
            rec: Mutex::new(None),
        });
        TracedVolume { inner, slot }
    }

    pub fn slot(&self) -> Arc<TraceSlot> {
        self.slot.clone()
    }
}

/// Where `[[volume]] trace` points (relative to `data_dir`), if anywhere.
pub fn target(path: &str, max_bytes: u64, data_dir: &Path) -> Option<TraceTarget> {
    (!path.is_empty()).then(|| TraceTarget { path: data_dir.join(path), max_bytes })
}

impl<V: Volume> Volume for TracedVolume<V> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn block_bytes(&self) -> u64 {
        self.inner.block_bytes()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        self.slot.record('R', offset, buf.len() as u64);
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), VolumeError> {
        self.slot.record('W', offset, data.len() as u64);
        self.inner.write(offset, data, fua)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), VolumeError> {
        self.slot.record('T', offset, len);
        self.inner.trim(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), VolumeError> {
        self.slot.record('T', offset, len);
        self.inner.write_zeroes(offset, len, fua)
    }
    fn flush(&self) -> Result<(), VolumeError> {
        self.slot.record('F', 0, 0);
        self.inner.flush()
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, VolumeError> {
        self.inner.block_status(offset, len)
    }
    fn write_batch(&self, writes: &[(u64, &[u8])], fua: bool) -> Result<(), VolumeError> {
        for &(offset, data) in writes {
            self.slot.record('W', offset, data.len() as u64);
        }
        self.inner.write_batch(writes, fua)
    }
    fn write_buffer(&self, len: usize) -> WriteBuf {
        self.inner.write_buffer(len)
    }
    fn write_owned(&self, offset: u64, data: WriteBuf, fua: bool) -> Result<(), VolumeError> {
        self.slot.record('W', offset, data.data().len() as u64);
        self.inner.write_owned(offset, data, fua)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::{Engine, EngineConfig, Layout, VolumeSpec};
    use sluice_media::{BlockDevice, MemoryDevice};

    fn volume() -> TracedVolume<sluice_engine::EngineVolume> {
        let dev = |n| Arc::new(MemoryDevice::new(n, 4096)) as Arc<dyn BlockDevice>;
        let spec = [VolumeSpec { name: "v".into(), size_bytes: 64 << 20 }];
        let cfg = EngineConfig { chunk_bytes: 1 << 20, layout: Layout::InPlace, ..EngineConfig::default() };
        let e = Engine::create(dev(16 << 20), dev(80 << 20), cfg, &spec).unwrap();
        TracedVolume::new(e.volume("v").unwrap())
    }

    /// Requests are recorded in order with growing timestamps while a
    /// target is set, not before or after; the file stops before
    /// `trace_max`; the same target again does not truncate it.
    #[test]
    fn a_trace_records_requests_while_on_and_stops_at_its_bound() {
        let dir = std::env::temp_dir().join(format!("sluice-recorder-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let v = volume();
        let slot = v.slot();
        v.write(0, &[1; 4096], false).unwrap();
        let t = target("t.csv", 1 << 20, &dir).unwrap();
        slot.set(Some(t.clone())).unwrap();
        v.write_batch(&[(8192, &[2; 8192]), (65536, &[3; 4096])], false).unwrap();
        let mut b = vec![0; 4096];
        v.read(8192, &mut b).unwrap();
        v.write_zeroes(0, 4096, false).unwrap();
        v.flush().unwrap();
        slot.set(Some(t.clone())).unwrap();
        v.trim(65536, 4096).unwrap();
        slot.set(None).unwrap();
        v.write(0, &[4; 4096], false).unwrap();
        let text = std::fs::read_to_string(dir.join("t.csv")).unwrap();
        let recs = sluice_workload::parse_trace(&text).unwrap();
        let ops: Vec<(sluice_workload::TraceOp, u64, u64)> = recs.iter().map(|r| (r.op, r.offset, r.size)).collect();
        use sluice_workload::TraceOp::*;
        assert_eq!(
            ops,
            [
                (Write, 8192, 8192),
                (Write, 65536, 4096),
                (Read, 8192, 4096),
                (Trim, 0, 4096),
                (Flush, 0, 0),
                (Trim, 65536, 4096)
            ]
        );
        assert!(recs.windows(2).all(|w| w[0].timestamp_us <= w[1].timestamp_us));
        assert!(text.starts_with("# sluice trace: volume \"v\", size 67108864 bytes"), "{text}");

        // Bounded: 300 bytes hold the header and a few lines.
        slot.set(Some(TraceTarget { path: dir.join("small.csv"), max_bytes: 300 })).unwrap();
        for i in 0..100 {
            v.write(i * 4096, &[5; 4096], false).unwrap();
        }
        slot.set(None).unwrap();
        let small = std::fs::read_to_string(dir.join("small.csv")).unwrap();
        assert!(small.len() <= 300, "{} bytes", small.len());
        assert!(small.trim_end().ends_with("# stopped: trace_max 300 reached"), "{small}");
        let n = sluice_workload::parse_trace(&small).unwrap().len();
        assert!((1..100).contains(&n), "{n} records");

        // A trace file that cannot be created is an error and records nothing.
        assert!(slot.set(Some(TraceTarget { path: dir.join("no/such/dir.csv"), max_bytes: 1 << 20 })).is_err());
        v.write(0, &[6; 4096], false).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
