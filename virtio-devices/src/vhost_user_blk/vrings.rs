//! The vhost-user messages that start and stop the backend's work on a
//! device's queues.
//!
//! Enters as guest memory (file-backed regions), the queues the transport
//! activated and their eventfds; leaves as SET_MEM_TABLE and per queue
//! SET_VRING_NUM/ADDR/BASE/CALL/KICK/ENABLE messages, and on stop
//! GET_VRING_BASE (the backend's next avail index).

use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use super::error::{request_failed, VhostUserBlkError};

/// Most regions one SET_MEM_TABLE carries (fds in one message).
pub const MAX_REGIONS: usize = 8;

/// Each guest RAM region as the backend maps it: its memfd and offset.
pub fn memory_regions(
    mem: &GuestMemoryMmap,
) -> Result<Vec<VhostUserMemoryRegionInfo>, VhostUserBlkError> {
    if mem.num_regions() > MAX_REGIONS {
        return Err(VhostUserBlkError::TooManyRegions(mem.num_regions()));
    }
    mem.iter()
        .map(|region| {
            VhostUserMemoryRegionInfo::from_guest_region(region)
                .map_err(|_| VhostUserBlkError::MemoryNotShared(region.start_addr().0))
        })
        .collect()
}

/// What the VMM and the backend exchange per queue.
pub struct VringFds<'a> {
    pub kick: &'a EventFd,
    pub call: &'a EventFd,
}

/// Hands queue `index` to the backend and enables it.
pub fn start_vring(
    frontend: &mut Frontend,
    socket: &str,
    mem: &GuestMemoryMmap,
    index: u16,
    queue: &Queue,
    fds: VringFds<'_>,
) -> Result<(), VhostUserBlkError> {
    let request = |request: &'static str| request_failed(socket, request);
    let host = |addr: u64| {
        mem.get_host_address(GuestAddress(addr))
            .map(|p| p as u64)
            .map_err(|_| VhostUserBlkError::RingAddress { index, addr })
    };
    let i = usize::from(index);
    frontend
        .set_vring_num(i, queue.size())
        .map_err(request("SET_VRING_NUM"))?;
    let addresses = VringConfigData {
        queue_max_size: queue.max_size(),
        queue_size: queue.size(),
        flags: 0,
        desc_table_addr: host(queue.desc_table())?,
        used_ring_addr: host(queue.used_ring())?,
        avail_ring_addr: host(queue.avail_ring())?,
        log_addr: None,
    };
    frontend
        .set_vring_addr(i, &addresses)
        .map_err(request("SET_VRING_ADDR"))?;
    frontend
        .set_vring_base(i, queue.next_avail())
        .map_err(request("SET_VRING_BASE"))?;
    frontend
        .set_vring_call(i, fds.call)
        .map_err(request("SET_VRING_CALL"))?;
    frontend
        .set_vring_kick(i, fds.kick)
        .map_err(request("SET_VRING_KICK"))?;
    frontend
        .set_vring_enable(i, true)
        .map_err(request("SET_VRING_ENABLE"))?;
    Ok(())
}

/// Stops queue `index` in the backend; returns the avail index it reached.
pub fn stop_vring(
    frontend: &mut Frontend,
    socket: &str,
    index: u16,
) -> Result<u32, VhostUserBlkError> {
    frontend
        .get_vring_base(usize::from(index))
        .map_err(request_failed(socket, "GET_VRING_BASE"))
}
