//! What can go wrong building or changing the machine's devices: opening
//! a disk, wiring a function into KVM, the legacy devices, a vhost-user
//! backend. The device manager, the disk registry and the PCI attach code
//! all return it; the API maps it to a status (`crate::control::status`).

use std::io;

use block::BlockError;
use thiserror::Error;
use virtio_devices::block::BlockDeviceError;
use virtio_devices::transport::TransportError;

use crate::devices::bus::BusOverlap;

#[derive(Debug, Error)]
pub enum DeviceError {
    /// The path is left out when the block error names it already (it
    /// does for a missing file or an NBD URI), so it is printed once.
    #[error("{}", open_disk_message(path, source))]
    OpenDisk {
        path: String,
        #[source]
        source: BlockError,
    },
    #[error("cannot create virtio-blk device for {path}")]
    CreateBlock {
        path: String,
        #[source]
        source: BlockDeviceError,
    },
    #[error("cannot create virtio-pci transport")]
    Transport(#[source] TransportError),
    #[error("cannot open serial output file {path}")]
    SerialFile {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot start the serial input thread")]
    SerialInput(#[source] io::Error),
    #[error("cannot create an eventfd")]
    EventFd(#[source] io::Error),
    #[error("KVM rejected an interrupt or notification set-up")]
    Kvm(#[source] hypervisor::HypervisorError),
    #[error("device address conflict")]
    Bus(#[source] BusOverlap),
    #[error("cannot build the queue workers' seccomp filter")]
    Seccomp(#[source] crate::seccomp::SeccompError),
    #[error("disk {path} has the backing file {backing}, and backing_files is off")]
    BackingFilesOff { path: String, backing: String },
    #[error("too many disks: the PCI bus and MMIO window hold {0}")]
    TooManyDisks(usize),
    #[error("cannot set up a vhost-user disk")]
    VhostUser(#[source] virtio_devices::vhost_user_blk::VhostUserBlkError),
}

fn open_disk_message(path: &str, source: &BlockError) -> String {
    if source.to_string().contains(path) {
        "cannot open a disk".to_string()
    } else {
        format!("cannot open disk {path}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_path_is_named_once() {
        let uri = "nbd+unix:///e?socket=/run/e.sock";
        let named = DeviceError::OpenDisk {
            path: uri.into(),
            source: BlockError::Nbd {
                uri: uri.into(),
                reason: "gone".into(),
            },
        };
        let chain = ch_log::error_chain(&named);
        assert_eq!(chain.matches(uri).count(), 1, "{chain}");
        let unnamed = DeviceError::OpenDisk {
            path: "a.qcow2".into(),
            source: BlockError::Corrupt,
        };
        assert_eq!(unnamed.to_string(), "cannot open disk a.qcow2");
    }
}
