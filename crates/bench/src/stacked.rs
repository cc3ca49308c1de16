//! Stacked systems in virtual time: Sluice's engine (and, for comparison, a
//! conventional set-associative write-back cache) over an emulated SCM cache
//! device and an emulated QLC or ZNS capacity device, presented to the job
//! runner as one `BlockDevice`.
//!
//! The engine is synchronous: a call runs to completion, doing its device
//! I/O one request after another. To simulate many concurrent callers (8
//! jobs × iodepth 32) on a virtual clock, requests submitted at one moment
//! run at the next reap, at that moment (`CallTime`), one engine call per
//! group the executor forms (Sluice group-commits plain writes to one
//! volume; everything else runs alone): the devices see every I/O of the
//! call issued at that time, and its requests complete when the last I/O
//! does (or when the engine's reuse gate says the log space it writes into
//! was freed, if later). Submission times therefore never run
//! backwards, so the emulators' resource timelines (dies, channels, cores,
//! firmware) stay exact queues; the price is that I/O a call makes one after
//! another (compaction's read, then its writes) is timed as if overlapped.
//! Throughput in steady state is set by resource occupancy and by the gate —
//! writers wait for the compaction that frees their chunk, as behind a real
//! background compactor — so it is what the model measures faithfully;
//! per-request latency of calls that compact is optimistic.
//!
//! Invariants: the runner's clock never runs backwards; no request is in
//! flight on the inner devices between calls; every request yields exactly
//! one completion.

use crate::error::BenchError;
use sluice_engine::{
    BandPlacement, Engine, EngineConfig, EngineVolume, Runtime, Schedule, Volume, VolumeError, VolumeSpec,
};
use sluice_media::device::{check_range, sync_io};
use sluice_media::{
    BlockDevice, Clock, ClockRef, DeviceError, DeviceInfo, DeviceStats, IoBuf, IoCompletion, IoOp, IoRequest, Pending,
    VirtualClock,
};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The time of the call being simulated: when it started, and the latest
/// moment anything it waited for completes.
#[derive(Debug, Default)]
pub struct CallTime {
    start_ns: AtomicU64,
    latest_ns: AtomicU64,
}

impl CallTime {
    pub fn new() -> Arc<CallTime> {
        Arc::new(CallTime::default())
    }
    fn begin(&self, t_ns: u64) {
        self.start_ns.store(t_ns, Ordering::Relaxed);
        self.latest_ns.store(t_ns, Ordering::Relaxed);
    }
    fn end(&self) -> u64 {
        self.latest_ns.load(Ordering::Relaxed)
    }
    /// The clock the devices run on: now is the call's start; waiting only
    /// records how long the call takes.
    pub fn device_clock(self: &Arc<CallTime>) -> ClockRef {
        Arc::new(DeviceView(self.clone()))
    }
    /// The clock the engine's reuse gate runs on: now is the latest moment
    /// the call has reached.
    pub fn engine_clock(self: &Arc<CallTime>) -> ClockRef {
        Arc::new(EngineView(self.clone()))
    }
}

struct DeviceView(Arc<CallTime>);
struct EngineView(Arc<CallTime>);

impl Clock for DeviceView {
    fn now_ns(&self) -> u64 {
        self.0.start_ns.load(Ordering::Relaxed)
    }
    fn wait_until(&self, t_ns: u64) {
        self.0.latest_ns.fetch_max(t_ns, Ordering::Relaxed);
    }
    fn is_virtual(&self) -> bool {
        true
    }
}

impl Clock for EngineView {
    fn now_ns(&self) -> u64 {
        self.0.latest_ns.load(Ordering::Relaxed)
    }
    fn wait_until(&self, t_ns: u64) {
        self.0.latest_ns.fetch_max(t_ns, Ordering::Relaxed);
    }
    fn is_virtual(&self) -> bool {
        true
    }
}

/// What a stack runs each request through, synchronously, on the inner clock.
pub trait Executor: Send {
    fn execute(&mut self, req: &mut IoRequest) -> Result<u64, DeviceError>;

