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

use super::l2p::PAGE_ENTRIES;
use super::recovery::{map_error, scan, Damage};
use super::{
    crc32c, decode_checkpoint, new_maps, on_media_config, read_at, read_checkpoint, Arc, BlockDevice, Engine,
    EngineError, Loc, Serialize, SharedDevice, BLOCK_BYTES, BS,
};

/// What `Engine::check` found.
#[derive(Clone, Debug, Serialize)]
pub struct CheckReport {
    pub uuid: String,
    /// The last stop was clean (a checkpoint describes the state).
    pub clean: bool,
    pub volumes: Vec<(String, u64)>,
    /// Blocks holding data, every one read and checked.
    pub blocks_checked: u64,
    /// In place: the homes with a sum (each read and checked) and those
    /// without (home_sums.rs; `sluice scrub` records theirs). None with bands.
    pub homes: Option<super::HomeSumCounts>,
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
        if let Some(h) = &self.homes {
            o += &format!("{} homes verified, {} unverified, ", h.verified, h.unverified);
        }
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
            // (Attached to a disk with its data: on the cache device.)
            let region_dev = if cfg.attached { &cache } else { &capacity };
            let ck = read_checkpoint(&**region_dev, &geo, &sb)
                .and_then(|b| decode_checkpoint(b, cfg, geo, sb.clone(), new_maps(&sb, &cache)));
            match ck {
                Err(_) => damage.push(Damage::CheckpointUnreadable),
                Ok(ck) => {
                    for (v, cv) in media.vols.iter().zip(&ck.vols) {
                        let mut starts: Vec<usize> = v.l2p.windows().map(|w| w.start).collect();
                        if v.l2p.is_paged() {
                            starts.extend(cv.l2p.windows().map(|w| w.start));
                            starts.sort_unstable();
                            starts.dedup();
                        }
                        for start in starts {
                            let w = start..(start + PAGE_ENTRIES).min(v.l2p.len());
                            let ours = v.l2p.mapped(w.clone()).map_err(map_error)?;
                            // A page of the checkpoint's map that does not
                            // read back is the checkpoint's damage.
                            let Ok(theirs) = cv.l2p.mapped(w) else {
                                damage.push(Damage::CheckpointUnreadable);
                                break;
                            };
                            for lba in differing(&ours, &theirs) {
                                damage.push(Damage::Checkpoint { volume: v.name.clone(), lba: lba as u64 });
                            }
                        }
                    }
                }
            }
        }
        let mut checked = 0u64;
        for v in &media.vols {
            for window in v.l2p.windows() {
                let mapped = v.l2p.mapped(window).map_err(map_error)?;
                let mut k = 0;
                while k < mapped.len() {
                    // A run of blocks stored back to back, read at once.
                    let (lba, loc, _) = mapped[k];
                    let (in_cache, first) = place(loc).expect("mapped");
                    let mut n = 1;
                    while k + n < mapped.len()
                        && n < CHECK_RUN_BLOCKS
                        && mapped[k + n].0 == lba + n
                        && place(mapped[k + n].1) == Some((in_cache, first + n as u64))
                    {
                        n += 1;
                    }
                    let dev = if in_cache { &cache } else { &capacity };
                    let data = read_at(&**dev, first * BS, n * BLOCK_BYTES)?;
                    for (i, &(lba, _, crc)) in mapped[k..k + n].iter().enumerate() {
                        if crc32c(&data[i * BLOCK_BYTES..(i + 1) * BLOCK_BYTES]) != crc {
                            // Already reported as a damaged log copy?
                            let known = damage.iter().any(|d| {
                                matches!(d, Damage::LogBlock { volume, lba: l, .. } | Damage::Block { volume, lba: l, .. }
                                    if *volume == v.name && *l == lba as u64)
                            });
                            if !known {
                                damage.push(Damage::Block {
                                    volume: v.name.clone(),
                                    lba: lba as u64,
                                    device: if in_cache { "cache" } else { "capacity" },
                                    offset: (first + i as u64) * BS,
                                });
                            }
                        }
                    }
                    checked += n as u64;
                    k += n;
                }
            }
        }
        let homes = match media.in_place() {
            true => Some(check_homes(&sb, &cache, &capacity, &mut damage)?),
            false => None,
        };
        if let Some(h) = &homes {
            checked += h.verified;
        }
        Ok(CheckReport {
            uuid: crate::persist::uuid_text(&sb.uuid),
            clean: sb.clean,
            volumes: sb.volumes.clone(),
            blocks_checked: checked,
            homes,
            damage,
        })
    }
}

/// In place: every home with a sum read and checked against it (a
/// mismatch is a damaged block on the capacity device), and the homes
/// counted. Reads the table's pages; writes nothing.
fn check_homes(
    sb: &crate::persist::Superblock,
    cache: &Arc<dyn BlockDevice>,
    capacity: &Arc<dyn BlockDevice>,
    damage: &mut Vec<Damage>,
) -> Result<super::HomeSumCounts, EngineError> {
    let mut sums = super::home_sums_of(sb, cache);
    if !sums.enabled() {
        let unverified = super::l2p::region::home_blocks(sb);
        return Ok(super::HomeSumCounts { unverified, ..Default::default() });
    }
    let counts = sums.counts()?;
    let mut first = 0u64;
    for (name, size) in &sb.volumes {
        let blocks = size / BS;
        let mut lba = 0;
        while lba < blocks {
            let n = (blocks - lba).min(CHECK_RUN_BLOCKS as u64);
            let mut want = Vec::with_capacity(n as usize);
            for k in 0..n {
                want.push(sums.sum(first + lba + k)?);
            }
            if want.iter().any(|&w| w != 0) {
                let data = read_at(&**capacity, (first + lba) * BS, n as usize * BLOCK_BYTES)?;
                for (k, &w) in want.iter().enumerate() {
                    if w != 0 && crc32c(&data[k * BLOCK_BYTES..(k + 1) * BLOCK_BYTES]) != w {
                        damage.push(Damage::Block {
                            volume: name.clone(),
                            lba: lba + k as u64,
                            device: "capacity",
                            offset: (first + lba + k as u64) * BS,
                        });
                    }
                }
            }
            lba += n;
        }
        first += blocks;
    }
    Ok(counts)
}

/// The LBAs where two lists of mapped entries (LBA-ordered) differ: mapped
/// in one only, or to another place or CRC.
fn differing(a: &[(usize, Loc, u32)], b: &[(usize, Loc, u32)]) -> Vec<usize> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x.0 == y.0 => {
                if x != y {
                    out.push(x.0);
                }
                (i, j) = (i + 1, j + 1);
            }
            (Some(x), Some(y)) if x.0 < y.0 => {
                out.push(x.0);
                i += 1;
            }
            (Some(x), None) => {
                out.push(x.0);
                i += 1;
            }
            (_, Some(y)) => {
                out.push(y.0);
                j += 1;
            }
            (None, None) => unreachable!("the loop runs while either has entries"),
        }
    }
    out
}

/// Which device and block a location is on (None: unmapped).
fn place(l: Loc) -> Option<(bool, u64)> {
    l.cache_block().map(|b| (true, b)).or_else(|| l.capacity_block().map(|b| (false, b)))
}
