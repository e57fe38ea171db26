//! What the KVM tests share: guest RAM, a VM or a skip, and a vCPU run
//! with a deadline.

use std::sync::mpsc;
use std::time::Duration;

use hypervisor::Vm;

pub const MEM_SIZE: usize = 1 << 20;

/// Anonymous guest RAM that unmaps on drop.
pub struct Ram(pub *mut u8);

// SAFETY: the mapping is plain memory owned by this value; moving the
// owner to another thread moves nothing else.
unsafe impl Send for Ram {}

impl Ram {
    pub fn new() -> Ram {
        // SAFETY: anonymous private mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MEM_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Ram(p.cast())
    }

    pub fn write(&mut self, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= MEM_SIZE);
        // SAFETY: in bounds of our mapping (checked above).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.0.add(at), bytes.len()) };
    }
}

impl Drop for Ram {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `new`.
        unsafe { libc::munmap(self.0.cast(), MEM_SIZE) };
    }
}

pub fn vm_or_skip() -> Option<std::sync::Arc<Vm>> {
    match Vm::new() {
        Ok(vm) => Some(vm),
        Err(e) => {
            testkit::available("KVM", Err(e.to_string()));
            None
        }
    }
}

/// Runs `body` on its own thread and fails the test if it takes longer
/// than `limit` (a guest that spins without exiting would otherwise hang
/// the test; the stuck thread dies with the test process).
pub fn with_deadline<T: Send + 'static>(
    limit: Duration,
    body: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => v,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("the guest did not finish within {limit:?}"),
    }
}
