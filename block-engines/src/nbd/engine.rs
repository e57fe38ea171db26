//! [`NbdEngine`]: one queue's engine for one NBD export. It satisfies the
//! same [`Engine`] trait as the file engines, so the executor (plans,
//! accounting, one completion per request) runs unchanged over it.
//!
//! `push` turns a host op into an NBD operation on the queue's
//! connection (READ, WRITE, FLUSH, TRIM, WRITE_ZEROES); `submit` sends
//! everything pushed with one `sendmsg`; completions arrive from the
//! connection's thread in the queue's completion list, which signals the
//! queue's eventfd: the one completion path every engine uses.

use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use super::connection::Connection;
use super::inflight::{OpKind, OpRequest};
use super::iov::IovList;
use super::sink::{Outcome, QueueSink, Sink};
use crate::error::BlockError;
use crate::{Engine, EngineCompletion, HostOp, OpToken};
use nbd::wire::consts::flag;

pub(crate) struct NbdEngine {
    conn: Arc<Connection>,
    sink: Arc<QueueSink>,
    eventfd: Arc<EventFd>,
    flags: u16,
    in_flight: usize,
}

impl NbdEngine {
    pub fn new(conn: Arc<Connection>, eventfd: Arc<EventFd>) -> Self {
        let info = conn.info();
        let flags = if info.has(flag::HAS_FLAGS) {
            info.flags
        } else {
            0
        };
        NbdEngine {
            sink: Arc::new(QueueSink::new(eventfd.clone())),
            conn,
            eventfd,
            flags,
            in_flight: 0,
        }
    }

    fn start(&mut self, token: OpToken, kind: OpKind, offset: u64, len: u64, iov: IovList) {
        self.conn.submit(OpRequest {
            sink: Sink::Queue(self.sink.clone()),
            token,
            kind,
            offset,
            len,
            iov,
        });
    }

    /// Completes `token` at once (an op the server need not see).
    fn done_now(&self, token: OpToken) {
        Sink::Queue(self.sink.clone()).deliver(Outcome {
            token,
            result: Ok(0),
            extents: Vec::new(),
        });
    }
}

impl Engine for NbdEngine {
    unsafe fn push(&mut self, token: OpToken, op: HostOp) -> Result<(), BlockError> {
        self.in_flight += 1;
        let has = |f: u16| self.flags & f != 0;
        match op {
            HostOp::Readv { offset, iov, .. } => {
                // SAFETY: the caller promises the iovecs are valid.
                let iov = unsafe { IovList::from_raw(&iov) };
                self.start(token, OpKind::Read, offset, iov.len(), iov);
            }
            HostOp::Writev { offset, iov, .. } => {
                // SAFETY: as above.
                let iov = unsafe { IovList::from_raw(&iov) };
                self.start(token, OpKind::Write, offset, iov.len(), iov);
            }
            HostOp::Fdatasync { .. } if has(flag::SEND_FLUSH) => {
                self.start(token, OpKind::Flush, 0, 0, IovList::empty())
            }
            HostOp::PunchHole { offset, len, .. } if has(flag::SEND_TRIM) => {
                self.start(token, OpKind::Trim, offset, len, IovList::empty())
            }
            HostOp::ZeroRange { offset, len, .. } => {
                let kind = if has(flag::SEND_WRITE_ZEROES) {
                    OpKind::WriteZeroes
                } else {
                    OpKind::WriteZeroData
                };
                self.start(token, kind, offset, len, IovList::empty());
            }
            // No FLUSH: the server has no volatile cache to flush. No
            // TRIM: discarding is a hint.
            HostOp::Fdatasync { .. } | HostOp::PunchHole { .. } => self.done_now(token),
        }
        Ok(())
    }

    fn submit(&mut self) -> Result<(), BlockError> {
        self.conn.flush();
        Ok(())
    }

    fn reap(&mut self, out: &mut Vec<EngineCompletion>) {
        self.in_flight -= self.sink.take(out);
    }

    fn wait(&mut self, out: &mut Vec<EngineCompletion>) -> Result<(), BlockError> {
        if self.in_flight > 0 {
            self.conn.flush();
            self.in_flight -= self.sink.wait(out);
        }
        Ok(())
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn eventfd(&self) -> &Arc<EventFd> {
        &self.eventfd
    }
}

impl Drop for NbdEngine {
    /// The executor waits for every op before dropping its engine; if it
    /// could not, the connection forgets this queue's operations so their
    /// memory is never written again.
    fn drop(&mut self) {
        if self.in_flight > 0 {
            self.conn.forget(&Sink::Queue(self.sink.clone()));
        }
    }
}
