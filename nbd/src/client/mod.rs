//! The client side of the protocol, without threads of its own.
//!
//! [`NbdUri`] parses QEMU's URI spellings; [`connect`] opens the socket
//! and runs the handshake ([`negotiate`]), returning the stream and what
//! the server said about the export ([`ExportInfo`]). In the transmission
//! phase the caller encodes requests with [`crate::wire::RequestHeader`]
//! and feeds every received byte to a [`ReplyParser`], which reports what
//! each reply says about the request it answers. The block layer's NBD
//! client (`block_engines::nbd`) drives this from its connection threads.

mod connect;
mod negotiate;
mod reply_parser;
mod uri;

pub use connect::{connect, connect_socket, ConnectError};
pub use negotiate::{list_exports, negotiate, ClientConfig, ExportInfo, NegotiateError};
pub use reply_parser::{Expect, Extent, ReplyError, ReplyEvent, ReplyParser};
pub use uri::{NbdAddr, NbdUri, UriError};
