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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice_volume::{Volume, VolumeError};

use crate::pool::WorkerPool;
use crate::proto::{self, ProtoError};
use crate::shared::{log_client, Export, Shared};
pub use crate::shared::{ConnError, ServerOptions, ServerStats, StatsSnapshot};
use crate::stream::{ConnReader, ListenAddr, Listener, Stream};
use crate::{handshake, transmission};

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
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    let (cur, max) = (lim.current.unwrap_or(u64::MAX), lim.maximum.unwrap_or(u64::MAX));
    if cur >= wanted {
        return Ok(cur);
    }
    if max < wanted {
        let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(max);
        let raised = wanted.min(nr_open);
        // Failure (no privilege) leaves the limits as they were and is
        // handled below.
        if setrlimit(Resource::Nofile, Rlimit { current: Some(raised), maximum: Some(raised) }).is_ok() {
            return Ok(raised);
        }
    }
    // A soft limit up to the hard one needs no privilege.
    let soft = wanted.min(max);
    setrlimit(Resource::Nofile, Rlimit { current: Some(soft), maximum: lim.maximum })?;
    Ok(soft)
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
    ) || e.raw_os_error().is_some_and(|n| {
        use rustix::io::Errno;
        [Errno::MFILE, Errno::NFILE, Errno::NOBUFS, Errno::NOMEM].iter().any(|x| x.raw_os_error() == n)
    })
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
