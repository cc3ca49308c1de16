//! `FileDevice`: a regular file or a raw block device driven through io_uring.
//!
//! It owns one io_uring instance, the file (registered with the ring), and a
//! slab of in-flight requests keyed by the SQE `user_data` (the slot index).
//! A request's `IoBuf` lives in its slot from `submit` until its completion is
//! reaped, so the kernel always writes into memory we own; dropping the device
//! first waits for every request the kernel holds.
//!
//! Invariants:
//! - slots in use ≤ `queue_depth_max` ≤ SQ entries, and each slot has at most
//!   one SQE/CQE outstanding, so the SQ never overflows and the CQ (2× SQ)
//!   never does either;
//! - `in_flight()` = slots in use + immediate completions not yet reaped; the
//!   queue-depth bound applies to that sum, as in every other backend;
//! - every request completes exactly once, with its buffer.
//!
//! Why this shape: `submit` only fills an SQE; the `io_uring_enter` that hands
//! the batch to the kernel happens in `reap` (or when the SQ is full), which
//! also waits for `min` completions in the same system call. One syscall per
//! reap, not per request, is where io_uring's speed comes from (fio's
//! `iodepth_batch`). Short transfers are continued from where they stopped
//! (a transfer that makes no progress fails with EIO), so callers never see a
//! partial read or write reported as success.
//!
//! Before sleeping for a completion, `reap` polls briefly (yielding the CPU):
//! a sleeping waiter costs the completing side a wake-up per completion, which
//! at hundreds of thousands of IOPS costs more than the poll.
//!
//! One ring per device behind one mutex is a deliberate first step: `reap`
//! holds the lock while it waits, so other threads' submits wait for the next
//! completion (bounded by device latency). Any thread may submit and reap;
//! `FileOptions::single_reaper` trades that for speed when one thread reaps.
//! Many rings (one per queue/thread) can come later without changing the trait.

use crate::buf::IO_ALIGN_BYTES;
use crate::device::{check_range, BlockDevice, DeviceError, DeviceInfo, DeviceStats, IoCompletion, IoOp, IoRequest};
use io_uring::{opcode, squeue, types, IoUring};
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// Default device block size.
pub const DEFAULT_BLOCK_BYTES: u64 = 4096;
/// Default ring entries, which is also the queue depth bound.
pub const DEFAULT_QUEUE_DEPTH: u32 = 128;
/// Default longest poll before sleeping for a completion.
pub const DEFAULT_SPIN_US: u32 = 20;
/// Shortest poll the adaptive budget shrinks to (about one yield).
const SPIN_MIN_NS: u64 = 1_000;
/// Largest queue depth accepted (the kernel's SQ limit).
pub const QUEUE_DEPTH_MAX: u32 = 32768;
/// Largest transfer one SQE carries (Linux's MAX_RW_COUNT); longer requests continue in further SQEs.
const SQE_BYTES_MAX: u64 = 0x7fff_f000;

// Block-device ioctls (asm-generic encoding: x86, arm, riscv).
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;

/// How the file is opened with respect to the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CacheMode {
    /// O_DIRECT; opening fails with `FileError::DirectUnsupported` where the filesystem refuses it.
    #[default]
    Direct,
    /// O_DIRECT where possible, the page cache where the filesystem refuses O_DIRECT.
    DirectOrBuffered,
    /// Always through the page cache (flush then matters for durability).
    Buffered,
}

