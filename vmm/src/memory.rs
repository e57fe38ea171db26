//! Guest RAM: one anonymous mapping below 3 GiB and, for larger guests,
//! one from 4 GiB up, both registered with KVM as memory slots.
//!
//! Enters as the configured size; leaves as an `Arc<GuestMemoryMmap>`
//! shared by the boot loader, the devices and (through its host
//! addresses) KVM.

use std::sync::Arc;

use hypervisor::Vm;
use thiserror::Error;
use vm_memory::mmap::FromRangesError;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::layout::{LOW_RAM_END, RAM_64BIT_START};

#[derive(Debug, Error)]
pub enum MemoryError {
    #[error("cannot allocate {size} bytes of guest memory")]
    Allocate {
        size: u64,
        #[source]
        source: FromRangesError,
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

/// Allocates guest RAM and maps it into the VM.
pub fn create_guest_memory(vm: &Vm, size: u64) -> Result<Arc<GuestMemoryMmap>, MemoryError> {
    let mem = GuestMemoryMmap::<()>::from_ranges(&ram_ranges(size))
        .map_err(|source| MemoryError::Allocate { size, source })?;
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
}
