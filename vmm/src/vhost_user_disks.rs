//! `--disk vhost_user=on,...`: connects one vhost-user-blk front end to
//! its backend's socket (at boot, so a missing backend fails before the
//! guest runs). The [`crate::disk_registry::DiskRegistry`] puts it behind
//! virtio-pci after the in-VMM disks.
//!
//! Enters as a parsed [`VhostUserDiskConfig`]; leaves as a connected
//! device and the capacity its backend reported.

use virtio_devices::vhost_user_blk::device::VhostUserBlkConfig;
use virtio_devices::vhost_user_blk::VhostUserBlkDevice;

use crate::config::VhostUserDiskConfig;
use crate::device_error::DeviceError;

/// Connects to the backend of `c`.
pub(crate) fn connect(c: &VhostUserDiskConfig) -> Result<(VhostUserBlkDevice, u64), DeviceError> {
    let dev = VhostUserBlkDevice::new(&VhostUserBlkConfig {
        socket: c.socket.clone(),
        num_queues: c.num_queues,
        queue_size: c.queue_size,
    })
    .map_err(DeviceError::VhostUser)?;
    let capacity = dev.capacity_bytes();
    Ok((dev, capacity))
}