    /// Split the requests `idx` (indexes into `reqs`, in submission order)
    /// into groups that run as one call each; by default one each.
    fn groups(&self, _reqs: &[IoRequest], idx: &[usize]) -> Vec<Vec<usize>> {
        idx.iter().map(|&i| vec![i]).collect()
    }

    /// Run one group; one result per member.
    fn execute_group(&mut self, reqs: &mut [IoRequest], group: &[usize]) -> Vec<Result<u64, DeviceError>> {
        group.iter().map(|&i| self.execute(&mut reqs[i])).collect()
    }
}

struct StackState<E> {
    exec: E,
    /// Submitted since the last reap, not yet run.
    queued: Vec<IoRequest>,
    pending: BinaryHeap<Reverse<Pending>>,
    stats: DeviceStats,
    seq: u64,
}

/// A cache device and a capacity device behind an `Executor`, as one device.
pub struct Stack<E: Executor> {
    info: DeviceInfo,
    outer: Arc<VirtualClock>,
    call: Arc<CallTime>,
    cache: Arc<dyn BlockDevice>,
    capacity: Arc<dyn BlockDevice>,
    state: Mutex<StackState<E>>,
}

impl<E: Executor> Stack<E> {
    /// Run every queued request at the present time, in groups the executor
    /// chooses; each group is one call and completes when it ends.
    fn run_queued(&self, st: &mut StackState<E>) {
        if st.queued.is_empty() {
            return;
        }
        let now = self.outer.now_ns();
        let mut reqs = std::mem::take(&mut st.queued);
        let room = self.info.queue_depth_max.saturating_sub(st.pending.len());
        let mut results: Vec<Option<Result<u64, DeviceError>>> = (0..reqs.len()).map(|_| None).collect();
        let mut done = vec![now; reqs.len()];
        for (i, r) in reqs.iter().enumerate() {
            if i >= room {
                results[i] = Some(Err(DeviceError::QueueFull { queue_depth_max: self.info.queue_depth_max }));
            } else if let Err(e) = check_range(&self.info, r) {
                results[i] = Some(Err(e));
            }
        }
        let runnable: Vec<usize> = (0..reqs.len()).filter(|&i| results[i].is_none()).collect();
        for group in st.exec.groups(&reqs, &runnable) {
            self.call.begin(now);
            let rs = st.exec.execute_group(&mut reqs, &group);
            let end = self.call.end();
            for (&i, r) in group.iter().zip(rs) {
                results[i] = Some(r);
                done[i] = end;
            }
        }
        for (i, req) in reqs.into_iter().enumerate() {
            let result = results[i].take().expect("every request ran or was refused");
            st.stats.count_host(req.op, req.len, result.is_ok());
            if result.is_ok() {
                st.stats.busy_ns += done[i] - now;
            }
            st.seq += 1;
            let seq = st.seq;
            let c = IoCompletion {
                user_data: req.user_data,
                op: req.op,
                result,
                buf: req.buf,
                submitted_ns: now,
                completed_ns: done[i],
            };
            st.pending.push(Reverse(Pending(c, seq)));
        }
    }

    /// The devices underneath: (cache, capacity).
    pub fn tiers(&self) -> (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) {
        (self.cache.clone(), self.capacity.clone())
    }

    /// The runner's clock.
    pub fn clock(&self) -> ClockRef {
        self.outer.clone()
    }
}

impl<E: Executor> BlockDevice for Stack<E> {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Requests are queued and run at the next `reap`: everything submitted
    /// at one moment is there together, so the executor may group them
    /// (Sluice group-commits same-volume writes into shared log records).
    fn submit(&self, req: IoRequest) {
        let mut st = self.state.lock().expect("stack lock");
        st.queued.push(req);
    }

    fn reap(&self, min: usize, out: &mut Vec<IoCompletion>) -> usize {
        let mut st = self.state.lock().expect("stack lock");
        self.run_queued(&mut st);
        let mut n = 0;
        while let Some(Reverse(head)) = st.pending.peek() {
            let due = head.0.completed_ns;
            if due > self.outer.now_ns() {
                if n >= min {
                    break;
                }
                self.outer.wait_until(due);
            }
            let Reverse(Pending(c, _)) = st.pending.pop().expect("peeked");
            out.push(c);
            n += 1;
        }
        n
    }

