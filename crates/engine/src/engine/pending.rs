//! A compaction or GC step's segment writes left in flight with their
//! remaps (`Pending`), their blocks copied in from the step's window (or
//! read from the cache) by the thread that submits them, and the remaps
//! applied once the writes completed, only to blocks that did not move
//! meanwhile (`Engine::settle`). The windows steps read outside the lock
//! are step_io.rs's.
//!
//! Why: on slow media a step's writes took milliseconds under the lock
//! every request waits for. Invariants: anything that writes, flushes,
//! closes or collects capacity bands, frees a chunk or writes the
//! checkpoint settles a pending step first; a step's own deferred writes
//! stay in one band per stream and under `CAP_QUEUE_DEPTH`; at most
//! `PENDING_STEPS_MAX` steps are pending at once.

use super::step_io::read_pieces;
use super::{
    sync_io, Arc, BlockDevice, DeviceError, Engine, Inner, IoBuf, IoOp, IoRequest, Loc, Mutex, VolumeError,
    BLOCK_BYTES, BS, CAP_QUEUE_DEPTH,
};

/// Most steps left pending at once (`Inner::pending`): a deferred step
/// settles the earlier ones first when there are this many.
pub(super) const PENDING_STEPS_MAX: usize = 2;

/// A remap that waits for its segment write: (volume, LBA, the cache
/// location the block was moved from, its capacity location).
pub(super) type Remap = (u32, u64, Loc, Loc);

/// Segment writes of a compaction or GC step, not submitted yet, and their
/// remaps, while the step is still under the lock (`write_segments`).
/// Filling a segment with its blocks is a copy, and submitting can cost
/// another (a memory device copies at submission), so the background
/// compactor and an assisting writer do both after they let go of the lock.
#[derive(Default)]
pub(super) struct Deferred {
    pub(super) queued: Vec<QueuedWrite>,
    pub(super) remaps: Vec<Remap>,
    /// Buffers queued writes copy their blocks from (a compaction step's
    /// window): back to the pool with the writes' buffers.
    pub(super) sources: Vec<IoBuf>,
}

/// A queued segment write: its request (header and padding in place), and
/// where its data blocks are still to come from, in order, if they are not
/// in place yet.
pub(super) struct QueuedWrite {
    pub(super) req: IoRequest,
    pub(super) fill: Option<Fill>,
}

/// Where a queued write's blocks come from.
pub(super) enum Fill {
    /// Offsets in the step's sources, one after the other (`Data::Deferred`).
    Sources(Vec<usize>),
    /// Cache blocks (`Data::Cache`), read when the write is filled: a
    /// sealed chunk's blocks stay as they are until it is freed, which
    /// waits for the step to settle.
    Cache(Vec<u64>),
}

impl Deferred {
    /// Where a source added now starts (`Data::Deferred` offsets).
    pub(super) fn next_source_at(&self) -> usize {
        self.sources.iter().map(|s| s.len()).sum()
    }
}

/// Copy each queued write's blocks into it, from `sources` or read from
/// `cache`; the requests, in order, or the first read error (then none is
/// to be submitted).
fn filled(queued: Vec<QueuedWrite>, sources: &[IoBuf], cache: &dyn BlockDevice) -> Result<Vec<IoRequest>, DeviceError> {
    let block = |mut at: usize| {
        for s in sources {
            if at < s.len() {
                return &s[at..at + BLOCK_BYTES];
            }
            at -= s.len();
        }
        unreachable!("a queued block lies in a source of its step")
    };
    let mut out = Vec::with_capacity(queued.len());
    for QueuedWrite { mut req, fill } in queued {
        match fill {
            None => {}
            Some(Fill::Sources(offs)) => {
                for (i, at) in offs.into_iter().enumerate() {
                    req.buf[(i + 1) * BLOCK_BYTES..(i + 2) * BLOCK_BYTES].copy_from_slice(block(at));
                }
            }
            Some(Fill::Cache(blocks)) => {
                let buf = std::mem::replace(&mut req.buf, IoBuf::empty());
                req.buf = read_after_header(cache, &blocks, buf)?;
            }
        }
        out.push(req);
    }
    Ok(out)
}

