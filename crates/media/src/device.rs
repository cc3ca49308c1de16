//! The one device interface: every byte Sluice stores goes through `BlockDevice`.
//!
//! A device takes requests (`submit`) and hands back completions (`reap`); many
//! requests may be in flight, up to `DeviceInfo::queue_depth_max`. Every
//! request yields exactly one completion, errors included, so the caller always
//! gets its buffer back. Offsets and lengths are bytes and must be multiples of
//! `DeviceInfo::block_bytes`; checking that is shared (`check_range`) so every
//! backend and emulator rejects the same things with the same typed error.
//!
//! Zoned devices additionally implement `ZonedDevice` (report zones, limits);
//! zone append and zone management travel as ordinary requests because on real
//! hardware they are commands with latency like any other.

use crate::buf::IoBuf;
use serde::Serialize;

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    /// Read `len` bytes at `offset` into the buffer (the buffer's length is `len`).
    Read,
    /// Write the buffer at `offset`.
    Write,
    /// Make every completed write durable.
    Flush,
    /// Drop `len` bytes at `offset`; later reads return zeros.
    Discard,
    /// Zoned devices: write the buffer at the write pointer of the zone that
    /// starts at `offset`; the completion's value is the byte offset written.
    ZoneAppend,
    /// Zoned devices: a zone management action on the zone starting at `offset`.
    Zone(ZoneAction),
}

/// Zone management actions (NVMe ZNS Zone Management Send).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZoneAction {
    Open,
    Close,
    Finish,
    Reset,
}

/// One request. `user_data` comes back untouched in the completion.
#[derive(Debug)]
pub struct IoRequest {
    pub op: IoOp,
    pub offset: u64,
    /// Bytes to read or discard; for writes it must equal `buf.len()`.
    pub len: u64,
    pub buf: IoBuf,
    /// Force unit access: the write is durable when it completes.
    pub fua: bool,
    pub user_data: u64,
}

impl IoRequest {
    pub fn read(offset: u64, len: usize, user_data: u64) -> IoRequest {
        IoRequest { op: IoOp::Read, offset, len: len as u64, buf: IoBuf::zeroed(len), fua: false, user_data }
    }
    pub fn write(offset: u64, buf: IoBuf, user_data: u64) -> IoRequest {
        IoRequest { op: IoOp::Write, offset, len: buf.len() as u64, buf, fua: false, user_data }
    }
    pub fn flush(user_data: u64) -> IoRequest {
        IoRequest { op: IoOp::Flush, offset: 0, len: 0, buf: IoBuf::empty(), fua: false, user_data }
    }
    pub fn discard(offset: u64, len: u64, user_data: u64) -> IoRequest {
        IoRequest { op: IoOp::Discard, offset, len, buf: IoBuf::empty(), fua: false, user_data }
    }
    pub fn zone_append(zone_start: u64, buf: IoBuf, user_data: u64) -> IoRequest {
        IoRequest { op: IoOp::ZoneAppend, offset: zone_start, len: buf.len() as u64, buf, fua: false, user_data }
    }
    pub fn zone(action: ZoneAction, zone_start: u64, user_data: u64) -> IoRequest {
        IoRequest { op: IoOp::Zone(action), offset: zone_start, len: 0, buf: IoBuf::empty(), fua: false, user_data }
    }
}

/// The answer to one request.
#[derive(Debug)]
pub struct IoCompletion {
    pub user_data: u64,
    pub op: IoOp,
    /// Bytes transferred, or for `ZoneAppend` the byte offset the data landed at.
    pub result: Result<u64, DeviceError>,
    pub buf: IoBuf,
    /// Device clock at submission and completion (ns); equal for untimed backends.
    pub submitted_ns: u64,
    pub completed_ns: u64,
}

impl IoCompletion {
    /// The completion of `req` with `result`, for an untimed device.
    pub fn untimed(req: IoRequest, result: Result<u64, DeviceError>) -> IoCompletion {
        IoCompletion { user_data: req.user_data, op: req.op, result, buf: req.buf, submitted_ns: 0, completed_ns: 0 }
    }
}

