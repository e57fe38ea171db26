//! An opened image as an export source: `ch-storage-daemon`'s export.
//!
//! Each connection gets its own `block::DiskQueue` on the shared
//! [`Disk`]; block status is the format's (`qemu-img map`'s source);
//! FAST_ZERO is fast only where zeroing changes metadata alone (whole
//! qcow2 clusters, or a hole punched in a raw file). The bitmaps it
//! offers are the ones its owner adds ([`DiskSource::with_bitmap`]).

use std::sync::Arc;

use block::{BlockError, Disk};

use crate::bitmap::{DirtyBitmap, ExportedBitmap};
use crate::source::{Allocation, ExportSource, SourceQueue};

/// A [`Disk`] served as it is.
pub struct DiskSource {
    disk: Disk,
    /// qcow2's cluster size (FAST_ZERO on whole clusters is metadata only).
    cluster_size: Option<u64>,
    bitmaps: Vec<ExportedBitmap>,
}

impl DiskSource {
    pub fn new(disk: &Disk) -> DiskSource {
        DiskSource {
            disk: disk.clone(),
            cluster_size: disk.format().info().cluster_size,
            bitmaps: Vec::new(),
        }
    }

    /// Also offers `bitmap` as `qemu:dirty-bitmap:NAME`.
    pub fn with_bitmap(mut self, name: &str, bitmap: Arc<dyn DirtyBitmap>) -> DiskSource {
        self.bitmaps.push(ExportedBitmap {
            name: name.to_string(),
            bitmap,
        });
        self
    }
}

impl ExportSource for DiskSource {
    fn size(&self) -> u64 {
        self.disk.size()
    }

    fn readonly(&self) -> bool {
        self.disk.readonly()
    }

    fn queue(&self) -> Result<Box<dyn SourceQueue>, BlockError> {
        Ok(Box::new(self.disk.queue()?))
    }

    fn allocation(&self, offset: u64, len: u64) -> Result<Allocation, BlockError> {
        let st = self.disk.format().block_status(offset, len)?;
        Ok(Allocation {
            len: st.len,
            data: st.data,
            zero: st.zero,
        })
    }

    fn zeroing_is_fast(&self, offset: u64, len: u64, may_unmap: bool) -> bool {
        match self.cluster_size {
            Some(cs) => {
                offset.is_multiple_of(cs)
                    && (len.is_multiple_of(cs) || offset + len == self.disk.size())
            }
            None => may_unmap,
        }
    }

    fn bitmaps(&self) -> Vec<ExportedBitmap> {
        self.bitmaps.clone()
    }
}