/// How to open a `FileDevice`.
#[derive(Clone, Debug)]
pub struct FileOptions {
    /// Regular files: create the file if missing and extend it (sparsely) to this size, which becomes the
    /// device capacity; `None` uses the existing size. Block devices: use the first `capacity_bytes`
    /// (must fit); `None` uses the whole device. Rounded down to whole blocks when taken from the file.
    pub capacity_bytes: Option<u64>,
    /// Device block size: a power of two ≥ 512 and ≥ the underlying logical block size.
    pub block_bytes: u64,
    /// Ring entries = most requests in flight.
    pub queue_depth: u32,
    pub cache: CacheMode,
    /// Before sleeping for a completion, poll for up to this long, yielding the CPU between polls; 0 always
    /// sleeps. See `FileDevice::spin_for_completions`.
    pub spin_us: u32,
    /// Promise that `reap` is only ever called from one thread (the first to call it). This enables
    /// IORING_SETUP_COOP_TASKRUN: completions are then posted only when that thread enters the kernel, which
    /// saves the completing side an interrupt per batch (~25% more IOPS on tmpfs here). With several reaping
    /// threads that could deadlock (one waits for completions only another, blocked, thread can post), so a
    /// `reap` from another thread panics. Dropping the device must then happen on the reaping thread or after
    /// it exited. Off by default.
    pub single_reaper: bool,
    /// Regular files with `capacity_bytes`: a missing file is created fully
    /// allocated (`fallocate`, so a full filesystem fails here, not in the
    /// middle of a workload), and an existing file is never resized: its
    /// size must be exactly `capacity_bytes` (`FileError::SizeMismatch`).
    /// Off: create or extend sparsely (tests, benchmarks).
    pub allocate: bool,
    /// With `allocate`: a new file is also written with zeros (and synced),
    /// so its extents are written, not only reserved. On ext4 and XFS the
    /// first write into a reserved (unwritten) extent is converted in the
    /// filesystem journal, and every flush then waits for that commit: a
    /// log written in small records with frequent flushes (the engine's
    /// cache) ran at about three quarters of the speed.
    pub zero_fill: bool,
    /// Take the device for this process alone: an exclusive `flock` on a
    /// regular file, `O_EXCL` on a block device (which the kernel refuses
    /// while it is mounted or held the same way). A second opener gets
    /// `FileError::Busy`.
    pub exclusive: bool,
    /// Open for reading only (`O_RDONLY`): nothing is created, extended or
    /// allocated (a regular file must then be exactly `capacity_bytes`, if
    /// given: `FileError::SizeMismatch`), and with `exclusive` a regular
    /// file's claim is shared (`flock(LOCK_SH)`), so readers may run
    /// together while a writer's exclusive claim refuses them
    /// (`FileError::Busy`); a block device's stays `O_EXCL`.
    /// Works on a read-only file system. A write fails with `EBADF`.
    pub read_only: bool,
}

impl Default for FileOptions {
    fn default() -> FileOptions {
        FileOptions {
            capacity_bytes: None,
            block_bytes: DEFAULT_BLOCK_BYTES,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            cache: CacheMode::Direct,
            spin_us: DEFAULT_SPIN_US,
            single_reaper: false,
            allocate: false,
            zero_fill: false,
            exclusive: false,
            read_only: false,
        }
    }
}

/// Why a `FileDevice` could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    #[error("opening {path}: {}", os_error(*errno))]
    Open { path: PathBuf, errno: i32 },
    #[error("{path} is in use by another process (an exclusive lock is held on it)")]
    Busy { path: PathBuf },
    #[error("{path} is {file_bytes} bytes, not the configured {capacity_bytes}; an existing device is never resized")]
    SizeMismatch { path: PathBuf, file_bytes: u64, capacity_bytes: u64 },
    #[error("{path}: the filesystem refuses O_DIRECT (use CacheMode::DirectOrBuffered or Buffered)")]
    DirectUnsupported { path: PathBuf },
    #[error("{path}: neither a regular file nor a block device")]
    NotFileOrBlockDevice { path: PathBuf },
    #[error(
        "block size {block_bytes} must be a power of two ≥ 512 and ≥ the logical block size {logical_block_bytes}"
    )]
    BadBlockSize { block_bytes: u64, logical_block_bytes: u64 },
    #[error("capacity {capacity_bytes} is not a positive multiple of the {block_bytes}-byte block")]
    BadCapacity { capacity_bytes: u64, block_bytes: u64 },
    #[error("{path}: capacity {capacity_bytes} exceeds the device's {device_bytes} bytes")]
    CapacityTooLarge { path: PathBuf, capacity_bytes: u64, device_bytes: u64 },
    #[error("{path}: O_DIRECT needs {required}-byte aligned memory, buffers are {IO_ALIGN_BYTES}-byte aligned")]
    MemoryAlignment { path: PathBuf, required: u64 },
    #[error("queue depth {0} must be within 1..={QUEUE_DEPTH_MAX}")]
    BadQueueDepth(u32),
    #[error("{path}: {what}: {}", os_error(*errno))]
    Sys { path: PathBuf, what: &'static str, errno: i32 },
    #[error("io_uring setup: {}", os_error(*errno))]
    Ring { errno: i32 },
}

