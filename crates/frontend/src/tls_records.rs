//! The TLS 1.3 record layer for application data, after rustls has done
//! the handshake (RFC 8446 §5.2–5.3): what the kernel's kTLS does, in user
//! space, because this machine's kernel has no `tls` ULP.
//!
//! Owns: one direction's AEAD key, static IV and record sequence number;
//! sealing plaintext into `application_data` records and opening received
//! records in place.
//!
//! Invariants: the nonce of record `seq` is the IV XOR the big-endian `seq`
//! (left-padded to 12 bytes) and `seq` advances by exactly one per record
//! sealed or opened, so records must be sealed in wire order (the caller
//! writes each sealed buffer before sealing the next) and opened in arrival
//! order. A record that fails authentication, is longer than the protocol
//! allows, or is not application data or an alert is an error: the
//! connection ends (no KeyUpdate support; clients of this server do not send
//! it, and an unexpected one fails loudly, never silently).
//!
//! Why: rustls's buffered connection copies every received byte three more
//! times (into its deframer, into its plaintext queue, out to the caller)
//! and serializes both directions behind one lock; this layer decrypts in
//! the read buffer and encrypts in the send buffer, with the two directions
//! independent. Keys and sequence numbers come from rustls
//! (`dangerous_extract_secrets`), the AEAD from ring (AES-NI/VAES).

use std::io;
use std::ops::Range;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::ConnectionTrafficSecrets;

/// Record header: content type, legacy version (2), length (2).
pub(crate) const HEADER_BYTES: usize = 5;
/// Largest plaintext per record (2^14).
pub(crate) const PLAINTEXT_MAX: usize = 1 << 14;
/// Largest encrypted record body TLS 1.3 allows (2^14 + 256).
pub(crate) const BODY_MAX: usize = PLAINTEXT_MAX + 256;
const TAG_BYTES: usize = 16;

pub(crate) const CONTENT_ALERT: u8 = 21;
pub(crate) const CONTENT_HANDSHAKE: u8 = 22;
pub(crate) const CONTENT_APPLICATION_DATA: u8 = 23;

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// One direction of a TLS 1.3 session's record protection.
pub(crate) struct Direction {
    key: LessSafeKey,
    iv: [u8; aead::NONCE_LEN],
    seq: u64,
}

impl std::fmt::Debug for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key or IV.
        f.debug_struct("Direction").field("algorithm", self.key.algorithm()).field("seq", &self.seq).finish()
    }
}

