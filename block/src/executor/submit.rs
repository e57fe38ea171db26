//! The coordinator's submission flow: a request is admitted (partial-block
//! locks, its write number), built into ops by the [`OpBuilder`](super::build::OpBuilder), owned
//! by the accounting's in-flight table, and its ops pushed to the engine.
//!
//! A request enters in [`Executor::start`]; it either completes at once
//! (errors, zero and cached pieces only), is parked (a blocked write,
//! replanned by [`Executor::retry_parked`] on every drain), or enters the
//! table with its ops pushed ([`Executor::push_op`], also used to push an
//! op again after a short transfer).

use super::build::Built;
use super::rmw::{new_owner, partial_blocks};
use super::table::{token, AfterRead, InFlight, OpKind};
use super::Executor;
use crate::error::BlockError;
use crate::request::{BlockRequest, RequestOp};
use block_engines::{HostOp, RawIovecs};

impl Executor {
    /// Admits, builds and pushes `req` (see the module docs).
    pub(super) fn start(&mut self, mut req: BlockRequest) {
        let rmw_owner = match self.lock_partial_blocks(&req) {
            Ok(owner) => owner,
            Err(()) => return self.parked.push_back(req),
        };
        // Writes take their number before planning (see `barrier`).
        let frees = matches!(
            req.op,
            RequestOp::Discard { .. } | RequestOp::WriteZeroes { .. }
        );
        let write_seq = match req.op {
            RequestOp::Read | RequestOp::Flush => None,
            _ => Some(self.writes.begin()),
        };
        let release = |this: &mut Self| {
            if let Some(owner) = rmw_owner {
                this.shared.rmw.unlock(owner);
            }
            if let Some(seq) = write_seq {
                this.writes.end(seq, &this.shared.writes);
            }
        };
        let mut segs = self.builder.spares.segs();
        if let Err(e) = segs.fill(&mut req.memory) {
            release(self);
            return self.acct.complete_now(req, Err(e));
        }
        let built = self
            .builder
            .build(&req, &segs, &self.eventfd, &self.compressed);
        let (ops, commit, plan_frees) = match built {
            Ok(Built::Ops(ops, commit, plan_frees)) => (ops, commit, plan_frees),
            Ok(Built::Parked) => {
                release(self);
                return self.parked.push_back(req);
            }
            Err(e) => {
                release(self);
                return self.acct.complete_now(req, Err(e));
            }
        };
        // Read after planning: any write that could have been planned into
        // a cluster this commit frees holds a smaller number.
        let barrier =
            ((frees || plan_frees) && commit.is_some()).then(|| self.shared.writes.barrier());
        let bytes = match req.op {
            RequestOp::Read | RequestOp::Write => segs.len(),
            _ => 0,
        };
        let n = ops.len();
        let len = req.len();
        let slot = self.acct.insert(InFlight {
            user_data: req.user_data,
            op: req.op,
            offset: req.offset,
            len,
            memory: req.memory,
            segs,
            ops,
            pending: n,
            error: None,
            commit,
            bytes,
            rmw_owner,
            write_seq,
            barrier,
        });
        for i in 0..n {
            self.push_op(slot, i);
        }
        self.finish_if_done(slot);
    }

    /// Locks the partial O_DIRECT blocks of an unaligned write (see
    /// `rmw`); `Err` means another write holds one and `req` must wait.
    fn lock_partial_blocks(&mut self, req: &BlockRequest) -> Result<Option<u64>, ()> {
        if self.rmw_block <= 1 || req.op == RequestOp::Read || req.op == RequestOp::Flush {
            return Ok(None);
        }
        let blocks = partial_blocks(req.offset, req.len(), self.rmw_block);
        if blocks.is_empty() {
            return Ok(None);
        }
        let owner = new_owner();
        if self.shared.rmw.try_lock(&blocks, owner, &self.eventfd) {
            Ok(Some(owner))
        } else {
            Err(())
        }
    }

    /// Re-plans every parked write (their waker fired, or might have).
    pub(super) fn retry_parked(&mut self) {
        for _ in 0..self.parked.len() {
            if let Some(req) = self.parked.pop_front() {
                self.start(req);
            }
        }
    }

    /// Pushes op `i` of `slot` as it stands (first push or resubmission);
    /// a push failure finishes the op with that error.
    pub(super) fn push_op(&mut self, slot: u32, i: usize) {
        let Some(op) = self.acct.op_mut(slot, i) else {
            return;
        };
        if op.done {
            return;
        }
        if let AfterRead::Inflate { ext, .. } = op.after {
            if op.kind == OpKind::AwaitInflate {
                if !self.compressed.wait(&ext, token(slot, i as u32)) {
                    // The leader failed while this request was built.
                    let e = BlockError::Read {
                        offset: ext.host_offset,
                        source: std::io::Error::other("read of the compressed cluster failed"),
                    };
                    self.op_finished(slot, i, Some(e));
                }
                return;
            }
            self.compressed.lead(&ext);
        }
        if let Some(zero) = op.zero_source.as_ref() {
            let n = op.remaining.min(zero.len() as u64) as usize;
            op.iov.clear();
            op.iov_start = 0;
            op.iov.push(libc::iovec {
                iov_base: zero.as_ptr().cast(),
                iov_len: n,
            });
        }
        let iov = RawIovecs {
            ptr: op.iov[op.iov_start.min(op.iov.len())..].as_ptr(),
            count: (op.iov.len().saturating_sub(op.iov_start)) as u32,
        };
        let host_op = match op.kind {
            OpKind::Read => HostOp::Readv {
                file: op.file,
                offset: op.offset,
                iov,
            },
            OpKind::Write => HostOp::Writev {
                file: op.file,
                offset: op.offset,
                iov,
            },
            OpKind::Fdatasync => HostOp::Fdatasync { file: op.file },
            OpKind::PunchHole => HostOp::PunchHole {
                file: op.file,
                offset: op.offset,
                len: op.remaining,
            },
            OpKind::ZeroRange => HostOp::ZeroRange {
                file: op.file,
                offset: op.offset,
                len: op.remaining,
            },
            // Handled above; never reaches the engine.
            OpKind::AwaitInflate => return,
        };
        // SAFETY: the iovecs point into the request's memory (through its
        // `segs`) or into `op.buffers`/`op.zero_source`, all owned by its
        // in-flight entry; the entry leaves the accounting's table only
        // when every op has been reaped (`Accounting::finish_if_done`),
        // and `Executor::drop` waits for the engine to reap every op
        // before the table is freed. The iovec array is not touched until
        // the op is reaped.
        let pushed = unsafe { self.engine.push(token(slot, i as u32), host_op) };
        if let Err(e) = pushed {
            self.op_finished(slot, i, Some(e));
        }
    }
}
