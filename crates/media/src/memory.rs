//! Memory and null backends: untimed devices that complete every request at
//! submission.
//!
//! `MemoryDevice::new` keeps data in lazily allocated 64 KiB pages, so a large
//! sparse device costs only what was written (zeros written to a hole leave it
//! a hole, like a thin-provisioned disk); discard frees fully covered pages. `MemoryDevice::null` keeps no data at all (reads return zeros), like
//! Linux null_blk: emulators use it to model a 16 TB drive's timing and wear
//! without holding its bytes.
//!
//! `MemoryDevice::preallocated` takes all its pages from one anonymous
//! mapping advised for transparent huge pages (`Arena`): a benchmark device
//! of several GiB touched at random in 4 KiB pieces otherwise misses the TLB
//! on nearly every access (measured: engine writes +10 %, reads +25 %, see
//! docs/engine.md). Arena pages are never given back one by one; the
//! mapping goes when the device does.

use crate::buf::IoBuf;
use crate::device::{check_range, BlockDevice, DeviceError, DeviceInfo, DeviceStats, IoCompletion, IoOp, IoRequest};
use std::collections::VecDeque;
use std::sync::{Mutex, RwLock};

const PAGE_BYTES: u64 = 64 * 1024;

/// Freed pages kept for reuse (64 MiB): discard-then-rewrite cycles (an
/// engine's GC) would otherwise pay a page fault per 4 KiB every time.
const SPARE_PAGES_MAX: usize = 1024;

/// One anonymous mapping, 2 MiB aligned, advised `MADV_HUGEPAGE`, unmapped
/// on drop. Pages handed out of it live no longer than the `State` that
/// owns both (its fields drop after every page is gone with them).
struct Arena {
    map: *mut libc::c_void,
    map_len: usize,
    /// First 2 MiB-aligned byte within the mapping.
    start: *mut u8,
}

// SAFETY: the mapping is plain memory owned by one `State` (each page
// behind its own lock); the arena itself is only unmapped, on drop.
unsafe impl Send for Arena {}
// SAFETY: as above: shared references to it are never used to touch memory.
unsafe impl Sync for Arena {}

const HUGE_PAGE_BYTES: usize = 2 << 20;

impl Arena {
    /// `bytes` of zeroed, resident memory (every page touched), or None if
    /// the mapping fails. Huge pages are a request: without THP the memory
    /// is ordinary 4 KiB pages.
    fn new(bytes: usize) -> Option<Arena> {
        let map_len = bytes.checked_add(HUGE_PAGE_BYTES)?;
        // SAFETY: an anonymous private mapping; no file, no fixed address.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return None;
        }
        let skip = (HUGE_PAGE_BYTES - map as usize % HUGE_PAGE_BYTES) % HUGE_PAGE_BYTES;
        // SAFETY: `skip < HUGE_PAGE_BYTES`, within the mapping.
        let start = unsafe { (map as *mut u8).add(skip) };
        advise_huge_pages(start, bytes);
        for off in (0..bytes).step_by(4096) {
            // SAFETY: `off < bytes`, within the mapping past `start`.
            unsafe { std::ptr::write_volatile(start.add(off), 0) };
        }
        Some(Arena { map, map_len, start })
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping this arena made, once.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// Asks for transparent huge pages on the whole 2 MiB pages within
/// `[start, start + bytes)`, memory the caller owns and has not yet
/// touched (pages already faulted in stay small). A request: without THP,
/// or on failure, nothing changes.
fn advise_huge_pages(start: *const u8, bytes: usize) {
    let first = (start as usize).next_multiple_of(HUGE_PAGE_BYTES);
    let end = (start as usize).saturating_add(bytes) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    if end > first {
        // SAFETY: advice only, on whole pages of the caller's own memory.
        unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
    }
}

/// A vector of `n` copies of `fill` whose memory was advised for huge pages
/// before it was filled: for large maps read and written at random (an
/// engine's L2P), which with 4 KiB pages miss the TLB on nearly every
/// access. Without THP it is an ordinary vector.
pub fn huge_page_vec<T: Clone>(n: usize, fill: T) -> Vec<T> {
    let mut v = Vec::with_capacity(n);
    advise_huge_pages(v.as_ptr() as *const u8, n * std::mem::size_of::<T>());
    v.resize(n, fill);
    v
}

/// A 64 KiB page: its own allocation, or a slot of the device's `Arena`.
enum Page {
    Heap(Box<[u8]>),
    Arena(std::ptr::NonNull<u8>),
}

// SAFETY: an arena page is a disjoint slot of memory owned by the same
// `State` as the page, used only under its page's lock: written under the
// write lock, read (through `&Page`) under the read lock.
unsafe impl Send for Page {}
// SAFETY: as above.
unsafe impl Sync for Page {}

impl std::ops::Deref for Page {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Page::Heap(b) => b,
            // SAFETY: a PAGE_BYTES slot of a live arena, used by this page only.
            Page::Arena(p) => unsafe { std::slice::from_raw_parts(p.as_ptr(), PAGE_BYTES as usize) },
        }
    }
}

