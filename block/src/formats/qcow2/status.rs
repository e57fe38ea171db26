//! The extent walk behind `Format::block_status` (`qemu-img map`): the
//! kind of each cluster, and the status of ranges the backing image
//! decides; `queue.rs` merges clusters into runs.
//!
//! Guest ranges enter; `BlockStatus` runs leave, each as long as the
//! clusters keep the same kind (and contiguous host offsets).

use std::sync::atomic::Ordering;

use super::header::OFF_SIZE;
use super::image::{Qcow2Image, State};
use super::l2_entry::{subcluster_state, L2Entry, SubclusterState};
use super::meta::MetaState;
use super::meta_io::MetaKind;
use crate::error::BlockError;
use crate::formats::BlockStatus;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Data(u64),
    /// Reads as zeroes; keeps its host cluster when it has one.
    Zero(Option<u64>),
    Compressed,
    Unallocated,
}

impl Qcow2Image {
    pub(super) fn kind_at(&self, st: &mut State, guest: u64) -> Result<(Kind, u64), BlockError> {
        let meta = &mut st.meta;
        let cs = meta.g.cluster_size;
        let in_c = guest & (cs - 1);
        // Compressed data still in the write cache: what reads return.
        if st.compressed.is_pending(guest - in_c) {
            return Ok((Kind::Compressed, cs - in_c));
        }
        // A missing L2 table: the whole range it would map is unallocated.
        if let Some(n) = meta.unmapped_run(guest)? {
            return Ok((Kind::Unallocated, n));
        }
        let (e, bitmap) = meta.l2_entry(guest)?;
        if meta.g.extended_l2 && !matches!(e, L2Entry::Compressed(_)) {
            let sub = cs / 32;
            let n = sub - in_c % sub;
            let st = subcluster_state(bitmap, (in_c / sub) as u32).map_err(|r| meta.invalid(r))?;
            let host = match e {
                L2Entry::Normal { host, .. }
                | L2Entry::Zero {
                    host: Some(host), ..
                } => host,
                _ => 0,
            };
            return Ok(match st {
                SubclusterState::Allocated => (Kind::Data(host + in_c), n),
                SubclusterState::Zero => (Kind::Zero((host != 0).then_some(host + in_c)), n),
                SubclusterState::Unallocated => (Kind::Unallocated, n),
            });
        }
        let n = cs - in_c;
        Ok(match e {
            L2Entry::Normal { host, .. } => (Kind::Data(host + in_c), n),
            L2Entry::Zero { host, .. } => (Kind::Zero(host.map(|h| h + in_c)), n),
            L2Entry::Compressed(_) => (Kind::Compressed, n),
            L2Entry::Unallocated => (Kind::Unallocated, n),
        })
    }

    pub(super) fn backing_status(&self, offset: u64, len: u64) -> Result<BlockStatus, BlockError> {
        let unallocated = |len, depth| BlockStatus {
            len,
            depth,
            present: false,
            zero: true,
            data: false,
            compressed: false,
            offset: None,
            file: None,
        };
        let Some(b) = &self.backing else {
            return Ok(unallocated(len, 0));
        };
        let bsize = b.image.size();
        // Past the backing image's end this layer already knows the range
        // reads as zeroes: depth 0, as qemu-img map reports it.
        if offset >= bsize {
            return Ok(unallocated(len, 0));
        }
        let mut s = b.image.block_status(offset, len.min(bsize - offset))?;
        s.depth += 1;
        if let Some(f) = &mut s.file {
            f.0 += self.backing_base;
        }
        Ok(s)
    }

    /// Makes everything before durable, then writes `new_size` into the
    /// header and takes it as the disk's size (the L1 table must already
    /// cover it).
    pub(super) fn write_size(&self, meta: &mut MetaState, new_size: u64) -> Result<(), BlockError> {
        meta.barrier()?;
        meta.write(MetaKind::Header, OFF_SIZE, &new_size.to_be_bytes())?;
        self.size.store(new_size, Ordering::Release);
        Ok(())
    }
}
