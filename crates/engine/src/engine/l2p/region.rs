//! Which maps an engine has and where they live: the entry width the two
//! devices' sizes allow, and, when the maps are paged, the map region at the
//! end of the cache device (docs/format.md) and the log chunks it leaves.

use super::{L2p, PageStore, Width};
use crate::engine::BS;
use crate::persist::Superblock;
use sluice_media::BlockDevice;
use std::sync::Arc;

/// The L2P entry width for the devices a superblock records.
pub(in crate::engine) fn l2p_width(sb: &Superblock) -> Width {
    Width::for_devices(sb.cache_bytes / BS, sb.capacity_bytes / BS)
}

/// Where the paged maps live: the map region's first byte on the cache
/// device (its end, if no map is paged) and each volume's pages' offset in
/// it. The region is whole chunks at the end of the cache device.
pub(in crate::engine) fn map_region(sb: &Superblock) -> (u64, Vec<u64>) {
    if sb.l2p_dram_bytes == 0 {
        return (sb.cache_bytes, Vec::new());
    }
    let width = l2p_width(sb);
    let mut offsets = Vec::with_capacity(sb.volumes.len());
    let mut at = 0;
    for (_, size) in &sb.volumes {
        offsets.push(at);
        at += L2p::region_bytes(size / BS, width);
    }
    (sb.cache_bytes.saturating_sub(at.div_ceil(sb.chunk_bytes) * sb.chunk_bytes), offsets)
}

/// Homes the volumes have (in place): one per volume block.
pub(in crate::engine) fn home_blocks(sb: &Superblock) -> u64 {
    sb.volumes.iter().map(|(_, s)| s / BS).sum()
}

/// The home-sum table's region (version 9, in place): its first byte and
/// its length in whole chunks, right before the map region; (map region's
/// start, 0) without one.
pub(in crate::engine) fn home_sums_region(sb: &Superblock) -> (u64, u64) {
    let maps = map_region(sb).0;
    if !sb.home_sums {
        return (maps, 0);
    }
    let bytes =
        crate::engine::home_sums::HomeSums::region_bytes(home_blocks(sb)).div_ceil(sb.chunk_bytes) * sb.chunk_bytes;
    (maps.saturating_sub(bytes), bytes)
}

/// Log chunks on the cache device: what the map region and the home-sum
/// table leave.
pub(in crate::engine) fn chunk_count(sb: &Superblock) -> u64 {
    if sb.layout == crate::persist::LAYOUT_ATTACHED {
        // Attached: the checkpoint region's whole chunks come first.
        return sb.checkpoint_offset / sb.chunk_bytes;
    }
    home_sums_region(sb).0 / sb.chunk_bytes
}

/// The home-sum table the superblock describes, on `dev` (the cache
/// device), with its share of the L2P's DRAM budget when the maps are
/// paged (an eighth, at least 16 pages), all of it in DRAM otherwise.
pub(in crate::engine) fn home_sums_of(
    sb: &Superblock,
    dev: &Arc<dyn BlockDevice>,
) -> crate::engine::home_sums::HomeSums {
    use crate::engine::home_sums::HomeSums;
    if !sb.home_sums {
        return HomeSums::none();
    }
    let blocks = home_blocks(sb);
    let frames = match sb.l2p_dram_bytes {
        0 => usize::MAX,
        b => ((b / 8 / BS) as usize).max(16),
    };
    HomeSums::on(dev.clone(), home_sums_region(sb).0, blocks, sb.engine_tag(), frames)
}

/// Every volume's map, empty: in DRAM, or paged through `dev` (the cache
/// device, or a scratch device for a read-only scan) with the superblock's
/// budget shared in proportion to the volumes' sizes.
pub(in crate::engine) fn new_maps(sb: &Superblock, dev: &Arc<dyn BlockDevice>) -> Vec<L2p> {
    let width = l2p_width(sb);
    let (base, offsets) = map_region(sb);
    let total: u64 = sb.volumes.iter().map(|(_, s)| s / BS).sum::<u64>().max(1);
    let page = L2p::page_bytes(width) as u64;
    sb.volumes
        .iter()
        .enumerate()
        .map(|(i, (_, size))| {
            let blocks = size / BS;
            if sb.l2p_dram_bytes == 0 {
                return L2p::new(blocks as usize, width);
            }
            // (An eighth of the budget is the home-sum table's when it has one.)
            let budget = if sb.home_sums { sb.l2p_dram_bytes - sb.l2p_dram_bytes / 8 } else { sb.l2p_dram_bytes };
            let share = (budget as u128 * blocks as u128 / total as u128) as u64;
            let store = PageStore { dev: dev.clone(), base: base + offsets[i], frames: (share / page) as usize };
            L2p::paged(blocks as usize, width, store)
        })
        .collect()
}
