//! The NBD server: exports, listeners, connections, shutdown.
//!
//! Owns: the set of exports (`Arc<dyn Volume>`, validated once in
//! [`Server::new`]), the accept loop, one thread per connection (handshake,
//! then the transmission reader with its worker pool), the registry of live
//! connections, and the shutdown sequence.
//!
//! Invariants:
//! - a connection's failure (I/O error, malformed request, client vanishing)
//!   ends only that connection; the accept loop and other connections go on;
//! - connections are bounded (`connections_max`), in-flight request bytes
//!   per connection are bounded (`inflight_bytes_max`), a client stuck in the
//!   handshake is dropped after `handshake_timeout`;
//! - [`ServerHandle::shutdown`] stops accepting, lets every request already
//!   read finish and be answered, closes the connections, then flushes every
//!   export, and only then returns.
//!
//! Why threads and blocking sockets: `Volume` is synchronous, so a worker
//! thread per in-flight request is the natural unit. A connection costs one
//! thread (its reader, with a small stack) while idle; workers are started
//! when requests queue and leave when idle (see `transmission::Queue`), so
//! 10,000 mostly idle connections cost tens of KiB each, not 5 threads each
//! (`scripts/bench-connections.sh` measures it).

use std::collections::HashMap;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice_volume::{Volume, VolumeError};

use crate::access::{self, ClientIdentity, ExportAccess, Grant};
use crate::pool::WorkerPool;
use crate::proto::{self, ProtoError};
use crate::stream::{ConnReader, ListenAddr, Listener, Stream};
use crate::subblock::WriteOrder;
use crate::{handshake, transmission};

/// Tunables of a server; every bound says its unit in its name.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Threads executing requests, shared by all connections of a server;
    /// started on demand, they leave when idle.
    pub workers_max: usize,
    /// Bytes of request payload and read buffers one connection may hold at
    /// once; the reader stops reading requests while the bound is reached.
    pub inflight_bytes_max: u64,
    /// Largest READ/WRITE length accepted (the payloads a request carries
    /// one way or the other), advertised as the maximum block size: 64 MiB,
    /// so a client that never negotiates block sizes may send what nbdkit
    /// serves (the spec's 32 MiB and more). TRIM, WRITE_ZEROES and CACHE
    /// carry no data and take any length. Rounded down to a multiple of the
    /// volume block.
    pub request_bytes_max: u32,
    /// Connections served at once; more are accepted and closed at once.
    pub connections_max: usize,
    /// Longest wait for the next bytes of the option haggling (the number of
    /// options is bounded too, by `handshake::HANDSHAKE_OPTIONS_MAX`).
    pub handshake_timeout: Duration,
    /// Descriptors returned in one BLOCK_STATUS reply at most (the spec lets
    /// a server answer less than the requested range).
    pub block_status_extents_max: usize,
    /// Per-export access rules by export name (`access`); an export not
    /// named here is open to every client, read-write.
    pub access: HashMap<String, ExportAccess>,
    /// How long shutdown waits for connections to drain before cutting them.
    pub shutdown_grace: Duration,
    /// Text sent as `NBD_INFO_DESCRIPTION` / in `NBD_REP_SERVER`.
    pub description: String,
    /// TLS (`NBD_OPT_STARTTLS`), or None: STARTTLS is answered `ERR_UNSUP`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// With `tls`: refuse every option but STARTTLS and ABORT before TLS
    /// (`NBD_REP_ERR_TLS_REQD`; EXPORT_NAME, which has no error reply,
    /// closes the connection), as the NBD spec's "TLS-only" server.
    pub tls_required: bool,
    /// A request the volume took this long or more for (in nanoseconds) is
    /// slow: each connection runs a kind of request (reads, writes) on the
    /// thread that read it, batching writes, while most of its recent
    /// requests of that kind are faster, and on the worker pool otherwise
    /// (see `dispatch`). `u64::MAX` keeps every kind but FLUSH on the
    /// reader; 0 sends every request to the pool.
    pub slow_request_ns: u64,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            workers_max: 32,
            inflight_bytes_max: 64 << 20,
            request_bytes_max: 64 << 20,
            connections_max: 16384,
            handshake_timeout: Duration::from_secs(30),
            block_status_extents_max: 4096,
            shutdown_grace: Duration::from_secs(10),
            description: String::from("sluice volume"),
            tls: None,
            tls_required: false,
            access: HashMap::new(),
            slow_request_ns: crate::dispatch::SLOW_REQUEST_NS,
        }
    }
}

