//! Sluice frontends: the NBD protocol server.
//!
//! `proto` is the wire format (pure, fuzzable); `server` owns listening,
//! connections and shutdown; `handshake` negotiates options; `transmission`
//! runs requests against an `Arc<dyn Volume>` (`subblock` serves clients that
//! never negotiated block sizes at any byte offset); `stream` hides TCP vs Unix vs TLS; `tls` builds the
//! TLS configuration and the encrypted stream; `client` is a lean NBD client for
//! load generation.

pub mod access;
pub mod client;
mod dispatch;
pub mod handshake;
mod pool;
pub mod proto;
pub mod server;
mod shared;
mod socket;
pub mod stream;
mod subblock;
pub mod tls;
#[doc(hidden)]
pub mod tls_bench;
mod tls_records;
mod transmission;

pub use server::{
    raise_open_files_limit, ConnError, Server, ServerError, ServerHandle, ServerMonitor, ServerOptions, StatsSnapshot,
    FDS_PER_CONNECTION,
};
pub use stream::{ConnReader, ListenAddr, Listener, Socket, Stream};
