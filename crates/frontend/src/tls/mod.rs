//! TLS for NBD: the server's TLS configuration (TLS 1.3, and TLS 1.2 with
//! ECDHE and AES-GCM unless the minimum is 1.3; X.509 from PEM files, rustls
//! with the `ring` provider) and the encrypted stream a connection switches
//! to after `NBD_OPT_STARTTLS`.
//!
//! Why this shape: rustls runs the handshake (fed whole records only, so it
//! holds no byte of what follows), then hands its traffic keys and sequence
//! numbers over (`dangerous_extract_secrets`) to our record layer
//! (`tls_records`), as kTLS would take them into the kernel. From then on the
//! reader decrypts records in its own read buffer with no lock shared with
//! the writers, and a writer seals a reply in its send buffer and writes it
//! under the sending direction's lock (records must hit the wire in
//! sequence order). rustls's buffered connection copied every received byte
//! three more times and put both directions behind one lock: TLS writes ran
//! at 0.5–0.67 of plaintext. Not supported after the handshake:
//! post-handshake messages other than TLS 1.3's KeyUpdate, which the
//! reader answers: it derives the next receive key (rustls's
//! `KernelConnection` keeps the traffic secrets, as for kTLS) and, if the
//! client asks, seals a KeyUpdate of its own under the sending lock and
//! moves the sender to the next key before any further record.
//!
//! `fuzz` holds the fuzz target's entry into the record reader.
//!
//! AES-GCM comes from `ring`, whose assembly uses the CPU's AES-NI and
//! carry-less multiply (and AVX2/VAES where present), chosen at run time.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use rustls::kernel::KernelConnection;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, EncodeTlsData, InsufficientSizeError, UnbufferedStatus};
use rustls::ServerConfig;

use crate::access::ClientIdentity;
use crate::socket::Socket;
use crate::tls_records::{self, Direction};

mod fuzz;
#[doc(hidden)]
pub use fuzz::fuzz_record_reader;

