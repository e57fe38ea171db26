//! [`VhostUserBlkDevice`]: a virtio-blk [`VirtioDevice`] whose queues a
//! vhost-user backend serves.
//!
//! Built at boot from a socket path and the queue shape ([`handshake`]
//! connects and negotiates). The transport then reads the features and the
//! config space the backend reported; on activation the device sends the
//! guest's features, the memory table and the queues ([`vrings`]), giving
//! the backend the transport's ioeventfds as kick eventfds and its own
//! call eventfds, which a [`CallForwarder`] turns into interrupts. Reset
//! and shutdown stop every queue with GET_VRING_BASE.

use std::path::PathBuf;
use std::sync::Arc;

use vhost::vhost_user::message::VhostUserConfigFlags;
use vhost::vhost_user::VhostUserFrontend;
use vhost::VhostBackend;
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::call_forwarder::CallForwarder;
use super::error::{request_failed, VhostUserBlkError};
use super::handshake::{self, Connection};
use super::vrings::{self, VringFds};
use crate::block::VIRTIO_ID_BLOCK;
use crate::device::{ActivateError, ActivatedQueue, VirtioDevice, VirtioInterrupt};

/// What the VMM asks for (`--disk vhost_user=on,socket=...`).
#[derive(Clone, Debug)]
pub struct VhostUserBlkConfig {
    pub socket: PathBuf,
    pub num_queues: u16,
    pub queue_size: u16,
}

/// The queues the backend is running.
struct Running {
    indexes: Vec<u16>,
    kicks: Vec<EventFd>,
    forwarder: CallForwarder,
}

pub struct VhostUserBlkDevice {
    connection: Connection,
    queue_sizes: Vec<u16>,
    acked_features: u64,
    running: Option<Running>,
}

impl VhostUserBlkDevice {
    /// Connects to the backend and negotiates; fails naming the socket.
    pub fn new(config: &VhostUserBlkConfig) -> Result<Self, VhostUserBlkError> {
        let connection = handshake::connect(&config.socket, config.num_queues)?;
        Ok(VhostUserBlkDevice {
            connection,
            queue_sizes: vec![config.queue_size; usize::from(config.num_queues)],
            acked_features: 0,
            running: None,
        })
    }

    /// The disk size the backend reported, in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        let mut sectors = [0u8; 8];
        if let Some(bytes) = self.connection.config.get(..8) {
            sectors.copy_from_slice(bytes);
        }
        u64::from_le_bytes(sectors).saturating_mul(512)
    }

    fn start(
        &mut self,
        mem: &GuestMemoryMmap,
        interrupt: Arc<dyn VirtioInterrupt>,
        queues: &[ActivatedQueue],
    ) -> Result<Running, VhostUserBlkError> {
        let socket = self.connection.socket.clone();
        let request = |request: &'static str| request_failed(&socket, request);
        let frontend = &mut self.connection.frontend;
        frontend
            .set_features(self.acked_features | self.connection.protocol_bit)
            .map_err(request("SET_FEATURES"))?;
        frontend
            .set_mem_table(&vrings::memory_regions(mem)?)
            .map_err(request("SET_MEM_TABLE"))?;
        // The forwarder owns the call eventfds; the backend gets duplicates.
        let mut calls = Vec::with_capacity(queues.len());
        let mut backend_calls = Vec::with_capacity(queues.len());
        for q in queues {
            let call = EventFd::new(EFD_NONBLOCK).map_err(VhostUserBlkError::CallForwarder)?;
            backend_calls.push(call.try_clone().map_err(VhostUserBlkError::CallForwarder)?);
            calls.push((q.index, call));
        }
        let forwarder =
            CallForwarder::start(calls, interrupt).map_err(VhostUserBlkError::CallForwarder)?;
        for (started, (q, call)) in queues.iter().zip(&backend_calls).enumerate() {
            let fds = VringFds {
                kick: &q.kick,
                call,
            };
            if let Err(e) = vrings::start_vring(frontend, &socket, mem, q.index, &q.queue, fds) {
                // Take back the queues already handed over: the transport
                // reuses their kick eventfds.
                for q in &queues[..started] {
                    if let Err(stop) = vrings::stop_vring(frontend, &socket, q.index) {
                        log::error!("{}", ch_log::error_chain(&stop));
                    }
                }
                return Err(e);
            }
        }
        Ok(Running {
            indexes: queues.iter().map(|q| q.index).collect(),
            kicks: Vec::new(),
            forwarder,
        })
    }

    /// Stops the backend's queues and the forwarder; returns the kicks.
    fn stop(&mut self) -> Vec<EventFd> {
        let Some(mut running) = self.running.take() else {
            return Vec::new();
        };
        for &index in &running.indexes {
            let socket = &self.connection.socket;
            match vrings::stop_vring(&mut self.connection.frontend, socket, index) {
                Ok(base) => log::debug!("vhost-user-blk {socket}: queue {index} stopped at {base}"),
                Err(e) => log::error!("{}", ch_log::error_chain(&e)),
            }
        }
        running.forwarder.stop();
        running.kicks
    }
}

impl VirtioDevice for VhostUserBlkDevice {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn features(&self) -> u64 {
        self.connection.guest_features
    }

    fn ack_features(&mut self, features: u64) {
        self.acked_features = features & self.connection.guest_features;
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let config = &self.connection.config;
        let Ok(start) = usize::try_from(offset) else {
            return;
        };
        if let Some(src) = config.get(start..) {
            let n = src.len().min(data.len());
            data[..n].copy_from_slice(&src[..n]);
        }
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let (Ok(start), Ok(offset32)) = (usize::try_from(offset), u32::try_from(offset)) else {
            return;
        };
        let Some(dst) = start
            .checked_add(data.len())
            .and_then(|end| self.connection.config.get_mut(start..end))
        else {
            log::warn!("vhost-user-blk: config write outside the config space at {offset}");
            return;
        };
        dst.copy_from_slice(data);
        if let Err(e) =
            self.connection
                .frontend
                .set_config(offset32, VhostUserConfigFlags::WRITABLE, data)
        {
            log::error!(
                "vhost-user-blk {}: SET_CONFIG: {}",
                self.connection.socket,
                ch_log::error_chain(&e)
            );
        }
    }

    fn activate(
        &mut self,
        mem: Arc<GuestMemoryMmap>,
        interrupt: Arc<dyn VirtioInterrupt>,
        queues: Vec<ActivatedQueue>,
    ) -> Result<(), ActivateError> {
        // A second activation without a reset: stop what runs first.
        self.stop();
        match self.start(&mem, interrupt, &queues) {
            Ok(mut running) => {
                running.kicks = queues.into_iter().map(|q| q.kick).collect();
                log::info!(
                    "vhost-user-blk {}: {} queue(s) handed to the backend",
                    self.connection.socket,
                    running.indexes.len()
                );
                self.running = Some(running);
                Ok(())
            }
            Err(e) => {
                let message = ch_log::error_chain(&e);
                log::error!("{message}");
                Err(ActivateError::BadActivate(message))
            }
        }
    }

    fn reset(&mut self) -> Vec<EventFd> {
        self.stop()
    }

    fn shutdown(&mut self) {
        self.stop();
    }
}
