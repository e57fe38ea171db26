//! The bottom floor of the block layer: the files of an image and the
//! engines that run host operations on them. Nothing here knows a
//! format, a plan or a request: the block crate's formats name files by
//! [`FileId`], its executor turns plans into [`HostOp`]s and pushes them
//! to a queue's [`Engine`].
//!
//! - [`files`]: an image's files, local or remote ([`ImageFiles`]); an
//!   NBD export is a remote file reached through its connections
//!   ([`nbd`]);
//! - [`engine`]: the host operation, its completion and the [`Engine`]
//!   trait; the engines: [`sync`] (at submit, in the calling thread),
//!   [`threads`] (a worker pool per disk, QEMU's aio=threads), [`aio`]
//!   (Linux native AIO, one context per queue), [`uring`] (one ring per
//!   queue) and the NBD engine; all complete through the queue's eventfd,
//!   so every format runs on every engine;
//! - [`factory`]: making a queue's engine ([`EngineKind`], [`kind`]);
//!   [`probe`]: what the kernel offers io_uring;
//! - [`align`] and [`aligned`]: O_DIRECT alignment of a file, and buffers
//!   that meet it;
//! - [`error`]: the block layer's error type, [`BlockError`], which every
//!   floor above fails with.
//!
//! Floors above: formats (the block crate's `formats`), the executor
//! (`executor`) and the disk (`Disk`, `DiskQueue`); Cargo keeps this
//! crate from naming them.

pub mod aio;
pub mod align;
pub mod aligned;
pub(crate) mod blocking;
pub mod engine;
pub mod error;
pub mod factory;
pub mod files;
pub mod kind;
pub mod nbd;
pub mod probe;
pub mod submit_stats;
pub mod sync;
#[cfg(test)]
mod test_blocks;
pub mod threads;
pub mod uring;

pub use engine::{Engine, EngineCompletion, FileId, HostOp, OpToken, RawIovecs};
pub use error::{BlockError, Consequence};
pub use factory::{new_engine, queue_engine};
pub use files::ImageFiles;
pub use kind::EngineKind;
