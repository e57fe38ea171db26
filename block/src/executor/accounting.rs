//! Completion accounting: which request's ops are done, and exactly one
//! [`Completion`] per request.
//!
//! Owns the in-flight table ([`RequestTable`]), the completions ready for
//! the caller and the requests whose freeing commit waits for older
//! writes. It decides, but does not act: an op result enters
//! [`Accounting::result_of`], which says whether to push the op again
//! (short transfer, EINTR/EAGAIN, the zero-range fallback) or finish it;
//! [`Accounting::finish_op`] marks the op finished, keeps the request's
//! first error, and says whether a compressed leader went to the
//! pipeline or failed; [`Accounting::finish_if_done`] commits (or
//! aborts) the request after its last op and queues its completion,
//! which leaves through [`Accounting::take_ready`].

use std::io;
use std::sync::Arc;

use super::barrier::WriteLane;
use super::compressed::CompressedReads;
use super::shared::DiskShared;
use super::spares::Spares;
use super::table::RequestTable;
use super::table::{split_token, token, AfterRead, InFlight, OpBuffer, OpKind, OpSlot};
use crate::aligned::AlignedBuf;
use crate::error::BlockError;
use crate::formats::{CompressedExtent, Format, Waker};
use crate::request::{BlockRequest, Completion};
use block_engines::{EngineCompletion, OpToken};

/// What to do with an op after its result was accounted.
pub(super) enum Next {
    /// Nothing (unknown token, or the op was already finished).
    Nothing,
    /// Push op `.1` of slot `.0` again, as it now stands.
    Push(u32, usize),
    /// Finish op `.1` of slot `.0`, failed with the error if there is one.
    Finish(u32, usize, Option<BlockError>),
}

/// How [`Accounting::finish_op`] ended.
pub(super) enum OpEnd {
    /// The op was unknown or already finished.
    Nothing,
    /// A compressed leader's bytes went to the pipeline; the op stays
    /// pending until its inflation is accounted.
    Inflating,
    /// The op is finished; a failed compressed leader names its cluster,
    /// whose waiters must fail too.
    Finished {
        failed_leader: Option<CompressedExtent>,
    },
}

/// What a request's end needs beyond the table.
pub(super) struct RequestEnd<'a> {
    pub format: &'a dyn Format,
    pub shared: &'a DiskShared,
    /// This queue's write numbers.
    pub lane: &'a mut WriteLane,
    /// Woken when a deferred commit's older writes have ended.
    pub waker: &'a Waker,
    pub spares: &'a mut Spares,
}

/// See the module docs.
#[derive(Default)]
pub(super) struct Accounting {
    table: RequestTable,
    ready: Vec<Completion>,
    /// Slots whose ops are done but whose freeing commit waits for older
    /// writes (see `barrier`).
    deferred: Vec<u32>,
}

// The per-request methods are marked inline, for the reason `table.rs`
// gives for the table's: the coordinator that calls them may be compiled
// in another codegen unit (which one depends on the module tree), and an
// out-of-line call moves an `InFlight` and adds calls on every request.
impl Accounting {
    /// Takes ownership of a request whose ops are about to be pushed.
    #[inline]
    pub fn insert(&mut self, entry: InFlight) -> u32 {
        self.table.insert(entry)
    }

    /// Op `i` of `slot`, if that request is in flight.
    pub fn op_mut(&mut self, slot: u32, i: usize) -> Option<&mut OpSlot> {
        self.table.get_mut(slot)?.ops.get_mut(i)
    }

    /// Completes a request that never entered the table.
    pub fn complete_now(&mut self, req: BlockRequest, result: Result<u64, BlockError>) {
        self.ready.push(Completion {
            user_data: req.user_data,
            op: req.op,
            offset: req.offset,
            len: req.len(),
            result,
            memory: req.memory,
        });
    }

    /// Completions waiting for the caller.
    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Moves every ready completion to `out`.
    pub fn take_ready(&mut self, out: &mut Vec<Completion>) {
        out.append(&mut self.ready);
    }

    /// Requests in the table or ready, not yet drained.
    pub fn in_flight(&self) -> usize {
        self.table.len() + self.ready.len()
    }

