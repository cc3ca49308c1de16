//! The record layer measured against rustls's own unbuffered API, in one
//! process: the server's side of TLS 1.3 (AES-128-GCM, the suite it
//! prefers), opening a client's application data and sealing replies, with
//! no sockets in between (`sluice bench tls-records`).
//!
//! Owns: an in-memory handshake between a rustls client and the server's
//! configuration (`tls::server_config`), and the timing of both record
//! layers on the same bytes.
//!
//! Both sides do what the NBD server does with a request or a reply: the
//! plaintext of received records ends up in a request buffer (one copy out
//! of the decrypted record), and a reply's plaintext is sealed into a send
//! buffer. Only the server's work is timed; the client (rustls's buffered
//! connection) produces the records and checks the replies untimed.

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::Instant;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, UnbufferedStatus};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, ServerConfig, SignatureScheme};

use crate::tls_records::{self, Direction};

/// Throughputs of one record layer, MiB/s of plaintext.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct RecordLayerSpeed {
    /// Opening a client's records and copying their plaintext out.
    pub open_mib_per_s: f64,
    /// Sealing replies into a send buffer.
    pub seal_mib_per_s: f64,
}

/// Both record layers on the same work.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Comparison {
    pub mib: u64,
    pub message_bytes: usize,
    pub own: RecordLayerSpeed,
    pub rustls_unbuffered: RecordLayerSpeed,
}

fn bad(msg: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

/// A benchmark client trusts any server certificate: the bytes measured are
/// the same whoever signed it.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn client_config() -> Result<Arc<ClientConfig>, io::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(bad)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// A handshake in memory: the server (unbuffered) at WriteTraffic, the
/// client done.
fn handshake(server_cfg: &Arc<ServerConfig>) -> io::Result<(UnbufferedServerConnection, ClientConnection)> {
    let name = ServerName::try_from("localhost").map_err(bad)?;
    let mut client = ClientConnection::new(client_config()?, name).map_err(bad)?;
    let mut server = UnbufferedServerConnection::new(server_cfg.clone()).map_err(bad)?;
    let (mut to_server, mut to_client) = (Vec::new(), Vec::new());
    for _ in 0..64 {
        while client.wants_write() {
            client.write_tls(&mut to_server)?;
        }
        loop {
            let UnbufferedStatus { discard, state } = server.process_tls_records(&mut to_server);
            let (mut blocked, mut done) = (false, false);
            match state.map_err(bad)? {
                ConnectionState::EncodeTlsData(mut e) => crate::tls::encode(&mut e, &mut to_client)?,
                ConnectionState::TransmitTlsData(t) => {
                    client.read_tls(&mut &to_client[..])?;
                    client.process_new_packets().map_err(bad)?;
                    to_client.clear();
                    t.done();
                }
                ConnectionState::BlockedHandshake => blocked = true,
                ConnectionState::WriteTraffic(_) => done = true,
                _ => return Err(bad("unexpected state in the benchmark handshake")),
            }
            to_server.drain(..discard);
            if done && !client.is_handshaking() {
                return Ok((server, client));
            }
            if blocked || done {
                break;
            }
        }
    }
    Err(bad("the benchmark handshake did not finish"))
}

/// The client's records carrying `total` bytes in `message`-sized writes.
fn client_records(client: &mut ClientConnection, message: &[u8], total: u64) -> io::Result<Vec<u8>> {
    let mut wire = Vec::with_capacity(total as usize + total as usize / 512);
    let mut sent = 0;
    client.set_buffer_limit(None);
    while sent < total {
        client.writer().write_all(message)?;
        while client.wants_write() {
            client.write_tls(&mut wire)?;
        }
        sent += message.len() as u64;
    }
    Ok(wire)
}

/// Reads back what the server sealed and checks it.
fn check_replies(client: &mut ClientConnection, wire: &[u8], message: &[u8], count: usize) -> io::Result<()> {
    let mut rd = wire;
    let mut got = Vec::new();
    while !rd.is_empty() {
        client.read_tls(&mut rd)?;
        client.process_new_packets().map_err(bad)?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match client.reader().read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
    }
    if got.len() != message.len() * count || got.chunks(message.len()).any(|c| c != message) {
        return Err(bad("the client did not read back what the server sealed"));
    }
    Ok(())
}

/// Copies `p` into the request buffer `dest` from `at` on, wrapping at its
/// end (a request's payload arriving record by record); returns the next
/// position.
fn copy_out(dest: &mut [u8], mut at: usize, mut p: &[u8]) -> usize {
    while !p.is_empty() {
        let n = p.len().min(dest.len() - at);
        dest[at..at + n].copy_from_slice(&p[..n]);
        (at, p) = ((at + n) % dest.len(), &p[n..]);
    }
    at
}

fn mib_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs.max(1e-9)
}

