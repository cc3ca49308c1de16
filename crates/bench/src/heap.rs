//! Heap accounting for benchmarks: `Counting` wraps the system allocator and
//! keeps the bytes live and the peak since the last `reset_peak`, so that a
//! benchmark can report what an operation (an engine's recovery) allocated
//! at its worst against what stays allocated after it.
//!
//! Installed as the global allocator by the `sluice` binary; elsewhere
//! (unit tests) `installed()` is false and the counters stay at zero. Two
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
pub fn live() -> usize {
    LIVE.load(Relaxed)
}

/// The most bytes live at once since the last `reset_peak`.
pub fn peak() -> usize {
    PEAK.load(Relaxed)
}

/// Start a new peak from what is live now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Relaxed), Relaxed);
}

/// Whether `Counting` is the global allocator (an allocation moves `live`).
pub fn installed() -> bool {
    let before = live();
    let probe = std::hint::black_box(vec![0u8; 1 << 16]);
    let moved = live() >= before + probe.len();
    drop(probe);
    moved
}
