//! Completion accounting: one op result at a time, into at most one
//! completion per request.
//!
//! An op result enters in [`Executor::on_op_complete`]: a short transfer
//! resubmits the rest, a read at EOF zero-fills the rest, EINTR/EAGAIN
//! retries, and an error is kept if it is the request's first. When an
//! op is finished its post-read work runs (bounce copy, inflate); when the
//! request's last op is finished the format commits (or aborts) and the
//! request's [`Completion`] joins the ready list.

use std::io;
use std::sync::Arc;

use super::table::{split_token, token, AfterRead, InFlight, OpBuffer, OpKind, OpSlot};
use super::Executor;
use crate::error::BlockError;
use crate::io::inflate_pool::{inflates_in_queue, InflateJob};
use crate::io::EngineCompletion;
use crate::request::Completion;

impl Executor {
    /// Accounts one reaped op (see the module docs).
    pub(super) fn on_op_complete(&mut self, c: EngineCompletion) {
        let (slot, i) = split_token(c.token);
        let i = i as usize;
        let zero_page = self.zero_page.clone();
        let Some(entry) = self.table.get_mut(slot) else {
            log::error!("block queue: completion for unknown token {:#x}", c.token);
            return;
        };
        let Some(op) = entry.ops.get_mut(i) else {
            log::error!("block queue: completion for unknown op {:#x}", c.token);
            return;
        };
        if op.done {
            return;
        }
        let n = match c.result {
            Ok(n) => n,
            Err(e) => {
                let errno = e.raw_os_error();
                if errno == Some(libc::EINTR) || errno == Some(libc::EAGAIN) {
                    return self.push_op(slot, i);
                }
                let unsupported = errno == Some(libc::EOPNOTSUPP) || errno == Some(libc::ENOSYS);
                if op.kind == OpKind::PunchHole && unsupported {
                    // Discard is a hint.
                    return self.op_finished(slot, i, None);
                }
                if op.kind == OpKind::ZeroRange && (unsupported || errno == Some(libc::EINVAL)) {
                    // No ZERO_RANGE here: write zeroes instead.
                    op.kind = OpKind::Write;
                    op.zero_source = Some(zero_page);
                    return self.push_op(slot, i);
                }
                let err = op_error(op, e);
                return self.op_finished(slot, i, Some(err));
            }
        };
        match op.kind {
            OpKind::Read | OpKind::Write => {}
            _ => return self.op_finished(slot, i, None),
        }
        if n >= op.remaining {
            op.advance(op.remaining);
            return self.op_finished(slot, i, None);
        }
        if n == 0 {
            if op.kind == OpKind::Write {
                let err = op_error(op, io::Error::from(io::ErrorKind::WriteZero));
                return self.op_finished(slot, i, Some(err));
            }
            // SAFETY: the op was just reaped, so nothing uses its memory,
            // which its in-flight entry still owns.
            unsafe { op.zero_rest() };
            return self.op_finished(slot, i, None);
        }
        op.advance(n);
        if op.zero_source.is_some() {
            // The zero page is re-pointed on the next push.
        } else if op.kind == OpKind::Read
            && op.align > 1
            && !op.offset.is_multiple_of(u64::from(op.align))
        {
            // An O_DIRECT read ending mid-block hit EOF.
            // SAFETY: as above.
            unsafe { op.zero_rest() };
            return self.op_finished(slot, i, None);
        }
        self.push_op(slot, i);
    }

    /// Marks op `i` of `slot` finished (with `err` if it failed), runs its
    /// post-read work, and completes the request after its last op. A
    /// compressed read goes to the inflate pool (or the queue's own
    /// backlog) first and stays pending until [`Executor::take_inflated`]
    /// sees its result.
    pub(super) fn op_finished(&mut self, slot: u32, i: usize, err: Option<BlockError>) {
        let Some(entry) = self.table.get_mut(slot) else {
            return;
        };
        let Some(op) = entry.ops.get_mut(i) else {
            return;
        };
        if op.done {
            return;
        }
        op.done = true;
        // A leader's compressed bytes are inflated even if its request
        // already failed: other reads may be waiting for the cluster.
        let leader = op.kind == OpKind::Read;
        if err.is_none() && leader {
            if let AfterRead::Inflate { ext, skip, .. } = op.after {
                if let Some(OpBuffer::Aligned(input)) = op.buffers.pop() {
                    // The op has been reaped: the kernel is done with the
                    // buffer, which moves to the job.
                    let job = InflateJob {
                        tag: token(slot, i as u32),
                        ext,
                        input,
                        skip,
                        replies: self.replies.clone(),
                    };
                    if inflates_in_queue(ext.algorithm) {
                        self.inflate_backlog.push_back(job);
                    } else {
                        crate::io::inflate_pool::submit(job);
                    }
                    return;
                }
            }
        }
        // A leader that was not sent to the pool fails its waiters.
        let failed_leader = match op.after {
            AfterRead::Inflate { ext, .. } if leader => Some(ext),
            _ => None,
        };
        entry.pending = entry.pending.saturating_sub(1);
        match err {
            Some(e) => entry.fail(e),
            None => {
                if entry.error.is_none() {
                    if let Err(e) = after_read(entry, i) {
                        entry.fail(e);
                    }
                }
            }
        }
        if let Some(ext) = failed_leader {
            self.serve_waiters(&ext, Err("read of the compressed cluster failed"));
        }
        self.finish_if_done(slot);
    }

