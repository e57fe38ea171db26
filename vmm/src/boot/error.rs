//! [`BootError`]: every way loading the guest can fail, for each part of
//! the boot (the files, the loaders, the MP and ACPI tables) to return
//! and for `crate::vm_error` to carry.

use std::path::PathBuf;

use thiserror::Error;

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
