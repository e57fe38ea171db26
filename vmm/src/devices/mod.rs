//! Emulated devices the vCPU threads dispatch port and MMIO exits to:
//! the [`bus::Bus`] address decoder, the 8250 [`serial`] port, the
//! [`acpi_pm`] sleep and reset registers (laid out in
//! [`acpi_pm_registers`]), the
//! [`i8042`] reset line, the [`cmos`] real-time clock, and the [`pci`]
//! host bridge with its virtio-pci functions, the [`pci_hotplug`]
//! registers behind ACPI PCI hotplug, and the [`ged`] event register
//! (the power button).

pub mod acpi_pm;
pub mod acpi_pm_registers;
pub mod bus;
pub mod cmos;
pub mod ged;
pub mod i8042;
pub mod pci;
pub mod pci_hotplug;
pub mod serial;
