//! Transports the server listens on: TCP or a Unix socket path, behind one
//! `Listener` / `Stream` pair so the protocol code is transport-agnostic.
//!
//! Invariants: every accepted TCP stream has `TCP_NODELAY` set (NBD is
//! request/response traffic; without it Nagle's algorithm collapses
//! throughput). A `Stream` can be cloned into independent read and write
//! halves and shut down from another thread, which is how the server stops a
//! connection blocked in `read`.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
                Ok(Stream::Tcp(Arc::new(s)))
            }
            Listener::Unix(l, _) => l.accept().map(|(s, _)| Stream::Unix(Arc::new(s))),
        }
    }

    /// Waits up to `timeout` for a connection to be ready to accept.
    pub fn poll_readable(&self, timeout: Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd { fd: self.raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `pfd` is a valid pollfd for the duration of the call and
        // the count passed is 1.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        match rc {
            -1 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
            0 => Ok(false),
            _ => Ok(true),
        }
    }

    fn raw_fd(&self) -> RawFd {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l, _) => l.as_raw_fd(),
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
    Tcp(Arc<TcpStream>),
    Unix(Arc<UnixStream>),
    Tls(TlsStream),
}

impl Stream {
    pub fn try_clone(&self) -> io::Result<Stream> {
        match self {
            Stream::Tcp(s) => Ok(Stream::Tcp(s.clone())),
            Stream::Unix(s) => Ok(Stream::Unix(s.clone())),
            Stream::Tls(s) => s.try_clone().map(Stream::Tls),
        }
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tls(s) => s.raw().shutdown(how),
        }
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tls(s) => s.raw().set_read_timeout(t),
        }
    }

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(on),
            Stream::Unix(s) => s.set_nonblocking(on),
            Stream::Tls(s) => s.raw().set_nonblocking(on),
        }
    }

    /// The socket's descriptor (a TLS stream's underlying socket).
    fn raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tls(s) => s.raw().raw_fd(),
        }
    }

    /// Whether bytes (or end of stream) are waiting on the socket now.
    /// Bytes the kernel holds for this socket, not yet read (`FIONREAD`;
    /// for TLS, ciphertext), or whether a TLS stream holds plaintext.
    fn bytes_waiting(&self) -> usize {
        if let Stream::Tls(t) = self {
            if t.has_buffered() {
                return 1;
            }
        }
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int for a valid socket descriptor.
        match unsafe { libc::ioctl(self.raw_fd(), libc::FIONREAD, &mut n) } {
            0 => n.max(0) as usize,
            _ => 0,
        }
    }

    fn readable_now(&self) -> bool {
        let mut pfd = libc::pollfd { fd: self.raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, zero timeout.
        unsafe { libc::poll(&mut pfd, 1, 0) != 0 }
    }

    /// Reads what is waiting without blocking: `None` if nothing is (a TLS
    /// stream that holds the start of a record waits for its rest). One
    /// system call on a plain socket (a non-blocking `recv`); a TLS stream
    /// answers from records already buffered, else does the same `recv`
    /// (`TlsStream::read_ready`).
    pub(crate) fn read_ready(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        if let Stream::Tls(t) = self {
            return t.read_ready(buf);
        }
        loop {
            // SAFETY: `buf` is writable for `buf.len()` bytes during the call.
            let rc = unsafe { libc::recv(self.raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if rc >= 0 {
                return Ok(Some(rc as usize));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(None),
                _ => return Err(e),
            }
        }
    }

    /// A human-readable peer name for logs.
    pub fn peer(&self) -> String {
        match self {
            Stream::Tcp(s) => s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "tcp:?".into()),
            Stream::Unix(_) => "unix".into(),
            Stream::Tls(s) => format!("tls:{}", s.raw().peer()),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&**s).read(buf),
            Stream::Unix(s) => (&**s).read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&**s).write(buf),
            Stream::Unix(s) => (&**s).write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&**s).write_vectored(bufs),
            Stream::Unix(s) => (&**s).write_vectored(bufs),
            Stream::Tls(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => (&**s).flush(),
            Stream::Unix(s) => (&**s).flush(),
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

    /// A reader that gets bytes in bursts holds a buffer only mid-burst and
    /// returns exactly the bytes sent, in order.
    #[test]
    fn conn_reader_returns_every_byte_and_drops_its_buffer_when_idle() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut r = ConnReader::new(Stream::Unix(Arc::new(a)), 4096);
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
        let mut s = Stream::Unix(Arc::new(a));
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