/// NVMe ZNS status codes a zoned device returns for rule violations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ZoneError {
    #[error("zone invalid write: write does not start at the write pointer")]
    InvalidWrite,
    #[error("zone boundary error: write crosses the zone's writable capacity")]
    BoundaryError,
    #[error("zone is full")]
    ZoneIsFull,
    #[error("zone is read only")]
    ZoneIsReadOnly,
    #[error("zone is offline")]
    ZoneIsOffline,
    #[error("too many active zones")]
    TooManyActive,
    #[error("too many open zones")]
    TooManyOpen,
    #[error("invalid zone state transition")]
    InvalidStateTransition,
    #[error("not the start of a zone")]
    NotZoneStart,
    #[error("zone append larger than the zone append size limit")]
    AppendTooLarge,
}

/// Operating errors of a device: typed, so callers can act on them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    #[error("offset {offset} or length {len} not aligned to the {block_bytes}-byte block")]
    Misaligned { offset: u64, len: u64, block_bytes: u64 },
    #[error("range {offset}+{len} beyond the device capacity {capacity_bytes}")]
    OutOfRange { offset: u64, len: u64, capacity_bytes: u64 },
    #[error("buffer of {buf_len} bytes does not match request length {len}")]
    BadBuffer { buf_len: u64, len: u64 },
    #[error("{0:?} is not supported by this device")]
    Unsupported(IoOp),
    #[error("more than {queue_depth_max} requests in flight")]
    QueueFull { queue_depth_max: usize },
    #[error("zoned device: {0}")]
    Zone(#[from] ZoneError),
    #[error("I/O error: {}", std::io::Error::from_raw_os_error(*errno))]
    Io { errno: i32 },
    #[error("injected fault")]
    Injected,
}

impl DeviceError {
    pub fn from_io(e: &std::io::Error) -> DeviceError {
        DeviceError::Io { errno: e.raw_os_error().unwrap_or(libc::EIO) }
    }
}

/// Static description of a device.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceInfo {
    /// Human label, e.g. "qlc-16t" or "memory".
    pub name: String,
    pub capacity_bytes: u64,
    /// Smallest addressable unit; every offset and length is a multiple of it.
    pub block_bytes: u64,
    /// Most requests in flight at once.
    pub queue_depth_max: usize,
    /// Best write granularity (the IU of a conventional SSD, the block otherwise).
    pub optimal_write_bytes: u64,
    pub zoned: bool,
}

/// Counters every device keeps. Media fields stay 0 on devices without a model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceStats {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub host_read_bytes: u64,
    pub host_write_bytes: u64,
    pub host_discard_bytes: u64,
    /// Bytes programmed to the medium (NAND pages incl. RMW and internal GC).
    pub media_program_bytes: u64,
    /// Bytes read from the medium (host reads, RMW reads, GC reads).
    pub media_read_bytes: u64,
    /// Erase-block erases (NAND) or zone resets (ZNS).
    pub erases: u64,
    /// Time the device had at least one request in flight (ns of its clock).
    pub busy_ns: u64,
    pub errors: u64,
}

impl DeviceStats {
    /// Device WAF: media bytes programmed / host bytes written (0 if nothing written).
    pub fn device_waf(&self) -> f64 {
        if self.host_write_bytes == 0 {
            0.0
        } else {
            self.media_program_bytes as f64 / self.host_write_bytes as f64
        }
    }

    /// Counter-wise difference `self - earlier` (for measuring a window).
    pub fn since(&self, earlier: &DeviceStats) -> DeviceStats {
        self.zip_with(earlier, |a, b| a - b)
    }

    /// Counter-wise sum (counters kept in shards, added up when read).
    pub fn plus(&self, o: &DeviceStats) -> DeviceStats {
        self.zip_with(o, |a, b| a + b)
    }

