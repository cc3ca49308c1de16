//! `StripedDevice`: several devices as one, striped (RAID 0) — the
//! "fewer disks" capacity of the caching experiments (N emulated HDDs).
//!
//! Byte `o` of the striped device lives on member `(o / stripe) % n` at
//! `(o / stripe / n) * stripe + o % stripe`. A request is split at stripe
//! boundaries into one request per piece, all submitted at once, so the
//! members work in parallel; it completes when its last piece does (its
//! completion time is the latest piece's). A flush goes to every member.
//! Reads gather their pieces into the caller's buffer.
//!
//! Reaping keeps device-clock order across members: while every member can
//! say when its next completion is due (`next_completion_ns`, as emulated
//! media do), the earliest is reaped first, so a virtual clock never jumps
//! past a completion another member would deliver sooner; otherwise members
//! are polled in turn.
//!
//! Invariants: every request yields exactly one completion; a piece's error
//! fails the whole request (the first error is kept); stats are the sum of
//! the members'.

use crate::buf::IoBuf;
use crate::device::{BlockDevice, DeviceError, DeviceInfo, DeviceStats, IoCompletion, IoOp, IoRequest};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// One request in flight, waiting for its pieces.
struct Parent {
    user_data: u64,
    op: IoOp,
    len: u64,
    buf: IoBuf,
    left: usize,
    result: Result<u64, DeviceError>,
    submitted_ns: u64,
    completed_ns: u64,
    /// Reads: where each piece's bytes go in `buf` (piece index → offset).
    at: Vec<usize>,
}

#[derive(Default)]
struct State {
    parents: HashMap<u64, Parent>,
    next: u64,
    done: VecDeque<IoCompletion>,
    turn: usize,
    /// Per member, pieces waiting for room in its queue: one request may
    /// split into more pieces than a member takes at once.
    backlog: Vec<VecDeque<IoRequest>>,
}

/// RAID 0 over `members` (module doc).
pub struct StripedDevice {
    members: Vec<Arc<dyn BlockDevice>>,
    stripe: u64,
    info: DeviceInfo,
    state: Mutex<State>,
}

/// Pieces of one request a parent may have (stripe units per request).
const PIECE_BITS: u32 = 16;

impl StripedDevice {
    /// Stripe `members` (at least one, same block size) in units of
    /// `stripe_bytes` (a multiple of the block size). The capacity is the
    /// smallest member's, in whole stripes, times the members.
    pub fn new(members: Vec<Arc<dyn BlockDevice>>, stripe_bytes: u64) -> StripedDevice {
        assert!(!members.is_empty(), "a striped device needs a member");
        let bs = members[0].info().block_bytes;
        assert!(members.iter().all(|m| m.info().block_bytes == bs), "members share a block size");
        assert!(stripe_bytes > 0 && stripe_bytes.is_multiple_of(bs), "the stripe is whole blocks");
        let each =
            members.iter().map(|m| m.info().capacity_bytes).min().expect("members") / stripe_bytes * stripe_bytes;
        let first = members[0].info();
        let info = DeviceInfo {
            name: format!("{}x{}", members.len(), first.name),
            capacity_bytes: each * members.len() as u64,
            block_bytes: bs,
            queue_depth_max: members.iter().map(|m| m.info().queue_depth_max).min().expect("members"),
            optimal_write_bytes: first.optimal_write_bytes,
            zoned: false,
        };
        let state = State { backlog: (0..members.len()).map(|_| VecDeque::new()).collect(), ..State::default() };
        StripedDevice { members, stripe: stripe_bytes, info, state: Mutex::new(state) }
    }

    /// Hand waiting pieces to members with room in their queues.
    fn pump(&self, st: &mut State) {
        for (m, dev) in self.members.iter().enumerate() {
            while !st.backlog[m].is_empty() && dev.in_flight() < dev.info().queue_depth_max {
                dev.submit(st.backlog[m].pop_front().expect("not empty"));
            }
        }
    }

    /// The pieces of [offset, offset + len): (member, member offset, length, offset in the request).
    fn pieces(&self, offset: u64, len: u64) -> Vec<(usize, u64, u64, u64)> {
        let n = self.members.len() as u64;
        let mut out = Vec::new();
        let mut at = 0;
        while at < len {
            let o = offset + at;
            let unit = o / self.stripe;
            let within = o % self.stripe;
            let piece = (self.stripe - within).min(len - at);
            out.push(((unit % n) as usize, (unit / n) * self.stripe + within, piece, at));
            at += piece;
        }
        out
    }

