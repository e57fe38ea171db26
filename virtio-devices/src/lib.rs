//! Virtio devices: the device model, virtio-blk, and the virtio-pci
//! transport that exposes a device to the guest.
//!
//! - [`device`]: the small [`device::VirtioDevice`] trait every device
//!   implements, and [`device::VirtioInterrupt`], how a device signals the
//!   guest without knowing about KVM.
//! - [`block`]: virtio-blk (request parser, per-queue workers, config space).
//! - [`vhost_user_blk`]: virtio-blk served by a vhost-user backend (the
//!   VMM as a vhost-user front end).
//! - `transport`: virtio-pci (modern) with MSI-X.
//!
//! The host-side driver that plays the guest in tests and `blk-bench`
//! lives in its own crate, `virtio-host-driver`, so the VMM does not link it.

pub mod block;
pub mod device;
pub mod transport;
pub mod vhost_user_blk;

pub use device::{ActivateError, ActivatedQueue, InterruptKind, VirtioDevice, VirtioInterrupt};
