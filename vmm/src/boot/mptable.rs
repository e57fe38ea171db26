//! An Intel MultiProcessor Specification 1.4 table: one processor entry
//! per vCPU, the PCI and ISA buses, the IOAPIC, the ISA interrupt
//! assignments (IRQ 0 on IOAPIC pin 2, as KVM routes it) and the local
//! interrupts (LINT0 ExtINT, LINT1 NMI). Linux reads it when it finds no
//! ACPI (`acpi=off`); the ACPI tables in [`super::acpi`] describe the
//! same machine.
//!
//! Enters as the vCPU count; leaves as bytes written at [`MPTABLE_START`]
//! (floating pointer, then the configuration table), in the reserved
//! range of the memory map.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::error::BootError;
use crate::config::cpus::MAX_VCPUS;
use crate::layout::{IOAPIC_START, LAPIC_START, MPTABLE_START};

const BUS_PCI: u8 = 0;
const BUS_ISA: u8 = 1;
const APIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;

/// The byte that makes `bytes` sum to zero (mod 256) once added.
fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |a, b| a.wrapping_add(*b))
        .wrapping_neg()
}

/// Builds the floating pointer and configuration table for `cpus` vCPUs,
/// to be placed at `base`.
pub fn build(base: u64, cpus: u8) -> Result<Vec<u8>, BootError> {
    if cpus == 0 || cpus > MAX_VCPUS {
        return Err(BootError::TooManyCpus(cpus));
    }
    let ioapic_id = cpus;
    let mut entries: Vec<u8> = Vec::new();
    let mut count: u16 = 0;
    for id in 0..cpus {
        let flags = if id == 0 { 0x3 } else { 0x1 }; // enabled, BSP
        entries.extend_from_slice(&[0, id, APIC_VERSION, flags]);
        entries.extend_from_slice(&0x600u32.to_le_bytes()); // family 6
        entries.extend_from_slice(&0x201u32.to_le_bytes()); // FPU, APIC
        entries.extend_from_slice(&[0; 8]);
        count += 1;
    }
    for (id, name) in [(BUS_PCI, b"PCI   "), (BUS_ISA, b"ISA   ")] {
        entries.extend_from_slice(&[1, id]);
        entries.extend_from_slice(name);
        count += 1;
    }
    entries.extend_from_slice(&[2, ioapic_id, IOAPIC_VERSION, 1]);
    entries.extend_from_slice(&(IOAPIC_START as u32).to_le_bytes());
    count += 1;
    // ExtINT from the PIC on pin 0, then ISA IRQs 0..16.
    entries.extend_from_slice(&[3, 3, 0, 0, BUS_ISA, 0, ioapic_id, 0]);
    count += 1;
    for irq in 0u8..16 {
        if irq == 2 {
            continue; // the PIC cascade
        }
        let pin = if irq == 0 { 2 } else { irq };
        entries.extend_from_slice(&[3, 0, 0, 0, BUS_ISA, irq, ioapic_id, pin]);
        count += 1;
    }
    entries.extend_from_slice(&[4, 3, 0, 0, BUS_ISA, 0, 0xff, 0]);
    entries.extend_from_slice(&[4, 1, 0, 0, BUS_ISA, 0, 0xff, 1]);
    count += 2;

    let table_addr = base + 16;
    let mut table = Vec::with_capacity(44 + entries.len());
    table.extend_from_slice(b"PCMP");
    let len = u16::try_from(44 + entries.len()).map_err(|_| BootError::TooManyCpus(cpus))?;
    table.extend_from_slice(&len.to_le_bytes());
    table.push(4); // spec revision 1.4
    table.push(0); // checksum, below
    table.extend_from_slice(b"CLOUDHV ");
    table.extend_from_slice(b"VIRTIO-BLK  ");
    table.extend_from_slice(&0u32.to_le_bytes());
    table.extend_from_slice(&0u16.to_le_bytes());
    table.extend_from_slice(&count.to_le_bytes());
    table.extend_from_slice(&(LAPIC_START as u32).to_le_bytes());
    table.extend_from_slice(&0u16.to_le_bytes());
    table.extend_from_slice(&[0, 0]);
    table.extend_from_slice(&entries);
    table[7] = checksum(&table);

    let mut fp = Vec::with_capacity(16);
    fp.extend_from_slice(b"_MP_");
    fp.extend_from_slice(&(table_addr as u32).to_le_bytes());
    fp.extend_from_slice(&[1, 4, 0, 0, 0, 0, 0, 0]);
    fp[10] = checksum(&fp);
    fp.extend_from_slice(&table);
    Ok(fp)
}

pub fn write_mptable(mem: &GuestMemoryMmap, cpus: u8) -> Result<(), BootError> {
    let bytes = build(MPTABLE_START, cpus)?;
    mem.write_slice(&bytes, GuestAddress(MPTABLE_START))
        .map_err(|source| BootError::WriteGuest {
            what: "MP table",
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_and_counts() {
        let b = build(0x9fc00, 4).unwrap();
        assert_eq!(&b[0..4], b"_MP_");
        assert_eq!(b[..16].iter().fold(0u8, |a, x| a.wrapping_add(*x)), 0);
        let table = &b[16..];
        assert_eq!(&table[0..4], b"PCMP");
        let len = u16::from_le_bytes([table[4], table[5]]) as usize;
        assert_eq!(len, table.len());
        assert_eq!(table.iter().fold(0u8, |a, x| a.wrapping_add(*x)), 0);
        let count = u16::from_le_bytes([table[34], table[35]]);
        // 4 CPUs, 2 buses, 1 IOAPIC, 1 ExtINT + 15 ISA IRQs, 2 local.
        assert_eq!(count, 4 + 2 + 1 + 16 + 2);
        assert_eq!(table[44 + 20 + 1], 1, "second processor has APIC id 1");
        assert!(build(0, 0).is_err());
    }
}
