//! `CrashDevice`: a memory-backed `BlockDevice` that shows what a power loss
//! could leave behind, and fails chosen requests on purpose.
//!
//! It keeps two sparse images: the *live* one (what reads see) and the
//! *durable* one (what survives a crash). Writes and discards change the live
//! image at once and are remembered, in submission order, as unflushed
//! operations; a completed `Flush` applies them all to the durable image. A FUA
//! write is durable on completion: it goes to both images and is never
//! unflushed; so is a discard flagged `fua` (what a zone reset is to a ZNS
//! drive), at O(range) in the FUA bookkeeping below. `crash(seed)` builds a new device from the durable image plus,
//! for each unflushed operation and decided by the seed, all of it, none of it,
//! or (torn, multi-block only) a random subset of its blocks; a single block is
//! atomic. Chosen operations apply in submission order. The original device is
//! left unchanged, so one moment can be crashed with many seeds.
//!
//! Invariants:
//! - an image never stores an all-zero block (absent means zeros), so images
//!   with equal contents are equal maps;
//! - an unflushed operation is never applied to the durable image over a block
//!   that a *later* FUA write made durable (`fua_seq`): the device cache holds
//!   the newer data, so the older write cannot land after it. Hence after a
//!   crash every block holds its durable content or the content of some
//!   unflushed operation newer than that durable content;
//! - after a flush, durable == live and nothing is unflushed.
//!
//! Memory: per image, one `block_bytes` allocation plus a BTreeMap entry
//! (~50 B) per non-zero block; every unflushed write keeps a copy of its data
//! until the next flush; one HashMap entry per block written with FUA while
//! unflushed operations were pending. Discards cost O(present blocks in range),
//! not O(range). Completions are immediate (untimed, like `MemoryDevice`), with
//! the same queue bound.

use crate::device::{check_range, BlockDevice, DeviceError, DeviceInfo, DeviceStats, IoCompletion, IoOp, IoRequest};
use crate::rng::SplitMix64;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

/// Completions held before `submit` answers `QueueFull` (as `MemoryDevice`).
const QUEUE_DEPTH_MAX: usize = 1024;

/// How one kind of request (reads, writes or flushes) is made to fail.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FaultRule {
    #[default]
    Never,
    /// The `n`th next request of this kind fails (1 = the very next one), once.
    Nth(u64),
    /// Each request of this kind fails with probability `p / 1_000_000`,
    /// drawn from the plan's seed.
    PerMillion(u32),
}

/// Which requests complete with `DeviceError::Injected` (changing nothing).
/// Only requests that pass validation count; writes include FUA writes but not
/// discards. A failed flush makes nothing durable: what was unflushed stays
/// unflushed, so a crash after it may keep any subset (a real drive's failed
/// cache flush promises nothing either).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    pub read: FaultRule,
    pub write: FaultRule,
    pub flush: FaultRule,
    /// Seed of the `PerMillion` draws.
    pub seed: u64,
    /// 0: faults are `DeviceError::Injected`; else `DeviceError::Io` with
    /// this errno (28: the host file system is full).
    pub errno: i32,
}

impl FaultPlan {
    /// No faults.
    pub fn none() -> FaultPlan {
        FaultPlan::default()
    }

    /// Fail the `n`th next read (1 = the next one).
    pub fn nth_read(n: u64) -> FaultPlan {
        FaultPlan { read: FaultRule::Nth(n), ..FaultPlan::default() }
    }

    /// Fail the `n`th next write (1 = the next one).
    pub fn nth_write(n: u64) -> FaultPlan {
        FaultPlan { write: FaultRule::Nth(n), ..FaultPlan::default() }
    }

    /// Fail the `n`th next flush (1 = the next one).
    pub fn nth_flush(n: u64) -> FaultPlan {
        FaultPlan { flush: FaultRule::Nth(n), ..FaultPlan::default() }
    }
}

/// A plan's rule plus how many matching requests it has seen.
struct ArmedRule {
    rule: FaultRule,
    seen: u64,
}

impl ArmedRule {
    fn new(rule: FaultRule) -> ArmedRule {
        ArmedRule { rule, seen: 0 }
    }

