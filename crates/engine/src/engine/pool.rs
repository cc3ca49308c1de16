//! The engine's reusable I/O buffers.
//!
//! Owns: the buffers compaction, GC and log appends borrow for one device
//! request each (they move megabytes per call; a fresh allocation would cost
//! a zeroed page per 4 KiB), and each writer thread's own record buffers
//! (`take_thread_buf`), which the concurrent write path fills without the
//! engine lock.
//!
//! Invariants: at most `BUFS_MAX` buffers are kept, and together at most the
//! byte bound the caller passes to `give`; a buffer handed out has exactly
//! the length asked for (its contents are whatever it last held).
//!
//! Why by capacity, not by exact length: records and segments vary in
//! length with every group commit, so an exact-size pool missed and every
//! miss paid for fresh zeroed pages. Allocations are rounded up to a power of
//! two and a request takes the smallest pooled buffer of 1–2× its size, so a
//! small record never takes the buffer the next chunk read needs.

use super::{Inner, BLOCK_BYTES, BS};
use crate::volume::VolumeError;
use sluice_media::device::sync_io;
use sluice_media::{BlockDevice, IoBuf, IoOp, IoRequest};

/// Most buffers kept: a full capacity queue twice over.
const BUFS_MAX: usize = 2 * super::CAP_QUEUE_DEPTH;

#[derive(Default)]
pub(super) struct BufPool {
    bufs: Vec<IoBuf>,
}

impl BufPool {
    /// A buffer of exactly `len` bytes (contents undefined).
    pub fn take(&mut self, len: usize) -> IoBuf {
        let fits = len.next_power_of_two();
        let best = (self.bufs.iter().enumerate())
            .filter(|(_, b)| (fits..=2 * fits).contains(&b.capacity()))
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        let mut b = match best {
            Some(i) => self.bufs.swap_remove(i),
            None => IoBuf::zeroed(fits),
        };
        b.set_len(len);
        assert_eq!(b.len(), len, "a pooled buffer of the length asked for");
        b
    }

    /// Buffers kept now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.bufs.len()
    }

    /// Keep `b` for later if the pool stays within `BUFS_MAX` buffers and
    /// `bytes_max` bytes; otherwise free it.
    pub fn give(&mut self, b: IoBuf, bytes_max: usize) {
        let held: usize = self.bufs.iter().map(IoBuf::capacity).sum();
        if self.bufs.len() < BUFS_MAX && held + b.capacity() <= bytes_max {
            self.bufs.push(b);
        }
        debug_assert!(self.bufs.len() <= BUFS_MAX, "the pool keeps at most BUFS_MAX buffers");
    }
}

/// Read `len` bytes at `offset` into a pooled buffer.
pub(super) fn read_pooled(
    dev: &dyn BlockDevice,
    inner: &mut Inner,
    offset: u64,
    len: usize,
) -> Result<IoBuf, VolumeError> {
    let buf = inner.take_buf(len);
    let c = sync_io(dev, IoRequest { op: IoOp::Read, offset, len: len as u64, buf, fua: false, user_data: 0 });
    match c.result {
        Ok(_) => Ok(c.buf),
        Err(e) => {
            inner.give_buf(c.buf);
            Err(e.into())
        }
    }
}

impl Inner {
    /// A buffer of exactly `len` bytes from the pool (contents undefined).
    pub(super) fn take_buf(&mut self, len: usize) -> IoBuf {
        self.pool.take(len)
    }

    /// Return a buffer to the pool, which keeps at most four of the largest
    /// reads' worth (a chunk or a GC window, rounded up as it allocates).
    pub(super) fn give_buf(&mut self, b: IoBuf) {
        let bytes_max = 4 * ((self.gc_window_blocks() * BS) as usize).next_power_of_two();
        self.pool.give(b, bytes_max);
    }
}

thread_local! {
    /// Each writer thread's record buffers, kept between batches: a fresh
    /// aligned, zeroed buffer per batch costs more than copying into it,
    /// and a pool shared by every writer would be one more lock.
    static BUFS: std::cell::RefCell<Vec<IoBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Buffers kept per thread, and the largest kept.
const BUFS_KEPT: usize = 4;
const BUF_KEPT_BYTES_MAX: usize = 1 << 20;

/// A buffer of `len` bytes from this thread's own (contents undefined:
/// every byte is written before the buffer goes to a device).
pub(super) fn take_thread_buf(len: usize) -> IoBuf {
    let kept = BUFS.with(|b| {
        let mut b = b.borrow_mut();
        let i = b.iter().position(|x| x.capacity() >= len)?;
        Some(b.swap_remove(i))
    });
    let mut buf = kept.unwrap_or_else(|| IoBuf::zeroed(len.next_power_of_two().max(2 * BLOCK_BYTES)));
    buf.set_len(len);
    buf
}

/// A record buffer back to the thread's pool.
pub(super) fn give_thread_buf(buf: IoBuf) {
    if buf.capacity() == 0 || buf.capacity() > BUF_KEPT_BYTES_MAX {
        return;
    }
    BUFS.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < BUFS_KEPT {
            b.push(buf);
        }
    });
}
