//! One queue's side of the write seam: the generation of the disk's
//! [`LiveState`] it last saw and its own handles on the filters.
//!
//! The queue calls [`QueueFilters::refresh`] once per batch (submitted
//! or drained): one relaxed load of the generation; only when it moved
//! are the filters read again (under the state's mutex, which the owner
//! takes only while the queues are quiesced). Completions leave through
//! [`QueueFilters::completed`], which marks the enabled dirty bitmaps
//! with every write-like one, failed ones too (a failed write may have
//! changed part of its range).

use std::sync::Arc;

use super::state::{Filters, LiveState};
use crate::request::Completion;

/// See the module docs.
#[derive(Debug)]
pub struct QueueFilters {
    live: Arc<LiveState>,
    seen: u64,
    filters: Arc<Filters>,
}

impl QueueFilters {
    pub fn new(live: Arc<LiveState>) -> Self {
        let (seen, filters) = live.filters();
        QueueFilters {
            live,
            seen,
            filters,
        }
    }

    /// Picks up a new filter set if the generation moved.
    #[inline]
    pub fn refresh(&mut self) {
        if self.live.generation() != self.seen {
            let (seen, filters) = self.live.filters();
            self.seen = seen;
            self.filters = filters;
        }
    }

    /// Whether any filter is active for this queue.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    /// Acts on completions about to leave the queue.
    #[inline]
    pub fn completed(&self, done: &[Completion]) {
        if self.filters.bitmaps.is_empty() {
            return;
        }
        for c in done.iter().filter(|c| c.changes_data()) {
            for b in &self.filters.bitmaps {
                b.mark(c.offset, c.len);
            }
        }
    }
}