impl std::ops::DerefMut for Page {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Page::Heap(b) => b,
            // SAFETY: as in `deref`; `&mut self` makes the access unique.
            Page::Arena(p) => unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), PAGE_BYTES as usize) },
        }
    }
}

/// The stored data, a lock per page: reads of a page share it, writes and
/// discards take it alone, so requests of many threads on different pages
/// copy at once (a request spanning pages takes them one at a time: like a
/// real device's, it is atomic per block, not as a whole).
struct State {
    /// `None` for a null device; otherwise one slot per page.
    pages: Option<Vec<RwLock<Option<Page>>>>,
    /// Discarded pages, contents undefined, ready for reuse.
    spare: Mutex<Spares>,
    /// Where a preallocated device's pages live (declared last: dropped
    /// after them).
    _arena: Option<Arena>,
}

struct Spares {
    pages: Vec<Page>,
    /// Most spare pages kept: `SPARE_PAGES_MAX`, or every page of a
    /// preallocated device (which never gives memory back).
    max: usize,
}

/// Completed requests.
struct Queue {
    done: VecDeque<IoCompletion>,
    /// Requests admitted and still executing (they count against the
    /// queue depth like completed, unreaped ones).
    executing: usize,
}

pub struct MemoryDevice {
    info: DeviceInfo,
    state: State,
    queue: Mutex<Queue>,
    /// The counters, one shard per thread (by number): threads doing
    /// synchronous I/O at once (`execute_now`) then share no lock and no
    /// cache line. `stats` adds them up.
    stats: [StatShard; STAT_SHARDS],
}

const STAT_SHARDS: usize = 8;

/// One shard of a device's counters, on a cache line pair of its own.
#[repr(align(128))]
#[derive(Default)]
struct StatShard(Mutex<DeviceStats>);

impl MemoryDevice {
    /// A device of `capacity_bytes` with `block_bytes` blocks that stores data.
    pub fn new(capacity_bytes: u64, block_bytes: u64) -> MemoryDevice {
        let pages = capacity_bytes.div_ceil(PAGE_BYTES) as usize;
        Self::build("memory", capacity_bytes, block_bytes, Some((0..pages).map(|_| RwLock::new(None)).collect()))
    }

    /// Like [`MemoryDevice::new`], but with every page allocated and touched
    /// up front (kept as spare pages: the device still reads as zeros and
    /// reports holes). Writes then never wait on the kernel to fault in and
    /// clear fresh memory — which otherwise dominates a log-structured
    /// engine's first pass over a large memory device — at the price of the
    /// whole capacity resident from the start.
    pub fn preallocated(capacity_bytes: u64, block_bytes: u64) -> MemoryDevice {
        let mut dev = Self::new(capacity_bytes, block_bytes);
        {
            let st = &mut dev.state;
            let spare = st.spare.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
            let pages = capacity_bytes.div_ceil(PAGE_BYTES) as usize;
            spare.pages.reserve_exact(pages);
            spare.max = spare.max.max(pages);
            match Arena::new(pages * PAGE_BYTES as usize) {
                Some(arena) => {
                    for i in 0..pages {
                        // SAFETY: slot `i` lies within the arena's `pages` pages.
                        let p = unsafe { arena.start.add(i * PAGE_BYTES as usize) };
                        spare.pages.push(Page::Arena(std::ptr::NonNull::new(p).expect("mapped memory")));
                    }
                    st._arena = Some(arena);
                }
                None => {
                    for _ in 0..pages {
                        let mut pg = vec![0u8; PAGE_BYTES as usize].into_boxed_slice();
                        // Fresh allocator memory may be untouched zero pages:
                        // write each 4 KiB page once so it is resident now.
                        for off in (0..pg.len()).step_by(4096) {
                            // SAFETY: `off` is in bounds of `pg`.
                            unsafe { std::ptr::write_volatile(pg.as_mut_ptr().add(off), 0) };
                        }
                        spare.pages.push(Page::Heap(pg));
                    }
                }
            }
        }
        dev
    }

