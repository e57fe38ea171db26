//! The virtio device trait, kept small: what a transport needs from a
//! device, and nothing else.
//!
//! Flow: the transport offers [`VirtioDevice::features`], passes the
//! driver's choice to [`VirtioDevice::ack_features`], forwards config space
//! accesses, and once the driver sets DRIVER_OK hands the device its queues
//! (each with the eventfd the guest's notifications land on) in
//! [`VirtioDevice::activate`]. The device signals used buffers through the
//! [`VirtioInterrupt`] it was given. A guest reset ends in
//! [`VirtioDevice::reset`].

use std::io;
use std::sync::Arc;

use thiserror::Error;
use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

/// Which interrupt a device raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InterruptKind {
    /// The configuration space changed.
    Config,
    /// Used buffers were added to queue N.
    Queue(u16),
}

/// How a device signals the guest. The transport implements it (MSI-X
/// vector lookup, masking, pending bits); the device only says which.
pub trait VirtioInterrupt: Send + Sync {
    fn trigger(&self, kind: InterruptKind) -> io::Result<()>;
}

/// A queue the driver has set up, ready for a device worker.
pub struct ActivatedQueue {
    pub index: u16,
    pub queue: Queue,
    /// Signalled when the guest notifies this queue (an ioeventfd).
    pub kick: EventFd,
}

#[derive(Debug, Error)]
pub enum ActivateError {
    #[error("device activation: {0}")]
    BadActivate(String),
    #[error("cannot create queue handle for the backend")]
    Backend(#[source] block::BlockError),
    #[error("cannot start queue worker thread")]
    SpawnWorker(#[source] io::Error),
    #[error("eventfd setup failed")]
    EventFd(#[source] io::Error),
}

pub trait VirtioDevice: Send {
    /// Virtio device ID (2 for block).
    fn device_type(&self) -> u32;

    /// Maximum size of each queue; its length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];

    /// Feature bits offered to the driver (VIRTIO_F_VERSION_1 included).
    fn features(&self) -> u64;

    /// The features the driver accepted (a subset of `features`).
    fn ack_features(&mut self, features: u64);

    /// Reads device-specific config space at `offset`.
    fn read_config(&self, offset: u64, data: &mut [u8]);

    /// Writes device-specific config space (virtio-blk: writeback).
    fn write_config(&mut self, offset: u64, data: &[u8]);

    /// Starts the device: one worker per queue.
    fn activate(
        &mut self,
        mem: Arc<GuestMemoryMmap>,
        interrupt: Arc<dyn VirtioInterrupt>,
        queues: Vec<ActivatedQueue>,
    ) -> Result<(), ActivateError>;

    /// Stops the workers after in-flight I/O has drained, and returns the
    /// device to its pre-activation state. Returns the kick eventfds so a
    /// transport can reuse its ioeventfd registrations.
    fn reset(&mut self) -> Vec<EventFd>;

    /// Stops the device for good (VM shutdown): drains and flushes.
    fn shutdown(&mut self);
}
