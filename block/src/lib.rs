//! Disk images: their formats, the executor that runs a format's plans
//! on the engines, and the disk handles queues and tools use.
//!
//! The block layer is four floors, each knowing only the floors below it
//! (`module-cycles` holds every crate to having no module cycle; Cargo
//! holds the bottom floor apart):
//!
//! 1. **Files and engines** (the `block-engines` crate, re-exported as
//!    [`engines`]): a [`engines::FileId`] and the files it names, local
//!    or remote (an NBD export, reached through its connections); the
//!    engines that run host operations on them (`sync`, `threads`,
//!    `aio`, `uring`, the NBD engine), all completing through the
//!    queue's eventfd; the error type, [`BlockError`].
//! 2. **Formats** ([`formats`]): raw, qcow2 and a raw disk over an NBD
//!    export. A format answers "where does guest range X live?" with a
//!    plan of host extents ([`formats::ReadPlan`], [`formats::WritePlan`])
//!    and performs the metadata updates itself; it never moves guest data.
//!    What queues call is [`formats::Format`]; the image-tool capabilities
//!    are separate traits in [`formats::tools`]. With them: the options an
//!    image is opened with ([`options`]), its locks ([`lock`]), creating
//!    ([`create`]) and checking ([`check`]) images, and `info`'s JSON
//!    ([`info_json`]).
//! 3. **The executor** ([`executor`]): runs a format's plans on a queue's
//!    engine: bounce buffers, splitting, completion accounting, the
//!    compressed-cluster inflation; over the request model ([`request`]).
//! 4. **The disk** (top): [`Disk`], the shared opened image, and
//!    [`DiskQueue`], the per-queue handle a virtio queue worker (or
//!    `ch-img`) submits [`BlockRequest`]s to and drains [`Completion`]s
//!    from, with the engine a disk's queues use ([`engine_choice`]);
//!    [`ExclusiveImage`], the owner's open, with the tool capabilities no
//!    `Disk` or `DiskQueue` can reach, and [`Resizer`], the one an owner
//!    may lend to threads running queues ([`exclusive`]); a new overlay
//!    on a running disk's image ([`overlay`]). The write seam of live
//!    operations ([`live`]: dirty bitmaps marked by every queue,
//!    docs/live-operations.md) and the image switch go on this floor,
//!    with the block jobs that use them ([`jobs`]: the mirror).
//!
//! [`error_log`] is the one rate-limited log of failed requests that
//! every front end writes through.
//!
//! Data enters as a batch of requests, each owning the memory it reads into
//! or writes from ([`IoMemory`]); it leaves as exactly one completion per
//! request, which hands that memory back.

pub mod check;
pub mod create;
pub mod disk;
pub mod engine_choice;
pub mod error_log;
pub mod exclusive;
pub mod executor;
pub mod formats;
pub mod info_json;
pub mod jobs;
pub mod live;
pub mod lock;
pub mod new_file;
pub mod options;
pub mod overlay;
pub mod padded;
pub mod prealloc;
pub mod request;

pub use block_engines as engines;
pub use block_engines::{aligned, error};
pub use disk::{Disk, DiskQueue};
pub use error::{BlockError, Consequence};
pub use exclusive::{ExclusiveImage, Resizer};
pub use options::{DiskOptions, EngineKind, ImageType};
pub use request::{BlockRequest, Completion, IoMemory, RequestOp, SECTOR_SIZE};
