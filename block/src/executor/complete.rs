//! The coordinator's completion flow: reaped op results and finished
//! inflations go through the parts in order. The
//! [`Accounting`](super::accounting::Accounting) decides what a result
//! means; this file acts on it (pushes the op again, hands a compressed
//! leader's bytes to the
//! [`CompressedReads`](super::compressed::CompressedReads) pipeline,
//! serves or fails the
//! reads waiting for that cluster) and lets the accounting complete the
//! request after its last op.
//!
//! Results enter through [`Executor::on_op_complete`] (engine ops) and
//! [`Executor::take_inflated`] (inflations); completions leave in the
//! accounting's ready list.

use std::sync::Arc;

use super::accounting::{Next, OpEnd, RequestEnd};
use super::Executor;
use crate::error::BlockError;
use crate::formats::CompressedExtent;
use block_engines::EngineCompletion;

impl Executor {
    /// Accounts one reaped op and acts on the outcome.
    pub(super) fn on_op_complete(&mut self, c: EngineCompletion) {
        match self.acct.result_of(c, &self.builder.zero_page) {
            Next::Nothing => {}
            Next::Push(slot, i) => self.push_op(slot, i),
            Next::Finish(slot, i, err) => self.op_finished(slot, i, err),
        }
    }

    /// Finishes op `i` of `slot` (failed with `err`, if any); a failed
    /// compressed leader fails its waiters; the request completes after
    /// its last op.
    pub(super) fn op_finished(&mut self, slot: u32, i: usize, err: Option<BlockError>) {
        match self.acct.finish_op(slot, i, err, &mut self.compressed) {
            OpEnd::Nothing | OpEnd::Inflating => {}
            OpEnd::Finished { failed_leader } => {
                if let Some(ext) = failed_leader {
                    self.serve_waiters(&ext, Err("read of the compressed cluster failed"));
                }
                self.finish_if_done(slot);
            }
        }
    }

    /// Accounts every inflation finished for this queue: the piece is
    /// copied into the request's memory, the cluster cached, and the
    /// reads waiting for it served.
    pub(super) fn take_inflated(&mut self) {
        let mut done = self.compressed.take_finished();
        for d in done.drain(..) {
            let data = d.result.map(Arc::new);
            let slot = self.acct.account_inflated(d.tag, &d.ext, &data);
            match &data {
                Ok(data) => {
                    self.compressed.finished_cluster(&d.ext, data.clone());
                    self.serve_waiters(&d.ext, Ok(data));
                }
                Err(reason) => self.serve_waiters(&d.ext, Err(reason)),
            }
            self.finish_if_done(slot);
        }
        self.compressed.recycle(done);
    }

    /// Finishes every op waiting for the cluster of `ext`, copying its
    /// piece from `data` (the inflated cluster) or failing with `data`'s
    /// reason.
    pub(super) fn serve_waiters(&mut self, ext: &CompressedExtent, data: Result<&[u8], &str>) {
        for t in self.compressed.waiters(ext) {
            if let Some((slot, i, err)) = self.acct.serve_waiter(t, data) {
                self.op_finished(slot, i, err);
            }
        }
    }

    /// Completes the request in `slot` if its last op is done.
    pub(super) fn finish_if_done(&mut self, slot: u32) {
        let end = RequestEnd {
            format: self.builder.format.as_ref(),
            shared: &self.shared,
            lane: &mut self.writes,
            waker: &self.eventfd,
            spares: &mut self.builder.spares,
        };
        self.acct.finish_if_done(slot, end);
    }
}
