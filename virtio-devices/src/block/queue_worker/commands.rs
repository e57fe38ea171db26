//! The worker's end of its control channel ([`super::control`]): reading
//! the commands when the control eventfd fires, and parking the worker
//! while it is paused, until a resume or a stop.

use std::sync::mpsc::{Receiver, TryRecvError};

use super::control::WorkerCommand;
use super::state::WorkerState;

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