    /// A device that stores nothing: writes vanish, reads return zeros.
    pub fn null(capacity_bytes: u64, block_bytes: u64) -> MemoryDevice {
        Self::build("null", capacity_bytes, block_bytes, None)
    }

    fn build(
        name: &str,
        capacity_bytes: u64,
        block_bytes: u64,
        pages: Option<Vec<RwLock<Option<Page>>>>,
    ) -> MemoryDevice {
        assert!(
            block_bytes.is_power_of_two() && block_bytes <= PAGE_BYTES,
            "block size must be a power of two ≤ 64 KiB"
        );
        assert_eq!(capacity_bytes % block_bytes, 0, "capacity must be whole blocks");
        MemoryDevice {
            info: DeviceInfo {
                name: name.to_string(),
                capacity_bytes,
                block_bytes,
                queue_depth_max: 1024,
                optimal_write_bytes: block_bytes,
                zoned: false,
            },
            state: State { pages, spare: Mutex::new(Spares { pages: Vec::new(), max: SPARE_PAGES_MAX }), _arena: None },
            queue: Mutex::new(Queue { done: VecDeque::new(), executing: 0 }),
            stats: Default::default(),
        }
    }

    /// Run `req` on the stored data and count it.
    fn run(&self, req: &mut IoRequest) -> Result<u64, DeviceError> {
        let result = check_range(&self.info, req).and_then(|_| {
            if req.op == IoOp::Read {
                self.state.read(req)
            } else {
                self.state.execute(req)
            }
        });
        self.count(req.op, req.len, result.is_ok());
        result
    }

    fn count(&self, op: IoOp, len: u64, ok: bool) {
        let shard = &self.stats[crate::device::thread_no() as usize % STAT_SHARDS];
        shard.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).count_host(op, len, ok);
    }
}

/// Visit the page pieces of [offset, offset+len): (page index, offset in page, length).
fn for_pieces(offset: u64, len: u64, mut f: impl FnMut(usize, usize, usize)) {
    let mut pos = offset;
    let end = offset + len;
    while pos < end {
        let page = pos / PAGE_BYTES;
        let in_page = pos % PAGE_BYTES;
        let n = (PAGE_BYTES - in_page).min(end - pos);
        f(page as usize, in_page as usize, n as usize);
        pos += n;
    }
}

/// Whether `b` is all zeros: a 512-byte piece at a time with no early exit
/// inside it, so the compiler vectorizes it (a byte-wise `all` does not,
/// and cost a bench on zero data a quarter of its time in this check).
fn is_zero(b: &[u8]) -> bool {
    b.chunks(512).all(|c| c.iter().fold(0u8, |a, &x| a | x) == 0)
}

impl State {
    /// A read: each page under its shared lock.
    fn read(&self, req: &mut IoRequest) -> Result<u64, DeviceError> {
        let Some(pages) = self.pages.as_ref() else {
            req.buf.fill(0);
            return Ok(req.len);
        };
        let base = req.offset;
        for_pieces(req.offset, req.len, |p, o, n| {
            let dst = &mut req.buf[(p as u64 * PAGE_BYTES + o as u64 - base) as usize..][..n];
            match &*pages[p].read().unwrap_or_else(std::sync::PoisonError::into_inner) {
                Some(page) => dst.copy_from_slice(&page[o..o + n]),
                None => dst.fill(0),
            }
        });
        Ok(req.len)
    }

