//! TLS for NBD: the server's TLS configuration (TLS 1.3 only, X.509 from PEM
//! files, rustls with the `ring` provider) and the encrypted stream a
//! connection switches to after `NBD_OPT_STARTTLS`.
//!
//! Why this shape: a connection is served by one reader thread and several
//! workers that each write whole replies under a writer lock. A TLS session
//! is one state machine for both directions, so it lives in a mutex together
//! with the socket half that writes records: a worker encrypts and sends
//! under it; the reader reads raw bytes from its own socket half *without*
//! it (a blocked read must not stall replies), then takes it only to decrypt.
//! Alerts and post-handshake messages the reader's input produces are sent at
//! once, under the same lock.
//!
//! AES-GCM comes from `ring`, whose assembly uses the CPU's AES-NI and
//! carry-less multiply (and AVX2/VAES where present), chosen at run time.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ServerConfig, ServerConnection};

use crate::stream::Stream;

/// Bytes read from the socket at once (several TLS records: fewer syscalls).
const TLS_READ_BYTES: usize = 64 * 1024;

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("TLS certificate {path}: {msg}")]
    Cert { path: String, msg: String },
    #[error("TLS key {path}: {msg}")]
    Key { path: String, msg: String },
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A TLS 1.3 server configuration from a PEM certificate chain and key.
pub fn server_config(cert_pem: &Path, key_pem: &Path) -> Result<Arc<ServerConfig>, TlsConfigError> {
    let cert_err = |msg: String| TlsConfigError::Cert { path: cert_pem.display().to_string(), msg };
    let certs = CertificateDer::pem_file_iter(cert_pem)
        .map_err(|e| cert_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cert_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(cert_err("no CERTIFICATE in the file".into()));
    }
    let key = PrivateKeyDer::from_pem_file(key_pem)
        .map_err(|e| TlsConfigError::Key { path: key_pem.display().to_string(), msg: e.to_string() })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    Ok(Arc::new(cfg))
}

/// The shared half of a TLS stream: the session and the socket it writes to.
#[derive(Debug)]
pub struct TlsShared {
    conn: ServerConnection,
    wsock: Stream,
}

impl TlsShared {
    /// Send every TLS record the session has ready.
    fn send_pending(&mut self) -> io::Result<()> {
        while self.conn.wants_write() {
            self.conn.write_tls(&mut self.wsock)?;
        }
        Ok(())
    }

    /// Hand rustls the next raw bytes of `pending` (it takes up to 4 KiB per
    /// call), process them, send whatever that produced (alerts too).
    /// Returns the bytes consumed. Call only while rustls holds no unread
    /// plaintext: its received-plaintext buffer is bounded.
    fn feed(&mut self, mut pending: &[u8]) -> io::Result<usize> {
        let before = pending.len();
        self.conn.read_tls(&mut pending)?;
        if let Err(e) = self.conn.process_new_packets() {
            let _ = self.send_pending();
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        self.send_pending()?;
        Ok(before - pending.len())
    }
}

/// The encrypted stream: this clone's reading socket half plus the shared
/// session (see the module comment).
#[derive(Debug)]
pub struct TlsStream {
    rsock: Box<Stream>,
    shared: Arc<Mutex<TlsShared>>,
    /// Raw bytes read from the socket (per clone); `rbuf[rpos..rend]` are
    /// not yet handed to rustls, which takes more only once the plaintext it
    /// holds was read (its received-plaintext buffer is bounded).
    rbuf: Vec<u8>,
    rpos: usize,
    rend: usize,
}

impl TlsStream {
    /// Run the server side of the TLS handshake on `raw` (whose read timeout
    /// bounds it). `early` are bytes already read from the socket past the
    /// STARTTLS reply (a client's ClientHello a buffered reader took in).
    pub fn accept(raw: Stream, early: &[u8], cfg: Arc<ServerConfig>) -> io::Result<TlsStream> {
        let conn = ServerConnection::new(cfg).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let shared = TlsShared { conn, wsock: raw.try_clone()? };
        let mut rbuf = vec![0u8; TLS_READ_BYTES.max(early.len())];
        rbuf[..early.len()].copy_from_slice(early);
        let mut s =
            TlsStream { rsock: Box::new(raw), shared: Arc::new(Mutex::new(shared)), rbuf, rpos: 0, rend: early.len() };
        loop {
            let mut sh = s.shared.lock().unwrap_or_else(PoisonError::into_inner);
            sh.send_pending()?;
            if !sh.conn.is_handshaking() {
                // Bytes past the handshake stay buffered for `read`.
                break;
            }
            if s.rpos < s.rend {
                s.rpos += sh.feed(&s.rbuf[s.rpos..s.rend])?;
                continue;
            }
            drop(sh);
            let n = s.rsock.read(&mut s.rbuf)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "client closed during the TLS handshake"));
            }
            (s.rpos, s.rend) = (0, n);
        }
        Ok(s)
    }

    pub fn try_clone(&self) -> io::Result<TlsStream> {
        Ok(TlsStream {
            rsock: Box::new(self.rsock.try_clone()?),
            shared: self.shared.clone(),
            rbuf: vec![0u8; TLS_READ_BYTES],
            rpos: 0,
            rend: 0,
        })
    }

    /// The raw socket (timeouts, shutdown, peer name).
    pub fn raw(&self) -> &Stream {
        &self.rsock
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TlsShared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            {
                // Plaintext if there is some; else feed the buffered bytes
                // until a record's plaintext comes out, all under one lock.
                let mut sh = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
                loop {
                    match sh.conn.reader().read(buf) {
                        Ok(n) => return Ok(n),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                    if self.rpos == self.rend {
                        break;
                    }
                    self.rpos += sh.feed(&self.rbuf[self.rpos..self.rend])?;
                }
            }
            // Nothing buffered: wait for the socket, without the lock.
            let n = self.rsock.read(&mut self.rbuf)?;
            (self.rpos, self.rend) = (0, n);
            if n == 0 {
                // End of the TCP stream: rustls tells a clean close_notify
                // (Ok(0)) from a truncation (UnexpectedEof).
                let mut sh = self.lock();
                sh.feed(&[])?;
                return match sh.conn.reader().read(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                    r => r,
                };
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut sh = self.lock();
        let n = sh.conn.writer().write(buf)?;
        sh.send_pending()?;
        Ok(n)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let mut sh = self.lock();
        let n = sh.conn.writer().write_vectored(bufs)?;
        sh.send_pending()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        let mut sh = self.lock();
        sh.conn.writer().flush()?;
        sh.send_pending()?;
        sh.wsock.flush()
    }
}