/// Runs both record layers over `mib` MiB each way in `message_bytes`
/// requests and replies (e.g. 128 KiB, an NBD write's payload).
pub fn compare(server_cfg: &Arc<ServerConfig>, mib: u64, message_bytes: usize) -> io::Result<Comparison> {
    let total = mib << 20;
    let message: Vec<u8> = (0..message_bytes).map(|i| (i * 31 % 251) as u8).collect();
    let count = (total / message_bytes as u64) as usize;
    let mut dest = vec![0u8; message_bytes];

    // rustls unbuffered.
    let (mut server, mut client) = handshake(server_cfg)?;
    let mut wire = client_records(&mut client, &message, total)?;
    let t = Instant::now();
    let (mut pos, mut at, mut opened) = (0usize, 0usize, 0u64);
    while pos < wire.len() {
        let UnbufferedStatus { mut discard, state } = server.process_tls_records(&mut wire[pos..]);
        match state.map_err(bad)? {
            ConnectionState::ReadTraffic(mut r) => {
                while let Some(rec) = r.next_record() {
                    let rec = rec.map_err(bad)?;
                    discard += rec.discard;
                    at = copy_out(&mut dest, at, rec.payload);
                    opened += rec.payload.len() as u64;
                }
            }
            ConnectionState::WriteTraffic(_) if discard == 0 => break,
            _ => {}
        }
        pos += discard;
    }
    let open_secs = t.elapsed().as_secs_f64();
    if opened != total || dest != message {
        return Err(bad(format!("rustls opened {opened} of {total} bytes")));
    }
    let mut out = vec![0u8; message_bytes + message_bytes / 512 + 1024];
    let mut replies = Vec::new();
    let t = Instant::now();
    for i in 0..count {
        let UnbufferedStatus { state, .. } = server.process_tls_records(&mut []);
        let ConnectionState::WriteTraffic(mut w) = state.map_err(bad)? else {
            return Err(bad("rustls left WriteTraffic"));
        };
        let n = w.encrypt(&message, &mut out).map_err(bad)?;
        if i < 8 {
            replies.extend_from_slice(&out[..n]);
        }
    }
    let seal_secs = t.elapsed().as_secs_f64();
    check_replies(&mut client, &replies, &message, 8.min(count))?;
    let rustls_unbuffered =
        RecordLayerSpeed { open_mib_per_s: mib_per_s(total, open_secs), seal_mib_per_s: mib_per_s(total, seal_secs) };

    // Ours, from the same kind of session.
    let (server, mut client) = handshake(server_cfg)?;
    let (secrets, _) = server.dangerous_into_kernel_connection().map_err(bad)?;
    let (mut rx, mut tx) = (Direction::new(secrets.rx.0, secrets.rx.1)?, Direction::new(secrets.tx.0, secrets.tx.1)?);
    let mut wire = client_records(&mut client, &message, total)?;
    let t = Instant::now();
    let (mut pos, mut at, mut opened) = (0usize, 0usize, 0u64);
    while let Some(n) = Direction::record_len(&wire[pos..])? {
        let (ct, plain) = rx.open(&mut wire[pos..pos + n])?;
        if ct == tls_records::CONTENT_APPLICATION_DATA {
            at = copy_out(&mut dest, at, &wire[pos + plain.start..pos + plain.end]);
            opened += plain.len() as u64;
        }
        pos += n;
    }
    let open_secs = t.elapsed().as_secs_f64();
    if opened != total || dest != message {
        return Err(bad(format!("the record layer opened {opened} of {total} bytes")));
    }
    let mut out = Vec::with_capacity(message_bytes + message_bytes / 512 + 1024);
    let mut replies = Vec::new();
    let t = Instant::now();
    for i in 0..count {
        out.clear();
        tx.seal(&message, &mut out)?;
        if i < 8 {
            replies.extend_from_slice(&out);
        }
    }
    let seal_secs = t.elapsed().as_secs_f64();
    check_replies(&mut client, &replies, &message, 8.min(count))?;
    let own =
        RecordLayerSpeed { open_mib_per_s: mib_per_s(total, open_secs), seal_mib_per_s: mib_per_s(total, seal_secs) };
    Ok(Comparison { mib, message_bytes, own, rustls_unbuffered })
}
