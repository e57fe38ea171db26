//! The virtio-pci modern transport (virtio 1.2, section 4.1) with MSI-X.
//!
//! - [`pci_config`]: the PCI function's configuration space.
//! - [`layout`]: BAR 0's layout and the capabilities that describe it.
//! - [`common_config`]: the common configuration registers.
//! - [`status`]: the device status bits the driver writes.
//! - [`msix`]: the MSI-X table, PBA, masking, and the
//!   [`crate::VirtioInterrupt`] devices signal through.
//! - [`virtio_pci`]: [`VirtioPciDevice`], which joins them around one
//!   [`crate::VirtioDevice`]; [`error`]: [`TransportError`], why one could
//!   not be built.
//!
//! Nothing here knows about KVM: the VMM passes in one irqfd per MSI-X
//! vector and an [`MsiRouter`] that programs the hypervisor's MSI routes,
//! registers the notify addresses from
//! [`VirtioPciDevice::notify_eventfds`] as ioeventfds (and moves them when
//! a config write reports a [`BarMoved`]), and forwards config cycles and
//! BAR 0 accesses.

pub mod common_config;
pub mod error;
pub mod layout;
pub mod msix;
pub mod pci_config;
pub mod status;
pub mod virtio_pci;

pub use error::TransportError;
pub use msix::{MsiMessage, MsiRouter};
pub use virtio_pci::{BarMoved, DeviceEvent, EventObserver, VirtioPciDevice};
