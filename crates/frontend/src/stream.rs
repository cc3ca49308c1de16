//! Transports the server listens on: TCP or a Unix socket path, behind one
//! `Listener` / `Stream` pair so the protocol code is transport-agnostic.
//!
//! Invariants: every accepted TCP stream has `TCP_NODELAY` set (NBD is
//! request/response traffic; without it Nagle's algorithm collapses
//! throughput). A `Stream` can be cloned into independent read and write
//! halves and shut down from another thread, which is how the server stops a
//! connection blocked in `read`.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use crate::socket::Socket;
use crate::tls::TlsStream;

/// Where a listener is bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "nbd://{a}"),
            ListenAddr::Unix(p) => write!(f, "nbd+unix:///?socket={}", p.display()),
        }
    }
}

/// A bound listening socket.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Binds a TCP listener (`"127.0.0.1:0"` picks a free port).
    pub fn bind_tcp(addr: impl std::net::ToSocketAddrs) -> io::Result<Self> {
        TcpListener::bind(addr).map(Listener::Tcp)
    }

    /// Binds a Unix socket at `path`, replacing a stale socket file there.
    pub fn bind_unix(path: impl Into<PathBuf>) -> io::Result<Self> {
        let path = path.into();
        match std::fs::symlink_metadata(&path) {
            Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => std::fs::remove_file(&path)?,
            _ => {}
        }
        UnixListener::bind(&path).map(|l| Listener::Unix(l, path))
    }

    pub fn local_addr(&self) -> io::Result<ListenAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr().map(ListenAddr::Tcp),
            Listener::Unix(_, p) => Ok(ListenAddr::Unix(p.clone())),
        }
    }

    /// Accepts one connection (TCP ones get `TCP_NODELAY`).
    pub fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                Ok(Stream::Plain(Socket::Tcp(Arc::new(s))))
            }
            Listener::Unix(l, _) => l.accept().map(|(s, _)| Stream::Plain(Socket::Unix(Arc::new(s)))),
        }
    }

    /// Waits up to `timeout` for a connection to be ready to accept.
    pub fn poll_readable(&self, timeout: Duration) -> io::Result<bool> {
        let fd = match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l, _) => l.as_fd(),
        };
        let mut fds = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
        let timeout = rustix::event::Timespec::try_from(timeout)
            .unwrap_or(rustix::event::Timespec { tv_sec: i64::MAX, tv_nsec: 0 });
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(n) => Ok(n > 0),
            Err(rustix::io::Errno::INTR) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.set_nonblocking(on),
            Listener::Unix(l, _) => l.set_nonblocking(on),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl From<TcpListener> for Listener {
    fn from(l: TcpListener) -> Self {
        Listener::Tcp(l)
    }
}

/// One connected client: plain, or TLS after `NBD_OPT_STARTTLS`.
///
/// The socket is shared, not duplicated: every clone of a connection's
/// stream (reader, reply writer, the server's handle for shutdown) uses the
/// one descriptor, so a connection costs one file descriptor and 10,000
/// connections fit the usual 20,000-descriptor limit. (A `dup` would share
/// the same open file description anyway: blocking mode and timeouts were
/// always common to all clones.)
#[derive(Debug)]
pub enum Stream {
    Plain(Socket),
    Tls(TlsStream),
}

