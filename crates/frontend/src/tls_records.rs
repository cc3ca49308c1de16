//! The TLS record layer for application data, after rustls has done the
//! handshake: TLS 1.3 (RFC 8446 §5.2–5.3) and TLS 1.2's AEAD records
//! (RFC 5246 §6.2.3.3, RFC 5288 for AES-GCM, RFC 7905 for ChaCha20). What
//! the kernel's kTLS does, in user space, because this machine's kernel has
//! no `tls` ULP.
//!
//! Owns: one direction's AEAD key, static IV, record sequence number and
//! protocol version; sealing plaintext into `application_data` records and
//! opening received records in place.
//!
//! Invariants: `seq` advances by exactly one per record sealed or opened, so
//! records must be sealed in wire order (the caller writes each sealed
//! buffer before sealing the next) and opened in arrival order. TLS 1.3: the
//! nonce is the IV XOR the big-endian `seq` (left-padded to 12 bytes), the
//! additional data is the record header, and the content type is inside the
//! encryption. TLS 1.2: the additional data is `seq`, type, version and
//! plaintext length; AES-GCM's nonce is the 4-byte salt and an 8-byte
//! explicit part sent before the ciphertext (we send IV[4..] XOR `seq`, as
//! rustls and OpenSSL do, so it never repeats); ChaCha20's is the IV XOR
//! `seq`. A record that fails authentication, is longer than the protocol
//! allows, or is not application data, an alert or (TLS 1.3) a handshake
//! message is an error: the connection ends, never silently.
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
/// Handshake message type of a TLS 1.3 KeyUpdate.
const HANDSHAKE_KEY_UPDATE: u8 = 24;

/// A TLS 1.3 post-handshake record's plaintext as a KeyUpdate: whether the
/// sender asks for one back. It must be the record's only message (RFC 8446
/// §5.1: a key change aligns with a record boundary); anything else, as any
/// other post-handshake message (this server never asks for post-handshake
/// authentication), is an error.
pub(crate) fn key_update_request(plain: &[u8]) -> io::Result<bool> {
    match plain {
        [HANDSHAKE_KEY_UPDATE, 0, 0, 1, r @ (0 | 1)] => Ok(*r == 1),
        [t, ..] => Err(bad(format!("TLS: unexpected post-handshake message (type {t}, {} bytes)", plain.len()))),
        [] => Err(bad("TLS: an empty handshake record")),
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// One direction of a TLS session's record protection.
pub(crate) struct Direction {
    key: LessSafeKey,
    iv: [u8; aead::NONCE_LEN],
    seq: u64,
    /// TLS 1.2's record format rather than TLS 1.3's.
    tls12: bool,
    /// Bytes of explicit nonce before each TLS 1.2 ciphertext (8 for
    /// AES-GCM, 0 for ChaCha20; always 0 in TLS 1.3).
    explicit: usize,
}

impl std::fmt::Debug for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key or IV.
        let mut d = f.debug_struct("Direction");
        d.field("algorithm", self.key.algorithm()).field("seq", &self.seq).field("tls12", &self.tls12).finish()
    }
}

impl Direction {
    /// A TLS 1.3 direction from rustls's extracted (sequence number,
    /// secrets).
    pub(crate) fn new(seq: u64, secrets: ConnectionTrafficSecrets) -> io::Result<Direction> {
        Direction::for_version(false, seq, secrets)
    }

