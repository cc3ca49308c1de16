//! Virtual time for simulating this engine as many concurrent callers.

use super::{BandId, ChunkId, Engine, Inner};

/// Causality for simulating this synchronous engine as many concurrent
/// callers on a virtual clock: each call runs at its caller's own time, so a
/// call may free a chunk (or band) at a time later than another caller's
/// present. No write may land in a chunk or band before it was freed; these
/// are the times they were. This is what throttles simulated writers to the
/// compaction rate, as a real background compactor would.
pub(super) struct SimGate {
    clock: sluice_media::ClockRef,
    chunk_free_at_ns: Vec<u64>,
    band_free_at_ns: Vec<u64>,
}

impl Engine {
    /// Simulation only: run on `clock` (the virtual clock the emulated devices
    /// use, which the simulator sets to each caller's time before a call).
    /// From now on a write waits until the chunk or band it lands in was
    /// freed (`SimGate`). Without this the engine ignores time entirely.
    pub fn attach_sim_clock(&self, clock: sluice_media::ClockRef) {
        let mut inner = self.lock();
        let (chunks, bands) = (inner.log.chunk_count(), inner.bands.len());
        inner.sim = Some(SimGate { clock, chunk_free_at_ns: vec![0; chunks], band_free_at_ns: vec![0; bands] });
    }
}

impl Inner {
    /// Simulation: wait until chunk `c` (or band `b`) was freed.
    pub(super) fn sim_wait(&self, chunk: Option<ChunkId>, band: Option<BandId>) {
        if let Some(g) = &self.sim {
            let t = chunk.map_or(0, |c| g.chunk_free_at_ns[c.index()]);
            g.clock.wait_until(t.max(band.map_or(0, |b| g.band_free_at_ns[b.index()])));
        }
    }

    /// Simulation: chunk `c` (or band `b`) is free as of now.
    pub(super) fn sim_freed(&mut self, chunk: Option<ChunkId>, band: Option<BandId>) {
        if let Some(g) = &mut self.sim {
            let now = g.clock.now_ns();
            if let Some(c) = chunk {
                g.chunk_free_at_ns[c.index()] = now;
            }
            if let Some(b) = band {
                g.band_free_at_ns[b.index()] = now;
            }
        }
    }
}
