//! `SharedDevice`: one device used by many threads at once, each seeing only
//! its own requests.
//!
//! Owns: the routing of completions. A `BlockDevice` is a single queue —
//! `reap` hands back whichever requests finished, whoever submitted them —
//! so code written as "submit, then reap what I submitted" (`sync_io`, the
//! engine's bounded in-flight segment writes) works only while one thread
//! owns the device. This wrapper tags every request with a private id,
//! remembers the submitting thread, and routes each completion back to it:
//! `reap` and `in_flight` answer for the calling thread alone. One thread
//! at a time reaps the inner device (the *reaper*); the others wait on a
//! condition variable and are woken when their completions arrive or when
//! the reaper role is free.
//!
//! Invariants: every tag in `owner` is in flight on the inner device; a
//! completion is delivered exactly once, to the thread that submitted it,
//! with the caller's `user_data` restored; `inflight[t]` counts thread t's
//! requests submitted and not yet returned by its `reap`.
//!
//! Why: the engine used to do every device I/O under its one lock, so a
//! slow read (emulated QLC, a real disk) held up every other request. With
//! this, reads run outside the lock, concurrently, while the engine's own
//! writes keep their simple submit-then-reap shape.

use crate::device::{
    thread_no, BlockDevice, DeviceError, DeviceInfo, DeviceStats, IoCompletion, IoRequest, ZonedDevice,
};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Per thread with requests: how many are out, and the completions
/// delivered to it. A handful of threads at a time, so a short vector
/// searched in order beats hashing.
struct Waiter {
    thread: u64,
    inflight: usize,
    done: Vec<IoCompletion>,
}

#[derive(Default)]
struct Routing {
    /// Tag (index) → (submitting thread, its user_data) while in flight.
    owner: Vec<Option<(u64, u64)>>,
    /// Free indexes of `owner`.
    free_tags: Vec<u64>,
    waiters: Vec<Waiter>,
    /// A thread is inside the inner device's `reap`.
    reaping: bool,
}

impl Routing {
    fn waiter(&mut self, thread: u64) -> Option<&mut Waiter> {
        self.waiters.iter_mut().find(|w| w.thread == thread)
    }
}

/// A device many threads may use at once (see the module doc).
pub struct SharedDevice {
    dev: Arc<dyn BlockDevice>,
    routing: Mutex<Routing>,
    wake: Condvar,
}

impl SharedDevice {
    pub fn new(dev: Arc<dyn BlockDevice>) -> SharedDevice {
        SharedDevice { dev, routing: Mutex::new(Routing::default()), wake: Condvar::new() }
    }

    /// `dev` usable by many threads at once: wrapped, unless it already is
    /// a shared device (never wrapped twice).
    pub fn wrap(dev: Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice> {
        if dev.is_shared() {
            dev
        } else {
            Arc::new(SharedDevice::new(dev))
        }
    }

    fn lock(&self) -> MutexGuard<'_, Routing> {
        // Routing holds no invariant a panicking holder could half-update
        // in a way later callers would misread: keep going.
        self.routing.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Move the calling thread's delivered completions into `out`; returns
    /// (moved, still in flight). A thread with nothing out leaves the list.
    fn take_mine(r: &mut Routing, me: u64, out: &mut Vec<IoCompletion>) -> (usize, usize) {
        let Some(i) = r.waiters.iter().position(|w| w.thread == me) else { return (0, 0) };
        let w = &mut r.waiters[i];
        let n = w.done.len();
        out.append(&mut w.done);
        w.inflight -= n;
        let left = w.inflight;
        if left == 0 {
            r.waiters.swap_remove(i);
        }
        (n, left)
    }
}

impl BlockDevice for SharedDevice {
    fn info(&self) -> &DeviceInfo {
        self.dev.info()
    }

    fn submit(&self, mut req: IoRequest) {
        let me = thread_no();
        {
            let mut r = self.lock();
            let tag = match r.free_tags.pop() {
                Some(t) => t,
                None => {
                    r.owner.push(None);
                    r.owner.len() as u64 - 1
                }
            };
            r.owner[tag as usize] = Some((me, req.user_data));
            match r.waiter(me) {
                Some(w) => w.inflight += 1,
                None => r.waiters.push(Waiter { thread: me, inflight: 1, done: Vec::new() }),
            }
            req.user_data = tag;
        }
        // Outside the routing lock: a device may take its time to accept.
        self.dev.submit(req);
    }