    /// Any other request: each page under its exclusive lock.
    fn execute(&self, req: &mut IoRequest) -> Result<u64, DeviceError> {
        let Some(pages) = self.pages.as_ref() else { return Ok(req.len) };
        let base = req.offset;
        let page_lock = |p: usize| pages[p].write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let spares = || self.spare.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match req.op {
            IoOp::Read => unreachable!("reads share the pages' locks (State::read)"),
            IoOp::Write => for_pieces(req.offset, req.len, |p, o, n| {
                let src = &req.buf[(p as u64 * PAGE_BYTES + o as u64 - base) as usize..][..n];
                let mut slot = page_lock(p);
                // Zeros on a page never written already read back: keep it a hole.
                if slot.is_none() && is_zero(src) {
                    return;
                }
                let page = slot.get_or_insert_with(|| match spares().pages.pop() {
                    // A recycled page must read as zeros wherever this write does not reach.
                    Some(mut pg) => {
                        if n as u64 != PAGE_BYTES {
                            pg.fill(0);
                        }
                        pg
                    }
                    None => Page::Heap(vec![0u8; PAGE_BYTES as usize].into_boxed_slice()),
                });
                page[o..o + n].copy_from_slice(src);
            }),
            IoOp::Discard => for_pieces(req.offset, req.len, |p, o, n| {
                let mut slot = page_lock(p);
                if n as u64 == PAGE_BYTES {
                    if let Some(pg) = slot.take() {
                        let mut spare = spares();
                        if spare.pages.len() < spare.max {
                            spare.pages.push(pg);
                        }
                    }
                } else if let Some(page) = &mut *slot {
                    page[o..o + n].fill(0);
                }
            }),
            IoOp::Flush => {}
            op @ (IoOp::ZoneAppend | IoOp::Zone(_)) => return Err(DeviceError::Unsupported(op)),
        }
        Ok(req.len)
    }
}

impl BlockDevice for MemoryDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&self, mut req: IoRequest) {
        let admitted = {
            let mut q = self.queue.lock().expect("memory device queue");
            let room = q.done.len() + q.executing < self.info.queue_depth_max;
            q.executing += room as usize;
            room
        };
        let result = if !admitted {
            self.count(req.op, req.len, false);
            Err(DeviceError::QueueFull { queue_depth_max: self.info.queue_depth_max })
        } else {
            self.run(&mut req)
        };
        let mut q = self.queue.lock().expect("memory device queue");
        q.executing -= admitted as usize;
        q.done.push_back(IoCompletion::untimed(req, result));
    }

    fn reap(&self, _min: usize, out: &mut Vec<IoCompletion>) -> usize {
        let mut q = self.queue.lock().expect("memory device queue");
        let n = q.done.len();
        out.extend(q.done.drain(..));
        n
    }

    fn in_flight(&self) -> usize {
        let q = self.queue.lock().expect("memory device queue");
        q.done.len() + q.executing
    }

    fn stats(&self) -> DeviceStats {
        let shards = self.stats.iter().map(|s| *s.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        shards.fold(DeviceStats::default(), |a, s| a.plus(&s))
    }

    /// Every request completes at once anyway: run it in the caller's
    /// thread, past the queue (no queue lock, no completion hand-off).
    fn execute_now(&self, mut req: IoRequest) -> Result<IoCompletion, IoRequest> {
        let result = self.run(&mut req);
        Ok(IoCompletion::untimed(req, result))
    }

    fn runs_inline(&self) -> bool {
        true
    }
}

