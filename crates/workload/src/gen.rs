//! I/O stream generation for one job instance.
//!
//! Owns: [`IoGen`] (the I/O sequence of one fio job instance: [`Op`], absolute byte offset, length),
//! its plain-data configuration [`GenParams`], the `rw=` kinds [`RwKind`], and the preconditioning
//! stream [`PreconditionGen`] for our `precondition=` extension ([`Precondition`]).
//!
//! Invariants:
//! - Every I/O lies inside the region: `region_offset <= offset` and
//!   `offset + len <= region_offset + region_size`; `len` is the block size of its direction.
//! - Random I/O targets `block × min_bs` where `block` comes from the [`Sampler`] over
//!   `n = ⌈region_size / min_bs⌉` ranges (fio's `nranges`). If a larger block size would overrun the
//!   region end, the offset is clamped down to the last `min_bs`-aligned start that fits (fio instead
//!   aligns to each direction's own block size; the two agree when read and write sizes are equal).
//! - Sequential I/O keeps one cursor per direction, as fio does (`last_pos[ddir]`), and when a
//!   direction reaches the region end, all cursors restart at the region start (fio resets the whole
//!   file; observed with fio 3.33 `rw=rw`).
//! - Reads and writes of `randrw` share one sampler (fio keeps one random map / zipf state per file).
//! - The read/write choice for mixed kinds is an independent Bernoulli(`rwmixread`%) draw per I/O from
//!   its own RNG stream, so changing the mix never changes the offset sequence. (fio switches direction
//!   in short runs; the long-run ratio is the same.)
//! - The stream ends (`None`) once `io_limit` bytes were issued; with `io_limit = None` (fio
//!   `time_based`) it never ends and the caller applies the runtime on its virtual clock. The last I/O
//!   is not truncated, so the total can exceed a limit that is not a multiple of the block size.
//! - Everything is a pure function of [`GenParams`] (including `seed`): same params, same stream.
//!
//! Why: the simulator replays fio job files on virtual time; keeping generation separate from timing
//! and free of global state lets every consumer (benches, tests, the device model) drive it freely.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::dist::{DistError, Distribution, Sampler};
use crate::rng::{mix_seed, Rng};

/// Direction of an I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Op {
    Read,
    Write,
}

impl Op {
    fn idx(self) -> usize {
        match self {
            Op::Read => 0,
            Op::Write => 1,
        }
    }
}

/// One generated I/O: absolute byte offset in the device and length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Io {
    pub op: Op,
    pub offset: u64,
    pub len: u64,
}

/// fio's `rw=` / `readwrite=` values that we support.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum RwKind {
    /// `read`: sequential reads (fio's default).
    #[default]
    Read,
    /// `write`: sequential writes.
    Write,
    /// `randread`.
    RandRead,
    /// `randwrite`.
    RandWrite,
    /// `randrw`: random mixed, ratio from `rwmixread`.
    RandRw,
    /// `rw` / `readwrite`: sequential mixed, ratio from `rwmixread`.
    ReadWrite,
}

impl RwKind {
    /// Offsets come from the distribution rather than a cursor.
    pub fn is_random(self) -> bool {
        matches!(self, RwKind::RandRead | RwKind::RandWrite | RwKind::RandRw)
    }

    /// Both reads and writes are issued.
    pub fn is_mixed(self) -> bool {
        matches!(self, RwKind::RandRw | RwKind::ReadWrite)
    }
}

/// Error parsing an `rw=` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RwParseError {
    /// Not a fio `rw=` value (fio's names are case-sensitive).
    #[error("unknown rw kind {0:?} (supported: read, write, randread, randwrite, randrw, rw, readwrite)")]
    Unknown(String),
    /// Valid in fio but not supported here (trim kinds, `:N` offset modifiers).
    #[error("rw kind {0:?} is valid in fio but not supported here")]
    Unsupported(String),
}

impl FromStr for RwKind {
    type Err = RwParseError;