    /// `f` of each counter and its counterpart in `o`.
    fn zip_with(&self, o: &DeviceStats, f: impl Fn(u64, u64) -> u64) -> DeviceStats {
        DeviceStats {
            reads: f(self.reads, o.reads),
            writes: f(self.writes, o.writes),
            flushes: f(self.flushes, o.flushes),
            discards: f(self.discards, o.discards),
            host_read_bytes: f(self.host_read_bytes, o.host_read_bytes),
            host_write_bytes: f(self.host_write_bytes, o.host_write_bytes),
            host_discard_bytes: f(self.host_discard_bytes, o.host_discard_bytes),
            media_program_bytes: f(self.media_program_bytes, o.media_program_bytes),
            media_read_bytes: f(self.media_read_bytes, o.media_read_bytes),
            erases: f(self.erases, o.erases),
            busy_ns: f(self.busy_ns, o.busy_ns),
            errors: f(self.errors, o.errors),
        }
    }

    /// Count a completed host request in the host-side counters.
    pub fn count_host(&mut self, op: IoOp, len: u64, ok: bool) {
        if !ok {
            self.errors += 1;
            return;
        }
        match op {
            IoOp::Read => {
                self.reads += 1;
                self.host_read_bytes += len;
            }
            IoOp::Write | IoOp::ZoneAppend => {
                self.writes += 1;
                self.host_write_bytes += len;
            }
            IoOp::Flush => self.flushes += 1,
            IoOp::Discard => {
                self.discards += 1;
                self.host_discard_bytes += len;
            }
            IoOp::Zone(_) => {}
        }
    }
}

/// The only path to storage.
pub trait BlockDevice: Send + Sync {
    fn info(&self) -> &DeviceInfo;

    /// Queue a request. Never fails here: problems come back in its completion.
    fn submit(&self, req: IoRequest);

    /// Move at least `min` completions (fewer only if fewer are in flight) into
    /// `out`, plus any others already finished. Returns how many were added.
    fn reap(&self, min: usize, out: &mut Vec<IoCompletion>) -> usize;

    /// Requests submitted and not yet reaped.
    fn in_flight(&self) -> usize;

    fn stats(&self) -> DeviceStats;

    /// The zoned interface, if this device is zoned.
    fn as_zoned(&self) -> Option<&dyn ZonedDevice> {
        None
    }

    /// Whether `reap` and `in_flight` answer for the calling thread alone
    /// (`SharedDevice`), so many threads may use the device at once. A
    /// device must be wrapped once: two wrappers over one device would reap
    /// each other's completions.
    fn is_shared(&self) -> bool {
        false
    }

    /// When the next completion `reap` would return is due on the device's
    /// clock, if the device knows (emulated media do); None otherwise.
    /// Lets a device built of several (`StripedDevice`) reap in clock order.
    fn next_completion_ns(&self) -> Option<u64> {
        None
    }

    /// Makes every write completed so far durable, synchronously and
    /// without going through (or waiting behind) the request queue: a
    /// file's `fdatasync`. None if the device has no such path; the caller
    /// then submits an `IoOp::Flush`. Counted as a flush in `stats`.
    fn flush_now(&self) -> Option<Result<(), DeviceError>> {
        None
    }

    /// Runs `req` to completion in the calling thread, beside the request
    /// queue rather than through it, if the device can (one that completes
    /// every request at submission anyway: memory); otherwise hands `req`
    /// back untouched and the caller submits it. Counted in `stats` like a
    /// queued request. What makes a synchronous request from many threads
    /// at once cost no shared queue (`sync_io`).
    fn execute_now(&self, req: IoRequest) -> Result<IoCompletion, IoRequest> {
        Err(req)
    }

    /// Whether `execute_now` always runs the request (never hands it
    /// back): synchronous I/O then never occupies the request queue, and
    /// callers need not bound it against the queue depth.
    fn runs_inline(&self) -> bool {
        false
    }
}

/// A small number naming the calling thread (cheaper than `ThreadId`,
/// which clones the thread handle on every call): what shards per-thread
/// state (`SharedDevice`'s routing, a memory device's counters).
pub fn thread_no() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    thread_local!(static NO: u64 = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    NO.with(|n| *n)
}