impl Stream {
    /// The socket under the stream (a TLS stream's, for its timeouts,
    /// shutdown and peer name).
    pub fn socket(&self) -> &Socket {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.raw(),
        }
    }

    pub fn try_clone(&self) -> io::Result<Stream> {
        match self {
            Stream::Plain(s) => Ok(Stream::Plain(s.clone())),
            Stream::Tls(s) => s.try_clone().map(Stream::Tls),
        }
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.socket().shutdown(how)
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.socket().set_read_timeout(t)
    }

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.socket().set_nonblocking(on)
    }

    /// Whether bytes (or end of stream) are waiting on the socket now.
    /// Bytes the kernel holds for this socket, not yet read (for TLS,
    /// ciphertext), or whether a TLS stream holds plaintext.
    fn bytes_waiting(&self) -> usize {
        if let Stream::Tls(t) = self {
            if t.has_buffered() {
                return 1;
            }
        }
        self.socket().bytes_waiting()
    }

    fn readable_now(&self) -> bool {
        self.socket().readable_now()
    }

    /// Reads what is waiting without blocking: `None` if nothing is (a TLS
    /// stream that holds the start of a record waits for its rest). One
    /// system call on a plain socket (a non-blocking `recv`); a TLS stream
    /// answers from records already buffered, else does the same `recv`
    /// (`TlsStream::read_ready`).
    pub(crate) fn read_ready(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match self {
            Stream::Plain(s) => s.read_ready(buf),
            Stream::Tls(t) => t.read_ready(buf),
        }
    }

    /// A human-readable peer name for logs.
    pub fn peer(&self) -> String {
        match self {
            Stream::Plain(s) => s.peer(),
            Stream::Tls(s) => format!("tls:{}", s.raw().peer()),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write_vectored(bufs),
            Stream::Tls(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// A buffered reader over a connection's [`Stream`] that holds its buffer
/// only while bytes are flowing.
///
/// `std::io::BufReader` keeps (and, through the default `read_buf`, zeroes)
/// its whole buffer for the connection's life: 64 KiB of resident memory per
/// idle connection. This one drops its buffer when it is drained and the
/// socket has nothing waiting, so an idle connection holds none; a busy one
/// reads many requests per system call as before.
pub struct ConnReader {
    inner: Stream,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    capacity: usize,
}

impl ConnReader {
    pub fn new(inner: Stream, capacity: usize) -> ConnReader {
        ConnReader { inner, buf: Vec::new(), pos: 0, end: 0, capacity: capacity.max(1) }
    }

    /// Bytes read from the socket and not yet consumed.
    pub fn buffer(&self) -> &[u8] {
        &self.buf[self.pos..self.end]
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Marks `n` buffered bytes as read (at most `buffer().len()`).
    pub fn consume(&mut self, n: usize) {
        self.pos += n.min(self.end - self.pos);
    }

    /// Bytes of buffer held now (0 while idle).
    pub fn held_bytes(&self) -> usize {
        self.buf.len()
    }

    /// While the server stops: after the end of stream its shutdown caused
    /// (the read side shut, nothing buffered then), whether the client
    /// sends more within `quiet` — a request it sent as the stop began,
    /// which is to be answered too. Polls every 2 ms.
    pub fn sends_more_within(&self, quiet: std::time::Duration) -> bool {
        let t = std::time::Instant::now();
        loop {
            // The deadline first: a TLS stream past its close_notify may
            // keep bytes buffered that no read returns.
            if t.elapsed() >= quiet {
                return false;
            }
            if self.pos < self.end || self.inner.bytes_waiting() > 0 {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

impl Read for ConnReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.end {
            self.pos = 0;
            self.end = 0;
            // A TLS stream buffers records itself: copying its plaintext
            // through this buffer too would only add a copy.
            if out.len() >= self.capacity || (matches!(self.inner, Stream::Tls(_)) && out.len() >= TLS_DIRECT_BYTES) {
                return self.inner.read(out);
            }
            // While bytes flow the buffer is kept and one non-blocking read
            // refills it; a drained socket sends us to the idle path below.
            let ready = if !self.buf.is_empty() {
                self.inner.read_ready(&mut self.buf)?
            } else if self.inner.readable_now() {
                self.buf = vec![0u8; self.capacity.max(IDLE_READ_BYTES)];
                Some(self.inner.read(&mut self.buf)?)
            } else {
                None
            };
            match ready {
                Some(n) => self.end = n,
                None => {
                    // About to block: wait holding no buffer, and take the
                    // first bytes that arrive through a small one on the stack.
                    self.buf = Vec::new();
                    let mut first = [0u8; IDLE_READ_BYTES];
                    let n = self.inner.read(&mut first)?;
                    let given = n.min(out.len());
                    out[..given].copy_from_slice(&first[..given]);
                    if n > given {
                        self.buf = vec![0u8; self.capacity.max(IDLE_READ_BYTES)];
                        self.buf[..n - given].copy_from_slice(&first[given..n]);
                        self.end = n - given;
                    }
                    return Ok(given);
                }
            }
        }
        let n = out.len().min(self.end - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Reads of at least this much go straight to a TLS stream (a write's
/// payload), smaller ones (request headers) through the buffer.
const TLS_DIRECT_BYTES: usize = 4096;

/// The first read after a connection went idle (a request header and the
/// start of its payload fit).
const IDLE_READ_BYTES: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// A reader that gets bytes in bursts holds a buffer only mid-burst and
    /// returns exactly the bytes sent, in order.
    #[test]
    fn conn_reader_returns_every_byte_and_drops_its_buffer_when_idle() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut r = ConnReader::new(Stream::Plain(Socket::Unix(Arc::new(a))), 4096);
        let mut w = b;
        let msg: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
        w.write_all(&msg).unwrap();
        let mut got = vec![0u8; msg.len()];
        // Small reads go through the buffer; it is held while bytes wait.
        r.read_exact(&mut got[..28]).unwrap();
        assert!(r.held_bytes() > 0);
        r.read_exact(&mut got[28..]).unwrap();
        assert_eq!(got, msg);
        // Drained, nothing waiting: the next read blocks holding no buffer.
        let t = std::thread::spawn(move || {
            let mut h = [0u8; 28];
            r.read_exact(&mut h).unwrap();
            (h, r.held_bytes())
        });
        std::thread::sleep(Duration::from_millis(50));
        w.write_all(&[9u8; 28]).unwrap();
        let (h, held) = t.join().unwrap();
        assert_eq!(h, [9u8; 28]);
        assert_eq!(held, 0);
    }

    /// A non-blocking read says "nothing yet" on an empty socket, returns
    /// what waits on a busy one, and 0 at end of stream, on plain sockets.
    #[test]
    fn read_ready_never_blocks() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut s = Stream::Plain(Socket::Unix(Arc::new(a)));
        let mut buf = [0u8; 64];
        assert_eq!(s.read_ready(&mut buf).unwrap(), None);
        b.write_all(b"hello").unwrap();
        assert_eq!(s.read_ready(&mut buf).unwrap(), Some(5));
        assert_eq!(&buf[..5], b"hello");
        assert_eq!(s.read_ready(&mut buf).unwrap(), None);
        drop(b);
        assert_eq!(s.read_ready(&mut buf).unwrap(), Some(0));
    }
}
