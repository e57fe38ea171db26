//! Turning a request into host operations: plan it with the format, split
//! the request's memory into iovecs per plan piece, route unaligned
//! O_DIRECT pieces through bounce buffers, and push the ops.
//!
//! A request enters in [`Executor::start`]; it either completes at once
//! (errors, zero and cached pieces only), is parked (a blocked write), or
//! enters the in-flight table with its ops pushed to the engine.

use super::rmw::{new_owner, partial_blocks};
use super::table::{token, AfterRead, InFlight, OpKind, OpSlot};
use super::Executor;
use crate::aligned::AlignedBuf;
use crate::error::BlockError;
use crate::formats::{FileId, WriteOutcome, WritePlan};
use crate::io::align::DioAlign;
use crate::io::memory::{iovecs_aligned, HostSegments, IOV_MAX};
use crate::io::{HostOp, RawIovecs};
use crate::request::{BlockRequest, Completion, RequestOp};

/// Bounce buffers are used in chunks of at most this many bytes.
pub(super) const BOUNCE_CHUNK: u64 = 1 << 20;

/// The most bounce-buffer (and compressed-read buffer) bytes one request
/// may use. Guests that respect the reported block size never need bounce
/// buffers; a request over this fails instead of allocating without bound.
pub(super) const MAX_BOUNCE_PER_REQUEST: u64 = 64 << 20;

/// What a request turned into.
enum Built {
    Ops(Vec<OpSlot>, Option<crate::formats::WriteCommit>),
    Parked,
}

