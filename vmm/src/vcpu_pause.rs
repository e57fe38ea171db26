//! Pausing the vCPUs for `vm.pause`: a gate every vCPU thread passes
//! between two `KVM_RUN`s.
//!
//! [`PauseGate::pause`] closes the gate and kicks each thread out of
//! `KVM_RUN` (the same signal that stops them) until every one is parked
//! at the gate; [`PauseGate::resume`] opens it. A thread parked at the
//! gate also leaves when its stop flag is set and the gate is woken
//! ([`PauseGate::wake_for_stop`]), so a paused VM can still be shut down.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use vmm_sys_util::signal::Killable;

use crate::vcpu_thread::{kick_signal, VcpuHandle};

/// How long [`PauseGate::pause`] waits for every vCPU to park.
pub const PARK_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Default)]
struct GateState {
    closed: bool,
    parked: usize,
}

#[derive(Default)]
pub struct PauseGate {
    state: Mutex<GateState>,
    changed: Condvar,
}

impl PauseGate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Called by a vCPU thread before each `KVM_RUN`: blocks while the
    /// gate is closed (and `stop` is not set).
    pub fn pass(&self, stop: &AtomicBool) {
        let mut s = self.lock();
        if !s.closed {
            return;
        }
        s.parked += 1;
        self.changed.notify_all();
        while s.closed && !stop.load(Ordering::Acquire) {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.parked -= 1;
        self.changed.notify_all();
    }

    /// Closes the gate and waits until every thread in `vcpus` is parked
    /// at it (or has ended). On timeout the gate is opened again.
    pub fn pause(&self, vcpus: &[VcpuHandle]) -> Result<(), String> {
        self.lock().closed = true;
        let deadline = Instant::now() + PARK_TIMEOUT;
        loop {
            let running = vcpus.iter().filter(|h| !h.thread.is_finished()).count();
            let s = self.lock();
            if s.parked >= running {
                return Ok(());
            }
            if Instant::now() >= deadline {
                drop(s);
                self.resume();
                return Err(format!(
                    "{} of {running} vCPU(s) did not stop within {PARK_TIMEOUT:?}",
                    running - self.lock().parked
                ));
            }
            drop(s);
            // A kick that lands outside KVM_RUN is lost: repeat.
            for h in vcpus.iter().filter(|h| !h.thread.is_finished()) {
                if let Err(e) = h.thread.kill(kick_signal()) {
                    log::warn!("cannot kick a vCPU thread: {e}");
                }
            }
            let s = self.lock();
            let _ = self
                .changed
                .wait_timeout(s, Duration::from_millis(5))
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Opens the gate; parked threads go back to `KVM_RUN`.
    pub fn resume(&self) {
        self.lock().closed = false;
        self.changed.notify_all();
    }

    /// Wakes parked threads so they see their stop flags.
    pub fn wake_for_stop(&self) {
        let _guard = self.lock();
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    extern "C" fn ignore(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

    #[test]
    fn threads_park_and_leave_on_resume_or_stop() {
        // The kicks would end the test process without a handler.
        vmm_sys_util::signal::register_signal_handler(kick_signal(), ignore).unwrap();
        let gate = Arc::new(PauseGate::default());
        let stop = Arc::new(AtomicBool::new(false));
        let passes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let spawn = || {
            let (gate, stop, passes) = (gate.clone(), stop.clone(), passes.clone());
            let thread = std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    gate.pass(&stop);
                    passes.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            VcpuHandle {
                thread,
                stop: Arc::new(AtomicBool::new(false)),
            }
        };
        let handles = vec![spawn(), spawn()];
        gate.pause(&handles).unwrap();
        let before = passes.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(passes.load(Ordering::SeqCst), before, "ran while paused");
        gate.resume();
        let t = Instant::now();
        while passes.load(Ordering::SeqCst) == before && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(passes.load(Ordering::SeqCst) > before);
        gate.pause(&handles).unwrap();
        stop.store(true, Ordering::Release);
        gate.wake_for_stop();
        for h in handles {
            h.thread.join().unwrap();
        }
    }
}
