//! The set-point controller that paces foreground writes to background
//! compaction.
//!
//! It works the way Linux paces dirty pages (balance_dirty_pages): below a
//! set point it admits writes at a rate proportional to the measured drain
//! bandwidth (a chunk's log bytes over the time of its compaction steps and
//! the GC steps done meanwhile) — exactly that bandwidth at the set point,
//! falling linearly to a tenth of it at the floor — and admits them freely
//! above it. Free space then settles at the set point, where writes run as
//! fast as the log drains, and writers are slowed smoothly instead of being
//! stopped. The inline paths stay as safety valves, so no write ever fails
//! for lack of space.
//!
//! Invariant: a pure function of (time, bytes, free chunks, bandwidth), with
//! no clock and no threads, tested as such; the worker (worker.rs) feeds it
//! and sleeps outside the engine lock.

use std::time::Duration;

/// The set-point controller (no clock, no threads: time comes in as ns).
#[derive(Clone, Debug)]
pub struct Throttle {
    /// Free chunks at which writes run at compaction bandwidth.
    setpoint: f64,
    /// Free chunks at which writes compact inline (the engine's minimum).
    floor: f64,
    max_delay_ns: u64,
    /// Log bytes the compactor frees per second while it works (EWMA);
    /// 0 until measured, and until then nothing is throttled.
    bandwidth: f64,
    /// When the pacing schedule lets the next write start.
    next_ns: u64,
}

impl Throttle {
    pub fn new(setpoint_chunks: f64, floor_chunks: f64, max_delay: Duration) -> Throttle {
        Throttle {
            setpoint: setpoint_chunks.max(floor_chunks + 1.0),
            floor: floor_chunks,
            max_delay_ns: max_delay.as_nanos() as u64,
            bandwidth: 0.0,
            next_ns: 0,
        }
    }

    /// The compactor freed `bytes` of log in `ns` of work.
    pub fn observe(&mut self, bytes: u64, ns: u64) {
        let bw = bytes as f64 * 1e9 / ns.max(1) as f64;
        self.bandwidth = if self.bandwidth == 0.0 { bw } else { 0.75 * self.bandwidth + 0.25 * bw };
    }

    /// Measured compaction bandwidth (bytes/s), 0 before the first chunk.
    pub fn bandwidth(&self) -> f64 {
        self.bandwidth
    }

    /// The rate (bytes/s) writes are admitted at with `free` free chunks, or
    /// None when they are not paced.
    pub fn rate(&self, free: usize) -> Option<f64> {
        let free = free as f64;
        if free >= self.setpoint || self.bandwidth == 0.0 {
            return None;
        }
        let x = ((free - self.floor) / (self.setpoint - self.floor)).clamp(0.0, 1.0);
        Some(self.bandwidth * (0.1 + 0.9 * x))
    }

    /// A write of `bytes` arriving at `now_ns` with `free` free chunks: how
    /// long it waits before it may go (0 when not paced). Paced writes are
    /// scheduled back to back at `rate`, so concurrent writers share it.
    pub fn admit(&mut self, now_ns: u64, bytes: u64, free: usize) -> u64 {
        let Some(rate) = self.rate(free) else {
            self.next_ns = now_ns;
            return 0;
        };
        let start = self.next_ns.max(now_ns);
        self.next_ns = start + (bytes as f64 * 1e9 / rate) as u64;
        (self.next_ns - now_ns).min(self.max_delay_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle() -> Throttle {
        // Log of 40 chunks: set point 10 free, floor 2, max delay 100 ms.
        let mut t = Throttle::new(10.0, 2.0, Duration::from_millis(100));
        t.observe(100 << 20, 1_000_000_000); // 100 MiB/s
        t
    }

    #[test]
    fn nothing_is_paced_above_the_set_point_or_before_bandwidth_is_known() {
        let mut t = throttle();
        assert_eq!(t.rate(10), None);
        assert_eq!(t.admit(5, 1 << 20, 30), 0);
        let mut fresh = Throttle::new(10.0, 2.0, Duration::from_millis(100));
        assert_eq!(fresh.admit(0, 1 << 20, 3), 0, "unmeasured compaction: the inline floor protects");
    }

    #[test]
    fn writes_run_at_compaction_bandwidth_at_the_set_point_and_slower_below() {
        let t = throttle();
        let bw = (100 << 20) as f64;
        // Just under the set point: (almost) the bandwidth itself.
        let near = t.rate(9).unwrap();
        assert!((near / bw - (0.1 + 0.9 * 7.0 / 8.0)).abs() < 1e-9, "{near}");
        // Monotonic down to a tenth at the floor (and below it).
        let rates: Vec<f64> = (0..10).rev().map(|f| t.rate(f).unwrap()).collect();
        assert!(rates.windows(2).all(|w| w[0] >= w[1]), "{rates:?}");
        assert!((t.rate(2).unwrap() / bw - 0.1).abs() < 1e-9);
        assert_eq!(t.rate(0), t.rate(2));
    }

    #[test]
    fn paced_writes_are_scheduled_back_to_back_and_capped() {
        let mut t = throttle();
        let rate = t.rate(6).unwrap();
        let one = (4096.0 * 1e9 / rate) as u64;
        // Two writes at the same instant: the second waits for the first's slot too.
        assert_eq!(t.admit(1_000, 4096, 6), one);
        assert_eq!(t.admit(1_000, 4096, 6), 2 * one);
        // Later arrivals after the schedule caught up wait only for themselves.
        let later = 1_000 + 10 * one;
        assert_eq!(t.admit(later, 4096, 6), one);
        // A huge write waits at most max_delay.
        assert_eq!(t.admit(later, 1 << 30, 3), 100_000_000);
        // Back above the set point: free again, and the schedule resets.
        assert_eq!(t.admit(later + 1, 1 << 30, 12), 0);
        assert_eq!(t.admit(later + 2, 4096, 6), one);
    }

    #[test]
    fn bandwidth_is_a_moving_average() {
        let mut t = Throttle::new(10.0, 2.0, Duration::from_millis(100));
        t.observe(1000, 1_000_000_000);
        assert_eq!(t.bandwidth(), 1000.0);
        t.observe(2000, 1_000_000_000);
        assert_eq!(t.bandwidth(), 1250.0);
    }
}
