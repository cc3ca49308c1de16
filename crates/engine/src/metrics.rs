//! Per-volume request metrics: operation and byte counters and latency
//! histograms, updated lock-free from any thread.
//!
//! The histogram is log-linear (HDR-style): for each power of two of
//! nanoseconds, `SUB_BUCKETS` equal sub-buckets, so any quantile is within
//! 1/`SUB_BUCKETS` (12.5 %) of the true value, from 1 ns to ~70 s, in a fixed
//! 2.5 KiB per histogram. Counters only grow; rates (IOPS, MiB/s) are the
//! difference of two snapshots over their interval, as Prometheus does.
//!
//! A volume's counters are kept in `SHARDS` shards, each on cache lines of
//! its own, chosen by the recording thread's number and added up by
//! `snapshot`: threads serving one volume at a million requests a second
//! each would otherwise spend more on bouncing the counters' cache lines
//! between cores than on the request (issue "The write path on every core").

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

const SUB_BITS: u32 = 3;
const SUB_BUCKETS: usize = 1 << SUB_BITS;
/// Exponents 0..=36 (2^36 ns ≈ 69 s); longer latencies land in the last bucket.
const EXPONENTS: usize = 37;
const BUCKETS: usize = EXPONENTS * SUB_BUCKETS;

/// Log-linear latency histogram in nanoseconds.
pub struct LatencyHistogram {
    buckets: Box<[AtomicU64]>,
    /// Every recorded latency added up (a Prometheus summary's `_sum`).
    sum_ns: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram { buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(), sum_ns: AtomicU64::new(0) }
    }
}

fn bucket_of(ns: u64) -> usize {
    if ns < SUB_BUCKETS as u64 {
        return ns as usize;
    }
    let exp = 63 - ns.leading_zeros(); // ≥ SUB_BITS
    let sub = (ns >> (exp - SUB_BITS)) as usize & (SUB_BUCKETS - 1);
    (((exp - SUB_BITS + 1) as usize) * SUB_BUCKETS + sub).min(BUCKETS - 1)
}

/// The upper bound (ns) of bucket `i`.
fn bucket_top(i: usize) -> u64 {
    if i < SUB_BUCKETS {
        return i as u64;
    }
    let exp = (i / SUB_BUCKETS) as u32 + SUB_BITS - 1;
    let sub = (i % SUB_BUCKETS) as u64;
    ((SUB_BUCKETS as u64 + sub + 1) << (exp - SUB_BITS)) - 1
}

impl LatencyHistogram {
    pub fn record(&self, ns: u64) {
        self.buckets[bucket_of(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// The sum of every recorded latency, nanoseconds.
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns.load(Ordering::Relaxed)
    }

    /// Counts per bucket, copied.
    fn counts(&self) -> Vec<u64> {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect()
    }

    /// Quantiles `qs` (0..=1) in nanoseconds (upper bucket bounds); 0 if empty.
    pub fn quantiles(&self, qs: &[f64]) -> Vec<u64> {
        quantiles_of(&self.counts(), qs)
    }
}

/// Quantiles `qs` of a histogram's bucket `counts` (`LatencyHistogram::quantiles`).
fn quantiles_of(counts: &[u64], qs: &[f64]) -> Vec<u64> {
    let total: u64 = counts.iter().sum();
    qs.iter()
        .map(|&q| {
            if total == 0 {
                return 0;
            }
            let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
            let mut seen = 0;
            for (i, &c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return bucket_top(i);
                }
            }
            bucket_top(BUCKETS - 1)
        })
        .collect()
}

/// The operations a volume counts separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read = 0,
    Write = 1,
    Trim = 2,
    Flush = 3,
}

pub const OPS: [Op; 4] = [Op::Read, Op::Write, Op::Trim, Op::Flush];

impl Op {
    pub fn name(self) -> &'static str {
        ["read", "write", "trim", "flush"][self as usize]
    }
}

/// One volume's counters, in shards (module doc).
pub struct VolumeMetrics {
    shards: Box<[Shard]>,
    /// Reads that found a block not matching its CRC (answered with an error).
    checksum_errors: AtomicU64,
}

const SHARDS: usize = 4;

/// One shard of a volume's counters (the histograms' buckets are
/// allocations of their own).
#[repr(align(128))]
#[derive(Default)]
struct Shard {
    ops: [AtomicU64; 4],
    bytes: [AtomicU64; 4],
    errors: [AtomicU64; 4],
    latency: [LatencyHistogram; 4],
}

