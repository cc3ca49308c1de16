//! What the engine counts: bytes by kind (user, cache, capacity, compaction,
//! GC, padding) since open or since the last clean shutdown's checkpoint,
//! each volume's compaction and GC bytes, and the DRAM the maps take.

use super::{Band, Chunk, Engine, Inner, Serialize, BS};

/// The L2P's paging (`Engine::l2p_stats`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct L2pStats {
    pub paged: bool,
    /// DRAM the maps take (entries and CRCs, or a paged map's frames and tables).
    pub dram_bytes: u64,
    pub page_faults: u64,
    pub page_writebacks: u64,
}

/// One volume's data bytes compaction and GC wrote to the capacity device
/// since the engine opened (not persisted). Only rises.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Moves {
    compaction_bytes: u64,
    gc_bytes: u64,
    direct_bytes: u64,
}

impl Moves {
    /// `bytes` of the volume's data written to the capacity device by GC
    /// (`by_gc`) or by compaction.
    pub(super) fn moved(&mut self, bytes: u64, by_gc: bool) {
        let c = if by_gc { &mut self.gc_bytes } else { &mut self.compaction_bytes };
        *c = c.checked_add(bytes).expect("moved bytes overflow");
    }

    /// `bytes` of the volume's writes that went to the capacity device
    /// directly (direct.rs).
    pub(super) fn direct(&mut self, bytes: u64) {
        self.direct_bytes = self.direct_bytes.checked_add(bytes).expect("direct bytes overflow");
    }

    /// (compaction bytes, GC bytes, direct bytes).
    pub(super) fn get(&self) -> (u64, u64, u64) {
        (self.compaction_bytes, self.gc_bytes, self.direct_bytes)
    }
}

/// The engine's counters (`Inner::stats`), private to this module: each
/// path that writes or moves bytes says what it did through one method
/// here, so every counter is changed in one file and only ever rises.
/// Invariants: header bytes never exceed cache bytes; padding never
/// exceeds capacity bytes (asserted by `check`).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Counters(EngineStats);

impl Counters {
    /// The counters as a checkpoint restored them.
    pub(super) fn restored(s: EngineStats) -> Counters {
        let c = Counters(s);
        c.check();
        c
    }

    pub(super) fn get(&self) -> EngineStats {
        self.0
    }

    /// What `check_invariants` asserts of them.
    pub(super) fn check(&self) {
        let s = &self.0;
        assert!(s.cache_header_bytes <= s.cache_write_bytes, "header bytes past cache bytes: {s:?}");
        assert!(s.compaction_pad_bytes <= s.capacity_write_bytes, "padding past capacity bytes: {s:?}");
    }

    pub(super) fn user_wrote(&mut self, bytes: u64) {
        self.0.user_write_bytes += bytes;
    }

    pub(super) fn user_read(&mut self, bytes: u64) {
        self.0.user_read_bytes += bytes;
    }

    pub(super) fn user_trimmed(&mut self, bytes: u64) {
        self.0.user_trim_bytes += bytes;
    }

    /// One log record of `blocks` blocks (its header block included)
    /// written to the cache device.
    pub(super) fn logged(&mut self, blocks: u64) {
        assert!(blocks >= 1, "a record has its header block");
        self.0.cache_write_bytes += blocks * BS;
        self.0.cache_header_bytes += BS;
    }

    /// Bytes written to the capacity device outside a segment (in place:
    /// homes, written past the log or cleaned).
    pub(super) fn capacity_wrote(&mut self, bytes: u64) {
        self.0.capacity_write_bytes += bytes;
    }

    /// A segment of `blocks` blocks (header and padding included), `data`
    /// of them data, written to a band.
    pub(super) fn segment_written(&mut self, blocks: u64, data: u64) {
        assert!(data <= blocks, "a segment of {blocks} blocks holds {data} of data");
        self.0.capacity_write_bytes += blocks * BS;
        self.0.compaction_pad_bytes += (blocks - data) * BS;
    }

    /// User data bytes compaction (in place: cleaning) moved to the
    /// capacity device.
    pub(super) fn compacted(&mut self, bytes: u64) {
        self.0.compaction_bytes += bytes;
    }

    /// User data bytes GC relocated.
    pub(super) fn collected(&mut self, bytes: u64) {
        self.0.gc_bytes += bytes;
    }

    pub(super) fn chunk_compacted(&mut self) {
        self.0.chunks_compacted += 1;
    }

