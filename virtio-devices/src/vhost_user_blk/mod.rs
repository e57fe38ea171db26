//! virtio-blk served by another process over vhost-user: the VMM is the
//! front end, a backend such as `ch-storage-daemon --export
//! type=vhost-user-blk` does the I/O.
//!
//! - [`handshake`]: connects to the backend's socket at boot, negotiates
//!   virtio and protocol features and reads the config space.
//! - [`vrings`]: on activation, hands the backend the guest memory table
//!   and each queue (addresses, size, start position, kick and call
//!   eventfds); on reset, stops each queue (GET_VRING_BASE).
//! - [`call_forwarder`]: one thread turning the backend's call eventfds
//!   into [`crate::VirtioInterrupt`] triggers (MSI-X vector lookup and
//!   masking stay in the transport).
//! - [`device`]: [`VhostUserBlkDevice`], the [`crate::VirtioDevice`] the
//!   virtio-pci transport drives exactly as it drives the in-VMM device.
//!
//! Data never passes through the VMM: the guest's queue notifications land
//! on the transport's ioeventfds, which are the backend's kick eventfds,
//! and the backend reads and writes guest RAM through the memfd it was
//! sent (guest memory must be file-backed: `--memory shared=on`).

pub mod call_forwarder;
pub mod device;
pub mod handshake;
pub mod vrings;

use std::io;

use thiserror::Error;

pub use device::VhostUserBlkDevice;

#[derive(Debug, Error)]
pub enum VhostUserBlkError {
    #[error("cannot connect to the vhost-user socket {socket}")]
    Connect {
        socket: String,
        #[source]
        source: vhost::Error,
    },
    #[error("vhost-user {request} to {socket} failed")]
    Request {
        socket: String,
        request: &'static str,
        #[source]
        source: vhost::Error,
    },
    #[error("the vhost-user backend at {socket} does not offer {what}")]
    MissingFeature { socket: String, what: &'static str },
    #[error("the vhost-user backend at {socket} has {available} queue(s), {requested} asked for")]
    TooFewQueues {
        socket: String,
        available: u64,
        requested: u16,
    },
    #[error("guest memory at {0:#x} is not in a shareable file (use --memory shared=on)")]
    MemoryNotShared(u64),
    #[error("guest memory has {0} regions, more than vhost-user can send")]
    TooManyRegions(usize),
    #[error("queue {index}: ring address {addr:#x} is not in guest memory")]
    RingAddress { index: u16, addr: u64 },
    #[error("cannot set up the call eventfds and their forwarding thread")]
    CallForwarder(#[source] io::Error),
}

/// For `map_err`: message `request` to the backend at `socket` failed.
pub(crate) fn request_failed(
    socket: &str,
    request: &'static str,
) -> impl FnOnce(vhost::Error) -> VhostUserBlkError {
    let socket = socket.to_string();
    move |source| VhostUserBlkError::Request {
        socket,
        request,
        source,
    }
}
