//! The DSDT's AML: the `\_S5` sleep type (what a guest writes to the
//! sleep control register to power off), the PCI host bridge
//! `\_SB.PCI0` with the resources it decodes (`_CRS`): bus 0, the
//! configuration ports, the rest of the I/O space, and the 32-bit MMIO
//! window the BARs live in, plus its hotplug slots ([`super::hotplug`]);
//! the Generic Event Device that announces hotplug and the power button
//! ([`super::ged`]), the power button itself ([`super::power_button`]);
//! and COM1 (`\_SB.COM1`, ports `0x3f8..0x400`, GSI 4), since a
//! hardware-reduced machine has no legacy IRQ table a guest could assume
//! it from.
//!
//! Every object is `acpi_tables`' AML. Each device of `\_SB` is built
//! and encoded by its own function and [`body`] lists them, so a new
//! device is one function and one line there; a new GED event is one
//! entry in [`GED_EVENTS`].
//!
//! Enters as nothing but the layout constants; leaves as the table body
//! (the caller adds the header).

use acpi_tables::aml::{
    AddressSpace, AddressSpaceCacheable, Device, EISAName, Interrupt, Name, Package,
    ResourceTemplate, Scope, IO, ZERO,
};

use super::encoded::{encode, Encoded};
use super::ged::{self, GedEvent};
use super::{hotplug, power_button};
use crate::devices::acpi_pm_registers::S5_SLEEP_TYPE;
use crate::layout::{COM1_IRQ, COM1_PORT, GED_IRQ, PCI_CONFIG_PORT, PCI_MMIO_END, PCI_MMIO_START};

/// The events the GED signals, each with the method its interrupt runs.
const GED_EVENTS: &[GedEvent] = &[
    GedEvent {
        irq: GED_IRQ,
        handler: hotplug::EVENT_HANDLER,
    },
    GedEvent {
        irq: power_button::POWER_BUTTON_IRQ,
        handler: power_button::EVENT_HANDLER,
    },
];

/// The DSDT's definition block body.
pub fn body() -> Vec<u8> {
    let s5_type = Package::new(vec![&S5_SLEEP_TYPE, &ZERO, &ZERO, &ZERO]);
    let mut out = encode(&[&Name::new("_S5_".into(), &s5_type)]);
    let devices = [
        pci0(),
        com1(),
        power_button::device(),
        ged::device(GED_EVENTS),
    ];
    out.extend(Scope::raw("\\_SB_".into(), devices.concat()));
    out
}

/// `Device(PCI0)`: the host bridge, its resources and its hotplug slots.
fn pci0() -> Vec<u8> {
    let hid = Name::new("_HID".into(), &EISAName::new("PNP0A03"));
    let uid = Name::new("_UID".into(), &ZERO);
    let seg = Name::new("_SEG".into(), &ZERO);
    let bbn = Name::new("_BBN".into(), &ZERO);
    let bus = AddressSpace::new_bus_number(0u16, 0u16);
    let config_ports = IO::new(PCI_CONFIG_PORT, PCI_CONFIG_PORT, 1, 8);
    // Word I/O ranges cover ISA and non-ISA addresses.
    let io_below = AddressSpace::new_io(0u16, PCI_CONFIG_PORT - 1, None);
    let io_above = AddressSpace::new_io(PCI_CONFIG_PORT + 8, 0xffffu16, None);
    // The MMIO window is 32-bit by construction (layout.rs).
    let mmio = AddressSpace::new_memory(
        AddressSpaceCacheable::NotCacheable,
        true,
        PCI_MMIO_START as u32,
        (PCI_MMIO_END - 1) as u32,
        None,
    );
    let resources = ResourceTemplate::new(vec![&bus, &config_ports, &io_below, &io_above, &mmio]);
    let crs = Name::new("_CRS".into(), &resources);
    let slots = Encoded(hotplug::pci0_body());
    encode(&[&Device::new(
        "PCI0".into(),
        vec![&hid, &uid, &seg, &bbn, &crs, &slots],
    )])
}

/// `Device(COM1)`: the first serial port's ports and interrupt.
fn com1() -> Vec<u8> {
    let hid = Name::new("_HID".into(), &EISAName::new("PNP0501"));
    let uid = Name::new("_UID".into(), &ZERO);
    let ports = IO::new(COM1_PORT, COM1_PORT, 1, 8);
    // Consumer, edge-triggered, active high, exclusive.
    let irq = Interrupt::new(true, true, false, false, COM1_IRQ);
    let crs = Name::new("_CRS".into(), &ResourceTemplate::new(vec![&ports, &irq]));
    encode(&[&Device::new("COM1".into(), vec![&hid, &uid, &crs])])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
        hay.windows(needle.len()).position(|w| w == needle)
    }

    #[test]
    fn body_declares_s5_and_the_host_bridge() {
        let b = body();
        assert!(b.starts_with(&[0x08, b'_', b'S', b'5', b'_', 0x12]));
        let hid = find(&b, b"_HID").unwrap();
        assert_eq!(b[hid + 4], 0x0c, "DWordConst");
        assert_eq!(b[hid + 5..hid + 9], 0x030a_d041u32.to_le_bytes());
        // The memory descriptor carries the MMIO window.
        let mem = find(&b, &[0x87, 23, 0]).unwrap();
        let window = |o: usize| u32::from_le_bytes(b[mem + o..mem + o + 4].try_into().unwrap());
        assert_eq!(window(10), 0xe000_0000);
        assert_eq!(window(14), 0xfebf_ffff);
        assert_eq!(window(22), 0x1ec0_0000);
        // The `\_SB` scope follows `_S5_`, and its PkgLength covers
        // exactly the rest of the body.
        let scope = 13;
        assert_eq!(b[scope], 0x10);
        let lead = b[scope + 1];
        let extra = usize::from(lead >> 6);
        let mut len = usize::from(lead & if extra == 0 { 0x3f } else { 0x0f });
        for i in 0..extra {
            len |= usize::from(b[scope + 2 + i]) << (4 + 8 * i);
        }
        assert_eq!(len, b.len() - scope - 1);
        assert!(find(&b, b"GED_").is_some(), "the hotplug event device");
        assert!(find(&b, b"PWRB").is_some(), "the power button");
    }
}
