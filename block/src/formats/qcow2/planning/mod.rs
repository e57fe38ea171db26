//! Planning a queue's requests: guest ranges in, plans of host
//! operations out (the executor runs them; the format itself writes only
//! metadata).
//!
//! - `read` (`ReadPlanner`) and `queue_view` (a queue's reads of
//!   allocated clusters without the image lock);
//! - `write` (allocating and in-place writes, commit and abort), `zero`
//!   (write-zeroes and discard), with the plan under construction in
//!   `plan_builder`; `cow` (copy-on-write sources read outside the lock);
//!   `inflight` (allocations whose L2 entries wait for their data);
//! - `status` (block status, with `prealloc_detect` for images made with
//!   `preallocation=metadata`);
//! - `populate`: a stream's copy of backing data into clusters still
//!   unallocated, decided under the image lock;
//! - `plan_exec`: executing a read plan inline (copy-on-write sources,
//!   tests).
//!
//! Each planner borrows the image's `Chain` and, under the image lock,
//! its `State`; a request's guest range enters and a `ReadPlan` or
//! `WritePlan` leaves, while table lookups, allocations and published
//! L2 entries go through `metadata::meta`'s operations.

pub(crate) mod cow;
pub(crate) mod inflight;
pub(crate) mod plan_builder;
pub(crate) mod plan_exec;
pub(crate) mod populate;
pub(crate) mod prealloc_detect;
pub(crate) mod queue_view;
pub(crate) mod read;
pub(crate) mod status;
pub(crate) mod write;
pub(crate) mod zero;
