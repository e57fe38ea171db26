//! What an in-VMM disk is built from, once its `DiskConfig` has been
//! checked ([`super::disk_resolve`]): the block crate's [`DiskOptions`]
//! (how the image is opened) plus the virtio-blk device's settings, and
//! the limits those checks apply.

use block::DiskOptions;
use virtio_devices::block::rate_limit::RateLimitConfig;

/// Most queues per disk: the vCPU count is small on our machines and each
/// queue is a thread.
pub const MAX_QUEUES: u16 = 64;
/// Largest split virtqueue.
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// The virtio-blk serial (GET_ID) is at most 20 bytes.
pub const MAX_SERIAL: usize = 20;
/// Largest `poll_us` (the device caps its spin at 1 ms).
pub const MAX_POLL_US: u32 = 1000;

/// An in-VMM disk, checked: what the device manager opens and builds.
#[derive(Clone, Debug)]
pub struct LocalDiskConfig {
    pub options: DiskOptions,
    pub num_queues: u16,
    pub queue_size: u16,
    pub id: Option<String>,
    pub serial: Option<String>,
    /// Throttling of each of the disk's queues (nothing by default).
    pub rate_limit: RateLimitConfig,
    /// Host CPUs per queue index (`None`: not pinned).
    pub queue_affinity: Vec<Option<Vec<usize>>>,
    /// Ceiling of the queue workers' adaptive spin in microseconds (0: none).
    pub poll_us: u32,
    /// Whether an image with a backing file may be opened (its chain is
    /// then followed); `backing_files=off` refuses one.
    pub backing_files: bool,
}
