//! The driver side of one split virtqueue, laid out in guest memory.
//!
//! Data enters as descriptor chains the caller builds ([`DriverQueue::add_chain`],
//! [`DriverQueue::add_indirect_chain`], or raw descriptors for malformed
//! chains); [`DriverQueue::publish`] puts their heads on the available ring.
//! Data leaves through [`DriverQueue::pop_used`], which reads the used ring
//! and frees the descriptors of each returned chain. EVENT_IDX is
//! supported in both directions (`used_event` written by
//! [`DriverQueue::set_used_event`], `avail_event` honoured by
//! [`DriverQueue::publish`]'s kick decision).

// foldhash: the keys are our own descriptor heads (the driver plays the
// guest; SipHash was a tenth of its CPU per request).
use foldhash::{HashMap, HashMapExt};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use virtio_bindings::virtio_ring::{
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, VRING_USED_F_NO_NOTIFY,
};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Where a queue's three parts live in guest memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLayout {
    pub size: u16,
    pub desc_table: GuestAddress,
    pub avail_ring: GuestAddress,
    pub used_ring: GuestAddress,
}

impl QueueLayout {
    /// Packs the three parts from `base` (aligned as virtio requires).
    pub fn at(base: GuestAddress, size: u16) -> Self {
        let n = u64::from(size);
        let desc_table = base;
        let avail_ring = GuestAddress(base.0 + 16 * n);
        let used_ring = GuestAddress((avail_ring.0 + 6 + 2 * n + 63) & !63);
        QueueLayout {
            size,
            desc_table,
            avail_ring,
            used_ring,
        }
    }

    /// First byte after the used ring.
    pub fn end(&self) -> u64 {
        self.used_ring.0 + 6 + 8 * u64::from(self.size)
    }
}

/// One descriptor the caller wants in a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DescSpec {
    pub addr: u64,
    pub len: u32,
    /// Device-writable.
    pub writable: bool,
}

impl DescSpec {
    pub fn readable(addr: u64, len: u32) -> Self {
        DescSpec {
            addr,
            len,
            writable: false,
        }
    }

    pub fn writable(addr: u64, len: u32) -> Self {
        DescSpec {
            addr,
            len,
            writable: true,
        }
    }
}

/// The driver's view of one split virtqueue.
pub struct DriverQueue {
    mem: Arc<GuestMemoryMmap>,
    layout: QueueLayout,
    free: Vec<u16>,
    /// Descriptors of each chain in flight, by head.
    chains: HashMap<u16, Vec<u16>>,
    /// Emptied descriptor lists of completed chains, reused (the driver
    /// plays a guest and allocates nothing per request).
    spare: Vec<Vec<u16>>,
    avail_idx: u16,
    last_used: u16,
    /// avail idx at the last kick decision (for EVENT_IDX).
    kicked_at: u16,
    event_idx: bool,
}

impl DriverQueue {
    /// Zeroes the rings and marks every descriptor free.
    pub fn new(mem: Arc<GuestMemoryMmap>, layout: QueueLayout, event_idx: bool) -> Self {
        let zeroes = vec![0u8; usize::try_from(layout.end() - layout.desc_table.0).unwrap_or(0)];
        mem.write_slice(&zeroes, layout.desc_table)
            .expect("queue layout lies in guest memory");
        DriverQueue {
            free: (0..layout.size).rev().collect(),
            chains: HashMap::new(),
            spare: Vec::new(),
            mem,
            layout,
            avail_idx: 0,
            last_used: 0,
            kicked_at: 0,
            event_idx,
        }
    }

    pub fn layout(&self) -> QueueLayout {
        self.layout
    }

    pub fn memory(&self) -> &Arc<GuestMemoryMmap> {
        &self.mem
    }

    /// A device-side [`Queue`] configured for this layout (what a
    /// transport would build from the driver's register writes).
    pub fn device_queue(&self) -> Queue {
        let mut q = Queue::new(self.layout.size).expect("queue size is a power of two");
        q.set_size(self.layout.size);
        let split = |a: GuestAddress| (Some(a.0 as u32), Some((a.0 >> 32) as u32));
        let (lo, hi) = split(self.layout.desc_table);
        q.set_desc_table_address(lo, hi);
        let (lo, hi) = split(self.layout.avail_ring);
        q.set_avail_ring_address(lo, hi);
        let (lo, hi) = split(self.layout.used_ring);
        q.set_used_ring_address(lo, hi);
        q.set_event_idx(self.event_idx);
        q.set_ready(true);
        q
    }

    /// Free descriptors left.
    pub fn free_descriptors(&self) -> usize {
        self.free.len()
    }

    /// Chains published and not yet returned.
    pub fn in_flight(&self) -> usize {
        self.chains.len()
    }

