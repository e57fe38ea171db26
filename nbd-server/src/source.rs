//! What an export serves: the [`ExportSource`] trait the server reads,
//! writes and asks block status through, and the [`SourceQueue`] each
//! connection submits its requests on.
//!
//! The server never sees an image: it asks the source for its size,
//! whether it can be written, one queue per connection (block requests
//! in, completions out on the queue's eventfd), the `base:allocation`
//! status of a range, and the dirty bitmaps it offers as
//! `qemu:dirty-bitmap:NAME` contexts. A plain opened image is one source
//! (`crate::disk_source::DiskSource`); a point-in-time view of a running
//! disk is another, built where the disk runs.

use std::os::fd::{AsRawFd, RawFd};

use block::{BlockError, BlockRequest, Completion};

use crate::bitmap::ExportedBitmap;

/// One extent of `base:allocation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Bytes from the asked offset with this status (more than 0).
    pub len: u64,
    /// Holds data somewhere (false: a hole, `NBD_STATE_HOLE`).
    pub data: bool,
    /// Reads as zeroes (`NBD_STATE_ZERO`).
    pub zero: bool,
}

/// Something the server exports (see the module docs). Called from the
/// accept thread and every connection thread at once.
pub trait ExportSource: Send + Sync {
    /// Bytes the export has (fixed while it is served).
    fn size(&self) -> u64;

    /// Writes are impossible; the export must then be read-only.
    fn readonly(&self) -> bool;

    /// A queue of the connection's own (made on the connection's thread,
    /// after its handshake).
    fn queue(&self) -> Result<Box<dyn SourceQueue>, BlockError>;

    /// The `base:allocation` status of the extent at `offset`, at most
    /// `len` bytes long (`len` is more than 0 and the range lies inside
    /// the export). Blocking; called on a connection's thread.
    fn allocation(&self, offset: u64, len: u64) -> Result<Allocation, BlockError>;

    /// Whether zeroing `len` bytes at `offset` only changes metadata, not
    /// data (`NBD_CMD_FLAG_FAST_ZERO`); `may_unmap` is the request's lack
    /// of `NO_HOLE`. A read-only source never gets asked.
    fn zeroing_is_fast(&self, _offset: u64, _len: u64, _may_unmap: bool) -> bool {
        false
    }

    /// The dirty bitmaps offered as `qemu:dirty-bitmap:NAME` contexts,
    /// each covering the whole export.
    fn bitmaps(&self) -> Vec<ExportedBitmap> {
        Vec::new()
    }
}

/// A connection's queue on its source: `block::DiskQueue`'s contract
/// (every submitted request yields exactly one completion; the eventfd
/// is readable while completions wait).
pub trait SourceQueue: Send {
    /// Submits (and empties) `batch`.
    fn submit(&mut self, batch: &mut Vec<BlockRequest>);

    /// Readable while completions wait (non-blocking); valid as long as
    /// the queue.
    fn completion_fd(&self) -> RawFd;

    /// Clears the eventfd, then moves every finished request to `out`.
    fn drain_completions(&mut self, out: &mut Vec<Completion>);
}

impl SourceQueue for block::DiskQueue {
    fn submit(&mut self, batch: &mut Vec<BlockRequest>) {
        self.submit_batch_requests(batch.drain(..));
    }

    fn completion_fd(&self) -> RawFd {
        self.completion_eventfd().as_raw_fd()
    }

    fn drain_completions(&mut self, out: &mut Vec<Completion>) {
        block::DiskQueue::drain_completions(self, out);
    }
}
