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
pub mod mptable;
pub mod pvh;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use thiserror::Error;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::layout::{CMDLINE_MAX, CMDLINE_START, LOW_RAM_END};

/// How the boot vCPU starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootEntry {
    /// 32-bit protected mode at `entry`, `%ebx` = `start_info`.
    Pvh { entry: u64, start_info: u64 },
    /// 64-bit mode at `entry`, `%rsi` = `boot_params`.
    Linux64 { entry: u64, boot_params: u64 },
}

#[derive(Debug, Error)]
pub enum BootError {
    #[error("cannot open {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is neither an ELF vmlinux with a PVH note nor a bzImage")]
    UnknownKernelFormat { path: PathBuf },
    #[error("{path}: the ELF has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY); use a bzImage or a PVH-enabled vmlinux")]
    NoPvhNote { path: PathBuf },
    #[error("cannot load kernel {path}")]
    LoadKernel {
        path: PathBuf,
        #[source]
        source: linux_loader::loader::Error,
    },
    #[error("kernel command line is {len} bytes; at most {max} fit")]
    CmdlineTooLong { len: usize, max: usize },
    #[error("kernel command line contains a NUL byte")]
    CmdlineNul,
    #[error("initramfs {path} ({size} bytes) does not fit in guest RAM below {limit:#x}")]
    InitramfsTooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error("cannot write boot data ({what}) into guest memory")]
    WriteGuest {
        what: &'static str,
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    #[error("too many vCPUs for the MP table: {0}")]
    TooManyCpus(u8),
    #[error("the ACPI tables do not fit below 1 MiB")]
    AcpiTooLarge,
}

/// Where the initramfs went.
#[derive(Clone, Copy, Debug)]
pub struct Initramfs {
    pub addr: u64,
    pub size: u64,
}

/// Opens a kernel or initramfs file, naming it in the error.
fn open_file(path: &Path) -> Result<File, BootError> {
    File::open(path).map_err(|source| BootError::Open {
        path: path.into(),
        source,
    })
}

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

/// Loads the initramfs page-aligned at the top of low RAM (below
/// `limit`, and above `kernel_end`).
pub fn load_initramfs(
    mem: &GuestMemoryMmap,
    path: &Path,
    ram_size: u64,
    kernel_end: u64,
) -> Result<Initramfs, BootError> {
    let mut f = open_file(path)?;
    let size = f
        .seek(SeekFrom::End(0))
        .and_then(|s| f.seek(SeekFrom::Start(0)).map(|_| s))
        .map_err(|source| BootError::Read {
            path: path.into(),
            source,
        })?;
    let top = ram_size.min(LOW_RAM_END);
    let too_large = || BootError::InitramfsTooLarge {
        path: path.into(),
        size,
        limit: top,
    };
    let addr = top.checked_sub(size).ok_or_else(too_large)? & !0xfff;
    if addr < kernel_end {
        return Err(too_large());
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut at = addr;
    loop {
        let n = f.read(&mut buf).map_err(|source| BootError::Read {
            path: path.into(),
            source,
        })?;
        if n == 0 {
            break;
        }
        mem.write_slice(&buf[..n], GuestAddress(at))
            .map_err(|source| BootError::WriteGuest {
                what: "initramfs",
                source,
            })?;
        at += n as u64;
    }
    Ok(Initramfs { addr, size })
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
