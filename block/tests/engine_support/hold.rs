//! An engine wrapper that holds back writes while a gate is closed: they
//! are kept (not run) until the test opens the gate, which lets a test
//! keep one write "in flight" for as long as it likes, deterministically.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use block::engines::{Engine, EngineCompletion, HostOp, OpToken};
use block::error::BlockError;
use vmm_sys_util::eventfd::EventFd;

pub struct HoldEngine {
    inner: Box<dyn Engine>,
    /// Writes are held while this is true.
    closed: Arc<AtomicBool>,
    held: Vec<(OpToken, HostOp)>,
}

// SAFETY: the held ops' iovecs point into memory the executor keeps alive
// per `Engine::push`'s contract; they are used only by the owning thread.
unsafe impl Send for HoldEngine {}

impl HoldEngine {
    /// Wraps `inner`; writes pushed while the returned gate is `true` wait
    /// until it is set to `false`.
    pub fn new(inner: Box<dyn Engine>) -> (Self, Arc<AtomicBool>) {
        let closed = Arc::new(AtomicBool::new(true));
        (
            HoldEngine {
                inner,
                closed: closed.clone(),
                held: Vec::new(),
            },
            closed,
        )
    }

    /// How many writes are held right now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    fn release(&mut self) -> Result<(), BlockError> {
        if self.closed.load(Ordering::SeqCst) || self.held.is_empty() {
            return Ok(());
        }
        for (token, op) in std::mem::take(&mut self.held) {
            // SAFETY: the op was pushed to us under the same contract,
            // which still holds (it has not been reaped).
            unsafe { self.inner.push(token, op)? };
        }
        self.inner.submit()
    }
}

impl Engine for HoldEngine {
    unsafe fn push(&mut self, token: OpToken, op: HostOp) -> Result<(), BlockError> {
        if self.closed.load(Ordering::SeqCst) && matches!(op, HostOp::Writev { .. }) {
            self.held.push((token, op));
            return Ok(());
        }
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.push(token, op) }
    }

    fn submit(&mut self) -> Result<(), BlockError> {
        self.release()?;
        self.inner.submit()
    }

    fn reap(&mut self, out: &mut Vec<EngineCompletion>) {
        let _ = self.release();
        self.inner.reap(out)
    }

    fn wait(&mut self, out: &mut Vec<EngineCompletion>) -> Result<(), BlockError> {
        self.release()?;
        if self.inner.in_flight() == 0 {
            // Only held writes: nothing can finish until the gate opens.
            return Ok(());
        }
        self.inner.wait(out)
    }

    fn in_flight(&self) -> usize {
        self.held.len() + self.inner.in_flight()
    }

    fn eventfd(&self) -> &Arc<EventFd> {
        self.inner.eventfd()
    }
}
