//! A connection's plain socket, TCP or Unix, shared by every clone of the
//! connection's stream (reader, reply writer, the server's handle for
//! shutdown): one descriptor per connection.
//!
//! Why a module of its own: a TLS stream reads and writes records over a
//! plain socket, and a connection's `Stream` is either a plain socket or a
//! TLS stream; with the socket here, `stream` uses `tls` and both use this,
//! and neither imports the other's importer.
//!
//! Invariants: a `Socket` never wraps another stream (TLS sits above it,
//! never below); cloning shares the descriptor, so blocking mode and
//! timeouts are common to all clones, as with `dup`.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

/// A connected TCP or Unix socket.
#[derive(Clone, Debug)]
pub enum Socket {
    Tcp(Arc<TcpStream>),
    Unix(Arc<UnixStream>),
}

impl Socket {
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.shutdown(how),
            Socket::Unix(s) => s.shutdown(how),
        }
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_read_timeout(t),
            Socket::Unix(s) => s.set_read_timeout(t),
        }
    }

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_nonblocking(on),
            Socket::Unix(s) => s.set_nonblocking(on),
        }
    }

    /// Bytes the kernel holds for this socket, not yet read (`FIONREAD`).
    pub(crate) fn bytes_waiting(&self) -> usize {
        rustix::io::ioctl_fionread(self).map(|n| n as usize).unwrap_or(0)
    }

    /// Whether a read would not block now (bytes, end of stream or error).
    pub(crate) fn readable_now(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(self, rustix::event::PollFlags::IN)];
        rustix::event::poll(&mut fds, Some(&rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 })).unwrap_or(0) != 0
    }

    /// Reads what is waiting without blocking: one non-blocking `recv`;
    /// `None` if nothing is.
    pub(crate) fn read_ready(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            match rustix::net::recv(self, &mut *buf, rustix::net::RecvFlags::DONTWAIT) {
                Ok((n, _)) => return Ok(Some(n)),
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// A human-readable peer name for logs.
    pub fn peer(&self) -> String {
        match self {
            Socket::Tcp(s) => s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "tcp:?".into()),
            Socket::Unix(_) => "unix".into(),
        }
    }
}

impl AsFd for Socket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Socket::Tcp(s) => s.as_fd(),
            Socket::Unix(s) => s.as_fd(),
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => (&**s).read(buf),
            Socket::Unix(s) => (&**s).read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => (&**s).write(buf),
            Socket::Unix(s) => (&**s).write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => (&**s).write_vectored(bufs),
            Socket::Unix(s) => (&**s).write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
