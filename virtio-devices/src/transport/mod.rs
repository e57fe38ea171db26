//! The virtio-pci modern transport (virtio 1.2, section 4.1) with MSI-X.
//!
//! - [`pci_config`]: the PCI function's configuration space.
//! - [`layout`]: BAR 0's layout and the capabilities that describe it.
//! - [`common_config`]: the common configuration registers.
//! - [`msix`]: the MSI-X table, PBA, masking, and the
//!   [`crate::VirtioInterrupt`] devices signal through.
//! - [`virtio_pci`]: [`VirtioPciDevice`], which joins them around one
//!   [`crate::VirtioDevice`].
//!
//! Nothing here knows about KVM: the VMM passes in one irqfd per MSI-X
//! vector and an [`MsiRouter`] that programs the hypervisor's MSI routes,
//! registers the notify addresses from
//! [`VirtioPciDevice::notify_eventfds`] as ioeventfds (and moves them when
//! a config write reports a [`BarMoved`]), and forwards config cycles and
//! BAR 0 accesses.

pub mod common_config;
pub mod layout;
pub mod msix;
pub mod pci_config;
pub mod virtio_pci;

pub use msix::{MsiMessage, MsiRouter};
pub use virtio_pci::{BarMoved, DeviceEvent, EventObserver, TransportError, VirtioPciDevice};

/// PCI vendor ID of virtio devices.
pub const VIRTIO_PCI_VENDOR: u16 = 0x1af4;

// Device status bits.
pub const STATUS_ACKNOWLEDGE: u8 = 1;
pub const STATUS_DRIVER: u8 = 2;
pub const STATUS_DRIVER_OK: u8 = 4;
pub const STATUS_FEATURES_OK: u8 = 8;
pub const STATUS_NEEDS_RESET: u8 = 0x40;
pub const STATUS_FAILED: u8 = 0x80;
