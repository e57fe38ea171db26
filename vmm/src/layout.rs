//! The guest physical address map. Everything the VMM places in guest
//! memory or decodes as MMIO has its address here.
//!
//! ```text
//! 0x0000_0500  GDT (64-bit boot)
//! 0x0000_6000  PVH hvm_start_info, memmap, module list
//! 0x0000_7000  zero page (Linux boot_params)
//! 0x0000_9000  page tables (PML4, PDPT, PD) for 64-bit boot
//! 0x0002_0000  kernel command line (up to CMDLINE_MAX)
//! 0x0009_fc00  MP table (last KiB of base memory), reserved to 1 MiB
//! 0x000e_0000  ACPI tables (RSDP first), up to 0x10_0000
//! 0x0010_0000  kernel (ELF at its physical addresses)
//! ...          RAM up to min(size, 3 GiB), initramfs at its top
//! 0xe000_0000  32-bit PCI MMIO window (BARs) up to 0xfec0_0000
//! 0xfec0_0000  IOAPIC
//! 0xfee0_0000  LAPIC
//! 4 GiB        RAM above 3 GiB, if any
//! ```

pub const GDT_START: u64 = 0x500;
pub const PVH_INFO_START: u64 = 0x6000;
pub const ZERO_PAGE_START: u64 = 0x7000;
pub const PML4_START: u64 = 0x9000;
pub const PDPT_START: u64 = 0xa000;
pub const PD_START: u64 = 0xb000;
pub const CMDLINE_START: u64 = 0x20000;
pub const CMDLINE_MAX: usize = 0x10000;
pub const MPTABLE_START: u64 = 0x9fc00;
pub const EBDA_START: u64 = 0x9fc00;
pub const ACPI_START: u64 = 0xe0000;
pub const ACPI_END: u64 = 0x10_0000;
pub const HIGH_RAM_START: u64 = 0x10_0000;
pub const KERNEL_START: u64 = HIGH_RAM_START;
/// Low RAM ends here at most; the rest goes above 4 GiB.
pub const LOW_RAM_END: u64 = 0xc000_0000;
pub const PCI_MMIO_START: u64 = 0xe000_0000;
pub const PCI_MMIO_END: u64 = 0xfec0_0000;
pub const IOAPIC_START: u64 = 0xfec0_0000;
pub const LAPIC_START: u64 = 0xfee0_0000;
pub const RAM_64BIT_START: u64 = 1 << 32;

// Legacy I/O ports and their IRQs.
pub const COM1_PORT: u16 = 0x3f8;
pub const COM1_IRQ: u32 = 4;
pub const I8042_PORT: u16 = 0x60;
pub const CMOS_PORT: u16 = 0x70;
pub const PCI_CONFIG_PORT: u16 = 0xcf8;
/// ACPI sleep control (+0), sleep status (+1) and reset (+2) registers.
pub const ACPI_PM_PORT: u16 = 0x600;
/// The PCI hotplug registers (devices/pci_hotplug.rs): slots added (+0),
/// slots to remove (+4), eject (+8).
pub const PCI_HOTPLUG_PORT: u16 = 0x610;
/// The Generic Event Device's event register (devices/ged.rs): bit 0,
/// the power button was pressed.
pub const GED_EVENT_PORT: u16 = 0x620;
/// The IOAPIC pin of the ACPI Generic Event Device that announces PCI
/// hotplug events.
pub const GED_IRQ: u32 = 5;
/// The GED's second pin: the power button (boot/acpi/power_button.rs).
pub const POWER_BUTTON_IRQ: u32 = 6;
