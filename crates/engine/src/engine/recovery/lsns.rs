//! Step 3 of recovery for the log: every LSN from the head (the oldest
//! record still needed) up to the watermark (the newest a flush made
//! durable) must be found. Below the watermark a missing record is damage,
//! above it a torn write; either way the range is logged as a gap record
//! afterwards, so later recoveries accept it.

use super::chunks::{ChunkScan, LsnRun};
use super::damage::Damage;

/// What the log's numbering says.
pub(super) struct LsnCheck {
    /// The highest LSN a flush made durable (the watermark).
    pub(super) flushed: u64,
    /// The highest LSN found.
    pub(super) lsn_max: u64,
    /// LSN ranges earlier recoveries accepted as missing (gap records).
    pub(super) accepted: Vec<(u64, u64)>,
    /// LSN ranges this recovery accepts as missing.
    pub(super) new_gaps: Vec<(u64, u64)>,
}

/// Check the records `scans` found against the numbering from `head`;
/// missing durable ones go into `damage`. `claimed`: the watermark the
/// cache device's slots claim (watermark.rs), a header's in all but place.
pub(super) fn check_lsns(scans: &[ChunkScan], head: u64, claimed: u64, damage: &mut Vec<Damage>) -> LsnCheck {
    let flushed = scans.iter().map(|cs| cs.flushed_lsn).max().unwrap_or(0).max(claimed);
    let mut runs: Vec<&LsnRun> = scans.iter().flat_map(|cs| cs.runs.iter()).collect();
    runs.sort_unstable_by_key(|r| (r.first, r.chunk));
    let lsn_max = runs.iter().map(|r| r.first + r.count - 1).max().unwrap_or(0);
    // Missing ranges [from, to] from the head to the newest record found
    // (or the watermark), less what earlier recoveries accepted as torn:
    // at or below the watermark they are damage, above it torn writes, which
    // are recorded (`new_gaps`) so that later recoveries accept them too.
    let mut accepted: Vec<(u64, u64)> = scans.iter().flat_map(|cs| cs.gaps.iter().copied()).collect();
    accepted.sort_unstable();
    let mut missing: Vec<(u64, u64, u32, u64)> = Vec::new();
    let mut expect = head.max(1);
    for run in runs.iter().filter(|r| r.first + r.count > head) {
        // (A run reaching below the head starts, for this purpose, at it;
        // `expect` is then the head, so nothing before it is missing.)
        let start = run.first.max(head);
        if expect < start {
            missing.push((expect, start - 1, run.chunk, run.first_pos));
        }
        expect = expect.max(run.first + run.count);
    }
    let newest = runs.iter().max_by_key(|r| r.first + r.count);
    let (last_chunk, last_pos) = newest.map_or((0, 0), |r| (r.chunk, r.last_pos));
    if expect <= flushed.max(lsn_max) {
        missing.push((expect, flushed.max(lsn_max), last_chunk, last_pos));
    }
    let mut new_gaps = Vec::new();
    for (from, to, chunk, pos) in missing {
        let mut at = from;
        while at <= to {
            // Skip what a gap record already accepted.
            if let Some(&(_, end)) = accepted.iter().find(|&&(a, b)| a <= at && at <= b) {
                at = end + 1;
                continue;
            }
            let next_accepted = accepted.iter().map(|&(a, _)| a).filter(|&a| a > at).min().unwrap_or(u64::MAX);
            let end = to.min(next_accepted - 1);
            if at <= flushed {
                let to_lsn = end.min(flushed);
                damage.push(Damage::LogRecords { from_lsn: at, to_lsn, chunk, near_block: pos });
                new_gaps.push((at, to_lsn));
                at = to_lsn + 1;
            } else {
                new_gaps.push((at, end));
                at = end + 1;
            }
        }
    }
    LsnCheck { flushed, lsn_max, accepted, new_gaps }
}
