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

use super::recovery::{scan, Damage};
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
        let r = scan(&*cache, &*capacity, cfg.clone(), geo, sb.clone())?;
        let mut damage = r.damage;
        let media = r.inner;
        if sb.clean {
            match read_checkpoint(&*capacity, &geo, &sb).and_then(|b| decode_checkpoint(&b, cfg, geo, sb.clone())) {
                Err(_) => damage.push(Damage::CheckpointUnreadable),
                Ok(ck) => {
                    for (v, cv) in media.vols.iter().zip(&ck.vols) {
                        // An unmapped block's CRC slot means nothing.
                        let entry = |l: Loc, c: u32| (l, if l.is_none() { 0 } else { c });
                        for lba in 0..v.l2p.len() {
                            if entry(v.l2p.get(lba), v.l2p.crc(lba)) != entry(cv.l2p.get(lba), cv.l2p.crc(lba)) {
                                damage.push(Damage::Checkpoint { volume: v.name.clone(), lba: lba as u64 });
                            }
                        }
                    }
                }
            }
        }
        let mut checked = 0u64;
        for v in &media.vols {
            let mut lba = 0usize;
            while lba < v.l2p.len() {
                let Some((in_cache, first)) = place(v.l2p.get(lba)) else {
                    lba += 1;
                    continue;
                };
                let mut n = 1;
                while lba + n < v.l2p.len()
                    && n < CHECK_RUN_BLOCKS
                    && place(v.l2p.get(lba + n)) == Some((in_cache, first + n as u64))
                {
                    n += 1;
                }
                let dev = if in_cache { &cache } else { &capacity };
                let data = read_at(&**dev, first * BS, n * BLOCK_BYTES)?;
                for i in 0..n {
                    if crc32c(&data[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES]) != v.l2p.crc(lba + i) {
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
        Ok(CheckReport {
            uuid: crate::persist::uuid_text(&sb.uuid),
            clean: sb.clean,
            volumes: sb.volumes.clone(),
            blocks_checked: checked,
            damage,
        })
    }
}

/// Which device and block a location is on (None: unmapped).
fn place(l: Loc) -> Option<(bool, u64)> {
    l.cache_block().map(|b| (true, b)).or_else(|| l.capacity_block().map(|b| (false, b)))
}