/// The read buffer: several TLS records per system call, and a partial
/// record moved to its front only once the largest record no longer fits
/// behind it. It stays with the connection: 64 KiB bounds that cost.
const TLS_READ_BYTES: usize = 64 * 1024;

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsConfigError {
    #[error("TLS certificate {path}: {msg}")]
    Cert { path: String, msg: String },
    #[error("TLS key {path}: {msg}")]
    Key { path: String, msg: String },
    #[error("TLS client CA {path}: {msg}")]
    ClientCa { path: String, msg: String },
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The oldest protocol version a server accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MinVersion {
    /// TLS 1.2 (ECDHE with AES-GCM only) or 1.3: what upstream `nbd-client`
    /// and GnuTLS clients told to prefer 1.2 need, as nbdkit accepts.
    #[default]
    Tls12,
    /// TLS 1.3 only.
    Tls13,
}

impl std::str::FromStr for MinVersion {
    type Err = String;
    fn from_str(s: &str) -> Result<MinVersion, String> {
        match s {
            "1.2" => Ok(MinVersion::Tls12),
            "1.3" => Ok(MinVersion::Tls13),
            other => Err(format!("TLS version {other:?}: expected \"1.2\" or \"1.3\"")),
        }
    }
}

/// The TLS 1.2 suites offered: forward-secret key exchange, AEAD with
/// AES-GCM (the hardware-accelerated cipher); no CBC, no RSA key exchange.
fn tls12_suite_allowed(suite: rustls::CipherSuite) -> bool {
    use rustls::CipherSuite as C;
    matches!(
        suite,
        C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            | C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
            | C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
            | C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384
    )
}

/// A server configuration from a PEM certificate chain and key, accepting
/// TLS 1.3 and, unless `min` says 1.3, TLS 1.2. With `client_ca` (PEM, one
/// or more CA certificates) every client must present a certificate that CA
/// issued (mutual TLS); its names are then the client's identity
/// (`access`).
pub fn server_config(
    cert_pem: &Path,
    key_pem: &Path,
    min: MinVersion,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsConfigError> {
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
    // AES-128-GCM first, and the server's order decides: 10 AES rounds
    // instead of 14 on both ends, the same AEAD construction (kTLS and
    // most HTTPS servers prefer it too).
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.retain(|s| s.tls13().is_some() || tls12_suite_allowed(s.suite()));
    provider.cipher_suites.sort_by_key(|s| {
        use rustls::CipherSuite as C;
        !matches!(
            s.suite(),
            C::TLS13_AES_128_GCM_SHA256
                | C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
                | C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        )
    });
    let provider = Arc::new(provider);
    let versions: &[&rustls::SupportedProtocolVersion] = match min {
        MinVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        MinVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let builder = ServerConfig::builder_with_provider(provider.clone()).with_protocol_versions(versions)?;
    let cfg = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let ca_err = |msg: String| TlsConfigError::ClientCa { path: ca.display().to_string(), msg };
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).map_err(|e| ca_err(e.to_string()))? {
                roots.add(c.map_err(|e| ca_err(e.to_string()))?).map_err(|e| ca_err(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(ca_err("no CERTIFICATE in the file".into()));
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| ca_err(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    }
    .with_single_cert(certs, key)?;
    let mut cfg = cfg;
    // After the handshake the keys move to our own record layer
    // (`tls_records`), which needs them.
    cfg.enable_secret_extraction = true;
    cfg.ignore_client_order = true;
    Ok(Arc::new(cfg))
}

fn tls_err(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

fn bad_tls(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The length of the whole record `buf` starts with, if it is all there.
fn whole_record(buf: &[u8]) -> Option<usize> {
    let h = buf.get(..tls_records::HEADER_BYTES)?;
    let n = tls_records::HEADER_BYTES + u16::from_be_bytes([h[3], h[4]]) as usize;
    (n <= buf.len()).then_some(n)
}

/// Appends a handshake record rustls has ready to `out`.
pub(crate) fn encode(e: &mut EncodeTlsData<'_, ServerConnectionData>, out: &mut Vec<u8>) -> io::Result<()> {
    let start = out.len();
    out.resize(start + 4096, 0);
    loop {
        match e.encode(&mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                return Ok(());
            }
            Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size })) => {
                out.resize(start + required_size, 0)
            }
            Err(e) => return Err(bad_tls(&e.to_string())),
        }
    }
}

/// The sending direction: sealing and writing happen under one lock, so
/// records reach the wire in sequence-number order.
#[derive(Debug)]
struct TxRecords {
    dir: Direction,
    wsock: Socket,
    /// Reused buffer of sealed records.
    out: Vec<u8>,
}

/// The receiving direction, and what derives its next keys.
struct RxRecords {
    dir: Direction,
    /// TLS 1.3 sessions: the traffic secrets for KeyUpdate.
    kernel: Option<KernelConnection<ServerConnectionData>>,
}

impl RxRecords {
    /// The client sent a KeyUpdate (already opened with the old key): the
    /// receive side moves to the next key; if asked, a KeyUpdate goes out
    /// under the current send key and the sender moves to its next key
    /// before any other record can be sealed (the send lock is held).
    fn key_update(&mut self, tx: &Mutex<TxRecords>, requested: bool) -> io::Result<()> {
        let Some(kernel) = self.kernel.as_mut() else {
            return Err(bad_tls("TLS: a handshake message on a TLS 1.2 session (renegotiation is not supported)"));
        };
        let (seq, secrets) = kernel.update_rx_secret().map_err(tls_err)?;
        self.dir = Direction::new(seq, secrets)?;
        if requested {
            let mut tx = tx.lock().unwrap_or_else(PoisonError::into_inner);
            let tx = &mut *tx;
            let (seq, secrets) = kernel.update_tx_secret().map_err(tls_err)?;
            let next = Direction::new(seq, secrets)?;
            tx.out.clear();
            tx.dir.seal_key_update(false, &mut tx.out)?;
            tx.dir = next;
            tx.wsock.write_all(&tx.out)?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for RxRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxRecords").field("dir", &self.dir).field("key_updates", &self.kernel.is_some()).finish()
    }
}

/// The encrypted stream: this clone's reading socket half, and the two
/// directions' record state shared by all clones.
#[derive(Debug)]
pub struct TlsStream {
    rsock: Socket,
    tx: Arc<Mutex<TxRecords>>,
    rx: Arc<Mutex<RxRecords>>,
    /// Raw bytes read from the socket (per clone, allocated on first read);
    /// `rbuf[rpos..rend]` are not yet opened.
    rbuf: Vec<u8>,
    rpos: usize,
    rend: usize,
    /// The opened record's plaintext not yet read, within `rbuf`.
    plain: std::ops::Range<usize>,
    /// The peer sent close_notify.
    closed: bool,
    /// An error met after a read had already taken plaintext: reported by
    /// the next read, so the bytes before it are not lost.
    pending_err: Option<io::Error>,
    /// The names of the client's verified certificate (mutual TLS).
    client: Option<ClientIdentity>,
}

impl TlsStream {
    /// Run the server side of the TLS handshake on `raw` (whose read timeout
    /// bounds it). `early` are bytes already read from the socket past the
    /// STARTTLS reply (a client's ClientHello a buffered reader took in).
    ///
    /// rustls (its unbuffered API) sees whole records only, one more each
    /// time it needs more, so when the handshake completes it has decrypted
    /// no byte of what follows; its keys then move to the record layer, and
    /// its `KernelConnection` stays for key updates.
    pub fn accept(raw: Socket, early: &[u8], cfg: Arc<ServerConfig>) -> io::Result<TlsStream> {
        let mut conn = UnbufferedServerConnection::new(cfg).map_err(tls_err)?;
        let mut wsock = raw.clone();
        let mut rsock = raw.clone();
        let mut rbuf = vec![0u8; TLS_READ_BYTES.max(early.len())];
        rbuf[..early.len()].copy_from_slice(early);
        // rustls is shown `rbuf[rpos..fed]`, one more whole record only when
        // it is blocked; `rbuf[fed..rend]` waits (it may follow the
        // handshake).
        let (mut rpos, mut fed, mut rend) = (0, 0, early.len());
        let mut out = Vec::new();
        loop {
            let UnbufferedStatus { discard, state } = conn.process_tls_records(&mut rbuf[rpos..fed]);
            let (mut done, mut blocked) = (false, false);
            match state {
                Ok(ConnectionState::EncodeTlsData(mut e)) => encode(&mut e, &mut out)?,
                Ok(ConnectionState::TransmitTlsData(t)) => {
                    wsock.write_all(&out)?;
                    out.clear();
                    t.done();
                }
                Ok(ConnectionState::BlockedHandshake) => blocked = true,
                Ok(ConnectionState::WriteTraffic(_)) => done = true,
                Ok(_) => return Err(bad_tls("TLS: the client sent data or closed before the handshake ended")),
                Err(e) => {
                    // Tell the client why (rustls queued an alert).
                    if let Ok(ConnectionState::EncodeTlsData(mut a)) = conn.process_tls_records(&mut []).state {
                        out.clear();
                        if encode(&mut a, &mut out).is_ok() {
                            let _ = wsock.write_all(&out);
                        }
                    }
                    return Err(tls_err(e));
                }
            }
            rpos += discard;
            fed = fed.max(rpos);
            if done {
                break;
            }
            if !blocked {
                continue;
            }
            // rustls needs more: the next whole record, else more bytes.
            if let Some(n) = whole_record(&rbuf[fed..rend]) {
                fed += n;
                continue;
            }
            rbuf.copy_within(rpos..rend, 0);
            (fed, rend, rpos) = (fed - rpos, rend - rpos, 0);
            if rend == rbuf.len() {
                rbuf.resize(rbuf.len() * 2, 0);
            }
            let n = rsock.read(&mut rbuf[rend..])?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "client closed during the TLS handshake"));
            }
            rend += n;
        }
        let client = conn.peer_certificates().and_then(|c| c.first()).and_then(ClientIdentity::of);
        let (secrets, kernel) = conn.dangerous_into_kernel_connection().map_err(tls_err)?;
        let tls12 = kernel.protocol_version() == rustls::ProtocolVersion::TLSv1_2;
        let rx = RxRecords {
            dir: Direction::for_version(tls12, secrets.rx.0, secrets.rx.1)?,
            kernel: (!tls12).then_some(kernel),
        };
        let tx = TxRecords { dir: Direction::for_version(tls12, secrets.tx.0, secrets.tx.1)?, wsock, out: Vec::new() };
        // Bytes past the handshake stay buffered for `read`.
        let mut s = TlsStream::with_records(raw, Arc::new(Mutex::new(tx)), Arc::new(Mutex::new(rx)));
        (s.rbuf, s.rpos, s.rend, s.client) = (rbuf, rpos, rend, client);
        Ok(s)
    }

    /// A stream reading `rsock` with the directions' record state, nothing
    /// read yet.
    fn with_records(rsock: Socket, tx: Arc<Mutex<TxRecords>>, rx: Arc<Mutex<RxRecords>>) -> TlsStream {
        let (rbuf, rpos, rend, plain) = (Vec::new(), 0, 0, 0..0);
        let (closed, pending_err, client) = (false, None, None);
        TlsStream { rsock, tx, rx, rbuf, rpos, rend, plain, closed, pending_err, client }
    }

    pub fn try_clone(&self) -> io::Result<TlsStream> {
        let mut s = TlsStream::with_records(self.rsock.clone(), self.tx.clone(), self.rx.clone());
        s.client = self.client.clone();
        Ok(s)
    }

    /// The names of the client's certificate, if it presented one the
    /// configured client CA verified.
    pub fn client_identity(&self) -> Option<&ClientIdentity> {
        self.client.as_ref()
    }

    /// The raw socket (timeouts, shutdown, peer name).
    pub fn raw(&self) -> &Socket {
        &self.rsock
    }

    /// Opens the next record into `self.plain`; Ok(false) at the end of the
    /// stream.
    fn next_record(&mut self) -> io::Result<bool> {
        loop {
            if self.closed {
                return Ok(false);
            }
            if let Some(n) = Direction::record_len(&self.rbuf[self.rpos..self.rend])? {
                let rec = self.rpos..self.rpos + n;
                self.rpos += n;
                let mut rx = self.rx.lock().unwrap_or_else(PoisonError::into_inner);
                let (ct, plain) = rx.dir.open(&mut self.rbuf[rec.clone()])?;
                if ct == tls_records::CONTENT_HANDSHAKE {
                    // Keys change between this record and the next: still
                    // under the receive lock.
                    let requested = tls_records::key_update_request(&self.rbuf[rec.start..][plain])?;
                    rx.key_update(&self.tx, requested)?;
                    continue;
                }
                drop(rx);
                match ct {
                    tls_records::CONTENT_APPLICATION_DATA => {
                        self.plain = rec.start + plain.start..rec.start + plain.end;
                        return Ok(true);
                    }
                    // close_notify: description 0 (TLS 1.3 ignores the level).
                    tls_records::CONTENT_ALERT if plain.len() == 2 && self.rbuf[rec.start + plain.start + 1] == 0 => {
                        self.closed = true;
                    }
                    tls_records::CONTENT_ALERT => {
                        return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "TLS: the client sent an alert"));
                    }
                    other => {
                        let msg = format!("TLS: unexpected inner content type {other}");
                        return Err(io::Error::new(io::ErrorKind::InvalidData, msg));
                    }
                }
                continue;
            }
            // An incomplete record: read after it, first moving it to the
            // front if the largest record would not fit behind it.
            if self.rbuf.len() < TLS_READ_BYTES {
                self.rbuf.resize(TLS_READ_BYTES, 0);
            }
            if self.rbuf.len() - self.rpos < tls_records::HEADER_BYTES + tls_records::BODY_MAX {
                self.rbuf.copy_within(self.rpos..self.rend, 0);
                (self.rpos, self.rend) = (0, self.rend - self.rpos);
            }
            let n = self.rsock.read(&mut self.rbuf[self.rend..])?;
            if n == 0 {
                if self.rend == 0 {
                    return Ok(false);
                }
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "TLS: the stream ended inside a record"));
            }
            self.rend += n;
        }
    }
}

