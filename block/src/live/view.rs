//! [`PointInTimeView`]: a running disk as it was when its
//! copy-before-write filter was installed (docs/live-operations.md, "The
//! point-in-time view"), read-only, for the NBD server.
//!
//! Reads enter through a [`ViewReader`] (one per reader thread, with its
//! own sync-engine queues on the live disk and the scratch image):
//!
//! - a `Copied` granule is read from the scratch image, a `CopiedZero`
//!   one is zeroes;
//! - an `Uncopied` run is read from the live disk, then every granule of
//!   it is checked again: one whose state moved (a guest write claimed
//!   it, and so copied it before changing it) is read again from the
//!   scratch once its copy is done. A guest write that changed the bytes
//!   read must have claimed the granule before, so a granule still
//!   `Uncopied` after the read was read as it was at the instant.
//!
//! Block status (`base:allocation`) follows the same split: the live
//! format's status for uncopied runs (checked the same way), data for
//! copied granules, zeroes for zero ones. The dirty bitmap the view
//! offers is a frozen copy made at the instant. A broken view (a copy
//! failed) fails every read with the reason.

use std::sync::Arc;

use super::cbw::{CopyBeforeWrite, GranuleState};
use super::dirty_bitmap::DirtyBitmap;
use crate::error::BlockError;
use crate::options::EngineKind;
use crate::request::{IoMemory, RequestOp};
use crate::DiskQueue;

/// See the module docs.
#[derive(Debug)]
pub struct PointInTimeView {
    cbw: Arc<CopyBeforeWrite>,
    /// The bitmap offered as `qemu:dirty-bitmap:NAME`, frozen at the
    /// instant.
    bitmap: Option<(String, Arc<DirtyBitmap>)>,
}

/// The `base:allocation` status of one extent of the view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewStatus {
    pub len: u64,
    pub data: bool,
    pub zero: bool,
}

impl PointInTimeView {
    pub fn new(cbw: Arc<CopyBeforeWrite>, bitmap: Option<(String, Arc<DirtyBitmap>)>) -> Self {
        PointInTimeView { cbw, bitmap }
    }

    pub fn size(&self) -> u64 {
        self.cbw.size()
    }

    pub fn filter(&self) -> &Arc<CopyBeforeWrite> {
        &self.cbw
    }

    /// The frozen bitmap and its name.
    pub fn bitmap(&self) -> Option<&(String, Arc<DirtyBitmap>)> {
        self.bitmap.as_ref()
    }

    /// A reader with queues of its own.
    pub fn reader(&self) -> Result<ViewReader, BlockError> {
        Ok(ViewReader {
            cbw: self.cbw.clone(),
            source: self.cbw.source().queue_with_engine(EngineKind::Sync)?,
            scratch: self.cbw.scratch().queue_with_engine(EngineKind::Sync)?,
        })
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(BlockError::OutOfRange {
                offset,
                len,
                size: self.size(),
            }),
        }
    }

    /// The status of the extent at `offset` (at most `len` bytes, more
    /// than 0, inside the view).
    pub fn allocation(&self, offset: u64, len: u64) -> Result<ViewStatus, BlockError> {
        self.check_range(offset, len)?;
        let cbw = &self.cbw;
        loop {
            broken(cbw, offset)?;
            let range = cbw.granules(offset, len);
            let first = range.start;
            let state = cbw.settled(first);
            // The run of granules in the same state.
            let mut end_granule = first + 1;
            while end_granule < range.end && cbw.state(end_granule) == state {
                end_granule += 1;
            }
            let run_end = (end_granule * cbw.granule()).min(offset + len);
            let run = run_end - offset;
            match state {
                GranuleState::Copied => {
                    return Ok(ViewStatus {
                        len: run,
                        data: true,
                        zero: false,
                    })
                }
                GranuleState::CopiedZero => {
                    return Ok(ViewStatus {
                        len: run,
                        data: false,
                        zero: true,
                    })
                }
                GranuleState::Uncopied => {
                    let st = cbw.source().format().block_status(offset, run)?;
                    let len = st.len.clamp(1, run);
                    if still_uncopied(cbw, offset, len) {
                        broken(cbw, offset)?;
                        return Ok(ViewStatus {
                            len,
                            data: st.data,
                            zero: st.zero,
                        });
                    }
                }
                GranuleState::Copying | GranuleState::Broken => {}
            }
        }
    }
}

/// Whether every granule of `offset..offset + len` is still uncopied.
fn still_uncopied(cbw: &CopyBeforeWrite, offset: u64, len: u64) -> bool {
    cbw.granules(offset, len)
        .all(|i| cbw.state(i) == GranuleState::Uncopied)
}

/// The view's error once it is broken.
fn broken(cbw: &CopyBeforeWrite, offset: u64) -> Result<(), BlockError> {
    match cbw.broken() {
        Some(reason) => Err(BlockError::Read {
            offset,
            source: std::io::Error::other(format!("the point-in-time view is broken: {reason}")),
        }),
        None => Ok(()),
    }
}

/// Reads the view (see the module docs); one per reading thread.
pub struct ViewReader {
    cbw: Arc<CopyBeforeWrite>,
    source: DiskQueue,
    scratch: DiskQueue,
}

impl ViewReader {
    /// Reads `buf.len()` bytes of the view at `offset`.
    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let len = buf.len() as u64;
        let size = self.cbw.size();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(BlockError::OutOfRange { offset, len, size });
        }
        let cbw = self.cbw.clone();
        let g = cbw.granule();
        let mut at = offset;
        while at < offset + len {
            broken(&cbw, at)?;
            let range = cbw.granules(at, offset + len - at);
            let state = cbw.settled(range.start);
            let mut end_granule = range.start + 1;
            while end_granule < range.end && cbw.state(end_granule) == state {
                end_granule += 1;
            }
            let run_end = (end_granule * g).min(offset + len);
            let part = &mut buf[(at - offset) as usize..(run_end - offset) as usize];
            match state {
                GranuleState::CopiedZero => part.fill(0),
                GranuleState::Copied => read_into(&mut self.scratch, at, part)?,
                GranuleState::Uncopied => {
                    read_into(&mut self.source, at, part)?;
                    // Granules a guest write claimed meanwhile are read
                    // again from the scratch once their copy is done.
                    for i in cbw.granules(at, run_end - at) {
                        if cbw.state(i) == GranuleState::Uncopied {
                            continue;
                        }
                        let (gs, gl) = cbw.granule_range(i);
                        let from = gs.max(at);
                        let to = (gs + gl).min(run_end);
                        let sub = &mut buf[(from - offset) as usize..(to - offset) as usize];
                        match cbw.settled(i) {
                            GranuleState::Copied => read_into(&mut self.scratch, from, sub)?,
                            GranuleState::CopiedZero => sub.fill(0),
                            _ => broken(&cbw, from)?,
                        }
                    }
                    // A write that found the view broken copied nothing.
                    broken(&cbw, at)?;
                }
                GranuleState::Copying | GranuleState::Broken => broken(&cbw, at)?,
            }
            at = run_end;
        }
        Ok(())
    }
}

/// Reads `buf.len()` bytes at `offset` through `queue`.
fn read_into(queue: &mut DiskQueue, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
    const CHUNK: usize = 4 << 20;
    let mut pos = offset;
    for chunk in buf.chunks_mut(CHUNK) {
        let (_, mem) = queue.run(RequestOp::Read, pos, IoMemory::Owned(vec![0; chunk.len()]))?;
        if let Some(data) = mem.into_owned() {
            chunk.copy_from_slice(&data);
        }
        pos += chunk.len() as u64;
    }
    Ok(())
}