impl Direction {
    /// From rustls's extracted (sequence number, secrets) of one direction.
    pub(crate) fn new(seq: u64, secrets: ConnectionTrafficSecrets) -> io::Result<Direction> {
        let (alg, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&aead::CHACHA20_POLY1305, key, iv),
            _ => return Err(bad("TLS: unsupported cipher suite for the record layer")),
        };
        let key = UnboundKey::new(alg, key.as_ref()).map_err(|_| bad("TLS: bad traffic key length"))?;
        let iv: [u8; aead::NONCE_LEN] = iv.as_ref().try_into().map_err(|_| bad("TLS: bad IV length"))?;
        Ok(Direction { key: LessSafeKey::new(key), iv, seq })
    }

    fn next_nonce(&mut self) -> io::Result<Nonce> {
        let mut n = self.iv;
        for (b, s) in n[aead::NONCE_LEN - 8..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        // RFC 8446 §5.3: the sequence number must not wrap.
        self.seq = self.seq.checked_add(1).ok_or_else(|| bad("TLS: record sequence number exhausted"))?;
        Ok(Nonce::assume_unique_for_key(n))
    }

    /// Appends `plaintext` to `out` as application-data records of at most
    /// 2^14 plaintext bytes each.
    pub(crate) fn seal(&mut self, plaintext: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        self.seal_parts(&[plaintext], out)
    }

    /// Appends the concatenation of `parts` to `out` as application-data
    /// records of at most 2^14 plaintext bytes each: a request header and
    /// its payload share records, and nothing is copied but into `out`.
    pub(crate) fn seal_parts(&mut self, parts: &[&[u8]], out: &mut Vec<u8>) -> io::Result<()> {
        let mut left: usize = parts.iter().map(|p| p.len()).sum();
        let (mut part, mut at) = (0, 0);
        while left > 0 {
            let len = left.min(PLAINTEXT_MAX);
            left -= len;
            let body_len = len + 1 + TAG_BYTES;
            let start = out.len();
            out.extend_from_slice(&[CONTENT_APPLICATION_DATA, 3, 3]);
            out.extend_from_slice(&(body_len as u16).to_be_bytes());
            let mut need = len;
            while need > 0 {
                let p = &parts[part][at..];
                let take = p.len().min(need);
                out.extend_from_slice(&p[..take]);
                need -= take;
                at += take;
                if at == parts[part].len() {
                    (part, at) = (part + 1, 0);
                }
            }
            out.push(CONTENT_APPLICATION_DATA);
            let header: [u8; HEADER_BYTES] = out[start..start + HEADER_BYTES].try_into().expect("5 bytes");
            let nonce = self.next_nonce()?;
            let tag = self
                .key
                .seal_in_place_separate_tag(nonce, Aad::from(header), &mut out[start + HEADER_BYTES..])
                .map_err(|_| bad("TLS: sealing a record failed"))?;
            out.extend_from_slice(tag.as_ref());
        }
        Ok(())
    }

    /// The whole record's length (header + body) if `buf` starts with a
    /// complete one, None if more bytes are needed; an error for a header no
    /// TLS 1.3 peer sends after the handshake.
    pub(crate) fn record_len(buf: &[u8]) -> io::Result<Option<usize>> {
        let Some(h) = buf.get(..HEADER_BYTES) else { return Ok(None) };
        if h[0] != CONTENT_APPLICATION_DATA {
            return Err(bad(format!("TLS: unexpected record type {} after the handshake", h[0])));
        }
        let len = u16::from_be_bytes([h[3], h[4]]) as usize;
        if !(1 + TAG_BYTES..=BODY_MAX).contains(&len) {
            return Err(bad(format!("TLS: record body of {len} bytes")));
        }
        Ok((buf.len() >= HEADER_BYTES + len).then_some(HEADER_BYTES + len))
    }

    /// Decrypts the complete record `rec` (header + body) in place; returns
    /// its inner content type and where its plaintext lies within `rec`.
    pub(crate) fn open(&mut self, rec: &mut [u8]) -> io::Result<(u8, Range<usize>)> {
        let header: [u8; HEADER_BYTES] = rec[..HEADER_BYTES].try_into().expect("a whole record");
        let nonce = self.next_nonce()?;
        let inner = self
            .key
            .open_in_place(nonce, Aad::from(header), &mut rec[HEADER_BYTES..])
            .map_err(|_| bad("TLS: a record failed authentication"))?;
        // TLSInnerPlaintext: content, content type, zero padding.
        let Some(end) = inner.iter().rposition(|&b| b != 0) else {
            return Err(bad("TLS: a record with no content type"));
        };
        Ok((inner[end], HEADER_BYTES..HEADER_BYTES + end))
    }
}

/// During a handshake: if `have` starts with a whole record (any type),
/// feeds exactly that record to rustls and returns its length; None if more
/// bytes are needed. Feeding whole records only is what keeps rustls from
/// swallowing bytes that follow the handshake.
pub(crate) fn feed_handshake_record<T>(
    conn: &mut rustls::ConnectionCommon<T>,
    have: &[u8],
) -> Result<Option<usize>, HandshakeError> {
    let whole = (have.len() >= HEADER_BYTES)
        .then(|| HEADER_BYTES + u16::from_be_bytes([have[3], have[4]]) as usize)
        .filter(|&n| n <= have.len());
    let Some(n) = whole else { return Ok(None) };
    let mut rec = &have[..n];
    while !rec.is_empty() {
        conn.read_tls(&mut rec).map_err(HandshakeError::Io)?;
        conn.process_new_packets().map_err(HandshakeError::Tls)?;
    }
    Ok(Some(n))
}

