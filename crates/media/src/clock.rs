//! Clocks: virtual time for deterministic simulation, real time for live use.
//!
//! Every emulator computes a completion time for each request from its model;
//! the clock decides what waiting for that time means. A `VirtualClock` jumps
//! straight to it (so a simulated hour runs as fast as the CPU allows and the
//! same seed gives the same result); a `RealClock` sleeps, so a live server
//! feels the medium. Time is nanoseconds since the clock's origin.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's origin.
    fn now_ns(&self) -> u64;
    /// Block (real) or advance (virtual) until `t_ns` counts as reached.
    /// For both clocks here that means `now_ns() >= t_ns` afterwards; a
    /// simulator's clock may instead only record that its caller waited.
    fn wait_until(&self, t_ns: u64);
    /// True when time only moves because somebody waits.
    fn is_virtual(&self) -> bool;
}

/// A shared handle to a clock.
pub type ClockRef = Arc<dyn Clock>;

/// Deterministic time: `wait_until` moves time forward, nothing else does.
#[derive(Debug, Default)]
pub struct VirtualClock {
    now_ns: AtomicU64,
}

impl VirtualClock {
    pub fn new() -> Arc<VirtualClock> {
        Arc::new(VirtualClock::default())
    }
}

impl Clock for VirtualClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::Acquire)
    }
    fn wait_until(&self, t_ns: u64) {
        self.now_ns.fetch_max(t_ns, Ordering::AcqRel);
    }
    fn is_virtual(&self) -> bool {
        true
    }
}

/// Wall-clock time from the moment of creation.
#[derive(Debug)]
pub struct RealClock {
    origin: Instant,
}

impl RealClock {
    pub fn new() -> Arc<RealClock> {
        Arc::new(RealClock { origin: Instant::now() })
    }
}

impl Clock for RealClock {
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
    fn wait_until(&self, t_ns: u64) {
        let now = self.now_ns();
        if t_ns > now {
            std::thread::sleep(Duration::from_nanos(t_ns - now));
        }
    }
    fn is_virtual(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_only_moves_forward_when_waited_on() {
        let c = VirtualClock::new();
        assert_eq!(c.now_ns(), 0);
        c.wait_until(500);
        assert_eq!(c.now_ns(), 500);
        c.wait_until(100);
        assert_eq!(c.now_ns(), 500, "time never goes back");
        assert!(c.is_virtual());
    }

    #[test]
    fn real_clock_sleeps() {
        let c = RealClock::new();
        let t = c.now_ns() + 2_000_000;
        c.wait_until(t);
        assert!(c.now_ns() >= t);
        assert!(!c.is_virtual());
    }
}
