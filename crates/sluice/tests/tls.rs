//! `sluice serve` with `[tls] mode = "require"`: real clients (nbdinfo via
//! libnbd/GnuTLS, qemu-io) connect over TLS and verify the server's
//! certificate against a CA; a client trusting another CA is refused; a
//! plaintext client is refused with the spec's TLS-required answer.

mod common;

use common::{libnbd, need, qemu_io, small_config, start, stop};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use sluice_frontend::proto::{self, ClientOption, OptionReply};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA (`ca-cert.pem`, the file name libnbd and qemu look for) in `dir`,
/// and, if `server`, a server certificate for 127.0.0.1/localhost it signed.
fn pki(dir: &Path, server: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca-key.pem", "-out", "ca-cert.pem", "-subj", "/CN=sluice test CA", "-days", "2"]);
    openssl(dir, &ca);
    if !server {
        return;
    }
    let mut req = vec!["req"];
    req.extend(ec);
    req.extend(["-keyout", "server-key.pem", "-out", "server.csr", "-subj", "/CN=localhost"]);
    openssl(dir, &req);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca-cert.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            "server-cert.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

fn nbdinfo(uri: &str) -> (bool, String) {
    let out = Command::new("nbdinfo").arg(uri).output().expect("nbdinfo");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

/// Adds `[tls] mode = "require"` with `pki_dir`'s server certificate.
fn require_tls(config: &Path, pki_dir: &Path) {
    tls_mode(config, pki_dir, "require")
}

fn tls_mode(config: &Path, pki_dir: &Path, mode: &str) {
    let mut text = std::fs::read_to_string(config).unwrap();
    text += &format!(
        "[tls]\nmode = {mode:?}\ncert = {:?}\nkey = {:?}\n",
        pki_dir.join("server-cert.pem"),
        pki_dir.join("server-key.pem")
    );
    std::fs::write(config, text).unwrap();
}

#[test]
fn tls_required_serves_verified_clients_and_refuses_plaintext() {
    need("openssl");
    need("nbdinfo");
    need("qemu-io");
    let (dir, config) = small_config("tls");
    let (pki_dir, other_ca) = (dir.join("pki"), dir.join("other-ca"));
    pki(&pki_dir, true);
    pki(&other_ca, false);
    require_tls(&config, &pki_dir);
    let (server, port) = start(&config);

    let certs = pki_dir.display();
    let (ok, out) = nbdinfo(&format!("nbds://127.0.0.1:{port}/default?tls-certificates={certs}"));
    assert!(ok && out.contains("with TLS") && out.contains("export-size: 268435456"), "{out}");

    let io = |cmds: &[&str]| {
        let (ok, out) = qemu_io_tls(port, &pki_dir, "NORMAL", cmds);
        assert!(ok, "qemu-io {cmds:?}: {out}");
    };
    io(&["write -P 0x3c 0 4M", "write -P 0x3d 8M 128k", "flush"]);
    io(&["read -P 0x3c 0 4M", "read -P 0x3d 8M 128k", "read -P 0 4M 4M"]);

    // Varied data through large requests both ways (nbdcopy: 256 KiB
    // requests, structured replies, many records per reply), read back
    // byte for byte.
    need("nbdcopy");
    {
        let src: Vec<u8> = (0..3u32 << 20).map(|i| (i / 4096 * 31 + i % 251) as u8).collect();
        std::fs::write(dir.join("src.img"), &src).unwrap();
        let uri = format!("nbds://127.0.0.1:{port}/default?tls-certificates={certs}");
        let copy = |from: &str, to: &str| {
            let out = Command::new("nbdcopy").args([from, to]).output().expect("nbdcopy");
            assert!(out.status.success(), "nbdcopy {from} {to}: {}", String::from_utf8_lossy(&out.stderr));
        };
        copy(dir.join("src.img").to_str().unwrap(), &uri);
        copy(&uri, dir.join("back.img").to_str().unwrap());
        let back = std::fs::read(dir.join("back.img")).unwrap();
        assert!(back[..src.len()] == src[..], "TLS round trip changed the data");
    }

    // A client that trusts another CA must refuse this server.
    let (ok, out) = nbdinfo(&format!("nbds://127.0.0.1:{port}/default?tls-certificates={}", other_ca.display()));
    assert!(!ok, "verification against the wrong CA passed: {out}");

    // Plaintext: refused with NBD_REP_ERR_TLS_REQD and our message.
    let (ok, out) = nbdinfo(&format!("nbd://127.0.0.1:{port}/default"));
    assert!(!ok, "{out}");
    let plain = Command::new("qemu-io")
        .args(["-f", "raw", &format!("nbd://127.0.0.1:{port}/default"), "-c", "read 0 4k"])
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&plain.stdout).to_string() + &String::from_utf8_lossy(&plain.stderr);
    assert!(!plain.status.success() && t.contains("requires TLS"), "{t}");
    let (ok, out) = nbd_load(port, &[]);
    assert!(!ok && out.contains("requires TLS"), "{out}");

    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sluice bench nbd-load` with these extra arguments against 127.0.0.1:port
/// for a moment over the first 4 MiB (unless `args` name a span);
/// (success, stdout + stderr).
fn nbd_load(port: u16, args: &[&str]) -> (bool, String) {
    let span: &[&str] = if args.contains(&"--span") { &[] } else { &["--span", "4m"] };
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "nbd-load", "--addr", &format!("127.0.0.1:{port}"), "--seconds", "0.3"])
        .args(span)
        .args(args)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

/// The benchmark client's writes land as 0xA5 bytes over plaintext and over
/// TLS (read back by qemu-io, which checks the pattern), its reads complete,
/// and it refuses a server whose certificate another CA signed.
#[test]
fn the_load_client_writes_and_reads_over_plaintext_and_tls() {
    need("openssl");
    need("qemu-io");
    let (dir, config) = small_config("tls-load");
    let (pki_dir, other_ca) = (dir.join("pki"), dir.join("other-ca"));
    pki(&pki_dir, true);
    pki(&other_ca, false);
    tls_mode(&config, &pki_dir, "allow");
    let (server, port) = start(&config);
    let ca = pki_dir.join("ca-cert.pem").display().to_string();

    let (ok, out) = nbd_load(port, &["--rw", "write", "--bs", "64k", "--span", "2m"]);
    assert!(ok && out.contains("write 64 KiB QD32:") && !out.contains("TLS"), "{out}");
    qemu_io(port, &["read -P 0xa5 0 2M", "read -P 0 2M 2M"]);
    qemu_io(port, &["write -P 0 0 2M"]);
    let (ok, out) = nbd_load(port, &["--rw", "write", "--tls-ca", &ca]);
    // The server's preference, AES-128-GCM, wins over the client's (rustls
    // lists AES-256-GCM first).
    assert!(ok && out.contains("write 128 KiB QD32 over TLS (TLS13_AES_128_GCM_SHA256):"), "{out}");
    qemu_io(port, &["read -P 0xa5 0 4M", "read -P 0 4M 4M"]);
    for args in [&["--rw", "read"][..], &["--rw", "read", "--iodepth", "3", "--bs", "4k", "--tls-ca", &ca]] {
        let (ok, out) = nbd_load(port, args);
        assert!(ok && out.contains("read "), "{args:?}: {out}");
    }
    let other = other_ca.join("ca-cert.pem").display().to_string();
    let (ok, out) = nbd_load(port, &["--rw", "read", "--tls-ca", &other]);
    assert!(!ok && out.contains("TLS"), "a server another CA signed was trusted: {out}");

    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client certificate for `name` (subject CN) issued by the CA in
/// `ca_dir`, in a new directory laid out as GnuTLS clients (qemu, libnbd)
/// look for it: ca-cert.pem (the server's CA, `trust`), client-cert.pem,
/// client-key.pem.
fn client_cert(dir: &Path, ca_dir: &Path, trust: &Path, name: &str) -> PathBuf {
    let out = dir.join(format!("client-{name}-{}", ca_dir.file_name().unwrap().to_string_lossy()));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::copy(trust.join("ca-cert.pem"), out.join("ca-cert.pem")).unwrap();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let subj = format!("/CN={name}");
    let mut req = vec!["req"];
    req.extend(ec);
    req.extend(["-keyout", "client-key.pem", "-out", "client.csr", "-subj", &subj]);
    openssl(&out, &req);
    std::fs::write(
        out.join("ext.cnf"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    let (ca_cert, ca_key) = (ca_dir.join("ca-cert.pem"), ca_dir.join("ca-key.pem"));
    let args = ["x509", "-req", "-in", "client.csr", "-CA", ca_cert.to_str().unwrap(), "-CAkey"];
    let rest =
        [ca_key.to_str().unwrap(), "-CAcreateserial", "-out", "client-cert.pem", "-days", "2", "-extfile", "ext.cnf"];
    openssl(&out, &[&args[..], &rest[..]].concat());
    out
}

/// `libnbd` as the client with `certs` on `export`: (success, output).
fn libnbd_tls(port: u16, certs: &Path, export: &str, body: &str) -> (bool, String) {
    let uri = format!("nbds://127.0.0.1:{port}/{export}?tls-certificates={}", certs.display());
    libnbd(&uri, "h.set_uri_allow_local_file(True)", body)
}

/// Mutual TLS with per-export allow-lists: alice (listed) reads and writes;
/// carol (read-only list) reads, is told the export is read-only and gets
/// EPERM for a write; mallory (certified by the same CA, not listed) is
/// refused with NBD_REP_ERR_POLICY and the refusal is logged; a client with
/// no certificate, or one from another CA, fails the TLS handshake. A
/// read-only export refuses even alice's writes.
#[test]
fn client_certificates_decide_who_may_use_which_export() {
    need("openssl");
    need("qemu-io");
    need("/usr/bin/python3");
    let (dir, config) = small_config("tls-mtls");
    let (pki_dir, other_ca) = (dir.join("pki"), dir.join("other-ca"));
    pki(&pki_dir, true);
    pki(&other_ca, false);
    let [alice, carol, mallory] = ["alice", "carol", "mallory"].map(|n| client_cert(&dir, &pki_dir, &pki_dir, n));
    let forged = client_cert(&dir, &other_ca, &pki_dir, "alice");
    let volumes = "allow = [\"alice\"]\nallow_read_only = [\"carol\"]\n\
                   [[volume]]\nname = \"archive\"\nsize = \"64m\"\nread_only = true\n";
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap() + volumes).unwrap();
    require_tls(&config, &pki_dir);
    let ca = format!("client_ca = {:?}\n", pki_dir.join("ca-cert.pem"));
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap() + &ca).unwrap();
    let (server, port) = start(&config);

    let (ok, out) = qemu_io_tls_on(port, &alice, "NORMAL", "default", &["write -P 0x61 0 1M", "read -P 0x61 0 1M"]);
    assert!(ok, "alice on default: {out}");
    let carol_reads = "check(h.is_read_only(), 'carol is not told the export is read-only')\n\
         check(h.pread(4096, 0) == b'\\x61' * 4096, 'carol reads what alice wrote')\n\
         h.set_strict_mode(0)\n\
         try:\n    h.pwrite(b'x' * 4096, 0)\n    check(False, 'carol wrote')\n\
         except nbd.Error as e:\n    check(e.errno in (errno.EPERM, 'EPERM'), 'errno %s' % e.errno)";
    let (ok, out) = libnbd_tls(port, &carol, "default", carol_reads);
    assert!(ok, "carol on default: {out}");
    let (ok, out) = libnbd_tls(port, &mallory, "default", "");
    assert!(!ok && out.contains("server policy prevents NBD_OPT_GO"), "mallory was served: {out}");
    let (ok, out) = libnbd_tls(port, &alice, "archive", carol_reads.replace("\\x61", "\\x00").as_str());
    assert!(ok, "alice on the read-only export: {out}");
    for (who, certs) in [("no certificate", &pki_dir), ("another CA's alice", &forged)] {
        let (ok, out) = libnbd_tls(port, certs, "default", "");
        assert!(!ok && out.contains("TLS fatal alert"), "{who} was served: {out}");
    }
    let (ok, out) = qemu_io_tls_on(port, &alice, "NORMAL", "default", &["read -P 0x61 0 1M"]);
    assert!(ok, "alice after carol's refused write: {out}");
    let log = stop(server);
    assert!(log.contains("client \"mallory\" may not use export \"default\": refused"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A started server requiring TLS with a fresh test PKI: (dir, config,
/// pki dir, server, port).
fn tls_server(name: &str) -> (PathBuf, PathBuf, PathBuf, common::Served, u16) {
    let (dir, config) = small_config(name);
    let pki_dir = dir.join("pki");
    pki(&pki_dir, true);
    require_tls(&config, &pki_dir);
    let (server, port) = start(&config);
    (dir, config, pki_dir, server, port)
}

/// qemu-io over a GnuTLS session limited to `priority`: (success, output).
fn qemu_io_tls(port: u16, certs: &Path, priority: &str, cmds: &[&str]) -> (bool, String) {
    qemu_io_tls_on(port, certs, priority, "default", cmds)
}

fn qemu_io_tls_on(port: u16, certs: &Path, priority: &str, export: &str, cmds: &[&str]) -> (bool, String) {
    let creds = format!("tls-creds-x509,id=tls0,dir={},endpoint=client,priority={priority}", certs.display());
    let image = format!("driver=nbd,host=127.0.0.1,port={port},export={export},tls-creds=tls0");
    let mut c = Command::new("qemu-io");
    c.args(["--object", &creds, "--image-opts", &image]);
    for x in cmds {
        c.args(["-c", x]);
    }
    let out = c.output().expect("qemu-io");
    let t = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success() && !t.contains("Pattern verification failed"), t)
}

/// A GnuTLS client that may only speak TLS 1.2 (qemu's `priority`, as
/// upstream nbd-client defaults to): served by default, with data crossing
/// in many records both ways and over both AES-GCM key sizes; refused when
/// `min_version = "1.3"`.
#[test]
fn tls_1_2_clients_are_served_unless_the_minimum_is_1_3() {
    need("openssl");
    need("qemu-io");
    let (dir, config, pki_dir, server, port) = tls_server("tls12");
    let tls12 = "NORMAL:-VERS-ALL:+VERS-TLS1.2";
    for (suite, pattern) in [("", 0x41), (":-AES-128-GCM", 0x42)] {
        let priority = format!("{tls12}{suite}");
        let (ok, out) = qemu_io_tls(port, &pki_dir, &priority, &["write -P 0x12 0 3M", "write -P 0x34 5M 4k"]);
        assert!(ok, "TLS 1.2 ({priority}) write: {out}");
        let (ok, out) = qemu_io_tls(port, &pki_dir, &priority, &["read -P 0x12 0 3M", "read -P 0x34 5M 4k"]);
        assert!(ok, "TLS 1.2 ({priority}) read: {out}");
        let (ok, out) = qemu_io_tls(port, &pki_dir, &priority, &[&format!("write -P {pattern} 8M 1M"), "flush"]);
        assert!(ok, "TLS 1.2 ({priority}) flush: {out}");
    }
    // Both patterns landed: each suite's session wrote what it meant to.
    let (ok, out) = qemu_io_tls(port, &pki_dir, "NORMAL", &["read -P 0x42 8M 1M"]);
    assert!(ok, "TLS 1.3 read back: {out}");
    stop(server);

    let text = std::fs::read_to_string(&config).unwrap() + "min_version = \"1.3\"\n";
    std::fs::write(&config, text).unwrap();
    let (server, port) = start(&config);
    let (ok, out) = qemu_io_tls(port, &pki_dir, tls12, &["read 0 4k"]);
    assert!(!ok, "a TLS 1.2 client was served with min_version 1.3: {out}");
    let (ok, out) = qemu_io_tls(port, &pki_dir, "NORMAL", &["read -P 0x12 0 3M"]);
    assert!(ok, "TLS 1.3 with min_version 1.3: {out}");
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tls_config_errors_are_clear_and_open_nothing() {
    let (dir, config) = small_config("tlsbad");
    let base = std::fs::read_to_string(&config).unwrap();
    for (tls, want) in [
        ("[tls]\nmode = \"require\"\n", "needs cert and key"),
        ("[tls]\nmode = \"sometimes\"\ncert = \"c\"\nkey = \"k\"\n", "expected"),
        ("[tls]\nmode = \"allow\"\ncert = \"missing.pem\"\nkey = \"missing.pem\"\n", "missing.pem"),
        ("[tls]\nmode = \"allow\"\ncert = \"c\"\nkey = \"k\"\nmin_version = \"1.1\"\n", "tls.min_version"),
        (
            "allow = [\"alice\"]\n[tls]\nmode = \"allow\"\ncert = \"c\"\nkey = \"k\"\n",
            "need [tls] mode = \"require\" and client_ca",
        ),
    ] {
        std::fs::write(&config, format!("{base}{tls}")).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_sluice")).args(["serve", "--config"]).arg(&config).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{tls:?}: {err}");
    }
    // Nothing was created: the TLS section is checked before the devices.
    assert!(!dir.join("data").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Connects, sends STARTTLS and reads its ACK: the socket, and a rustls
/// TLS 1.3 client (trusting `pki_dir`'s CA) that has not started.
fn starttls(port: u16, pki_dir: &Path) -> (TcpStream, rustls::ClientConnection) {
    let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let mut greeting = [0u8; proto::GREETING_BYTES];
    sock.read_exact(&mut greeting).unwrap();
    sock.write_all(&(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes()).unwrap();
    sock.write_all(&ClientOption::StartTls.encode()).unwrap();
    let mut h = [0u8; proto::OPTION_REPLY_HEADER_BYTES];
    sock.read_exact(&mut h).unwrap();
    assert_eq!(OptionReply::decode_header(&h).unwrap().1, proto::REP_ACK);

    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(pki_dir.join("ca-cert.pem")).unwrap()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").unwrap();
    (sock, rustls::ClientConnection::new(Arc::new(cfg), name).unwrap())
}

/// A client that rekeys mid-session (TLS 1.3 KeyUpdate asking for one
/// back, as rustls's `refresh_traffic_keys` sends; also twice in a row):
/// the server opens what follows with the client's next key and answers
/// under its own next key, so writes and reads go on byte-exact.
#[test]
fn a_client_key_update_mid_transfer_is_followed_both_ways() {
    use sluice_frontend::proto::{Command, RequestHeader};
    need("openssl");
    let (dir, _, pki_dir, server, port) = tls_server("tls-keyupdate");
    let (sock, tls) = starttls(port, &pki_dir);
    let mut s = rustls::StreamOwned::new(tls, sock);
    let go = ClientOption::Info { go: true, name: "default".into(), requests: vec![proto::INFO_BLOCK_SIZE] };
    s.write_all(&go.encode()).unwrap();
    loop {
        let mut h = [0u8; proto::OPTION_REPLY_HEADER_BYTES];
        s.read_exact(&mut h).unwrap();
        let (_, reply_type, len) = OptionReply::decode_header(&h).unwrap();
        s.read_exact(&mut vec![0u8; len as usize]).unwrap();
        if reply_type == proto::REP_ACK {
            break;
        }
        assert_eq!(reply_type, proto::REP_INFO);
    }
    let mut cookie = 0u64;
    let mut request = |s: &mut rustls::StreamOwned<_, _>, command: Command, offset: u64, data: &[u8], len: usize| {
        cookie += 1;
        let header = RequestHeader { flags: 0, command: command as u16, cookie, offset, len: len as u32 };
        s.write_all(&[&header.encode()[..], data].concat()).unwrap();
        let mut reply = vec![0u8; proto::SIMPLE_REPLY_BYTES];
        s.read_exact(&mut reply).unwrap();
        let r = proto::SimpleReply::decode(&reply).unwrap();
        assert_eq!((r.error, r.cookie), (0, cookie), "{command:?} at {offset}");
        let mut back = vec![0u8; if command == Command::Read { len } else { 0 }];
        s.read_exact(&mut back).unwrap();
        back
    };
    let a: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
    let b: Vec<u8> = (0..256u32 << 10).map(|i| (i * 13 + 5) as u8).collect();
    request(&mut s, Command::Write, 0, &a, a.len());
    s.conn.refresh_traffic_keys().unwrap();
    request(&mut s, Command::Write, 1 << 20, &b, b.len());
    assert!(request(&mut s, Command::Read, 0, &[], a.len()) == a, "data read back after one key update");
    for _ in 0..2 {
        s.conn.refresh_traffic_keys().unwrap();
        assert!(request(&mut s, Command::Read, 1 << 20, &[], b.len()) == b, "data after repeated key updates");
    }
    request(&mut s, Command::Flush, 0, &[], 0);
    drop(s);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client whose TLS Finished and first NBD option leave in one TCP write
/// (rustls's client does that when both are queued): the server must find
/// the option in the bytes that arrived with the handshake's last record.
/// Before the fix the connection's reader started with an empty buffer and
/// the session hung until the handshake timeout — 1 in 8 nbdinfo runs.
#[test]
fn an_option_sent_with_the_tls_finished_is_answered() {
    need("openssl");
    let (dir, _, pki_dir, server, port) = tls_server("tls-finished");

    let (mut sock, mut tls) = starttls(port, &pki_dir);
    // Handshake until the client has queued its Finished, but not sent it.
    while tls.is_handshaking() {
        if tls.wants_write() {
            tls.write_tls(&mut sock).unwrap();
        } else {
            tls.read_tls(&mut sock).unwrap();
            tls.process_new_packets().unwrap();
        }
    }
    let go = ClientOption::Info { go: true, name: "default".into(), requests: vec![] };
    tls.writer().write_all(&go.encode()).unwrap();
    let mut wire = Vec::new();
    while tls.wants_write() {
        tls.write_tls(&mut wire).unwrap();
    }
    sock.write_all(&wire).unwrap(); // Finished and the option, one write

    // Replies to GO: INFO(s), then ACK.
    let mut plain = Vec::new();
    let mut acked = false;
    while !acked {
        let n = tls.read_tls(&mut sock).expect("the server answers the option");
        assert!(n > 0, "the server closed the connection");
        tls.process_new_packets().unwrap();
        let mut buf = [0u8; 4096];
        while let Ok(k) = tls.reader().read(&mut buf) {
            if k == 0 {
                break;
            }
            plain.extend_from_slice(&buf[..k]);
        }
        while plain.len() >= proto::OPTION_REPLY_HEADER_BYTES {
            let (_, reply_type, len) = OptionReply::decode_header(&plain[..proto::OPTION_REPLY_HEADER_BYTES]).unwrap();
            let total = proto::OPTION_REPLY_HEADER_BYTES + len as usize;
            if plain.len() < total {
                break;
            }
            plain.drain(..total);
            assert!(reply_type == proto::REP_INFO || reply_type == proto::REP_ACK, "reply {reply_type:#x}");
            acked |= reply_type == proto::REP_ACK;
        }
    }
    drop(sock);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
