//! The project's NBD server: `ch-storage-daemon --export type=nbd` and
//! the VMM's point-in-time backup exports run this one server.
//!
//! The protocol is the `nbd` crate's (handshake, request parser, reply
//! encoders, as plain data); this crate drives it over sockets and a
//! block queue:
//!
//! - [`NbdServer::start`] takes an [`ExportConfig`] (a `unix:PATH` or
//!   `tcp:HOST:PORT` address, a name, writable or not, a connection
//!   limit) and an [`ExportSource`], binds the socket and starts the
//!   accept thread (`listen`); [`NbdServer::stop`] or dropping it ends
//!   every connection cleanly and joins the threads.
//! - Every client gets a thread of its own (`connection`) with its own
//!   [`SourceQueue`], so several clients run in parallel and nothing on
//!   the request path is shared between them. A connection thread runs
//!   the handshake, then one loop: read whatever the client sent, parse
//!   it into requests, turn them into block requests (`commands`) and
//!   submit them as one batch, drain the queue's completions into
//!   replies, send the replies with one `sendmsg`. Nothing in that loop
//!   blocks on image I/O, so many requests are in flight per connection.
//! - Metadata contexts: `base:allocation` from the source's allocation
//!   status, and `qemu:dirty-bitmap:NAME` for each bitmap the source
//!   offers ([`DirtyBitmap`], [`ExportedBitmap`]); BLOCK_STATUS answers
//!   one chunk per selected context (`block_status`).
//!
//! Sources: [`DiskSource`] serves an opened image (`block::Disk`), with
//! a qcow2 image's persistent bitmap ([`PersistentBitmap`]) if asked;
//! [`ViewSource`] serves a point-in-time view of a running disk
//! (`block::live::PointInTimeView`, the VMM's backup export) read-only,
//! with the bitmap frozen at its instant.
//!
//! # Threads and system calls
//!
//! [`NbdServer::start`] and [`NbdServer::stop`] run on the caller's
//! thread (binding, listening, starting the accept thread; joining it and
//! removing a Unix socket file); the accept thread and one thread per
//! client inherit the caller's seccomp filter. docs/nbd.md ("The server
//! as a library") lists the calls each of them makes, as `strace`
//! recorded them. A TCP host name (not an address) is resolved through
//! the C library, which reads files and may open sockets of its own; a
//! numeric address is not resolved.

mod addr;
mod answers;
mod bitmap;
mod block_status;
mod commands;
mod connection;
mod disk_source;
mod listen;
mod persistent_bitmap;
mod poll;
mod server;
mod shared;
mod source;
mod view_source;

pub use addr::ListenAddr;
pub use answers::answer_block_error;
pub use bitmap::{dirty_extents, DirtyBitmap, ExportedBitmap};
pub use disk_source::DiskSource;
pub use persistent_bitmap::PersistentBitmap;
pub use server::{BoundExport, ExportConfig, NbdServer, ServerError};
pub use source::{Allocation, ExportSource, SourceQueue};
pub use view_source::{ViewQueue, ViewSource};
