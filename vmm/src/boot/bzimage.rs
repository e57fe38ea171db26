//! The 64-bit Linux boot protocol for a bzImage: the protected-mode
//! kernel is loaded at 1 MiB, the zero page (`boot_params`) gets the
//! kernel's setup header, command line, initramfs and e820 table, and the
//! vCPU enters at `startup_64` (load address + 0x200) in long mode with
//! identity-mapped page tables (first 1 GiB, 2 MiB pages) and a GDT with
//! `__BOOT_CS` = 0x10, `__BOOT_DS` = 0x18.
//!
//! Untested against a real Linux boot on this project's machines (guest
//! code is emulated too slowly); see docs/linux-guests.md.

use std::path::Path;

use linux_loader::bootparam::boot_params;
use linux_loader::loader::bzimage::BzImage;
use linux_loader::loader::KernelLoader;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::e820::memory_map;
use super::entry::BootEntry;
use super::error::BootError;
use super::files::{load_initramfs, open_file};
use crate::layout::{GDT_START, HIGH_RAM_START, PDPT_START, PD_START, PML4_START, ZERO_PAGE_START};

/// The GDT the boot protocol asks for: null, null, code64, data, TSS.
pub const GDT: [u64; 5] = [
    0,
    0,
    0x00af_9a00_0000_ffff,
    0x00cf_9200_0000_ffff,
    0x0080_8900_0000_0067,
];

const BOOT_FLAG: u16 = 0xaa55;
const HDR_MAGIC: u32 = 0x5372_6448;
const LOADER_TYPE_UNDEFINED: u8 = 0xff;
/// `loadflags` bit 0: the kernel is loaded high.
const LOADED_HIGH: u8 = 1;
const MAX_E820: usize = 128;

fn write<T: AsRef<[u8]>>(
    mem: &GuestMemoryMmap,
    what: &'static str,
    addr: u64,
    bytes: T,
) -> Result<(), BootError> {
    mem.write_slice(bytes.as_ref(), GuestAddress(addr))
        .map_err(|source| BootError::WriteGuest { what, source })
}

/// Writes the GDT and the identity-mapped page tables.
pub fn write_long_mode_tables(mem: &GuestMemoryMmap) -> Result<(), BootError> {
    let gdt: Vec<u8> = GDT.iter().flat_map(|e| e.to_le_bytes()).collect();
    write(mem, "GDT", GDT_START, gdt)?;
    write(mem, "PML4", PML4_START, (PDPT_START | 0x3).to_le_bytes())?;
    write(mem, "PDPT", PDPT_START, (PD_START | 0x3).to_le_bytes())?;
    let pd: Vec<u8> = (0..512u64)
        .flat_map(|i| ((i << 21) | 0x83).to_le_bytes())
        .collect();
    write(mem, "page directory", PD_START, pd)
}

pub fn load(
    mem: &GuestMemoryMmap,
    kernel: &Path,
    initramfs: Option<&Path>,
    cmdline_addr: u64,
    cmdline_len: usize,
    ram_size: u64,
) -> Result<BootEntry, BootError> {
    let mut f = open_file(kernel)?;
    let loaded = BzImage::load(mem, None, &mut f, Some(GuestAddress(HIGH_RAM_START))).map_err(
        |e| match e {
            linux_loader::loader::Error::Bzimage(_) => BootError::UnknownKernelFormat {
                path: kernel.into(),
            },
            source => BootError::LoadKernel {
                path: kernel.into(),
                source,
            },
        },
    )?;
    let Some(mut hdr) = loaded.setup_header else {
        return Err(BootError::UnknownKernelFormat {
            path: kernel.into(),
        });
    };
    hdr.type_of_loader = LOADER_TYPE_UNDEFINED;
    hdr.boot_flag = BOOT_FLAG;
    hdr.header = HDR_MAGIC;
    hdr.loadflags |= LOADED_HIGH;
    // The command line sits at CMDLINE_START, below 4 GiB.
    hdr.cmd_line_ptr = cmdline_addr as u32;
    // `cmdline_size` is the kernel's limit (protocol 2.06+); 0 means an
    // old kernel with the historical 255-byte limit.
    let limit = if hdr.cmdline_size == 0 {
        255
    } else {
        hdr.cmdline_size as usize
    };
    if cmdline_len > limit {
        return Err(BootError::CmdlineTooLong {
            len: cmdline_len,
            max: limit,
        });
    }
    if let Some(p) = initramfs {
        let i = load_initramfs(mem, p, ram_size, loaded.kernel_end)?;
        // load_initramfs places it below LOW_RAM_END (< 4 GiB).
        hdr.ramdisk_image = i.addr as u32;
        hdr.ramdisk_size = i.size as u32;
    }
    let mut params = boot_params {
        hdr,
        ..Default::default()
    };
    let map = memory_map(ram_size);
    for (slot, e) in params.e820_table.iter_mut().zip(map.iter().take(MAX_E820)) {
        slot.addr = e.addr;
        slot.size = e.size;
        slot.r#type = e.kind;
    }
    params.e820_entries = map.len().min(MAX_E820) as u8;
    // SAFETY: boot_params is a plain-old-data C struct (integers and
    // arrays of integers, no padding-sensitive invariants); viewing it as
    // bytes for the duration of this borrow is sound.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (&params as *const boot_params).cast::<u8>(),
            std::mem::size_of::<boot_params>(),
        )
    };
    write(mem, "zero page", ZERO_PAGE_START, bytes)?;
    write_long_mode_tables(mem)?;
    Ok(BootEntry::Linux64 {
        entry: loaded.kernel_load.0 + 0x200,
        boot_params: ZERO_PAGE_START,
    })
}