    /// Accounts every inflation the pool has finished for this queue: the
    /// piece is copied into the request's memory and the cluster cached.
    pub(super) fn take_inflated(&mut self) {
        let mut done = std::mem::take(&mut self.inflated);
        self.replies.take(&mut done);
        for d in done.drain(..) {
            let (slot, i) = split_token(d.tag);
            let data = d.result.map(Arc::new);
            if let Some(entry) = self.table.get_mut(slot) {
                entry.pending = entry.pending.saturating_sub(1);
                let piece = match entry.ops.get(i as usize).map(|op| &op.after) {
                    Some(AfterRead::Inflate { req_off, len, .. }) => Some((*req_off, *len)),
                    _ => None,
                };
                match (&data, piece) {
                    (Ok(data), Some((req_off, len))) => {
                        let from = d.ext.offset_in_cluster as usize;
                        match data.get(from..from.saturating_add(len as usize)) {
                            // SAFETY: the op that read these bytes is
                            // finished, no other op of the request touches
                            // this range (pieces do not overlap), and the
                            // entry owns the memory.
                            Some(bytes) => unsafe { entry.segs.copy_in(req_off, bytes) },
                            None => entry.fail(BlockError::Decompress {
                                offset: d.ext.host_offset,
                                reason: "piece extends past its cluster".into(),
                            }),
                        }
                    }
                    (Err(reason), _) => entry.fail(BlockError::Decompress {
                        offset: d.ext.host_offset,
                        reason: reason.clone(),
                    }),
                    (Ok(_), None) => {}
                }
            }
            match &data {
                Ok(data) => {
                    self.inflate_cache().insert(&d.ext, data.clone());
                    self.serve_waiters(&d.ext, Ok(data));
                }
                Err(reason) => self.serve_waiters(&d.ext, Err(reason)),
            }
            self.finish_if_done(slot);
        }
        self.inflated = done;
    }

    /// Completes the request in `slot` if none of its ops is pending (a
    /// commit that frees clusters first waits for older writes, see
    /// `barrier`: the slot is deferred and retried on every drain).
    pub(super) fn finish_if_done(&mut self, slot: u32) {
        let (writes, eventfd) = (&self.shared.writes, &self.eventfd);
        match self.table.get_mut(slot) {
            Some(e) if e.pending == 0 => {
                if let (Some(barrier), Some(_), None) = (e.barrier, &e.commit, &e.error) {
                    // Its own number is below its barrier: give it back.
                    if let Some(seq) = e.write_seq.take() {
                        writes.end(seq);
                    }
                    if !writes.passed(barrier, eventfd) {
                        if !self.deferred.contains(&slot) {
                            self.deferred.push(slot);
                        }
                        return;
                    }
                }
            }
            _ => return,
        }
        let Some(mut entry) = self.table.remove(slot) else {
            return;
        };
        if let Some(owner) = entry.rmw_owner.take() {
            self.shared.rmw.unlock(owner);
        }
        if let Some(commit) = entry.commit.take() {
            if entry.error.is_none() {
                if let Err(e) = self.format.commit(commit) {
                    entry.fail(e);
                }
            } else {
                self.format.abort(commit);
            }
        }
        // After the commit: a discard planned now sees this write's data
        // published (or its allocation aborted).
        if let Some(seq) = entry.write_seq.take() {
            self.shared.writes.end(seq);
        }
        let result = match entry.error.take() {
            Some(e) => Err(e),
            None => Ok(entry.bytes),
        };
        // The ops' iovecs point into `entry`; recycle them (emptied)
        // before the memory leaves.
        self.spares.put_ops(std::mem::take(&mut entry.ops));
        self.spares.put_segs(std::mem::take(&mut entry.segs));
        self.ready.push(Completion {
            user_data: entry.user_data,
            result,
            memory: entry.memory,
        });
    }
}

/// The error of a failed op, naming the operation.
fn op_error(op: &OpSlot, source: io::Error) -> BlockError {
    let offset = op.offset;
    match op.kind {
        OpKind::Read | OpKind::AwaitInflate => BlockError::Read { offset, source },
        OpKind::Write => BlockError::Write { offset, source },
        OpKind::Fdatasync => BlockError::Flush(source),
        OpKind::PunchHole | OpKind::ZeroRange => BlockError::Fallocate { offset, source },
    }
}

/// Post-read work of op `i`: copy out of its bounce buffer.
fn after_read(entry: &mut InFlight, i: usize) -> Result<(), BlockError> {
    let Some(op) = entry.ops.get(i) else {
        return Ok(());
    };
    let Some(OpBuffer::Aligned(buf)) = op.buffers.first() else {
        return Ok(());
    };
    match op.after {
        AfterRead::None => Ok(()),
        AfterRead::Copy { skip, req_off, len } => {
            let src = buf.as_slice().get(skip..skip + len as usize).unwrap_or(&[]);
            // SAFETY: every op of the entry that could touch this range
            // is finished (pieces do not overlap), and the entry owns the
            // memory.
            unsafe { entry.segs.copy_in(req_off, src) };
            Ok(())
        }
        // Inflation runs on the pool (`op_finished`); its buffer is gone.
        AfterRead::Inflate { .. } => Ok(()),
    }
}