    fn in_flight(&self) -> usize {
        let st = self.state.lock().expect("stack lock");
        st.pending.len() + st.queued.len()
    }

    /// Host counters are the users' requests; media counters are the
    /// capacity device's, so `device_waf()` is the CSAL paper's WAF: bytes
    /// programmed to the capacity medium per user byte written.
    fn stats(&self) -> DeviceStats {
        let mut s = self.state.lock().expect("stack lock").stats;
        let cap = self.capacity.stats();
        s.media_program_bytes = cap.media_program_bytes;
        s.media_read_bytes = cap.media_read_bytes;
        s.erases = cap.erases;
        s
    }
}

fn volume_error(e: VolumeError) -> DeviceError {
    DeviceError::Io { errno: e.errno() }
}

/// Sluice's engine with equal volumes laid end to end: device offset `o` is
/// volume `o / volume_bytes`, so fio jobs on equal partitions are tenants.
pub struct SluiceExec {
    engine: Arc<Engine>,
    vols: Vec<EngineVolume>,
    volume_bytes: u64,
}

impl Stack<SluiceExec> {
    /// The engine under this stack.
    pub fn engine(&self) -> Arc<Engine> {
        self.state.lock().expect("stack state").exec.engine.clone()
    }
}

impl SluiceExec {
    /// Run `f` on each volume piece of [offset, offset+len): (volume, offset in it, range in the request).
    fn pieces(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(&EngineVolume, u64, std::ops::Range<usize>) -> Result<(), VolumeError>,
    ) -> Result<(), VolumeError> {
        let mut pos = offset;
        while pos < offset + len {
            let v = (pos / self.volume_bytes) as usize;
            let in_vol = pos % self.volume_bytes;
            let n = (self.volume_bytes - in_vol).min(offset + len - pos);
            let at = (pos - offset) as usize;
            f(&self.vols[v], in_vol, at..at + n as usize)?;
            pos += n;
        }
        Ok(())
    }
}

impl SluiceExec {
    /// The volume a request lies wholly in, if it is a plain (non-FUA) write.
    fn batchable(&self, r: &IoRequest) -> Option<usize> {
        let v = r.offset / self.volume_bytes;
        (r.op == IoOp::Write && !r.fua && (r.offset + r.len - 1) / self.volume_bytes == v).then_some(v as usize)
    }
}

impl Executor for SluiceExec {
    /// Plain writes to one volume submitted together form one group (group
    /// commit); everything else runs alone.
    fn groups(&self, reqs: &[IoRequest], idx: &[usize]) -> Vec<Vec<usize>> {
        let mut by_vol: Vec<Vec<usize>> = vec![Vec::new(); self.vols.len()];
        let mut out = Vec::new();
        for &i in idx {
            match self.batchable(&reqs[i]) {
                Some(v) => by_vol[v].push(i),
                None => out.push(vec![i]),
            }
        }
        out.extend(by_vol.into_iter().filter(|g| !g.is_empty()));
        out
    }

    fn execute_group(&mut self, reqs: &mut [IoRequest], group: &[usize]) -> Vec<Result<u64, DeviceError>> {
        if group.len() == 1 {
            return vec![self.execute(&mut reqs[group[0]])];
        }
        let v = self.batchable(&reqs[group[0]]).expect("groups hold batchable writes");
        let writes: Vec<(u64, &[u8])> =
            group.iter().map(|&i| (reqs[i].offset % self.volume_bytes, &reqs[i].buf[..])).collect();
        let r = self.vols[v].write_batch(&writes, false).map_err(volume_error);
        group.iter().map(|&i| r.clone().map(|_| reqs[i].len)).collect()
    }

    fn execute(&mut self, req: &mut IoRequest) -> Result<u64, DeviceError> {
        let buf = &mut req.buf;
        let r = match req.op {
            IoOp::Read => self.pieces(req.offset, req.len, |v, o, r| v.read(o, &mut buf[r])),
            IoOp::Write => self.pieces(req.offset, req.len, |v, o, r| v.write(o, &buf[r], req.fua)),
            IoOp::Discard => self.pieces(req.offset, req.len, |v, o, r| v.trim(o, r.len() as u64)),
            IoOp::Flush => self.vols[0].flush(),
            op => return Err(DeviceError::Unsupported(op)),
        };
        r.map(|_| req.len).map_err(volume_error)
    }
}