/// Read cache `blocks` into `buf` after its first block (a segment's
/// header, kept). Consecutive blocks — a sequential stream's — come in one
/// read straight into `buf`, with the cache block before them standing in
/// for the header until it is put back: no copy, where reading into pieces
/// and copying cost 3 % of the server's CPU on 128 KiB sequential writes.
fn read_after_header(cache: &dyn BlockDevice, blocks: &[u64], mut buf: IoBuf) -> Result<IoBuf, DeviceError> {
    let n = blocks.len();
    let consecutive = blocks.windows(2).all(|w| w[1] == w[0] + 1);
    if !consecutive || blocks.first().is_none_or(|&b| b == 0) || buf.len() < (n + 1) * BLOCK_BYTES {
        read_blocks_into(cache, blocks, &mut buf[BLOCK_BYTES..])?;
        return Ok(buf);
    }
    let header: Vec<u8> = buf[..BLOCK_BYTES].to_vec();
    let full = buf.len();
    let len = (n + 1) * BLOCK_BYTES;
    buf.set_len(len);
    let req =
        IoRequest { op: IoOp::Read, offset: (blocks[0] - 1) * BS, len: len as u64, buf, fua: false, user_data: 0 };
    let c = sync_io(cache, req);
    c.result?;
    let mut buf = c.buf;
    buf.set_len(full);
    buf[..BLOCK_BYTES].copy_from_slice(&header);
    Ok(buf)
}

/// Read cache `blocks` into `out`, one after the other: each run of
/// consecutive blocks in one request, a few in flight.
fn read_blocks_into(cache: &dyn BlockDevice, blocks: &[u64], out: &mut [u8]) -> Result<(), DeviceError> {
    let mut pieces: Vec<(u64, u64, usize)> = Vec::new();
    for (i, &b) in blocks.iter().enumerate() {
        match pieces.last_mut() {
            Some((off, len, _)) if *off + *len == b * BS => *len += BS,
            _ => pieces.push((b * BS, BS, i * BLOCK_BYTES)),
        }
    }
    read_pieces(cache, &pieces, out, CAP_QUEUE_DEPTH)
}

/// The writes of the background compactor's last step, in flight without
/// the engine lock, and the remaps that wait for them (`Engine::settle`).
/// Until they are applied every moved block is still read from the cache,
/// whose chunk is not freed before its last step settles.
pub(super) struct Pending {
    io: Arc<PendingIo>,
    remaps: Vec<Remap>,
}

/// Completions of a pending step: reaped by the thread that submitted
/// them (a shared device routes completions to their submitter), published
/// for whichever thread applies the remaps.
pub(super) struct PendingIo {
    owner: std::thread::ThreadId,
    writes: usize,
    /// Writes still to be filled and submitted (in order) by the owner
    /// before it reaps, and their sources.
    queued: Mutex<(Vec<QueuedWrite>, Vec<IoBuf>)>,
    done: Mutex<Option<(Vec<IoBuf>, Option<DeviceError>)>>,
    ready: std::sync::Condvar,
}

