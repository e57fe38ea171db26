//! The NBD client's files: an NBD export as a file of an image, reached
//! through its connections. Nothing here knows a format: the block
//! crate opens an export as a raw disk, or as a qcow2 overlay's backing
//! file, over an [`NbdFile`] (see docs/nbd.md).
//!
//! An image's plans name an export as a *remote file*, numbered after
//! its local files ([`crate::files::ImageFiles`]), so plans stay what
//! they are: host extents in file N. A queue's engine is then a
//! `route::RoutedEngine` over the file engine (local files) and one
//! `engine::NbdEngine` per export ([`crate::factory::queue_engine`]).
//! The NBD engine turns each host op into NBD commands on a connection
//! (`connection`) and sends a whole batch with one `sendmsg`; many
//! commands are in flight per connection. The connection's thread
//! (`io_thread`) parses replies (the `nbd` crate's reply parser),
//! copies READ data into the requests' memory and completes each op to
//! its queue's completion list and eventfd, the same eventfd and drain
//! every engine uses. Inline work (copy-on-write reads of a backing
//! export, block status) runs as blocking operations on the export's
//! first connection ([`NbdFile::read_at`], [`NbdFile::block_status`]).
//!
//! Queues share one connection unless the server advertises multi-conn,
//! then each queue has its own (`file`). A program that confines its
//! threads with seccomp opens every connection on one connector thread
//! whose filter allows sockets (`connector`, [`start_connector`]). A
//! lost connection is reconnected with QEMU's `reconnect-delay`
//! semantics (the disk key `reconnect_delay`); a server that breaks the
//! protocol is disconnected for good.
//!
//! Why threads and not the queue's io_uring: several queues (and inline
//! callers) may share one connection, and its replies must reach
//! whichever queue asked; one reader per connection does that without a
//! lock on the request path of the file engines, and without touching
//! their rings.

mod connection;
mod connector;
mod engine;
mod file;
mod inflight;
mod io_thread;
mod iov;
mod link;
mod path;
pub(crate) mod route;
mod sink;

pub use connector::start_connector;
pub use file::NbdFile;
pub use path::{is_nbd_path, qemu_filename};