/// An errno in words, as the C library says it ("No space left on device (os error 28)").
pub fn os_error(errno: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(errno)
}

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// One request the kernel holds (or is about to).
struct Slot {
    req: IoRequest,
    /// Bytes already transferred (short reads/writes continue from here).
    done_bytes: u64,
    submitted_ns: u64,
}

/// What a CQE means for its request.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Complete(Result<u64, DeviceError>),
    /// A short transfer made progress: submit the remainder.
    Continue,
}

/// Fold one CQE result into a request's progress.
fn advance(op: IoOp, len: u64, done_bytes: &mut u64, res: i32) -> Step {
    if res < 0 {
        return Step::Complete(Err(DeviceError::Io { errno: -res }));
    }
    match op {
        IoOp::Read | IoOp::Write => {
            *done_bytes += res as u64;
            if *done_bytes >= len {
                Step::Complete(Ok(len))
            } else if res == 0 {
                // No progress (end of a file truncated behind our back, say): never report it as success.
                Step::Complete(Err(DeviceError::Io { errno: libc::EIO }))
            } else {
                Step::Continue
            }
        }
        _ => Step::Complete(Ok(len)),
    }
}

struct State {
    ring: IoUring,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    /// Slots in use: requests the kernel holds or whose SQE waits in the SQ.
    in_ring: usize,
    /// Completions decided at submission (bad requests, queue full, unsupported ops).
    done: VecDeque<IoCompletion>,
    stats: DeviceStats,
    /// Start of the current stretch with `in_ring > 0`.
    busy_since: Option<Instant>,
    /// Current poll budget before sleeping (adaptive, `SPIN_MIN_NS..=spin_max_ns`).
    spin_ns: u64,
    /// With `single_reaper`: the thread that reaps.
    reaper: Option<std::thread::ThreadId>,
}

pub struct FileDevice {
    info: DeviceInfo,
    /// This open created the file (it did not exist before).
    created: bool,
    /// With `FileOptions::exclusive`: the descriptor holding the claim.
    _claim: Option<File>,
    path: PathBuf,
    file: File,
    block_device: bool,
    direct: bool,
    origin: Instant,
    spin_max_ns: u64,
    single_reaper: bool,
    state: Mutex<State>,
}

