//! A vCPU thread as the control loop holds it ([`VcpuHandle`]: the
//! thread and its stop flag) and the signal that kicks it out of
//! `KVM_RUN` ([`kick_signal`]), for stopping ([`crate::machine`]) and
//! pausing ([`crate::vcpu_pause`]) alike.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;

/// The signal that kicks a vCPU out of `KVM_RUN`.
pub fn kick_signal() -> i32 {
    libc::SIGRTMIN()
}

/// A running vCPU thread and its stop flag.
pub struct VcpuHandle {
    pub thread: JoinHandle<()>,
    pub stop: Arc<AtomicBool>,
}
