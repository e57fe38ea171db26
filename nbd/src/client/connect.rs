//! Opening a connection: the socket (Unix or TCP, with a deadline), then
//! the handshake under read and write timeouts, so a server that accepts
//! and then says nothing cannot hold the caller forever.

use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use thiserror::Error;

use super::negotiate::{negotiate, ClientConfig, ExportInfo, NegotiateError};
use super::uri::{NbdAddr, NbdUri};
use crate::stream::Stream;

#[derive(Debug, Error)]
pub enum ConnectError {
    /// The socket could not be connected (qemu-img's words).
    #[error("Failed to connect to '{addr}'")]
    Connect {
        addr: String,
        #[source]
        source: io::Error,
    },
    /// The server did not answer in time: the socket's connect, or a
    /// step of the handshake (a server that accepts and never speaks).
    #[error("timed out after {} s {waiting_for}", after.as_secs_f32())]
    TimedOut {
        waiting_for: String,
        after: Duration,
    },
    #[error("NBD handshake")]
    Handshake(#[source] NegotiateError),
}

/// Where `addr` is, for messages: the socket path or `HOST:PORT`.
fn addr_name(addr: &NbdAddr) -> String {
    match addr {
        NbdAddr::Unix(p) => p.display().to_string(),
        NbdAddr::Tcp { host, port } => format!("{host}:{port}"),
    }
}

/// Connects to `addr`; a TCP connect gives up after `timeout` per
/// resolved address.
pub fn connect_socket(addr: &NbdAddr, timeout: Duration) -> Result<Stream, ConnectError> {
    let fail = |source| ConnectError::Connect {
        addr: addr_name(addr),
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
            if matches!(
                last.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ) {
                return Err(ConnectError::TimedOut {
                    waiting_for: format!("connecting to {}", addr_name(addr)),
                    after: timeout,
                });
            }
            Err(fail(last))
        }
    }
}

/// Connects to `uri` and runs the handshake; every step of it gives up
/// after `timeout` ([`ConnectError::TimedOut`] names the step). The
/// stream comes back blocking, without timeouts.
pub fn connect(
    uri: &NbdUri,
    cfg: &ClientConfig,
    timeout: Duration,
) -> Result<(Stream, ExportInfo), ConnectError> {
    let mut s = connect_socket(&uri.addr, timeout)?;
    let setup = |source| {
        ConnectError::Handshake(NegotiateError::Io {
            step: "setting the socket's timeouts".into(),
            source,
        })
    };
    s.set_timeouts(Some(timeout)).map_err(setup)?;
    let info = negotiate(&mut s, cfg).map_err(|e| match e {
        NegotiateError::TimedOut(waiting_for) => ConnectError::TimedOut {
            waiting_for,
            after: timeout,
        },
        e => ConnectError::Handshake(e),
    })?;
    s.set_timeouts(None).map_err(setup)?;
    Ok((s, info))
}