/// Why feeding a handshake record failed.
#[derive(Debug)]
pub(crate) enum HandshakeError {
    Io(io::Error),
    /// rustls refused the peer's message (an alert for it may be queued).
    Tls(rustls::Error),
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::cipher::{AeadKey, Iv};

    fn pair() -> (Direction, Direction) {
        let secrets = || ConnectionTrafficSecrets::Aes256Gcm { key: AeadKey::from([7u8; 32]), iv: Iv::new([9u8; 12]) };
        (Direction::new(5, secrets()).unwrap(), Direction::new(5, secrets()).unwrap())
    }

    #[test]
    fn sealed_records_open_in_order_and_split_at_16_kib() {
        let (mut tx, mut rx) = pair();
        let data: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        let mut wire = Vec::new();
        tx.seal(&data, &mut wire).unwrap();
        tx.seal(b"tail", &mut wire).unwrap();
        let mut got = Vec::new();
        let mut at = 0;
        let mut records = 0;
        while at < wire.len() {
            let n = Direction::record_len(&wire[at..]).unwrap().expect("whole record");
            let (ct, plain) = rx.open(&mut wire[at..at + n]).unwrap();
            assert_eq!(ct, CONTENT_APPLICATION_DATA);
            assert!(plain.len() <= PLAINTEXT_MAX);
            got.extend_from_slice(&wire[at + plain.start..at + plain.end]);
            at += n;
            records += 1;
        }
        assert_eq!(records, 4);
        assert_eq!(&got[..40_000], &data[..]);
        assert_eq!(&got[40_000..], b"tail");
    }

    #[test]
    fn parts_seal_as_their_concatenation_would() {
        let (mut a, mut b) = pair();
        let head = [1u8; 28];
        let body: Vec<u8> = (0..40_000u32).map(|i| (i * 7) as u8).collect();
        let (mut one, mut parts) = (Vec::new(), Vec::new());
        a.seal(&[&head[..], &body[..]].concat(), &mut one).unwrap();
        b.seal_parts(&[&head, &body, &[]], &mut parts).unwrap();
        assert_eq!(one, parts);
        assert_eq!(one.len(), 28 + 40_000 + 3 * (HEADER_BYTES + 1 + TAG_BYTES));
    }

    #[test]
    fn a_tampered_or_reordered_record_is_refused() {
        let (mut tx, mut rx) = pair();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        tx.seal(b"first", &mut a).unwrap();
        tx.seal(b"second", &mut b).unwrap();
        // Out of order: `b` was sealed with the next sequence number.
        assert!(rx.clone_for_test().open(&mut b.clone()).is_err());
        let mut t = a.clone();
        t[HEADER_BYTES + 1] ^= 1;
        assert!(rx.clone_for_test().open(&mut t).is_err());
        assert!(rx.open(&mut a).is_ok());
        assert!(rx.open(&mut b).is_ok());
    }

    #[test]
    fn record_headers_are_checked_before_anything_is_decrypted() {
        assert_eq!(Direction::record_len(&[23, 3, 3, 0]).unwrap(), None);
        assert_eq!(Direction::record_len(&[23, 3, 3, 0, 17]).unwrap(), None);
        assert!(Direction::record_len(&[22, 3, 3, 0, 40]).is_err());
        assert!(Direction::record_len(&[23, 3, 3, 0, 3]).is_err());
        assert!(Direction::record_len(&[23, 3, 3, 0xff, 0xff]).is_err());
    }

    impl Direction {
        fn clone_for_test(&self) -> Direction {
            let secrets = ConnectionTrafficSecrets::Aes256Gcm { key: AeadKey::from([7u8; 32]), iv: Iv::new(self.iv) };
            Direction::new(self.seq, secrets).unwrap()
        }
    }
}
