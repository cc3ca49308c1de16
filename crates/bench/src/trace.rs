//! Replay a CSV block trace against a device, open loop.
//!
//! Each record is submitted at its own timestamp on the device clock (relative
//! to the first record), whether or not earlier requests have completed — a
//! trace records when an application asked, not when the old device answered.
//! In-flight requests are bounded by `inflight_max` (the submitter stalls, as
//! a real queue would); records whose timestamp has already passed go at once,
//! so an overloaded device shows up as growing latency. Under a virtual clock
//! the replay is deterministic and runs as fast as the CPU allows.
//!
//! Real traces are taken as they are:
//! - requests that are not whole blocks (512-byte sectors are common) are
//!   widened to the blocks they touch, as a device would read-modify-write
//!   them; a trim is narrowed to the blocks it covers whole (nothing left:
//!   skipped). Both are counted (`unaligned_records`); the read of a
//!   read-modify-write is not issued, only its write;
//! - a trim the device does not support (a disk, a zoned drive) is counted
//!   as ignored, not an error.
//!
//! The first bad line or failed request ends the replay with a typed error;
//! requests are numbered from 1 in file order (lines that are comments,
//! blank or a header are not counted).

use crate::runner::Histogram;
use serde::Serialize;
use sluice_media::{BlockDevice, Clock, DeviceStats, IoBuf, IoCompletion, IoOp, IoRequest};
use sluice_workload::{TraceError, TraceOp, TraceRecord};

/// What a replay measured.
#[derive(Clone, Debug, Serialize)]
pub struct TraceReport {
    pub records: u64,
    pub reads: u64,
    pub writes: u64,
    pub trims: u64,
    pub flushes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Device time from the first submission to the last completion.
    pub device_seconds: f64,
    pub read_lat_p50_us: f64,
    pub read_lat_p99_us: f64,
    pub write_lat_p50_us: f64,
    pub write_lat_p99_us: f64,
    pub waf: f64,
    /// Records widened (or a trim narrowed) to whole blocks.
    pub unaligned_records: u64,
    /// Trims the device does not support, skipped.
    pub trims_ignored: u64,
    pub device: DeviceStats,
}

