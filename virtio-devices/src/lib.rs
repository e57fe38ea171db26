//! Virtio devices: the device model, virtio-blk, and the virtio-pci
//! transport that exposes a device to the guest.
//!
//! - [`device`]: the small [`device::VirtioDevice`] trait every device
//!   implements, and [`device::VirtioInterrupt`], how a device signals the
//!   guest without knowing about KVM.
//! - `block`: virtio-blk (request parser, per-queue workers, config space).
//! - `transport`: virtio-pci (modern) with MSI-X.

pub mod device;

pub use device::{ActivateError, ActivatedQueue, InterruptKind, VirtioDevice, VirtioInterrupt};