    fn from_str(s: &str) -> Result<Self, RwParseError> {
        let s = s.trim();
        Ok(match s {
            "read" => RwKind::Read,
            "write" => RwKind::Write,
            "randread" => RwKind::RandRead,
            "randwrite" => RwKind::RandWrite,
            "randrw" => RwKind::RandRw,
            "rw" | "readwrite" => RwKind::ReadWrite,
            "trim" | "randtrim" | "trimwrite" | "randtrimwrite" => return Err(RwParseError::Unsupported(s.into())),
            _ if s.contains(':') => return Err(RwParseError::Unsupported(s.into())),
            _ => return Err(RwParseError::Unknown(s.into())),
        })
    }
}

impl fmt::Display for RwKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RwKind::Read => "read",
            RwKind::Write => "write",
            RwKind::RandRead => "randread",
            RwKind::RandWrite => "randwrite",
            RwKind::RandRw => "randrw",
            RwKind::ReadWrite => "rw",
        })
    }
}

/// Our `precondition=` job-file extension: writes issued before the measured job, to bring a device
/// model into steady state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Precondition {
    /// `none` (default): no preconditioning.
    #[default]
    None,
    /// `seq`: one sequential write pass over the instance's region (write block size).
    Seq,
    /// `seq+rand`: the sequential pass, then random writes with the job's own distribution and
    /// `norandommap` setting totalling 2× the region size (a fresh random order for each pass).
    SeqRand,
}

/// Error parsing a `precondition=` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown precondition {0:?} (supported: none, seq, seq+rand)")]
pub struct PreconditionParseError(pub String);

impl FromStr for Precondition {
    type Err = PreconditionParseError;

    fn from_str(s: &str) -> Result<Self, PreconditionParseError> {
        match s.trim() {
            "none" => Ok(Precondition::None),
            "seq" => Ok(Precondition::Seq),
            "seq+rand" => Ok(Precondition::SeqRand),
            other => Err(PreconditionParseError(other.into())),
        }
    }
}

/// Errors building a generator.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GenError {
    #[error("block size must be at least 1 byte")]
    ZeroBlockSize,
    #[error("job region is empty")]
    EmptyRegion,
    #[error("block size {bs} larger than the job region ({region} bytes)")]
    BlockLargerThanRegion { bs: u64, region: u64 },
    #[error("region offset {offset} + size {size} overflows 64 bits")]
    RegionOverflow { offset: u64, size: u64 },
    #[error("rwmixread {0} out of range (0..=100)")]
    RwMixOutOfRange(u8),
    #[error("job instance {index} does not exist (job has {count})")]
    NoSuchInstance { index: usize, count: usize },
    #[error(transparent)]
    Dist(#[from] DistError),
}

/// Everything that determines an I/O stream. Usually produced by
/// [`ResolvedJob::params`](crate::job::ResolvedJob::params), but usable directly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenParams {
    pub rw: RwKind,
    pub bs_read: u64,
    pub bs_write: u64,
    pub distribution: Distribution,
    pub norandommap: bool,
    /// New random-map order on every pass (fio with `time_based`) or the same order each pass
    /// (fio when `io_size` exceeds the region).
    pub reshuffle_each_pass: bool,
    /// Percentage of reads for mixed kinds (0..=100).
    pub rwmixread: u8,
    /// Absolute start of the region in the device, bytes.
    pub region_offset: u64,
    /// Region length, bytes.
    pub region_size: u64,
    /// Stop after this many bytes; `None` = endless (time-based).
    pub io_limit: Option<u64>,
    pub seed: u64,
}

impl GenParams {
    /// Smallest block size (fio's `min_bs`), the unit of the random ranges.
    pub fn min_bs(&self) -> u64 {
        self.bs_read.min(self.bs_write)
    }

