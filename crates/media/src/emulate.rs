//! `Emulated<M>`: the shared machinery of every emulated medium.
//!
//! A `MediaModel` owns a medium's rules and costs: it validates a request
//! against the medium's state (a ZNS write pointer, say), updates that state,
//! charges media counters and returns the time the request completes. This
//! wrapper owns everything else, once for all media: range checks, the queue
//! depth bound, the backend that actually holds the bytes, host counters, busy
//! time, and completion ordering on the injected clock.
//!
//! Invariants: completions are reaped in (completion time, submission order);
//! time never runs backwards; a rejected request changes neither the model
//! nor the backend. Under a `VirtualClock`, reaping jumps time forward to the
//! completion, so runs are deterministic and as fast as the CPU allows.

use crate::clock::ClockRef;
use crate::device::{
    check_range, sync_io, BlockDevice, DeviceError, DeviceInfo, DeviceStats, IoCompletion, IoRequest, ZoneDesc,
    ZoneLimits, ZonedDevice,
};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;

/// What the backend must do for a request the model accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum BackendAction {
    /// Perform the (possibly rewritten) request on the backend.
    Forward,
    /// Discard a byte range on the backend (zone reset).
    Discard { offset: u64, len: u64 },
    /// Nothing to store (flush, zone open/close/finish).
    Nothing,
}

/// The model's verdict on one request.
#[derive(Debug)]
pub struct Service {
    /// Completion time on the device clock.
    pub done_ns: u64,
    /// Overrides the completion value (zone append returns the offset written).
    pub value: Option<u64>,
    pub backend: BackendAction,
}

/// A medium's rules and costs.
pub trait MediaModel: Send {
    /// Accept or reject `req` submitted at `now_ns`. On acceptance update the
    /// medium's state and `media` counters (program/read bytes, erases). It may
    /// rewrite `req` (zone append becomes a write at the write pointer). On
    /// rejection nothing may change.
    fn service(&mut self, req: &mut IoRequest, now_ns: u64, media: &mut DeviceStats) -> Result<Service, DeviceError>;

    /// Zone geometry and limits, for zoned media.
    fn zone_limits(&self) -> Option<ZoneLimits> {
        None
    }

    /// Report zones, for zoned media.
    fn report_zones(&self, _from: u64, _max: usize) -> Vec<ZoneDesc> {
        Vec::new()
    }

    /// Whether the medium reorders its queue (an HDD's NCQ). If so, requests
    /// are served lazily: whenever the medium is free (`free_at`), `pick`
    /// chooses among those already submitted, and `service` runs then.
    fn reorders(&self) -> bool {
        false
    }

    /// When the medium can start its next request (reordering media).
    fn free_at(&self) -> u64 {
        0
    }

    /// Which of `candidates` (submitted by `now_ns`, oldest first, none
    /// overlapping an older queued request) to serve at `now_ns`.
    fn pick(&self, _candidates: &[&IoRequest], _submitted_ns: &[u64], _now_ns: u64) -> usize {
        0
    }
}

/// A completion waiting for its time: ordered by (completion time,
/// submission sequence), so a min-heap of them reaps in device order. Shared
/// with every simulated device that queues completions (bench stacks).
pub struct Pending(pub IoCompletion, pub u64);

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.0.completed_ns, self.1) == (o.0.completed_ns, o.1)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.0.completed_ns, self.1).cmp(&(o.0.completed_ns, o.1))
    }
}

struct State<M> {
    model: M,
    pending: BinaryHeap<Reverse<Pending>>,
    /// Reordering media: requests submitted and not yet served, oldest first,
    /// each with its submission time.
    queued: std::collections::VecDeque<(IoRequest, u64)>,
    seq: u64,
    stats: DeviceStats,
    busy_until_ns: u64,
}

pub struct Emulated<M: MediaModel> {
    info: DeviceInfo,
    clock: ClockRef,
    backend: Box<dyn BlockDevice>,
    state: Mutex<State<M>>,
}

impl<M: MediaModel> Emulated<M> {
    /// Wrap `backend` (an untimed device of at least `info.capacity_bytes`).
    pub fn new(info: DeviceInfo, model: M, backend: Box<dyn BlockDevice>, clock: ClockRef) -> Emulated<M> {
        assert!(backend.info().capacity_bytes >= info.capacity_bytes, "backend smaller than the emulated device");
        assert_eq!(info.block_bytes % backend.info().block_bytes, 0, "backend block size must divide the device's");
        Emulated {
            info,
            clock,
            backend,
            state: Mutex::new(State {
                model,
                pending: BinaryHeap::new(),
                queued: std::collections::VecDeque::new(),
                seq: 0,
                stats: DeviceStats::default(),
                busy_until_ns: 0,
            }),
        }
    }

