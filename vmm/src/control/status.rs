//! The one mapping from a failed operation to the API's HTTP status.
//!
//! The rule: what the asker got wrong is a 4xx, what the host got wrong
//! a 500. 400 when the request cannot be done as asked (a bad size, an
//! operation this image or disk does not offer, a path that names
//! nothing); 409 when it conflicts with what exists (a snapshot name
//! taken, an image another process holds, a full bus); 500 when the host
//! or the image failed (I/O errors, damage, set-up). Block errors go by
//! the consequence the block crate gives each one
//! ([`block::Consequence`]), so a new error there lands on the right
//! side without an edit here.
//!
//! Enters as the error of a disk operation (the block layer's, the
//! device's or the device manager's) or of a boot; leaves as a status
//! code that the control loop's handlers put on their answers.

use block::{BlockError, Consequence};
use virtio_devices::block::{BlockDeviceError, ControlError};

use crate::boot::error::BootError;
use crate::device_manager::DeviceError;
use crate::vm_error::VmError;

/// The status of a failed block-layer operation.
pub(super) fn of_block(e: &BlockError) -> u16 {
    match e {
        // Another process holds the image.
        BlockError::Locked { .. } => 409,
        // The path names nothing that can be opened as a file.
        BlockError::Open { source, .. }
            if matches!(
                source.raw_os_error(),
                Some(
                    libc::ENOENT | libc::ENOTDIR | libc::EISDIR | libc::ENAMETOOLONG | libc::ELOOP
                )
            ) =>
        {
            400
        }
        BlockError::NoSuchSnapshot { .. } => 400,
        // An export that cannot be used as asked: a bad URI, read-only
        // without readonly=on, a qcow2 inside.
        BlockError::Nbd { .. } => 400,
        _ => match e.consequence() {
            Consequence::Unsupported | Consequence::BadRequest => 400,
            Consequence::HostIo | Consequence::Corrupt | Consequence::Setup => 500,
        },
    }
}

/// The status of a failed operation on a running disk (resize,
/// snapshot, flush).
pub(super) fn of_control(e: &ControlError) -> u16 {
    match e {
        ControlError::BadSize(_)
        | ControlError::NoShrink { .. }
        | ControlError::ShrinkNotAsked { .. }
        | ControlError::ReadOnly
        | ControlError::SnapshotFormat(_)
        | ControlError::BadSnapshotName
        | ControlError::NoImageTools => 400,
        ControlError::SnapshotExists(_) => 409,
        ControlError::SwitchReadOnly { .. } | ControlError::SwitchBlockSize { .. } => 400,
        ControlError::Closed | ControlError::NotPaused => 409,
        ControlError::DrainTimeout(_) | ControlError::SwitchRefused => 500,
        ControlError::Resize(e)
        | ControlError::Flush(e)
        | ControlError::Snapshot(e)
        | ControlError::SwitchQueue(e)
        | ControlError::Close(e) => of_block(e),
    }
}

/// The status of an overlay that was not made: the asker's path (it
/// exists, it is the running image or a backing file) or the host.
pub(super) fn of_overlay(e: &block::overlay::OverlayError) -> u16 {
    use block::overlay::OverlayError;
    match e {
        OverlayError::IsRunningImage(_) | OverlayError::InChain(_) | OverlayError::Exists(_) => 409,
        OverlayError::NotLocal(_) => 400,
        OverlayError::Create { source, .. } | OverlayError::Open { source, .. } => of_block(source),
    }
}

/// Whether a file could not be opened because of its path (nothing
/// there, not a file, no permission): the asker's to fix.
fn path_is_wrong(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ENOENT
                | libc::ENOTDIR
                | libc::EISDIR
                | libc::ENAMETOOLONG
                | libc::ELOOP
                | libc::EACCES
        )
    )
}

/// The status of a failed boot or reboot.
pub(super) fn of_vm(e: &VmError) -> u16 {
    match e {
        VmError::NotCreated => 404,
        VmError::Config(_) => 400,
        VmError::OpenDisks(e) | VmError::Devices(e) => of_device(e),
        VmError::LoadGuest(e) => match e {
            BootError::Open { source, .. } if path_is_wrong(source) => 400,
            BootError::UnknownKernelFormat { .. }
            | BootError::NoPvhNote { .. }
            | BootError::CmdlineTooLong { .. }
            | BootError::CmdlineNul
            | BootError::InitramfsTooLarge { .. }
            | BootError::TooManyCpus(_) => 400,
            _ => 500,
        },
        _ => 500,
    }
}

/// The status of a failed hot-add (or of the devices of a boot).
pub(super) fn of_device(e: &DeviceError) -> u16 {
    match e {
        DeviceError::OpenDisk { source, .. } => of_block(source),
        DeviceError::SerialFile { source, .. } if path_is_wrong(source) => 400,
        DeviceError::CreateBlock { source, .. } => match source {
            BlockDeviceError::InvalidConfig(_) => 400,
            BlockDeviceError::Close(e) => of_block(e),
        },
        // The request said backing_files=off for an image that has one.
        DeviceError::BackingFilesOff { .. } => 400,
        DeviceError::TooManyDisks(_) => 409,
        _ => 500,
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    fn os(errno: i32) -> io::Error {
        io::Error::from_raw_os_error(errno)
    }

    #[test]
    fn the_askers_mistakes_are_4xx_and_the_hosts_failures_500() {
        // What an NBD export cannot do (resize, internal snapshots) is
        // refused as the block crate's Unsupported.
        let nbd_resize = BlockError::Unsupported {
            path: "".into(),
            feature: "resizing in raw (over NBD) images".into(),
        };
        assert_eq!(of_block(&nbd_resize), 400);
        assert_eq!(of_control(&ControlError::Resize(nbd_resize)), 400);
        for (e, want) in [
            (BlockError::InvalidResize("beyond the limit".into()), 400),
            (BlockError::ReadOnly, 400),
            (
                BlockError::Open {
                    path: "x".into(),
                    source: os(libc::ENOENT),
                },
                400,
            ),
            (
                BlockError::Open {
                    path: "x".into(),
                    source: os(libc::EIO),
                },
                500,
            ),
            (
                BlockError::Locked {
                    path: "x".into(),
                    perm: "write",
                    shared: false,
                },
                409,
            ),
            (
                BlockError::Nbd {
                    uri: "nbd://h/e".into(),
                    reason: "the export is read-only".into(),
                },
                400,
            ),
            (BlockError::Resize("ftruncate: EIO".into()), 500),
            (BlockError::Flush(os(libc::EIO)), 500),
            (BlockError::Corrupt, 500),
            (BlockError::NoSpace("full".into()), 500),
        ] {
            assert_eq!(of_block(&e), want, "{e}");
        }
        assert_eq!(of_control(&ControlError::SnapshotExists("a".into())), 409);
        assert_eq!(of_control(&ControlError::BadSize(3)), 400);
        assert_eq!(
            of_control(&ControlError::Snapshot(BlockError::Flush(os(libc::EIO)))),
            500
        );
        assert_eq!(of_device(&DeviceError::TooManyDisks(31)), 409);
        let bad_queues = DeviceError::CreateBlock {
            path: "x".into(),
            source: BlockDeviceError::InvalidConfig("num_queues".into()),
        };
        assert_eq!(of_device(&bad_queues), 400);
        let missing = DeviceError::OpenDisk {
            path: "x".into(),
            source: BlockError::Open {
                path: "x".into(),
                source: os(libc::ENOENT),
            },
        };
        assert_eq!(of_device(&missing), 400);
    }
}