    /// A direction of the negotiated version (`tls12`: TLS 1.2, else 1.3).
    pub(crate) fn for_version(tls12: bool, seq: u64, secrets: ConnectionTrafficSecrets) -> io::Result<Direction> {
        let (alg, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&aead::CHACHA20_POLY1305, key, iv),
            _ => return Err(bad("TLS: unsupported cipher suite for the record layer")),
        };
        let key = UnboundKey::new(alg, key.as_ref()).map_err(|_| bad("TLS: bad traffic key length"))?;
        let iv: [u8; aead::NONCE_LEN] = iv.as_ref().try_into().map_err(|_| bad("TLS: bad IV length"))?;
        let explicit =
            if tls12 && !matches!(secrets, ConnectionTrafficSecrets::Chacha20Poly1305 { .. }) { 8 } else { 0 };
        Ok(Direction { key: LessSafeKey::new(key), iv, seq, tls12, explicit })
    }

    /// This record's sequence number; advances it.
    fn take_seq(&mut self) -> io::Result<u64> {
        let seq = self.seq;
        // RFC 8446 §5.3 (and RFC 5246 §6.1): the sequence number must not wrap.
        self.seq = seq.checked_add(1).ok_or_else(|| bad("TLS: record sequence number exhausted"))?;
        Ok(seq)
    }

    /// The IV XOR the big-endian `seq`.
    fn nonce_bytes(&self, seq: u64) -> [u8; aead::NONCE_LEN] {
        let mut n = self.iv;
        for (b, s) in n[aead::NONCE_LEN - 8..].iter_mut().zip(seq.to_be_bytes()) {
            *b ^= s;
        }
        n
    }

    /// TLS 1.2's additional data: seq, type, version, plaintext length.
    fn tls12_aad(seq: u64, content_type: u8, plain_len: usize) -> [u8; 13] {
        let mut a = [0u8; 13];
        a[..8].copy_from_slice(&seq.to_be_bytes());
        a[8..11].copy_from_slice(&[content_type, 3, 3]);
        a[11..].copy_from_slice(&(plain_len as u16).to_be_bytes());
        a
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
        self.seal_as(CONTENT_APPLICATION_DATA, parts, out)
    }

    /// Appends a TLS 1.3 KeyUpdate handshake message (RFC 8446 §4.6.3),
    /// sealed with this direction's current key; `requested`: the peer must
    /// answer with its own.
    pub(crate) fn seal_key_update(&mut self, requested: bool, out: &mut Vec<u8>) -> io::Result<()> {
        if self.tls12 {
            return Err(bad("TLS 1.2 has no KeyUpdate"));
        }
        self.seal_as(CONTENT_HANDSHAKE, &[&[HANDSHAKE_KEY_UPDATE, 0, 0, 1, u8::from(requested)]], out)
    }

    /// Seals `parts` as records of `content_type` (inside the encryption in
    /// TLS 1.3; the header's in TLS 1.2).
    pub(crate) fn seal_as(&mut self, content_type: u8, parts: &[&[u8]], out: &mut Vec<u8>) -> io::Result<()> {
        let mut left: usize = parts.iter().map(|p| p.len()).sum();
        let (mut part, mut at) = (0, 0);
        while left > 0 {
            let len = left.min(PLAINTEXT_MAX);
            left -= len;
            // TLS 1.3 carries the content type inside; TLS 1.2 AES-GCM an
            // explicit nonce before.
            let inner_type = usize::from(!self.tls12);
            let body_len = self.explicit + len + inner_type + TAG_BYTES;
            let start = out.len();
            let outer = if self.tls12 { content_type } else { CONTENT_APPLICATION_DATA };
            out.extend_from_slice(&[outer, 3, 3]);
            out.extend_from_slice(&(body_len as u16).to_be_bytes());
            let seq = self.take_seq()?;
            let nonce = self.nonce_bytes(seq);
            out.extend_from_slice(&nonce[aead::NONCE_LEN - self.explicit..]);
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
            let sealed = start + HEADER_BYTES + self.explicit;
            let nonce = Nonce::assume_unique_for_key(nonce);
            let tag = if self.tls12 {
                let aad = Direction::tls12_aad(seq, content_type, len);
                self.key.seal_in_place_separate_tag(nonce, Aad::from(aad), &mut out[sealed..])
            } else {
                out.push(content_type);
                let header: [u8; HEADER_BYTES] = out[start..start + HEADER_BYTES].try_into().expect("5 bytes");
                self.key.seal_in_place_separate_tag(nonce, Aad::from(header), &mut out[sealed..])
            };
            let tag = tag.map_err(|_| bad("TLS: sealing a record failed"))?;
            out.extend_from_slice(tag.as_ref());
        }
        Ok(())
    }

    /// The whole record's length (header + body) if `buf` starts with a
    /// complete one, None if more bytes are needed; an error for a header no
    /// peer sends after the handshake (anything but application data, or a
    /// TLS 1.2 alert; `open` then holds each version to its own).
    pub(crate) fn record_len(buf: &[u8]) -> io::Result<Option<usize>> {
        let Some(h) = buf.get(..HEADER_BYTES) else { return Ok(None) };
        if h[0] != CONTENT_APPLICATION_DATA && h[0] != CONTENT_ALERT {
            return Err(bad(format!("TLS: unexpected record type {} after the handshake", h[0])));
        }
        let len = u16::from_be_bytes([h[3], h[4]]) as usize;
        if !(1 + TAG_BYTES..=BODY_MAX).contains(&len) {
            return Err(bad(format!("TLS: record body of {len} bytes")));
        }
        Ok((buf.len() >= HEADER_BYTES + len).then_some(HEADER_BYTES + len))
    }

    /// Decrypts the complete record `rec` (header + body) in place; returns
    /// its content type and where its plaintext lies within `rec`.
    pub(crate) fn open(&mut self, rec: &mut [u8]) -> io::Result<(u8, Range<usize>)> {
        if self.tls12 {
            return self.open_tls12(rec);
        }
        let header: [u8; HEADER_BYTES] = rec[..HEADER_BYTES].try_into().expect("a whole record");
        if header[0] != CONTENT_APPLICATION_DATA {
            return Err(bad(format!("TLS 1.3: outer record type {}", header[0])));
        }
        let seq = self.take_seq()?;
        let nonce = Nonce::assume_unique_for_key(self.nonce_bytes(seq));
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

    /// TLS 1.2: the content type is the header's; AES-GCM's explicit nonce
    /// precedes the ciphertext.
    fn open_tls12(&mut self, rec: &mut [u8]) -> io::Result<(u8, Range<usize>)> {
        let content_type = rec[0];
        let body = rec.len() - HEADER_BYTES;
        let Some(plain_len) = body.checked_sub(self.explicit + TAG_BYTES) else {
            return Err(bad(format!("TLS 1.2: record body of {body} bytes")));
        };
        let seq = self.take_seq()?;
        let mut nonce = self.nonce_bytes(seq);
        if self.explicit > 0 {
            nonce[..4].copy_from_slice(&self.iv[..4]);
            nonce[4..].copy_from_slice(&rec[HEADER_BYTES..HEADER_BYTES + 8]);
        }
        let aad = Direction::tls12_aad(seq, content_type, plain_len);
        let start = HEADER_BYTES + self.explicit;
        self.key
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut rec[start..])
            .map_err(|_| bad("TLS: a record failed authentication"))?;
        Ok((content_type, start..start + plain_len))
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
        // A TLS 1.2 alert; a TLS 1.3 direction refuses it when opening.
        assert_eq!(Direction::record_len(&[21, 3, 3, 0, 26]).unwrap(), None);
        let mut alert = [21u8, 3, 3, 0, 17].into_iter().chain([0; 17]).collect::<Vec<_>>();
        assert!(pair().1.open(&mut alert).is_err());
        assert!(Direction::record_len(&[23, 3, 3, 0, 3]).is_err());
        assert!(Direction::record_len(&[23, 3, 3, 0xff, 0xff]).is_err());
    }

    /// TLS 1.2 records: AES-GCM carries IV[4..] XOR seq as its explicit
    /// nonce before the ciphertext, ChaCha20 none; both open in order, the
    /// content type is the header's, and a changed explicit nonce, header
    /// or order is refused.
    #[test]
    fn tls12_records_round_trip_with_their_nonces_and_refuse_tampering() {
        let gcm = || ConnectionTrafficSecrets::Aes256Gcm { key: AeadKey::from([3u8; 32]), iv: Iv::new([5u8; 12]) };
        let chacha =
            || ConnectionTrafficSecrets::Chacha20Poly1305 { key: AeadKey::from([3u8; 32]), iv: Iv::new([5u8; 12]) };
        for (secrets, explicit) in [(&gcm as &dyn Fn() -> ConnectionTrafficSecrets, 8), (&chacha, 0)] {
            let mut tx = Direction::for_version(true, 7, secrets()).unwrap();
            let mut rx = Direction::for_version(true, 7, secrets()).unwrap();
            let data: Vec<u8> = (0..20_000u32).map(|i| (i % 253) as u8).collect();
            let mut wire = Vec::new();
            tx.seal(&data, &mut wire).unwrap();
            let first = HEADER_BYTES + explicit + PLAINTEXT_MAX + TAG_BYTES;
            assert_eq!(wire.len(), first + HEADER_BYTES + explicit + (20_000 - PLAINTEXT_MAX) + TAG_BYTES);
            if explicit == 8 {
                let mut want = [5u8; 8];
                want[7] ^= 7;
                assert_eq!(wire[HEADER_BYTES..HEADER_BYTES + 8], want, "explicit nonce of record 7");
            }
            let mut t = wire.clone();
            t[HEADER_BYTES] ^= 1;
            assert!(Direction::for_version(true, 7, secrets()).unwrap().open(&mut t[..first]).is_err());
            let mut t = wire.clone();
            t[0] = CONTENT_ALERT;
            assert!(Direction::for_version(true, 7, secrets()).unwrap().open(&mut t[..first]).is_err());
            assert!(Direction::for_version(true, 8, secrets()).unwrap().open(&mut wire.clone()[..first]).is_err());
            let (ct, plain) = rx.open(&mut wire[..first]).unwrap();
            assert_eq!(ct, CONTENT_APPLICATION_DATA);
            assert_eq!(wire[plain], data[..PLAINTEXT_MAX]);
            let (_, plain) = rx.open(&mut wire[first..]).unwrap();
            assert_eq!(wire[first..][plain], data[PLAINTEXT_MAX..]);
        }
    }

    /// A post-handshake record is a lone KeyUpdate or an error; a sealed
    /// KeyUpdate opens as one (inner type handshake).
    #[test]
    fn only_a_lone_key_update_is_accepted_after_the_handshake() {
        assert!(!key_update_request(&[24, 0, 0, 1, 0]).unwrap());
        assert!(key_update_request(&[24, 0, 0, 1, 1]).unwrap());
        assert!(key_update_request(&[24, 0, 0, 1, 2]).is_err());
        assert!(key_update_request(&[24, 0, 0, 1, 0, 24, 0, 0, 1, 0]).is_err(), "two messages in one record");
        assert!(key_update_request(&[4, 0, 0, 1, 0]).is_err(), "NewSessionTicket from a client");
        assert!(key_update_request(&[]).is_err());
        let (mut tx, mut rx) = pair();
        let mut wire = Vec::new();
        tx.seal_key_update(true, &mut wire).unwrap();
        let (ct, plain) = rx.open(&mut wire).unwrap();
        assert_eq!(ct, CONTENT_HANDSHAKE);
        assert!(key_update_request(&wire[plain]).unwrap());
        let tls12 = ConnectionTrafficSecrets::Aes256Gcm { key: AeadKey::from([7u8; 32]), iv: Iv::new([9u8; 12]) };
        assert!(Direction::for_version(true, 0, tls12).unwrap().seal_key_update(false, &mut wire).is_err());
    }

    impl Direction {
        fn clone_for_test(&self) -> Direction {
            let secrets = ConnectionTrafficSecrets::Aes256Gcm { key: AeadKey::from([7u8; 32]), iv: Iv::new(self.iv) };
            Direction::new(self.seq, secrets).unwrap()
        }
    }
}
