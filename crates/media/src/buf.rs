//! `IoBuf`: an owned, 4096-byte-aligned byte buffer.
//!
//! Requests own their buffers while in flight (the kernel writes into them under
//! io_uring), so a buffer moves into an `IoRequest` and comes back in its
//! `IoCompletion`. The alignment satisfies O_DIRECT on every device we target.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every `IoBuf`, enough for O_DIRECT on 4Kn and 512e devices.
pub const IO_ALIGN_BYTES: usize = 4096;

/// An owned, zero-initialised, `IO_ALIGN_BYTES`-aligned buffer. Its length
/// (what I/O moves) may be set anywhere up to the capacity it was allocated
/// with, so a pool can reuse one allocation for requests of many sizes; every
/// byte up to the capacity was initialised (zeroed) at allocation.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: IoBuf uniquely owns its allocation, like Vec<u8>.
unsafe impl Send for IoBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// A zeroed buffer of `len` bytes (`len` may be 0).
    pub fn zeroed(len: usize) -> IoBuf {
        if len == 0 {
            return IoBuf { ptr: NonNull::dangling(), len: 0, cap: 0 };
        }
        let layout = Layout::from_size_align(len, IO_ALIGN_BYTES).expect("IoBuf layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        IoBuf { ptr, len, cap: len }
    }

    /// An empty buffer, for requests that carry no data (flush, discard).
    pub fn empty() -> IoBuf {
        IoBuf::zeroed(0)
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> IoBuf {
        let mut b = IoBuf::zeroed(data.len());
        b.copy_from_slice(data);
        b
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes allocated: the most `set_len` accepts.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Make the buffer `len` bytes long, keeping its allocation; bytes that
    /// come into view hold whatever the buffer last held (zeros if never
    /// written). Panics if `len` exceeds the capacity (a caller's bug).
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap, "IoBuf::set_len({len}) beyond capacity {}", self.cap);
        self.len = len;
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if self.cap != 0 {
            let layout = Layout::from_size_align(self.cap, IO_ALIGN_BYTES).expect("IoBuf layout");
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes (or dangling with len 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: unique ownership, valid for len bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Default for IoBuf {
    fn default() -> IoBuf {
        IoBuf::empty()
    }
}

impl Clone for IoBuf {
    fn clone(&self) -> IoBuf {
        IoBuf::from_slice(self)
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IoBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        let b = IoBuf::zeroed(8192);
        assert_eq!(b.as_ptr() as usize % IO_ALIGN_BYTES, 0);
        assert!(b.iter().all(|&x| x == 0));
        let c = IoBuf::from_slice(&[1, 2, 3]);
        assert_eq!(&c[..], &[1, 2, 3]);
        assert_eq!(c.clone()[..], c[..]);
        assert!(IoBuf::empty().is_empty());
    }

    #[test]
    fn set_len_keeps_the_allocation_and_its_bytes() {
        let mut b = IoBuf::zeroed(8192);
        b[4096] = 7;
        b.set_len(4096);
        assert_eq!((b.len(), b.capacity()), (4096, 8192));
        b.set_len(8192);
        assert_eq!(b[4096], 7, "bytes beyond a shortened length survive");
        assert!(std::panic::catch_unwind(move || b.set_len(8193)).is_err());
    }
}
