//! Joining reads of a compressed cluster that is already being read and
//! inflated by this queue, so that several small reads of one cluster in
//! flight together (sequential reads at a queue depth above one) read
//! and inflate it once.
//!
//! The first read of a cluster (the leader) registers the cluster when
//! its op is pushed; a later read of the same cluster, planned while the
//! leader is in flight, gets an `AwaitInflate` op instead of a read, which
//! registers its token under the cluster when pushed. When the leader's
//! inflation comes back ([`Executor::take_inflated`]) every waiter gets
//! its piece copied in and its op finished; if the leader's read or
//! inflation fails, the waiters fail with it. Registrations live only in
//! this queue's executor.

use std::collections::HashMap;

use super::table::{split_token, AfterRead, OpKind};
use super::Executor;
use crate::error::BlockError;
use crate::formats::{CompressedExtent, FileId};
use crate::io::OpToken;

/// A compressed cluster's bytes in the image.
pub(super) type ClusterKey = (FileId, u64, u64);

pub(super) fn key_of(ext: &CompressedExtent) -> ClusterKey {
    (ext.file, ext.host_offset, ext.compressed_len)
}

/// Clusters being read by a leader op, with the ops waiting for them.
#[derive(Default)]
pub(super) struct InflateJoins {
    waiting: HashMap<ClusterKey, Vec<OpToken>>,
}

impl InflateJoins {
    /// Whether a leader is reading this cluster now.
    pub fn leading(&self, ext: &CompressedExtent) -> bool {
        self.waiting.contains_key(&key_of(ext))
    }

    /// A leader's op is pushed (again, after a short read: no change).
    pub fn lead(&mut self, ext: &CompressedExtent) {
        self.waiting.entry(key_of(ext)).or_default();
    }

    /// A waiter's op is pushed; false if no leader reads the cluster.
    pub fn wait(&mut self, ext: &CompressedExtent, token: OpToken) -> bool {
        match self.waiting.get_mut(&key_of(ext)) {
            Some(w) => {
                w.push(token);
                true
            }
            None => false,
        }
    }

    /// The leader is done: the waiters to serve.
    pub fn finish(&mut self, ext: &CompressedExtent) -> Vec<OpToken> {
        self.waiting.remove(&key_of(ext)).unwrap_or_default()
    }
}

impl Executor {
    /// Finishes every op waiting for the cluster of `ext`, copying its
    /// piece from `data` (the inflated cluster) or failing with `err`.
    pub(super) fn serve_waiters(&mut self, ext: &CompressedExtent, data: Result<&[u8], &str>) {
        for t in self.joins.finish(ext) {
            let (slot, i) = split_token(t);
            let i = i as usize;
            let Some(entry) = self.table.get_mut(slot) else {
                continue;
            };
            let piece = match entry.ops.get(i) {
                Some(op) if op.kind == OpKind::AwaitInflate && !op.done => match op.after {
                    AfterRead::Inflate {
                        ext, req_off, len, ..
                    } => (ext, req_off, len),
                    _ => continue,
                },
                _ => continue,
            };
            let (wext, req_off, len) = piece;
            let from = wext.offset_in_cluster as usize;
            let err = match data.map(|d| d.get(from..from.saturating_add(len as usize))) {
                Ok(Some(bytes)) => {
                    // SAFETY: the waiter op is not finished, so its
                    // request (and memory) is in the table; no other op of
                    // it touches this range, and nothing of it is in the
                    // kernel for this piece.
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
            self.op_finished(slot, i, err);
        }
    }
}
