//! A host-side virtio-blk driver: it plays the guest against a real
//! [`BlockDevice`] with real worker threads.
//!
//! [`BlockHarness::new`] allocates guest memory, negotiates features,
//! builds one split virtqueue per device queue and activates the device.
//! Each queue's driver state is a [`QueueDriver`] (movable to its own
//! thread): requests enter with [`QueueDriver::post`] (header, data and
//! status in a preallocated slot, as a direct or indirect chain),
//! [`QueueDriver::kick`] publishes them and notifies the device when it
//! asked for it, and results leave through [`QueueDriver::reap`] /
//! [`QueueDriver::wait`] as [`UsedRequest`]s carrying the status byte and
//! used length.

// foldhash: the keys are our own descriptor heads (the driver plays the
// guest; SipHash was a tenth of its CPU per request).
use foldhash::{HashMap, HashMapExt};
use std::io;
use std::sync::Arc;
use std::time::Duration;

use block::Disk;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_WRITE_ZEROES,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::interrupt::EventFdInterrupt;
use crate::split_queue::{DescSpec, DriverQueue, QueueLayout};
use virtio_devices::block::{BlockDevice, BlockDeviceConfig};
use virtio_devices::device::{ActivatedQueue, VirtioDevice};

/// How the driver sets things up.
#[derive(Clone, Copy, Debug)]
pub struct DriverOptions {
    /// Negotiate VIRTIO_RING_F_EVENT_IDX.
    pub event_idx: bool,
    /// Post requests as indirect chains (one ring descriptor each).
    pub indirect: bool,
    /// Request slots per queue (the most requests in flight).
    pub slots: u16,
    /// Data buffer bytes per slot.
    pub slot_data: u32,
    /// Extra guest memory after the queues, for tests' own buffers.
    pub scratch: u64,
    /// How long [`QueueDriver::wait`] spins for a pending interrupt
    /// before it sleeps, like a halted vCPU in KVM (zero: sleep at once).
    pub halt_poll: Duration,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            event_idx: true,
            indirect: false,
            slots: 32,
            slot_data: 128 << 10,
            scratch: 1 << 20,
            halt_poll: Duration::ZERO,
        }
    }
}

/// Where one request's pieces live.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    pub header: GuestAddress,
    pub status: GuestAddress,
    pub indirect_table: GuestAddress,
    pub data: GuestAddress,
    pub data_cap: u32,
}

const SLOT_META: u64 = 4096;

/// A request the device returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsedRequest {
    pub head: u16,
    pub slot: usize,
    pub used_len: u32,
    pub status: u8,
}

/// The driver side of one queue.
pub struct QueueDriver {
    pub index: u16,
    pub vq: DriverQueue,
    kick: EventFd,
    interrupt: Arc<EventFdInterrupt>,
    slots: Vec<Slot>,
    free_slots: Vec<usize>,
    by_head: HashMap<u16, usize>,
    indirect: bool,
    halt_poll: Duration,
    /// Kicks written (the device asked for them).
    pub kicks: u64,
}

impl QueueDriver {
    /// The driver of queue `index` over `vq`, with `opts.slots` request
    /// slots laid out from guest address `slots_base` (each
    /// [`QueueDriver::slot_stride`] bytes). The device is told about new
    /// chains through `kick`; it signals on `interrupt`'s eventfd of
    /// queue `index`. [`BlockHarness`] builds its queues with it; the
    /// storage daemon's vhost-user tests build theirs over shared memory.
    pub fn new(
        index: u16,
        vq: DriverQueue,
        kick: EventFd,
        interrupt: Arc<EventFdInterrupt>,
        slots_base: u64,
        opts: &DriverOptions,
    ) -> Self {
        let per_slot = Self::slot_stride(opts);
        let slots = (0..u64::from(opts.slots))
            .map(|i| {
                let at = slots_base + per_slot * i;
                Slot {
                    header: GuestAddress(at),
                    status: GuestAddress(at + 16),
                    indirect_table: GuestAddress(at + 64),
                    data: GuestAddress(at + SLOT_META),
                    data_cap: opts.slot_data,
                }
            })
            .collect::<Vec<_>>();
        QueueDriver {
            index,
            vq,
            kick,
            interrupt,
            free_slots: (0..slots.len()).rev().collect(),
            slots,
            by_head: HashMap::new(),
            indirect: opts.indirect,
            halt_poll: opts.halt_poll,
            kicks: 0,
        }
    }

