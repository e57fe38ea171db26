//! The fixed-layout ACPI tables: RSDP, XSDT, FADT (hardware-reduced, with
//! a reset register and sleep control/status registers in I/O space) and
//! MADT (one local APIC per vCPU, the IOAPIC, the IRQ 0 override and the
//! LINT1 NMI, matching the MP table).
//!
//! Each builder returns the table's bytes with its checksum set; the
//! caller decides the addresses.

use super::{checksum, sdt_header};
use crate::devices::acpi_pm::{
    RESET_OFFSET, RESET_VALUE, SLEEP_CONTROL_OFFSET, SLEEP_STATUS_OFFSET,
};
use crate::layout::{ACPI_PM_PORT, IOAPIC_START, LAPIC_START};

pub const RSDP_SIZE: usize = 36;
pub const FADT_SIZE: usize = 276;

const FADT_REVISION: u8 = 6;
const FADT_MINOR_VERSION: u8 = 5;
/// FADT flags: the reset register is supported (bit 10) and the machine
/// is hardware-reduced (bit 20: no PM1 blocks, SCI, PM timer or GPEs; the
/// sleep registers below replace PM1 control).
const FADT_FLAGS: u32 = (1 << 10) | (1 << 20);

/// The RSDP (revision 2) pointing at the XSDT.
pub fn rsdp(xsdt: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(RSDP_SIZE);
    b.extend_from_slice(b"RSD PTR ");
    b.push(0); // checksum of the first 20 bytes
    b.extend_from_slice(super::OEM_ID);
    b.push(2); // revision: ACPI 2.0+
    b.extend_from_slice(&0u32.to_le_bytes()); // no RSDT
    b.extend_from_slice(&(RSDP_SIZE as u32).to_le_bytes());
    b.extend_from_slice(&xsdt.to_le_bytes());
    b.push(0); // extended checksum
    b.extend_from_slice(&[0; 3]);
    b[8] = checksum(&b[..20]);
    b[32] = checksum(&b);
    b
}

/// The XSDT listing `tables`.
pub fn xsdt(tables: &[u64]) -> Vec<u8> {
    let mut b = sdt_header(b"XSDT", 1, 36 + 8 * tables.len());
    for t in tables {
        b.extend_from_slice(&t.to_le_bytes());
    }
    b[9] = checksum(&b);
    b
}

/// A Generic Address Structure for one byte at I/O port `port`.
fn io_byte_register(port: u16) -> [u8; 12] {
    let mut g = [0u8; 12];
    g[0] = 1; // system I/O space
    g[1] = 8; // bit width
    g[3] = 1; // byte access
    g[4..6].copy_from_slice(&port.to_le_bytes());
    g
}

/// The FADT, hardware-reduced, pointing at the DSDT.
pub fn fadt(dsdt: u64) -> Vec<u8> {
    let mut b = sdt_header(b"FACP", FADT_REVISION, FADT_SIZE);
    b.resize(FADT_SIZE, 0);
    // The tables sit below 1 MiB, so the 32-bit DSDT field can carry
    // the same address as X_DSDT (which ACPI 2.0+ readers prefer).
    b[40..44].copy_from_slice(&(dsdt as u32).to_le_bytes());
    b[112..116].copy_from_slice(&FADT_FLAGS.to_le_bytes());
    b[116..128].copy_from_slice(&io_byte_register(ACPI_PM_PORT + RESET_OFFSET));
    b[128] = RESET_VALUE;
    b[131] = FADT_MINOR_VERSION;
    b[140..148].copy_from_slice(&dsdt.to_le_bytes());
    b[244..256].copy_from_slice(&io_byte_register(ACPI_PM_PORT + SLEEP_CONTROL_OFFSET));
    b[256..268].copy_from_slice(&io_byte_register(ACPI_PM_PORT + SLEEP_STATUS_OFFSET));
    b[268..276].copy_from_slice(b"CHVMMKVM");
    b[9] = checksum(&b);
    b
}

/// The MADT for `cpus` vCPUs (APIC IDs 0..cpus) and the IOAPIC with ID
/// `cpus`, as in the MP table.
pub fn madt(cpus: u8) -> Vec<u8> {
    let mut b = sdt_header(b"APIC", 5, 44);
    b.extend_from_slice(&(LAPIC_START as u32).to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes()); // PCAT_COMPAT: 8259s present
    for id in 0..cpus {
        // Processor Local APIC: UID, APIC ID, enabled.
        b.extend_from_slice(&[0, 8, id, id]);
        b.extend_from_slice(&1u32.to_le_bytes());
    }
    // I/O APIC: ID, reserved, address, GSI base 0.
    b.extend_from_slice(&[1, 12, cpus, 0]);
    b.extend_from_slice(&(IOAPIC_START as u32).to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    // Interrupt source override: ISA IRQ 0 is GSI 2, as KVM wires it.
    b.extend_from_slice(&[2, 10, 0, 0]);
    b.extend_from_slice(&2u32.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    // Local APIC NMI on LINT1 of every processor (UID 0xff).
    b.extend_from_slice(&[4, 6, 0xff, 0, 0, 1]);
    let len = b.len() as u32;
    b[4..8].copy_from_slice(&len.to_le_bytes());
    b[9] = checksum(&b);
    b
}
