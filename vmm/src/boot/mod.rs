//! Loading the guest: the kernel (ELF with a PVH note, or bzImage), the
//! initramfs and command line, and the boot information each protocol
//! expects (PVH start info or the Linux zero page, both with a memory
//! map), plus the MP table and the ACPI tables describing CPUs, the
//! IOAPIC, the PCI host bridge and the power-off and reset registers.
//!
//! Enters as file paths and the guest memory; leaves as a [`BootEntry`]
//! telling the vCPUs how to start.

pub mod acpi;
pub mod bzimage;
pub mod e820;
pub mod entry;
pub mod error;
pub mod files;
pub mod mptable;
pub mod pvh;

use std::io::Read;
use std::path::Path;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::layout::{CMDLINE_MAX, CMDLINE_START};
use entry::BootEntry;
use error::BootError;
use files::open_file;

/// Writes the command line (NUL-terminated) at [`CMDLINE_START`].
pub fn write_cmdline(mem: &GuestMemoryMmap, cmdline: &str) -> Result<u64, BootError> {
    if cmdline.as_bytes().contains(&0) {
        return Err(BootError::CmdlineNul);
    }
    let len = cmdline.len() + 1;
    if len > CMDLINE_MAX {
        return Err(BootError::CmdlineTooLong {
            len,
            max: CMDLINE_MAX,
        });
    }
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(cmdline.as_bytes());
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_START))
        .map_err(|source| BootError::WriteGuest {
            what: "command line",
            source,
        })?;
    Ok(CMDLINE_START)
}

/// Loads the kernel and writes the boot information for its protocol.
pub fn load_kernel(
    mem: &GuestMemoryMmap,
    kernel: &Path,
    initramfs: Option<&Path>,
    cmdline: &str,
    ram_size: u64,
    cpus: u8,
) -> Result<BootEntry, BootError> {
    let mut f = open_file(kernel)?;
    let mut magic = [0u8; 4];
    f.read_exact(&mut magic).map_err(|source| BootError::Read {
        path: kernel.into(),
        source,
    })?;
    mptable::write_mptable(mem, cpus)?;
    // bzImage kernels find the RSDP by scanning 0xE0000..0x100000.
    let rsdp = acpi::write_tables(mem, cpus)?;
    let cmdline_addr = write_cmdline(mem, cmdline)?;
    if magic == *b"\x7fELF" {
        pvh::load(mem, kernel, initramfs, cmdline_addr, ram_size, rsdp)
    } else {
        bzimage::load(
            mem,
            kernel,
            initramfs,
            cmdline_addr,
            cmdline.len(),
            ram_size,
        )
    }
}
