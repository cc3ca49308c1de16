//! What the engine runs on: its clock and its schedule, injected when the
//! engine is created or opened (`Runtime`), never asked of the caller.
//!
//! - **The clock** is the one source of time in the engine: request
//!   latency, the throttle's schedule, idle detection and the age of a
//!   sealed chunk (cleaning) all read it. A live engine runs on real time;
//!   a benchmark in virtual time hands in its own clock.
//! - **The schedule** says how device I/O is ordered. `Concurrent` (the
//!   default): writers write the log and background steps their segments
//!   outside the engine lock, many at once. `Serial`: every device I/O in
//!   request order under the lock, so that a run on emulated devices with
//!   a virtual clock is deterministic.
//! - **The reuse gate**: no write lands in a chunk or band before the
//!   moment it was freed, on the engine's clock. On real time a place is
//!   always freed in the past, so the gate never waits; on a virtual clock
//!   where each caller runs at its own time, it is what holds a simulated
//!   writer back to the compaction rate, as a real compactor would.
//!
//! Invariants: the clock and schedule are fixed for the engine's life
//! (given before its first change); the gate knows every chunk and band.

use super::{BandId, ChunkId, Inner};
use sluice_media::{ClockRef, RealClock};

/// How device I/O is ordered (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Schedule {
    #[default]
    Concurrent,
    Serial,
}

/// The clock and schedule an engine runs on (`Engine::create_on`,
/// `OpenOptions::runtime`).
#[derive(Clone)]
pub struct Runtime {
    pub clock: ClockRef,
    pub schedule: Schedule,
}

impl Default for Runtime {
    fn default() -> Runtime {
        Runtime { clock: RealClock::new(), schedule: Schedule::Concurrent }
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("schedule", &self.schedule).finish_non_exhaustive()
    }
}

/// When each chunk and band was last freed, on the engine's clock (ns).
pub(super) struct ReuseGate {
    chunk_free_at_ns: Vec<u64>,
    band_free_at_ns: Vec<u64>,
}

impl ReuseGate {
    pub(super) fn new(chunks: usize, bands: usize) -> ReuseGate {
        ReuseGate { chunk_free_at_ns: vec![0; chunks], band_free_at_ns: vec![0; bands] }
    }

    /// Whether the gate covers `chunks` chunks and `bands` bands.
    pub(super) fn covers(&self, chunks: usize, bands: usize) -> bool {
        self.chunk_free_at_ns.len() == chunks && self.band_free_at_ns.len() == bands
    }
}

impl Inner {
    /// Run on `runtime` (before the engine is assembled: nothing has read
    /// the clock yet).
    pub(super) fn run_on(&mut self, runtime: Runtime) {
        assert!(self.gate.covers(self.log.chunk_count(), self.bands.len()), "a reuse gate for another geometry");
        self.runtime = runtime;
    }

    /// The engine's clock, now (ns since its origin).
    pub(super) fn now_ns(&self) -> u64 {
        self.runtime.clock.now_ns()
    }

    /// Wait until chunk `chunk` (or band `band`) was freed (module doc).
    pub(super) fn reuse_wait(&self, chunk: Option<ChunkId>, band: Option<BandId>) {
        let g = &self.gate;
        let t =
            chunk.map_or(0, |c| g.chunk_free_at_ns[c.index()]).max(band.map_or(0, |b| g.band_free_at_ns[b.index()]));
        if t > 0 {
            self.runtime.clock.wait_until(t);
        }
    }

    /// Chunk `chunk` (or band `band`) is free as of now.
    pub(super) fn reuse_freed(&mut self, chunk: Option<ChunkId>, band: Option<BandId>) {
        let now = self.runtime.clock.now_ns();
        let g = &mut self.gate;
        if let Some(c) = chunk {
            g.chunk_free_at_ns[c.index()] = now;
        }
        if let Some(b) = band {
            g.band_free_at_ns[b.index()] = now;
        }
    }

    /// Whether device I/O runs in request order under the lock.
    pub(super) fn serial(&self) -> bool {
        self.runtime.schedule == Schedule::Serial
    }
}
