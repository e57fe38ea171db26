//! The payload buffers of one ring thread's entries, all in one anonymous
//! mapping (entry i at offset i x [`PAYLOAD_SIZE`], so every buffer is
//! page-aligned), wrapped as a `GuestMemoryMmap`: a READ or WRITE then
//! does its block I/O right in its entry's payload ([`InPlace`], an
//! `IoMemory::Guest` segment): the kernel put the write data there and
//! takes the read data from there, so neither needs a buffer of its own
//! nor a copy (with O_DIRECT the engine reads and writes it directly).
//!
//! Enters as the entry count ([`PayloadArea::new`]); leaves as host
//! pointers for the REGISTER iovecs, byte slices for the handlers and
//! the replies, and [`InPlace`] handles for requests.

use std::sync::Arc;

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::limits::MAX_WRITE;
use super::request::InPlace;

/// The kernel's `max_payload_sz`: max(8 KiB, max_write, max_pages pages).
pub const PAYLOAD_SIZE: usize = MAX_WRITE as usize;

pub struct PayloadArea {
    mem: Arc<GuestMemoryMmap>,
    entries: usize,
}

impl PayloadArea {
    /// Maps `entries` payload buffers.
    pub fn new(entries: usize) -> std::io::Result<Self> {
        let size = entries.max(1) * PAYLOAD_SIZE;
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), size)])
            .map_err(|e| std::io::Error::other(format!("mapping ring payloads: {e}")))?;
        Ok(PayloadArea {
            mem: Arc::new(mem),
            entries,
        })
    }

    /// Start of entry `i`'s buffer, or None past the last entry.
    fn host(&self, i: usize) -> Option<*mut u8> {
        if i >= self.entries {
            return None;
        }
        let addr = GuestAddress((i * PAYLOAD_SIZE) as u64);
        self.mem.get_host_address(addr).ok()
    }

    /// Entry `i`'s buffer, for the REGISTER iovec.
    pub fn host_ptr(&self, i: usize) -> Option<*mut u8> {
        self.host(i)
    }

    /// The first `len` bytes of entry `i`'s buffer (request data).
    pub fn bytes(&self, i: usize, len: usize) -> &[u8] {
        match self.host(i) {
            // SAFETY: the buffer lies inside the mapping `self.mem` keeps
            // alive, and `len` is clamped to it; the caller holds the
            // entry (the kernel does not write it until the commit).
            Some(p) => unsafe { std::slice::from_raw_parts(p, len.min(PAYLOAD_SIZE)) },
            None => &[],
        }
    }

    /// Entry `i`'s whole buffer, to write a reply into.
    pub fn bytes_mut(&mut self, i: usize) -> &mut [u8] {
        match self.host(i) {
            // SAFETY: as in `bytes`; `&mut self` makes this the only
            // slice of the area the thread holds.
            Some(p) => unsafe { std::slice::from_raw_parts_mut(p, PAYLOAD_SIZE) },
            None => &mut [],
        }
    }

    /// Keeps the mapping for the life of the process (the kernel may
    /// still write into entries it holds).
    pub fn leak(&self) {
        std::mem::forget(self.mem.clone());
    }

    /// Entry `i`'s buffer as request memory.
    pub fn in_place(&self, i: usize) -> Option<InPlace> {
        (i < self.entries).then(|| InPlace {
            mem: self.mem.clone(),
            addr: GuestAddress((i * PAYLOAD_SIZE) as u64),
            capacity: PAYLOAD_SIZE,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::IoMemory;

    #[test]
    fn buffers_are_page_aligned_and_disjoint() {
        let mut area = PayloadArea::new(3).unwrap();
        let p0 = area.host_ptr(0).unwrap() as usize;
        let p2 = area.host_ptr(2).unwrap() as usize;
        assert_eq!(p0 % 4096, 0);
        assert_eq!(p2 - p0, 2 * PAYLOAD_SIZE);
        assert!(area.host_ptr(3).is_none());
        area.bytes_mut(1)[..3].copy_from_slice(b"abc");
        assert_eq!(area.bytes(1, 3), b"abc");
        assert_eq!(area.bytes(0, 3), [0, 0, 0]);
        let Some(IoMemory::Guest { segments, .. }) = area.in_place(1).unwrap().memory(4096) else {
            panic!("no in-place memory");
        };
        assert_eq!(segments[0].addr, GuestAddress(PAYLOAD_SIZE as u64));
        assert!(area.in_place(1).unwrap().memory(PAYLOAD_SIZE + 1).is_none());
    }
}
