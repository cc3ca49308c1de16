//! Helpers shared by the tests that run `sluice serve` as a real process.
#![allow(dead_code)] // each test file uses its own subset

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

pub fn need(bin: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {bin}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success());
    assert!(
        ok.unwrap_or(false),
        "{bin} is not installed: run scripts/setup.sh (it installs the NBD clients and openssl)"
    );
}

/// A running `sluice serve`, killed if dropped while still held (a failing
/// test must not leave a server behind); `stop` ends it cleanly instead.
pub struct Served(Option<Child>);

impl Served {
    /// The process, for tests that end it themselves.
    pub fn into_child(mut self) -> Child {
        self.0.take().expect("held")
    }
}

impl std::ops::Deref for Served {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0.as_ref().expect("held")
    }
}

impl std::ops::DerefMut for Served {
    fn deref_mut(&mut self) -> &mut Child {
        self.0.as_mut().expect("held")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Start the server; returns it and its TCP port (read from its first line).
pub fn start(config: &Path) -> (Served, u16) {
    let (child, port, _) = start_with_metrics(config);
    (child, port)
}

/// `sluice serve --config CONFIG` with its output piped, not yet started.
pub fn serve_command(config: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.args(["serve", "--config"]).arg(config).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Start the server; also returns the metrics address (its second line).
pub fn start_with_metrics(config: &Path) -> (Served, u16, String) {
    start_command(serve_command(config))
}

/// Start `cmd` (a `serve_command`, perhaps with more flags or environment):
/// the server, its TCP port and its metrics address.
pub fn start_command(mut cmd: Command) -> (Served, u16, String) {
    let child = cmd.spawn().expect("spawn sluice serve");
    // Held from here, so a panic below does not leave it running.
    let mut served = Served(Some(child));
    let mut out = BufReader::new(served.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("first line");
    let port = line.trim().rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| {
        // It did not start: say why.
        use std::io::Read;
        let mut err = String::new();
        let _ = served.stderr.take().expect("stderr").read_to_string(&mut err);
        panic!("no port in {line:?}; the server said: {err}")
    });
    // Further listeners (a Unix socket) come before the metrics line.
    let mut metrics = String::new();
    while metrics.is_empty() || metrics.starts_with("sluice: serving ") {
        metrics.clear();
        out.read_line(&mut metrics).expect("the metrics line");
    }
    let metrics = metrics
        .trim()
        .strip_prefix("sluice: metrics on http://")
        .and_then(|m| m.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address in {metrics:?}"))
        .to_string();
    (served, port, metrics)
}

/// Stop the server with SIGTERM; it must shut down cleanly. Returns its log.
pub fn stop(served: Served) -> String {
    let child = served.into_child();
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().expect("wait");
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "server exit: {:?} {log}", out.status);
    assert!(log.contains("clean shutdown"), "{log}");
    log
}

pub fn qemu_io(port: u16, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw", &format!("nbd://127.0.0.1:{port}/default")]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let out = c.output().expect("qemu-io");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !text.contains("Pattern verification failed"), "qemu-io {cmds:?}: {text}");
    text
}

/// Runs a Python script with python3-libnbd: `h` is a handle that runs
/// `setup` (e.g. `h.set_request_block_size(False)`), then connects to
/// `uri`; `body` follows, with `check(cond, what)` and `errno` at hand, then
/// a clean shutdown. Returns (whether it printed nothing but OK, its output).
pub fn libnbd(uri: &str, setup: &str, body: &str) -> (bool, String) {
    need("/usr/bin/python3");
    let script = format!(
        "import errno, sys, nbd\n\
         def check(cond, what):\n    if not cond: sys.exit('FAILED: ' + what)\n\
         h = nbd.NBD()\n{setup}\nh.connect_uri({uri:?})\n{body}\nh.shutdown()\nprint('OK')\n"
    );
    let out = Command::new("/usr/bin/python3").args(["-c", &script]).output().expect("python3");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success() && text.trim() == "OK", text)
}

/// `libnbd` on the default export WITHOUT block-size negotiation, so any
/// byte offset is allowed; it must succeed.
pub fn libnbd_byte_granular(port: u16, body: &str) {
    let (ok, text) = libnbd(&format!("nbd://127.0.0.1:{port}/default"), "h.set_request_block_size(False)", body);
    assert!(ok, "libnbd {body:?}: {text}");
}

/// A fresh directory with a small file-backed config; returns (dir, config).
pub fn small_config(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    device_config(name, "size = \"64m\"", "size = \"1g\"")
}

/// `small_config` with every write through the log (`[engine]
/// direct_write = "0"`): for tests of the log itself, whose large writes
/// would otherwise go to the capacity device directly.
#[allow(dead_code)]
pub fn small_config_logged(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let (dir, config) = small_config(name);
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("[engine]\n", "[engine]\ndirect_write = \"0\"\n")).unwrap();
    (dir, config)
}

/// A small config whose `[cache]` and `[capacity]` tables have these bodies.
pub fn device_config(name: &str, cache: &str, capacity: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    config_of(
        name,
        &format!(
            "[cache]\n{cache}\n[capacity]\n{capacity}\n\
             [engine]\nchunk_size = \"4m\"\nband_size = \"32m\"\n\
             [[volume]]\nname = \"default\"\nsize = \"256m\"\n"
        ),
    )
}

/// A fresh directory with a config: a data directory in it, a TCP port and
/// a metrics port picked by the system, no Unix socket, then `tables`.
/// Returns (dir, config).
pub fn config_of(name: &str, tables: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("sluice-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("sluice.toml");
    let head = format!(
        "data_dir = {:?}\nlisten = [\"127.0.0.1:0\"]\nunix_socket = \"\"\nmetrics_listen = \"127.0.0.1:0\"\n",
        dir.join("data")
    );
    std::fs::write(&config, head + tables).unwrap();
    (dir, config)
}

/// A config in `dir` attaching a cache of `cache_size` (a file in `dir`)
/// to the disk image `image`, served whole as volume "default" (in place,
/// `[engine] attach`). Returns the config's path.
pub fn attached_config(dir: &Path, image: &Path, cache_size: &str) -> std::path::PathBuf {
    let config = dir.join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nlisten = [\"127.0.0.1:0\"]\nunix_socket = \"\"\nmetrics_listen = \"127.0.0.1:0\"\n\
             [cache]\nkind = \"file\"\npath = {:?}\nsize = {cache_size:?}\n\
             [capacity]\nkind = \"file\"\npath = {:?}\nsize = \"\"\n\
             [engine]\nlayout = \"in-place\"\nattach = true\nchunk_size = \"1m\"\n\
             [[volume]]\nname = \"default\"\nsize = \"disk\"\n",
            dir.join("data"),
            dir.join("cache.img"),
            image
        ),
    )
    .unwrap();
    config
}

/// The server's log (stderr), line by line: a test waits for the line an
/// action logs before the next one (signals sent before the last was taken
/// would merge into one).
pub struct Log {
    lines: std::sync::mpsc::Receiver<String>,
    reader: Option<std::thread::JoinHandle<()>>,
    pub said: Vec<String>,
}

impl Log {
    pub fn take(server: &mut Served) -> Log {
        let (tx, lines) = std::sync::mpsc::channel::<String>();
        let err = server.stderr.take().expect("stderr piped");
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Log { lines, reader: Some(reader), said: Vec::new() }
    }

    /// The next line containing `what` (30 s at most).
    pub fn wait_for(&mut self, what: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line =
                self.lines.recv_timeout(left).unwrap_or_else(|_| panic!("no {what:?} in the log: {:?}", self.said));
            self.said.push(line.clone());
            if line.contains(what) {
                return line;
            }
        }
    }

    /// Wait for the server's output to end.
    pub fn join(mut self) {
        if let Some(r) = self.reader.take() {
            r.join().expect("log reader");
        }
    }
}