impl FileDevice {
    /// Open (and for regular files possibly create/extend) `path`; see `FileOptions`.
    pub fn open(path: impl AsRef<Path>, opts: &FileOptions) -> Result<FileDevice, FileError> {
        let path = path.as_ref().to_path_buf();
        if opts.queue_depth == 0 || opts.queue_depth > QUEUE_DEPTH_MAX {
            return Err(FileError::BadQueueDepth(opts.queue_depth));
        }
        let bs = opts.block_bytes;
        if !bs.is_power_of_two() || bs < 512 {
            return Err(FileError::BadBlockSize { block_bytes: bs, logical_block_bytes: 512 });
        }
        if let Some(cap) = opts.capacity_bytes {
            if cap == 0 || cap % bs != 0 {
                return Err(FileError::BadCapacity { capacity_bytes: cap, block_bytes: bs });
            }
        }
        let existed = std::fs::symlink_metadata(&path).is_ok();
        let (file, direct) = open_file(&path, opts)?;
        let sys =
            |what: &'static str, e: std::io::Error| FileError::Sys { path: path.clone(), what, errno: errno_of(&e) };
        let meta = file.metadata().map_err(|e| sys("fstat", e))?;
        let block_device = meta.file_type().is_block_device();
        let claimed = if opts.exclusive { Some(claim(&path, block_device, opts.read_only)?) } else { None };
        let (logical_block_bytes, device_bytes) = if block_device {
            let lbs = ioctl_u32(&file, BLKSSZGET).map_err(|e| sys("BLKSSZGET", e))? as u64;
            let bytes = ioctl_u64(&file, BLKGETSIZE64).map_err(|e| sys("BLKGETSIZE64", e))?;
            (lbs, bytes)
        } else if meta.file_type().is_file() {
            let (offset_align, mem_align) = if direct { dio_align(&file).unwrap_or((512, 512)) } else { (512, 512) };
            if mem_align > IO_ALIGN_BYTES as u64 {
                return Err(FileError::MemoryAlignment { path, required: mem_align });
            }
            (offset_align, meta.len())
        } else {
            return Err(FileError::NotFileOrBlockDevice { path });
        };
        if bs < logical_block_bytes {
            return Err(FileError::BadBlockSize { block_bytes: bs, logical_block_bytes });
        }
        let capacity_bytes = match opts.capacity_bytes {
            Some(cap) if block_device && cap > device_bytes => {
                return Err(FileError::CapacityTooLarge { path, capacity_bytes: cap, device_bytes });
            }
            Some(cap) if opts.read_only && !block_device => {
                if device_bytes != cap {
                    return Err(FileError::SizeMismatch { path, file_bytes: device_bytes, capacity_bytes: cap });
                }
                cap
            }
            Some(cap) if opts.allocate && !block_device => {
                if existed && device_bytes != cap {
                    return Err(FileError::SizeMismatch { path, file_bytes: device_bytes, capacity_bytes: cap });
                }
                if !existed {
                    let made = allocate(&file, cap).map_err(|e| ("allocating the file", e)).and_then(|()| {
                        if opts.zero_fill {
                            zero_fill(&path, cap).map_err(|e| ("writing zeros over the file", e))
                        } else {
                            Ok(())
                        }
                    });
                    if let Err((what, errno)) = made {
                        // Leave nothing half made behind.
                        drop(file);
                        let _ = std::fs::remove_file(&path);
                        return Err(FileError::Sys { path, what, errno });
                    }
                }
                cap
            }
            Some(cap) => {
                if !block_device && device_bytes < cap {
                    file.set_len(cap).map_err(|e| sys("extending the file", e))?;
                }
                cap
            }
            None => {
                let cap = device_bytes / bs * bs;
                if cap == 0 {
                    return Err(FileError::BadCapacity { capacity_bytes: device_bytes, block_bytes: bs });
                }
                cap
            }
        };

        let qd = opts.queue_depth;
        let mut builder = IoUring::builder();
        builder.setup_submit_all();
        if opts.single_reaper {
            builder.setup_coop_taskrun();
        }
        let ring = builder
            .build(qd)
            .or_else(|_| IoUring::new(qd)) // kernels before 5.18/5.19 lack the flags
            .map_err(|e| FileError::Ring { errno: errno_of(&e) })?;
        ring.submitter().register_files(&[file.as_raw_fd()]).map_err(|e| FileError::Ring { errno: errno_of(&e) })?;
        debug_assert!(ring.params().sq_entries() >= qd);

        let info = DeviceInfo {
            name: if block_device { "blockdev".into() } else { "file".into() },
            capacity_bytes,
            block_bytes: bs,
            queue_depth_max: qd as usize,
            optimal_write_bytes: bs,
            zoned: false,
        };
        let state = State {
            ring,
            slots: (0..qd).map(|_| None).collect(),
            free: (0..qd).rev().collect(),
            in_ring: 0,
            done: VecDeque::new(),
            stats: DeviceStats::default(),
            busy_since: None,
            spin_ns: opts.spin_us as u64 * 1000,
            reaper: None,
        };
        let spin_max_ns = opts.spin_us as u64 * 1000;
        Ok(FileDevice {
            info,
            _claim: claimed,
            created: !existed,
            path,
            file,
            block_device,
            direct,
            origin: Instant::now(),
            spin_max_ns,
            single_reaper: opts.single_reaper,
            state: Mutex::new(state),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this open created the file: it held nothing before.
    pub fn created(&self) -> bool {
        self.created
    }

    /// True when opened with O_DIRECT (false only with a non-`Direct` `CacheMode`).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the kernel with memory we freed: slots are only
        // emptied after their CQE, so continuing with the inner state is sound.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Push the SQE for the untransferred rest of slot `idx`'s request.
    fn push_sqe(&self, ring: &mut IoUring, idx: u32, slot: &mut Slot) {
        let fd = types::Fixed(0);
        let req = &mut slot.req;
        let rest = req.len - slot.done_bytes;
        let offset = req.offset + slot.done_bytes;
        let chunk = rest.min(SQE_BYTES_MAX) as u32;
        let entry: squeue::Entry = match req.op {
            IoOp::Read => {
                // SAFETY (pointer): done_bytes < len = buf.len(), so the pointer stays inside the buffer.
                let ptr = unsafe { req.buf.as_mut_ptr().add(slot.done_bytes as usize) };
                opcode::Read::new(fd, ptr, chunk).offset(offset).build()
            }
            IoOp::Write => {
                // SAFETY: as above.
                let ptr = unsafe { req.buf.as_ptr().add(slot.done_bytes as usize) };
                let flags = if req.fua { libc::RWF_DSYNC } else { 0 };
                opcode::Write::new(fd, ptr, chunk).offset(offset).rw_flags(flags).build()
            }
            IoOp::Flush => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
            IoOp::Discard => opcode::Fallocate::new(fd, req.len)
                .offset(req.offset)
                .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                .build(),
            IoOp::ZoneAppend | IoOp::Zone(_) => unreachable!("rejected at submit"),
        };
        let entry = entry.user_data(idx as u64);
        loop {
            // SAFETY: the buffer and the file live in this device until the CQE for `idx` is reaped
            // (Drop waits for all of them); one SQE per slot at a time.
            if unsafe { ring.submission().push(&entry) }.is_ok() {
                break;
            }
            // SQ full (cannot happen while slots ≤ SQ entries, kept for safety): hand the batch over.
            enter(ring, 0).expect("io_uring_enter to drain a full SQ");
        }
    }

    /// Process every CQE available; returns completions added to `out`.
    fn drain_cq(&self, st: &mut State, out: &mut Vec<IoCompletion>) -> usize {
        let mut n = 0;
        let mut now_ns = None;
        loop {
            let Some(cqe) = st.ring.completion().next() else { break };
            let idx = cqe.user_data() as u32;
            let mut res = cqe.result();
            let mut slot = st.slots[idx as usize].take().expect("CQE for a slot in use");
            if slot.req.op == IoOp::Discard && res == -libc::EOPNOTSUPP && self.block_device {
                // No zeroing deallocate (WRITE ZEROES with unmap): plain discard. Later reads return zeros
                // only if the device zeroes discarded blocks.
                res = self.blkdiscard(slot.req.offset, slot.req.len);
            }
            match advance(slot.req.op, slot.req.len, &mut slot.done_bytes, res) {
                Step::Continue => {
                    self.push_sqe(&mut st.ring, idx, &mut slot);
                    st.slots[idx as usize] = Some(slot);
                }
                Step::Complete(result) => {
                    st.free.push(idx);
                    st.in_ring -= 1;
                    st.stats.count_host(slot.req.op, slot.req.len, result.is_ok());
                    let completed_ns = *now_ns.get_or_insert_with(|| self.now_ns());
                    let req = slot.req;
                    out.push(IoCompletion {
                        user_data: req.user_data,
                        op: req.op,
                        result,
                        buf: req.buf,
                        submitted_ns: slot.submitted_ns,
                        completed_ns,
                    });
                    n += 1;
                }
            }
        }
        n
    }

    fn blkdiscard(&self, offset: u64, len: u64) -> i32 {
        let range = [offset, len];
        // SAFETY: BLKDISCARD reads two u64 from the pointer.
        let r = unsafe { libc::ioctl(self.file.as_raw_fd(), BLKDISCARD as _, range.as_ptr()) };
        if r < 0 {
            -errno_of(&std::io::Error::last_os_error())
        } else {
            0
        }
    }

    /// Submit pending SQEs and gather completions until `min` (capped by what is in flight) arrived.
    fn reap_locked(&self, st: &mut State, min: usize, out: &mut Vec<IoCompletion>) -> Result<usize, std::io::Error> {
        let mut n = st.done.len();
        out.extend(st.done.drain(..));
        loop {
            n += self.drain_cq(st, out);
            let wait = n < min && st.in_ring > 0;
            if !wait && st.ring.submission().is_empty() {
                break;
            }
            if wait && self.spin_max_ns > 0 {
                let k = self.spin_for_completions(st, out);
                if k > 0 {
                    n += k;
                    continue;
                }
            }
            let want = if wait { (min - n).min(st.in_ring) } else { 0 };
            match enter(&mut st.ring, want) {
                Ok(()) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR)) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY | libc::ENOMEM)) => {
                    // Kernel short of resources: completions already posted free them; give it a moment.
                    let k = self.drain_cq(st, out);
                    if k == 0 {
                        std::thread::yield_now();
                    }
                    n += k;
                }
                Err(e) => return Err(e),
            }
        }
        if st.in_ring == 0 {
            if let Some(t) = st.busy_since.take() {
                st.stats.busy_ns += t.elapsed().as_nanos() as u64;
            }
        }
        Ok(n)
    }

    /// Poll for completions for up to the current budget, yielding the CPU between polls; returns how many
    /// arrived (0: the caller sleeps in io_uring_enter).
    ///
    /// Why: a sleeping waiter makes the completing side (an io-wq worker, an interrupt) pay for a wake-up, an
    /// IPI under virtualisation, for every completion it is waiting for. At high IOPS that costs more than the
    /// poll: on tmpfs at QD 32 here, 4 KiB random writes went from ~270 k to ~300-330 k IOPS (~400 k with
    /// `single_reaper`) with less CPU per I/O. `sched_yield` keeps the poll polite to other runnable tasks,
    /// and its return to user space runs this thread's pending io_uring task work, which posts completions,
    /// so no io_uring_enter is needed per poll. The budget adapts, doubling after a poll that found
    /// completions and halving after one that did not, so a slow device costs about one yield per wait.
    fn spin_for_completions(&self, st: &mut State, out: &mut Vec<IoCompletion>) -> usize {
        if !st.ring.submission().is_empty() && enter(&mut st.ring, 0).is_err() {
            return 0; // the blocking path retries and reports
        }
        let start = Instant::now();
        loop {
            std::thread::yield_now();
            let k = self.drain_cq(st, out);
            if k > 0 {
                st.spin_ns = (st.spin_ns * 2).min(self.spin_max_ns);
                return k;
            }
            if start.elapsed().as_nanos() as u64 >= st.spin_ns {
                st.spin_ns = (st.spin_ns / 2).max(SPIN_MIN_NS);
                return 0;
            }
        }
    }

    fn complete_now(&self, st: &mut State, req: IoRequest, result: Result<u64, DeviceError>, now_ns: u64) {
        st.stats.count_host(req.op, req.len, result.is_ok());
        st.done.push_back(IoCompletion {
            user_data: req.user_data,
            op: req.op,
            result,
            buf: req.buf,
            submitted_ns: now_ns,
            completed_ns: now_ns,
        });
    }
}