    /// The deferred slots, to be retried with [`Accounting::finish_if_done`].
    pub fn take_deferred(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.deferred)
    }

    /// Accounts one reaped op result (see the module docs).
    #[inline]
    pub fn result_of(&mut self, c: EngineCompletion, zero_page: &Arc<AlignedBuf>) -> Next {
        let (slot, i) = split_token(c.token);
        let i = i as usize;
        let Some(op) = self.op_mut(slot, i) else {
            log::error!("block queue: completion for unknown op {:#x}", c.token);
            return Next::Nothing;
        };
        if op.done {
            return Next::Nothing;
        }
        let n = match c.result {
            Ok(n) => n,
            Err(e) => {
                let errno = e.raw_os_error();
                if errno == Some(libc::EINTR) || errno == Some(libc::EAGAIN) {
                    return Next::Push(slot, i);
                }
                let unsupported = errno == Some(libc::EOPNOTSUPP) || errno == Some(libc::ENOSYS);
                if op.kind == OpKind::PunchHole && unsupported {
                    // Discard is a hint.
                    return Next::Finish(slot, i, None);
                }
                if op.kind == OpKind::ZeroRange && (unsupported || errno == Some(libc::EINVAL)) {
                    // No ZERO_RANGE here: write zeroes instead.
                    op.kind = OpKind::Write;
                    op.zero_source = Some(zero_page.clone());
                    return Next::Push(slot, i);
                }
                return Next::Finish(slot, i, Some(op_error(op, e)));
            }
        };
        match op.kind {
            OpKind::Read | OpKind::Write => {}
            _ => return Next::Finish(slot, i, None),
        }
        if n >= op.remaining {
            op.advance(op.remaining);
            return Next::Finish(slot, i, None);
        }
        if n == 0 {
            if op.kind == OpKind::Write {
                let err = op_error(op, io::Error::from(io::ErrorKind::WriteZero));
                return Next::Finish(slot, i, Some(err));
            }
            // SAFETY: the op was just reaped, so nothing uses its memory,
            // which its in-flight entry still owns.
            unsafe { op.zero_rest() };
            return Next::Finish(slot, i, None);
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
            return Next::Finish(slot, i, None);
        }
        Next::Push(slot, i)
    }

    /// Marks op `i` of `slot` finished (with `err` if it failed) and runs
    /// its post-read work. A compressed leader's bytes go to `compressed`
    /// and the op stays pending until [`Accounting::account_inflated`].
    #[inline]
    pub fn finish_op(
        &mut self,
        slot: u32,
        i: usize,
        err: Option<BlockError>,
        compressed: &mut CompressedReads,
    ) -> OpEnd {
        let Some(entry) = self.table.get_mut(slot) else {
            return OpEnd::Nothing;
        };
        let Some(op) = entry.ops.get_mut(i) else {
            return OpEnd::Nothing;
        };
        if op.done {
            return OpEnd::Nothing;
        }
        op.done = true;
        // A leader's compressed bytes are inflated even if its request
        // already failed: other reads may be waiting for the cluster.
        let leader = op.kind == OpKind::Read;
        if err.is_none() && leader {
            if let AfterRead::Inflate { ext, skip, .. } = op.after {
                if let Some(OpBuffer::Aligned(input)) = op.buffers.pop() {
                    // The op has been reaped: the kernel is done with the
                    // buffer, which moves to the pipeline.
                    compressed.inflate(token(slot, i as u32), ext, input, skip);
                    return OpEnd::Inflating;
                }
            }
        }
        // A leader that was not sent to the pipeline fails its waiters.
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
        OpEnd::Finished { failed_leader }
    }

    /// Accounts a leader's finished inflation: its op is no longer
    /// pending, and its piece is copied into the request's memory (or the
    /// request fails). Returns the leader's slot.
    pub fn account_inflated(
        &mut self,
        tag: OpToken,
        ext: &CompressedExtent,
        data: &Result<Arc<Vec<u8>>, String>,
    ) -> u32 {
        let (slot, i) = split_token(tag);
        let Some(entry) = self.table.get_mut(slot) else {
            return slot;
        };
        entry.pending = entry.pending.saturating_sub(1);
        let piece = match entry.ops.get(i as usize).map(|op| &op.after) {
            Some(AfterRead::Inflate { req_off, len, .. }) => Some((*req_off, *len)),
            _ => None,
        };
        match (data, piece) {
            (Ok(data), Some((req_off, len))) => {
                let from = ext.offset_in_cluster as usize;
                match data.get(from..from.saturating_add(len as usize)) {
                    // SAFETY: the op that read these bytes is finished, no
                    // other op of the request touches this range (pieces
                    // do not overlap), and the entry owns the memory.
                    Some(bytes) => unsafe { entry.segs.copy_in(req_off, bytes) },
                    None => entry.fail(BlockError::Decompress {
                        offset: ext.host_offset,
                        reason: "piece extends past its cluster".into(),
                    }),
                }
            }
            (Err(reason), _) => entry.fail(BlockError::Decompress {
                offset: ext.host_offset,
                reason: reason.clone(),
            }),
            (Ok(_), None) => {}
        }
        slot
    }

    /// Copies the piece waiter op `t` asked for out of `data` (the
    /// inflated cluster), or fails it with the leader's error; returns the
    /// op to finish, if it still waits.
    pub fn serve_waiter(
        &mut self,
        t: OpToken,
        data: Result<&[u8], &str>,
    ) -> Option<(u32, usize, Option<BlockError>)> {
        let (slot, i) = split_token(t);
        let i = i as usize;
        let entry = self.table.get_mut(slot)?;
        let (wext, req_off, len) = match entry.ops.get(i) {
            Some(op) if op.kind == OpKind::AwaitInflate && !op.done => match op.after {
                AfterRead::Inflate {
                    ext, req_off, len, ..
                } => (ext, req_off, len),
                _ => return None,
            },
            _ => return None,
        };
        let from = wext.offset_in_cluster as usize;
        let err = match data.map(|d| d.get(from..from.saturating_add(len as usize))) {
            Ok(Some(bytes)) => {
                // SAFETY: the waiter op is not finished, so its request
                // (and memory) is in the table; no other op of it touches
                // this range, and nothing of it is in the kernel for this
                // piece.
                unsafe { entry.segs.copy_in(req_off, bytes) };
                None
            }
            Ok(None) => Some(BlockError::Decompress {
                offset: wext.host_offset,
                reason: "piece extends past its cluster".into(),
            }),
            Err(reason) => Some(BlockError::Decompress {
                offset: wext.host_offset,
                reason: reason.to_string(),
            }),
        };
        Some((slot, i, err))
    }

    /// Completes the request in `slot` if none of its ops is pending (a
    /// commit that frees clusters first waits for older writes, see
    /// `barrier`: the slot is deferred and retried on every drain).
    #[inline]
    pub fn finish_if_done(&mut self, slot: u32, end: RequestEnd<'_>) {
        let writes = &end.shared.writes;
        match self.table.get_mut(slot) {
            Some(e) if e.pending == 0 => {
                if let (Some(barrier), Some(_), None) = (&e.barrier, &e.commit, &e.error) {
                    // Its own number is below its barrier: give it back.
                    if let Some(seq) = e.write_seq.take() {
                        end.lane.end(seq, writes);
                    }
                    if !writes.passed(barrier, end.waker) {
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
            end.shared.rmw.unlock(owner);
        }
        if let Some(commit) = entry.commit.take() {
            if entry.error.is_none() {
                if let Err(e) = end.format.commit(commit) {
                    entry.fail(e);
                }
            } else {
                end.format.abort(commit);
            }
        }
        // After the commit: a discard planned now sees this write's data
        // published (or its allocation aborted).
        if let Some(seq) = entry.write_seq.take() {
            end.lane.end(seq, writes);
        }
        let result = match entry.error.take() {
            Some(e) => Err(e),
            None => Ok(entry.bytes),
        };
        // The ops' iovecs point into `entry`; recycle them (emptied)
        // before the memory leaves.
        end.spares.put_ops(std::mem::take(&mut entry.ops));
        end.spares.put_segs(std::mem::take(&mut entry.segs));
        self.ready.push(Completion {
            user_data: entry.user_data,
            op: entry.op,
            offset: entry.offset,
            len: entry.len,
            result,
            memory: entry.memory,
        });
    }

    /// Gives up every request still in the table when the engine can no
    /// longer reap: their commits are aborted (leaking, never publishing)
    /// and their locks and write numbers released, so other queues do not
    /// wait forever; their memory is leaked, not freed under the kernel.
    pub fn abandon_all(&mut self, format: &dyn Format, shared: &DiskShared, lane: &mut WriteLane) {
        let (owners, commits, seqs) = self.table.take_locks_and_commits();
        for commit in commits {
            format.abort(commit);
        }
        for owner in owners {
            shared.rmw.unlock(owner);
        }
        // The leaked writes may still land: their clusters stay
        // referenced (aborted commits leak), so nothing waits.
        for seq in seqs {
            lane.end(seq, &shared.writes);
        }
        self.table.leak();
    }

    /// Gives up the freeing commits still waiting for other queues'
    /// writes (the clusters leak; nothing is freed under a write).
    pub fn abandon_deferred(
        &mut self,
        format: &dyn Format,
        shared: &DiskShared,
        lane: &mut WriteLane,
    ) {
        for slot in std::mem::take(&mut self.deferred) {
            if let Some(mut entry) = self.table.remove(slot) {
                if let Some(commit) = entry.commit.take() {
                    format.abort(commit);
                }
                if let Some(seq) = entry.write_seq.take() {
                    lane.end(seq, &shared.writes);
                }
            }
        }
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
#[inline]
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
        // Inflation runs in the pipeline (`finish_op`); its buffer is gone.
        AfterRead::Inflate { .. } => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::memory::HostSegments;
    use crate::formats::raw::RawImage;
    use crate::formats::FileId;
    use crate::request::IoMemory;
    use std::path::Path;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    /// One 8-byte read op into owned memory, in the table.
    fn one_read(acct: &mut Accounting) -> u32 {
        let mut memory = IoMemory::Owned(vec![0xff; 8]);
        let segs = HostSegments::of(&mut memory).unwrap();
        let mut op = OpSlot::new(OpKind::Read, FileId(0), 0, 8);
        segs.iovecs(0, 8, &mut op.iov);
        acct.insert(InFlight {
            user_data: 42,
            op: crate::request::RequestOp::Read,
            offset: 0,
            len: 8,
            memory,
            segs,
            ops: vec![op],
            pending: 1,
            error: None,
            commit: None,
            bytes: 8,
            rmw_owner: None,
            write_seq: None,
            barrier: None,
        })
    }

    #[test]
    fn a_short_read_is_pushed_again_then_zero_filled_at_eof_and_completes_once() {
        let path = Path::new("/proc/self/exe");
        let file = Arc::new(std::fs::File::open(path).unwrap());
        let format = RawImage::new(path, file, true, false).unwrap();
        let shared = DiskShared::default();
        let mut lane = shared.writes.lane();
        let waker = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        let zero_page = Arc::new(AlignedBuf::new(4096, 4096).unwrap());
        let mut spares = Spares::default();
        let mut compressed = CompressedReads::new(waker.clone(), Arc::new(DiskShared::default()));
        let mut acct = Accounting::default();
        let slot = one_read(&mut acct);
        let done = |result| EngineCompletion {
            token: token(slot, 0),
            result,
        };

        assert!(matches!(acct.result_of(done(Ok(3)), &zero_page), Next::Push(s, 0) if s == slot));
        assert_eq!(acct.op_mut(slot, 0).unwrap().remaining, 5);
        // EOF: the rest reads as zeroes.
        let Next::Finish(s, i, None) = acct.result_of(done(Ok(0)), &zero_page) else {
            panic!("EOF must finish the op");
        };
        assert!(matches!(
            acct.finish_op(s, i, None, &mut compressed),
            OpEnd::Finished {
                failed_leader: None
            }
        ));
        for _ in 0..2 {
            let end = RequestEnd {
                format: &format,
                shared: &shared,
                lane: &mut lane,
                waker: &waker,
                spares: &mut spares,
            };
            acct.finish_if_done(slot, end);
        }
        // A late duplicate result is ignored.
        assert!(matches!(
            acct.result_of(done(Ok(8)), &zero_page),
            Next::Nothing
        ));
        let mut out = Vec::new();
        acct.take_ready(&mut out);
        assert_eq!(out.len(), 1, "exactly one completion");
        assert_eq!(out[0].user_data, 42);
        assert_eq!(out[0].result.as_ref().unwrap(), &8);
        let data = out.pop().unwrap().memory.into_owned().unwrap();
        assert_eq!(data[3..], [0; 5], "the bytes past EOF are zeroed");
        assert_eq!(acct.in_flight(), 0);
    }

    #[test]
    fn the_first_error_wins() {
        let mut compressed = CompressedReads::new(
            Arc::new(EventFd::new(EFD_NONBLOCK).unwrap()),
            Arc::new(DiskShared::default()),
        );
        let mut acct = Accounting::default();
        let slot = one_read(&mut acct);
        let eio = |offset| BlockError::Read {
            offset,
            source: io::Error::from_raw_os_error(libc::EIO),
        };
        acct.finish_op(slot, 0, Some(eio(1)), &mut compressed);
        // Finishing the same op again changes nothing.
        assert!(matches!(
            acct.finish_op(slot, 0, Some(eio(2)), &mut compressed),
            OpEnd::Nothing
        ));
        let entry = acct.table.get_mut(slot).unwrap();
        assert_eq!(entry.pending, 0);
        assert!(matches!(
            entry.error,
            Some(BlockError::Read { offset: 1, .. })
        ));
    }
}
