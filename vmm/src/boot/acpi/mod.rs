//! ACPI tables for guests that look for them (Linux prefers ACPI over
//! the MP table): RSDP, XSDT, FADT, MADT and a DSDT. The machine is
//! "hardware-reduced": no PM1 event/control blocks, SCI or PM timer;
//! power-off and reset go through the FADT's sleep control and reset
//! registers, which [`crate::devices::acpi_pm`] implements.
//!
//! Enters as the vCPU count and guest memory; leaves as the tables
//! written at [`ACPI_START`] (inside the 0xE0000..0x100000 range a BIOS
//! would search for the RSDP, reserved in the memory map) and the RSDP's
//! address for PVH's `rsdp_paddr`.

mod aml;
pub mod dsdt;
mod hotplug;
mod tables;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::BootError;
use crate::layout::{ACPI_END, ACPI_START};

const OEM_ID: &[u8; 6] = b"CHVMM ";
const OEM_TABLE_ID: &[u8; 8] = b"CHVMMKVM";
const CREATOR_ID: &[u8; 4] = b"CHVM";

/// The byte that makes `bytes` sum to zero (mod 256) once added.
pub fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |a, b| a.wrapping_add(*b))
        .wrapping_neg()
}

/// A 36-byte system description table header for a table of `len`
/// bytes; the checksum (byte 9) is left 0 for the caller.
fn sdt_header(signature: &[u8; 4], revision: u8, len: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(signature);
    // Our tables are a few hundred bytes.
    b.extend_from_slice(&(len as u32).to_le_bytes());
    b.push(revision);
    b.push(0);
    b.extend_from_slice(OEM_ID);
    b.extend_from_slice(OEM_TABLE_ID);
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(CREATOR_ID);
    b.extend_from_slice(&1u32.to_le_bytes());
    b
}

/// The DSDT: header plus AML.
fn dsdt() -> Vec<u8> {
    let body = dsdt::body();
    // Revision 2: integers are 64-bit.
    let mut b = sdt_header(b"DSDT", 2, 36 + body.len());
    b.extend(body);
    b[9] = checksum(&b);
    b
}

/// Every table with its guest address, RSDP first, laid out from `base`
/// with 16-byte alignment.
pub fn build(base: u64, cpus: u8) -> Vec<(u64, Vec<u8>)> {
    let align = |a: u64| (a + 15) & !15;
    let xsdt_at = align(base + tables::RSDP_SIZE as u64);
    // XSDT with two entries: 36 + 16 bytes.
    let fadt_at = align(xsdt_at + 36 + 16);
    let madt_at = align(fadt_at + tables::FADT_SIZE as u64);
    let madt = tables::madt(cpus);
    let dsdt_at = align(madt_at + madt.len() as u64);
    vec![
        (base, tables::rsdp(xsdt_at)),
        (xsdt_at, tables::xsdt(&[fadt_at, madt_at])),
        (fadt_at, tables::fadt(dsdt_at)),
        (madt_at, madt),
        (dsdt_at, dsdt()),
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