/// Errors setting up or stopping a server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error("a server needs at least one export")]
    NoExports,
    #[error("export {name:?}: {reason}")]
    BadExport { name: String, reason: &'static str },
    #[error("access rules for {0:?}, which is not an export")]
    BadAccess(String),
    #[error("two exports are named {0:?}")]
    DuplicateExport(String),
    #[error("bad server option: {0}")]
    BadOptions(&'static str),
    #[error("listener: {0}")]
    Io(#[from] io::Error),
    #[error("the accept thread panicked")]
    AcceptPanicked,
    #[error("flushing export {name:?} at shutdown: {source}")]
    Flush { name: String, source: VolumeError },
}

/// Why one connection ended early (counted, never propagated past it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnError {
    #[error("I/O: {0}")]
    Io(#[from] io::Error),
    #[error("protocol: {0}")]
    Proto(#[from] ProtoError),
    #[error("NBD_OPT_EXPORT_NAME for unknown export {0:?}")]
    UnknownExport(String),
    #[error("write payload of {len} bytes beyond the {max}-byte maximum")]
    PayloadTooLarge { len: u32, max: u32 },
    #[error("more than {0} options in one handshake")]
    TooManyOptions(usize),
    #[error("NBD_OPT_EXPORT_NAME before STARTTLS on a TLS-required server")]
    TlsRequired,
    #[error("client {client} may not use export {export:?} (not on its allow-lists)")]
    Refused { export: String, client: String },
}

/// Counters of one listener's activity.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub connections_accepted: AtomicU64,
    pub connections_refused: AtomicU64,
    /// Connections that ended with a protocol or I/O error.
    pub connections_failed: AtomicU64,
    pub requests: AtomicU64,
    /// Requests answered with an error.
    pub request_errors: AtomicU64,
}

/// A plain copy of [`ServerStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub connections_accepted: u64,
    pub connections_refused: u64,
    pub connections_failed: u64,
    pub requests: u64,
    pub request_errors: u64,
}

impl ServerStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            connections_accepted: g(&self.connections_accepted),
            connections_refused: g(&self.connections_refused),
            connections_failed: g(&self.connections_failed),
            requests: g(&self.requests),
            request_errors: g(&self.request_errors),
        }
    }
}

/// What every connection of a server shares (read-only after `new`).
pub(crate) struct Shared {
    pub(crate) exports: Vec<Export>,
    pub(crate) opts: ServerOptions,
    pub(crate) pool: Arc<WorkerPool>,
    /// Set when a shutdown begins: a connection's reader that meets the
    /// end of stream the shutdown caused still reads, for `DRAIN_QUIET`
    /// from then, requests the client sent as the stop began, and answers
    /// them (a stop stays prompt under a client that never pauses).
    pub(crate) stopping: AtomicBool,
}

/// How long a stopping connection waits for more of its client's
/// requests before it closes (`Shared::stopping`).
pub(crate) const DRAIN_QUIET: Duration = Duration::from_millis(200);

impl Shared {
    /// The export a client names; the empty name is the first export.
    pub(crate) fn find_export(&self, name: &str) -> Option<&Export> {
        if name.is_empty() {
            return self.exports.first();
        }
        self.exports.iter().find(|e| e.volume.name() == name)
    }

    /// What `client` may do with the export named `name`.
    pub(crate) fn grant(&self, name: &str, client: Option<&ClientIdentity>) -> Grant {
        match self.opts.access.get(name) {
            Some(a) => access::decide(a, client),
            None => Grant::ReadWrite,
        }
    }

    /// Block size constraints (min, preferred, max) advertised for `v`.
    pub(crate) fn block_sizes(&self, v: &dyn Volume) -> (u32, u32, u32) {
        let min = v.block_bytes() as u32;
        let preferred = min.max(4096);
        let max = (self.opts.request_bytes_max / min) * min;
        (min, preferred, max)
    }
}

/// One export: its volume and the lock that orders sub-block
/// read-modify-writes against its other writes (`subblock`).
pub(crate) struct Export {
    pub(crate) volume: Arc<dyn Volume>,
    pub(crate) order: Arc<WriteOrder>,
}