    /// Writes descriptor `index` verbatim (for malformed chains).
    pub fn write_raw_descriptor(
        &self,
        table: GuestAddress,
        index: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..16].copy_from_slice(&next.to_le_bytes());
        let at = GuestAddress(table.0 + 16 * u64::from(index));
        self.mem
            .write_slice(&raw, at)
            .expect("descriptor table lies in guest memory");
    }

    /// Takes `n` descriptors off the free list (None if not enough).
    pub fn alloc(&mut self, n: usize) -> Option<Vec<u16>> {
        if n == 0 || self.free.len() < n {
            return None;
        }
        let at = self.free.len() - n;
        let mut descs = self.spare.pop().unwrap_or_default();
        descs.extend(self.free.drain(at..));
        Some(descs)
    }

    /// Records that `descs` (head first) form a chain awaiting publish.
    pub fn track_chain(&mut self, descs: Vec<u16>) -> u16 {
        let head = descs[0];
        self.chains.insert(head, descs);
        head
    }

    /// Writes a direct chain; returns its head (not yet published).
    pub fn add_chain(&mut self, descs: &[DescSpec]) -> Option<u16> {
        let indices = self.alloc(descs.len())?;
        for (i, d) in descs.iter().enumerate() {
            let mut flags = if d.writable {
                VRING_DESC_F_WRITE as u16
            } else {
                0
            };
            let next = indices.get(i + 1).copied().unwrap_or(0);
            if i + 1 < descs.len() {
                flags |= VRING_DESC_F_NEXT as u16;
            }
            self.write_raw_descriptor(
                self.layout.desc_table,
                indices[i],
                d.addr,
                d.len,
                flags,
                next,
            );
        }
        Some(self.track_chain(indices))
    }

    /// Writes `descs` as an indirect table at `table` and one ring
    /// descriptor pointing at it; returns the head.
    pub fn add_indirect_chain(&mut self, table: GuestAddress, descs: &[DescSpec]) -> Option<u16> {
        let n = u16::try_from(descs.len()).ok()?;
        for (i, d) in descs.iter().enumerate() {
            let i = i as u16;
            let mut flags = if d.writable {
                VRING_DESC_F_WRITE as u16
            } else {
                0
            };
            if i + 1 < n {
                flags |= VRING_DESC_F_NEXT as u16;
            }
            self.write_raw_descriptor(table, i, d.addr, d.len, flags, i + 1);
        }
        let head = self.alloc(1)?;
        self.write_raw_descriptor(
            self.layout.desc_table,
            head[0],
            table.0,
            u32::from(n) * 16,
            VRING_DESC_F_INDIRECT as u16,
            0,
        );
        Some(self.track_chain(head))
    }

    /// Puts `head` on the available ring (not yet visible: see
    /// [`DriverQueue::publish`]).
    pub fn push_avail(&mut self, head: u16) {
        let slot = u64::from(self.avail_idx % self.layout.size);
        let at = GuestAddress(self.layout.avail_ring.0 + 4 + 2 * slot);
        self.mem
            .write_obj(head.to_le(), at)
            .expect("avail ring lies in guest memory");
        self.avail_idx = self.avail_idx.wrapping_add(1);
    }

    /// Makes every pushed head visible to the device; returns whether the
    /// device asked to be notified (EVENT_IDX avail_event or NO_NOTIFY).
    pub fn publish(&mut self) -> bool {
        let idx_at = GuestAddress(self.layout.avail_ring.0 + 2);
        self.mem
            .store(self.avail_idx.to_le(), idx_at, Ordering::Release)
            .expect("avail ring lies in guest memory");
        std::sync::atomic::fence(Ordering::SeqCst);
        let old = self.kicked_at;
        let new = self.avail_idx;
        self.kicked_at = new;
        if self.event_idx {
            let at = GuestAddress(self.layout.used_ring.0 + 4 + 8 * u64::from(self.layout.size));
            let event: u16 = u16::from_le(self.mem.load(at, Ordering::Acquire).unwrap_or(0));
            // Kick if avail_event lies in [old, new).
            new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
        } else {
            let flags: u16 = u16::from_le(
                self.mem
                    .load(self.layout.used_ring, Ordering::Acquire)
                    .unwrap_or(0),
            );
            flags & VRING_USED_F_NO_NOTIFY as u16 == 0
        }
    }

    /// Convenience: push and publish one head.
    pub fn submit(&mut self, head: u16) -> bool {
        self.push_avail(head);
        self.publish()
    }

    /// The device's used index.
    pub fn used_idx(&self) -> u16 {
        let at = GuestAddress(self.layout.used_ring.0 + 2);
        u16::from_le(self.mem.load(at, Ordering::Acquire).unwrap_or(0))
    }

    /// Takes the next used entry (head, used length) and frees its chain.
    pub fn pop_used(&mut self) -> Option<(u16, u32)> {
        if self.used_idx() == self.last_used {
            return None;
        }
        let slot = u64::from(self.last_used % self.layout.size);
        let at = GuestAddress(self.layout.used_ring.0 + 4 + 8 * slot);
        let mut raw = [0u8; 8];
        self.mem.read_slice(&mut raw, at).ok()?;
        self.last_used = self.last_used.wrapping_add(1);
        let id = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
        let len = u32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]);
        let head = u16::try_from(id).ok()?;
        if let Some(mut descs) = self.chains.remove(&head) {
            self.free.append(&mut descs);
            self.spare.push(descs);
        }
        Some((head, len))
    }

    /// Index of the next used entry the driver will read.
    pub fn last_used(&self) -> u16 {
        self.last_used
    }

    /// EVENT_IDX: ask for an interrupt once the used index passes `idx`.
    pub fn set_used_event(&self, idx: u16) {
        let at = GuestAddress(self.layout.avail_ring.0 + 4 + 2 * u64::from(self.layout.size));
        self.mem
            .store(idx.to_le(), at, Ordering::Release)
            .expect("avail ring lies in guest memory");
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Asks for an interrupt at the next used entry (what Linux does when
    /// it re-enables callbacks).
    pub fn arm_interrupt(&self) {
        self.set_used_event(self.last_used);
    }
}