    pub(super) fn band_reclaimed(&mut self) {
        self.0.bands_reclaimed += 1;
    }
}

/// Counters of the engine (bytes unless named otherwise).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct EngineStats {
    pub user_write_bytes: u64,
    pub user_read_bytes: u64,
    pub user_trim_bytes: u64,
    pub cache_write_bytes: u64,
    pub cache_header_bytes: u64,
    pub capacity_write_bytes: u64,
    pub compaction_bytes: u64,
    pub compaction_pad_bytes: u64,
    pub gc_bytes: u64,
    pub chunks_compacted: u64,
    pub bands_reclaimed: u64,
}

impl EngineStats {
    pub(super) fn words(&self) -> [u64; 11] {
        [
            self.user_write_bytes,
            self.user_read_bytes,
            self.user_trim_bytes,
            self.cache_write_bytes,
            self.cache_header_bytes,
            self.capacity_write_bytes,
            self.compaction_bytes,
            self.compaction_pad_bytes,
            self.gc_bytes,
            self.chunks_compacted,
            self.bands_reclaimed,
        ]
    }

    pub(super) fn from_words(w: [u64; 11]) -> EngineStats {
        EngineStats {
            user_write_bytes: w[0],
            user_read_bytes: w[1],
            user_trim_bytes: w[2],
            cache_write_bytes: w[3],
            cache_header_bytes: w[4],
            capacity_write_bytes: w[5],
            compaction_bytes: w[6],
            compaction_pad_bytes: w[7],
            gc_bytes: w[8],
            chunks_compacted: w[9],
            bands_reclaimed: w[10],
        }
    }

    /// Bytes written to both devices / bytes the users wrote.
    pub fn host_waf(&self) -> f64 {
        if self.user_write_bytes == 0 {
            0.0
        } else {
            (self.cache_write_bytes + self.capacity_write_bytes) as f64 / self.user_write_bytes as f64
        }
    }
}

impl Engine {
    pub fn stats(&self) -> EngineStats {
        let mut inner = self.lock();
        self.fold_read_bytes(&mut inner);
        inner.stats.get()
    }

    /// Add the bytes lock-free reads counted to the engine's counters.
    pub(super) fn fold_read_bytes(&self, inner: &mut Inner) {
        inner.stats.user_read(self.read_bytes.take());
    }

    /// DRAM the maps take per 4 KiB block of volume capacity: the L2P, the
    /// chunk P2L of the cache tier and per-chunk and per-band state, over
    /// the volumes' blocks.
    pub fn dram_bytes_per_block(&self) -> f64 {
        let inner = self.lock();
        let blocks: usize = inner.vols.iter().map(|v| v.l2p.len()).sum();
        let l2p: usize = inner.vols.iter().map(|v| v.l2p.bytes()).sum();
        let chunks: usize = inner.log.chunks().map(|(_, c)| std::mem::size_of::<Chunk>() + c.p2l().len() * 16).sum();
        let bands = inner.bands.len() * std::mem::size_of::<Band>();
        (l2p + chunks + bands) as f64 / blocks.max(1) as f64
    }

    /// The L2P's paging: whether the maps are paged, the DRAM they take, and
    /// pages faulted in and written back since the engine opened.
    pub fn l2p_stats(&self) -> L2pStats {
        let inner = self.lock();
        let mut s = L2pStats::default();
        for v in &inner.vols {
            let (faults, writebacks) = v.l2p.page_traffic();
            s.paged |= v.l2p.is_paged();
            s.dram_bytes += v.l2p.bytes() as u64;
            s.page_faults += faults;
            s.page_writebacks += writebacks;
        }
        s
    }
}

/// A counter many threads add to at once without sharing a cache line:
/// one shard per thread number, emptied into a plain counter under the
/// engine lock (`take`).
#[derive(Default)]
pub(super) struct ShardedCounter([CounterShard; 4]);

#[repr(align(128))]
#[derive(Default)]
struct CounterShard(std::sync::atomic::AtomicU64);

impl ShardedCounter {
    pub(super) fn add(&self, n: u64) {
        let shard = &self.0[sluice_media::device::thread_no() as usize % self.0.len()];
        shard.0.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Everything added since the last `take`.
    pub(super) fn take(&self) -> u64 {
        self.0.iter().map(|s| s.0.swap(0, std::sync::atomic::Ordering::Relaxed)).sum()
    }
}
