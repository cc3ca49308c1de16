//! A lean NBD client for load generation (`sluice bench nbd-load`): fixed
//! newstyle handshake, optional STARTTLS (TLS 1.3, certificate verified
//! against a CA file), NBD_OPT_GO, then pipelined simple requests.
//!
//! Owns: one TCP connection, its read buffer, and after STARTTLS both
//! directions' record state.
//!
//! Invariants: requests go out in the order given; replies are parsed in
//! arrival order, each simple reply followed by `read_len` bytes of data when
//! it answers a successful read; no structured replies are negotiated, so
//! the server sends no other kind.
//!
//! Why it exists: on this 2-core machine the client shares the CPU with the
//! server, and the stock clients (fio's nbd engine, nbdcopy, qemu: libnbd or
//! qemu over GnuTLS) spend 0.6–0.9 ms of CPU per MiB on TLS alone, so a
//! TLS-against-plaintext comparison measured with them measures the client.
//! This one does what a kTLS client would: rustls runs the handshake only,
//! then the same record layer as the server's (ring's AES-GCM) seals
//! requests straight into the send buffer and opens replies in place in the
//! read buffer; plaintext requests leave with one `writev` per batch, and
//! read data is never copied. It skips session tickets (post-handshake
//! handshake records) and stops at anything else it does not expect.

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::proto::{self, ClientOption, OptionReply, RequestHeader, SimpleReply};
use crate::tls_records::{self, Direction, HandshakeError};

const READ_BYTES: usize = 256 * 1024;

/// Verify the server's certificate against `ca` (PEM) for `server_name`.
#[derive(Clone, Debug)]
pub struct ClientTlsOptions {
    pub ca: PathBuf,
    pub server_name: String,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("NBD protocol: {0}")]
    Protocol(String),
    /// The server broke the TLS exchange (what it did).
    #[error("TLS: {0}")]
    Tls(String),
    /// rustls refused (configuration or the handshake), with its error.
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("TLS: CA {path}: {source}")]
    Ca { path: PathBuf, source: rustls_pki_types::pem::Error },
    #[error("TLS: server name {name:?}: {source}")]
    ServerName { name: String, source: rustls_pki_types::InvalidDnsNameError },
}

struct Records {
    tx: Direction,
    rx: Direction,
    /// The negotiated cipher suite, e.g. `TLS13_AES_128_GCM_SHA256`.
    suite: String,
}

/// One connection in the transmission phase.
pub struct Client {
    sock: TcpStream,
    tls: Option<Records>,
    /// Bytes read; `rbuf[rpos..rend]` not yet consumed (TLS: not opened).
    rbuf: Vec<u8>,
    rpos: usize,
    rend: usize,
    /// TLS: the opened record's plaintext not yet consumed, within `rbuf`.
    plain: Range<usize>,
    /// Sealed records (TLS) waiting for `flush`.
    out: Vec<u8>,
    size: u64,
    transmission_flags: u16,
    /// The reply being parsed: header bytes so far, then data left to skip.
    header: [u8; proto::SIMPLE_REPLY_BYTES],
    header_have: usize,
    skip: u64,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("tls", &self.tls.is_some()).field("size", &self.size).finish()
    }
}

fn protocol(what: impl Into<String>) -> ClientError {
    ClientError::Protocol(what.into())
}