    /// Block size of the directions this kind actually issues; the largest must fit in the region.
    fn used_max_bs(&self) -> u64 {
        match self.rw {
            RwKind::Read | RwKind::RandRead => self.bs_read,
            RwKind::Write | RwKind::RandWrite => self.bs_write,
            RwKind::RandRw | RwKind::ReadWrite => self.bs_read.max(self.bs_write),
        }
    }

    pub(crate) fn validate(&self) -> Result<(), GenError> {
        if self.bs_read == 0 || self.bs_write == 0 {
            return Err(GenError::ZeroBlockSize);
        }
        if self.region_size == 0 {
            return Err(GenError::EmptyRegion);
        }
        if self.region_offset.checked_add(self.region_size).is_none() {
            return Err(GenError::RegionOverflow { offset: self.region_offset, size: self.region_size });
        }
        if self.used_max_bs() > self.region_size {
            return Err(GenError::BlockLargerThanRegion { bs: self.used_max_bs(), region: self.region_size });
        }
        if self.rwmixread > 100 {
            return Err(GenError::RwMixOutOfRange(self.rwmixread));
        }
        Ok(())
    }
}

/// Purposes of the RNG streams derived from [`GenParams::seed`].
const STREAM_OFFSETS: u64 = 1;
const STREAM_MIX: u64 = 2;
const STREAM_SAMPLER_INIT: u64 = 3;
const STREAM_PRECONDITION: u64 = 4;

/// The I/O stream of one job instance; see the module docs for its guarantees.
#[derive(Debug, Clone)]
pub struct IoGen {
    p: GenParams,
    min_bs: u64,
    bs: [u64; 2],
    /// Last valid `min_bs`-aligned relative start for an I/O of each direction.
    last_start: [u64; 2],
    sampler: Option<Sampler>,
    off_rng: Rng,
    mix_rng: Rng,
    cursor: [u64; 2],
    issued_bytes: u64,
    issued_ios: u64,
}

impl IoGen {
    /// Validates `params` and builds the generator.
    pub fn new(params: GenParams) -> Result<Self, GenError> {
        params.validate()?;
        let min_bs = params.min_bs();
        let size = params.region_size;
        let bs = [params.bs_read, params.bs_write];
        let last_start = bs.map(|b| if b <= size { (size - b) / min_bs * min_bs } else { 0 });
        let sampler = if params.rw.is_random() {
            let n = size.div_ceil(min_bs);
            let mut init = Rng::new(mix_seed(&[params.seed, STREAM_SAMPLER_INIT]));
            Some(Sampler::new(&params.distribution, n, params.norandommap, params.reshuffle_each_pass, &mut init)?)
        } else {
            None
        };
        Ok(IoGen {
            off_rng: Rng::new(mix_seed(&[params.seed, STREAM_OFFSETS])),
            mix_rng: Rng::new(mix_seed(&[params.seed, STREAM_MIX])),
            p: params,
            min_bs,
            bs,
            last_start,
            sampler,
            cursor: [0; 2],
            issued_bytes: 0,
            issued_ios: 0,
        })
    }

    /// The parameters this generator was built from.
    pub fn params(&self) -> &GenParams {
        &self.p
    }

    /// Bytes issued so far.
    pub fn issued_bytes(&self) -> u64 {
        self.issued_bytes
    }

    /// I/Os issued so far.
    pub fn issued_ios(&self) -> u64 {
        self.issued_ios
    }

    fn pick_op(&mut self) -> Op {
        match self.p.rw {
            RwKind::Read | RwKind::RandRead => Op::Read,
            RwKind::Write | RwKind::RandWrite => Op::Write,
            RwKind::RandRw | RwKind::ReadWrite => {
                if self.mix_rng.below(100) < u64::from(self.p.rwmixread) {
                    Op::Read
                } else {
                    Op::Write
                }
            }
        }
    }
}

impl Iterator for IoGen {
    type Item = Io;

