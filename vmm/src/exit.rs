//! How the VM asks to end or restart, and how the VMM is asked to end:
//! an [`ExitReason`] requested on the one [`ExitSignal`], which wakes the
//! control loop (`crate::control`) through its eventfd. The guest's
//! devices (i8042, the ACPI registers) and the vCPU threads request; so
//! do the signal handlers and `vmm.shutdown`; the loop takes the reason.

use std::sync::{Mutex, PoisonError};

use vmm_sys_util::eventfd::EventFd;

/// Why the VM (or the VMM) ended, or what the guest asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitReason {
    /// The guest asked for a reset (i8042, the ACPI reset register, a
    /// triple fault): the VM reboots.
    Reset,
    /// The guest powered off (ACPI S5): the VMM ends, as upstream's does.
    PowerOff,
    /// SIGTERM or SIGINT.
    Signal(i32),
    /// `vmm.shutdown` through the API.
    ApiShutdown,
    /// Something we cannot continue from.
    Fatal(String),
}

/// First reason wins; the control loop (`crate::control`) waits on the
/// eventfd.
pub struct ExitSignal {
    reason: Mutex<Option<ExitReason>>,
    evt: EventFd,
}

impl ExitSignal {
    pub fn new() -> std::io::Result<Self> {
        Ok(ExitSignal {
            reason: Mutex::new(None),
            evt: EventFd::new(libc::EFD_NONBLOCK)?,
        })
    }

    pub fn request(&self, reason: ExitReason) {
        let mut r = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if r.is_none() {
            *r = Some(reason);
        }
        if let Err(e) = self.evt.write(1) {
            log::error!("cannot signal VM exit: {e}");
        }
    }

    /// Takes the reason requested so far (the next request wins again).
    pub fn take(&self) -> Option<ExitReason> {
        let _ = self.evt.read();
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// The reason requested so far, if any.
    pub fn peek(&self) -> Option<ExitReason> {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn eventfd(&self) -> &EventFd {
        &self.evt
    }
}
