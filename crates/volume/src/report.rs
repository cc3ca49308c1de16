//! Operator-facing log lines of the engine: what it says on stderr when a
//! device error stops it or a read finds a damaged block, bounded so that a
//! failing device cannot flood the log (`LogLimit`), and silenced in crash
//! simulations, which provoke such errors by the thousand (`quiet`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Set by the crash simulation, which provokes device errors by the
/// thousand: the engine then does not log each one (`say`).
static QUIET: AtomicBool = AtomicBool::new(false);

/// Stop the engine's own log lines in this process (simulations).
pub fn quiet() {
    QUIET.store(true, Ordering::Relaxed);
}

/// A bound on log lines of one kind: at most `LINES_PER_SECOND` a second.
/// Lines beyond it are counted, and the next line admitted says how many.
pub struct LogLimit {
    second: AtomicU64,
    lines: AtomicU64,
    suppressed: AtomicU64,
}

impl LogLimit {
    pub const LINES_PER_SECOND: u64 = 10;

    pub const fn new() -> LogLimit {
        LogLimit { second: AtomicU64::new(0), lines: AtomicU64::new(0), suppressed: AtomicU64::new(0) }
    }

    /// `Some(lines left out since the last one)` if a line may be written now.
    pub fn admit(&self) -> Option<u64> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if self.second.swap(now, Ordering::Relaxed) != now {
            self.lines.store(0, Ordering::Relaxed);
        }
        if self.lines.fetch_add(1, Ordering::Relaxed) < Self::LINES_PER_SECOND {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }

    /// " (N more not logged)" for `admit`'s count, or nothing.
    pub fn also(left_out: u64) -> String {
        if left_out > 0 {
            format!(" ({left_out} more not logged)")
        } else {
            String::new()
        }
    }
}

impl Default for LogLimit {
    fn default() -> LogLimit {
        LogLimit::new()
    }
}

/// Write an operator-facing line to stderr, unless `quiet`.
pub fn say(line: std::fmt::Arguments<'_>) {
    if !QUIET.load(Ordering::Relaxed) {
        eprintln!("{line}");
    }
}