    /// Run `f` on the model (for inspection in tests and reports).
    pub fn with_model<R>(&self, f: impl FnOnce(&M) -> R) -> R {
        f(&self.state.lock().expect("emulator lock").model)
    }

    pub fn clock(&self) -> &ClockRef {
        &self.clock
    }
}

impl<M: MediaModel> BlockDevice for Emulated<M> {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&self, req: IoRequest) {
        let now = self.clock.now_ns();
        let mut st = self.state.lock().expect("emulator lock");
        let st = &mut *st;
        let reorders = st.model.reorders();
        // (Only reordering media queue requests before serving them.)
        let refused = if st.pending.len() + st.queued.len() >= self.info.queue_depth_max {
            Some(DeviceError::QueueFull { queue_depth_max: self.info.queue_depth_max })
        } else if reorders {
            // Checked now: served later, a bad request would fail late.
            check_range(&self.info, &req).err()
        } else {
            None
        };
        match refused {
            Some(e) => {
                st.stats.count_host(req.op, req.len, false);
                st.seq += 1;
                let c = IoCompletion { submitted_ns: now, completed_ns: now, ..IoCompletion::untimed(req, Err(e)) };
                st.pending.push(Reverse(Pending(c, st.seq)));
            }
            None if reorders => st.queued.push_back((req, now)),
            None => self.serve(st, req, now, now),
        }
    }

    fn reap(&self, min: usize, out: &mut Vec<IoCompletion>) -> usize {
        let mut n = 0;
        // Completions up to here are due: the clock said so, or we waited for them.
        let mut waited = 0;
        loop {
            let mut st = self.state.lock().expect("emulator lock");
            if st.pending.is_empty() && !st.queued.is_empty() {
                self.schedule_one(&mut st);
            }
            let Some(Reverse(head)) = st.pending.peek() else { return n };
            let due = head.0.completed_ns;
            if due > waited && due > self.clock.now_ns() {
                if n >= min {
                    return n;
                }
                // Wait without the lock, so a live device keeps accepting work.
                drop(st);
                self.clock.wait_until(due);
                waited = due;
                continue;
            }
            let Reverse(Pending(c, _)) = st.pending.pop().expect("peeked");
            out.push(c);
            n += 1;
        }
    }

    fn in_flight(&self) -> usize {
        let st = self.state.lock().expect("emulator lock");
        st.pending.len() + st.queued.len()
    }

    fn next_completion_ns(&self) -> Option<u64> {
        let mut st = self.state.lock().expect("emulator lock");
        if st.pending.is_empty() && !st.queued.is_empty() {
            self.schedule_one(&mut st);
        }
        st.pending.peek().map(|Reverse(p)| p.0.completed_ns)
    }

    fn stats(&self) -> DeviceStats {
        self.state.lock().expect("emulator lock").stats
    }

    fn as_zoned(&self) -> Option<&dyn ZonedDevice> {
        if self.info.zoned {
            Some(self)
        } else {
            None
        }
    }
}

impl<M: MediaModel> Emulated<M> {
    /// Reordering media: serve the request the model picks among those
    /// submitted by the time the medium is free. A flush waits until every
    /// request before it was served; a request overlapping an older queued
    /// one waits for it (data order is kept).
    fn schedule_one(&self, st: &mut State<M>) {
        let first_submit = st.queued.front().map_or(0, |q| q.1);
        let t = st.model.free_at().max(first_submit);
        let mut idx: Vec<usize> = Vec::new();
        for (i, (r, sub)) in st.queued.iter().enumerate() {
            if *sub > t {
                break;
            }
            if r.op == crate::device::IoOp::Flush {
                if i == 0 {
                    idx.push(0);
                }
                break;
            }
            let overlaps =
                st.queued.iter().take(i).any(|(o, _)| o.offset < r.offset + r.len && r.offset < o.offset + o.len);
            if !overlaps {
                idx.push(i);
            }
        }
        let chosen = if idx.is_empty() {
            0
        } else {
            let cands: Vec<&IoRequest> = idx.iter().map(|&i| &st.queued[i].0).collect();
            let subs: Vec<u64> = idx.iter().map(|&i| st.queued[i].1).collect();
            idx[st.model.pick(&cands, &subs, t).min(idx.len() - 1)]
        };
        let (req, submitted) = st.queued.remove(chosen).expect("a queued request");
        self.serve(st, req, submitted, t);
    }

