//! The completion side of a queue worker: finished disk requests become
//! used entries, and the driver gets at most one interrupt per drain.
//!
//! Data enters from the [`DiskQueue`](block::DiskQueue)'s completions
//! (drained when its eventfd fires, and between the slices of a large
//! batch, see [`super::WorkerState::process_available`]); it leaves as
//! status bytes written into guest memory, used-ring entries and, unless
//! the driver's EVENT_IDX `used_event` says it does not want one yet, an
//! interrupt. A write in writethrough mode is not completed here: a flush
//! is submitted for it first.

use block::{BlockRequest, IoMemory, RequestOp};
use log::{debug, error, warn};
use virtio_bindings::virtio_blk::VIRTIO_BLK_S_OK;
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress};

use std::time::Instant;

use super::state::{PendingChain, WorkerState};
use crate::block::counters::CountedOp;
use crate::block::error_status::failed_request_status;
use crate::device::InterruptKind;

impl WorkerState {
    /// Drains the disk queue's completions (clearing its eventfd first);
    /// returns how many there were.
    pub(super) fn process_completions(&mut self) -> usize {
        self.signal_stale = false;
        self.complete_finished(true)
    }

    /// Completes what the disk queue has finished without clearing its
    /// eventfd (no system call unless there is something), for the spin
    /// before a sleep; the eventfd is cleared before the worker sleeps
    /// (`signal_stale`). Returns how many there were.
    pub(super) fn reap_finished(&mut self) -> usize {
        let n = self.complete_finished(false);
        self.signal_stale |= n > 0;
        n
    }

    fn complete_finished(&mut self, clear_eventfd: bool) -> usize {
        let mut completions = std::mem::take(&mut self.completions);
        if clear_eventfd {
            self.w.disk.drain_completions(&mut completions);
        } else {
            self.w.disk.reap_completions(&mut completions);
        }
        let drained = completions.len();
        let now = if drained > 0 {
            Instant::now()
        } else {
            self.pass_started
        };
        let mut flushes = Vec::new();
        for c in completions.drain(..) {
            if let IoMemory::Guest { segments, .. } = c.memory {
                self.scratch.recycle(segments);
            }
            let Some(chain) = self.pending.remove(&c.user_data) else {
                warn!(
                    "virtio-blk queue {}: completion for unknown request {:#x}",
                    self.w.index, c.user_data
                );
                continue;
            };
            match c.result {
                Ok(bytes) if chain.flush_after => {
                    // The write is done; the flush that follows is ours,
                    // not the guest's, and is not counted.
                    self.w
                        .counters
                        .completed(chain.op, bytes, now - chain.submitted);
                    let user_data = self.track(PendingChain {
                        flush_after: false,
                        op: CountedOp::Other,
                        ..chain
                    });
                    flushes.push(BlockRequest {
                        user_data,
                        op: RequestOp::Flush,
                        offset: 0,
                        memory: IoMemory::None,
                    });
                }
                Ok(bytes) => {
                    self.w
                        .counters
                        .completed(chain.op, bytes, now - chain.submitted);
                    let data = if chain.is_read {
                        u32::try_from(bytes).unwrap_or(u32::MAX - 1)
                    } else {
                        0
                    };
                    self.complete(chain.head, chain.status, VIRTIO_BLK_S_OK as u8, data + 1);
                }
                Err(e) => {
                    let status = failed_request_status(self.w.index, c.user_data, &e);
                    self.complete(chain.head, chain.status, status, 1);
                }
            }
        }
        self.completions = completions;
        if !flushes.is_empty() {
            self.w.disk.submit_batch_requests(flushes);
        }
        if drained > 0 {
            self.w.counters.set_in_flight(self.pending.len());
        }
        self.notify_if_needed();
        drained
    }

    /// Writes the status byte and adds the used entry.
    pub(super) fn complete(
        &mut self,
        head: u16,
        status_addr: GuestAddress,
        status: u8,
        used_len: u32,
    ) {
        if status != VIRTIO_BLK_S_OK as u8 {
            self.w.counters.failed();
        }
        if let Err(e) = self.w.mem.write_obj(status, status_addr) {
            warn!(
                "virtio-blk queue {}: cannot write status of chain {head}: {e}",
                self.w.index
            );
        }
        self.add_used(head, used_len);
    }

    pub(super) fn add_used(&mut self, head: u16, len: u32) {
        match self.w.queue.add_used(&*self.w.mem, head, len) {
            Ok(()) => self.used_added = true,
            // Guest-triggerable (a head index beyond the queue size): no warning.
            Err(e) => debug!("virtio-blk queue {}: add used {head}: {e}", self.w.index),
        }
    }

    /// One interrupt for everything added since the last one, unless the
    /// driver's used_event says it does not want it yet.
    pub(super) fn notify_if_needed(&mut self) {
        if !self.used_added {
            return;
        }
        self.used_added = false;
        let needed = match self.w.queue.needs_notification(&*self.w.mem) {
            Ok(n) => n,
            Err(e) => {
                warn!("virtio-blk queue {}: needs notification: {e}", self.w.index);
                true
            }
        };
        if needed {
            if let Err(e) = self.w.interrupt.trigger(InterruptKind::Queue(self.w.index)) {
                error!("virtio-blk queue {}: interrupt: {e}", self.w.index);
            }
        }
    }
}