impl PendingIo {
    /// On the submitting thread: reap every write of the step, publish.
    /// A device whose reap panics publishes an I/O error instead (through
    /// the drop), so that no one waits under the engine lock forever.
    fn reap(&self, dev: &dyn BlockDevice, cache: &dyn BlockDevice) {
        struct Publish<'a>(&'a PendingIo, Option<(Vec<IoBuf>, Option<DeviceError>)>);
        impl Drop for Publish<'_> {
            fn drop(&mut self) {
                // EIO: the completions are lost with the panic.
                let out = self.1.take().unwrap_or_else(|| (Vec::new(), Some(DeviceError::Io { errno: 5 })));
                *self.0.done.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(out);
                self.0.ready.notify_all();
            }
        }
        let mut publish = Publish(self, None);
        publish.1 = Some(self.submit_and_reap(dev, cache));
    }

    /// On the submitting thread: fill and submit what the step queued, in
    /// order, and reap it; the buffers (the sources' too) and the first error.
    fn submit_and_reap(&self, dev: &dyn BlockDevice, cache: &dyn BlockDevice) -> (Vec<IoBuf>, Option<DeviceError>) {
        let (queued, sources) =
            std::mem::take(&mut *self.queued.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let (mut bufs, err) = match filled(queued, &sources, cache) {
            Ok(reqs) => {
                reqs.into_iter().for_each(|r| dev.submit(r));
                reap_own(dev, self.writes)
            }
            // Nothing written: the step's remaps are never applied.
            Err(e) => (Vec::new(), Some(e)),
        };
        bufs.extend(sources);
        (bufs, err)
    }

    /// The published completions, reaping them first if this thread
    /// submitted them and has not, else waiting for the submitter.
    pub(super) fn take(&self, dev: &dyn BlockDevice, cache: &dyn BlockDevice) -> (Vec<IoBuf>, Option<DeviceError>) {
        let mut done = self.done.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if done.is_none() && std::thread::current().id() == self.owner {
            return self.submit_and_reap(dev, cache);
        }
        loop {
            if let Some(out) = done.take() {
                return out;
            }
            done = self.ready.wait(done).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

/// Reap `n` completions submitted by this thread: their buffers and the
/// first error.
fn reap_own(dev: &dyn BlockDevice, n: usize) -> (Vec<IoBuf>, Option<DeviceError>) {
    let mut out = Vec::with_capacity(n);
    let mut got = 0;
    while got < n {
        got += dev.reap(n - got, &mut out);
    }
    let err = out.iter().find_map(|c| c.result.as_ref().err().cloned());
    (out.into_iter().map(|c| c.buf).collect(), err)
}

impl Inner {
    /// Leave a step's deferred writes, if any, pending (`Engine::settle`).
    pub(super) fn defer_pending(&mut self, deferred: Option<Deferred>) {
        let Some(d) = deferred else { return };
        if d.queued.is_empty() {
            d.sources.into_iter().for_each(|b| self.give_buf(b));
            return;
        }
        let owner = std::thread::current().id();
        let (done, ready) = (Mutex::new(None), std::sync::Condvar::new());
        let writes = d.queued.len();
        assert!(writes <= CAP_QUEUE_DEPTH, "a step left {writes} writes pending, past the queue depth");
        assert!(self.pending.len() < PENDING_STEPS_MAX, "{} steps pending already", self.pending.len());
        let queued = Mutex::new((d.queued, d.sources));
        let io = Arc::new(PendingIo { owner, writes, queued, done, ready });
        self.pending.push(Pending { io, remaps: d.remaps });
        self.pendings_made += 1;
    }

    /// The writes a step left pending (its last act), if it left any since
    /// `pendings_made` was `made`: for the step's thread to fill, submit
    /// and reap without the lock.
    pub(super) fn pending_since(&self, made: u64) -> Option<Arc<PendingIo>> {
        (self.pendings_made > made).then(|| self.pending.last().map(|p| p.io.clone())).flatten()
    }

    /// Apply remaps whose writes completed: a block still where it was
    /// moved from now lives at its copy; one rewritten or trimmed meanwhile
    /// stays as it is (its copy is garbage in the band).
    /// Applies each remap whose block is still where it was copied from;
    /// returns how many were dropped (their copies are garbage).
    fn apply_remaps(&mut self, remaps: &[Remap]) -> Result<u64, VolumeError> {
        let mut dropped = 0;
        for &(vol, lba, from, to) in remaps {
            if self.vols[vol as usize].l2p.get(lba as usize)? == from {
                self.vols[vol as usize].l2p.relocate(lba as usize, to)?;
                self.invalidate(from);
                let b = self.band_of(to).expect("a remap goes to the capacity device");
                self.bands.add_valid(b);
            } else {
                dropped += 1;
            }
        }
        Ok(dropped)
    }
}

impl Engine {
    /// Finish the pending steps, if any, oldest first: their writes
    /// completed (waiting for them), their remaps applied. Everything that
    /// writes to, flushes, closes or collects capacity bands, or frees a
    /// chunk, settles first.
    pub(super) fn settle(&self, inner: &mut Inner) -> Result<(), VolumeError> {
        for p in std::mem::take(&mut inner.pending) {
            self.finish_writes(inner, p.io.take(&*self.capacity, &*self.cache), &p.remaps)?;
        }
        Ok(())
    }

    /// Finish the pending step whose writes `io` stands for, if no one has.
    /// Steps pending together moved different blocks (each walked its own
    /// window), so their remaps may be applied in any order.
    pub(super) fn settle_one(&self, inner: &mut Inner, io: &Arc<PendingIo>) -> Result<(), VolumeError> {
        let Some(i) = inner.pending.iter().position(|p| Arc::ptr_eq(&p.io, io)) else { return Ok(()) };
        let p = inner.pending.remove(i);
        self.finish_writes(inner, p.io.take(&*self.capacity, &*self.cache), &p.remaps)
    }

    /// The same for writes of the step still under the lock (its sources
    /// stay: later writes of the step may copy from them).
    pub(super) fn settle_deferred(&self, inner: &mut Inner, d: &mut Deferred) -> Result<(), VolumeError> {
        let writes = d.queued.len();
        let reqs = filled(std::mem::take(&mut d.queued), &d.sources, &*self.cache)?;
        reqs.into_iter().for_each(|r| self.capacity.submit(r));
        let done = reap_own(&*self.capacity, writes);
        self.finish_writes(inner, done, &std::mem::take(&mut d.remaps))
    }

    /// Completed segment writes (their buffers, the first error): buffers
    /// back to the pool, then, if all succeeded, the remaps that waited for
    /// them; those dropped (the block moved on) are counted as superseded.
    fn finish_writes(
        &self,
        inner: &mut Inner,
        (bufs, err): (Vec<IoBuf>, Option<DeviceError>),
        remaps: &[Remap],
    ) -> Result<(), VolumeError> {
        bufs.into_iter().for_each(|b| inner.give_buf(b));
        if let Some(e) = err {
            return Err(e.into());
        }
        let dropped = inner.apply_remaps(remaps)?;
        self.bg.copies_superseded.fetch_add(dropped, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Without the lock, on the thread that submitted them: reap the
    /// pending step's writes so that the remaps can be applied.
    pub(super) fn reap_pending(&self, io: &Arc<PendingIo>) {
        io.reap(&*self.capacity, &*self.cache);
    }
}

impl Pending {
    #[cfg(test)]
    pub(super) fn remaps(&self) -> &[Remap] {
        &self.remaps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::*;
    use crate::testkit::{assert_reads_as, pattern, small_world};

    /// A step's copies of blocks rewritten or trimmed before its remaps
    /// settle are dropped, counted as superseded, and every block reads its
    /// latest version (the rewrite's, or zeros after the trim).
    #[test]
    fn copies_overtaken_before_settling_are_counted_and_not_remapped() {
        let w = small_world(&[256]);
        let mut model = vec![vec![0u64; 256]];
        // Two of the log's seven chunks (a single write is a header and a
        // block): one full, and far from inline compaction, which settles.
        for lba in 0..40 {
            w.volumes[0].write(lba * 4096, &pattern(0, lba, 1), false).unwrap();
            model[0][lba as usize] = 1;
        }
        assert!(w.engine.compact_some_leaving_remaps(8).unwrap());
        let lbas: Vec<u64> =
            w.engine.lock().pending.last().expect("remaps left pending").remaps().iter().map(|r| r.1).collect();
        assert!(lbas.len() >= 3, "{lbas:?}");
        for &lba in &lbas[..2] {
            w.volumes[0].write(lba * 4096, &pattern(0, lba, 2), false).unwrap();
            model[0][lba as usize] = 2;
        }
        w.volumes[0].trim(lbas[2] * 4096, 4096).unwrap();
        model[0][lbas[2] as usize] = 0;
        assert!(!w.engine.lock().pending.is_empty(), "nothing settled the step meanwhile");
        w.engine.compact_some(8).unwrap(); // settles the first step
        assert_eq!(w.engine.snapshot().compactor.copies_superseded, 3);
        assert_reads_as(&w, &model);
        w.engine.check_invariants();
    }

    /// A device whose reap panics while the compactor waits, unlocked, for
    /// a pending step's writes: the step is published as failed, so a
    /// request settling it under the engine lock gets an error instead of
    /// waiting forever.
    #[test]
    fn a_pending_step_whose_reap_panics_is_published_as_failed() {
        use sluice_media::MemoryDevice;
        struct PanicsOnReap(MemoryDevice);
        impl BlockDevice for PanicsOnReap {
            fn info(&self) -> &sluice_media::DeviceInfo {
                self.0.info()
            }
            fn submit(&self, req: IoRequest) {
                self.0.submit(req)
            }
            fn reap(&self, _min: usize, _out: &mut Vec<sluice_media::IoCompletion>) -> usize {
                panic!("injected: the device's reap fails");
            }
            fn in_flight(&self) -> usize {
                self.0.in_flight()
            }
            fn stats(&self) -> sluice_media::DeviceStats {
                self.0.stats()
            }
        }
        let dev = Arc::new(PanicsOnReap(MemoryDevice::new(1 << 20, 4096)));
        dev.submit(IoRequest::write(0, IoBuf::zeroed(4096), 0));
        let owner = std::thread::current().id();
        let (queued, done, ready) = (Mutex::new(Default::default()), Mutex::new(None), std::sync::Condvar::new());
        let io = Arc::new(PendingIo { owner, writes: 1, queued, done, ready });
        let reaped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| io.reap(&*dev, &*dev)));
        assert!(reaped.is_err(), "the injected panic reached the compactor");
        let (tx, rx) = std::sync::mpsc::channel();
        let (io2, dev2) = (io.clone(), dev.clone());
        std::thread::spawn(move || tx.send(io2.take(&*dev2, &*dev2).1));
        let err = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("the settling thread was answered");
        assert_eq!(err, Some(DeviceError::Io { errno: 5 }));
    }

    /// A bounded step as the background compactor takes it submits its
    /// segment writes after it let go of the engine lock (a memory device
    /// copies the data at submission), while inline compaction, which runs
    /// inside a request, writes under it.
    #[test]
    fn background_steps_submit_their_segment_writes_without_the_lock() {
        use crate::testkit::{small_device_bytes, small_world_on};
        use sluice_media::MemoryDevice;
        use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
        /// Counts the writes submitted while the engine lock is held.
        struct Watch {
            dev: MemoryDevice,
            engine: std::sync::OnceLock<std::sync::Weak<Engine>>,
            writes: AtomicUsize,
            locked: AtomicUsize,
        }
        impl BlockDevice for Watch {
            fn info(&self) -> &sluice_media::DeviceInfo {
                self.dev.info()
            }
            fn submit(&self, req: IoRequest) {
                if let (IoOp::Write, Some(e)) = (req.op, self.engine.get().and_then(|w| w.upgrade())) {
                    self.writes.fetch_add(1, Relaxed);
                    if e.inner.try_lock().is_err() {
                        self.locked.fetch_add(1, Relaxed);
                    }
                }
                self.dev.submit(req)
            }
            fn reap(&self, min: usize, out: &mut Vec<sluice_media::IoCompletion>) -> usize {
                self.dev.reap(min, out)
            }
            fn in_flight(&self) -> usize {
                self.dev.in_flight()
            }
            fn stats(&self) -> sluice_media::DeviceStats {
                self.dev.stats()
            }
        }
        let (c, p) = small_device_bytes(&[256]);
        let watch = Arc::new(Watch {
            dev: MemoryDevice::new(p, 4096),
            engine: Default::default(),
            writes: AtomicUsize::new(0),
            locked: AtomicUsize::new(0),
        });
        let w = small_world_on(Arc::new(MemoryDevice::new(c, 4096)), watch.clone(), &[256]);
        watch.engine.set(Arc::downgrade(&w.engine)).ok();
        for lba in 0..40 {
            w.volumes[0].write(lba * 4096, &pattern(0, lba, 1), false).unwrap();
        }
        let counts = || (watch.writes.load(Relaxed), watch.locked.load(Relaxed));
        assert_eq!(counts(), (0, 0), "nothing compacted yet");
        assert!(w.engine.compact_some_leaving_remaps(8).unwrap());
        let (writes, locked) = counts();
        assert!(writes > 0 && locked == 0, "{writes} segment writes, {locked} of them under the lock");
        // Inline compaction (the log full under a request) writes under it.
        for i in 0..400 {
            w.volumes[0].write((i % 256) * 4096, &pattern(0, i % 256, 2), false).unwrap();
        }
        assert!(counts().1 > 0, "inline compaction submits under the lock");
        w.engine.check_invariants();
    }
}
