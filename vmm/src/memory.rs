//! Guest RAM: one mapping below 3 GiB and, for larger guests, one from
//! 4 GiB up, both registered with KVM as memory slots. The mappings are
//! anonymous, or with `--memory shared=on` both are MAP_SHARED windows of
//! one memfd (the low region at file offset 0, the high one after it), so
//! a vhost-user backend can map the same pages from the fd.
//!
//! Enters as the configured size and sharing; leaves as an `Arc<GuestMemoryMmap>`
//! shared by the boot loader, the devices and (through its host
//! addresses) KVM.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::Arc;

use hypervisor::Vm;
use thiserror::Error;
use vm_memory::mmap::FromRangesError;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::layout::{LOW_RAM_END, RAM_64BIT_START};

#[derive(Debug, Error)]
pub enum MemoryError {
    #[error("cannot allocate {size} bytes of guest memory")]
    Allocate {
        size: u64,
        #[source]
        source: FromRangesError,
    },
    #[error("cannot create the {size}-byte memfd for shared guest memory")]
    Memfd {
        size: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("guest memory region at {0:#x} has no host mapping")]
    HostAddress(u64),
    #[error("cannot register guest memory with KVM")]
    Register(#[source] hypervisor::HypervisorError),
}

/// The RAM ranges for `size` bytes of guest memory.
pub fn ram_ranges(size: u64) -> Vec<(GuestAddress, usize)> {
    let low = size.min(LOW_RAM_END);
    let mut r = vec![(GuestAddress(0), low as usize)];
    if size > low {
        r.push((GuestAddress(RAM_64BIT_START), (size - low) as usize));
    }
    r
}

/// A memfd of `size` bytes (sealed against nothing: the VMM only hands it
/// to vhost-user backends it was told to trust).
fn create_memfd(size: u64) -> Result<File, MemoryError> {
    let err = |source| MemoryError::Memfd { size, source };
    // SAFETY: the name is a NUL-terminated string; memfd_create returns a
    // new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c"ch-guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a new descriptor nobody else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size).map_err(err)?;
    Ok(file)
}

/// Guest RAM for `size` bytes: anonymous, or MAP_SHARED windows of one
/// memfd when `shared`.
fn allocate(size: u64, shared: bool) -> Result<GuestMemoryMmap, MemoryError> {
    let ranges = ram_ranges(size);
    let mem = if shared {
        let file = create_memfd(size)?;
        let mut offset = 0u64;
        let mut with_files = Vec::with_capacity(ranges.len());
        for (start, len) in ranges {
            let dup = file
                .try_clone()
                .map_err(|source| MemoryError::Memfd { size, source })?;
            with_files.push((start, len, Some(FileOffset::new(dup, offset))));
            offset += len as u64;
        }
        GuestMemoryMmap::<()>::from_ranges_with_files(with_files)
    } else {
        GuestMemoryMmap::<()>::from_ranges(&ranges)
    };
    mem.map_err(|source| MemoryError::Allocate { size, source })
}

/// Allocates guest RAM and maps it into the VM.
pub fn create_guest_memory(
    vm: &Vm,
    size: u64,
    shared: bool,
) -> Result<Arc<GuestMemoryMmap>, MemoryError> {
    let mem = allocate(size, shared)?;
    for (slot, region) in mem.iter().enumerate() {
        let host = region
            .get_host_address(vm_memory::MemoryRegionAddress(0))
            .map_err(|_| MemoryError::HostAddress(region.start_addr().0))?;
        // SAFETY: the mapping belongs to `mem`, which the VMM keeps alive
        // (in an Arc held by `Vmm`) for as long as the VM runs, and the
        // ranges from `ram_ranges` do not overlap.
        unsafe {
            vm.map_memory(
                slot as u32,
                region.start_addr().0,
                region.len(),
                host as u64,
            )
        }
        .map_err(MemoryError::Register)?;
    }
    Ok(Arc::new(mem))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_around_the_pci_hole() {
        assert_eq!(ram_ranges(512 << 20), vec![(GuestAddress(0), 512 << 20)]);
        let r = ram_ranges(4 << 30);
        assert_eq!(r[0], (GuestAddress(0), LOW_RAM_END as usize));
        assert_eq!(r[1], (GuestAddress(1 << 32), (1 << 30) as usize));
    }

    #[test]
    fn shared_memory_is_one_memfd() {
        let mem = allocate(64 << 20, true).unwrap();
        let region = mem.iter().next().unwrap();
        let file_offset = region.file_offset().expect("file-backed");
        assert_eq!(file_offset.start(), 0);
        assert_eq!(file_offset.file().metadata().unwrap().len(), 64 << 20);
        let anon = allocate(64 << 20, false).unwrap();
        assert!(anon.iter().next().unwrap().file_offset().is_none());
    }
}
