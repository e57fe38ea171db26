//! The PVH boot protocol: an ELF kernel whose XEN_ELFNOTE_PHYS32_ENTRY
//! note names a 32-bit entry point, entered in flat protected mode with
//! `%ebx` pointing at an `hvm_start_info` (version 1, with a memory map).
//!
//! Enters as the kernel file, the command line's guest address and an
//! optional initramfs; leaves as a [`BootEntry::Pvh`]. The start info,
//! memmap and module list are written at [`PVH_INFO_START`].

use std::path::Path;

use linux_loader::loader::elf::{Elf, PvhBootCapability};
use linux_loader::loader::KernelLoader;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::e820::memory_map;
use super::entry::BootEntry;
use super::error::BootError;
use super::files::{load_initramfs, open_file};
use crate::layout::{HIGH_RAM_START, PVH_INFO_START};

const HVM_START_MAGIC: u32 = 0x336e_c578;
const START_INFO_SIZE: u64 = 56;
const MEMMAP_ENTRY_SIZE: u64 = 24;
const MODLIST_ENTRY_SIZE: u64 = 32;

/// Serializes the start info, memmap and module list (little endian, as
/// laid out in Xen's `arch-x86/hvm/start_info.h`).
pub fn start_info_bytes(
    base: u64,
    cmdline_addr: u64,
    ram_size: u64,
    initramfs: Option<(u64, u64)>,
    rsdp: u64,
) -> Vec<u8> {
    let map = memory_map(ram_size);
    let memmap_addr = base + START_INFO_SIZE;
    let modlist_addr = memmap_addr + MEMMAP_ENTRY_SIZE * map.len() as u64;
    let mut b = Vec::new();
    b.extend_from_slice(&HVM_START_MAGIC.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes()); // version
    b.extend_from_slice(&0u32.to_le_bytes()); // flags
    b.extend_from_slice(&u32::from(initramfs.is_some()).to_le_bytes());
    b.extend_from_slice(&(if initramfs.is_some() { modlist_addr } else { 0 }).to_le_bytes());
    b.extend_from_slice(&cmdline_addr.to_le_bytes());
    b.extend_from_slice(&rsdp.to_le_bytes());
    b.extend_from_slice(&memmap_addr.to_le_bytes());
    b.extend_from_slice(&(map.len() as u32).to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    for e in &map {
        b.extend_from_slice(&e.addr.to_le_bytes());
        b.extend_from_slice(&e.size.to_le_bytes());
        b.extend_from_slice(&e.kind.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
    }
    if let Some((addr, size)) = initramfs {
        b.extend_from_slice(&addr.to_le_bytes());
        b.extend_from_slice(&size.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
    }
    debug_assert_eq!(
        b.len() as u64,
        START_INFO_SIZE
            + MEMMAP_ENTRY_SIZE * map.len() as u64
            + if initramfs.is_some() {
                MODLIST_ENTRY_SIZE
            } else {
                0
            }
    );
    b
}

pub fn load(
    mem: &GuestMemoryMmap,
    kernel: &Path,
    initramfs: Option<&Path>,
    cmdline_addr: u64,
    ram_size: u64,
    rsdp: u64,
) -> Result<BootEntry, BootError> {
    let mut f = open_file(kernel)?;
    let loaded =
        Elf::load(mem, None, &mut f, Some(GuestAddress(HIGH_RAM_START))).map_err(|source| {
            BootError::LoadKernel {
                path: kernel.into(),
                source,
            }
        })?;
    let PvhBootCapability::PvhEntryPresent(entry) = loaded.pvh_boot_cap else {
        return Err(BootError::NoPvhNote {
            path: kernel.into(),
        });
    };
    let initrd = match initramfs {
        Some(p) => {
            let i = load_initramfs(mem, p, ram_size, loaded.kernel_end)?;
            Some((i.addr, i.size))
        }
        None => None,
    };
    let info = start_info_bytes(PVH_INFO_START, cmdline_addr, ram_size, initrd, rsdp);
    mem.write_slice(&info, GuestAddress(PVH_INFO_START))
        .map_err(|source| BootError::WriteGuest {
            what: "PVH start info",
            source,
        })?;
    Ok(BootEntry::Pvh {
        entry: entry.0,
        start_info: PVH_INFO_START,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], o: usize) -> u64 {
        u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
    }

    #[test]
    fn start_info_layout() {
        let b = start_info_bytes(
            0x6000,
            0x20000,
            256 << 20,
            Some((0x800_0000, 0x1234)),
            0xe0000,
        );
        assert_eq!(u32_at(&b, 0), HVM_START_MAGIC);
        assert_eq!(u32_at(&b, 4), 1);
        assert_eq!(u32_at(&b, 12), 1, "one module");
        assert_eq!(u64_at(&b, 24), 0x20000);
        assert_eq!(u64_at(&b, 40), 0x6000 + 56, "memmap follows");
        let n = u32_at(&b, 48) as usize;
        assert_eq!(n, 3);
        let modlist = u64_at(&b, 16);
        assert_eq!(modlist, 0x6000 + 56 + 24 * 3);
        let m = (modlist - 0x6000) as usize;
        assert_eq!((u64_at(&b, m), u64_at(&b, m + 8)), (0x800_0000, 0x1234));
        // Third memmap entry is RAM from 1 MiB.
        let e = 56 + 2 * 24;
        assert_eq!((u64_at(&b, e), u32_at(&b, e + 16)), (0x10_0000, 1));
    }
}
