//! What a queue calls before a write-like request goes down, and on
//! completions before they leave, seen from the seam's side: a filter
//! installed on the disk ([`WriteHook`], [`CompletionHook`]) and the
//! per-queue handle it makes ([`WriteHookQueue`],
//! [`CompletionHookQueue`]).
//!
//! The seam's shared state (`state.rs`) and each queue's side
//! (`queue_filters.rs`) hold hooks only through these traits, so they
//! name no filter that reaches images: copy-before-write (`cbw.rs`)
//! copies through `Disk`s, and `Disk` holds the seam, so naming it here
//! would make the seam and the disk import each other. The same holds
//! for a write-blocking mirror (`crate::jobs::write_blocking`), which
//! lives with the jobs, above the disk.

use std::any::Any;
use std::sync::Arc;

use crate::request::Completion;

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

/// A filter acting on write-like completions before they leave the
/// queue (a write-blocking mirror sends each to its target first).
pub trait CompletionHook: Send + Sync + std::fmt::Debug {
    /// The handle one queue acts through (its own I/O handles, made on
    /// the queue's thread when it first needs them).
    fn queue_handle(self: Arc<Self>) -> Box<dyn CompletionHookQueue>;
}

/// One queue's handle on a [`CompletionHook`].
pub trait CompletionHookQueue: Send {
    /// Sees a write-like request of `len` bytes at `offset` before it is
    /// submitted (a write-blocking mirror counts the writes in flight).
    fn before_write(&mut self, _offset: u64, _len: u64) {}

    /// Acts on `done` (completions of every kind, about to leave the
    /// queue); returns once they may leave. Their results stay as they
    /// are: the guest sees its own request's result, whatever the filter
    /// met.
    fn completed(&mut self, done: &[Completion]);
}

/// Whether two hooks are the same installed filter.
pub fn same_hook(a: &Arc<dyn WriteHook>, b: &Arc<dyn WriteHook>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// Whether two completion hooks are the same installed filter.
pub fn same_completion_hook(a: &Arc<dyn CompletionHook>, b: &Arc<dyn CompletionHook>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}