    fn fires(&mut self, rng: &mut SplitMix64) -> bool {
        match self.rule {
            FaultRule::Never => false,
            FaultRule::Nth(n) => {
                self.seen += 1;
                if self.seen >= n {
                    self.rule = FaultRule::Never;
                    n != 0
                } else {
                    false
                }
            }
            FaultRule::PerMillion(p) => rng.below(1_000_000) < u64::from(p),
        }
    }
}

/// A sparse image: block index → contents; absent blocks read as zeros.
#[derive(Clone, Default, PartialEq, Eq)]
struct Image {
    blocks: BTreeMap<u64, Box<[u8]>>,
}

impl Image {
    fn put(&mut self, block: u64, data: &[u8]) {
        if data.iter().all(|&b| b == 0) {
            self.blocks.remove(&block);
        } else if let Some(d) = self.blocks.get_mut(&block) {
            d.copy_from_slice(data);
        } else {
            self.blocks.insert(block, data.into());
        }
    }

    fn read(&self, block: u64, dst: &mut [u8]) {
        match self.blocks.get(&block) {
            Some(d) => dst.copy_from_slice(d),
            None => dst.fill(0),
        }
    }

    /// Blocks present (non-zero) in `[first, first + count)`.
    fn present(&self, first: u64, count: u64) -> Vec<u64> {
        self.blocks.range(first..first + count).map(|(&b, _)| b).collect()
    }
}

enum Change {
    /// The written data, `block_count * block_bytes` bytes.
    Write(Box<[u8]>),
    Discard,
}

/// A completed write or discard not yet made durable.
struct Unflushed {
    seq: u64,
    first_block: u64,
    block_count: u64,
    change: Change,
}

impl Unflushed {
    /// Apply this operation to `durable`, block by block, skipping blocks a
    /// later FUA write made durable; `pick` decides per candidate block
    /// (every written block; for a discard, every non-zero block in range).
    fn apply(&self, durable: &mut Image, fua_seq: &HashMap<u64, u64>, bs: usize, mut pick: impl FnMut() -> bool) {
        let newer_fua = |b: u64| fua_seq.get(&b).is_some_and(|&s| s > self.seq);
        match &self.change {
            Change::Write(data) => {
                for i in 0..self.block_count {
                    let b = self.first_block + i;
                    if pick() && !newer_fua(b) {
                        durable.put(b, &data[i as usize * bs..][..bs]);
                    }
                }
            }
            Change::Discard => {
                for b in durable.present(self.first_block, self.block_count) {
                    if pick() && !newer_fua(b) {
                        durable.blocks.remove(&b);
                    }
                }
            }
        }
    }
}

struct State {
    live: Image,
    durable: Image,
    /// In submission order (ascending `seq`).
    unflushed: Vec<Unflushed>,
    /// Block → seq of the last FUA write to it while operations were unflushed;
    /// cleared by a flush.
    fua_seq: HashMap<u64, u64>,
    next_seq: u64,
    read_fault: ArmedRule,
    write_fault: ArmedRule,
    flush_fault: ArmedRule,
    fault_rng: SplitMix64,
    fault_errno: i32,
    done: VecDeque<IoCompletion>,
    stats: DeviceStats,
}

impl State {
    fn new(image: Image) -> State {
        State {
            live: image.clone(),
            durable: image,
            unflushed: Vec::new(),
            fua_seq: HashMap::new(),
            next_seq: 0,
            read_fault: ArmedRule::new(FaultRule::Never),
            write_fault: ArmedRule::new(FaultRule::Never),
            flush_fault: ArmedRule::new(FaultRule::Never),
            fault_rng: SplitMix64(0),
            fault_errno: 0,
            done: VecDeque::new(),
            stats: DeviceStats::default(),
        }
    }

    /// The error an armed fault completes with.
    fn fault(&self) -> DeviceError {
        match self.fault_errno {
            0 => DeviceError::Injected,
            errno => DeviceError::Io { errno },
        }
    }

