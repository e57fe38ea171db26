//! Disk images and the I/O engines that move their data.
//!
//! The crate has three layers:
//!
//! - [`formats`]: raw and qcow2. A format answers "where does guest range X
//!   live?" with a plan of host extents ([`formats::ReadPlan`],
//!   [`formats::WritePlan`]) and performs the metadata updates (allocation,
//!   L2 and refcount writes, discard). It never moves guest data itself.
//!   What queues call is the queue-facing trait [`formats::Format`]; the
//!   image-tool capabilities (snapshots, backing edits, compressed writes,
//!   make-empty, resize) are separate traits in [`formats::tools`].
//! - [`io`]: engines that execute plans against host files: `sync`
//!   (preadv/pwritev in the calling thread), `threads` (a worker pool per
//!   disk), `aio` (Linux native AIO per queue) and `uring` (one io_uring
//!   per queue). All implement one trait, so every format runs on every
//!   engine.
//! - [`disk`]: the handle that joins them. A [`disk::Disk`] is the shared,
//!   opened image; [`disk::DiskQueue`] is the per-queue handle a virtio queue
//!   worker (or `ch-img`) submits [`request::BlockRequest`]s to and drains
//!   [`request::Completion`]s from. Both hold only a [`formats::Format`].
//! - [`nbd`]: the NBD client, a protocol layer below the formats: an
//!   export opens as a raw disk or serves as a qcow2 overlay's backing
//!   file, and its ops run on the queue's engine like a file's.
//! - [`exclusive`]: the owner's open, [`ExclusiveImage`]: a `Disk` for I/O
//!   plus the tool capabilities ([`formats::ImageTools`]), which no `Disk`
//!   or `DiskQueue` can reach; and [`Resizer`], the one capability an owner
//!   may lend to threads running queues.
//!
//! - [`error`] and [`error_log`]: what a failure means (its consequence,
//!   errno and log level), and the one rate-limited log of failed
//!   requests that every front end writes through.
//!
//! Data enters as a batch of requests, each owning the memory it reads into
//! or writes from ([`request::IoMemory`]); it leaves as exactly one
//! completion per request, which hands that memory back.

pub mod check;
pub mod create;
pub mod disk;
pub mod error_log;
pub mod exclusive;
pub mod formats;
pub mod info_json;
pub mod io;
pub mod lock;
pub mod nbd;
pub mod new_file;
pub mod options;
pub mod padded;
pub mod prealloc;
pub mod request;

pub use block_engines as engines;
pub use block_engines::{aligned, error};
pub use disk::{Disk, DiskQueue};
pub use error::{BlockError, Consequence};
pub use exclusive::{ExclusiveImage, Resizer};
pub use options::{DiskOptions, EngineKind, ImageType};
pub use request::{BlockRequest, Completion, IoMemory, RequestOp};

/// The sector size of the block layer's request model (virtio-blk's unit).
pub const SECTOR_SIZE: u64 = 512;
