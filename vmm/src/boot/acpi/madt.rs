//! The MADT: one local APIC per vCPU (APIC IDs 0..cpus), the IOAPIC
//! with ID `cpus`, ISA IRQ 0 routed to GSI 2 and the LINT1 NMI, as in
//! the MP table.
//!
//! `acpi_tables` gives the table ([`Sdt`]) and the local APIC and IOAPIC
//! entries. Its own `madt::MADT` cannot say PC-AT compatible (revision 1,
//! flags 0) and has no interrupt source override or local APIC NMI entry
//! (x86's), so the MADT's two header fields are written into the `Sdt`
//! and those two entries encode themselves through the crate's `Aml`
//! sink here.

use acpi_tables::madt::{EnabledStatus, IoApic, ProcessorLocalApic};
use acpi_tables::sdt::Sdt;
use acpi_tables::{Aml, AmlSink};

use super::encoded::encode;
use super::tables::{OEM_ID, OEM_REVISION, OEM_TABLE_ID};
use crate::layout::{IOAPIC_START, LAPIC_START};

const MADT_REVISION: u8 = 5;
/// The header, local APIC address and flags.
const MADT_HEADER_SIZE: u32 = 44;
/// Flags: PCAT_COMPAT, dual 8259s present.
const PCAT_COMPAT: u32 = 1;

/// Interrupt Source Override (ACPI 6.5, 5.2.12.5): ISA IRQ `source` is
/// GSI `gsi`; flags 0 (conforming polarity and trigger).
struct InterruptSourceOverride {
    source: u8,
    gsi: u32,
}

impl Aml for InterruptSourceOverride {
    fn to_aml_bytes(&self, sink: &mut dyn AmlSink) {
        sink.byte(2); // type
        sink.byte(10); // length
        sink.byte(0); // bus: ISA
        sink.byte(self.source);
        sink.dword(self.gsi);
        sink.word(0);
    }
}

/// Local APIC NMI (ACPI 6.5, 5.2.12.7) on LINT `lint` of processor
/// `uid` (0xff: all); flags 0 (conforming).
struct LocalApicNmi {
    uid: u8,
    lint: u8,
}

impl Aml for LocalApicNmi {
    fn to_aml_bytes(&self, sink: &mut dyn AmlSink) {
        sink.byte(4); // type
        sink.byte(6); // length
        sink.byte(self.uid);
        sink.word(0);
        sink.byte(self.lint);
    }
}

/// The MADT for `cpus` vCPUs.
pub fn madt(cpus: u8) -> Vec<u8> {
    let mut table = Sdt::new(
        *b"APIC",
        MADT_HEADER_SIZE,
        MADT_REVISION,
        OEM_ID,
        OEM_TABLE_ID,
        OEM_REVISION,
    );
    table.write_u32(36, LAPIC_START as u32);
    table.write_u32(40, PCAT_COMPAT);
    let lapics: Vec<ProcessorLocalApic> = (0..cpus)
        .map(|id| ProcessorLocalApic::new(id, id, EnabledStatus::Enabled))
        .collect();
    let mut entries: Vec<&dyn Aml> = lapics.iter().map(|l| l as &dyn Aml).collect();
    let ioapic = IoApic::new(cpus, IOAPIC_START as u32, 0);
    // KVM wires the PIT (ISA IRQ 0) to GSI 2.
    let timer = InterruptSourceOverride { source: 0, gsi: 2 };
    let nmi = LocalApicNmi { uid: 0xff, lint: 1 };
    entries.extend([&ioapic as &dyn Aml, &timer, &nmi]);
    table.append_slice(&encode(&entries));
    table.as_slice().to_vec()
}