impl Executor {
    /// Plans `req` and pushes its ops (see the module docs).
    pub(super) fn start(&mut self, mut req: BlockRequest) {
        self.bounce_budget = MAX_BOUNCE_PER_REQUEST;
        self.building_write = req.op != RequestOp::Read;
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
            _ => Some(self.shared.writes.begin()),
        };
        let release = |this: &mut Self| {
            if let Some(owner) = rmw_owner {
                this.shared.rmw.unlock(owner);
            }
            if let Some(seq) = write_seq {
                this.shared.writes.end(seq);
            }
        };
        let mut segs = self.spares.segs();
        let segs = match segs.fill(&mut req.memory) {
            Ok(()) => segs,
            Err(e) => {
                release(self);
                return self.complete_now(req, Err(e));
            }
        };
        let built = match req.op {
            RequestOp::Read => self
                .build_read(&req, &segs)
                .map(|ops| Built::Ops(ops, None)),
            RequestOp::Write => self
                .check_first_sector(&req, &segs)
                .and_then(|()| {
                    self.format
                        .plan_write(req.offset, segs.len(), &self.eventfd)
                })
                .and_then(|o| self.build_outcome(o, &segs)),
            RequestOp::Discard { len } => self
                .format
                .plan_discard(req.offset, len, &self.eventfd)
                .and_then(|o| self.build_outcome(o, &segs)),
            RequestOp::WriteZeroes { len, may_unmap } => self
                .format
                .plan_write_zeroes(req.offset, len, may_unmap, &self.eventfd)
                .and_then(|o| self.build_outcome(o, &segs)),
            RequestOp::Flush => self.build_flush().map(|ops| Built::Ops(ops, None)),
        };
        let (ops, commit) = match built {
            Ok(Built::Ops(ops, commit)) => (ops, commit),
            Ok(Built::Parked) => {
                release(self);
                return self.parked.push_back(req);
            }
            Err(e) => {
                release(self);
                return self.complete_now(req, Err(e));
            }
        };
        // Read after planning: any write that could have been planned into
        // a cluster this commit frees holds a smaller number.
        let barrier = (frees && commit.is_some()).then(|| self.shared.writes.barrier());
        let bytes = match req.op {
            RequestOp::Read | RequestOp::Write => segs.len(),
            _ => 0,
        };
        let n = ops.len();
        let slot = self.table.insert(InFlight {
            user_data: req.user_data,
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

    pub(super) fn complete_now(&mut self, req: BlockRequest, result: Result<u64, BlockError>) {
        self.ready.push(Completion {
            user_data: req.user_data,
            result,
            memory: req.memory,
        });
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
        let Some(entry) = self.table.get_mut(slot) else {
            return;
        };
        let Some(op) = entry.ops.get_mut(i) else {
            return;
        };
        if op.done {
            return;
        }
        if let AfterRead::Inflate { ext, .. } = op.after {
            if op.kind == OpKind::AwaitInflate {
                if !self.joins.wait(&ext, token(slot, i as u32)) {
                    // The leader failed while this request was built.
                    let e = BlockError::Read {
                        offset: ext.host_offset,
                        source: std::io::Error::other("read of the compressed cluster failed"),
                    };
                    self.op_finished(slot, i, Some(e));
                }
                return;
            }
            self.joins.lead(&ext);
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
        // SAFETY: the iovecs point into `entry.memory` (through `segs`) or
        // into `op.buffers`/`op.zero_source`, all owned by this in-flight
        // entry; the entry leaves the table only when every op has been
        // reaped (`finish_if_done`), and `Executor::drop` waits for the
        // engine to reap every op before the table is freed. The iovec
        // array is not touched until the op is reaped.
        let pushed = unsafe { self.engine.push(token(slot, i as u32), host_op) };
        if let Err(e) = pushed {
            self.op_finished(slot, i, Some(e));
        }
    }

    pub(super) fn file_align(&self, file: FileId) -> Result<DioAlign, BlockError> {
        self.align
            .get(usize::from(file.0))
            .copied()
            .ok_or_else(|| BlockError::Read {
                offset: 0,
                source: std::io::Error::other(format!(
                    "plan names file {} the image does not have",
                    file.0
                )),
            })
    }

    fn build_flush(&mut self) -> Result<Vec<OpSlot>, BlockError> {
        if self.shared.ignore_flushes {
            return Ok(Vec::new());
        }
        self.format.flush_metadata()?;
        Ok(self
            .format
            .flush_files()
            .into_iter()
            .map(|file| OpSlot::new(OpKind::Fdatasync, file, 0, 0))
            .collect())
    }

    fn build_outcome(
        &mut self,
        outcome: WriteOutcome,
        segs: &HostSegments,
    ) -> Result<Built, BlockError> {
        let plan = match outcome {
            WriteOutcome::Blocked => return Ok(Built::Parked),
            WriteOutcome::Ready(plan) => plan,
        };
        let WritePlan {
            ops: host_ops,
            commit,
        } = plan;
        let mut ops = Vec::with_capacity(host_ops.len());
        let mut result = Ok(());
        for hw in host_ops {
            result = self.write_ops(hw, segs, &mut ops);
            if result.is_err() {
                break;
            }
        }
        match result {
            Ok(()) => Ok(Built::Ops(ops, commit)),
            Err(e) => {
                if let Some(c) = commit {
                    self.format.abort(c);
                }
                Err(e)
            }
        }
    }

    /// An aligned buffer of `len` bytes, charged to the request's bounce
    /// budget so one request cannot make the queue allocate without bound.
    pub(super) fn bounce(
        &mut self,
        len: u64,
        a: DioAlign,
        offset: u64,
    ) -> Result<AlignedBuf, BlockError> {
        let write = self.building_write;
        let fail = |source: std::io::Error| match write {
            true => BlockError::Write { offset, source },
            false => BlockError::Read { offset, source },
        };
        self.bounce_budget = self.bounce_budget.checked_sub(len).ok_or_else(|| {
            fail(std::io::Error::other(format!(
                "request needs more than {MAX_BOUNCE_PER_REQUEST} bytes of bounce buffers"
            )))
        })?;
        usize::try_from(len)
            .ok()
            .and_then(|len| AlignedBuf::new(len, (a.mem as usize).max(64)))
            .ok_or_else(|| fail(std::io::Error::from(std::io::ErrorKind::OutOfMemory)))
    }
}

/// Whether an op may go straight to its memory under alignment `a`.
pub(super) fn direct_ok(a: DioAlign, offset: u64, len: u64, iov: &[libc::iovec]) -> bool {
    if iov.len() > IOV_MAX {
        return false;
    }
    if a.is_none() {
        return true;
    }
    let block = u64::from(a.offset);
    offset.is_multiple_of(block)
        && len.is_multiple_of(block)
        && iovecs_aligned(iov, a.mem as usize, a.offset as usize)
}

/// `offset..offset+len` widened to multiples of `block`.
pub(super) fn align_range(offset: u64, len: u64, block: u32) -> Option<(u64, u64)> {
    let block = u64::from(block.max(1));
    let start = offset - offset % block;
    let end = offset.checked_add(len)?.checked_next_multiple_of(block)?;
    Some((start, end))
}

pub(super) fn iovec_of(buf: &AlignedBuf) -> libc::iovec {
    libc::iovec {
        iov_base: buf.as_ptr().cast(),
        iov_len: buf.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_range_widens() {
        assert_eq!(align_range(100, 10, 512), Some((0, 512)));
        assert_eq!(align_range(512, 512, 512), Some((512, 1024)));
        assert_eq!(align_range(511, 2, 512), Some((0, 1024)));
        assert_eq!(align_range(u64::MAX - 1, 10, 512), None);
    }
}
