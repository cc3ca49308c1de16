//! Fuzzes the TLS record reader (crates/frontend/src/tls/fuzz.rs and
//! tls_records.rs) as a server meets it after the handshake: the input
//! builds a stream of correctly sealed records of any content type and
//! length, raw attacker bytes and bit flips, in TLS 1.3 or TLS 1.2 with
//! AES-GCM or ChaCha20 (`sluice_frontend::tls::fuzz_record_reader`). A panic,
//! or plaintext returned that is not a prefix of the application data sealed
//! in order, is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    sluice_frontend::tls::fuzz_record_reader(data);
});