/// An NBD server over a fixed set of exports. Cheap to clone.
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

impl Server {
    /// Validates the exports (non-empty, unique names that are valid NBD
    /// strings, power-of-two block sizes of 512..=65536 bytes dividing the
    /// size) and the options.
    pub fn new(exports: Vec<Arc<dyn Volume>>, opts: ServerOptions) -> Result<Server, ServerError> {
        if exports.is_empty() {
            return Err(ServerError::NoExports);
        }
        let mut seen = std::collections::HashSet::new();
        for v in &exports {
            let name = v.name().to_owned();
            let bad = |reason| Err(ServerError::BadExport { name: name.clone(), reason });
            if name.len() > proto::STRING_BYTES_MAX || name.contains('\0') {
                return bad("name is longer than 4096 bytes or contains NUL");
            }
            let bs = v.block_bytes();
            if !bs.is_power_of_two() || !(512..=65536).contains(&bs) {
                return bad("block size is not a power of two in 512..=65536");
            }
            if !v.size_bytes().is_multiple_of(bs) {
                return bad("size is not a multiple of the block size");
            }
            if opts.request_bytes_max < bs as u32 {
                return Err(ServerError::BadOptions("request_bytes_max is smaller than a block"));
            }
            if !seen.insert(name.clone()) {
                return Err(ServerError::DuplicateExport(name));
            }
        }
        if let Some(name) = opts.access.keys().find(|n| !seen.contains(*n)) {
            return Err(ServerError::BadAccess(name.clone()));
        }
        if opts.workers_max == 0 {
            return Err(ServerError::BadOptions("workers_max must be at least 1"));
        }
        if opts.connections_max == 0 {
            return Err(ServerError::BadOptions("connections_max must be at least 1"));
        }
        if opts.description.len() > proto::STRING_BYTES_MAX || opts.description.contains('\0') {
            return Err(ServerError::BadOptions("description is not a valid NBD string"));
        }
        let pool = WorkerPool::new(opts.workers_max);
        let exports = exports.into_iter().map(|volume| Export { volume, order: Arc::default() }).collect();
        Ok(Server { shared: Arc::new(Shared { exports, opts, pool, stopping: AtomicBool::new(false) }) })
    }

    /// Serves `listener` on background threads; the handle stops it.
    pub fn spawn(&self, listener: Listener) -> Result<ServerHandle, ServerError> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Registry::default());
        let stats = Arc::new(ServerStats::default());
        let accept = {
            let (shared, stop, conns, stats) = (self.shared.clone(), stop.clone(), conns.clone(), stats.clone());
            std::thread::Builder::new()
                .name("nbd-accept".into())
                .spawn(move || accept_loop(listener, shared, stop, conns, stats))?
        };
        Ok(ServerHandle { addr, stop, accept: Some(accept), conns, stats, shared: self.shared.clone() })
    }

    /// Serves `listener` on the calling thread until the listener fails.
    pub fn serve(&self, listener: Listener) -> Result<(), ServerError> {
        let mut h = self.spawn(listener)?;
        match h.accept.take().map(JoinHandle::join) {
            Some(Ok(r)) => r.map_err(ServerError::Io),
            Some(Err(_)) => Err(ServerError::AcceptPanicked),
            None => Ok(()),
        }
    }
}

/// Read-only view of a listener's counters; cheap to clone.
#[derive(Clone)]
pub struct ServerMonitor {
    conns: Arc<Registry>,
    stats: Arc<ServerStats>,
}

impl ServerMonitor {
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Connections currently open.
    pub fn connections(&self) -> usize {
        self.conns.lock().live.len()
    }
}

/// A running listener: its address, its counters, and the way to stop it.
pub struct ServerHandle {
    addr: ListenAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<io::Result<()>>>,
    conns: Arc<Registry>,
    stats: Arc<ServerStats>,
    shared: Arc<Shared>,
}

impl ServerHandle {
    pub fn local_addr(&self) -> &ListenAddr {
        &self.addr
    }

