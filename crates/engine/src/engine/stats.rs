//! What the engine counts: bytes by kind (user, cache, capacity, compaction,
//! GC, padding) since open or since the last clean shutdown's checkpoint,
//! each volume's compaction and GC bytes, and the DRAM the maps take.

use super::{Band, Chunk, Engine, Inner, Serialize};

/// The L2P's paging (`Engine::l2p_stats`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct L2pStats {
    pub paged: bool,
    /// DRAM the maps take (entries and CRCs, or a paged map's frames and tables).
    pub dram_bytes: u64,
    pub page_faults: u64,
    pub page_writebacks: u64,
}

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Moves {
    pub(super) compaction_bytes: u64,
    pub(super) gc_bytes: u64,
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
        inner.stats
    }

    /// Add the bytes lock-free reads counted to the engine's counters.
    pub(super) fn fold_read_bytes(&self, inner: &mut Inner) {
        inner.stats.user_read_bytes += self.read_bytes.take();
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
