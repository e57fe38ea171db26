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
