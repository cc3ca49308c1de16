//! What recovery (and `sluice check`) reports as damage: something a
//! completed flush made durable that is not on the media as written, as
//! opposed to a torn write, which a crash may leave and recovery accepts.

use serde::Serialize;

/// Damage recovery found: something a completed flush made durable is not
/// on the media as written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Damage {
    /// Durable log records `from_lsn..=to_lsn` are missing or their headers
    /// do not check (their LBAs are unknown: whatever they held would revert
    /// to older copies).
    LogRecords { from_lsn: u64, to_lsn: u64, chunk: u32, near_block: u64 },
    /// A data block of a durable log record does not match its CRC, and it
    /// is the block's newest copy.
    LogBlock { volume: String, lba: u64, chunk: u32, block: u64 },
    /// Segments a band must hold are missing or do not check, in blocks
    /// [from, to) of the band.
    Segments { band: u32, from: u64, to: u64 },
    /// A capacity mark slot carries the mark's magic but does not check.
    Mark,
    /// A mapped block's data does not match its CRC (`sluice check` reads
    /// them all; recovery trusts durable segments' data).
    Block { volume: String, lba: u64, device: &'static str, offset: u64 },
    /// The clean-shutdown checkpoint maps a block elsewhere than the media do.
    Checkpoint { volume: String, lba: u64 },
    /// The clean-shutdown checkpoint does not check (or does not decode).
    CheckpointUnreadable,
}

impl Damage {
    /// The bands `damage` finds damaged, each once, ascending.
    pub(crate) fn bands(damage: &[Damage]) -> Vec<u32> {
        let mut bands: Vec<u32> = damage
            .iter()
            .filter_map(|d| if let Damage::Segments { band, .. } = d { Some(*band) } else { None })
            .collect();
        bands.sort_unstable();
        bands.dedup();
        bands
    }
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Damage::LogRecords { from_lsn, to_lsn, chunk, near_block } => write!(
                f,
                "log records {from_lsn}..={to_lsn} (chunk {chunk}, near block {near_block}) are missing or their \
                 headers are damaged; the blocks they held are unknown"
            ),
            Damage::LogBlock { volume, lba, chunk, block } => {
                write!(f, "volume {volume:?} LBA {lba}: its newest copy (log chunk {chunk}, block {block}) is damaged")
            }
            Damage::Segments { band, from, to } => {
                write!(f, "band {band}: segments in blocks {from}..{to} are missing or damaged")
            }
            Damage::Mark => write!(f, "a capacity mark (cache device block 2 or 3) is damaged"),
            Damage::Block { volume, lba, device, offset } => {
                write!(f, "volume {volume:?} LBA {lba}: data damaged ({device} device, byte {offset})")
            }
            Damage::Checkpoint { volume, lba } => {
                write!(f, "volume {volume:?} LBA {lba}: the checkpoint and the media disagree")
            }
            Damage::CheckpointUnreadable => write!(f, "the clean-shutdown checkpoint is damaged"),
        }
    }
}
