//! What every connection of a server shares: the server's options, its
//! exports, its counters, why a connection ended, and the rate-limited
//! log line about a client. The server (`server`) builds it once; the
//! handshake and the transmission phase read it.
//!
//! Why a module of its own: `server` runs `handshake` and `transmission`,
//! and both need what the server holds; kept here, the dependencies run one
//! way (server → handshake, transmission → shared) and none of the three
//! imports the one that imports it.
//!
//! Invariants: `Shared` is read-only after `Server::new` (but `stopping`,
//! set once when a shutdown begins); its exports have unique, valid names
//! (checked in `Server::new`).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_volume::Volume;

use crate::access::{self, ClientIdentity, ExportAccess, Grant};
use crate::pool::WorkerPool;
use crate::proto::ProtoError;
use crate::subblock::WriteOrder;

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

/// One line about a client: at most 10 lines a second (all clients
/// together), with how many were left out.
pub(crate) fn log_client(peer: &str, what: &str) {
    use sluice_volume::report::LogLimit;
    static LIMIT: LogLimit = LogLimit::new();
    if let Some(left_out) = LIMIT.admit() {
        eprintln!("sluice: NBD client {peer}: {what}{}", LogLimit::also(left_out));
    }
}