/// The shared clocks and outer description of a stack over `cache` and `capacity`.
fn stack<E: Executor>(
    name: &str,
    capacity_bytes: u64,
    exec: E,
    call: Arc<CallTime>,
    cache: Arc<dyn BlockDevice>,
    capacity: Arc<dyn BlockDevice>,
) -> Stack<E> {
    Stack {
        info: DeviceInfo {
            name: name.to_string(),
            capacity_bytes,
            block_bytes: 4096,
            queue_depth_max: 4096,
            optimal_write_bytes: 4096,
            zoned: false,
        },
        outer: VirtualClock::new(),
        call,
        cache,
        capacity,
        state: Mutex::new(StackState {
            exec,
            queued: Vec::new(),
            pending: BinaryHeap::new(),
            stats: DeviceStats::default(),
            seq: 0,
        }),
    }
}

/// Sluice over `cache` and `capacity` (built on `call.device_clock()`):
/// `volumes` volumes of `volume_bytes` each.
pub fn sluice_stack(
    cache: Arc<dyn BlockDevice>,
    capacity: Arc<dyn BlockDevice>,
    call: Arc<CallTime>,
    cfg: EngineConfig,
    placement: BandPlacement,
    volumes: u64,
    volume_bytes: u64,
) -> Result<Stack<SluiceExec>, BenchError> {
    let specs: Vec<VolumeSpec> =
        (0..volumes).map(|i| VolumeSpec { name: format!("job{i}"), size_bytes: volume_bytes }).collect();
    // Virtual time: the engine's clock is the call's, its device I/O in
    // request order under its lock (the serial schedule).
    let runtime = Runtime { clock: call.engine_clock(), schedule: Schedule::Serial };
    let engine =
        Engine::create_on(runtime, cache.clone(), capacity.clone(), cfg, &specs).map_err(BenchError::Engine)?;
    engine.set_band_placement(placement).map_err(BenchError::Engine)?;
    let vols =
        specs.iter().map(|s| engine.volume(&s.name)).collect::<Result<Vec<_>, _>>().map_err(BenchError::Engine)?;
    let exec = SluiceExec { engine, vols, volume_bytes };
    Ok(stack("sluice", volume_bytes * volumes, exec, call, cache, capacity))
}

/// A conventional write-back cache, the CSAL paper's "traditional cache":
/// 4 KiB lines on the cache device, `ways`-way set associative (set =
/// hashed LBA), LRU replacement. A write hits or allocates a line (writing
/// the cache device); allocating over a dirty LRU line first cleans it —
/// read from the cache, written to the capacity device as the 4 KiB random
/// write it is. Reads are served from a line if present, else from the
/// capacity device (no read allocation). Flush flushes both devices.
pub struct SetAssocExec {
    cache: Arc<dyn BlockDevice>,
    capacity: Arc<dyn BlockDevice>,
    ways: usize,
    sets: u64,
    /// Per line: block + 1 (0 = empty).
    tag: Vec<u64>,
    dirty: Vec<bool>,
    /// Per line: last use (LRU).
    used: Vec<u64>,
    tick: u64,
    buf: IoBuf,
}

const LINE: u64 = 4096;

impl SetAssocExec {
    pub fn new(cache: Arc<dyn BlockDevice>, capacity: Arc<dyn BlockDevice>, ways: usize) -> SetAssocExec {
        let lines = cache.info().capacity_bytes / LINE;
        let sets = lines / ways as u64;
        let n = (sets * ways as u64) as usize;
        SetAssocExec {
            cache,
            capacity,
            ways,
            sets,
            tag: vec![0; n],
            dirty: vec![false; n],
            used: vec![0; n],
            tick: 0,
            buf: IoBuf::zeroed(LINE as usize),
        }
    }

    fn set_of(&self, block: u64) -> usize {
        // A multiplicative hash spreads neighbouring blocks over sets.
        let h = block.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ((h >> 20) % self.sets) as usize * self.ways
    }

