//! Joining reads of a compressed cluster that is already being read and
//! inflated by this queue, so that several small reads of one cluster in
//! flight together (sequential reads at a queue depth above one) read
//! and inflate it once.
//!
//! The first read of a cluster (the leader) registers the cluster when
//! its op is pushed; a later read of the same cluster, planned while the
//! leader is in flight, gets an `AwaitInflate` op instead of a read, which
//! registers its token under the cluster when pushed. When the leader's
//! inflation comes back (`Executor::take_inflated`) every waiter gets its
//! piece copied in and its op finished; if the leader's read or inflation
//! fails, the waiters fail with it. Registrations live only in this
//! queue's [`CompressedReads`](super::compressed::CompressedReads).

use std::collections::HashMap;

use crate::formats::{CompressedExtent, FileId};
use block_engines::OpToken;

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