    /// Run `req` (submitted at `submitted_ns`) through the model at `now`,
    /// then the backend, and queue its completion.
    fn serve(&self, st: &mut State<M>, mut req: IoRequest, submitted_ns: u64, now: u64) {
        // The model may rewrite the request (zone append becomes a write at the
        // write pointer); the completion still names what the caller submitted.
        let op = req.op;
        let mut done_ns = now;
        let result = {
            check_range(&self.info, &req).and_then(|_| st.model.service(&mut req, now, &mut st.stats)).and_then(|svc| {
                debug_assert!(svc.done_ns >= now, "completion before submission");
                done_ns = svc.done_ns;
                let len = req.len;
                match svc.backend {
                    BackendAction::Forward => {
                        let fwd = IoRequest {
                            op: req.op,
                            offset: req.offset,
                            len,
                            buf: std::mem::take(&mut req.buf),
                            fua: req.fua,
                            user_data: 0,
                        };
                        let c = sync_io(&*self.backend, fwd);
                        req.buf = c.buf;
                        c.result?;
                    }
                    BackendAction::Discard { offset, len } => {
                        sync_io(&*self.backend, IoRequest::discard(offset, len, 0)).result?;
                    }
                    BackendAction::Nothing => {}
                }
                Ok(svc.value.unwrap_or(len))
            })
        };
        st.stats.count_host(op, req.len, result.is_ok());
        if result.is_ok() {
            let start = now.max(st.busy_until_ns);
            if done_ns > start {
                st.stats.busy_ns += done_ns - start;
            }
            st.busy_until_ns = st.busy_until_ns.max(done_ns);
        }
        st.seq += 1;
        let c =
            IoCompletion { user_data: req.user_data, op, result, buf: req.buf, submitted_ns, completed_ns: done_ns };
        st.pending.push(Reverse(Pending(c, st.seq)));
    }
}

impl<M: MediaModel> ZonedDevice for Emulated<M> {
    fn zone_limits(&self) -> ZoneLimits {
        self.state.lock().expect("emulator lock").model.zone_limits().expect("zoned model reports limits")
    }
    fn report_zones(&self, from: u64, max: usize) -> Vec<ZoneDesc> {
        self.state.lock().expect("emulator lock").model.report_zones(from, max)
    }
}

/// A resource's booked busy intervals. Unlike `Timelines` (one free-at time) a
/// request ready early may use a gap before work booked for later: programs that
/// wait for a zone's buffer slot are booked in the future, and without backfill
/// they would block other zones' units that are ready now (head-of-line
/// blocking no real controller has, since it acts on events in time order).
#[derive(Clone, Debug, Default)]
pub(crate) struct Bookings {
    /// Sorted, disjoint, non-adjacent (start, end) intervals.
    busy: Vec<(u64, u64)>,
}

impl Bookings {
    /// Drop intervals over by `now_ns` (every later request is ready at or after it).
    pub(crate) fn forget_before(&mut self, now_ns: u64) {
        let done = self.busy.partition_point(|&(_, end)| end <= now_ns);
        self.busy.drain(..done);
    }

    /// Book `dur_ns` in the first gap at or after `ready_ns`; returns the end.
    pub(crate) fn book(&mut self, ready_ns: u64, dur_ns: u64) -> u64 {
        let mut start = ready_ns;
        let mut i = self.busy.partition_point(|&(_, end)| end <= ready_ns);
        while i < self.busy.len() && self.busy[i].0 < start + dur_ns {
            start = start.max(self.busy[i].1);
            i += 1;
        }
        let end = start + dur_ns;
        // Insert at i, merging with touching neighbours.
        let merge_prev = i > 0 && self.busy[i - 1].1 == start;
        let merge_next = i < self.busy.len() && self.busy[i].0 == end;
        match (merge_prev, merge_next) {
            (true, true) => {
                self.busy[i - 1].1 = self.busy[i].1;
                self.busy.remove(i);
            }
            (true, false) => self.busy[i - 1].1 = end,
            (false, true) => self.busy[i].0 = start,
            (false, false) => self.busy.insert(i, (start, end)),
        }
        let j = self.busy.partition_point(|&(_, e)| e < end); // the interval now holding [start, end)
        assert!(self.busy[j].0 <= start && self.busy[j].1 >= end, "booking lost");
        assert!(j + 1 >= self.busy.len() || self.busy[j].1 < self.busy[j + 1].0, "bookings overlap");
        end
    }
}

/// Per-resource busy timelines (dies, channels, actuators): a request that needs
/// a resource starts when both it and the resource are free.
#[derive(Clone, Debug)]
pub struct Timelines {
    free_at_ns: Vec<u64>,
}

