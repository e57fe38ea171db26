//! The DSDT's AML: the `\_S5` sleep type (what a guest writes to the
//! sleep control register to power off), the PCI host bridge
//! `\_SB.PCI0` with the resources it decodes (`_CRS`): bus 0, the
//! configuration ports, the rest of the I/O space, and the 32-bit MMIO
//! window the BARs live in, plus its hotplug slots ([`super::hotplug`]);
//! the Generic Event Device that announces hotplug; and COM1 (`\_SB.COM1`, ports `0x3f8..0x400`,
//! GSI 4), since a hardware-reduced machine has no legacy IRQ table a
//! guest could assume it from.
//!
//! Enters as nothing but the layout constants; leaves as the table body
//! (the caller adds the header).

use super::aml;
use crate::layout::{COM1_IRQ, COM1_PORT, PCI_CONFIG_PORT, PCI_MMIO_END, PCI_MMIO_START};

/// The SLP_TYP value `\_S5` declares; the sleep control register powers
/// off when it sees it.
pub const S5_SLEEP_TYPE: u8 = 5;

/// The DSDT's definition block body.
pub fn body() -> Vec<u8> {
    let mut out = aml::name("_S5_", &aml::package(&[u64::from(S5_SLEEP_TYPE), 0, 0, 0]));
    let cfg_end = PCI_CONFIG_PORT + 8;
    // The MMIO window is 32-bit by construction (layout.rs).
    let mmio_min = PCI_MMIO_START as u32;
    let mmio_max = (PCI_MMIO_END - 1) as u32;
    let crs = aml::resource_template(&[
        aml::word_space(2, 0, 0, 0),
        aml::io_port(PCI_CONFIG_PORT, 8),
        // I/O type flags 3: the range covers ISA and non-ISA addresses.
        aml::word_space(1, 3, 0, PCI_CONFIG_PORT - 1),
        aml::word_space(1, 3, cfg_end, 0xffff),
        aml::dword_memory(mmio_min, mmio_max),
    ]);
    let hid = |id| aml::integer(aml::eisa_id(id).map_or(0, u64::from));
    let mut pci = aml::name("_HID", &hid("PNP0A03"));
    pci.extend(aml::name("_UID", &aml::integer(0)));
    pci.extend(aml::name("_SEG", &aml::integer(0)));
    pci.extend(aml::name("_BBN", &aml::integer(0)));
    pci.extend(aml::name("_CRS", &crs));
    let mut com1 = aml::name("_HID", &hid("PNP0501"));
    com1.extend(aml::name("_UID", &aml::integer(0)));
    com1.extend(aml::name(
        "_CRS",
        &aml::resource_template(&[aml::io_port(COM1_PORT, 8), aml::interrupt(COM1_IRQ)]),
    ));
    pci.extend(super::hotplug::pci0_body());
    let mut sb = aml::device("PCI0", &pci);
    sb.extend(aml::device("COM1", &com1));
    sb.extend(super::hotplug::ged());
    out.extend(aml::scope("\\_SB_", &sb));
    out
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
    }
}
