//! The write seam of a running disk (docs/live-operations.md): the
//! filters every guest write, write-zeroes and discard passes through,
//! and the state the disk's queues share to find them.
//!
//! [`LiveState`] belongs to a [`crate::Disk`] (all its queues share it):
//! a generation counter and the current [`Filters`], plus the named dirty
//! bitmaps the owner manages ([`LiveState::bitmaps`], `bitmaps.rs`).
//! Every change to it is made by the owner while the disk's queues are
//! quiesced, and bumps the generation. Each [`crate::DiskQueue`] holds a
//! [`QueueFilters`]: the generation it last saw and its own handles on the
//! filters; it reads the generation once per batch (one relaxed atomic
//! load, the whole cost of the seam when no filter is active) and marks
//! the dirty bitmaps with the completions it hands out.
//!
//! Persistent bitmaps of a qcow2 image are loaded into the registry and
//! marked in use by [`attach`] (the owner's open,
//! `ExclusiveImage::attach_persistent_bitmaps`) and stored back by
//! [`LiveState::store_persistent`] when the disk closes (`persist.rs`).
//!
//! This floor reaches formats only through their traits; virtio, the VMM
//! and the API reach it through `Disk::live`.

mod bitmaps;
mod cbw;
mod dirty_bitmap;
mod persist;
mod queue_filters;
mod sink;
mod state;
mod view;
mod write_hook;

pub use bitmaps::{BitmapInfo, BitmapRegistry, Checkpoint, LiveError, NamedBitmap};
pub use cbw::{CbwQueue, CopyBeforeWrite, GranuleState, MIN_CBW_GRANULE};
pub use dirty_bitmap::{
    check_granularity, DirtyBitmap, DEFAULT_GRANULARITY, MAX_GRANULARITY, MIN_GRANULARITY,
};
pub use persist::{adopt, attach};
pub use queue_filters::QueueFilters;
pub use sink::BitmapSink;
pub use state::{BitmapGuard, Filters, LiveState};
pub use view::{PointInTimeView, ViewReader, ViewStatus};
pub use write_hook::{CompletionHook, CompletionHookQueue, WriteHook, WriteHookQueue};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod view_tests;