impl Default for VolumeMetrics {
    fn default() -> Self {
        VolumeMetrics { shards: (0..SHARDS).map(|_| Shard::default()).collect(), checksum_errors: AtomicU64::new(0) }
    }
}

/// Quantiles reported for every operation.
pub const QUANTILES: [f64; 4] = [0.5, 0.9, 0.99, 0.999];

/// A copy of one operation's counters.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OpSnapshot {
    pub op: &'static str,
    pub count: u64,
    pub bytes: u64,
    pub errors: u64,
    /// Latency at `QUANTILES` (p50, p90, p99, p99.9), microseconds.
    pub latency_us: [f64; 4],
    /// Every request's latency added up, seconds.
    pub latency_sum_s: f64,
}

impl VolumeMetrics {
    /// Count one completed request of `bytes` that took `ns`.
    pub fn record(&self, op: Op, bytes: u64, ns: u64, ok: bool) {
        let i = op as usize;
        let s = &self.shards[sluice_media::device::thread_no() as usize % SHARDS];
        s.ops[i].fetch_add(1, Ordering::Relaxed);
        if ok {
            s.bytes[i].fetch_add(bytes, Ordering::Relaxed);
        } else {
            s.errors[i].fetch_add(1, Ordering::Relaxed);
        }
        s.latency[i].record(ns);
    }

    pub fn count_checksum_error(&self) {
        self.checksum_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn checksum_errors(&self) -> u64 {
        self.checksum_errors.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> Vec<OpSnapshot> {
        OPS.iter()
            .map(|&op| {
                let i = op as usize;
                let sum = |f: &dyn Fn(&Shard) -> u64| self.shards.iter().map(f).sum::<u64>();
                let mut counts = vec![0u64; BUCKETS];
                for s in self.shards.iter() {
                    counts.iter_mut().zip(s.latency[i].counts()).for_each(|(c, n)| *c += n);
                }
                let q = quantiles_of(&counts, &QUANTILES);
                OpSnapshot {
                    op: op.name(),
                    count: sum(&|s| s.ops[i].load(Ordering::Relaxed)),
                    bytes: sum(&|s| s.bytes[i].load(Ordering::Relaxed)),
                    errors: sum(&|s| s.errors[i].load(Ordering::Relaxed)),
                    latency_us: [0, 1, 2, 3].map(|k| q[k] as f64 / 1000.0),
                    latency_sum_s: sum(&|s| s.latency[i].sum_ns()) as f64 / 1e9,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for ns in (0..5000u64).chain([1 << 20, (1 << 20) + 1, 123_456_789, 1 << 40]) {
            let b = bucket_of(ns);
            assert!(b >= last || ns >= 1 << 20, "monotonic at {ns}");
            last = b;
            let top = bucket_top(b);
            if ns < 1 << 36 {
                assert!(top >= ns, "top {top} ≥ {ns}");
                assert!(top as f64 <= ns as f64 * 1.125 + 1.0, "within 12.5 % at {ns}: {top}");
            }
        }
    }

    #[test]
    fn quantiles_of_a_known_distribution() {
        let h = LatencyHistogram::default();
        assert_eq!(h.quantiles(&[0.5]), vec![0]);
        // 1..=1000 µs, uniformly.
        for us in 1..=1000u64 {
            h.record(us * 1000);
        }
        let q = h.quantiles(&[0.5, 0.99]);
        assert!((500_000..=562_500).contains(&q[0]), "{q:?}");
        assert!((990_000..=1_113_750).contains(&q[1]), "{q:?}");
    }

    #[test]
    fn volume_metrics_count_ops_bytes_errors() {
        let m = VolumeMetrics::default();
        m.record(Op::Write, 4096, 10_000, true);
        m.record(Op::Write, 8192, 20_000, true);
        m.record(Op::Write, 4096, 5_000, false);
        m.record(Op::Read, 4096, 1_000, true);
        let s = m.snapshot();
        assert_eq!((s[1].count, s[1].bytes, s[1].errors), (3, 12288, 1));
        assert_eq!((s[0].count, s[0].bytes), (1, 4096));
        assert!(s[1].latency_us[3] >= 20.0 && s[1].latency_us[3] <= 22.5, "{:?}", s[1]);
    }
}
