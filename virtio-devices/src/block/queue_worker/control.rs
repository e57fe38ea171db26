//! A queue worker's control channel: what the device (and, through it,
//! the VMM's control loop) asks of a running worker.
//!
//! Commands travel on an mpsc channel; the worker's control eventfd
//! wakes it to read them. [`WorkerCommand::Stop`] ends the worker once
//! its requests in flight have completed. [`WorkerCommand::Pause`] makes
//! it stop taking chains, wait until nothing is in flight, answer on the
//! given sender, and then block until [`WorkerCommand::Resume`] (which
//! may carry new parser limits, e.g. a grown capacity) or `Stop`. While a
//! worker is paused its disk has no request of this queue in flight, so
//! the owner may resize, flush or snapshot the image.

use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;

use log::error;
use vmm_sys_util::eventfd::EventFd;

use super::WorkerState;
use crate::block::request_parser::ParserLimits;

/// What a worker is asked to do.
pub enum WorkerCommand {
    /// Complete what is in flight, then return.
    Stop,
    /// Complete what is in flight, take nothing new, send the queue
    /// index on the sender, then wait for `Resume` or `Stop`.
    Pause(Sender<u16>),
    /// Take chains again, checking them against these limits.
    Resume(ParserLimits),
}

/// The device's end of one worker's control channel.
pub struct WorkerControl {
    commands: Sender<WorkerCommand>,
    wake: Arc<EventFd>,
}

impl WorkerControl {
    pub fn new(commands: Sender<WorkerCommand>, wake: Arc<EventFd>) -> Self {
        WorkerControl { commands, wake }
    }

    /// Sends `cmd` and wakes the worker; false if the worker is gone.
    pub fn send(&self, cmd: WorkerCommand) -> bool {
        if self.commands.send(cmd).is_err() {
            return false;
        }
        if let Err(e) = self.wake.write(1) {
            error!("virtio-blk: cannot wake a queue worker: {e}");
            return false;
        }
        true
    }
}

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
                Err(TryRecvError::Empty) => return ControlOutcome::Continue,
            }
        }
    }

    /// Whether a pause was asked for and nothing is in flight any more.
    pub(super) fn ready_to_park(&self) -> bool {
        self.pause_ack.is_some() && self.pending.is_empty() && self.w.disk.in_flight() == 0
    }

    /// Answers the pause and blocks until resumed or stopped.
    pub(super) fn park(&mut self) -> ControlOutcome {
        if let Some(ack) = self.pause_ack.take() {
            // The device may have given up waiting; nothing to do then.
            let _ = ack.send(self.w.index);
        }
        self.w.counters.set_in_flight(0);
        loop {
            match wait_command(&self.w.commands) {
                Some(WorkerCommand::Resume(limits)) => {
                    self.w.limits = limits;
                    // Chains posted (and kicks consumed) while paused are
                    // taken now.
                    self.process_available();
                    return ControlOutcome::Continue;
                }
                Some(WorkerCommand::Pause(ack)) => {
                    let _ = ack.send(self.w.index);
                }
                Some(WorkerCommand::Stop) | None => return ControlOutcome::Stop,
            }
        }
    }
}

fn wait_command(rx: &Receiver<WorkerCommand>) -> Option<WorkerCommand> {
    rx.recv().ok()
}