    fn find(&self, block: u64) -> Option<usize> {
        let s = self.set_of(block);
        (s..s + self.ways).find(|&l| self.tag[l] == block + 1)
    }

    fn io(dev: &dyn BlockDevice, op: IoOp, offset: u64, buf: IoBuf) -> Result<IoBuf, DeviceError> {
        let len = buf.len() as u64;
        let c = sync_io(dev, IoRequest { op, offset, len, buf, fua: false, user_data: 0 });
        c.result.map(|_| c.buf)
    }

    /// The line `block` goes to: its own, a free one, or the LRU one cleaned.
    fn allocate(&mut self, block: u64) -> Result<usize, DeviceError> {
        if let Some(l) = self.find(block) {
            return Ok(l);
        }
        let s = self.set_of(block);
        let victim = (s..s + self.ways).min_by_key(|&l| (self.tag[l] != 0, self.used[l])).expect("ways ≥ 1");
        if self.tag[victim] != 0 && self.dirty[victim] {
            let old = self.tag[victim] - 1;
            let b = std::mem::take(&mut self.buf);
            let b = Self::io(&*self.cache, IoOp::Read, victim as u64 * LINE, b)?;
            self.buf = Self::io(&*self.capacity, IoOp::Write, old * LINE, b)?;
        }
        self.tag[victim] = block + 1;
        self.dirty[victim] = false;
        Ok(victim)
    }
}

impl Executor for SetAssocExec {
    fn execute(&mut self, req: &mut IoRequest) -> Result<u64, DeviceError> {
        match req.op {
            IoOp::Write => {
                for i in 0..req.len / LINE {
                    let block = req.offset / LINE + i;
                    let l = self.allocate(block)?;
                    let mut b = std::mem::take(&mut self.buf);
                    b.copy_from_slice(&req.buf[(i * LINE) as usize..((i + 1) * LINE) as usize]);
                    self.buf = Self::io(&*self.cache, IoOp::Write, l as u64 * LINE, b)?;
                    self.tick += 1;
                    (self.dirty[l], self.used[l]) = (true, self.tick);
                }
            }
            IoOp::Read => {
                // Runs of misses go to the capacity device as one read.
                let blocks = req.len / LINE;
                let mut i = 0;
                while i < blocks {
                    let block = req.offset / LINE + i;
                    let (dev, off, n) = match self.find(block) {
                        Some(l) => {
                            self.tick += 1;
                            self.used[l] = self.tick;
                            (&self.cache, l as u64 * LINE, 1)
                        }
                        None => {
                            let mut n = 1;
                            while i + n < blocks && self.find(block + n).is_none() {
                                n += 1;
                            }
                            (&self.capacity, block * LINE, n)
                        }
                    };
                    let b = Self::io(&**dev, IoOp::Read, off, IoBuf::zeroed((n * LINE) as usize))?;
                    req.buf[(i * LINE) as usize..((i + n) * LINE) as usize].copy_from_slice(&b);
                    i += n;
                }
            }
            IoOp::Discard => {
                for i in 0..req.len / LINE {
                    if let Some(l) = self.find(req.offset / LINE + i) {
                        (self.tag[l], self.dirty[l]) = (0, false);
                    }
                }
                sync_io(&*self.capacity, IoRequest::discard(req.offset, req.len, 0)).result?;
            }
            IoOp::Flush => {
                sync_io(&*self.cache, IoRequest::flush(0)).result?;
                sync_io(&*self.capacity, IoRequest::flush(0)).result?;
            }
            op => return Err(DeviceError::Unsupported(op)),
        }
        Ok(req.len)
    }
}

/// A set-associative write-back cache over `cache` and `capacity` (built on `call.device_clock()`).
pub fn setassoc_stack(
    cache: Arc<dyn BlockDevice>,
    capacity: Arc<dyn BlockDevice>,
    call: Arc<CallTime>,
    ways: usize,
) -> Stack<SetAssocExec> {
    let bytes = capacity.info().capacity_bytes;
    let exec = SetAssocExec::new(cache.clone(), capacity.clone(), ways);
    stack("setassoc", bytes, exec, call, cache, capacity)
}
