//! ACPI tables for guests that look for them (Linux prefers ACPI over
//! the MP table): RSDP, XSDT, FADT, MADT and a DSDT, every table and all
//! AML built with rust-vmm's `acpi_tables` ([`tables`], [`madt`],
//! [`dsdt`], [`hotplug`], [`ged`]). The machine is "hardware-reduced": no
//! PM1 event/control blocks, SCI or PM timer; power-off and reset go
//! through the FADT's sleep control and reset registers, which
//! [`crate::devices::acpi_pm`] implements.
//!
//! Enters as the vCPU count and guest memory; leaves as the tables
//! written at [`ACPI_START`] (inside the 0xE0000..0x100000 range a BIOS
//! would search for the RSDP, reserved in the memory map) and the RSDP's
//! address for PVH's `rsdp_paddr`.

mod dsdt;
mod encoded;
mod ged;
mod hotplug;
mod madt;
mod power_button;
mod tables;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::boot::error::BootError;
use crate::layout::{ACPI_END, ACPI_START};

/// Every table with its guest address, RSDP first, laid out from `base`
/// with 16-byte alignment.
pub fn build(base: u64, cpus: u8) -> Vec<(u64, Vec<u8>)> {
    let align = |a: u64| (a + 15) & !15;
    let xsdt_at = align(base + tables::RSDP_SIZE as u64);
    // The XSDT lists the FADT and the MADT (the FADT points at the DSDT).
    let fadt_at = align(xsdt_at + tables::xsdt_size(2) as u64);
    let madt_at = align(fadt_at + tables::FADT_SIZE as u64);
    let madt = madt::madt(cpus);
    let dsdt_at = align(madt_at + madt.len() as u64);
    vec![
        (base, tables::rsdp(xsdt_at)),
        (xsdt_at, tables::xsdt(&[fadt_at, madt_at])),
        (fadt_at, tables::fadt(dsdt_at)),
        (madt_at, madt),
        (dsdt_at, tables::dsdt()),
    ]
}

/// Writes the tables into guest memory; returns the RSDP's address.
pub fn write_tables(mem: &GuestMemoryMmap, cpus: u8) -> Result<u64, BootError> {
    for (addr, bytes) in build(ACPI_START, cpus) {
        if addr + bytes.len() as u64 > ACPI_END {
            return Err(BootError::AcpiTooLarge);
        }
        mem.write_slice(&bytes, GuestAddress(addr))
            .map_err(|source| BootError::WriteGuest {
                what: "ACPI tables",
                source,
            })?;
    }
    Ok(ACPI_START)
}

#[cfg(test)]
mod tests;
