//! Heap accounting for benchmarks: `Counting` wraps the system allocator and
//! keeps the bytes live and the peak since the last `reset_peak`, so that a
//! benchmark can report what an operation (an engine's recovery) allocated
//! at its worst against what stays allocated after it.
//!
//! Installed as the global allocator by the `sluice` binary built with its
//! `heap-count` feature (not the production build); elsewhere the counters
//! stay at zero. Two
//! relaxed atomic operations per allocation: the serving path allocates
//! little (its buffers are pooled), so the cost does not show there.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counted.
pub struct Counting;

// SAFETY: every request is passed to `System` unchanged; the counters are
// only arithmetic on the sizes it was given.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller's contract for `GlobalAlloc::alloc`.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller's contract for `GlobalAlloc::alloc_zeroed`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (so from `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as the caller's contract for `GlobalAlloc::realloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Relaxed);
            grew(new_size);
        }
        p
    }
}

fn grew(bytes: usize) {
    let now = LIVE.fetch_add(bytes, Relaxed) + bytes;
    PEAK.fetch_max(now, Relaxed);
}

/// Bytes allocated and not yet freed.
fn live() -> usize {
    LIVE.load(Relaxed)
}

/// Run `f`; with what it left allocated, and the most it held at once
/// (both above what was live before it).
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, Usage) {
    let base = live();
    PEAK.store(base, Relaxed);
    let out = f();
    let usage = Usage { peak: PEAK.load(Relaxed).saturating_sub(base), left: live().saturating_sub(base) };
    (out, usage)
}

/// What `measure` saw, in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub peak: usize,
    pub left: usize,
}
