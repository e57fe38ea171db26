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
//! - [`error`]: [`VhostUserBlkError`], what each of them returns.
//!
//! Data never passes through the VMM: the guest's queue notifications land
//! on the transport's ioeventfds, which are the backend's kick eventfds,
//! and the backend reads and writes guest RAM through the memfd it was
//! sent (guest memory must be file-backed: `--memory shared=on`).

pub mod call_forwarder;
pub mod device;
pub mod error;
pub mod handshake;
pub mod vrings;

pub use device::VhostUserBlkDevice;
pub use error::VhostUserBlkError;
