//! The files a boot reads: the kernel and initramfs are opened through
//! [`open_file`], which names the path in the error, and the initramfs
//! is copied into guest memory by [`load_initramfs`] (enters as a path,
//! leaves as where it went, an [`Initramfs`]). Both loaders
//! ([`super::pvh`], [`super::bzimage`]) use them.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::error::BootError;
use crate::layout::LOW_RAM_END;

/// Where the initramfs went.
#[derive(Clone, Copy, Debug)]
pub struct Initramfs {
    pub addr: u64,
    pub size: u64,
}

/// Opens a kernel or initramfs file, naming it in the error.
pub fn open_file(path: &Path) -> Result<File, BootError> {
    File::open(path).map_err(|source| BootError::Open {
        path: path.into(),
        source,
    })
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
