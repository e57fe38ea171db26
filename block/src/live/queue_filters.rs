//! One queue's side of the write seam: the generation of the disk's
//! [`LiveState`] it last saw and its own handles on the filters.
//!
//! The queue calls [`QueueFilters::refresh`] once per batch (submitted
//! or drained): one relaxed load of the generation; only when it moved
//! are the filters read again (under the state's mutex, which the owner
//! takes only while the queues are quiesced). Completions leave through
//! [`QueueFilters::completed`], which marks the enabled dirty bitmaps
//! with every write-like one, failed ones too (a failed write may have
//! changed part of its range). With a point-in-time view active, every
//! write-like request passes [`QueueFilters::before_submit`] first (as
//! with a write-blocking mirror, which counts the writes in flight), which
//! copies the old data it would overwrite (`cbw`). With a write-blocking
//! mirror active, completions also pass the queue's handle on it before
//! they leave (it writes each completed guest write to the target too).

use std::sync::Arc;

use super::state::{Filters, LiveState};
use super::write_hook::{
    same_completion_hook, same_hook, CompletionHook, CompletionHookQueue, WriteHook, WriteHookQueue,
};
use crate::request::{BlockRequest, Completion};

/// See the module docs.
#[derive(Debug)]
pub struct QueueFilters {
    live: Arc<LiveState>,
    seen: u64,
    filters: Arc<Filters>,
    /// This queue's handle on the write hook (copy-before-write while a
    /// view is active), and the hook it was made from.
    cbw: Option<HookHandle>,
    /// This queue's handle on a write-blocking mirror, and its filter.
    mirror: Option<CompletionHandle>,
}

struct CompletionHandle {
    hook: Arc<dyn CompletionHook>,
    queue: Box<dyn CompletionHookQueue>,
}

impl CompletionHandle {
    fn new(hook: &Arc<dyn CompletionHook>) -> Self {
        CompletionHandle {
            hook: hook.clone(),
            queue: hook.clone().queue_handle(),
        }
    }
}

impl std::fmt::Debug for CompletionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.hook.fmt(f)
    }
}

struct HookHandle {
    hook: Arc<dyn WriteHook>,
    queue: Box<dyn WriteHookQueue>,
}

impl HookHandle {
    fn new(hook: &Arc<dyn WriteHook>) -> Self {
        HookHandle {
            hook: hook.clone(),
            queue: hook.clone().queue_handle(),
        }
    }
}

impl std::fmt::Debug for HookHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.hook.fmt(f)
    }
}

impl QueueFilters {
    pub fn new(live: Arc<LiveState>) -> Self {
        let (seen, filters) = live.filters();
        let cbw = filters.cbw.as_ref().map(HookHandle::new);
        let mirror = filters.mirror.as_ref().map(CompletionHandle::new);
        QueueFilters {
            live,
            seen,
            filters,
            cbw,
            mirror,
        }
    }

    /// Picks up a new filter set if the generation moved.
    #[inline]
    pub fn refresh(&mut self) {
        if self.live.generation() != self.seen {
            let (seen, filters) = self.live.filters();
            self.seen = seen;
            let same_cbw = match (&self.cbw, &filters.cbw) {
                (Some(q), Some(c)) => same_hook(&q.hook, c),
                (None, None) => true,
                _ => false,
            };
            if !same_cbw {
                self.cbw = filters.cbw.as_ref().map(HookHandle::new);
            }
            let same_mirror = match (&self.mirror, &filters.mirror) {
                (Some(q), Some(m)) => same_completion_hook(&q.hook, m),
                (None, None) => true,
                _ => false,
            };
            if !same_mirror {
                self.mirror = filters.mirror.as_ref().map(CompletionHandle::new);
            }
            self.filters = filters;
        }
    }

    /// Whether requests must pass [`QueueFilters::before_submit`].
    #[inline]
    pub fn acts_before_submit(&self) -> bool {
        self.cbw.is_some() || self.mirror.is_some()
    }

    /// Acts on a request about to be submitted: a write-like one first
    /// has the old data it overwrites copied for the view.
    pub fn before_submit(&mut self, request: &BlockRequest) {
        if !request.op.changes_data() {
            return;
        }
        if let Some(cbw) = self.cbw.as_mut() {
            cbw.queue.before_write(request.offset, request.len());
        }
        if let Some(m) = self.mirror.as_mut() {
            m.queue.before_write(request.offset, request.len());
        }
    }

    /// Whether any filter is active for this queue.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    /// Acts on completions about to leave the queue: the dirty bitmaps
    /// mark them, then a write-blocking mirror writes them to its target
    /// (returning once it has).
    #[inline]
    pub fn completed(&mut self, done: &[Completion]) {
        if !self.filters.bitmaps.is_empty() {
            for c in done.iter().filter(|c| c.changes_data()) {
                for b in &self.filters.bitmaps {
                    b.mark(c.offset, c.len);
                }
            }
        }
        if let Some(m) = self.mirror.as_mut() {
            if !done.is_empty() {
                m.queue.completed(done);
            }
        }
    }
}
