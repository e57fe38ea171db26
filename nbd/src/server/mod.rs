//! The server side of the protocol, without sockets of its own.
//!
//! A connection goes through [`negotiate`] (the fixed-newstyle handshake,
//! blocking, over any `Read + Write`; [`negotiate_offering_bitmaps`] when
//! the export offers `qemu:dirty-bitmap:NAME` contexts, [`MetaContext`]),
//! then feeds every byte it receives
//! to a [`RequestParser`], which hands back validated [`Request`]s (WRITE
//! payloads included) or rejections to answer with an error reply; the
//! connection encodes its answers with [`replies`]. What a request does
//! to an image is the caller's business (the storage daemon's NBD export
//! turns them into block requests).

mod meta_context;
mod negotiate;
pub mod replies;
mod request_parser;

pub use meta_context::MetaContext;
pub use negotiate::{
    negotiate, negotiate_offering_bitmaps, ExportDesc, HandshakeError, Negotiated, Session,
};
pub use request_parser::{Command, Parsed, ProtocolViolation, Request, RequestParser, Rules};
