//! The transmission phase of one connection: read requests, run them on the
//! export from a small worker pool, send replies (possibly out of order).
//!
//! Owns: request validation (command, flags, alignment, bounds, sizes), the
//! mapping of each NBD command to `Volume` calls, the mapping of errors to
//! NBD errno values, and reply encoding (simple, or structured when
//! negotiated).
//!
//! Design: the connection thread is the *reader*: it decodes a header, waits
//! for room under `inflight_bytes_max`, reads the write payload, and either
//! runs the request itself or hands it to the server's worker pool
//! (`pool.rs`), as the volume's measured service time says (dispatch.rs).
//! Consecutive writes run by the reader share one `write_batch`. Replies
//! are written as one buffer each under the writer lock, so they never
//! interleave on the wire, and may go out of order. On NBD_CMD_DISC,
//! end of stream or a framing error the reader stops, waits until every
//! request already read was answered (their replies still go out when the
//! socket allows), and the connection closes.
//!
//! Invariants: a request is validated before any volume call, so a bad
//! request never changes data; a read reply carries exactly the requested
//! bytes or an error (never a partial payload); structured replies always
//! end with a chunk flagged DONE; a malformed request ends only this
//! connection.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use sluice_volume::{Volume, VolumeError, WriteBuf};

use crate::dispatch::Pace;
use crate::handshake::Session;
use crate::pool::WorkerPool;
use crate::proto::{self, Chunk, Command, ProtoError, RequestHeader, SimpleReply};
use crate::shared::{log_client, ConnError, ServerStats, Shared, DRAIN_QUIET};
use crate::stream::{ConnReader, Stream};
use crate::subblock::{self, WriteOrder};

/// Budget charged for a request beyond its data bytes (bounds the number of
/// queued zero-length requests too).
const REQUEST_OVERHEAD_BYTES: u64 = 4096;
/// Chunk used to write zeroes when a hole is not allowed (NO_HOLE).
const ZERO_CHUNK_BYTES: usize = 1 << 20;

/// The in-flight byte budget of one connection.
///
/// Waiters are counted so that a release wakes only when someone waits: the
/// standard library's condition variable makes a system call on every
/// notify, and releases happen once per request.
struct Budget {
    /// (bytes in use, threads waiting on `freed`)
    used: Mutex<(u64, usize)>,
    freed: Condvar,
    max: u64,
}

impl Budget {
    fn new(max: u64) -> Budget {
        Budget { used: Mutex::new((0, 0)), freed: Condvar::new(), max }
    }

    /// Blocks until `cost` fits (a lone request always fits).
    fn acquire(&self, cost: u64) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        while used.0 > 0 && used.0 + cost > self.max {
            used = self.wait(used);
        }
        used.0 += cost;
    }

    fn release(&self, cost: u64) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        used.0 -= cost;
        if used.1 > 0 {
            self.freed.notify_all();
        }
    }

    /// Blocks until every acquired byte was released.
    fn wait_empty(&self) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        while used.0 > 0 {
            used = self.wait(used);
        }
    }

    fn wait<'a>(&self, mut used: MutexGuard<'a, (u64, usize)>) -> MutexGuard<'a, (u64, usize)> {
        used.1 += 1;
        let mut used = self.freed.wait(used).unwrap_or_else(PoisonError::into_inner);
        used.1 -= 1;
        used
    }
}

struct Release<'a> {
    budget: &'a Budget,
    cost: u64,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.budget.release(self.cost);
    }
}

/// Serialises replies; once a write fails the socket is shut down so the
/// reader stops too.
///
/// Requests run on the reader thread (dispatch.rs) have their small replies
/// held and sent together (`flush`) when the reader has no further request
/// to run: one system call per burst of requests instead of one per reply.
/// Requests run on the pool reply at once.
struct ReplyWriter {
    stream: Mutex<Stream>,
    broken: AtomicBool,
    held: Mutex<Vec<u8>>,
}

/// Replies from this size on are sent at once rather than held (holding
/// would only add a copy), and held replies are sent once they reach it.
const HELD_BYTES_MAX: usize = 64 << 10;
/// Reply buffer a connection keeps between bursts.
const HELD_BYTES_KEPT: usize = 4 << 10;

