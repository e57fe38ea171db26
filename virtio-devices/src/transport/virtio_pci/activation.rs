//! Activation of a [`VirtioPciDevice`]: when the driver sets DRIVER_OK,
//! the queue registers the driver programmed become `virtio_queue::Queue`s
//! (checked against guest memory) and leave, with their kick eventfds and
//! an MSI-X interrupt handle, for [`crate::VirtioDevice::activate`]. A failed
//! activation gets the kick eventfds back so a later attempt can work.

use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;

use super::{DeviceEvent, VirtioPciDevice, VIRTIO_RING_F_EVENT_IDX};
use crate::device::ActivatedQueue;
use crate::transport::msix::MsixInterrupt;

impl VirtioPciDevice {
    pub(super) fn activate(&mut self) -> Result<(), String> {
        let event_idx = self.common.driver_features & VIRTIO_RING_F_EVENT_IDX != 0;
        let mut queues = Vec::new();
        for (i, regs) in self.common.queues.iter().enumerate() {
            if !regs.enabled {
                continue;
            }
            let mut q = Queue::new(regs.max_size).map_err(|e| format!("queue {i}: {e:?}"))?;
            // The `set_*` setters of `QueueT` log and keep the old value
            // (0) on a bad size or misaligned address, which would hand
            // the device rings at guest address 0: refuse instead.
            q.try_set_size(regs.size)
                .map_err(|e| format!("queue {i} size {}: {e:?}", regs.size))?;
            q.try_set_desc_table_address(GuestAddress(regs.desc))
                .map_err(|e| format!("queue {i} descriptor table {:#x}: {e:?}", regs.desc))?;
            q.try_set_avail_ring_address(GuestAddress(regs.driver))
                .map_err(|e| format!("queue {i} driver area {:#x}: {e:?}", regs.driver))?;
            q.try_set_used_ring_address(GuestAddress(regs.device))
                .map_err(|e| format!("queue {i} device area {:#x}: {e:?}", regs.device))?;
            q.set_event_idx(event_idx);
            q.set_ready(true);
            if !q.is_valid(&*self.mem) {
                return Err(format!("queue {i} addresses are not valid guest memory"));
            }
            queues.push((i, q));
        }
        if queues.is_empty() {
            return Err("no queue enabled".into());
        }
        let mut activated = Vec::with_capacity(queues.len());
        for (i, queue) in queues {
            let kick = self
                .kicks
                .get_mut(i)
                .and_then(Option::take)
                .ok_or_else(|| format!("queue {i} kick eventfd is missing"))?;
            activated.push(ActivatedQueue {
                index: u16::try_from(i).map_err(|_| "queue index")?,
                queue,
                kick,
            });
        }
        let interrupt = Arc::new(MsixInterrupt(self.msix.clone()));
        let mem = self.mem.clone();
        let result = match self.activation_hook.clone() {
            None => self
                .device
                .activate(mem, interrupt, activated)
                .map_err(|e| e.to_string()),
            Some(hook) => {
                let device = &mut self.device;
                std::thread::scope(|scope| {
                    let activator = std::thread::Builder::new()
                        .name("virtio-activate".into())
                        .spawn_scoped(scope, move || {
                            hook()?;
                            device
                                .activate(mem, interrupt, activated)
                                .map_err(|e| e.to_string())
                        })
                        .map_err(|e| format!("cannot spawn the activation thread: {e}"))?;
                    activator
                        .join()
                        .unwrap_or_else(|_| Err("the activation thread panicked".into()))
                })
            }
        };
        match result {
            Ok(()) => {
                self.activated = true;
                self.observe(DeviceEvent::Activated);
                Ok(())
            }
            Err(e) => {
                // The device dropped the eventfds it was given; replace
                // them from our clones so a later attempt works.
                self.restore_kicks();
                Err(e)
            }
        }
    }

    /// Refills the kick slots the device holds or dropped, from our own
    /// clones: a clone shares the eventfd object, so the KVM ioeventfd
    /// registrations keep working.
    pub(super) fn restore_kicks(&mut self) {
        for (slot, clone) in self.kicks.iter_mut().zip(&self.kick_clones) {
            if slot.is_none() {
                match clone.try_clone() {
                    Ok(fd) => *slot = Some(fd),
                    Err(e) => log::error!("cannot restore a kick eventfd: {e}"),
                }
            }
        }
    }
}
