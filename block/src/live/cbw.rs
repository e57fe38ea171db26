//! [`CopyBeforeWrite`]: the filter that keeps a point-in-time view of a
//! running disk (docs/live-operations.md, "A write on its way down").
//!
//! The disk is cut into granules (64 KiB, or the image's cluster size if
//! larger); each has a state in an atomic byte: `Uncopied` (the live disk
//! still holds the view's bytes), `Copying` (a queue claimed it and is
//! copying it), `Copied` (the scratch image holds them) or `CopiedZero`
//! (they were zeroes; nothing was written). Before a queue submits a
//! write, write-zeroes or discard, [`CbwQueue::before_write`] claims every
//! `Uncopied` granule the request touches and copies it at once, on the
//! queue's thread, through the queue's own sync-engine queues on the
//! source and the scratch (a granule the image reports as zeroes, or
//! that reads as zeroes, is not written); a granule another queue is
//! copying is waited for (the thread yields until the state moves; the
//! copy is bounded).
//! A queue never waits while it holds an unfinished claim, so two queues
//! whose requests overlap cannot wait for each other.
//!
//! A copy that fails breaks the view: the reason is kept
//! ([`CopyBeforeWrite::broken`]), the granule's state becomes `Broken`,
//! and from then on nothing is copied: the guest's write goes on
//! unharmed and the view's reads fail with the reason (QEMU's
//! `on-cbw-error=break-snapshot`).
//!
//! The view reads these states through [`CopyBeforeWrite::state`]
//! (`view.rs`). The filter holds the source [`Disk`], whose state holds
//! the filter while it is installed: the owner removes it when the view
//! ends ([`super::LiveState::set_cbw`]), which ends that cycle. The
//! seam's shared state holds it as a `WriteHook` (`write_hook.rs`), so
//! the seam names no `Disk`.
//!
//! Written here: it is a filter on this crate's own write path, which no
//! crate knows.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use super::state::LiveState;
use super::write_hook::{WriteHook, WriteHookQueue};
use crate::error::BlockError;
use crate::options::EngineKind;
use crate::request::{IoMemory, RequestOp};
use crate::{Disk, DiskQueue};

/// The smallest copy granule (QEMU's copy-before-write uses at least
/// 64 KiB).
pub const MIN_CBW_GRANULE: u64 = 64 << 10;

/// Where a granule's view bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GranuleState {
    /// Still on the live disk.
    Uncopied,
    /// A queue is copying it to the scratch image.
    Copying,
    /// In the scratch image.
    Copied,
    /// Zeroes (not written to the scratch).
    CopiedZero,
    /// Its copy failed; the view is broken.
    Broken,
}

const UNCOPIED: u8 = 0;
const COPYING: u8 = 1;
const COPIED: u8 = 2;
const COPIED_ZERO: u8 = 3;
const BROKEN: u8 = 4;

fn decode(v: u8) -> GranuleState {
    match v {
        UNCOPIED => GranuleState::Uncopied,
        COPYING => GranuleState::Copying,
        COPIED => GranuleState::Copied,
        COPIED_ZERO => GranuleState::CopiedZero,
        _ => GranuleState::Broken,
    }
}

/// See the module docs.
pub struct CopyBeforeWrite {
    source: Disk,
    scratch: Disk,
    granule_bits: u32,
    size: u64,
    states: Box<[AtomicU8]>,
    broken: OnceLock<String>,
    /// Bytes copied to the scratch image (zero granules not counted).
    copied_bytes: AtomicU64,
    /// Tests: copies fail as a full scratch image would.
    #[cfg(test)]
    pub(super) fail_copies: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for CopyBeforeWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyBeforeWrite")
            .field("granule", &self.granule())
            .field("size", &self.size)
            .field("broken", &self.broken.get())
            .finish()
    }
}

impl CopyBeforeWrite {
    /// A filter that copies `source`'s old data to `scratch` (an empty
    /// image at least as large, opened writable) before it changes.
    pub fn new(source: &Disk, scratch: &Disk) -> Result<CopyBeforeWrite, BlockError> {
        let size = source.size();
        if scratch.readonly() || scratch.size() < size {
            return Err(BlockError::Refused(format!(
                "the scratch image must be writable and at least {size} bytes"
            )));
        }
        let cluster = |d: &Disk| d.format().info().cluster_size.unwrap_or(0);
        let granule = MIN_CBW_GRANULE
            .max(cluster(source))
            .max(cluster(scratch))
            .next_power_of_two();
        let count = usize::try_from(size.div_ceil(granule))
            .map_err(|_| BlockError::Refused("the disk is too large for a view".into()))?;
        Ok(CopyBeforeWrite {
            source: source.clone(),
            scratch: scratch.clone(),
            granule_bits: granule.trailing_zeros(),
            size,
            states: (0..count).map(|_| AtomicU8::new(UNCOPIED)).collect(),
            broken: OnceLock::new(),
            copied_bytes: AtomicU64::new(0),
            #[cfg(test)]
            fail_copies: Default::default(),
        })
    }

    /// Bytes of one granule.
    pub fn granule(&self) -> u64 {
        1 << self.granule_bits
    }