/// Hand the SQ to the kernel and wait until `want` CQEs are available.
fn enter(ring: &mut IoUring, want: usize) -> std::io::Result<()> {
    ring.submission().sync();
    ring.submit_and_wait(want)?;
    Ok(())
}

/// Claim `path` for this process alone through a descriptor of its own:
/// an exclusive `flock` on a regular file, `O_EXCL` on a block device. Not
/// the I/O descriptor: io_uring keeps a registered file open until its ring
/// is torn down, which the kernel finishes asynchronously after the process
/// exits, so a lock on it would outlive a killed server and refuse its
/// restart. This descriptor closes with the process.
/// (`shared`: a reader's claim on a regular file, `LOCK_SH`; a block
/// device's claim is `O_EXCL` for readers too, which has no shared form.)
fn claim(path: &Path, block_device: bool, shared: bool) -> Result<File, FileError> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | if block_device { libc::O_EXCL } else { 0 })
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => FileError::Busy { path: path.to_path_buf() },
            _ => FileError::Open { path: path.to_path_buf(), errno: errno_of(&e) },
        })?;
    // SAFETY: flock on a descriptor this function owns; released when it closes.
    let how = if shared { libc::LOCK_SH } else { libc::LOCK_EX };
    if !block_device && unsafe { libc::flock(f.as_raw_fd(), how | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(FileError::Busy { path: path.to_path_buf() });
        }
        return Err(FileError::Sys { path: path.to_path_buf(), what: "locking", errno: errno_of(&e) });
    }
    Ok(f)
}

