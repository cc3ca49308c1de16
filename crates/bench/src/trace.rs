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
//! The first bad line or failed request ends the replay with a typed error.

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
    pub device: DeviceStats,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("trace: {0}")]
    Trace(#[from] TraceError),
    #[error("trace record {record}: {op:?} failed: {source}")]
    Io { record: u64, op: IoOp, source: sluice_media::DeviceError },
    #[error("inflight_max must be at least 1")]
    NoDepth,
}

struct Tally {
    read_lat: Histogram,
    write_lat: Histogram,
    first_ns: Option<u64>,
    last_ns: u64,
}

impl Tally {
    fn take(&mut self, c: IoCompletion) -> Result<(), ReplayError> {
        if let Err(source) = c.result {
            return Err(ReplayError::Io { record: c.user_data, op: c.op, source });
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
    let mut tally =
        Tally { read_lat: Histogram::default(), write_lat: Histogram::default(), first_ns: None, last_ns: 0 };
    let mut out = Vec::new();
    let mut n = [0u64; 4];
    let (mut read_bytes, mut write_bytes) = (0u64, 0u64);
    let mut count = 0u64;
    for rec in records {
        let rec = rec?;
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
        count += 1;
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
        device,
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
        let bad = parse_trace("0,W,4097,4096\n").unwrap();
        assert!(matches!(
            replay(&*dev, &*clock, bad.into_iter().map(Ok), 4),
            Err(ReplayError::Io { record: 0, op: IoOp::Write, .. })
        ));
        assert!(matches!(replay(&*dev, &*clock, std::iter::empty(), 0), Err(ReplayError::NoDepth)));
    }
}
