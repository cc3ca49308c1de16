//! Where a connection's requests run: on the thread that read them, or on
//! the worker pool. The server decides from how long the volume took for
//! the connection's recent requests of the same kind; no volume says.
//!
//! Why: a request that takes a few microseconds costs more to hand to
//! another thread (a wake-up and a context switch) than to run, and writes
//! run on the reader thread share one `write_batch` (one group commit in
//! the engine). A request that waits on a device for long would stall every
//! later request of its connection on the reader thread; on the pool, they
//! overlap. The same volume can be either: the engine's requests take
//! microseconds on memory devices and much longer on emulated or real slow
//! ones, and its reads get faster as its cache warms. Volumes once said
//! which they were with hints shaped by their locks (a volume that ran one
//! request at a time under one lock "serialized requests"); measuring
//! removed both the hints and the guesswork.
//!
//! Invariants:
//! - A kind with no measurement yet runs on the pool, so a volume that
//!   blocks on a connection's first requests does not stall the reader.
//! - A FLUSH always runs on the pool: the writes read after it go on while
//!   the device flushes, and flushes in flight together share one device
//!   flush.
//! - A request is timed in the volume call alone (not the queueing before
//!   it, nor the reply), so a busy pool does not by itself push requests
//!   off the reader.
//! - A kind moves only at the end of a window of `WINDOW` requests, on
//!   the window's median (see `Pace::record`), so the few requests that
//!   wait behind others do not move it.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

use crate::proto::Command;

/// The default of `ServerOptions::slow_request_ns`: a request that took
/// this long or more is slow, and a kind whose requests are mostly faster
/// runs on the reader thread. A hand-off to the pool costs a few
/// microseconds of CPU on both sides and as much again in latency; at
/// 20 µs a connection run inline still does 50,000 requests/s, beyond what
/// one client connection of fio or qemu asks of a slow volume.
pub(crate) const SLOW_REQUEST_NS: u64 = 20_000;

/// Decisions are taken over this many requests of a kind.
const WINDOW: u32 = 16;

/// Where a kind runs.
const UNKNOWN: u8 = 0;
const INLINE: u8 = 1;
const POOLED: u8 = 2;

/// The kinds measured apart: reads (and the other commands that only look)
/// and writes (and the other commands that change data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read = 0,
    Write = 1,
}

impl Kind {
    /// The kind of a command, or None for one that always runs on the pool
    /// (FLUSH).
    fn of(command: Command) -> Option<Kind> {
        match command {
            Command::Flush => None,
            Command::Read | Command::Cache | Command::BlockStatus | Command::Disc => Some(Kind::Read),
            Command::Write | Command::Trim | Command::WriteZeroes => Some(Kind::Write),
        }
    }
}

/// One kind's window: requests seen in it, how many were slow, and where
/// the kind runs until the window closes.
struct Tally {
    seen: AtomicU32,
    slow: AtomicU32,
    place: AtomicU8,
}

/// One connection's decisions, one per kind.
pub(crate) struct Pace {
    kinds: [Tally; 2],
    /// A request that took this long or more is slow.
    slow_ns: u64,
}

impl Pace {
    pub(crate) fn new(slow_ns: u64) -> Pace {
        let tally = || Tally { seen: AtomicU32::new(0), slow: AtomicU32::new(0), place: AtomicU8::new(UNKNOWN) };
        Pace { kinds: [tally(), tally()], slow_ns }
    }

    /// Run a request of this command on the reader thread?
    pub(crate) fn inline(&self, command: Command) -> bool {
        Kind::of(command).is_some_and(|k| self.kinds[k as usize].place.load(Ordering::Relaxed) == INLINE)
    }

    /// Run writes on the reader thread (and so batch them)?
    pub(crate) fn inline_writes(&self) -> bool {
        self.inline(Command::Write)
    }

    /// The volume took `ns` for one request of `command`. The first
    /// request of a kind places it; then each window of `WINDOW` requests
    /// does: on the pool if more than half of them were slow. A median,
    /// not a mean: the requests that waited behind another connection's
    /// (for a lock, or for the engine's write throttle) are a minority on
    /// a volume whose requests are short, and averaging them in moved such
    /// a volume's writes to the pool, where they lost their batches and
    /// waited more. Concurrent samples may race: it is an estimate.
    pub(crate) fn record(&self, command: Command, ns: u64) {
        let Some(k) = Kind::of(command) else { return };
        let t = &self.kinds[k as usize];
        let slow = ns >= self.slow_ns;
        let place = |slow: bool| if slow { POOLED } else { INLINE };
        if t.place.load(Ordering::Relaxed) == UNKNOWN {
            t.place.store(place(slow), Ordering::Relaxed);
            return;
        }
        let slow_seen = t.slow.fetch_add(slow as u32, Ordering::Relaxed) + slow as u32;
        let seen = t.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if seen >= WINDOW {
            t.place.store(place(slow_seen * 2 > seen), Ordering::Relaxed);
            t.seen.store(0, Ordering::Relaxed);
            t.slow.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmeasured_kinds_and_flushes_run_on_the_pool() {
        let p = Pace::new(SLOW_REQUEST_NS);
        assert!(!p.inline(Command::Read) && !p.inline(Command::Write));
        p.record(Command::Flush, 1);
        assert!(!p.inline(Command::Flush), "a flush is never run on the reader");
        p.record(Command::Trim, 2_000);
        assert!(p.inline(Command::Write) && p.inline(Command::WriteZeroes), "a trim places the write kind");
        assert!(!p.inline(Command::Read), "reads are measured apart");
        p.record(Command::Read, 1_000);
        assert!(p.inline(Command::BlockStatus));
    }

    #[test]
    fn a_kind_goes_to_the_pool_when_most_of_a_window_is_slow_and_comes_back_when_most_is_fast() {
        let p = Pace::new(SLOW_REQUEST_NS);
        p.record(Command::Write, 2_000);
        assert!(p.inline_writes(), "the first request places its kind");
        // One slow request in four (waits behind another connection): stays.
        for i in 0..10 * WINDOW {
            p.record(Command::Write, if i % 4 == 0 { 1_000_000 } else { 2_000 });
            assert!(p.inline_writes(), "moved after {i} requests");
        }
        // A window that is mostly slow moves it, at the window's end only.
        for i in 0..WINDOW {
            assert!(p.inline_writes(), "moved before the window closed ({i})");
            p.record(Command::Write, if i % 4 == 0 { 2_000 } else { 100_000 });
        }
        assert!(!p.inline_writes(), "a window of mostly slow writes");
        // Exactly half slow is not most.
        for i in 0..WINDOW {
            p.record(Command::Write, if i % 2 == 0 { 2_000 } else { 100_000 });
        }
        assert!(p.inline_writes(), "half fast brings it back");
        // A slow volume stays on the pool.
        p.record(Command::Read, 1_000_000);
        for _ in 0..10 * WINDOW {
            p.record(Command::Read, 100_000);
            assert!(!p.inline(Command::Read));
        }
    }
}