/// Write zeros over the first `bytes` of the file at `path` (through the
/// page cache, 1 MiB at a time) and sync them. Returns the errno.
fn zero_fill(path: &Path, bytes: u64) -> Result<(), i32> {
    use std::io::Write;
    let errno = |e: std::io::Error| e.raw_os_error().unwrap_or(libc::EIO);
    let mut f = OpenOptions::new().write(true).open(path).map_err(errno)?;
    let zeros = vec![0u8; 1 << 20];
    let mut done = 0;
    while done < bytes {
        let n = (bytes - done).min(zeros.len() as u64) as usize;
        f.write_all(&zeros[..n]).map_err(errno)?;
        done += n as u64;
    }
    f.sync_data().map_err(errno)
}

/// Reserve `bytes` of disk for a new file: `fallocate`, or where the
/// filesystem has none, `posix_fallocate` (which writes zeros). Returns the errno.
fn allocate(file: &File, bytes: u64) -> Result<(), i32> {
    // SAFETY: fallocate on a descriptor the caller owns.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, bytes as libc::off_t) };
    if r == 0 {
        return Ok(());
    }
    let errno = errno_of(&std::io::Error::last_os_error());
    if errno != libc::EOPNOTSUPP {
        return Err(errno);
    }
    // SAFETY: as above; posix_fallocate returns the error number itself.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, bytes as libc::off_t) } {
        0 => Ok(()),
        e => Err(e),
    }
}