impl TlsStream {
    /// Whether a read can be answered without a system call: plaintext is
    /// waiting, or a whole record (or a malformed header, whose error the
    /// read reports) is buffered.
    fn record_waiting(&self) -> bool {
        !self.plain.is_empty() || !matches!(Direction::record_len(&self.rbuf[self.rpos..self.rend]), Ok(None))
    }

    /// Whether bytes read from the socket wait here, opened or not.
    pub(crate) fn has_buffered(&self) -> bool {
        !self.plain.is_empty() || self.rend > self.rpos
    }

    /// Reads what is waiting without blocking, as `Stream::read_ready`:
    /// None if nothing is. Only the start of a record waiting (the rest is
    /// on its way) waits for the rest.
    pub(crate) fn read_ready(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        if self.closed || self.record_waiting() || self.rend > self.rpos {
            return self.read(buf).map(Some);
        }
        if self.rbuf.len() < TLS_READ_BYTES {
            self.rbuf.resize(TLS_READ_BYTES, 0);
        }
        (self.rpos, self.rend) = (0, 0);
        match self.rsock.read_ready(&mut self.rbuf)? {
            None => Ok(None),
            Some(0) => Ok(Some(0)),
            Some(n) => {
                self.rend = n;
                self.read(buf).map(Some)
            }
        }
    }
}