    /// Bytes of the disk at the instant the view began.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn source(&self) -> &Disk {
        &self.source
    }

    pub fn scratch(&self) -> &Disk {
        &self.scratch
    }

    /// Why the view is broken, if it is.
    pub fn broken(&self) -> Option<&str> {
        self.broken.get().map(String::as_str)
    }

    /// Bytes copied to the scratch image so far.
    pub fn copied_bytes(&self) -> u64 {
        self.copied_bytes.load(Ordering::Relaxed)
    }

    /// The state of granule `i` (Acquire: a `Copied` state comes after
    /// the scratch holds its bytes).
    pub fn state(&self, i: u64) -> GranuleState {
        decode(self.states[i as usize].load(Ordering::Acquire))
    }

    /// Waits until granule `i` is no longer being copied; returns its
    /// state then.
    pub fn settled(&self, i: u64) -> GranuleState {
        loop {
            match self.state(i) {
                GranuleState::Copying => std::thread::yield_now(),
                s => return s,
            }
        }
    }

    /// The granules bytes `offset..offset + len` touch (clipped to the
    /// disk).
    pub fn granules(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        let end = offset.saturating_add(len).min(self.size);
        if len == 0 || offset >= end {
            return 0..0;
        }
        (offset >> self.granule_bits)..((end - 1) >> self.granule_bits) + 1
    }

    /// Byte range of granule `i`.
    pub fn granule_range(&self, i: u64) -> (u64, u64) {
        let start = i << self.granule_bits;
        (start, self.granule().min(self.size - start))
    }

    /// Breaks the view (the first reason is kept).
    pub fn break_view(&self, reason: String) {
        if self.broken.set(reason.clone()).is_ok() {
            log::error!("point-in-time view broken: {reason}; the guest's writes go on");
        }
    }
}

impl WriteHook for CopyBeforeWrite {
    fn queue_handle(self: Arc<Self>) -> Box<dyn WriteHookQueue> {
        Box::new(CbwQueue::new(self))
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync> {
        self
    }
}

impl LiveState {
    /// Installs (or with `None` removes) the copy-before-write filter of
    /// a point-in-time view; the other filters stay. The disk's queues
    /// must be quiesced (docs/live-operations.md, "One instant").
    pub fn set_cbw(&self, cbw: Option<Arc<CopyBeforeWrite>>) {
        self.set_write_hook(cbw.map(|c| c as Arc<dyn WriteHook>));
    }

    /// The copy-before-write filter installed now, if any.
    pub fn cbw(&self) -> Option<Arc<CopyBeforeWrite>> {
        self.write_hook()
            .and_then(|h| h.into_any().downcast::<CopyBeforeWrite>().ok())
    }
}

impl WriteHookQueue for CbwQueue {
    fn before_write(&mut self, offset: u64, len: u64) {
        CbwQueue::before_write(self, offset, len);
    }
}

/// One queue's handles for copying: its own sync-engine queues on the
/// source and the scratch, made the first time it copies.
pub struct CbwQueue {
    cbw: Arc<CopyBeforeWrite>,
    source: Option<DiskQueue>,
    scratch: Option<DiskQueue>,
    buf: Vec<u8>,
}

impl CbwQueue {
    pub fn new(cbw: Arc<CopyBeforeWrite>) -> Self {
        CbwQueue {
            cbw,
            source: None,
            scratch: None,
            buf: Vec::new(),
        }
    }

    pub fn filter(&self) -> &Arc<CopyBeforeWrite> {
        &self.cbw
    }

    /// Copies every granule a write of `len` bytes at `offset` touches
    /// that the view still reads from the live disk; returns once each
    /// of them is copied (by this queue or another) or the view broke.
    pub fn before_write(&mut self, offset: u64, len: u64) {
        let cbw = self.cbw.clone();
        for i in cbw.granules(offset, len) {
            loop {
                if cbw.broken().is_some() {
                    return;
                }
                let state = &cbw.states[i as usize];
                match state.load(Ordering::Acquire) {
                    UNCOPIED => {
                        if state
                            .compare_exchange(
                                UNCOPIED,
                                COPYING,
                                Ordering::AcqRel,
                                Ordering::Acquire,
                            )
                            .is_err()
                        {
                            continue;
                        }
                        let done = match self.copy(i) {
                            Ok(true) => COPIED_ZERO,
                            Ok(false) => COPIED,
                            Err(e) => {
                                let (start, _) = cbw.granule_range(i);
                                cbw.break_view(format!(
                                    "copying the old data at offset {start} to the scratch image failed: {}",
                                    ch_log::error_chain(&e)
                                ));
                                BROKEN
                            }
                        };
                        state.store(done, Ordering::Release);
                        break;
                    }
                    COPYING => std::thread::yield_now(),
                    _ => break,
                }
            }
        }
    }

    /// Copies granule `i`; true when it held only zeroes (not written).
    fn copy(&mut self, i: u64) -> Result<bool, BlockError> {
        let (start, len) = self.cbw.granule_range(i);
        #[cfg(test)]
        if self.cbw.fail_copies.load(Ordering::Relaxed) {
            return Err(BlockError::NoSpace("test".into()));
        }
        // A granule the image knows reads as zeroes is not even read.
        if let Ok(st) = self.cbw.source.format().block_status(start, len) {
            if st.zero && st.len >= len {
                return Ok(true);
            }
        }
        let source = match self.source.as_mut() {
            Some(q) => q,
            None => self
                .source
                .insert(self.cbw.source.queue_with_engine(EngineKind::Sync)?),
        };
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(len as usize, 0);
        let (_, mem) = source.run(RequestOp::Read, start, IoMemory::Owned(buf))?;
        let buf = mem.into_owned().unwrap_or_default();
        if buf.iter().all(|&b| b == 0) {
            self.buf = buf;
            return Ok(true);
        }
        let scratch = match self.scratch.as_mut() {
            Some(q) => q,
            None => self
                .scratch
                .insert(self.cbw.scratch.queue_with_engine(EngineKind::Sync)?),
        };
        let (_, mem) = scratch.run(RequestOp::Write, start, IoMemory::Owned(buf))?;
        self.buf = mem.into_owned().unwrap_or_default();
        self.cbw.copied_bytes.fetch_add(len, Ordering::Relaxed);
        Ok(false)
    }
}