    /// The TCP port, if this is a TCP listener.
    pub fn port(&self) -> Option<u16> {
        match &self.addr {
            ListenAddr::Tcp(a) => Some(a.port()),
            ListenAddr::Unix(_) => None,
        }
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Connections currently open.
    pub fn connections(&self) -> usize {
        self.conns.lock().live.len()
    }

    /// A handle that reads this listener's counters from another thread
    /// (a metrics endpoint), also after the listener shut down.
    pub fn monitor(&self) -> ServerMonitor {
        ServerMonitor { conns: self.conns.clone(), stats: self.stats.clone() }
    }

    /// Stops accepting, lets in-flight requests finish and be answered,
    /// closes every connection, flushes every export, and returns.
    pub fn shutdown(mut self) -> Result<StatsSnapshot, ServerError> {
        self.stop_and_drain()?;
        for v in self.shared.exports.iter().map(|e| &e.volume) {
            v.flush().map_err(|source| ServerError::Flush { name: v.name().to_owned(), source })?;
        }
        Ok(self.stats.snapshot())
    }

    fn stop_and_drain(&mut self) -> Result<(), ServerError> {
        self.stop.store(true, Ordering::SeqCst);
        let accepted = match self.accept.take().map(JoinHandle::join) {
            Some(Ok(r)) => r.map_err(ServerError::Io),
            Some(Err(_)) => Err(ServerError::AcceptPanicked),
            None => Ok(()),
        };
        // No new connections now. Stop reading new requests on every live
        // one: the reader sees end of stream, its workers finish what was
        // already read, replies go out, and the connection thread exits.
        let deadline = Instant::now() + self.shared.opts.shutdown_grace;
        self.shared.stopping.store(true, Ordering::SeqCst);
        let mut g = self.conns.lock();
        for s in g.live.values() {
            let _ = s.shutdown(Shutdown::Read);
        }
        if !g.live.is_empty() {
            eprintln!(
                "sluice: NBD on {}: stopped accepting; answering what {} connection(s) sent, then closing them",
                self.addr,
                g.live.len()
            );
        }
        while !g.live.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                for s in g.live.values() {
                    let _ = s.shutdown(Shutdown::Both);
                }
                g = self.conns.idle.wait(g).unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            g = self.conns.idle.wait_timeout(g, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
        accepted
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if self.accept.is_some() {
            let _ = self.stop_and_drain();
        }
    }
}

#[derive(Default)]
struct Registry {
    inner: Mutex<Live>,
    idle: Condvar,
}

#[derive(Default)]
struct Live {
    next_id: u64,
    /// A clone of each live connection's socket, to shut it down from here.
    live: HashMap<u64, Stream>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Live> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Removes a connection from the registry however its thread ends.
struct LiveGuard {
    conns: Arc<Registry>,
    id: u64,
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        let mut g = self.conns.lock();
        g.live.remove(&self.id);
        self.conns.idle.notify_all();
    }
}

const ACCEPT_POLL: Duration = Duration::from_millis(50);
/// Stack of a connection thread (handshake, TLS, request reader). Only the
/// pages touched cost memory; a small bound keeps 10,000 connections' address
/// space modest too.
const CONN_STACK_BYTES: usize = 512 << 10;
/// Descriptors one connection holds: its socket, shared by the reader, the
/// reply writer and the registry's handle for shutdown (see [`Stream`]).
pub const FDS_PER_CONNECTION: u64 = 1;

/// Raises this process's open-file limit to at least `wanted` descriptors if
/// the hard limit (or, with the privilege, `/proc/sys/fs/nr_open`) allows;
/// returns the soft limit now in force. A server holding many connections
/// needs [`FDS_PER_CONNECTION`] per connection.
pub fn raise_open_files_limit(wanted: u64) -> io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid out pointer for getrlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur >= wanted {
        return Ok(lim.rlim_cur);
    }
    if lim.rlim_max < wanted {
        let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(lim.rlim_max);
        let raised = libc::rlimit { rlim_cur: wanted.min(nr_open), rlim_max: wanted.min(nr_open) };
        // SAFETY: `raised` is a valid rlimit; failure (no privilege) leaves
        // the limits as they were and is handled below.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Ok(raised.rlim_cur);
        }
    }
    let soft = libc::rlimit { rlim_cur: wanted.min(lim.rlim_max), rlim_max: lim.rlim_max };
    // SAFETY: as above; a soft limit up to the hard one needs no privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &soft) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(soft.rlim_cur)
}

