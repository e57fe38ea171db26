//! virtio-blk: a block device over a [`block::Disk`].
//!
//! - [`request_parser`]: one descriptor chain in, a validated request (or
//!   the status to answer with) out. Everything the guest controls is
//!   checked here.
//! - [`descriptor_walk`]: a chain (with its indirect table) as a bounded
//!   list of descriptors.
//! - [`queue_worker`]: one thread per queue; pops chains, submits batches
//!   to the disk, completes them into the used ring, raises interrupts.
//! - [`error_status`]: the status byte and the (rate-limited) log line of
//!   a request that failed.
//! - [`rate_limit`]: the optional bandwidth and ops token buckets a worker
//!   checks before it takes a chain off the ring.
//! - [`affinity`]: pins a worker thread to the host CPUs it was given.
//! - [`counters`]: per-queue I/O counters, summed for `vm.counters`.
//! - [`control`]: pause/resume, resize, flush and snapshot of a running
//!   device, and [`SharedBlockDevice`] for owners that keep a handle.
//! - [`switch`]: the image switch (a running device moves to another
//!   image at one instant: external snapshots, a mirror's complete).
//! - [`config_space`]: [`BlockDeviceConfig`] and the config space layout.
//! - [`features`]: which feature bits are offered.
//! - [`device`]: [`BlockDevice`], the [`crate::VirtioDevice`] the transport
//!   drives (activate, reset, shutdown).

pub mod affinity;
pub mod config_space;
pub mod control;
pub mod counters;
pub mod descriptor_walk;
pub mod device;
pub mod error_status;
pub mod features;
pub mod queue_worker;
pub mod rate_limit;
pub mod request_parser;
pub mod switch;

pub use config_space::{BlockDeviceConfig, DEFAULT_POLL_US};
pub use control::{ControlError, PauseTicket, SharedBlockDevice, Shrink};
pub use device::{BlockDevice, BlockDeviceError, StoppedQueue, VIRTIO_ID_BLOCK};
pub use switch::{NewImage, PreparedSwitch, SwitchedOut};
