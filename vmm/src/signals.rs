//! Signal handling: SIGTERM and SIGINT end the VM cleanly (the handler
//! records the signal and wakes the main thread through the exit
//! eventfd); the vCPU kick signal gets an empty handler so it interrupts
//! `KVM_RUN` instead of killing the process.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::register_signal_handler;

static EXIT_FD: AtomicI32 = AtomicI32::new(-1);
static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_exit_signal(num: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    PENDING.store(num, Ordering::SeqCst);
    let fd = EXIT_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: write(2) is async-signal-safe; the buffer is a local
        // u64 that outlives the call, and the fd is the exit eventfd,
        // which lives until the process exits.
        unsafe {
            libc::write(fd, (&one as *const u64).cast(), 8);
        }
    }
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// Installs the handlers; `exit` must live for the rest of the process.
pub fn install(exit: &EventFd) -> std::io::Result<()> {
    EXIT_FD.store(exit.as_raw_fd(), Ordering::SeqCst);
    for sig in [libc::SIGTERM, libc::SIGINT] {
        register_signal_handler(sig, on_exit_signal)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    }
    register_signal_handler(crate::vcpu_thread::kick_signal(), on_kick)
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    Ok(())
}

/// The exit signal received, if any (cleared).
pub fn take_pending() -> Option<i32> {
    match PENDING.swap(0, Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}