    fn finish(&self, st: &mut State, c: IoCompletion) {
        let (id, piece) = (c.user_data >> PIECE_BITS, (c.user_data & ((1 << PIECE_BITS) - 1)) as usize);
        let p = st.parents.get_mut(&id).expect("a piece of a request in flight");
        p.left -= 1;
        p.completed_ns = p.completed_ns.max(c.completed_ns);
        p.submitted_ns = p.submitted_ns.min(c.submitted_ns);
        match c.result {
            Err(e) if p.result.is_ok() => p.result = Err(e),
            Ok(_) if p.op == IoOp::Read && p.result.is_ok() => {
                let at = p.at[piece];
                p.buf[at..at + c.buf.len()].copy_from_slice(&c.buf);
            }
            _ => {}
        }
        if p.left == 0 {
            let p = st.parents.remove(&id).expect("present");
            st.done.push_back(IoCompletion {
                user_data: p.user_data,
                op: p.op,
                result: p.result.map(|_| p.len),
                buf: p.buf,
                submitted_ns: p.submitted_ns,
                completed_ns: p.completed_ns,
            });
        }
    }
}

impl BlockDevice for StripedDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&self, req: IoRequest) {
        let mut st = self.state.lock().expect("stripe lock");
        let id = st.next;
        st.next += 1;
        let check = crate::device::check_range(&self.info, &req);
        let pieces = match (&check, req.op) {
            (Err(_), _) => Vec::new(),
            (Ok(_), IoOp::Flush) => (0..self.members.len()).map(|m| (m, 0, 0, 0)).collect(),
            (Ok(_), IoOp::Read | IoOp::Write | IoOp::Discard) => self.pieces(req.offset, req.len),
            (Ok(_), _) => Vec::new(),
        };
        let result = match check {
            Err(e) => Err(e),
            Ok(_) if pieces.is_empty() && req.op != IoOp::Flush => Err(DeviceError::Unsupported(req.op)),
            Ok(_) => Ok(req.len),
        };
        if result.is_err() || pieces.len() >= 1 << PIECE_BITS {
            let result = result.and(Err(DeviceError::Unsupported(req.op)));
            st.done.push_back(IoCompletion::untimed(req, result));
            return;
        }
        let mut parent = Parent {
            user_data: req.user_data,
            op: req.op,
            len: req.len,
            buf: req.buf,
            left: pieces.len(),
            result: Ok(0),
            submitted_ns: u64::MAX,
            completed_ns: 0,
            at: Vec::new(),
        };
        let mut subs = Vec::with_capacity(pieces.len());
        for (i, &(m, off, len, at)) in pieces.iter().enumerate() {
            let ud = id << PIECE_BITS | i as u64;
            let sub = match req.op {
                IoOp::Flush => IoRequest::flush(ud),
                IoOp::Discard => IoRequest::discard(off, len, ud),
                IoOp::Write => IoRequest {
                    fua: req.fua,
                    ..IoRequest::write(off, IoBuf::from_slice(&parent.buf[at as usize..(at + len) as usize]), ud)
                },
                _ => {
                    parent.at.push(at as usize);
                    IoRequest::read(off, len as usize, ud)
                }
            };
            if req.op != IoOp::Read {
                parent.at.push(at as usize);
            }
            subs.push((m, sub));
        }
        st.parents.insert(id, parent);
        for (m, sub) in subs {
            st.backlog[m].push_back(sub);
        }
        self.pump(&mut st);
    }

    fn reap(&self, min: usize, out: &mut Vec<IoCompletion>) -> usize {
        let mut n = 0;
        let mut got = Vec::new();
        loop {
            {
                let mut st = self.state.lock().expect("stripe lock");
                while let Some(c) = st.done.pop_front() {
                    out.push(c);
                    n += 1;
                }
                if n >= min || st.parents.is_empty() {
                    return n;
                }
            }
            // The member whose next completion is due first, if all say;
            // else the next busy one in turn.
            let busy: Vec<usize> = (0..self.members.len()).filter(|&m| self.members[m].in_flight() > 0).collect();
            if busy.is_empty() {
                // Pieces are handed over under the lock as soon as there is
                // room, so requests in flight mean a busy member; never wait
                // on idle ones.
                return n;
            }
            let due: Option<Vec<u64>> = busy.iter().map(|&m| self.members[m].next_completion_ns()).collect();
            let m = match due {
                Some(d) => busy[(0..d.len()).min_by_key(|&i| d[i]).expect("busy")],
                None => {
                    let mut st = self.state.lock().expect("stripe lock");
                    st.turn = (st.turn + 1) % busy.len();
                    busy[st.turn]
                }
            };
            got.clear();
            self.members[m].reap(1, &mut got);
            let mut st = self.state.lock().expect("stripe lock");
            for c in got.drain(..) {
                self.finish(&mut st, c);
            }
            self.pump(&mut st);
        }
    }

    fn in_flight(&self) -> usize {
        let st = self.state.lock().expect("stripe lock");
        st.parents.len() + st.done.len()
    }

    fn stats(&self) -> DeviceStats {
        let mut s = DeviceStats::default();
        for m in &self.members {
            let x = m.stats();
            s.reads += x.reads;
            s.writes += x.writes;
            s.flushes += x.flushes;
            s.discards += x.discards;
            s.host_read_bytes += x.host_read_bytes;
            s.host_write_bytes += x.host_write_bytes;
            s.host_discard_bytes += x.host_discard_bytes;
            s.media_program_bytes += x.media_program_bytes;
            s.media_read_bytes += x.media_read_bytes;
            s.erases += x.erases;
            s.busy_ns = s.busy_ns.max(x.busy_ns);
            s.errors += x.errors;
        }
        s
    }

    fn next_completion_ns(&self) -> Option<u64> {
        if !self.state.lock().expect("stripe lock").done.is_empty() {
            return Some(0);
        }
        self.members.iter().filter(|m| m.in_flight() > 0).map(|m| m.next_completion_ns()).min().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::VirtualClock;
    use crate::device::{read_at, write_at};
    use crate::hdd::{hdd_device, HddProfile};
    use crate::memory::MemoryDevice;
    use crate::testutil::{run_queue, span_ns};

    const MIB: u64 = 1 << 20;

    fn disks(n: usize) -> StripedDevice {
        let clock = VirtualClock::new();
        let members: Vec<Arc<dyn BlockDevice>> = (0..n)
            .map(|_| {
                let p = HddProfile { capacity_bytes: 1 << 30, ..HddProfile::hdd_7200() };
                Arc::new(hdd_device(p, Box::new(MemoryDevice::new(1 << 30, 4096)), clock.clone()))
                    as Arc<dyn BlockDevice>
            })
            .collect();
        StripedDevice::new(members, MIB)
    }

    /// Bytes land where the layout says and read back across stripes;
    /// flushes reach every member; a bad range is refused.
    #[test]
    fn data_is_striped_and_reads_back() {
        let d = disks(3);
        assert_eq!(d.info().capacity_bytes, 3 << 30);
        let data: Vec<u8> = (0..5 * MIB).map(|i| (i % 251) as u8).collect();
        write_at(&d, MIB / 2, &data).unwrap();
        assert_eq!(&read_at(&d, MIB / 2, data.len()).unwrap()[..], &data[..]);
        // The second stripe unit is member 1's first.
        let m1 = read_at(&*d.members[1], 0, 4096).unwrap();
        assert_eq!(&m1[..], &data[(MIB / 2) as usize..(MIB / 2) as usize + 4096]);
        crate::device::flush(&d).unwrap();
        assert!(d.members.iter().all(|m| m.stats().flushes == 1));
        assert!(read_at(&d, 3 << 30, 4096).is_err());
    }

    /// A request of more pieces than a member's queue holds (64 MiB over 2
    /// disks of depth 32: 32 pieces each, plus another request's) is
    /// queued, not refused.
    #[test]
    fn a_request_larger_than_the_members_queues_is_served() {
        let d = disks(2);
        let data: Vec<u8> = (0..64 * MIB).map(|i| (i % 241) as u8).collect();
        d.submit(IoRequest::write(0, IoBuf::from_slice(&data), 1));
        d.submit(IoRequest::write(64 * MIB, IoBuf::from_slice(&data[..4096]), 2));
        let mut out = Vec::new();
        while out.len() < 2 {
            d.reap(1, &mut out);
        }
        assert!(out.iter().all(|c| c.result.is_ok()), "{:?}", out.iter().map(|c| &c.result).collect::<Vec<_>>());
        assert_eq!(&read_at(&d, 0, data.len()).unwrap()[..], &data[..]);
    }

    /// Members work in parallel: 1 MiB random reads at QD8 run about n
    /// times faster over n disks, and completions keep clock order.
    #[test]
    fn n_disks_serve_random_reads_about_n_times_faster() {
        let rate = |n: usize| {
            let d = disks(n);
            let span = d.info().capacity_bytes / MIB;
            let mut rng = crate::rng::SplitMix64(3);
            let mut i = 0;
            let out = run_queue(&d, 8, || {
                i += 1;
                (i <= 400).then(|| IoRequest::read(rng.below(span) * MIB, MIB as usize, i))
            });
            assert!(out.windows(2).all(|w| w[0].completed_ns <= w[1].completed_ns), "clock order");
            400.0 * 1e9 / span_ns(&out) as f64
        };
        let (one, four) = (rate(1), rate(4));
        println!("striped HDDs, 1 MiB random reads QD8: 1 disk {one:.1}/s, 4 disks {four:.1}/s");
        assert!(four > 2.5 * one, "{four} vs {one}");
    }
}