    fn execute(&mut self, req: &mut IoRequest, bs: u64) -> Result<u64, DeviceError> {
        let first = req.offset / bs;
        let count = req.len / bs;
        let bsz = bs as usize;
        match req.op {
            IoOp::Read => {
                if self.read_fault.fires(&mut self.fault_rng) {
                    return Err(self.fault());
                }
                for i in 0..count {
                    self.live.read(first + i, &mut req.buf[i as usize * bsz..][..bsz]);
                }
            }
            IoOp::Write => {
                if self.write_fault.fires(&mut self.fault_rng) {
                    return Err(self.fault());
                }
                for i in 0..count {
                    self.live.put(first + i, &req.buf[i as usize * bsz..][..bsz]);
                }
                let seq = self.next_seq;
                self.next_seq += 1;
                if req.fua {
                    let guard = !self.unflushed.is_empty();
                    for i in 0..count {
                        self.durable.put(first + i, &req.buf[i as usize * bsz..][..bsz]);
                        if guard {
                            self.fua_seq.insert(first + i, seq);
                        }
                    }
                } else {
                    let data = Change::Write(req.buf[..].into());
                    self.unflushed.push(Unflushed { seq, first_block: first, block_count: count, change: data });
                }
            }
            IoOp::Discard => {
                for b in self.live.present(first, count) {
                    self.live.blocks.remove(&b);
                }
                let seq = self.next_seq;
                self.next_seq += 1;
                if req.fua {
                    // Durable on completion, like a FUA write (a zone reset:
                    // the drive persists zone state before it answers).
                    for b in self.durable.present(first, count) {
                        self.durable.blocks.remove(&b);
                    }
                    if !self.unflushed.is_empty() {
                        for b in first..first + count {
                            self.fua_seq.insert(b, seq);
                        }
                    }
                } else {
                    let change = Change::Discard;
                    self.unflushed.push(Unflushed { seq, first_block: first, block_count: count, change });
                }
            }
            IoOp::Flush => {
                if self.flush_fault.fires(&mut self.fault_rng) {
                    return Err(self.fault());
                }
                for op in std::mem::take(&mut self.unflushed) {
                    op.apply(&mut self.durable, &self.fua_seq, bsz, || true);
                }
                self.fua_seq.clear();
            }
            op @ (IoOp::ZoneAppend | IoOp::Zone(_)) => return Err(DeviceError::Unsupported(op)),
        }
        Ok(req.len)
    }
}

/// A memory device with a live and a durable image; see the module comment.
pub struct CrashDevice {
    info: DeviceInfo,
    state: Mutex<State>,
}

impl CrashDevice {
    /// An all-zero device of `capacity_bytes` with `block_bytes` blocks.
    pub fn new(capacity_bytes: u64, block_bytes: u64) -> CrashDevice {
        assert!(block_bytes > 0, "block size must be positive");
        assert_eq!(capacity_bytes % block_bytes, 0, "capacity must be whole blocks");
        Self::with_image(capacity_bytes, block_bytes, Image::default())
    }

    fn with_image(capacity_bytes: u64, block_bytes: u64, image: Image) -> CrashDevice {
        CrashDevice {
            info: DeviceInfo {
                name: "crash".to_string(),
                capacity_bytes,
                block_bytes,
                queue_depth_max: QUEUE_DEPTH_MAX,
                optimal_write_bytes: block_bytes,
                zoned: false,
            },
            state: Mutex::new(State::new(image)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("crash device lock")
    }

    /// Replace the fault plan (counters of `Nth` rules restart from now).
    pub fn inject(&self, plan: FaultPlan) {
        let mut st = self.lock();
        st.read_fault = ArmedRule::new(plan.read);
        st.write_fault = ArmedRule::new(plan.write);
        st.flush_fault = ArmedRule::new(plan.flush);
        st.fault_rng = SplitMix64(plan.seed);
        st.fault_errno = plan.errno;
    }

    /// Completed writes and discards not yet made durable by a flush.
    pub fn unflushed_ops(&self) -> usize {
        self.lock().unflushed.len()
    }

    /// Whether a crash now would lose nothing.
    pub fn durable_equals_live(&self) -> bool {
        let st = self.lock();
        st.live == st.durable
    }

    /// Whether both devices' live images hold the same bytes.
    pub fn same_contents(&self, other: &CrashDevice) -> bool {
        if std::ptr::eq(self, other) {
            return true;
        }
        let live = self.lock().live.clone();
        self.info.capacity_bytes == other.info.capacity_bytes && other.lock().live == live
    }

    /// A new device holding what a power loss now could leave: the durable
    /// image plus, per unflushed operation (in submission order, chosen from
    /// `seed`), all, none, or for a multi-block operation a random subset of
    /// its blocks. Its live and durable images are equal, nothing is
    /// unflushed, no faults are planned, stats start at zero. `self` is
    /// unchanged.
    pub fn crash(&self, seed: u64) -> CrashDevice {
        let st = self.lock();
        let mut rng = SplitMix64(seed);
        let mut image = st.durable.clone();
        let bs = self.info.block_bytes as usize;
        for op in &st.unflushed {
            let choice = if op.block_count > 1 { rng.below(3) } else { rng.below(2) };
            match choice {
                0 => {}
                1 => op.apply(&mut image, &st.fua_seq, bs, || true),
                _ => op.apply(&mut image, &st.fua_seq, bs, || rng.coin()),
            }
        }
        Self::with_image(self.info.capacity_bytes, self.info.block_bytes, image)
    }
}

impl BlockDevice for CrashDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&self, mut req: IoRequest) {
        let mut st = self.lock();
        let result = if st.done.len() >= self.info.queue_depth_max {
            Err(DeviceError::QueueFull { queue_depth_max: self.info.queue_depth_max })
        } else {
            check_range(&self.info, &req).and_then(|_| st.execute(&mut req, self.info.block_bytes))
        };
        st.stats.count_host(req.op, req.len, result.is_ok());
        st.done.push_back(IoCompletion::untimed(req, result));
    }

