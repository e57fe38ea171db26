//! The worker's end of its control channel ([`super::control`]): reading
//! the commands when the control eventfd fires, and parking the worker
//! while it is paused, until a resume or a stop. A parked worker may be
//! handed a queue on another image (the image switch): it moves its
//! epoll registration from the old queue's completion eventfd to the new
//! one's and sends the old queue back.

use std::os::fd::AsRawFd;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};

use block::DiskQueue;
use log::error;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::control::{SwapAnswer, WorkerCommand};
use super::state::WorkerState;
use super::tokens::COMPLETION;

/// What the event loop should do after reading the control channel.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum ControlOutcome {
    Continue,
    Stop,
}

impl WorkerState {
    /// Reads every queued command (the control eventfd fired). A channel
    /// whose device end is gone means stop.
    pub(super) fn take_commands(&mut self) -> ControlOutcome {
        let _ = self.w.control.read();
        loop {
            match self.w.commands.try_recv() {
                Ok(WorkerCommand::Stop) | Err(TryRecvError::Disconnected) => {
                    return ControlOutcome::Stop
                }
                Ok(WorkerCommand::Pause(ack)) => self.pause_ack = Some(ack),
                Ok(WorkerCommand::Resume(limits)) => {
                    // Not paused (a resume that crossed a stop): just
                    // take the limits.
                    self.w.limits = limits;
                    self.pause_ack = None;
                }
                Ok(WorkerCommand::Swap { queue, done }) => {
                    // Requests may be in flight: never switch here.
                    let _ = done.send(SwapAnswer {
                        index: self.w.index,
                        unused: *queue,
                        swapped: false,
                    });
                }
                Err(TryRecvError::Empty) => return ControlOutcome::Continue,
            }
        }
    }

    /// Whether a pause was asked for and nothing is in flight any more.
    pub(super) fn ready_to_park(&self) -> bool {
        self.pause_ack.is_some() && self.pending.is_empty() && self.w.disk.in_flight() == 0
    }

    /// Answers the pause and blocks until resumed or stopped; `epoll`
    /// is the event loop's (a swap moves the completion source in it).
    pub(super) fn park(&mut self, epoll: &Epoll) -> ControlOutcome {
        if let Some(ack) = self.pause_ack.take() {
            // The device may have given up waiting; nothing to do then.
            let _ = ack.send(self.w.index);
        }
        self.w.counters.set_in_flight(0);
        loop {
            match wait_command(&self.w.commands) {
                Some(WorkerCommand::Resume(limits)) => {
                    self.w.limits = limits;
                    // A filter removed during the pause lets go of its
                    // images now, not at this queue's next request.
                    self.w.disk.refresh_filters();
                    // Chains posted (and kicks consumed) while paused are
                    // taken now.
                    self.process_available();
                    return ControlOutcome::Continue;
                }
                Some(WorkerCommand::Pause(ack)) => {
                    let _ = ack.send(self.w.index);
                }
                Some(WorkerCommand::Swap { queue, done }) => self.swap_queue(epoll, *queue, &done),
                Some(WorkerCommand::Stop) | None => return ControlOutcome::Stop,
            }
        }
    }

    /// Serves the queue from `queue` from now on (nothing is in flight:
    /// the worker is parked) and sends the old one back on `done`. If
    /// the epoll set cannot take the new completion eventfd, the worker
    /// keeps its old queue and sends the new one back unused.
    fn swap_queue(&mut self, epoll: &Epoll, mut queue: DiskQueue, done: &Sender<SwapAnswer>) {
        let old_fd = self.w.disk.completion_eventfd().as_raw_fd();
        let new_fd = queue.completion_eventfd().as_raw_fd();
        let event = EpollEvent::new(EventSet::IN, COMPLETION);
        if let Err(e) = epoll.ctl(ControlOperation::Add, new_fd, event) {
            error!(
                "virtio-blk queue {}: cannot watch the new image's completions: {e}",
                self.w.index
            );
            let _ = done.send(SwapAnswer {
                index: self.w.index,
                unused: queue,
                swapped: false,
            });
            return;
        }
        if let Err(e) = epoll.ctl(ControlOperation::Delete, old_fd, EpollEvent::default()) {
            // Harmless: the old eventfd closes with its queue, which
            // takes it out of the set.
            error!(
                "virtio-blk queue {}: cannot unwatch the old image's completions: {e}",
                self.w.index
            );
        }
        queue.allow_writes_at_submit();
        let old = std::mem::replace(&mut self.w.disk, queue);
        self.signal_stale = false;
        let _ = done.send(SwapAnswer {
            index: self.w.index,
            unused: old,
            swapped: true,
        });
    }
}

fn wait_command(rx: &Receiver<WorkerCommand>) -> Option<WorkerCommand> {
    rx.recv().ok()
}
