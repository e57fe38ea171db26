//! A point-in-time view of a running disk as an export source
//! (`block::live::PointInTimeView`): read-only, `base:allocation` from
//! the view, and the view's frozen dirty bitmap as
//! `qemu:dirty-bitmap:NAME`.
//!
//! Each connection gets a [`ViewQueue`] with a `block::live::ViewReader`
//! of its own: a READ is served on the connection's thread when it is
//! submitted (the view checks each granule's copy state around its reads
//! of the live disk, which a sync read does simply) and its completion
//! is ready at once, with the eventfd signalled. A broken view answers
//! every READ with an error that says why.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use block::live::{PointInTimeView, ViewReader};
use block::{BlockError, BlockRequest, Completion, IoMemory, RequestOp};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::bitmap::{DirtyBitmap, ExportedBitmap};
use crate::source::{Allocation, ExportSource, SourceQueue};

/// See the module docs.
pub struct ViewSource {
    view: Arc<PointInTimeView>,
}

impl ViewSource {
    pub fn new(view: Arc<PointInTimeView>) -> ViewSource {
        ViewSource { view }
    }
}

/// A running disk's bitmap, frozen at the view's instant.
struct FrozenBitmap(Arc<block::live::DirtyBitmap>);

impl DirtyBitmap for FrozenBitmap {
    fn granularity(&self) -> u64 {
        self.0.granularity()
    }

    fn next_dirty(&self, from: u64, end: u64) -> Option<(u64, u64)> {
        self.0.next_dirty(from, end)
    }
}

impl ExportSource for ViewSource {
    fn size(&self) -> u64 {
        self.view.size()
    }

    fn readonly(&self) -> bool {
        true
    }

    fn queue(&self) -> Result<Box<dyn SourceQueue>, BlockError> {
        Ok(Box::new(ViewQueue {
            reader: self.view.reader()?,
            done: Vec::new(),
            eventfd: EventFd::new(EFD_NONBLOCK).map_err(BlockError::EventFd)?,
        }))
    }

    fn allocation(&self, offset: u64, len: u64) -> Result<Allocation, BlockError> {
        let st = self.view.allocation(offset, len)?;
        Ok(Allocation {
            len: st.len,
            data: st.data,
            zero: st.zero,
        })
    }

    fn bitmaps(&self) -> Vec<ExportedBitmap> {
        self.view
            .bitmap()
            .map(|(name, bitmap)| ExportedBitmap {
                name: name.clone(),
                bitmap: Arc::new(FrozenBitmap(bitmap.clone())),
            })
            .into_iter()
            .collect()
    }
}

/// One connection's queue on the view (see the module docs).
pub struct ViewQueue {
    reader: ViewReader,
    done: Vec<Completion>,
    eventfd: EventFd,
}

impl SourceQueue for ViewQueue {
    fn submit(&mut self, batch: &mut Vec<BlockRequest>) {
        if batch.is_empty() {
            return;
        }
        for r in batch.drain(..) {
            let (op, offset, len) = (r.op, r.offset, r.len());
            let (result, memory) = match (r.op, r.memory) {
                (RequestOp::Read, IoMemory::Owned(mut buf)) => {
                    let result = self.reader.read(offset, &mut buf).map(|()| len);
                    (result, IoMemory::Owned(buf))
                }
                // Nothing is ever written: a flush has nothing to do.
                (RequestOp::Flush, m) => (Ok(0), m),
                (_, m) => (Err(BlockError::ReadOnly), m),
            };
            self.done.push(Completion {
                user_data: r.user_data,
                op,
                offset,
                len,
                result,
                memory,
            });
        }
        if let Err(e) = self.eventfd.write(1) {
            log::error!("nbd: cannot signal the view queue's completions: {e}");
        }
    }

    fn completion_fd(&self) -> RawFd {
        self.eventfd.as_raw_fd()
    }

    fn drain_completions(&mut self, out: &mut Vec<Completion>) {
        let _ = self.eventfd.read();
        out.append(&mut self.done);
    }
}