    fn reap(&self, _min: usize, out: &mut Vec<IoCompletion>) -> usize {
        let mut st = self.lock();
        let n = st.done.len();
        out.extend(st.done.drain(..));
        n
    }

    fn in_flight(&self) -> usize {
        self.lock().done.len()
    }

    fn stats(&self) -> DeviceStats {
        self.lock().stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::IoBuf;
    use crate::device::{discard, flush, read_at, sync_io, write_at};

    const BS: usize = 4096;
    const SEEDS: u64 = 200;

    fn dev() -> CrashDevice {
        CrashDevice::new(1 << 20, BS as u64)
    }

    fn block(byte: u8) -> Vec<u8> {
        vec![byte; BS]
    }

    fn write_fua(d: &CrashDevice, offset: u64, data: &[u8]) -> Result<u64, DeviceError> {
        let mut req = IoRequest::write(offset, IoBuf::from_slice(data), 0);
        req.fua = true;
        sync_io(d, req).result
    }

    /// The byte every byte of block `b` holds; panics if the block is mixed.
    fn uniform(d: &CrashDevice, b: u64) -> u8 {
        let data = read_at(d, b * BS as u64, BS).unwrap();
        assert!(data.iter().all(|&x| x == data[0]), "block {b} mixes contents");
        data[0]
    }

    #[test]
    fn unflushed_write_is_lost_or_kept_depending_on_seed() {
        let d = dev();
        write_at(&d, 0, &block(0xAA)).unwrap();
        assert_eq!(d.unflushed_ops(), 1);
        assert!(!d.durable_equals_live());
        let (mut kept, mut lost) = (0, 0);
        for seed in 0..SEEDS {
            match uniform(&d.crash(seed), 0) {
                0xAA => kept += 1,
                0 => lost += 1,
                x => panic!("seed {seed}: unexpected byte {x:#x}"),
            }
        }
        assert!(kept > 0 && lost > 0, "kept {kept} lost {lost}");
    }

    #[test]
    fn flushed_write_survives_every_seed() {
        let d = dev();
        write_at(&d, 8192, &block(0x5C)).unwrap();
        flush(&d).unwrap();
        assert_eq!(d.unflushed_ops(), 0);
        assert!(d.durable_equals_live());
        for seed in 0..SEEDS {
            assert_eq!(uniform(&d.crash(seed), 2), 0x5C, "seed {seed}");
        }
        assert_eq!(d.stats().flushes, 1);
    }

    #[test]
    fn fua_write_is_durable_and_later_unflushed_write_wins_or_is_lost() {
        let d = dev();
        write_fua(&d, 0, &block(0x22)).unwrap();
        assert_eq!(d.unflushed_ops(), 0);
        assert!(d.durable_equals_live());
        for seed in 0..SEEDS {
            assert_eq!(uniform(&d.crash(seed), 0), 0x22, "seed {seed}");
        }
        // An older unflushed write must never land over the FUA data; a newer one may.
        let d = dev();
        write_at(&d, 0, &block(0x11)).unwrap();
        write_fua(&d, 0, &block(0x22)).unwrap();
        write_at(&d, 0, &block(0x33)).unwrap();
        assert_eq!(uniform(&d, 0), 0x33);
        let (mut fua, mut later) = (0, 0);
        for seed in 0..SEEDS {
            match uniform(&d.crash(seed), 0) {
                0x22 => fua += 1,
                0x33 => later += 1,
                x => panic!("seed {seed}: block holds {x:#x}, not the FUA or the later data"),
            }
        }
        assert!(fua > 0 && later > 0, "fua {fua} later {later}");
    }

    /// A discard flagged FUA is durable at once, and an older unflushed
    /// write to its blocks never lands after it; a later one may.
    #[test]
    fn a_fua_discard_is_durable_and_older_writes_never_land_after_it() {
        let d = CrashDevice::new(4 * BS as u64, BS as u64);
        write_at(&d, 0, &block(0x11)).unwrap();
        flush(&d).unwrap();
        write_at(&d, 0, &block(0x22)).unwrap(); // unflushed, older than the discard
        let mut req = IoRequest::discard(0, 2 * BS as u64, 0);
        req.fua = true;
        assert_eq!(sync_io(&d, req).result, Ok(2 * BS as u64));
        write_at(&d, BS as u64, &block(0x33)).unwrap(); // unflushed, newer
        let (mut newer, mut zeros) = (0, 0);
        for seed in 0..64 {
            let c = d.crash(seed);
            assert!(read_at(&c, 0, BS).unwrap().iter().all(|&b| b == 0), "seed {seed}: the discard was lost");
            match read_at(&c, BS as u64, BS).unwrap()[0] {
                0x33 => newer += 1,
                0 => zeros += 1,
                other => panic!("seed {seed}: {other:#x}"),
            }
        }
        assert!(newer > 0 && zeros > 0, "newer {newer} zeros {zeros}");
    }

    #[test]
    fn flush_after_fua_does_not_resurrect_older_write() {
        let d = dev();
        write_at(&d, 0, &block(0x11)).unwrap();
        discard(&d, BS as u64, BS as u64).unwrap();
        write_fua(&d, 0, &block(0x22)).unwrap();
        write_fua(&d, BS as u64, &block(0x44)).unwrap();
        flush(&d).unwrap();
        assert!(d.durable_equals_live());
        for seed in 0..SEEDS {
            let c = d.crash(seed);
            assert_eq!((uniform(&c, 0), uniform(&c, 1)), (0x22, 0x44), "seed {seed}");
        }
    }

    #[test]
    fn multi_block_write_tears_at_block_granularity() {
        const N: u64 = 8;
        let d = dev();
        write_at(&d, 0, &vec![0x01; N as usize * BS]).unwrap();
        flush(&d).unwrap();
        write_at(&d, 0, &vec![0x02; N as usize * BS]).unwrap();
        let (mut full, mut none, mut partial) = (0, 0, 0);
        for seed in 0..SEEDS {
            let c = d.crash(seed);
            let new = (0..N)
                .filter(|&b| match uniform(&c, b) {
                    0x01 => false,
                    0x02 => true,
                    x => panic!("seed {seed} block {b}: {x:#x}"),
                })
                .count() as u64;
            match new {
                0 => none += 1,
                N => full += 1,
                _ => partial += 1,
            }
        }
        assert!(full > 0 && none > 0 && partial > 0, "full {full} none {none} partial {partial}");
    }

    #[test]
    fn unflushed_discard_leaves_old_data_or_zeros() {
        let d = dev();
        write_at(&d, 0, &vec![0x5A; 4 * BS]).unwrap();
        flush(&d).unwrap();
        discard(&d, 0, 4 * BS as u64).unwrap();
        assert!(read_at(&d, 0, 4 * BS).unwrap().iter().all(|&b| b == 0));
        let (mut old, mut zero) = (0, 0);
        for seed in 0..SEEDS {
            let c = d.crash(seed);
            for b in 0..4 {
                match uniform(&c, b) {
                    0x5A => old += 1,
                    0 => zero += 1,
                    x => panic!("seed {seed} block {b}: {x:#x}"),
                }
            }
        }
        assert!(old > 0 && zero > 0, "old {old} zero {zero}");
        flush(&d).unwrap();
        assert!(d.durable_equals_live());
        assert_eq!(uniform(&d.crash(1), 0), 0);
    }

    #[test]
    fn crash_leaves_the_original_untouched_and_is_deterministic() {
        let d = dev();
        for i in 0..16u64 {
            write_at(&d, i * BS as u64, &vec![i as u8 + 1; 2 * BS]).unwrap();
        }
        discard(&d, 4 * BS as u64, 2 * BS as u64).unwrap();
        let before: Vec<u8> = read_at(&d, 0, 20 * BS).unwrap().to_vec();
        let a = d.crash(7);
        let b = d.crash(7);
        assert!(a.same_contents(&b));
        assert_eq!(a.unflushed_ops(), 0);
        assert!(a.durable_equals_live());
        assert!((8..40).any(|s| !d.crash(s).same_contents(&a)), "different seeds never differ");
        assert_eq!(d.unflushed_ops(), 17);
        assert_eq!(&read_at(&d, 0, 20 * BS).unwrap()[..], &before[..]);
        assert!(!d.durable_equals_live());
        // A crashed device is an ordinary device again.
        write_at(&a, 0, &block(0x77)).unwrap();
        assert_eq!(uniform(&a, 0), 0x77);
        assert!(b.same_contents(&d.crash(7)));
    }

    #[test]
    fn injected_faults_fail_and_change_nothing() {
        let d = dev();
        write_at(&d, 0, &block(1)).unwrap();
        flush(&d).unwrap();
        d.inject(FaultPlan::nth_write(2));
        write_at(&d, BS as u64, &block(2)).unwrap();
        assert_eq!(write_at(&d, 0, &block(3)), Err(DeviceError::Injected));
        assert_eq!(write_fua(&d, 0, &block(3)), Ok(BS as u64));
        assert_eq!(uniform(&d, 0), 3);
        assert_eq!(d.unflushed_ops(), 1);

        d.inject(FaultPlan::nth_read(1));
        assert_eq!(read_at(&d, 0, BS).map(|_| ()), Err(DeviceError::Injected));
        assert_eq!(uniform(&d, 0), 3);
        assert_eq!(d.stats().errors, 2);

        // A failed flush makes nothing durable: the write before it can
        // still be lost, the next flush keeps it.
        d.inject(FaultPlan::nth_flush(1));
        assert_eq!(flush(&d), Err(DeviceError::Injected));
        assert_eq!(d.unflushed_ops(), 1);
        assert!(
            (0..SEEDS).any(|seed| uniform(&d.crash(seed), 1) == 0),
            "a crash after a failed flush can lose its write"
        );
        assert_eq!(flush(&d), Ok(()));
        assert_eq!(d.unflushed_ops(), 0);
        assert!((0..SEEDS).all(|seed| uniform(&d.crash(seed), 1) == 2));
        assert_eq!(d.stats().errors, 3);

        // Seeded probability: some writes fail, they change nothing, and the pattern replays.
        let outcomes = |seed: u64| {
            let d = dev();
            d.inject(FaultPlan { write: FaultRule::PerMillion(500_000), seed, ..FaultPlan::none() });
            let res: Vec<bool> = (0..64u64).map(|i| write_at(&d, i * BS as u64, &block(9)).is_ok()).collect();
            for (i, &ok) in res.iter().enumerate() {
                assert_eq!(uniform(&d, i as u64), if ok { 9 } else { 0 });
            }
            assert_eq!(d.unflushed_ops(), res.iter().filter(|&&ok| ok).count());
            res
        };
        let r = outcomes(42);
        assert!(r.contains(&true) && r.contains(&false));
        assert_eq!(r, outcomes(42));
        d.inject(FaultPlan::none());
        write_at(&d, 0, &block(4)).unwrap();
        assert_eq!(uniform(&d, 0), 4);
    }

    #[test]
    fn rejects_bad_requests_without_recording_them() {
        let d = dev();
        assert!(matches!(write_at(&d, 100, &block(1)), Err(DeviceError::Misaligned { .. })));
        assert!(matches!(write_at(&d, 1 << 20, &block(1)), Err(DeviceError::OutOfRange { .. })));
        let r = sync_io(&d, IoRequest::zone_append(0, IoBuf::from_slice(&block(1)), 0)).result;
        assert_eq!(r, Err(DeviceError::Unsupported(IoOp::ZoneAppend)));
        assert_eq!(d.unflushed_ops(), 0);
        assert!(d.durable_equals_live());
        assert_eq!(d.stats().errors, 3);
    }
}
