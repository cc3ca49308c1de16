//! The TLS record reader as a fuzz target sees it (`fuzz_record_reader`,
//! run by fuzz/fuzz_targets/tls_records.rs): a stream built from the fuzzer's
//! bytes, read by a real `TlsStream`, checked against the integrity rule.

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

use super::{RxRecords, TlsStream, TxRecords};
use crate::socket::Socket;
use crate::tls_records::{self, Direction};

/// Fuzzing entry (fuzz/fuzz_targets/tls_records.rs): the server's record
/// reader fed a stream built from `input`: records sealed with the session's
/// key (application data, alerts, handshake messages, any content type, any
/// length up to the maximum), raw attacker bytes, and bit flips, in TLS 1.3
/// or TLS 1.2 with AES-GCM or ChaCha20. Panics if the reader panics, or if
/// what it returns is not a prefix of the application data sealed in order
/// (it must never invent or reorder data).
pub fn fuzz_record_reader(input: &[u8]) {
    use rustls::crypto::cipher::{AeadKey, Iv};
    use rustls::ConnectionTrafficSecrets as S;
    let Some((&mode, mut ops)) = input.split_first() else { return };
    let tls12 = mode & 1 == 1;
    // AES-128-GCM differs from AES-256-GCM only in the key's length.
    let secrets = || match mode >> 1 & 1 {
        0 => S::Aes256Gcm { key: AeadKey::from([1u8; 32]), iv: Iv::new([2u8; 12]) },
        _ => S::Chacha20Poly1305 { key: AeadKey::from([1u8; 32]), iv: Iv::new([2u8; 12]) },
    };
    let Ok(mut sealer) = Direction::for_version(tls12, 0, secrets()) else { return };
    let (mut wire, mut sealed_data) = (Vec::new(), Vec::new());
    while let [kind, a, b, rest @ ..] = ops {
        let n = (u16::from_be_bytes([*a, *b]) as usize).min(rest.len());
        let (bytes, rest) = rest.split_at(n);
        ops = rest;
        match kind % 4 {
            // Application data, sealed in order.
            0 => {
                if sealer.seal(bytes, &mut wire).is_ok() {
                    sealed_data.extend_from_slice(bytes);
                }
            }
            // Another content type: the first byte names it (not 0, which
            // in TLS 1.3 would make the body's last non-zero byte the type:
            // padding, by the RFC).
            1 => match bytes.split_first() {
                Some((&tls_records::CONTENT_APPLICATION_DATA | 0, _)) | None => {}
                Some((&ct, body)) => {
                    let _ = sealer.seal_as(ct, &[body], &mut wire);
                }
            },
            // Raw bytes from an attacker.
            2 => wire.extend_from_slice(bytes),
            // A bit flip somewhere in what was sent so far.
            _ => {
                if let (Some(&at), false) = (bytes.first(), wire.is_empty()) {
                    let i = (at as usize * 257 + n) % wire.len();
                    wire[i] ^= 1 << (at % 8);
                }
            }
        }
    }
    let Ok((a, b)) = std::os::unix::net::UnixStream::pair() else { return };
    let raw = Socket::Unix(Arc::new(a));
    let wsock = raw.clone();
    let Ok(dir) = Direction::for_version(tls12, 0, secrets()) else { return };
    let tx = TxRecords { dir, wsock, out: Vec::new() };
    let Ok(rx) = Direction::for_version(tls12, 0, secrets()) else { return };
    let rx = RxRecords { dir: rx, kernel: None };
    let mut reader = TlsStream::with_records(raw, Arc::new(Mutex::new(tx)), Arc::new(Mutex::new(rx)));
    let feeder = std::thread::spawn(move || {
        let mut b = b;
        let _ = b.write_all(&wire);
        let _ = b.shutdown(std::net::Shutdown::Write);
        b
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 5000];
    while let Ok(n @ 1..) = reader.read(&mut buf) {
        got.extend_from_slice(&buf[..n]);
    }
    drop(reader);
    let _ = feeder.join();
    assert!(sealed_data.starts_with(&got), "the reader returned data that was not sealed, or out of order");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fuzzing entry on hand-made streams: good records, a tampered
    /// one, a close_notify, a KeyUpdate with nothing to derive keys from.
    #[test]
    fn the_fuzz_entry_checks_streams_of_every_kind() {
        for mode in 0..4u8 {
            let mut input = vec![mode];
            for op in [&[0u8, 0, 5, 1, 2, 3, 4, 5][..], &[1, 0, 3, 21, 1, 0], &[0, 0, 2, 9, 9]] {
                input.extend_from_slice(op);
            }
            fuzz_record_reader(&input);
            input.extend_from_slice(&[3, 0, 1, 77, 1, 0, 6, 22, 24, 0, 0, 1, 1, 2, 0, 3, 23, 3, 3]);
            fuzz_record_reader(&input);
        }
    }
}