/// Zone state per NVMe ZNS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ZoneState {
    Empty,
    ImplicitlyOpen,
    ExplicitlyOpen,
    Closed,
    Full,
    ReadOnly,
    Offline,
}

/// One zone as Report Zones describes it (byte units).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ZoneDesc {
    pub start: u64,
    pub size_bytes: u64,
    pub capacity_bytes: u64,
    pub write_pointer: u64,
    pub state: ZoneState,
}

/// Limits of a zoned device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ZoneLimits {
    pub zone_size_bytes: u64,
    pub zone_capacity_bytes: u64,
    pub zone_count: u64,
    /// 0 = no limit.
    pub max_open: u32,
    /// 0 = no limit.
    pub max_active: u32,
    pub zone_append_max_bytes: u64,
}

pub trait ZonedDevice: BlockDevice {
    fn zone_limits(&self) -> ZoneLimits;
    /// Up to `max` zones starting with the zone containing `from`.
    fn report_zones(&self, from: u64, max: usize) -> Vec<ZoneDesc>;
}

/// Shared request validation: alignment, range, buffer length, by op.
pub fn check_range(info: &DeviceInfo, req: &IoRequest) -> Result<(), DeviceError> {
    let bs = info.block_bytes;
    match req.op {
        IoOp::Flush => return Ok(()),
        IoOp::Zone(_) => {
            if !req.offset.is_multiple_of(bs) {
                return Err(DeviceError::Misaligned { offset: req.offset, len: 0, block_bytes: bs });
            }
            if req.offset >= info.capacity_bytes {
                return Err(DeviceError::OutOfRange {
                    offset: req.offset,
                    len: 0,
                    capacity_bytes: info.capacity_bytes,
                });
            }
            return Ok(());
        }
        IoOp::Read | IoOp::Write | IoOp::ZoneAppend => {
            if req.buf.len() as u64 != req.len {
                return Err(DeviceError::BadBuffer { buf_len: req.buf.len() as u64, len: req.len });
            }
        }
        IoOp::Discard => {}
    }
    if !req.offset.is_multiple_of(bs) || !req.len.is_multiple_of(bs) || req.len == 0 {
        return Err(DeviceError::Misaligned { offset: req.offset, len: req.len, block_bytes: bs });
    }
    match req.offset.checked_add(req.len) {
        Some(end) if end <= info.capacity_bytes => Ok(()),
        _ => Err(DeviceError::OutOfRange { offset: req.offset, len: req.len, capacity_bytes: info.capacity_bytes }),
    }
}

/// Convenience for callers that own a device exclusively (tests, tools): one
/// request, wait for it. Must not be mixed with other in-flight requests.
pub fn sync_io(dev: &dyn BlockDevice, req: IoRequest) -> IoCompletion {
    let req = match dev.execute_now(req) {
        Ok(done) => return done,
        Err(req) => req,
    };
    debug_assert_eq!(dev.in_flight(), 0, "sync_io needs an otherwise idle device");
    dev.submit(req);
    let mut out = Vec::with_capacity(1);
    dev.reap(1, &mut out);
    out.pop().expect("a submitted request always completes")
}

/// Read `len` bytes at `offset`, synchronously.
pub fn read_at(dev: &dyn BlockDevice, offset: u64, len: usize) -> Result<IoBuf, DeviceError> {
    let c = sync_io(dev, IoRequest::read(offset, len, 0));
    c.result.map(|_| c.buf)
}

/// Write `data` at `offset`, synchronously.
pub fn write_at(dev: &dyn BlockDevice, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
    sync_io(dev, IoRequest::write(offset, IoBuf::from_slice(data), 0)).result.map(|_| ())
}

/// Flush, synchronously.
pub fn flush(dev: &dyn BlockDevice) -> Result<(), DeviceError> {
    sync_io(dev, IoRequest::flush(0)).result.map(|_| ())
}

/// Discard a range, synchronously.
pub fn discard(dev: &dyn BlockDevice, offset: u64, len: u64) -> Result<(), DeviceError> {
    sync_io(dev, IoRequest::discard(offset, len, 0)).result.map(|_| ())
}