fn open_file(path: &Path, opts: &FileOptions) -> Result<(File, bool), FileError> {
    let open = |direct: bool| {
        OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .create(opts.capacity_bytes.is_some() && !opts.read_only)
            .mode(0o644)
            .custom_flags(libc::O_CLOEXEC | if direct { libc::O_DIRECT } else { 0 })
            .open(path)
    };
    let err = |e: std::io::Error| FileError::Open { path: path.to_path_buf(), errno: errno_of(&e) };
    match opts.cache {
        CacheMode::Buffered => open(false).map(|f| (f, false)).map_err(err),
        mode => match open(true) {
            Ok(f) => Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                if mode == CacheMode::DirectOrBuffered {
                    open(false).map(|f| (f, false)).map_err(err)
                } else {
                    Err(FileError::DirectUnsupported { path: path.to_path_buf() })
                }
            }
            Err(e) => Err(err(e)),
        },
    }
}

fn ioctl_u64(file: &File, req: libc::c_ulong) -> std::io::Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: the ioctl writes one u64.
    if unsafe { libc::ioctl(file.as_raw_fd(), req as _, &mut v as *mut u64) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(v)
}

fn ioctl_u32(file: &File, req: libc::c_ulong) -> std::io::Result<u32> {
    let mut v: libc::c_int = 0;
    // SAFETY: the ioctl writes one int.
    if unsafe { libc::ioctl(file.as_raw_fd(), req as _, &mut v as *mut libc::c_int) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(v as u32)
}

/// O_DIRECT (offset, memory) alignment of a regular file (statx STATX_DIOALIGN), when the filesystem reports it.
fn dio_align(file: &File) -> Option<(u64, u64)> {
    // SAFETY: statx fills the zeroed struct; the empty path with AT_EMPTY_PATH names the fd itself.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut stx) };
    if r != 0 || stx.stx_mask & libc::STATX_DIOALIGN == 0 || stx.stx_dio_offset_align == 0 {
        return None;
    }
    Some((stx.stx_dio_offset_align as u64, stx.stx_dio_mem_align as u64))
}

impl BlockDevice for FileDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&self, req: IoRequest) {
        let now_ns = self.now_ns();
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.in_ring + st.done.len() >= self.info.queue_depth_max {
            let err = DeviceError::QueueFull { queue_depth_max: self.info.queue_depth_max };
            return self.complete_now(st, req, Err(err), now_ns);
        }
        if let Err(e) = check_range(&self.info, &req) {
            return self.complete_now(st, req, Err(e), now_ns);
        }
        if let op @ (IoOp::ZoneAppend | IoOp::Zone(_)) = req.op {
            return self.complete_now(st, req, Err(DeviceError::Unsupported(op)), now_ns);
        }
        let idx = st.free.pop().expect("a free slot below the queue depth");
        let mut slot = Slot { req, done_bytes: 0, submitted_ns: now_ns };
        self.push_sqe(&mut st.ring, idx, &mut slot);
        st.slots[idx as usize] = Some(slot);
        if st.in_ring == 0 {
            st.busy_since = Some(Instant::now());
        }
        st.in_ring += 1;
    }

    fn reap(&self, min: usize, out: &mut Vec<IoCompletion>) -> usize {
        let mut st = self.lock();
        if self.single_reaper {
            let me = std::thread::current().id();
            let reaper = *st.reaper.get_or_insert(me);
            assert_eq!(reaper, me, "FileDevice opened with single_reaper reaped from a second thread");
        }
        // Any other enter failure (EBADF, EFAULT, ...) means the ring itself is broken: a bug, not an I/O error.
        self.reap_locked(&mut st, min, out).expect("io_uring_enter failed")
    }

    fn in_flight(&self) -> usize {
        let st = self.lock();
        st.in_ring + st.done.len()
    }

    /// `fdatasync` on the descriptor from the calling thread: the ring's
    /// lock is not held, so other threads' submits and reaps go on.
    fn flush_now(&self) -> Option<Result<(), DeviceError>> {
        // SAFETY: fdatasync on a descriptor this device keeps open.
        let rc = unsafe { libc::fdatasync(self.file.as_raw_fd()) };
        let result = if rc == 0 { Ok(()) } else { Err(DeviceError::from_io(&std::io::Error::last_os_error())) };
        self.lock().stats.count_host(IoOp::Flush, 0, result.is_ok());
        Some(result)
    }

    fn stats(&self) -> DeviceStats {
        let st = self.lock();
        let mut s = st.stats;
        if let Some(t) = st.busy_since {
            s.busy_ns += t.elapsed().as_nanos() as u64;
        }
        s
    }
}

impl Drop for FileDevice {
    fn drop(&mut self) {
        // The kernel may still read or write buffers held in slots: wait for every CQE before they are freed.
        let mut st = self.lock();
        let mut sink = Vec::new();
        while st.in_ring > 0 {
            let want = st.in_ring;
            if self.reap_locked(&mut st, want, &mut sink).is_err() {
                // Cannot wait: leak the buffers rather than free memory the kernel may still touch.
                for slot in st.slots.iter_mut() {
                    std::mem::forget(slot.take());
                }
                break;
            }
            sink.clear();
        }
    }
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