    fn next(&mut self) -> Option<Io> {
        if let Some(limit) = self.p.io_limit {
            if self.issued_bytes >= limit {
                return None;
            }
        }
        let op = self.pick_op();
        let d = op.idx();
        let len = self.bs[d];
        let rel = match self.sampler.as_mut() {
            Some(sampler) => {
                let block = sampler.next_block(&mut self.off_rng);
                // Align to this direction's own block size, as fio does, so a
                // 64 KiB read in a bs=64k,4k job stays 64 KiB aligned.
                (block.saturating_mul(self.min_bs) / len * len).min(self.last_start[d] / len * len)
            }
            None => {
                let at = self.cursor[d];
                self.cursor[d] = at + len;
                if self.cursor[d] + len > self.p.region_size {
                    self.cursor = [0; 2];
                }
                at
            }
        };
        self.issued_bytes = self.issued_bytes.saturating_add(len);
        self.issued_ios += 1;
        Some(Io { op, offset: self.p.region_offset + rel, len })
    }
}

/// Preconditioning writes for one region (see [`Precondition`]).
#[derive(Debug, Clone)]
pub struct PreconditionGen {
    region_offset: u64,
    region_size: u64,
    bs: u64,
    fill_pos: u64,
    random: Option<IoGen>,
}

impl PreconditionGen {
    /// The preconditioning stream for the job described by `params`, or `None` for
    /// [`Precondition::None`]. Writes use `params.bs_write`; the sequential pass covers the region
    /// exactly (its last write is shortened if the region is not a multiple of the block size).
    pub fn new(params: &GenParams, mode: Precondition) -> Result<Option<Self>, GenError> {
        if mode == Precondition::None {
            return Ok(None);
        }
        let fill = GenParams { rw: RwKind::Write, ..params.clone() };
        fill.validate()?;
        let random = if mode == Precondition::SeqRand {
            Some(IoGen::new(GenParams {
                rw: RwKind::RandWrite,
                reshuffle_each_pass: true,
                io_limit: Some(params.region_size.saturating_mul(2)),
                seed: mix_seed(&[params.seed, STREAM_PRECONDITION]),
                ..params.clone()
            })?)
        } else {
            None
        };
        Ok(Some(PreconditionGen {
            region_offset: params.region_offset,
            region_size: params.region_size,
            bs: params.bs_write,
            fill_pos: 0,
            random,
        }))
    }
}

impl Iterator for PreconditionGen {
    type Item = Io;