impl Timelines {
    pub fn new(n: usize) -> Timelines {
        assert!(n > 0);
        Timelines { free_at_ns: vec![0; n] }
    }

    pub fn len(&self) -> usize {
        self.free_at_ns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.free_at_ns.is_empty()
    }

    /// Occupy resource `i` for `dur_ns` from `max(ready_ns, free)`; returns the end.
    pub fn occupy(&mut self, i: usize, ready_ns: u64, dur_ns: u64) -> u64 {
        let start = ready_ns.max(self.free_at_ns[i]);
        self.free_at_ns[i] = start + dur_ns;
        start + dur_ns
    }

    /// The resource that frees first (ties: lowest index).
    pub fn earliest(&self) -> usize {
        let mut best = 0;
        for (i, &t) in self.free_at_ns.iter().enumerate() {
            if t < self.free_at_ns[best] {
                best = i;
            }
        }
        best
    }

    pub fn free_at(&self, i: usize) -> u64 {
        self.free_at_ns[i]
    }
}

/// Time to move `bytes` at `bytes_per_s`, in ns (rounded up).
pub fn transfer_ns(bytes: u64, bytes_per_s: u64) -> u64 {
    ((bytes as u128 * 1_000_000_000).div_ceil(bytes_per_s as u128)) as u64
}

#[cfg(test)]
mod tests {
    use crate::clock::VirtualClock;
    use crate::device::{flush, write_at, BlockDevice, DeviceInfo, DeviceStats, IoCompletion, IoOp, IoRequest};
    use crate::memory::MemoryDevice;
    use crate::ssd::{ssd_device, SsdProfile};
    use crate::{hdd_device, scm_device, zns_device, HddProfile, ScmProfile, ZnsProfile};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;

    /// A memory backend that counts the flushes and FUA writes reaching it.
    struct Counting {
        dev: MemoryDevice,
        flushes: Arc<AtomicU64>,
        fua_writes: Arc<AtomicU64>,
    }

    impl BlockDevice for Counting {
        fn info(&self) -> &DeviceInfo {
            self.dev.info()
        }
        fn submit(&self, req: IoRequest) {
            if req.op == IoOp::Flush {
                self.flushes.fetch_add(1, Relaxed);
            }
            if req.op == IoOp::Write && req.fua {
                self.fua_writes.fetch_add(1, Relaxed);
            }
            self.dev.submit(req)
        }
        fn reap(&self, min: usize, out: &mut Vec<IoCompletion>) -> usize {
            self.dev.reap(min, out)
        }
        fn in_flight(&self) -> usize {
            self.dev.in_flight()
        }
        fn stats(&self) -> DeviceStats {
            self.dev.stats()
        }
    }

    #[test]
    fn every_emulated_medium_passes_flush_and_fua_to_its_backend() {
        // Large enough for the QLC profile's erase blocks; memory is allocated as written.
        let size = 16u64 << 30;
        type Make = fn(Box<dyn BlockDevice>, u64) -> Box<dyn BlockDevice>;
        let media: Vec<(&str, Make)> = vec![
            ("scm", |b, size| {
                let mut p = ScmProfile::p5800x();
                p.capacity_bytes = size;
                Box::new(scm_device(p, b, VirtualClock::new()))
            }),
            ("qlc", |b, size| Box::new(ssd_device(SsdProfile::qlc(size), b, VirtualClock::new()))),
            ("tlc", |b, size| Box::new(ssd_device(SsdProfile::tlc(size), b, VirtualClock::new()))),
            ("hdd", |b, size| {
                let mut p = HddProfile::hdd_7200();
                p.capacity_bytes = size;
                Box::new(hdd_device(p, b, VirtualClock::new()))
            }),
            ("zns", |b, _| Box::new(zns_device(ZnsProfile::tiny(), b, VirtualClock::new()))),
        ];
        for (name, make) in media {
            let (flushes, fua_writes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
            let backend = Counting {
                dev: MemoryDevice::new(size, 4096),
                flushes: flushes.clone(),
                fua_writes: fua_writes.clone(),
            };
            let dev = make(Box::new(backend), size);
            write_at(&*dev, 0, &[7u8; 4096]).unwrap();
            let fua = IoRequest { fua: true, ..IoRequest::write(4096, crate::IoBuf::from_slice(&[9u8; 4096]), 0) };
            crate::device::sync_io(&*dev, fua).result.unwrap();
            assert_eq!(fua_writes.load(Relaxed), 1, "{name}: a FUA write reaches the backend as FUA");
            flush(&*dev).unwrap();
            assert_eq!(flushes.load(Relaxed), 1, "{name}: a flush reaches the backend");
        }
    }
}
