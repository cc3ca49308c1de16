//! `sluice serve` with `[tls] mode = "require"`: real clients (nbdinfo via
//! libnbd/GnuTLS, qemu-io) connect over TLS and verify the server's
//! certificate against a CA; a client trusting another CA is refused; a
//! plaintext client is refused with the spec's TLS-required answer.

mod common;

use common::{need, small_config, start, stop};
use std::path::Path;
use std::process::Command;

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

#[test]
fn tls_required_serves_verified_clients_and_refuses_plaintext() {
    need("openssl");
    need("nbdinfo");
    need("qemu-io");
    let (dir, config) = small_config("tls");
    let (pki_dir, other_ca) = (dir.join("pki"), dir.join("other-ca"));
    pki(&pki_dir, true);
    pki(&other_ca, false);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text += &format!(
        "[tls]\nmode = \"require\"\ncert = {:?}\nkey = {:?}\n",
        pki_dir.join("server-cert.pem"),
        pki_dir.join("server-key.pem")
    );
    std::fs::write(&config, text).unwrap();
    let (server, port) = start(&config);

    let certs = pki_dir.display();
    let (ok, out) = nbdinfo(&format!("nbds://127.0.0.1:{port}/default?tls-certificates={certs}"));
    assert!(ok && out.contains("with TLS") && out.contains("export-size: 268435456"), "{out}");

    let creds = format!("tls-creds-x509,id=tls0,dir={certs},endpoint=client");
    let image = format!("driver=nbd,host=127.0.0.1,port={port},export=default,tls-creds=tls0");
    let io = |cmds: &[&str]| {
        let mut c = Command::new("qemu-io");
        c.args(["--object", &creds, "--image-opts", &image]);
        cmds.iter().for_each(|x| {
            c.args(["-c", x]);
        });
        let out = c.output().expect("qemu-io");
        let t = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && !t.contains("Pattern verification failed"), "qemu-io {cmds:?}: {t}");
    };
    io(&["write -P 0x3c 0 4M", "write -P 0x3d 8M 128k", "flush"]);
    io(&["read -P 0x3c 0 4M", "read -P 0x3d 8M 128k", "read -P 0 4M 4M"]);

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
