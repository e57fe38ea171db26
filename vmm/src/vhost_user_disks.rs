//! `--disk vhost_user=on,...`: connects one vhost-user-blk front end per
//! disk to its backend's socket (at boot, so a missing backend fails
//! before the guest runs) and puts it behind virtio-pci after the in-VMM
//! disks.
//!
//! Enters as the parsed [`VhostUserDiskConfig`]s; leaves as PCI functions
//! in the device manager's bus.

use virtio_devices::vhost_user_blk::device::VhostUserBlkConfig;
use virtio_devices::vhost_user_blk::VhostUserBlkDevice;

use crate::config::VhostUserDiskConfig;
use crate::device_manager::{DeviceError, PciAttach};

/// Adds every vhost-user disk; the first takes device number
/// `first_index`.
pub(crate) fn add_vhost_user_disks(
    attach: &PciAttach<'_>,
    configs: &[VhostUserDiskConfig],
    first_index: usize,
    next_gsi: &mut u32,
) -> Result<(), DeviceError> {
    for (i, c) in configs.iter().enumerate() {
        let socket = c.socket.display().to_string();
        let dev = VhostUserBlkDevice::new(&VhostUserBlkConfig {
            socket: c.socket.clone(),
            num_queues: c.num_queues,
            queue_size: c.queue_size,
        })
        .map_err(DeviceError::VhostUser)?;
        let capacity = dev.capacity_bytes();
        let (slot, bar) = attach.add(Box::new(dev), c.num_queues, first_index + i, next_gsi)?;
        log::info!(
            "disk {socket}: vhost-user-blk ({capacity} bytes) at PCI 00:{slot:02x}.0, \
             BAR0 {bar:#x}, {} queue(s) of {}",
            c.num_queues,
            c.queue_size
        );
    }
    Ok(())
}
