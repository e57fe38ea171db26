//! The fixed-layout ACPI tables, each built with `acpi_tables`: the RSDP,
//! the XSDT, the FADT (hardware-reduced, with a reset register and sleep
//! control/status registers in I/O space) and the DSDT around
//! [`super::dsdt`]'s AML. The MADT is [`super::madt`]'s.
//!
//! Each builder returns the table's bytes with its checksum set; the
//! caller decides the addresses.

use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;

use super::encoded::encode;
use crate::devices::acpi_pm_registers::{
    RESET_OFFSET, RESET_VALUE, SLEEP_CONTROL_OFFSET, SLEEP_STATUS_OFFSET,
};
use crate::layout::ACPI_PM_PORT;

/// Who made the tables, in every table header.
pub const OEM_ID: [u8; 6] = *b"CHVMM ";
pub const OEM_TABLE_ID: [u8; 8] = *b"CHVMMKVM";
pub const OEM_REVISION: u32 = 1;

pub const RSDP_SIZE: usize = std::mem::size_of::<Rsdp>();
pub const FADT_SIZE: usize = std::mem::size_of::<FADTBuilder>();
/// A system description table's common header.
const HEADER_SIZE: usize = 36;

/// Bytes of an XSDT listing `entries` tables.
pub const fn xsdt_size(entries: usize) -> usize {
    HEADER_SIZE + 8 * entries
}

/// The RSDP (revision 2) pointing at the XSDT.
pub fn rsdp(xsdt: u64) -> Vec<u8> {
    encode(&[&Rsdp::new(OEM_ID, xsdt)])
}

/// The XSDT listing `tables`.
pub fn xsdt(tables: &[u64]) -> Vec<u8> {
    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    for &t in tables {
        xsdt.add_entry(t);
    }
    encode(&[&xsdt])
}

/// A Generic Address Structure for one byte at I/O port `port`.
fn io_byte_register(port: u16) -> GAS {
    GAS::new(
        AddressSpace::SystemIo,
        8,
        0,
        AccessSize::ByteAccess,
        port.into(),
    )
}

/// The FADT (revision 6.5), hardware-reduced, pointing at the DSDT: the
/// reset register is supported, and the sleep registers replace PM1
/// control (no PM1 blocks, SCI, PM timer or GPEs).
pub fn fadt(dsdt_at: u64) -> Vec<u8> {
    let mut fadt = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .flag(Flags::ResetRegSup)
        .flag(Flags::HwReducedAcpi);
    // The tables sit below 1 MiB, so the 32-bit DSDT field carries the
    // same address as X_DSDT (which ACPI 2.0+ readers prefer).
    fadt.dsdt = (dsdt_at as u32).into();
    fadt.x_dsdt = dsdt_at.into();
    fadt.reset_reg = io_byte_register(ACPI_PM_PORT + RESET_OFFSET);
    fadt.reset_value = RESET_VALUE;
    fadt.sleep_control_reg = io_byte_register(ACPI_PM_PORT + SLEEP_CONTROL_OFFSET);
    fadt.sleep_status_reg = io_byte_register(ACPI_PM_PORT + SLEEP_STATUS_OFFSET);
    fadt.hypervisor_vendor_identity = u64::from_le_bytes(OEM_TABLE_ID).into();
    encode(&[&fadt.finalize()])
}

/// The DSDT: header plus [`super::dsdt::body`]. Revision 2: integers
/// are 64-bit.
pub fn dsdt() -> Vec<u8> {
    let mut table = Sdt::new(
        *b"DSDT",
        HEADER_SIZE as u32,
        2,
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
    );
    table.append_slice(&super::dsdt::body());
    table.as_slice().to_vec()
}