fn accept_loop(
    listener: Listener,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    conns: Arc<Registry>,
    stats: Arc<ServerStats>,
) -> io::Result<()> {
    while !stop.load(Ordering::SeqCst) {
        if !listener.poll_readable(ACCEPT_POLL)? {
            continue;
        }
        let stream = match listener.accept() {
            Ok(s) => s,
            Err(e) if is_transient_accept_error(&e) => continue,
            Err(e) => return Err(e),
        };
        if stop.load(Ordering::SeqCst) {
            break;
        }
        if let Err(e) = start_connection(stream, &shared, &conns, &stats) {
            // Could not set the socket up or spawn a thread: drop this
            // connection, keep serving the others.
            let _ = e;
            stats.connections_failed.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock
            | io::ErrorKind::Interrupted
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) || matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM))
}

fn start_connection(
    stream: Stream,
    shared: &Arc<Shared>,
    conns: &Arc<Registry>,
    stats: &Arc<ServerStats>,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    let id = {
        let mut g = conns.lock();
        if g.live.len() >= shared.opts.connections_max {
            stats.connections_refused.fetch_add(1, Ordering::Relaxed);
            let _ = stream.shutdown(Shutdown::Both);
            return Ok(());
        }
        let id = g.next_id;
        g.next_id += 1;
        g.live.insert(id, stream.try_clone()?);
        id
    };
    stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
    let guard = LiveGuard { conns: conns.clone(), id };
    let (shared, stats) = (shared.clone(), stats.clone());
    std::thread::Builder::new().name(format!("nbd-conn-{id}")).stack_size(CONN_STACK_BYTES).spawn(move || {
        let _guard = guard;
        let peer = stream.peer();
        if let Err(e) = serve_connection(stream, &shared, &stats) {
            stats.connections_failed.fetch_add(1, Ordering::Relaxed);
            log_violation(&peer, &e);
        }
    })?;
    Ok(())
}

/// Log why a connection was closed, unless the client simply went away.
fn log_violation(peer: &str, e: &ConnError) {
    if let ConnError::Io(io) = e {
        use io::ErrorKind::*;
        if matches!(io.kind(), ConnectionReset | BrokenPipe | UnexpectedEof | ConnectionAborted) {
            return;
        }
    }
    log_client(peer, &format!("{e}; connection closed"));
}

/// One line about a client: at most 10 lines a second (all clients
/// together), with how many were left out.
pub(crate) fn log_client(peer: &str, what: &str) {
    use sluice_volume::report::LogLimit;
    static LIMIT: LogLimit = LogLimit::new();
    if let Some(left_out) = LIMIT.admit() {
        eprintln!("sluice: NBD client {peer}: {what}{}", LogLimit::also(left_out));
    }
}

/// Handshake then transmission on one connection; closes it on return.
fn serve_connection(stream: Stream, shared: &Shared, stats: &Arc<ServerStats>) -> Result<(), ConnError> {
    let writer = stream.try_clone()?;
    let closer = stream.try_clone()?;
    let mut reader = ConnReader::new(stream, 64 * 1024);
    let result = (|| {
        let mut writer = writer;
        let Some(session) = handshake::negotiate(&mut reader, &mut writer, shared)? else {
            return Ok(());
        };
        transmission::run(session, &mut reader, writer, shared, stats)
    })();
    if matches!(&result, Err(ConnError::PayloadTooLarge { .. }) | Err(ConnError::Proto(ProtoError::TooLong { .. }))) {
        // The error reply is sent; the client may still be sending what we
        // refused. Closing with unread input would reset the connection and
        // could destroy that reply before the client reads it: end our side,
        // then read and drop what comes, for a bounded time and amount.
        let _ = closer.shutdown(Shutdown::Write);
        let _ = closer.set_read_timeout(Some(LINGER));
        let _ = io::copy(&mut io::Read::take(&mut reader, LINGER_BYTES_MAX), &mut io::sink());
    }
    let _ = closer.shutdown(Shutdown::Both);
    result
}

/// How long, and how many bytes, a connection closed for an oversized
/// request drains what the client still sends (`serve_connection`).
const LINGER: std::time::Duration = std::time::Duration::from_secs(1);
const LINGER_BYTES_MAX: u64 = 64 << 20;
