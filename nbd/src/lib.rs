//! The NBD protocol (NetworkBlockDevice/nbd `doc/proto.md`), both sides,
//! as plain data and small state machines: no block layer, no threads.
//!
//! - [`wire`]: constants and the fixed-size headers (requests, simple and
//!   structured replies, option requests and replies) with their
//!   big-endian encoding; nothing here touches a socket.
//! - [`server`]: the fixed-newstyle handshake a server runs
//!   ([`server::negotiate`]), the transmission-phase request parser
//!   ([`server::RequestParser`], bytes in, validated commands out) and the
//!   reply encoders.
//! - [`client`]: URIs in QEMU's spelling ([`client::NbdUri`]), connecting
//!   and the client's handshake ([`client::connect`]), the request encoder
//!   and the reply parser ([`client::ReplyParser`], bytes in, events per
//!   request cookie out).
//! - [`outbox`]: the send queue both sides use: owned buffers written
//!   with one `sendmsg` per batch, without blocking; [`stream`]: a Unix
//!   or TCP socket.
//!
//! Who drives the sockets lives elsewhere: the `nbd-server` crate (the
//! server of `ch-storage-daemon`'s export, one thread per connection over
//! a block queue) and the block layer's NBD client (`block_engines::nbd`,
//! a file below the formats). The two parsers are what the fuzz targets
//! feed (`nbd/fuzz`).
//!
//! Hand-written because no maintained crate does this: the `nbd` crate on
//! crates.io is a small synchronous client/server without structured
//! replies or block status, and no asynchronous one exists.

pub mod client;
pub mod outbox;
pub mod server;
pub mod stream;
pub mod wire;