/// `r` as whole `block`-byte blocks (module doc); `None` for a trim that
/// covers no whole block.
pub fn whole_blocks(r: TraceRecord, block: u64) -> Option<TraceRecord> {
    let (s, e) = (r.offset, r.offset + r.size);
    let (s, e) = match r.op {
        TraceOp::Flush => return Some(r),
        TraceOp::Trim => (s.div_ceil(block) * block, e / block * block),
        TraceOp::Read | TraceOp::Write => (s / block * block, e.div_ceil(block) * block),
    };
    (e > s).then(|| TraceRecord { offset: s, size: e - s, ..r })
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    #[error("trace: {0}")]
    Trace(#[from] TraceError),
    #[error("trace request {record} (counting from 1): {op:?} failed: {source}")]
    Io { record: u64, op: IoOp, source: sluice_media::DeviceError },
    #[error("inflight_max must be at least 1")]
    NoDepth,
    #[error("opening the trace again: {0}")]
    Reopen(#[source] std::io::Error),
}

struct Tally {
    read_lat: Histogram,
    write_lat: Histogram,
    first_ns: Option<u64>,
    last_ns: u64,
    trims_ignored: u64,
}

impl Tally {
    fn take(&mut self, c: IoCompletion) -> Result<(), ReplayError> {
        match c.result {
            Err(sluice_media::DeviceError::Unsupported(IoOp::Discard)) => {
                self.trims_ignored += 1;
                return Ok(());
            }
            Err(source) => return Err(ReplayError::Io { record: c.user_data, op: c.op, source }),
            Ok(_) => {}
        }
        let lat = c.completed_ns - c.submitted_ns;
        match c.op {
            IoOp::Read => self.read_lat.record(lat),
            IoOp::Write => self.write_lat.record(lat),
            _ => {}
        }
        self.first_ns = Some(self.first_ns.map_or(c.submitted_ns, |f| f.min(c.submitted_ns)));
        self.last_ns = self.last_ns.max(c.completed_ns);
        Ok(())
    }
}

/// Replay `records` on `dev` (whose clock is `clock`).
pub fn replay(
    dev: &dyn BlockDevice,
    clock: &dyn Clock,
    records: impl Iterator<Item = Result<TraceRecord, TraceError>>,
    inflight_max: usize,
) -> Result<TraceReport, ReplayError> {
    if inflight_max == 0 {
        return Err(ReplayError::NoDepth);
    }
    let start_stats = dev.stats();
    let origin_ns = clock.now_ns();
    let mut first_ts_us: Option<u64> = None;
    let mut tally = Tally {
        read_lat: Histogram::default(),
        write_lat: Histogram::default(),
        first_ns: None,
        last_ns: 0,
        trims_ignored: 0,
    };
    let block = dev.info().block_bytes;
    let mut unaligned = 0u64;
    let mut out = Vec::new();
    let mut n = [0u64; 4];
    let (mut read_bytes, mut write_bytes) = (0u64, 0u64);
    let mut count = 0u64;
    for rec in records {
        let raw = rec?;
        count += 1;
        let Some(rec) = whole_blocks(raw, block) else {
            unaligned += 1;
            continue;
        };
        unaligned += u64::from(rec != raw);
        let t0 = *first_ts_us.get_or_insert(rec.timestamp_us);
        let at_ns = origin_ns + rec.timestamp_us.saturating_sub(t0).saturating_mul(1000);
        while dev.in_flight() >= inflight_max {
            out.clear();
            dev.reap(1, &mut out);
            for c in out.drain(..) {
                tally.take(c)?;
            }
        }
        if at_ns > clock.now_ns() {
            // Whatever was submitted before now runs now: a device that
            // queues submissions until a reap (a stacked system) must not
            // hold them until the replay next collects completions.
            out.clear();
            dev.reap(0, &mut out);
            for c in out.drain(..) {
                tally.take(c)?;
            }
            clock.wait_until(at_ns);
        }
        let req = match rec.op {
            TraceOp::Read => {
                n[0] += 1;
                read_bytes += rec.size;
                IoRequest::read(rec.offset, rec.size as usize, count)
            }
            TraceOp::Write => {
                n[1] += 1;
                write_bytes += rec.size;
                IoRequest::write(rec.offset, IoBuf::zeroed(rec.size as usize), count)
            }
            TraceOp::Trim => {
                n[2] += 1;
                IoRequest::discard(rec.offset, rec.size, count)
            }
            TraceOp::Flush => {
                n[3] += 1;
                IoRequest::flush(count)
            }
        };
        dev.submit(req);
    }
    while dev.in_flight() > 0 {
        out.clear();
        dev.reap(1, &mut out);
        for c in out.drain(..) {
            tally.take(c)?;
        }
    }
    let device = dev.stats().since(&start_stats);
    let us = |h: &Histogram, q| h.quantile(q) as f64 / 1e3;
    Ok(TraceReport {
        records: count,
        reads: n[0],
        writes: n[1],
        trims: n[2],
        flushes: n[3],
        read_bytes,
        write_bytes,
        device_seconds: (tally.last_ns - tally.first_ns.unwrap_or(0)) as f64 / 1e9,
        read_lat_p50_us: us(&tally.read_lat, 0.5),
        read_lat_p99_us: us(&tally.read_lat, 0.99),
        write_lat_p50_us: us(&tally.write_lat, 0.5),
        write_lat_p99_us: us(&tally.write_lat, 0.99),
        waf: device.device_waf(),
        unaligned_records: unaligned,
        trims_ignored: tally.trims_ignored,
        device,
    })
}

/// One pass of a multi-pass replay: the replay's report, and each tier's
/// counters over the pass on a stacked system.
#[derive(Clone, Debug, Serialize)]
pub struct Pass {
    pub report: TraceReport,
    pub cache: Option<DeviceStats>,
    pub capacity: Option<DeviceStats>,
}

/// A trace replayed `passes` times after an optional preconditioning fill.
#[derive(Clone, Debug, Serialize)]
pub struct TraceRun {
    pub system: String,
    /// Bytes written by the sequential fill (0: none) and its device time.
    pub precondition_bytes: u64,
    pub precondition_device_seconds: f64,
    pub passes: Vec<Pass>,
    /// Over the second half of the passes (steady state): bytes programmed
    /// to the capacity medium (the device's own medium when bare), bytes the
    /// trace wrote, and their ratio.
    pub steady_passes: usize,
    pub steady_media_program_bytes: u64,
    pub steady_write_bytes: u64,
    pub steady_waf: f64,
}

/// Write every byte of `dev` once, sequentially, 1 MiB at a time at most 32
/// in flight (a drive's preconditioning fill; on a stack, every volume).
pub fn fill(dev: &dyn BlockDevice, clock: &dyn Clock) -> Result<(u64, f64), ReplayError> {
    let (size, unit) = (dev.info().capacity_bytes, 1u64 << 20);
    let t0 = clock.now_ns();
    let mut out = Vec::new();
    let mut at = 0;
    while at < size || dev.in_flight() > 0 {
        if at < size && dev.in_flight() < 32 {
            let len = unit.min(size - at);
            dev.submit(IoRequest::write(at, IoBuf::zeroed(len as usize), at));
            at += len;
            continue;
        }
        out.clear();
        dev.reap(1, &mut out);
        for c in out.drain(..) {
            if let Err(source) = c.result {
                return Err(ReplayError::Io { record: 0, op: c.op, source });
            }
        }
    }
    Ok((size, (clock.now_ns() - t0) as f64 / 1e9))
}

/// Replay the trace `open()` yields `passes` times (each pass starts when
/// the last one's requests have completed), after a sequential fill if
/// `precondition`.
pub fn replay_passes<I: Iterator<Item = Result<TraceRecord, TraceError>>>(
    built: &crate::runner::Built,
    system: &str,
    mut open: impl FnMut() -> std::io::Result<I>,
    passes: usize,
    precondition: bool,
    inflight_max: usize,
) -> Result<TraceRun, ReplayError> {
    let (dev, clock) = (&*built.dev, &*built.clock);
    let (precondition_bytes, precondition_device_seconds) = if precondition { fill(dev, clock)? } else { (0, 0.0) };
    let tier_stats = || built.tiers.as_ref().map(|(c, k)| (c.stats(), k.stats()));
    let mut out = Vec::new();
    for _ in 0..passes.max(1) {
        let before = tier_stats();
        let report = replay(dev, clock, open().map_err(ReplayError::Reopen)?, inflight_max)?;
        let (cache, capacity) = match (before, tier_stats()) {
            (Some((c0, k0)), Some((c1, k1))) => (Some(c1.since(&c0)), Some(k1.since(&k0))),
            _ => (None, None),
        };
        out.push(Pass { report, cache, capacity });
    }
    let steady = &out[out.len() / 2..];
    let programmed: u64 = steady.iter().map(|p| p.report.device.media_program_bytes).sum();
    let written: u64 = steady.iter().map(|p| p.report.write_bytes).sum();
    Ok(TraceRun {
        system: system.to_string(),
        precondition_bytes,
        precondition_device_seconds,
        steady_passes: steady.len(),
        steady_media_program_bytes: programmed,
        steady_write_bytes: written,
        steady_waf: if written == 0 { 0.0 } else { programmed as f64 / written as f64 },
        passes: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::System;
    use sluice_workload::parse_trace;

    #[test]
    fn replays_every_record_at_its_time() {
        let crate::job::Built { dev, clock, .. } = System::Scm.build(1 << 30).unwrap();
        // Two reads 1 s apart: the replay takes ≥ 1 s of device time, and each
        // read is served alone (microseconds), not queued behind the other.
        let text = "timestamp_us,op,offset,size\n0,R,0,4096\n1000000,R,536870912,4096\n1000001,W,4096,8192\n1000002,T,0,4096\n1000003,F,0,0\n";
        let recs = parse_trace(text).unwrap();
        let r = replay(&*dev, &*clock, recs.into_iter().map(Ok), 8).unwrap();
        assert_eq!((r.records, r.reads, r.writes, r.trims, r.flushes), (5, 2, 1, 1, 1));
        assert_eq!(r.read_bytes, 8192);
        assert_eq!(r.write_bytes, 8192);
        assert!(r.device_seconds >= 1.0, "{}", r.device_seconds);
        assert!(r.read_lat_p99_us < 50.0, "a lone read on idle SCM: {} us", r.read_lat_p99_us);
    }

    /// On a stacked system (which runs submissions at the next reap), a
    /// trace's requests still start at their timestamps: a write 1 s after
    /// another is not held back to run beside it.
    #[test]
    fn requests_on_a_stacked_system_start_at_their_timestamps() {
        let crate::job::Built { dev, clock, .. } = System::SluiceQlc.build(1 << 30).unwrap();
        let text = "0,W,0,4096\n1000000,W,8192,4096\n";
        let r = replay(&*dev, &*clock, parse_trace(text).unwrap().into_iter().map(Ok), 256).unwrap();
        assert!(r.device_seconds >= 1.0, "the second write ran at {} s", r.device_seconds);
        assert!(r.write_lat_p99_us < 1000.0, "each write alone: {} us", r.write_lat_p99_us);
    }

    /// Sub-block requests are widened to whole blocks, a trim to the blocks
    /// it covers; a trim a disk cannot do is counted, not fatal.
    #[test]
    fn real_traces_unaligned_requests_and_trims_replay_on_a_disk() {
        let crate::job::Built { dev, clock, .. } = System::Hdd.build(1 << 30).unwrap();
        let text = "0,W,512,1024\n1,T,0,8192\n2,T,100,200\n3,R,4000,200\n";
        let r = replay(&*dev, &*clock, parse_trace(text).unwrap().into_iter().map(Ok), 4).unwrap();
        assert_eq!((r.records, r.writes, r.reads, r.trims), (4, 1, 1, 1));
        assert_eq!((r.write_bytes, r.read_bytes), (4096, 8192), "widened to the blocks touched");
        assert_eq!((r.unaligned_records, r.trims_ignored), (3, 1));
        assert_eq!(r.device.host_write_bytes, 4096);
    }

    /// Passes repeat the trace on the same device; a fill writes every byte
    /// first; the steady window is the second half; tiers are split on
    /// stacks.
    #[test]
    fn passes_after_a_fill_measure_the_steady_half() {
        let text = "0,W,0,4096\n1000,W,8192,8192\n2000,R,0,4096\n";
        let built = System::SluiceQlc.build(1 << 30).unwrap();
        let run =
            replay_passes(&built, "sluice+qlc", || Ok(parse_trace(text).unwrap().into_iter().map(Ok)), 4, true, 8)
                .unwrap();
        assert_eq!(run.precondition_bytes, built.dev.info().capacity_bytes);
        assert_eq!((run.passes.len(), run.steady_passes, run.steady_write_bytes), (4, 2, 2 * 12288));
        let p = &run.passes[3];
        assert_eq!(p.report.write_bytes, 12288);
        assert!(p.cache.unwrap().host_write_bytes >= 12288, "the writes land in the cache");
        assert!(p.capacity.is_some());
        let bare = System::Hdd.build(1 << 30).unwrap();
        let run =
            replay_passes(&bare, "hdd", || Ok(parse_trace(text).unwrap().into_iter().map(Ok)), 1, false, 8).unwrap();
        assert!(run.passes[0].cache.is_none() && run.precondition_bytes == 0);
    }

    #[test]
    fn overload_shows_as_latency_and_errors_are_typed() {
        // 200 random reads all stamped t=0 on a FIFO disk: at depth 4 each
        // waits behind up to 3 others, at depth 1 behind none.
        let text: String = (0..200u64).map(|i| format!("0,R,{},4096\n", (i * 7919 % 250_000) * 4096)).collect();
        let p50 = |depth| {
            let crate::job::Built { dev, clock, .. } = System::Hdd.build(1 << 30).unwrap();
            replay(&*dev, &*clock, parse_trace(&text).unwrap().into_iter().map(Ok), depth).unwrap().read_lat_p50_us
        };
        let (deep, shallow) = (p50(4), p50(1));
        assert!(deep > 2.0 * shallow, "depth 4 p50 {deep} us vs depth 1 {shallow} us");

        let crate::job::Built { dev, clock, .. } = System::Hdd.build(1 << 30).unwrap();
        let bad = parse_trace("0,R,0,4096\n0,W,1099511627776,4096\n").unwrap();
        let err = replay(&*dev, &*clock, bad.into_iter().map(Ok), 4).unwrap_err();
        assert!(matches!(err, ReplayError::Io { record: 2, op: IoOp::Write, .. }), "{err}");
        assert!(err.to_string().contains("request 2"), "{err}");
        assert!(matches!(replay(&*dev, &*clock, std::iter::empty(), 0), Err(ReplayError::NoDepth)));
    }
}