    /// Guest memory one request slot takes.
    pub fn slot_stride(opts: &DriverOptions) -> u64 {
        SLOT_META + u64::from(opts.slot_data).next_multiple_of(4096)
    }

    pub fn slot(&self, i: usize) -> Slot {
        self.slots[i]
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    pub fn free_slots(&self) -> usize {
        self.free_slots.len()
    }

    pub fn memory(&self) -> &Arc<GuestMemoryMmap> {
        self.vq.memory()
    }

    /// Reserves a slot for a request built by hand (malformed chains).
    pub fn take_slot(&mut self) -> Option<usize> {
        self.free_slots.pop()
    }

    /// Records that `head` uses `slot`, for [`QueueDriver::reap`].
    pub fn bind(&mut self, head: u16, slot: usize) {
        self.by_head.insert(head, slot);
    }

    /// Writes a request header into the slot.
    pub fn write_header(&self, slot: usize, request_type: u32, sector: u64) {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&request_type.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        let s = self.slots[slot];
        self.memory()
            .write_slice(&h, s.header)
            .expect("slot in guest memory");
        // A status the device never writes stays 0xff.
        self.memory()
            .write_obj(0xffu8, s.status)
            .expect("slot in guest memory");
    }

    /// Posts a well-formed request (not yet published: call
    /// [`QueueDriver::kick`]). For IN and GET_ID `data_len` bytes of the
    /// slot are device-writable; for OUT, DISCARD and WRITE_ZEROES they
    /// are device-readable (fill them first with [`QueueDriver::write_data`]).
    /// Returns the slot used.
    pub fn post(&mut self, request_type: u32, sector: u64, data_len: u32) -> Option<usize> {
        let slot = self.free_slots.pop()?;
        self.write_header(slot, request_type, sector);
        let s = self.slots[slot];
        // On the stack: a guest driver does not allocate per request, and
        // neither does this one (the driver thread's CPU is measured).
        let status = DescSpec::writable(s.status.0, 1);
        let mut descs = [DescSpec::readable(s.header.0, 16), status, status];
        let mut n = 1;
        if data_len > 0 {
            let len = data_len.min(s.data_cap);
            let writable = matches!(request_type, VIRTIO_BLK_T_IN | VIRTIO_BLK_T_GET_ID);
            descs[n] = DescSpec {
                addr: s.data.0,
                len,
                writable,
            };
            n += 1;
        }
        descs[n] = status;
        let descs = &descs[..=n];
        let head = if self.indirect {
            self.vq.add_indirect_chain(s.indirect_table, descs)
        } else {
            self.vq.add_chain(descs)
        };
        let Some(head) = head else {
            self.free_slots.push(slot);
            return None;
        };
        self.by_head.insert(head, slot);
        self.vq.push_avail(head);
        Some(slot)
    }

    /// Posts a request whose device-readable data is `data` (OUT).
    pub fn post_data(&mut self, request_type: u32, sector: u64, data: &[u8]) -> Option<usize> {
        let slot = *self.free_slots.last()?;
        let len = u32::try_from(data.len()).ok()?;
        if len > self.slots[slot].data_cap {
            return None;
        }
        self.write_data(slot, data);
        self.post(request_type, sector, len)
    }

    /// Posts a DISCARD or WRITE_ZEROES with one segment.
    pub fn post_discard(
        &mut self,
        write_zeroes: bool,
        sector: u64,
        num_sectors: u32,
        flags: u32,
    ) -> Option<usize> {
        let t = if write_zeroes {
            VIRTIO_BLK_T_WRITE_ZEROES
        } else {
            VIRTIO_BLK_T_DISCARD
        };
        let slot = *self.free_slots.last()?;
        let mut seg = [0u8; 16];
        seg[0..8].copy_from_slice(&sector.to_le_bytes());
        seg[8..12].copy_from_slice(&num_sectors.to_le_bytes());
        seg[12..16].copy_from_slice(&flags.to_le_bytes());
        self.write_data(slot, &seg);
        self.post(t, 0, 16)
    }

    pub fn write_data(&self, slot: usize, data: &[u8]) {
        self.memory()
            .write_slice(data, self.slots[slot].data)
            .expect("slot in guest memory");
    }

    pub fn read_data(&self, slot: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.memory()
            .read_slice(&mut v, self.slots[slot].data)
            .expect("slot in guest memory");
        v
    }

    /// Publishes posted requests and kicks the device if it wants a kick.
    pub fn kick(&mut self) -> io::Result<bool> {
        if self.vq.publish() {
            self.kick.write(1)?;
            self.kicks += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// Kicks unconditionally (tests of spurious notifications).
    pub fn force_kick(&mut self) -> io::Result<()> {
        self.vq.publish();
        self.kick.write(1)
    }

    /// Collects every returned request without waiting.
    pub fn reap(&mut self, out: &mut Vec<UsedRequest>) {
        while let Some((head, used_len)) = self.vq.pop_used() {
            let slot = self.by_head.remove(&head).unwrap_or(usize::MAX);
            let status = match self.slots.get(slot) {
                Some(s) => self.memory().read_obj::<u8>(s.status).unwrap_or(0xff),
                None => 0xff,
            };
            if slot != usize::MAX {
                self.free_slots.push(slot);
            }
            out.push(UsedRequest {
                head,
                slot,
                used_len,
                status,
            });
        }
    }

    /// Waits (up to `timeout` per interrupt) until at least one request
    /// comes back, arming the interrupt the way a guest driver does.
    pub fn wait(&mut self, timeout: Duration, out: &mut Vec<UsedRequest>) -> io::Result<usize> {
        let before = out.len();
        loop {
            self.reap(out);
            if out.len() > before {
                return Ok(out.len() - before);
            }
            self.vq.arm_interrupt();
            self.reap(out);
            if out.len() > before {
                return Ok(out.len() - before);
            }
            if !self
                .interrupt
                .wait_polling(self.index, self.halt_poll, timeout)?
            {
                self.reap(out);
                return Ok(out.len() - before);
            }
        }
    }

    /// Posts one request, kicks, and waits for it (tests).
    pub fn run(&mut self, request_type: u32, sector: u64, data_len: u32) -> Option<UsedRequest> {
        let slot = self.post(request_type, sector, data_len)?;
        self.kick().ok()?;
        self.wait_slot(slot)
    }

    /// Waits for the request in `slot` (other completions are dropped).
    pub fn wait_slot(&mut self, slot: usize) -> Option<UsedRequest> {
        let mut out = Vec::new();
        for _ in 0..100 {
            self.wait(Duration::from_millis(100), &mut out).ok()?;
            if let Some(u) = out.iter().find(|u| u.slot == slot) {
                return Some(*u);
            }
        }
        None
    }
}

/// Guest memory, a device and the driver side of each of its queues.
pub struct BlockHarness {
    pub mem: Arc<GuestMemoryMmap>,
    pub device: BlockDevice,
    pub interrupt: Arc<EventFdInterrupt>,
    queues: Vec<Option<QueueDriver>>,
    scratch: GuestAddress,
    /// Features the driver accepts (all offered, maybe minus EVENT_IDX).
    negotiated_mask: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("guest memory setup failed: {0}")]
    Memory(String),
    #[error("device creation failed")]
    Device(#[source] virtio_devices::block::BlockDeviceError),
    #[error("eventfd setup failed")]
    EventFd(#[source] io::Error),
    #[error("device activation failed")]
    Activate(#[source] virtio_devices::device::ActivateError),
}

impl BlockHarness {
    /// Builds and activates a device over `disk`.
    pub fn new(
        disk: Disk,
        config: BlockDeviceConfig,
        opts: DriverOptions,
    ) -> Result<Self, HarnessError> {
        let device = BlockDevice::new(disk, config).map_err(HarnessError::Device)?;
        Self::for_device(device, opts)
    }

    /// Builds guest memory and activates an already made device (one the
    /// test keeps control handles of).
    pub fn for_device(device: BlockDevice, opts: DriverOptions) -> Result<Self, HarnessError> {
        let sizes = device.queue_max_sizes();
        let queue_size = sizes.first().copied().unwrap_or(256);
        let num_queues = u16::try_from(sizes.len()).unwrap_or(1);
        let per_slot = QueueDriver::slot_stride(&opts);
        let rings = QueueLayout::at(GuestAddress(0), queue_size)
            .end()
            .next_multiple_of(4096);
        let per_queue = rings + per_slot * u64::from(opts.slots);
        let total = (per_queue * u64::from(num_queues) + opts.scratch).next_multiple_of(4096);
        let size = usize::try_from(total).map_err(|_| HarnessError::Memory("too large".into()))?;
        let mem = Arc::new(
            GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), size)])
                .map_err(|e| HarnessError::Memory(e.to_string()))?,
        );
        Self::with_memory(device, mem, opts, per_queue, rings)
    }

    fn with_memory(
        mut device: BlockDevice,
        mem: Arc<GuestMemoryMmap>,
        opts: DriverOptions,
        per_queue: u64,
        rings: u64,
    ) -> Result<Self, HarnessError> {
        let num_queues = u16::try_from(device.queue_max_sizes().len()).unwrap_or(1);
        let queue_size = device.queue_max_sizes().first().copied().unwrap_or(256);
        let mut negotiated_mask = u64::MAX;
        if !opts.event_idx {
            negotiated_mask &= !(1u64 << VIRTIO_RING_F_EVENT_IDX);
        }
        device.ack_features(device.features() & negotiated_mask);
        let interrupt = Arc::new(EventFdInterrupt::new(num_queues).map_err(HarnessError::EventFd)?);
        let mut drivers = Vec::new();
        let mut activated = Vec::new();
        for q in 0..num_queues {
            let base = per_queue * u64::from(q);
            let layout = QueueLayout::at(GuestAddress(base), queue_size);
            let vq = DriverQueue::new(Arc::clone(&mem), layout, opts.event_idx);
            let kick = EventFd::new(EFD_NONBLOCK).map_err(HarnessError::EventFd)?;
            activated.push(ActivatedQueue {
                index: q,
                queue: vq.device_queue(),
                kick: kick.try_clone().map_err(HarnessError::EventFd)?,
            });
            drivers.push(Some(QueueDriver::new(
                q,
                vq,
                kick,
                Arc::clone(&interrupt),
                base + rings,
                &opts,
            )));
        }
        let interrupt_dyn: Arc<dyn virtio_devices::device::VirtioInterrupt> = interrupt.clone();
        device
            .activate(Arc::clone(&mem), interrupt_dyn, activated)
            .map_err(HarnessError::Activate)?;
        Ok(BlockHarness {
            mem,
            device,
            interrupt,
            queues: drivers,
            scratch: GuestAddress(per_queue * u64::from(num_queues)),
            negotiated_mask,
        })
    }

    /// Resets the device, then renegotiates and activates it again with
    /// the kick eventfds the reset returned, as a guest driver reloading
    /// would; every queue's rings start empty again. Returns how many kick
    /// eventfds the reset handed back. Fails if a queue was taken out.
    pub fn reset_and_reactivate(&mut self) -> Result<usize, HarnessError> {
        let kicks = self.device.reset();
        let returned = kicks.len();
        self.reactivate(kicks)?;
        Ok(returned)
    }

    /// Renegotiates and activates a reset device with `kicks` (one per
    /// queue, as [`VirtioDevice::reset`] returned them); the rings start
    /// empty again.
    pub fn reactivate(&mut self, kicks: Vec<EventFd>) -> Result<(), HarnessError> {
        let features = self.device.features() & self.negotiated_mask;
        self.device.ack_features(features);
        let mut activated = Vec::new();
        for (driver, kick) in self.queues.iter_mut().zip(kicks) {
            let driver = driver.as_mut().ok_or_else(|| {
                HarnessError::Memory("a queue was taken out of the harness".into())
            })?;
            let layout = driver.vq.layout();
            let event_idx = features & (1u64 << VIRTIO_RING_F_EVENT_IDX) != 0;
            driver.vq = DriverQueue::new(Arc::clone(&self.mem), layout, event_idx);
            driver.by_head.clear();
            driver.free_slots = (0..driver.slots.len()).rev().collect();
            activated.push(ActivatedQueue {
                index: driver.index,
                queue: driver.vq.device_queue(),
                kick,
            });
        }
        let interrupt_dyn: Arc<dyn virtio_devices::device::VirtioInterrupt> =
            self.interrupt.clone();
        self.device
            .activate(Arc::clone(&self.mem), interrupt_dyn, activated)
            .map_err(HarnessError::Activate)
    }

    /// Start of the scratch area (tests' own buffers and tables).
    pub fn scratch(&self) -> GuestAddress {
        self.scratch
    }

    /// Borrows queue `i`'s driver (None once taken).
    pub fn queue(&mut self, i: u16) -> Option<&mut QueueDriver> {
        self.queues.get_mut(usize::from(i))?.as_mut()
    }

    /// Moves queue `i`'s driver out (to drive it from another thread).
    pub fn take_queue(&mut self, i: u16) -> Option<QueueDriver> {
        self.queues.get_mut(usize::from(i))?.take()
    }
}
