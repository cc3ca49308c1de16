//! The one operation generator both simulations draw from, and the data
//! they write: every block version is a pattern of (volume, LBA, version),
//! so a block read back names the write it came from.

use crate::testkit::pattern;
use sluice_media::rng::SplitMix64 as Rng;

const BS: usize = 4096;

/// One operation on the engine, drawn from the seed (`Op::draw`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Fresh versions of blocks `lba..lba + len` for each `(lba, len)`, in
    /// order (a later one wins where they overlap). More than one: submitted
    /// together (`Volume::write_batch`, one group commit). `owned`: handed
    /// over in the volume's own buffer (`write_owned`), as the NBD server
    /// does.
    Write {
        vol: usize,
        writes: Vec<(u64, u64)>,
        fua: bool,
        owned: bool,
    },
    Read {
        vol: usize,
        lba: u64,
        len: u64,
    },
    Trim {
        vol: usize,
        lba: u64,
        len: u64,
    },
    Zero {
        vol: usize,
        lba: u64,
        len: u64,
        fua: bool,
    },
    Flush {
        vol: usize,
    },
    /// A bounded GC step walking at most `blocks` of a victim
    /// (`Engine::collect_some`), as the background compactor takes them.
    Gc {
        blocks: u64,
    },
    /// A bounded compaction step; `leave_remaps`: its segment writes are
    /// left in flight with their remaps (`compact_some_leaving_remaps`).
    Compact {
        blocks: u64,
        leave_remaps: bool,
    },
}

impl Op {
    /// The next operation on volumes of `sizes` blocks: 55 % writes (a
    /// sixth of them batches of 2–7 short writes, half of the rest in the
    /// volume's own buffer, one in eight FUA), 18 % reads, 7 % GC and
    /// compaction steps, 8 % trims, 7 % write-zeroes, 5 % flushes; extents
    /// of 1–40 blocks.
    pub fn draw(rng: &mut Rng, sizes: &[u64]) -> Op {
        let vol = rng.below(sizes.len() as u64) as usize;
        let blocks = sizes[vol];
        let len = 1 + rng.below(40.min(blocks));
        let lba = rng.below(blocks - len + 1);
        let kind = rng.below(100);
        let fua = rng.below(8) == 0;
        match kind {
            0..=14 => {
                let n = 2 + rng.below(6);
                let writes = (0..n)
                    .map(|_| {
                        let len = 1 + rng.below(4.min(blocks));
                        (rng.below(blocks - len + 1), len)
                    })
                    .collect();
                Op::Write { vol, writes, fua: false, owned: false }
            }
            15..=54 => Op::Write { vol, writes: vec![(lba, len)], fua, owned: kind >= 35 },
            55..=72 => Op::Read { vol, lba, len },
            73..=75 => Op::Gc { blocks: len },
            76..=77 => Op::Compact { blocks: len, leave_remaps: false },
            78..=79 => Op::Compact { blocks: len, leave_remaps: true },
            80..=87 => Op::Trim { vol, lba, len },
            88..=94 => Op::Zero { vol, lba, len, fua },
            _ => Op::Flush { vol },
        }
    }
}

/// What block `lba` of volume `vol` holds at `version` (0: zeros, never
/// written, trimmed or zeroed).
pub fn expect(vol: usize, lba: u64, version: u64) -> Vec<u8> {
    if version == 0 {
        vec![0u8; BS]
    } else {
        pattern(vol, lba, version)
    }
}

/// Fresh versions of `len` blocks of volume `v` from `lba` (numbered from
/// `version` on): their data and numbers.
pub fn new_versions(version: &mut u64, v: usize, lba: u64, len: u64) -> (Vec<u8>, Vec<u64>) {
    let mut data = Vec::with_capacity(len as usize * BS);
    let mut versions = Vec::with_capacity(len as usize);
    for i in 0..len {
        *version += 1;
        data.extend_from_slice(&pattern(v, lba + i, *version));
        versions.push(*version);
    }
    (data, versions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_operation_is_drawn_and_stays_inside_its_volume() {
        let mut rng = Rng(1);
        let sizes = [8u64, 200];
        let mut seen = [0usize; 7];
        for _ in 0..20_000 {
            let op = Op::draw(&mut rng, &sizes);
            let (i, extents) = match &op {
                Op::Write { vol, writes, .. } => (0, writes.iter().map(|&(l, n)| (*vol, l, n)).collect()),
                Op::Read { vol, lba, len } => (1, vec![(*vol, *lba, *len)]),
                Op::Trim { vol, lba, len } => (2, vec![(*vol, *lba, *len)]),
                Op::Zero { vol, lba, len, .. } => (3, vec![(*vol, *lba, *len)]),
                Op::Flush { .. } => (4, Vec::new()),
                Op::Gc { .. } => (5, Vec::new()),
                Op::Compact { .. } => (6, Vec::new()),
            };
            seen[i] += 1;
            for (v, lba, len) in extents {
                assert!(len >= 1 && lba + len <= sizes[v], "{op:?}");
            }
        }
        assert!(seen.iter().all(|&n| n > 200), "{seen:?}");
    }
}