    fn reap(&self, min: usize, out: &mut Vec<IoCompletion>) -> usize {
        let me = thread_no();
        let mut got = 0;
        let mut r = self.lock();
        loop {
            let (n, outstanding) = Self::take_mine(&mut r, me, out);
            got += n;
            if got >= min || outstanding == 0 {
                return got;
            }
            if r.reaping {
                r = self.wake.wait(r).unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            // Become the reaper: wait on the inner device without the lock.
            r.reaping = true;
            drop(r);
            let mut batch = Vec::new();
            // Should the device's reap panic, the role is still given back
            // and the waiters woken (else every later reap would hang).
            let give_back = GiveBack(self);
            self.dev.reap(1, &mut batch);
            // Normally the role is given back only with the completions
            // routed, in one hold of the lock: a waiter woken earlier would
            // find its completion in nobody's hands and wait on the device
            // for the next one.
            std::mem::forget(give_back);
            r = self.lock();
            r.reaping = false;
            let mut others = false;
            for mut c in batch {
                let tag = c.user_data;
                let (owner, user_data) = r.owner[tag as usize].take().expect("every completion was submitted here");
                r.free_tags.push(tag);
                c.user_data = user_data;
                others |= owner != me;
                r.waiter(owner).expect("a thread with requests out is listed").done.push(c);
            }
            // Others may be waiting for what came in, or for the reaper role.
            if others || r.waiters.len() > 1 {
                self.wake.notify_all();
            }
        }
    }

    fn in_flight(&self) -> usize {
        let me = thread_no();
        self.lock().waiter(me).map_or(0, |w| w.inflight)
    }

    fn stats(&self) -> DeviceStats {
        self.dev.stats()
    }

    fn flush_now(&self) -> Option<Result<(), DeviceError>> {
        self.dev.flush_now()
    }

    fn as_zoned(&self) -> Option<&dyn ZonedDevice> {
        self.dev.as_zoned()
    }

    fn is_shared(&self) -> bool {
        true
    }

    /// A request completed in the caller's thread needs no routing.
    fn execute_now(&self, req: IoRequest) -> Result<IoCompletion, IoRequest> {
        self.dev.execute_now(req)
    }

    fn runs_inline(&self) -> bool {
        self.dev.runs_inline()
    }
}

/// Gives the reaper role back when dropped: only while unwinding from a
/// panic in the inner reap (the normal path forgets it).
struct GiveBack<'a>(&'a SharedDevice);

impl Drop for GiveBack<'_> {
    fn drop(&mut self) {
        self.0.lock().reaping = false;
        self.0.wake.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{read_at, write_at};
    use crate::{IoBuf, MemoryDevice};

    #[test]
    fn each_thread_reaps_only_its_own_requests() {
        let dev = Arc::new(SharedDevice::new(Arc::new(MemoryDevice::new(1 << 20, 4096))));
        // Another thread's request stays in flight, unreaped, while this
        // thread does synchronous I/O: its reap must not take that one.
        let other = {
            let dev = dev.clone();
            std::thread::spawn(move || {
                dev.submit(IoRequest::write(0, IoBuf::from_slice(&[7u8; 4096]), 41));
                assert_eq!(dev.in_flight(), 1);
                std::thread::sleep(std::time::Duration::from_millis(50));
                let mut out = Vec::new();
                assert_eq!(dev.reap(1, &mut out), 1);
                assert_eq!(out[0].user_data, 41, "the caller's user_data comes back");
                assert_eq!(dev.in_flight(), 0);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(10));
        assert_eq!(dev.in_flight(), 0, "in_flight counts the calling thread's requests");
        write_at(&*dev, 8192, &[9u8; 4096]).unwrap();
        assert_eq!(&read_at(&*dev, 8192, 4096).unwrap()[..], &[9u8; 4096][..]);
        other.join().unwrap();
        assert_eq!(&read_at(&*dev, 0, 4096).unwrap()[..], &[7u8; 4096][..]);
    }

    /// A memory device whose first `reap` panics.
    struct PanicsOnce {
        dev: MemoryDevice,
        panicked: std::sync::atomic::AtomicBool,
    }

    impl BlockDevice for PanicsOnce {
        fn info(&self) -> &DeviceInfo {
            self.dev.info()
        }
        fn submit(&self, req: IoRequest) {
            self.dev.submit(req)
        }
        fn reap(&self, min: usize, out: &mut Vec<IoCompletion>) -> usize {
            if !self.panicked.swap(true, std::sync::atomic::Ordering::SeqCst) {
                panic!("injected: the device's reap fails");
            }
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
    fn a_reaper_that_panics_gives_the_role_back() {
        let inner = PanicsOnce { dev: MemoryDevice::new(1 << 20, 4096), panicked: Default::default() };
        let dev = Arc::new(SharedDevice::new(Arc::new(inner)));
        let d = dev.clone();
        let died = std::thread::spawn(move || write_at(&*d, 0, &[1u8; 4096])).join();
        assert!(died.is_err(), "the injected panic reached the caller");
        // Another thread can still reap: the role was given back.
        let d = dev.clone();
        let ok = std::thread::spawn(move || {
            write_at(&*d, 4096, &[2u8; 4096]).unwrap();
            read_at(&*d, 4096, 4096).unwrap()[0]
        });
        assert_eq!(ok.join().unwrap(), 2);
        assert!(dev.is_shared());
    }

    #[test]
    fn many_threads_doing_synchronous_io_each_get_their_data() {
        let dev = Arc::new(SharedDevice::new(Arc::new(MemoryDevice::new(64 * 4096, 4096))));
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let dev = dev.clone();
                std::thread::spawn(move || {
                    for round in 0..500u32 {
                        let block = (t as u64 * 8 + (round as u64 % 8)) * 4096;
                        let fill = t.wrapping_mul(31).wrapping_add(round as u8);
                        write_at(&*dev, block, &[fill; 4096]).unwrap();
                        assert_eq!(read_at(&*dev, block, 4096).unwrap()[4095], fill, "thread {t} round {round}");
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(dev.in_flight(), 0);
    }
}
