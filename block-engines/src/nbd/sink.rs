//! Where a finished NBD operation goes: a queue's engine (its completion
//! list and the queue's eventfd, the one completion path every engine
//! uses) or a blocked caller of the file's blocking helpers.

use std::io;
use std::sync::{Arc, Condvar, Mutex};

use vmm_sys_util::eventfd::EventFd;

use crate::EngineCompletion;
use nbd::client::Extent;

/// What an operation ended with.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub token: u64,
    pub result: io::Result<u64>,
    /// BLOCK_STATUS extents (blocking callers only).
    pub extents: Vec<Extent>,
}

/// Completions of one queue's NBD ops, with the queue's eventfd.
pub(crate) struct QueueSink {
    done: Mutex<Vec<EngineCompletion>>,
    ready: Condvar,
    eventfd: Arc<EventFd>,
}

impl QueueSink {
    pub fn new(eventfd: Arc<EventFd>) -> Self {
        QueueSink {
            done: Mutex::new(Vec::new()),
            ready: Condvar::new(),
            eventfd,
        }
    }

    fn push(&self, c: EngineCompletion) {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).push(c);
        self.ready.notify_all();
        // An overflowing counter already wakes the queue.
        let _ = self.eventfd.write(1);
    }

    /// Moves every completion to `out`.
    pub fn take(&self, out: &mut Vec<EngineCompletion>) -> usize {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        let n = done.len();
        out.append(&mut done);
        n
    }

    /// Blocks until a completion is there, then takes them all.
    pub fn wait(&self, out: &mut Vec<EngineCompletion>) -> usize {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        while done.is_empty() {
            done = self.ready.wait(done).unwrap_or_else(|p| p.into_inner());
        }
        let n = done.len();
        out.append(&mut done);
        n
    }
}

/// One blocking caller's result slot.
#[derive(Default)]
pub(crate) struct Waiter {
    slot: Mutex<Option<Outcome>>,
    ready: Condvar,
}

impl Waiter {
    pub fn wait(&self) -> Outcome {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(o) = slot.take() {
                return o;
            }
            slot = self.ready.wait(slot).unwrap_or_else(|p| p.into_inner());
        }
    }
}

#[derive(Clone)]
pub(crate) enum Sink {
    Queue(Arc<QueueSink>),
    Waiter(Arc<Waiter>),
}

impl Sink {
    pub fn deliver(&self, o: Outcome) {
        match self {
            Sink::Queue(q) => q.push(EngineCompletion {
                token: o.token,
                result: o.result,
            }),
            Sink::Waiter(w) => {
                *w.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(o);
                w.ready.notify_all();
            }
        }
    }

    /// Whether two sinks are the same one.
    pub fn same(&self, other: &Sink) -> bool {
        match (self, other) {
            (Sink::Queue(a), Sink::Queue(b)) => Arc::ptr_eq(a, b),
            (Sink::Waiter(a), Sink::Waiter(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}
