//! `Engine::check`: a read-only scan of both devices (`sluice check`).
//!
//! It opens nothing and writes nothing: the superblock, the label and their
//! agreement (`Engine::inspect`); the log and every band as crash recovery
//! reads them, with its damage rules (recovery/); every mapped block's data
//! against its CRC (recovery trusts durable segments unread, so this is the
//! only place a block damaged at rest is found before a read meets it); and
//! after a clean shutdown, the checkpoint's CRC and its map against the one
//! the media give. The report is what an operator needs to decide between
//! restoring from elsewhere and `sluice check --salvage`.

use super::recovery::{map_error, scan, Damage};
use super::*;

/// What `Engine::check` found.
#[derive(Clone, Debug, Serialize)]
pub struct CheckReport {
    pub uuid: String,
    /// The last stop was clean (a checkpoint describes the state).
    pub clean: bool,
    pub volumes: Vec<(String, u64)>,
    /// Blocks holding data, every one read and checked.
    pub blocks_checked: u64,
    pub damage: Vec<Damage>,
}

impl CheckReport {
    /// The report as text, one line per finding.
    pub fn text(&self) -> String {
        let mut o = format!(
            "engine {} ({} stop), {} volume(s), {} blocks of data checked: ",
            self.uuid,
            if self.clean { "clean" } else { "unclean" },
            self.volumes.len(),
            self.blocks_checked
        );
        if self.damage.is_empty() {
            o += "no damage found\n";
        } else {
            o += &format!("{} finding(s)\n", self.damage.len());
            for d in &self.damage {
                o += &format!("  {d}\n");
            }
        }
        o
    }
}

/// Runs of blocks read at once when checking data.
const CHECK_RUN_BLOCKS: usize = 256;

impl Engine {
    /// Scan both devices without changing anything (see the module doc).
    pub fn check(cache: Arc<dyn BlockDevice>, capacity: Arc<dyn BlockDevice>) -> Result<CheckReport, EngineError> {
        let sb = Engine::inspect(&*cache, &*capacity)?;
        let (cfg, geo) = on_media_config(&sb, &*capacity)?;
        let (cache, capacity) = (SharedDevice::wrap(cache), SharedDevice::wrap(capacity));
        // Paged maps are rebuilt in a scratch device's memory, never in the
        // cache device's map region: this scan writes nothing.
        let scratch: Arc<dyn BlockDevice> = Arc::new(sluice_media::MemoryDevice::new(sb.cache_bytes, BS));
        let r = scan(&*cache, &*capacity, &scratch, cfg.clone(), geo, sb.clone())?;
        let mut damage = r.damage;
        let media = r.inner;
        if sb.clean {
            // (A paged checkpoint's maps read their pages from the map
            // region, and never write: nothing in them changes.)
            let ck = read_checkpoint(&*capacity, &geo, &sb)
                .and_then(|b| decode_checkpoint(&b, cfg, geo, sb.clone(), new_maps(&sb, &cache)));
            match ck {
                Err(_) => damage.push(Damage::CheckpointUnreadable),
                Ok(ck) => {
                    for (v, cv) in media.vols.iter().zip(&ck.vols) {
                        // An unmapped block's CRC slot means nothing.
                        let entry = |(l, c): (Loc, u32)| (l, if l.is_none() { 0 } else { c });
                        for lba in union(v.l2p.ranges(), cv.l2p.ranges()).into_iter().flatten() {
                            let ours = v.l2p.entry(lba).map_err(map_error)?;
                            // A page of the checkpoint's map that does not read back is the checkpoint's damage.
                            let theirs = cv.l2p.entry(lba).map_err(|_| Damage::CheckpointUnreadable);
                            match theirs {
                                Ok(t) if entry(ours) == entry(t) => {}
                                Ok(_) => damage.push(Damage::Checkpoint { volume: v.name.clone(), lba: lba as u64 }),
                                Err(d) => {
                                    damage.push(d);
                                    break;
                                }
                            }
                        }
                    }
                }
            }
        }
        let mut checked = 0u64;
        for v in &media.vols {
            for range in v.l2p.ranges() {
                let mut lba = range.start;
                let place_of = |lba: usize| v.l2p.get(lba).map(place).map_err(map_error);
                while lba < range.end {
                    let Some((in_cache, first)) = place_of(lba)? else {
                        lba += 1;
                        continue;
                    };
                    let mut n = 1;
                    while lba + n < range.end
                        && n < CHECK_RUN_BLOCKS
                        && place_of(lba + n)? == Some((in_cache, first + n as u64))
                    {
                        n += 1;
                    }
                    let dev = if in_cache { &cache } else { &capacity };
                    let data = read_at(&**dev, first * BS, n * BLOCK_BYTES)?;
                    for i in 0..n {
                        if crc32c(&data[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES])
                            != v.l2p.crc(lba + i).map_err(map_error)?
                        {
                            // Already reported as a damaged log copy?
                            let known = damage.iter().any(
                            |d| matches!(d, Damage::LogBlock { volume, lba: l, .. } if *volume == v.name && *l == (lba + i) as u64),
                        );
                            if !known {
                                damage.push(Damage::Block {
                                    volume: v.name.clone(),
                                    lba: (lba + i) as u64,
                                    device: if in_cache { "cache" } else { "capacity" },
                                    offset: (first + i as u64) * BS,
                                });
                            }
                        }
                    }
                    checked += n as u64;
                    lba += n;
                }
            }
        }
        Ok(CheckReport {
            uuid: crate::persist::uuid_text(&sb.uuid),
            clean: sb.clean,
            volumes: sb.volumes.clone(),
            blocks_checked: checked,
            damage,
        })
    }
}

/// The LBA ranges of two maps that may hold entries, merged.
fn union(a: Vec<std::ops::Range<usize>>, b: Vec<std::ops::Range<usize>>) -> Vec<std::ops::Range<usize>> {
    let mut all: Vec<std::ops::Range<usize>> = a.into_iter().chain(b).collect();
    all.sort_by_key(|r| r.start);
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for r in all {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// Which device and block a location is on (None: unmapped).
fn place(l: Loc) -> Option<(bool, u64)> {
    l.cache_block().map(|b| (true, b)).or_else(|| l.capacity_block().map(|b| (false, b)))
}