impl Client {
    /// Connects to `addr`, upgrades to TLS if `tls` is given, and enters
    /// transmission on `export`.
    pub fn connect(addr: &str, export: &str, tls: Option<&ClientTlsOptions>) -> Result<Client, ClientError> {
        let sock = TcpStream::connect(addr)?;
        sock.set_nodelay(true)?;
        let mut c = Client {
            sock,
            tls: None,
            rbuf: vec![0; READ_BYTES],
            rpos: 0,
            rend: 0,
            plain: 0..0,
            out: Vec::new(),
            size: 0,
            transmission_flags: 0,
            header: [0; proto::SIMPLE_REPLY_BYTES],
            header_have: 0,
            skip: 0,
        };
        let greeting = c.read_plain_exact(proto::GREETING_BYTES)?;
        proto::decode_greeting(&greeting).map_err(|e| protocol(e.to_string()))?;
        c.sock.write_all(&(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes())?;
        if let Some(opts) = tls {
            c.send_option(&ClientOption::StartTls)?;
            let (reply_type, _) = c.option_reply()?;
            if reply_type != proto::REP_ACK {
                return Err(ClientError::Tls(format!("STARTTLS answered with reply type {reply_type:#x}")));
            }
            c.start_tls(opts)?;
        }
        c.send_option(&ClientOption::Info { go: true, name: export.into(), requests: vec![] })?;
        loop {
            let (reply_type, data) = c.option_reply()?;
            match reply_type {
                proto::REP_ACK => break,
                proto::REP_INFO => {
                    if let Ok(Some(proto::Info::Export { size_bytes, transmission_flags })) = proto::Info::decode(&data)
                    {
                        (c.size, c.transmission_flags) = (size_bytes, transmission_flags);
                    }
                }
                proto::REP_ERR_TLS_REQD => return Err(protocol("the server requires TLS (NBD_REP_ERR_TLS_REQD)")),
                other => return Err(protocol(format!("NBD_OPT_GO answered with reply type {other:#x}"))),
            }
        }
        Ok(c)
    }

    /// The export's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The export's transmission flags.
    pub fn transmission_flags(&self) -> u16 {
        self.transmission_flags
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The TLS cipher suite the server chose, if TLS is on.
    pub fn tls_suite(&self) -> Option<&str> {
        self.tls.as_ref().map(|r| r.suite.as_str())
    }

    fn send_option(&mut self, o: &ClientOption) -> Result<(), ClientError> {
        let bytes = o.encode();
        self.send_plain(&[&bytes])?;
        Ok(())
    }

    /// Sends the concatenation of `parts` now (sealed, under TLS).
    fn send_plain(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        match &mut self.tls {
            Some(t) => {
                t.tx.seal_parts(parts, &mut self.out)?;
                self.sock.write_all(&self.out)?;
                self.out.clear();
                Ok(())
            }
            None => write_all_vectored(&mut self.sock, parts),
        }
    }

    /// One option reply: (reply type, data).
    fn option_reply(&mut self) -> Result<(u32, Vec<u8>), ClientError> {
        let h = self.read_plain_exact(proto::OPTION_REPLY_HEADER_BYTES)?;
        let (_, reply_type, len) = OptionReply::decode_header(&h).map_err(|e| protocol(e.to_string()))?;
        if len > proto::OPTION_DATA_BYTES_MAX {
            return Err(protocol(format!("option reply of {len} bytes")));
        }
        Ok((reply_type, self.read_plain_exact(len as usize)?))
    }

    fn read_plain_exact(&mut self, n: usize) -> Result<Vec<u8>, ClientError> {
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            let r = self.next_plain(n - v.len())?;
            v.extend_from_slice(&self.rbuf[r]);
        }
        Ok(v)
    }

    /// The next plaintext bytes, at most `max`, as a range of `rbuf`,
    /// valid until the next call.
    fn next_plain(&mut self, max: usize) -> Result<Range<usize>, ClientError> {
        loop {
            let Some(t) = &mut self.tls else {
                if self.rpos < self.rend {
                    let r = self.rpos..self.rend.min(self.rpos.saturating_add(max));
                    self.rpos = r.end;
                    return Ok(r);
                }
                (self.rpos, self.rend) = (0, 0);
                self.fill()?;
                continue;
            };
            if !self.plain.is_empty() {
                let r = self.plain.start..self.plain.end.min(self.plain.start.saturating_add(max));
                self.plain.start = r.end;
                return Ok(r);
            }
            if let Some(n) = Direction::record_len(&self.rbuf[self.rpos..self.rend])? {
                let rec = self.rpos..self.rpos + n;
                self.rpos += n;
                let (ct, plain) = t.rx.open(&mut self.rbuf[rec.clone()])?;
                match ct {
                    tls_records::CONTENT_APPLICATION_DATA => {
                        self.plain = rec.start + plain.start..rec.start + plain.end;
                    }
                    // Session tickets: this client resumes nothing.
                    tls_records::CONTENT_HANDSHAKE => {}
                    tls_records::CONTENT_ALERT => return Err(ClientError::Tls("the server sent an alert".into())),
                    other => return Err(ClientError::Tls(format!("unexpected inner content type {other}"))),
                }
                continue;
            }
            // An incomplete record (`plain` is empty, so nothing before
            // `rpos` is still needed): make room for the largest one.
            if self.rbuf.len() - self.rpos < tls_records::HEADER_BYTES + tls_records::BODY_MAX {
                self.rbuf.copy_within(self.rpos..self.rend, 0);
                (self.rpos, self.rend) = (0, self.rend - self.rpos);
            }
            self.fill()?;
        }
    }

    /// Reads what the socket has after `rend`.
    fn fill(&mut self) -> Result<(), ClientError> {
        let n = self.sock.read(&mut self.rbuf[self.rend..])?;
        if n == 0 {
            return Err(ClientError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "the server closed")));
        }
        self.rend += n;
        Ok(())
    }

    /// The TLS handshake after STARTTLS's ACK. rustls is fed whole records
    /// only, so the bytes after the server's Finished stay in `rbuf`.
    fn start_tls(&mut self, opts: &ClientTlsOptions) -> Result<(), ClientError> {
        let mut roots = rustls::RootCertStore::empty();
        let ca = CertificateDer::from_pem_file(&opts.ca)
            .map_err(|source| ClientError::Ca { path: opts.ca.clone(), source })?;
        roots.add(ca)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.enable_secret_extraction = true;
        let name = ServerName::try_from(opts.server_name.clone())
            .map_err(|source| ClientError::ServerName { name: opts.server_name.clone(), source })?;
        let mut conn = rustls::ClientConnection::new(Arc::new(cfg), name)?;
        self.rbuf.copy_within(self.rpos..self.rend, 0);
        (self.rpos, self.rend) = (0, self.rend - self.rpos);
        while conn.is_handshaking() {
            while conn.wants_write() {
                conn.write_tls(&mut self.sock)?;
            }
            match tls_records::feed_handshake_record(&mut conn, &self.rbuf[self.rpos..self.rend]) {
                Ok(Some(n)) => {
                    self.rpos += n;
                    continue;
                }
                Ok(None) => {}
                Err(HandshakeError::Io(e)) => return Err(e.into()),
                Err(HandshakeError::Tls(e)) => return Err(ClientError::Rustls(e)),
            }
            self.rbuf.copy_within(self.rpos..self.rend, 0);
            (self.rpos, self.rend) = (0, self.rend - self.rpos);
            let n = self.sock.read(&mut self.rbuf[self.rend..])?;
            if n == 0 {
                return Err(ClientError::Tls("the server closed during the handshake".into()));
            }
            self.rend += n;
        }
        while conn.wants_write() {
            conn.write_tls(&mut self.sock)?;
        }
        let suite = conn.negotiated_cipher_suite().map(|s| format!("{:?}", s.suite())).unwrap_or_default();
        let s = conn.dangerous_extract_secrets()?;
        self.tls = Some(Records { tx: Direction::new(s.tx.0, s.tx.1)?, rx: Direction::new(s.rx.0, s.rx.1)?, suite });
        Ok(())
    }

    /// Sends `requests` in one batch; each WRITE carries `payload[..len]`.
    pub fn send_requests(&mut self, requests: &[RequestHeader], payload: &[u8]) -> Result<(), ClientError> {
        let headers: Vec<[u8; proto::REQUEST_HEADER_BYTES]> = requests.iter().map(|r| r.encode()).collect();
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 * requests.len());
        for (r, h) in requests.iter().zip(&headers) {
            parts.push(h);
            if r.command == proto::Command::Write as u16 {
                let len = r.len as usize;
                if len > payload.len() {
                    return Err(protocol(format!("a write of {len} bytes with a {} byte payload", payload.len())));
                }
                parts.push(&payload[..len]);
            }
        }
        self.send_plain(&parts)?;
        Ok(())
    }

    /// Blocks until at least one reply is complete, then parses every reply
    /// already received into `done`. Every outstanding request must be a
    /// READ of `read_len` bytes (its data is skipped, not copied) or a
    /// command without reply data (`read_len` 0).
    pub fn recv_replies(&mut self, read_len: u32, done: &mut Vec<SimpleReply>) -> Result<(), ClientError> {
        let start = done.len();
        loop {
            let r = self.next_plain(usize::MAX)?;
            let mut at = r.start;
            while at < r.end {
                if self.skip > 0 {
                    let n = (self.skip as usize).min(r.end - at);
                    self.skip -= n as u64;
                    at += n;
                    continue;
                }
                let n = (proto::SIMPLE_REPLY_BYTES - self.header_have).min(r.end - at);
                self.header[self.header_have..self.header_have + n].copy_from_slice(&self.rbuf[at..at + n]);
                self.header_have += n;
                at += n;
                if self.header_have == proto::SIMPLE_REPLY_BYTES {
                    self.header_have = 0;
                    let rep = SimpleReply::decode(&self.header).map_err(|e| protocol(e.to_string()))?;
                    if rep.error == 0 {
                        self.skip = read_len as u64;
                    }
                    done.push(rep);
                }
            }
            if done.len() > start && self.skip == 0 && self.header_have == 0 && !self.has_buffered() {
                return Ok(());
            }
        }
    }

    /// Raw bytes received and not yet consumed (for TLS: a whole record).
    fn has_buffered(&self) -> bool {
        match self.tls {
            Some(_) if !self.plain.is_empty() => true,
            Some(_) => matches!(Direction::record_len(&self.rbuf[self.rpos..self.rend]), Ok(Some(_))),
            None => self.rpos < self.rend,
        }
    }

    /// NBD_CMD_DISC, then closes.
    pub fn disconnect(mut self) -> Result<(), ClientError> {
        let disc = RequestHeader { flags: 0, command: proto::Command::Disc as u16, cookie: 0, offset: 0, len: 0 };
        self.send_requests(&[disc], &[])?;
        Ok(())
    }
}

/// `write_all` for a list of slices: one `writev` per call, resumed after a
/// partial write.
fn write_all_vectored(sock: &mut TcpStream, parts: &[&[u8]]) -> io::Result<()> {
    let (mut part, mut at) = (0, 0);
    while part < parts.len() {
        let mut slices = Vec::with_capacity(parts.len() - part);
        slices.push(IoSlice::new(&parts[part][at..]));
        slices.extend(parts[part + 1..].iter().map(|p| IoSlice::new(p)));
        let mut n = match sock.write_vectored(&slices[..slices.len().min(1024)]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "the server stopped reading"));
        }
        while part < parts.len() && n >= parts[part].len() - at {
            n -= parts[part].len() - at;
            (part, at) = (part + 1, 0);
        }
        at += n;
    }
    Ok(())
}