/// Convenience: a zeroed buffer of `len` bytes filled with `byte`.
pub fn pattern(len: usize, byte: u8) -> IoBuf {
    let mut b = IoBuf::zeroed(len);
    b.fill(byte);
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{discard, read_at, write_at};

    /// Requests beyond the queue depth (completed but not reaped, or still
    /// executing) are refused with QueueFull; reaping makes room again.
    #[test]
    fn the_queue_depth_counts_unreaped_completions() {
        let d = MemoryDevice::new(1 << 20, 4096);
        let depth = d.info().queue_depth_max;
        for i in 0..depth {
            d.submit(IoRequest::read(0, 4096, i as u64));
        }
        assert_eq!(d.in_flight(), depth);
        d.submit(IoRequest::read(0, 4096, 7));
        let mut out = Vec::new();
        assert_eq!(d.reap(1, &mut out), depth + 1);
        let refused: Vec<_> = out.iter().filter(|c| c.result.is_err()).collect();
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].result, Err(DeviceError::QueueFull { queue_depth_max: depth }));
        assert_eq!(d.in_flight(), 0);
        d.submit(IoRequest::read(0, 4096, 9));
        out.clear();
        d.reap(1, &mut out);
        assert!(out[0].result.is_ok(), "room again");
    }

    /// A synchronous request runs in the caller's thread beside the queue,
    /// even a full one, and is counted like a queued one; through a
    /// `SharedDevice` too, from several threads at once.
    #[test]
    fn synchronous_requests_run_inline_beside_the_queue() {
        let d = MemoryDevice::new(1 << 20, 4096);
        let depth = d.info().queue_depth_max;
        for i in 0..depth {
            d.submit(IoRequest::read(0, 4096, i as u64));
        }
        assert!(d.runs_inline());
        write_at(&d, 8192, &[7u8; 4096]).unwrap();
        assert_eq!(&read_at(&d, 8192, 4096).unwrap()[..], &[7u8; 4096][..]);
        assert_eq!(d.in_flight(), depth, "the queue is untouched");
        let s = d.stats();
        assert_eq!((s.reads, s.writes, s.host_write_bytes, s.errors), (depth as u64 + 1, 1, 4096, 0));
        let shared =
            std::sync::Arc::new(crate::SharedDevice::new(std::sync::Arc::new(MemoryDevice::new(1 << 20, 4096))));
        assert!(shared.runs_inline());
        std::thread::scope(|s| {
            for t in 0..2u8 {
                let shared = &shared;
                s.spawn(move || {
                    for i in 0..100u64 {
                        let at = (t as u64 * 100 + i) * 4096;
                        write_at(&**shared, at, &[t + 1; 4096]).unwrap();
                        assert_eq!(read_at(&**shared, at, 4096).unwrap()[0], t + 1);
                    }
                });
            }
        });
        let s = shared.stats();
        assert_eq!((s.reads, s.writes, shared.in_flight()), (200, 200, 0));
    }

    /// A page is read under its shared lock: threads reading while another
    /// rewrites a page always see one whole version of it, never a mix.
    #[test]
    fn concurrent_readers_see_whole_writes() {
        let d = std::sync::Arc::new(crate::SharedDevice::new(std::sync::Arc::new(MemoryDevice::new(1 << 20, 4096))));
        write_at(&*d, 0, &[0u8; 65536]).unwrap();
        let writer = {
            let d = d.clone();
            std::thread::spawn(move || {
                for v in 1..=200u8 {
                    write_at(&*d, 0, &[v; 65536]).unwrap();
                }
            })
        };
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let d = d.clone();
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        let b = read_at(&*d, 0, 65536).unwrap();
                        assert!(b.iter().all(|&x| x == b[0]), "a read saw two versions");
                    }
                })
            })
            .collect();
        writer.join().unwrap();
        readers.into_iter().for_each(|r| r.join().unwrap());
        assert!(read_at(&*d, 0, 65536).unwrap().iter().all(|&x| x == 200));
    }

    #[test]
    fn reads_back_what_was_written_across_pages() {
        let d = MemoryDevice::new(1 << 20, 4096);
        let data: Vec<u8> = (0..3 * 4096).map(|i| (i % 251) as u8).collect();
        write_at(&d, 61440, &data).unwrap(); // straddles a 64 KiB page boundary
        assert_eq!(&read_at(&d, 61440, data.len()).unwrap()[..], &data[..]);
        assert!(read_at(&d, 0, 4096).unwrap().iter().all(|&b| b == 0));
        discard(&d, 61440, 4096).unwrap();
        assert!(read_at(&d, 61440, 4096).unwrap().iter().all(|&b| b == 0));
        assert_eq!(&read_at(&d, 65536, 4096).unwrap()[..], &data[4096..8192]);
        let s = d.stats();
        assert_eq!(s.host_write_bytes, 3 * 4096);
        assert_eq!(s.discards, 1);
    }

    #[test]
    fn rejects_bad_requests_and_changes_nothing() {
        let d = MemoryDevice::new(1 << 20, 4096);
        assert!(matches!(write_at(&d, 100, &[0; 4096]), Err(DeviceError::Misaligned { .. })));
        assert!(matches!(write_at(&d, 1 << 20, &[0; 4096]), Err(DeviceError::OutOfRange { .. })));
        assert!(matches!(read_at(&d, u64::MAX - 4095, 4096), Err(DeviceError::OutOfRange { .. })));
        assert_eq!(d.stats().host_write_bytes, 0);
        assert_eq!(d.stats().errors, 3);
    }

    #[test]
    fn recycled_pages_read_as_zeros_outside_the_new_write() {
        let d = MemoryDevice::new(1 << 20, 4096);
        write_at(&d, 0, &[0xee; 65536]).unwrap();
        discard(&d, 0, 65536).unwrap(); // the page goes to the spare pool
        write_at(&d, 65536 + 8192, &[0x11; 4096]).unwrap(); // reuses it, partly
        let b = read_at(&d, 65536, 65536).unwrap();
        assert!(b[..8192].iter().all(|&x| x == 0) && b[12288..].iter().all(|&x| x == 0));
        assert!(b[8192..12288].iter().all(|&x| x == 0x11));
        assert!(read_at(&d, 0, 65536).unwrap().iter().all(|&x| x == 0));
    }

    #[test]
    fn zeros_on_a_hole_allocate_nothing() {
        let d = MemoryDevice::new(1 << 20, 4096);
        write_at(&d, 0, &[0u8; 131072]).unwrap();
        write_at(&d, 131072 + 4096, &pattern(4096, 7)).unwrap();
        let allocated =
            |d: &MemoryDevice| d.state.pages.as_ref().unwrap().iter().filter(|p| p.read().unwrap().is_some()).count();
        assert_eq!(allocated(&d), 1);
        // Zeros over written data still overwrite it.
        write_at(&d, 131072 + 4096, &[0u8; 4096]).unwrap();
        assert!(read_at(&d, 0, 1 << 20).unwrap().iter().all(|&b| b == 0));
    }

    /// A single nonzero byte anywhere, in a whole piece or the tail, makes
    /// a buffer not zero.
    #[test]
    fn one_nonzero_byte_anywhere_is_data() {
        let mut b = vec![0u8; 4096 + 100];
        assert!(is_zero(&b) && is_zero(&[]));
        for at in [0, 1, 511, 512, 4095, 4096, 4195] {
            b[at] = 0x80;
            assert!(!is_zero(&b), "byte {at}");
            b[at] = 0;
        }
    }

    #[test]
    fn a_preallocated_device_reads_zeros_and_reads_back_writes() {
        let d = MemoryDevice::preallocated(4 * PAGE_BYTES, 4096);
        assert!(read_at(&d, PAGE_BYTES, 3 * 4096).unwrap().iter().all(|&b| b == 0));
        let data = vec![0x5au8; 4096];
        write_at(&d, PAGE_BYTES + 8192, &data).unwrap();
        let back = read_at(&d, PAGE_BYTES, 3 * 4096).unwrap();
        assert!(back[..8192].iter().all(|&b| b == 0));
        assert_eq!(&back[8192..], &data[..]);
    }

    /// Every page of a preallocated device is a slot of its one arena, the
    /// slots are disjoint, and a discarded page returns to the spares and
    /// reads as zeros wherever its next write does not reach.
    #[test]
    fn a_preallocated_device_takes_disjoint_pages_from_its_arena() {
        let d = MemoryDevice::preallocated(8 * PAGE_BYTES, 4096);
        for p in 0..8u64 {
            write_at(&d, p * PAGE_BYTES, &vec![p as u8 + 1; PAGE_BYTES as usize]).unwrap();
        }
        for p in 0..8u64 {
            assert!(read_at(&d, p * PAGE_BYTES, PAGE_BYTES as usize).unwrap().iter().all(|&b| b == p as u8 + 1));
        }
        {
            let st = &d.state;
            let arena = st._arena.as_ref().expect("an arena");
            assert_eq!(arena.start as usize % HUGE_PAGE_BYTES, 0);
            let mut slots: Vec<usize> = st
                .pages
                .as_ref()
                .unwrap()
                .iter()
                .map(|p| match &*p.read().unwrap() {
                    Some(Page::Arena(ptr)) => (ptr.as_ptr() as usize - arena.start as usize) / PAGE_BYTES as usize,
                    _ => panic!("a page outside the arena"),
                })
                .collect();
            slots.sort_unstable();
            assert_eq!(slots, (0..8).collect::<Vec<_>>());
            assert!(st.spare.lock().unwrap().pages.is_empty());
        }
        discard(&d, 3 * PAGE_BYTES, PAGE_BYTES).unwrap();
        assert_eq!(d.state.spare.lock().unwrap().pages.len(), 1);
        write_at(&d, 3 * PAGE_BYTES + 4096, &[9u8; 4096]).unwrap();
        let back = read_at(&d, 3 * PAGE_BYTES, PAGE_BYTES as usize).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0) && back[8192..].iter().all(|&b| b == 0));
        assert!(back[4096..8192].iter().all(|&b| b == 9));
    }

    #[test]
    fn null_device_stores_nothing() {
        let d = MemoryDevice::null(1 << 30, 4096);
        write_at(&d, 0, &pattern(4096, 7)).unwrap();
        assert!(read_at(&d, 0, 4096).unwrap().iter().all(|&b| b == 0));
    }
}
