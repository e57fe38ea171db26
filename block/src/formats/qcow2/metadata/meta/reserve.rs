//! Keeping the image file's size ahead of cluster allocation.
//!
//! New clusters are allocated at the end of the file. A direct write past
//! the end of a file must extend it, and filesystems (ext4, xfs) run such
//! writes one at a time, waiting for each to finish with the inode locked:
//! allocating writes would then serialise however deep the queue is. So
//! when an allocation passes the file's size, the size (not the space:
//! the tail stays a hole) is set well past it with one `ftruncate`, and
//! data writes land inside the file and run in parallel. The unused tail
//! is cut off again on close, so the file ends where qemu's would; after a
//! crash it is a hole that holds no cluster (refcount 0), which qemu-img
//! check does not report and later allocations reuse.
//!
//! Allocation ends (bytes) enter; `ftruncate` calls leave, through the
//! metadata-I/O seam (`MetaIo::set_len`).

use super::MetaState;
use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta_io::set_len;

/// Least the size grows by at once, and the fraction of the used size
/// it grows by when larger.
const MIN_RESERVE: u64 = 32 << 20;
const RESERVE_DIVISOR: u64 = 8;

impl MetaState {
    /// Makes the file at least `end` bytes long (plus headroom), after
    /// `end` became the end of the allocated clusters.
    pub fn reserve_to(&mut self, end: u64) -> Result<(), BlockError> {
        if self.g.data_file || end <= self.reserved_end {
            return Ok(());
        }
        let cs = self.g.cluster_size;
        let grow = (end / RESERVE_DIVISOR).max(MIN_RESERVE);
        let target = end.saturating_add(grow).div_ceil(cs).saturating_mul(cs);
        set_len(&*self.io, target, "space for new clusters")?;
        self.reserved_end = target;
        Ok(())
    }

    /// Cuts the file back to the end of its allocated clusters (only the
    /// headroom `reserve_to` added; nothing in use lies past `file_size`).
    pub fn trim_reserve(&mut self) -> Result<(), BlockError> {
        if self.reserved_end <= self.file_size {
            return Ok(());
        }
        set_len(&*self.io, self.file_size, "trimming unused space")?;
        self.reserved_end = self.file_size;
        Ok(())
    }
}
