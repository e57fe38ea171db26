//! Opening a connection: the socket (Unix or TCP, with a deadline), then
//! the handshake under read and write timeouts, so a server that accepts
//! and then says nothing cannot hold the caller forever.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use thiserror::Error;

use super::negotiate::{negotiate, ClientConfig, ExportInfo, NegotiateError};
use super::uri::{NbdAddr, NbdUri};

/// A connected socket.
#[derive(Debug)]
pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

#[derive(Debug, Error)]
pub enum ConnectError {
    #[error("cannot connect to {addr}")]
    Connect {
        addr: String,
        #[source]
        source: io::Error,
    },
    #[error("NBD handshake with {uri}")]
    Handshake {
        uri: String,
        #[source]
        source: NegotiateError,
    },
}

impl Stream {
    pub fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Stream::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(on),
            Stream::Tcp(s) => s.set_nonblocking(on),
        }
    }

    /// Shuts both directions down (wakes a thread blocked on it).
    pub fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }

    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            Stream::Tcp(s) => s.as_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Connects to `addr`; a TCP connect gives up after `timeout` per
/// resolved address.
pub fn connect_socket(addr: &NbdAddr, timeout: Duration) -> Result<Stream, ConnectError> {
    let fail = |source| ConnectError::Connect {
        addr: match addr {
            NbdAddr::Unix(p) => p.display().to_string(),
            NbdAddr::Tcp { host, port } => format!("{host}:{port}"),
        },
        source,
    };
    match addr {
        NbdAddr::Unix(p) => UnixStream::connect(p).map(Stream::Unix).map_err(fail),
        NbdAddr::Tcp { host, port } => {
            let addrs = (host.as_str(), *port).to_socket_addrs().map_err(fail)?;
            let mut last =
                io::Error::new(io::ErrorKind::NotFound, "the host resolves to no address");
            for a in addrs {
                match TcpStream::connect_timeout(&a, timeout) {
                    Ok(s) => {
                        // Requests are small and latency matters.
                        s.set_nodelay(true).map_err(fail)?;
                        return Ok(Stream::Tcp(s));
                    }
                    Err(e) => last = e,
                }
            }
            Err(fail(last))
        }
    }
}

/// Connects to `uri` and runs the handshake; every step of it gives up
/// after `timeout`. The stream comes back blocking, without timeouts.
pub fn connect(
    uri: &NbdUri,
    cfg: &ClientConfig,
    timeout: Duration,
) -> Result<(Stream, ExportInfo), ConnectError> {
    let mut s = connect_socket(&uri.addr, timeout)?;
    let handshake = |source| ConnectError::Handshake {
        uri: uri.to_string(),
        source,
    };
    s.set_timeouts(Some(timeout))
        .map_err(|e| handshake(NegotiateError::Io(e)))?;
    let info = negotiate(&mut s, cfg).map_err(handshake)?;
    s.set_timeouts(None)
        .map_err(|e| handshake(NegotiateError::Io(e)))?;
    Ok((s, info))
}