impl Read for TlsStream {
    /// Plaintext of as many records as fill `buf` and are already here:
    /// the first may need a system call, the rest never do.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(e) = self.pending_err.take() {
            return Err(e);
        }
        while self.plain.is_empty() {
            if !self.next_record()? {
                return Ok(0);
            }
        }
        let mut n = 0;
        loop {
            let k = (buf.len() - n).min(self.plain.len());
            buf[n..n + k].copy_from_slice(&self.rbuf[self.plain.start..self.plain.start + k]);
            self.plain.start += k;
            n += k;
            if n == buf.len() || !self.record_waiting() || self.closed {
                return Ok(n);
            }
            match self.next_record() {
                Ok(true) => {}
                Ok(false) => return Ok(n),
                Err(e) => {
                    self.pending_err = Some(e);
                    return Ok(n);
                }
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[io::IoSlice::new(buf)])
    }

    /// Seals every slice and sends the records with one write.
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let mut tx = self.tx.lock().unwrap_or_else(PoisonError::into_inner);
        let tx = &mut *tx;
        tx.out.clear();
        for b in bufs {
            tx.dir.seal(b, &mut tx.out)?;
        }
        let r = tx.wsock.write_all(&tx.out);
        if tx.out.capacity() > 4 * TLS_READ_BYTES {
            tx.out = Vec::new(); // do not keep a large reply's buffer
        }
        r?;
        Ok(bufs.iter().map(|b| b.len()).sum())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tx.lock().unwrap_or_else(PoisonError::into_inner).wsock.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::cipher::{AeadKey, Iv};
    use rustls::ConnectionTrafficSecrets;
    use std::os::unix::net::UnixStream;

    /// A server-side stream over one end of a socket pair, and the client's
    /// sealing direction (same keys) with the other end.
    fn streams() -> (TlsStream, Direction, UnixStream) {
        let secrets = || ConnectionTrafficSecrets::Aes256Gcm { key: AeadKey::from([3u8; 32]), iv: Iv::new([4u8; 12]) };
        let (a, b) = UnixStream::pair().unwrap();
        let raw = Socket::Unix(Arc::new(a));
        let tx = TxRecords { dir: Direction::new(0, secrets()).unwrap(), wsock: raw.clone(), out: Vec::new() };
        let rx = RxRecords { dir: Direction::new(0, secrets()).unwrap(), kernel: None };
        let s = TlsStream::with_records(raw, Arc::new(Mutex::new(tx)), Arc::new(Mutex::new(rx)));
        (s, Direction::new(0, secrets()).unwrap(), b)
    }

    /// One read returns the plaintext of every whole record already
    /// received (here three, 40 000 bytes); `read_ready` answers from
    /// buffered records, says "nothing" on a quiet socket without
    /// blocking, and reports the end of the stream.
    #[test]
    fn reads_take_every_buffered_record_and_read_ready_never_waits_on_a_quiet_socket() {
        let (mut s, mut client, mut peer) = streams();
        let data: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
        let mut wire = Vec::new();
        client.seal(&data, &mut wire).unwrap();
        client.seal(b"next", &mut wire).unwrap();
        peer.write_all(&wire).unwrap();
        let mut got = vec![0u8; 40_000];
        assert_eq!(s.read(&mut got).unwrap(), 40_000, "three records in one read");
        assert!(got == data);
        let mut small = [0u8; 16];
        assert_eq!(s.read_ready(&mut small).unwrap(), Some(4), "a buffered record, no system call needed");
        assert_eq!(&small[..4], b"next");
        assert_eq!(s.read_ready(&mut small).unwrap(), None, "a quiet socket");
        wire.clear();
        client.seal(b"later", &mut wire).unwrap();
        peer.write_all(&wire).unwrap();
        assert_eq!(s.read_ready(&mut small).unwrap(), Some(5));
        assert_eq!(&small[..5], b"later");
        drop(peer);
        assert_eq!(s.read_ready(&mut small).unwrap(), Some(0), "end of stream");
    }

    /// A bad record behind good ones: the read returns the good records'
    /// plaintext, and the next read the error (nothing read is lost).
    #[test]
    fn an_error_behind_good_records_comes_after_their_plaintext() {
        let (mut s, mut client, mut peer) = streams();
        let mut wire = Vec::new();
        client.seal(b"good", &mut wire).unwrap();
        let good = wire.len();
        client.seal(b"tampered", &mut wire).unwrap();
        wire[good + 7] ^= 1;
        peer.write_all(&wire).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(s.read(&mut buf).unwrap(), 4);
        assert_eq!(&buf[..4], b"good");
        assert!(s.read(&mut buf).is_err(), "the tampered record is refused");
    }
}
