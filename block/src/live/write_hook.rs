//! What a queue calls before a write-like request goes down, seen from
//! the seam's side: a filter installed on the disk ([`WriteHook`]) and
//! the per-queue handle it makes ([`WriteHookQueue`]).
//!
//! The seam's shared state (`state.rs`) and each queue's side
//! (`queue_filters.rs`) hold hooks only through these traits, so they
//! name no filter that reaches images: copy-before-write (`cbw.rs`)
//! copies through `Disk`s, and `Disk` holds the seam, so naming it here
//! would make the seam and the disk import each other.

use std::any::Any;
use std::sync::Arc;

/// A filter acting before write-like requests (copy-before-write).
pub trait WriteHook: Send + Sync + std::fmt::Debug {
    /// The handle one queue acts through (its own I/O handles).
    fn queue_handle(self: Arc<Self>) -> Box<dyn WriteHookQueue>;

    /// The hook as `Any`, for its owner to get its own type back.
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

/// One queue's handle on a [`WriteHook`].
pub trait WriteHookQueue: Send {
    /// Acts on a write-like request of `len` bytes at `offset` before it
    /// is submitted; returns once the request may go down.
    fn before_write(&mut self, offset: u64, len: u64);
}

/// Whether two hooks are the same installed filter.
pub fn same_hook(a: &Arc<dyn WriteHook>, b: &Arc<dyn WriteHook>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}