impl ReplyWriter {
    fn send(&self, buf: &[u8]) {
        let mut h = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if buf.len() < HELD_BYTES_MAX {
            h.extend_from_slice(buf);
            if h.len() >= HELD_BYTES_MAX {
                self.write(&h);
                h.clear();
            }
            return;
        }
        if !h.is_empty() {
            self.write(&h);
            h.clear();
        }
        drop(h);
        self.write(buf);
    }

    /// Sends every held reply. Called when the reader is about to wait for
    /// the client, so it also gives back all but a little of the buffer: a
    /// quiet connection holds no large reply buffer.
    fn flush(&self) {
        let mut h = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if !h.is_empty() {
            self.write(&h);
            h.clear();
        }
        h.shrink_to(HELD_BYTES_KEPT);
    }

    fn write(&self, buf: &[u8]) {
        if self.broken.load(Ordering::Relaxed) {
            return;
        }
        let mut s = self.stream.lock().unwrap_or_else(PoisonError::into_inner);
        if s.write_all(buf).is_err() {
            self.broken.store(true, Ordering::Relaxed);
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

struct Job {
    header: RequestHeader,
    command: Command,
    /// A write's data, received into the volume's own buffer.
    payload: Option<WriteBuf>,
    cost: u64,
}

/// Everything a worker needs to run one of this connection's requests.
struct Conn {
    export: Arc<dyn Volume>,
    /// Held shared by writes, exclusively by sub-block read-modify-writes.
    order: Arc<WriteOrder>,
    /// Any offset and length is served (`subblock`), not only whole blocks.
    byte_granular: bool,
    /// Writes, trims and zeroes get EPERM (a read-only export or grant).
    read_only: bool,
    /// Which requests run on the reader thread, from how long they took.
    pace: Pace,
    structured: bool,
    base_allocation: Option<u32>,
    request_bytes_max: u32,
    block_status_extents_max: usize,
    out: ReplyWriter,
    budget: Budget,
    stats: Arc<ServerStats>,
    /// The client's address, for the log (`log_client`).
    peer: String,
}

/// How a request ended.
enum Outcome {
    Ok,
    /// A read: `buf` holds the reply header space, then the data.
    Data {
        buf: Vec<u8>,
        prefix: usize,
    },
    BlockStatus {
        context_id: u32,
        descriptors: Vec<(u32, u32)>,
    },
    Err {
        errno: u32,
        message: String,
    },
}

fn err(errno: u32, message: impl Into<String>) -> Outcome {
    Outcome::Err { errno, message: message.into() }
}

/// Runs the transmission phase until DISC, end of stream or a fatal error;
/// returns once every request read was answered (or its reply failed).
pub(crate) fn run(
    session: Session,
    reader: &mut ConnReader,
    writer: Stream,
    shared: &Shared,
    stats: &Arc<ServerStats>,
) -> Result<(), ConnError> {
    let (_, _, request_bytes_max) = shared.block_sizes(session.export.as_ref());
    let peer = writer.peer();
    let conn = Arc::new(Conn {
        export: session.export.clone(),
        order: session.order.clone(),
        byte_granular: session.byte_granular,
        read_only: session.read_only,
        pace: Pace::new(shared.opts.slow_request_ns),
        structured: session.structured,
        base_allocation: session.base_allocation,
        request_bytes_max,
        block_status_extents_max: shared.opts.block_status_extents_max.max(1),
        out: ReplyWriter { stream: Mutex::new(writer), broken: AtomicBool::new(false), held: Mutex::new(Vec::new()) },
        budget: Budget::new(shared.opts.inflight_bytes_max),
        stats: stats.clone(),
        peer,
    });
    let r = read_requests(&conn, reader, shared);
    conn.out.flush();
    // Every queued request holds budget until it is answered.
    conn.budget.wait_empty();
    r
}

/// The reader loop: returns Ok on DISC or a clean end of stream.
fn read_requests(conn: &Arc<Conn>, reader: &mut ConnReader, shared: &Shared) -> Result<(), ConnError> {
    let pool = &shared.pool;
    // Stopping: until when requests sent as the stop began are still read.
    let mut drain_until: Option<std::time::Instant> = None;
    loop {
        if conn.pace.inline_writes() && buffered_writes(conn, reader, pool) > 0 {
            continue;
        }
        if reader.buffer().len() < proto::REQUEST_HEADER_BYTES {
            // About to wait for the client: answer what was run.
            conn.out.flush();
        }
        let mut hb = [0u8; proto::REQUEST_HEADER_BYTES];
        if !read_exact_or_eof(reader, &mut hb)? {
            // A stopping server shut the read side: requests the client
            // sent as the stop began are still answered (DRAIN_QUIET).
            if shared.stopping.load(Ordering::SeqCst) {
                let until = *drain_until.get_or_insert_with(|| std::time::Instant::now() + DRAIN_QUIET);
                if reader.sends_more_within(until.saturating_duration_since(std::time::Instant::now())) {
                    continue;
                }
            }
            return Ok(());
        }
        let header = RequestHeader::decode(&hb)?;
        conn.stats.requests.fetch_add(1, Ordering::Relaxed);
        let command = match header.validate(conn.structured) {
            Ok(c) => c,
            Err(e) => {
                // Answer EINVAL; a write's payload must still be consumed to
                // stay in sync. An unknown command is assumed to carry none.
                if header.payload_len() > 0 {
                    if let Err(e) = discard_payload(conn, reader, header.len) {
                        refuse_oversized(conn, &header, &e);
                        return Err(e);
                    }
                }
                conn.reply(&header, None, err(proto::EINVAL, e.to_string()));
                continue;
            }
        };
        if command == Command::Disc {
            return Ok(());
        }
        let data_bytes = match command {
            Command::Read | Command::Write if header.len <= conn.request_bytes_max => header.len as u64,
            _ => 0,
        };
        let cost = data_bytes + REQUEST_OVERHEAD_BYTES;
        let mut payload = None;
        if command == Command::Write {
            if header.len > conn.request_bytes_max {
                let e = ConnError::PayloadTooLarge { len: header.len, max: conn.request_bytes_max };
                refuse_oversized(conn, &header, &e);
                return Err(e);
            }
            conn.budget.acquire(cost);
            let mut data = conn.export.write_buffer(header.len as usize);
            if let Err(e) = reader.read_exact(data.data_mut()) {
                conn.budget.release(cost);
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    let what = format!(
                        "disconnected in the middle of a write's payload ({} bytes at byte {}): the write was not done",
                        header.len, header.offset
                    );
                    log_client(&conn.peer, &what);
                }
                return Err(e.into());
            }
            payload = Some(data);
        } else {
            conn.budget.acquire(cost);
        }
        let job = Job { header, command, payload, cost };
        if conn.pace.inline(command) {
            conn.execute(job, false);
        } else {
            conn.to_worker(pool, job);
        }
    }
}

/// Most writes, and most bytes, one group commit takes.
const BATCH_WRITES_MAX: usize = 64;
const BATCH_BYTES_MAX: usize = 1 << 20;

/// While writes run on the reader thread: if its buffer starts with plain
/// (non-FUA) writes received whole, runs them straight from the buffer as
/// one `write_batch` — no copy, no wait for more bytes — answers them all in
/// one send, and returns how many. FLUSH requests among them are taken too
/// and handed to the workers once the batch is written: a flush then covers
/// every write before it (and some after it, which NBD allows), and the
/// batch is not cut at every flush. Stops at the first request that is
/// anything else, incomplete, or would be refused, which the reader loop
/// then handles as usual.
fn buffered_writes(conn: &Arc<Conn>, reader: &mut ConnReader, pool: &Arc<WorkerPool>) -> usize {
    let buffered = reader.buffer();
    let mut taken: Vec<(RequestHeader, std::ops::Range<usize>)> = Vec::new();
    let mut flushes: Vec<RequestHeader> = Vec::new();
    let (mut pos, mut bytes) = (0, 0);
    let block = conn.export.block_bytes();
    while taken.len() < BATCH_WRITES_MAX {
        let Some(hb) = buffered.get(pos..pos + proto::REQUEST_HEADER_BYTES) else { break };
        let Ok(header) = RequestHeader::decode(hb) else { break };
        let (len, data) = (header.len as usize, pos + proto::REQUEST_HEADER_BYTES);
        if header.validate(conn.structured) == Ok(Command::Flush) && conn.check(Command::Flush, &header).is_ok() {
            flushes.push(header);
            pos = data;
            continue;
        }
        let plain_write = header.validate(conn.structured) == Ok(Command::Write)
            && header.flags & proto::CMD_FLAG_FUA == 0
            && len > 0
            && subblock::aligned(header.offset, len as u64, block)
            && bytes + len <= BATCH_BYTES_MAX
            && buffered.len() >= data + len
            && conn.check(Command::Write, &header).is_ok();
        if !plain_write {
            break;
        }
        taken.push((header, data..data + len));
        pos = data + len;
        bytes += len;
    }
    if taken.is_empty() && flushes.is_empty() {
        return 0;
    }
    conn.stats.requests.fetch_add((taken.len() + flushes.len()) as u64, Ordering::Relaxed);
    let writes: Vec<(u64, &[u8])> = taken.iter().map(|(h, r)| (h.offset, &buffered[r.clone()])).collect();
    let result = match writes.is_empty() {
        true => Ok(()),
        false => {
            let _order = conn.order.shared();
            let t = Instant::now();
            let r = conn.export.write_batch(&writes, false);
            let per_write = t.elapsed().as_nanos() as u64 / writes.len() as u64;
            conn.pace.record(Command::Write, per_write);
            r
        }
    };
    let mut out = Vec::with_capacity(taken.len() * proto::SIMPLE_REPLY_BYTES);
    for (h, _) in &taken {
        let outcome = match &result {
            Ok(()) => Outcome::Ok,
            Err(e) => volume_err(Command::Write, e),
        };
        conn.encode_reply(h, Some(Command::Write), outcome, &mut out);
    }
    conn.out.send(&out);
    reader.consume(pos);
    for header in &flushes {
        let cost = REQUEST_OVERHEAD_BYTES;
        conn.budget.acquire(cost);
        conn.to_worker(pool, Job { header: *header, command: Command::Flush, payload: None, cost });
    }
    taken.len() + flushes.len()
}

/// Reads `buf` fully; `Ok(false)` on end of stream before its first byte.
fn read_exact_or_eof<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<bool, ConnError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(ProtoError::Truncated { what: "request header", need: buf.len(), have: got }.into());
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// A write whose payload is beyond the maximum cannot be skipped cheaply
/// (up to 4 GiB): answer it with EOVERFLOW, as the NBD spec allows, before
/// the connection closes, so the client learns why.
fn refuse_oversized(conn: &Conn, header: &RequestHeader, e: &ConnError) {
    if matches!(e, ConnError::PayloadTooLarge { .. }) {
        conn.reply(header, None, err(proto::EOVERFLOW, e.to_string()));
        conn.out.flush();
    }
}

/// Skips the payload of a write that is refused before execution.
fn discard_payload<R: Read>(conn: &Conn, reader: &mut R, len: u32) -> Result<(), ConnError> {
    if len > conn.request_bytes_max {
        return Err(ConnError::PayloadTooLarge { len, max: conn.request_bytes_max });
    }
    let copied = io::copy(&mut reader.take(len as u64), &mut io::sink())?;
    if copied != len as u64 {
        return Err(ProtoError::Truncated { what: "write payload", need: len as usize, have: copied as usize }.into());
    }
    Ok(())
}

impl Conn {
    /// Hands a request to the worker pool. Its reply goes out at once, not
    /// into the held replies (the reader may be waiting for the client,
    /// with nothing left to flush them).
    fn to_worker(self: &Arc<Conn>, pool: &Arc<WorkerPool>, job: Job) {
        let conn = self.clone();
        pool.submit(Box::new(move || conn.execute(job, true)));
    }

    /// Runs one request and answers it; `direct`: send the reply now rather
    /// than hold it for the reader's next flush.
    fn execute(&self, mut job: Job, direct: bool) {
        // Released even if the volume panics, so the reader never waits on
        // budget that will not come back.
        let _release = Release { budget: &self.budget, cost: job.cost };
        let t = Instant::now();
        let outcome = self.outcome(&mut job);
        self.pace.record(job.command, t.elapsed().as_nanos() as u64);
        self.reply_to(&job.header, Some(job.command), outcome, direct);
    }

    fn outcome(&self, job: &mut Job) -> Outcome {
        let h = &job.header;
        if let Err(o) = self.check(job.command, h) {
            return o;
        }
        let v = self.export.as_ref();
        let fua = h.flags & proto::CMD_FLAG_FUA != 0;
        let (off, len) = (h.offset, h.len as u64);
        // Only a byte-granular session gets here with a partial block.
        let whole = subblock::aligned(off, len, v.block_bytes());
        let (_shared, _exclusive) = match job.command {
            Command::Write | Command::WriteZeroes if !whole => (None, Some(self.order.exclusive())),
            Command::Write | Command::WriteZeroes | Command::Trim => (Some(self.order.shared()), None),
            _ => (None, None),
        };
        let r = match job.command {
            Command::Read => return self.read(off, h.len, whole),
            Command::Write => match job.payload.take() {
                Some(data) if len > 0 && whole => v.write_owned(off, data, fua),
                Some(data) if len > 0 => subblock::write(v, off, data.data(), fua),
                _ => Ok(()),
            },
            Command::Flush => v.flush(),
            Command::Trim if len == 0 => Ok(()),
            Command::Trim if whole => v.trim(off, len).and_then(|()| if fua { v.flush() } else { Ok(()) }),
            Command::Trim => subblock::trim(v, off, len).and_then(|()| if fua { v.flush() } else { Ok(()) }),
            // A hint: the range is valid, nothing else to do.
            Command::Cache => Ok(()),
            Command::WriteZeroes if len == 0 => Ok(()),
            Command::WriteZeroes => return self.write_zeroes(h, fua, whole),
            Command::BlockStatus => return self.block_status(h, whole),
            Command::Disc => Ok(()),
        };
        match r {
            Ok(()) => Outcome::Ok,
            Err(e) => volume_err(job.command, &e),
        }
    }

    /// Validates alignment, bounds and sizes before any volume call.
    fn check(&self, command: Command, h: &RequestHeader) -> Result<(), Outcome> {
        let v = self.export.as_ref();
        let bs = v.block_bytes();
        let (off, len) = (h.offset, h.len as u64);
        let ranged = match command {
            Command::Flush | Command::Disc => false,
            Command::BlockStatus => {
                let Some(_) = self.base_allocation else {
                    return Err(err(proto::EINVAL, "no metadata context negotiated"));
                };
                if len == 0 {
                    return Err(err(proto::EINVAL, "zero-length block status"));
                }
                true
            }
            _ => true,
        };
        if self.read_only && matches!(command, Command::Write | Command::Trim | Command::WriteZeroes) {
            return Err(err(proto::EPERM, "the export is read-only for this client"));
        }
        if !ranged {
            return Ok(());
        }
        // Zeroes carry no payload and are written in bounded pieces: any
        // length is served, as nbdkit and qemu-nbd do (nbdcopy zeroes a
        // whole hole in one request).
        // CACHE carries no data either: any length, like a trim.
        let sized = matches!(command, Command::Read | Command::Write);
        if sized && h.len > self.request_bytes_max {
            let msg = format!("length {len} beyond the maximum block size {}", self.request_bytes_max);
            return Err(err(proto::EINVAL, msg));
        }
        if !self.byte_granular && !subblock::aligned(off, len, bs) {
            return Err(err(proto::EINVAL, format!("offset {off} or length {len} not a multiple of {bs}")));
        }
        let beyond = off.checked_add(len).is_none_or(|end| end > v.size_bytes());
        if beyond {
            // The spec: ENOSPC for writes past the end, EINVAL otherwise.
            let errno = match command {
                Command::Write | Command::WriteZeroes => proto::ENOSPC,
                _ => proto::EINVAL,
            };
            return Err(err(errno, format!("range {off}+{len} beyond the export size {}", v.size_bytes())));
        }
        Ok(())
    }

    fn read(&self, off: u64, len: u32, whole: bool) -> Outcome {
        if len == 0 {
            return Outcome::Ok;
        }
        let prefix = if self.structured { proto::OFFSET_DATA_PREFIX_BYTES } else { proto::SIMPLE_REPLY_BYTES };
        let mut buf = vec![0u8; prefix + len as usize];
        let r = if whole {
            self.export.read(off, &mut buf[prefix..])
        } else {
            subblock::read(self.export.as_ref(), off, &mut buf[prefix..])
        };
        match r {
            Ok(()) => Outcome::Data { buf, prefix },
            Err(e) => volume_err(Command::Read, &e),
        }
    }

    /// `whole`: the range is made of whole blocks; otherwise the caller
    /// holds the write order exclusively and the edges are patched.
    fn write_zeroes(&self, h: &RequestHeader, fua: bool, whole: bool) -> Outcome {
        let v = self.export.as_ref();
        let (off, len) = (h.offset, h.len as u64);
        let fast = h.flags & proto::CMD_FLAG_FAST_ZERO != 0;
        let no_hole = h.flags & proto::CMD_FLAG_NO_HOLE != 0;
        if no_hole && fast {
            // Allocated zeroes mean writing data: no faster than a write.
            return err(proto::ENOTSUP, "zeroes without a hole are written as data: not fast");
        }
        // Zeroes whole blocks.
        let zero = |off: u64, len: u64| {
            if !no_hole {
                // The volume zeroes by metadata (it may deallocate): fast.
                return v.write_zeroes(off, len, fua);
            }
            let zeros = vec![0u8; ZERO_CHUNK_BYTES.min(len as usize)];
            let mut done = 0;
            while done < len {
                let n = (len - done).min(zeros.len() as u64);
                v.write(off + done, &zeros[..n as usize], fua)?;
                done += n;
            }
            Ok(())
        };
        let r = if whole { zero(off, len) } else { subblock::write_zeroes(v, off, len, fua, zero) };
        match r {
            Ok(()) => Outcome::Ok,
            Err(e) => volume_err(Command::WriteZeroes, &e),
        }
    }

    /// `whole`: the range is made of whole blocks; otherwise the covering
    /// blocks are asked and the answer starts at the request's offset.
    fn block_status(&self, h: &RequestHeader, whole: bool) -> Outcome {
        let Some(context_id) = self.base_allocation else {
            return err(proto::EINVAL, "no metadata context negotiated");
        };
        let len = h.len as u64;
        let (start, end) = match whole {
            true => (h.offset, h.offset + len),
            false => subblock::covering(h.offset, len, self.export.block_bytes()),
        };
        let extents = match self.export.block_status(start, end - start) {
            Ok(e) => e,
            Err(e) => return volume_err(Command::BlockStatus, &e),
        };
        let max = if h.flags & proto::CMD_FLAG_REQ_ONE != 0 { 1 } else { self.block_status_extents_max };
        let mut descriptors: Vec<(u32, u32)> = Vec::new();
        let mut covered = 0u64;
        // Bytes of the first extents before the request's offset.
        let mut skip = h.offset - start;
        for e in extents {
            let skipped = skip.min(e.len);
            skip -= skipped;
            let n = (e.len - skipped).min(len - covered);
            if n == 0 {
                continue;
            }
            let flags = if e.allocated { 0 } else { proto::STATE_HOLE | proto::STATE_ZERO };
            // n ≤ len ≤ u32::MAX, and the merged length stays ≤ len.
            let full = descriptors.len() == max;
            match descriptors.last_mut() {
                Some((l, f)) if *f == flags => *l += n as u32,
                _ if full => break,
                _ => descriptors.push((n as u32, flags)),
            }
            covered += n;
            if covered == len {
                break;
            }
        }
        if descriptors.is_empty() {
            return err(proto::EIO, "the volume reported no extents");
        }
        Outcome::BlockStatus { context_id, descriptors }
    }

    /// Sends the reply for one request. `command` is None for a request
    /// refused before it was understood.
    fn reply(&self, h: &RequestHeader, command: Option<Command>, outcome: Outcome) {
        self.reply_to(h, command, outcome, false)
    }

    fn reply_to(&self, h: &RequestHeader, command: Option<Command>, outcome: Outcome, direct: bool) {
        let bytes = match outcome {
            Outcome::Data { buf, prefix } => self.data_reply(h, buf, prefix),
            outcome => {
                let mut out = Vec::new();
                self.encode_reply(h, command, outcome, &mut out);
                out
            }
        };
        if direct {
            self.out.write(&bytes);
        } else {
            self.out.send(&bytes);
        }
    }

    /// A read's reply: the data is already in place after `prefix` bytes of
    /// header space, which this fills.
    fn data_reply(&self, h: &RequestHeader, mut buf: Vec<u8>, prefix: usize) -> Vec<u8> {
        let data_len = (buf.len() - prefix) as u32;
        if self.structured {
            proto::encode_offset_data_prefix(&mut buf, h.cookie, h.offset, data_len, true);
        } else {
            SimpleReply { error: 0, cookie: h.cookie }.encode_into(&mut buf);
        }
        buf
    }

    /// Appends the reply for one request to `out`.
    fn encode_reply(&self, h: &RequestHeader, command: Option<Command>, outcome: Outcome, out: &mut Vec<u8>) {
        let cookie = h.cookie;
        if let Outcome::Err { errno, message } = &outcome {
            self.stats.request_errors.fetch_add(1, Ordering::Relaxed);
            let what = match command {
                Some(c) => format!("{c:?}"),
                None => format!("request type {}", h.command),
            };
            let line = format!("{what} of {} bytes at byte {}: {message} (errno {errno})", h.len, h.offset);
            log_client(&self.peer, &line);
        }
        // A READ must never get a simple reply once structured replies are on.
        let is_read = command == Some(Command::Read) || h.command == Command::Read as u16;
        match outcome {
            Outcome::Data { buf, prefix } => out.extend_from_slice(&self.data_reply(h, buf, prefix)),
            Outcome::Ok if self.structured && is_read => out.extend_from_slice(&Chunk::None.encode(cookie, true)),
            Outcome::Ok => out.extend_from_slice(&SimpleReply { error: 0, cookie }.encode()),
            Outcome::BlockStatus { context_id, descriptors } => {
                out.extend_from_slice(&Chunk::BlockStatus { context_id, descriptors }.encode(cookie, true))
            }
            Outcome::Err { errno, message } => {
                if self.structured {
                    out.extend_from_slice(&Chunk::Error { error: errno, message }.encode(cookie, true));
                } else {
                    out.extend_from_slice(&SimpleReply { error: errno, cookie }.encode());
                }
            }
        }
    }
}

/// The NBD error for a volume error; writes past the end are ENOSPC.
fn volume_err(command: Command, e: &VolumeError) -> Outcome {
    let errno = match (command, e) {
        (Command::Write | Command::WriteZeroes, VolumeError::OutOfRange { .. }) => proto::ENOSPC,
        _ => match e.errno() {
            n @ (1 | 5 | 12 | 22 | 28) => n as u32,
            _ => proto::EIO,
        },
    };
    err(errno, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An acquire that does not fit waits, counted, until a release makes
    /// room; `wait_empty` waits for the last release; no waiter is left
    /// counted (a release notifies only when one is).
    #[test]
    fn budget_waiters_are_woken_by_the_release_that_makes_room() {
        let b = Arc::new(Budget::new(10));
        b.acquire(8);
        let waiter = {
            let b = b.clone();
            std::thread::spawn(move || {
                b.acquire(5);
                b.release(5);
            })
        };
        while b.used.lock().unwrap().1 == 0 {
            std::thread::yield_now();
        }
        assert_eq!(*b.used.lock().unwrap(), (8, 1));
        b.release(8);
        waiter.join().unwrap();
        b.wait_empty();
        assert_eq!(*b.used.lock().unwrap(), (0, 0));
    }
}