    fn next(&mut self) -> Option<Io> {
        if self.fill_pos < self.region_size {
            let len = self.bs.min(self.region_size - self.fill_pos);
            let io = Io { op: Op::Write, offset: self.region_offset + self.fill_pos, len };
            self.fill_pos += len;
            return Some(io);
        }
        self.random.as_mut()?.next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(rw: RwKind) -> GenParams {
        GenParams {
            rw,
            bs_read: 4096,
            bs_write: 4096,
            distribution: Distribution::Random,
            norandommap: false,
            reshuffle_each_pass: false,
            rwmixread: 50,
            region_offset: 1 << 20,
            region_size: 64 * 4096,
            io_limit: Some(64 * 4096),
            seed: 0x89,
        }
    }

    #[test]
    fn rw_kind_parsing() {
        assert_eq!("randrw".parse::<RwKind>(), Ok(RwKind::RandRw));
        assert_eq!("readwrite".parse::<RwKind>(), Ok(RwKind::ReadWrite));
        assert_eq!("rw".parse::<RwKind>(), Ok(RwKind::ReadWrite));
        assert!(matches!("trim".parse::<RwKind>(), Err(RwParseError::Unsupported(_))));
        assert!(matches!("randread:8".parse::<RwKind>(), Err(RwParseError::Unsupported(_))));
        assert!(matches!("READ".parse::<RwKind>(), Err(RwParseError::Unknown(_))));
        for k in [RwKind::Read, RwKind::Write, RwKind::RandRead, RwKind::RandWrite, RwKind::RandRw, RwKind::ReadWrite] {
            assert_eq!(k.to_string().parse::<RwKind>(), Ok(k));
        }
    }

    #[test]
    fn sequential_write_walks_region_and_stops_at_limit() {
        let ios: Vec<Io> = IoGen::new(params(RwKind::Write)).unwrap().collect();
        assert_eq!(ios.len(), 64);
        for (i, io) in ios.iter().enumerate() {
            assert_eq!(*io, Io { op: Op::Write, offset: (1 << 20) + i as u64 * 4096, len: 4096 });
        }
    }

    #[test]
    fn sequential_wraps_around() {
        let p = GenParams { io_limit: Some(150 * 4096), ..params(RwKind::Read) };
        let offs: Vec<u64> = IoGen::new(p).unwrap().map(|io| (io.offset - (1 << 20)) / 4096).collect();
        assert_eq!(offs.len(), 150);
        let expect: Vec<u64> = (0..150).map(|i| i % 64).collect();
        assert_eq!(offs, expect);
    }

    #[test]
    fn mixed_sequential_keeps_cursor_per_direction_and_resets_together() {
        // fio 3.33, rw=rw bs=4k size=64k: reads and writes each walk 0,1,2,...; when one direction
        // reaches the end both restart at 0.
        let p = GenParams {
            region_size: 16 * 4096,
            region_offset: 0,
            io_limit: Some(32 * 4096),
            ..params(RwKind::ReadWrite)
        };
        let ios: Vec<Io> = IoGen::new(p).unwrap().collect();
        assert_eq!(ios.len(), 32);
        let mut cur = [0u64; 2];
        let mut joint_resets = 0;
        for io in &ios {
            let d = io.op.idx();
            assert_eq!(io.offset, cur[d] * 4096, "{ios:?}");
            cur[d] += 1;
            if cur[d] == 16 {
                joint_resets += usize::from(cur[1 - d] != 0);
                cur = [0, 0];
            }
        }
        assert!(joint_resets >= 1, "{ios:?}");
    }

    #[test]
    fn random_map_touches_each_block_once_per_pass() {
        for reshuffle in [false, true] {
            let p = GenParams {
                io_limit: Some(3 * 64 * 4096),
                reshuffle_each_pass: reshuffle,
                ..params(RwKind::RandWrite)
            };
            let ios: Vec<Io> = IoGen::new(p).unwrap().collect();
            assert_eq!(ios.len(), 192);
            let passes: Vec<Vec<u64>> = ios.chunks(64).map(|c| c.iter().map(|io| io.offset).collect()).collect();
            for pass in &passes {
                let mut s = pass.clone();
                s.sort_unstable();
                let expect: Vec<u64> = (0..64).map(|i| (1 << 20) + i * 4096).collect();
                assert_eq!(s, expect);
            }
            assert_eq!(passes[0] == passes[1], !reshuffle);
        }
    }

    #[test]
    fn deterministic_by_seed() {
        let run = |seed| {
            let p = GenParams { seed, distribution: "zipf:1.2".parse().unwrap(), ..params(RwKind::RandRw) };
            IoGen::new(p).unwrap().collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn rwmixread_ratio_within_tolerance() {
        for mix in [0u8, 30, 70, 100] {
            let p = GenParams {
                rwmixread: mix,
                io_limit: Some(20_000 * 4096),
                norandommap: true,
                ..params(RwKind::RandRw)
            };
            let ios: Vec<Io> = IoGen::new(p).unwrap().collect();
            let reads = ios.iter().filter(|io| io.op == Op::Read).count() as f64 / ios.len() as f64;
            assert!((reads - f64::from(mix) / 100.0).abs() < 0.015, "mix {mix}: {reads}");
        }
    }

    #[test]
    fn mixed_block_sizes_stay_in_region() {
        let p = GenParams {
            bs_read: 4096,
            bs_write: 16384,
            region_size: 10 * 4096 + 100,
            io_limit: Some(1 << 24),
            ..params(RwKind::RandRw)
        };
        let (start, end) = (p.region_offset, p.region_offset + p.region_size);
        let mut saw_clamped = false;
        for io in IoGen::new(p).unwrap() {
            assert!(io.offset >= start && io.offset + io.len <= end, "{io:?}");
            assert_eq!((io.offset - start) % io.len, 0, "each direction aligned to its own block size");
            assert_eq!(io.len, if io.op == Op::Read { 4096 } else { 16384 });
            // The last 16 KiB-aligned start that fits is 16 KiB.
            saw_clamped |= io.op == Op::Write && io.offset - start == 16384;
        }
        assert!(saw_clamped);
    }

    #[test]
    fn time_based_is_endless() {
        let p = GenParams { io_limit: None, ..params(RwKind::Read) };
        assert_eq!(IoGen::new(p).unwrap().take(10_000).count(), 10_000);
    }

    #[test]
    fn construction_errors() {
        assert_eq!(IoGen::new(GenParams { bs_read: 0, ..params(RwKind::Read) }).unwrap_err(), GenError::ZeroBlockSize);
        assert_eq!(
            IoGen::new(GenParams { region_size: 0, ..params(RwKind::Read) }).unwrap_err(),
            GenError::EmptyRegion
        );
        assert_eq!(
            IoGen::new(GenParams { bs_write: 1 << 30, ..params(RwKind::Write) }).unwrap_err(),
            GenError::BlockLargerThanRegion { bs: 1 << 30, region: 64 * 4096 }
        );
        // An unused direction's block size may exceed the region.
        assert!(IoGen::new(GenParams { bs_write: 1 << 30, ..params(RwKind::Read) }).is_ok());
        assert_eq!(
            IoGen::new(GenParams { rwmixread: 101, ..params(RwKind::RandRw) }).unwrap_err(),
            GenError::RwMixOutOfRange(101)
        );
        assert!(matches!(
            IoGen::new(GenParams { region_offset: u64::MAX, ..params(RwKind::Read) }),
            Err(GenError::RegionOverflow { .. })
        ));
    }

    #[test]
    fn precondition_streams() {
        let p = GenParams { region_size: 10 * 4096 + 512, ..params(RwKind::RandRead) };
        assert!(PreconditionGen::new(&p, Precondition::None).unwrap().is_none());
        let seq: Vec<Io> = PreconditionGen::new(&p, Precondition::Seq).unwrap().unwrap().collect();
        assert_eq!(seq.len(), 11);
        assert!(seq.iter().all(|io| io.op == Op::Write));
        assert_eq!(seq.iter().map(|io| io.len).sum::<u64>(), p.region_size);
        assert_eq!(seq[10], Io { op: Op::Write, offset: p.region_offset + 10 * 4096, len: 512 });

        let both: Vec<Io> = PreconditionGen::new(&p, Precondition::SeqRand).unwrap().unwrap().collect();
        assert_eq!(&both[..11], &seq[..]);
        let rand = &both[11..];
        assert!(rand.iter().all(|io| io.op == Op::Write));
        let bytes: u64 = rand.iter().map(|io| io.len).sum();
        assert!(bytes >= 2 * p.region_size && bytes < 2 * p.region_size + 4096);
        // Random map over 11 ranges: the first pass covers every range; the partial last range is
        // clamped onto the last full block, so 10 distinct offsets.
        let mut first: Vec<u64> = rand[..11].iter().map(|io| io.offset).collect();
        first.sort_unstable();
        first.dedup();
        let expect: Vec<u64> = (0..10).map(|i| p.region_offset + i * 4096).collect();
        assert_eq!(first, expect);
    }

    #[test]
    fn precondition_parsing() {
        assert_eq!("seq+rand".parse::<Precondition>(), Ok(Precondition::SeqRand));
        assert_eq!("none".parse::<Precondition>(), Ok(Precondition::None));
        assert_eq!("seq".parse::<Precondition>(), Ok(Precondition::Seq));
        assert!("rand".parse::<Precondition>().is_err());
    }
}
