//! Write-zeroes and discard planning, cluster by cluster:
//! [`ZeroPlanner`] borrows the image's [`Chain`] and, under the lock, its
//! tables (`Format::plan_write_zeroes` in `queue.rs` takes the lock).
//!
//! A guest range enters; the plan's ops go into a `PlanBuilder`. Whole clusters change metadata
//! only: on v3 images the L2 entry becomes a zero cluster, as QEMU's
//! qcow2 makes it for write-zeroes and for discard alike (an unallocated
//! cluster with nothing behind it is left alone); with unmapping allowed
//! the host cluster goes: the L2 entry is written now, the engine then
//! punches the old host cluster, and `commit` drops its refcount, so a
//! crash leaks, never corrupts, and a reused cluster is never punched.
//! A cluster flagged zero while keeping its host cluster (no unmapping
//! allowed) gets its entry published like an allocating write's.
//! Partial clusters, and v2 images over a backing file (v2 has no zero
//! flag), get zeroes written. Discard is write-zeroes with unmapping
//! allowed: a discarded range of a qcow2 image reads as zeroes.

use super::plan_builder::{PlanBuilder, Source};
use super::write::WritePlanner;
use crate::error::BlockError;
use crate::formats::qcow2::chain::Chain;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::on_disk::l2_entry::{L2Entry, OFLAG_COPIED, OFLAG_ZERO};

/// Extended L2 bitmap: all 32 subclusters read as zeroes.
const ALL_ZERO: u64 = 0xffff_ffff << 32;

/// See the module docs.
pub(crate) struct ZeroPlanner<'a> {
    pub chain: &'a Chain,
    pub meta: &'a mut MetaState,
}

impl ZeroPlanner<'_> {
    /// Plans making `offset..offset+len` read as zeroes; `may_unmap`:
    /// whole clusters may lose their host clusters.
    pub fn zero_range(
        &mut self,
        offset: u64,
        len: u64,
        may_unmap: bool,
        b: &mut PlanBuilder,
    ) -> Result<(), BlockError> {
        let cs = self.chain.cluster_size();
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let in_cluster = pos & (cs - 1);
            let n = (cs - in_cluster).min(end - pos);
            // Skip whole missing L2 tables that already read as zeroes.
            if let Some(run) = self.meta.unmapped_run(pos)? {
                if !self.chain.backing_covers(pos) {
                    pos += run.min(end - pos);
                    continue;
                }
            }
            if n < cs {
                if !self.reads_zero(pos)? {
                    self.writer().write_range(pos, n, Source::Zeroes, b)?;
                }
            } else {
                self.zero_cluster(pos, may_unmap, b)?;
            }
            pos += n;
        }
        Ok(())
    }

    /// The write planner over the same tables (partial clusters, and
    /// version 2 images over a backing file, get zeroes written).
    fn writer(&mut self) -> WritePlanner<'_> {
        WritePlanner {
            chain: self.chain,
            meta: &mut *self.meta,
        }
    }

    /// Whether the cluster holding `guest` already reads as zeroes.
    fn reads_zero(&mut self, guest: u64) -> Result<bool, BlockError> {
        let (e, bitmap) = self.meta.l2_entry(guest)?;
        let no_backing = !self.chain.backing_covers(guest);
        if self.meta.geometry().extended_l2 {
            return Ok(
                e == L2Entry::Unallocated && (bitmap == ALL_ZERO || (bitmap == 0 && no_backing))
            );
        }
        Ok(match e {
            L2Entry::Zero { .. } => true,
            L2Entry::Unallocated => no_backing,
            _ => false,
        })
    }

    /// Makes one whole cluster read as zeroes.
    fn zero_cluster(
        &mut self,
        guest: u64,
        may_unmap: bool,
        b: &mut PlanBuilder,
    ) -> Result<(), BlockError> {
        let cs = self.chain.cluster_size();
        let has_backing = self.chain.backing_covers(guest);
        if self.meta.geometry().extended_l2 {
            return self.zero_cluster_extended(guest, may_unmap, has_backing, b);
        }
        let (entry, _) = self.meta.l2_entry(guest)?;
        if self.meta.geometry().version < 3 {
            return match entry {
                L2Entry::Normal { host, copied: true } if !may_unmap || has_backing => {
                    b.zero_range(self.chain.data_file, host, cs);
                    Ok(())
                }
                L2Entry::Unallocated if !has_backing => Ok(()),
                _ if has_backing => self.writer().write_range(guest, cs, Source::Zeroes, b),
                _ => self.unmap(guest, entry, (0, 0), b),
            };
        }
        match entry {
            // A raw data file must read as zeroes too: zero the data.
            L2Entry::Normal { host, copied: true }
                if !may_unmap && self.meta.geometry().data_file =>
            {
                b.zero_range(self.chain.data_file, host, cs);
                Ok(())
            }
            // Keep the allocation, flag it zero.
            L2Entry::Normal { host, copied: true } if !may_unmap => {
                keep_allocation_zeroed(self.meta, guest, host | OFLAG_COPIED | OFLAG_ZERO, 0)
            }
            L2Entry::Zero { host: None, .. } => Ok(()),
            L2Entry::Zero { host: Some(_), .. } if !may_unmap => Ok(()),
            L2Entry::Unallocated if !has_backing => Ok(()),
            _ => self.unmap(guest, entry, (OFLAG_ZERO, 0), b),
        }
    }

    /// Extended L2: the subcluster bitmap says zero (all 32 zero bits); a
    /// kept host cluster becomes preallocated zeroes.
    fn zero_cluster_extended(
        &mut self,
        guest: u64,
        may_unmap: bool,
        has_backing: bool,
        b: &mut PlanBuilder,
    ) -> Result<(), BlockError> {
        let (entry, bitmap) = self.meta.l2_entry(guest)?;
        match entry {
            L2Entry::Normal { host, copied: true }
                if !may_unmap && self.meta.geometry().data_file =>
            {
                b.zero_range(self.chain.data_file, host, self.chain.cluster_size());
                Ok(())
            }
            L2Entry::Normal { host, copied: true } if !may_unmap => {
                keep_allocation_zeroed(self.meta, guest, host | OFLAG_COPIED, ALL_ZERO)
            }
            L2Entry::Unallocated if bitmap == ALL_ZERO || (bitmap == 0 && !has_backing) => Ok(()),
            _ => self.unmap(guest, entry, (0, ALL_ZERO), b),
        }
    }

    /// Writes `target` as the cluster's L2 entry now; the engine punches
    /// the old host cluster if we held its only reference; commit drops
    /// the reference.
    fn unmap(
        &mut self,
        guest: u64,
        old: L2Entry,
        (target, bitmap): (u64, u64),
        b: &mut PlanBuilder,
    ) -> Result<(), BlockError> {
        self.meta.writable_l2(guest)?;
        self.meta.set_l2_entry(guest, target, bitmap)?;
        match old {
            L2Entry::Normal { host, copied: true }
            | L2Entry::Zero {
                host: Some(host),
                copied: true,
            } => {
                b.punch(self.chain.data_file, host, self.chain.cluster_size());
            }
            _ => {}
        }
        if let Some(r) = self.meta.geometry().references(old) {
            b.pending.release_clusters(r);
        }
        Ok(())
    }
}

/// Flags an allocated cluster zero, keeping its host cluster: the new
/// entry is published like an allocating write's (in the cache now, on
/// disk at the next flush, after a barrier), because the host cluster may
/// have been allocated since the last barrier: written through now, the
/// entry could reach the disk before the cluster's refcount does.
fn keep_allocation_zeroed(
    meta: &mut MetaState,
    guest: u64,
    raw: u64,
    bitmap: u64,
) -> Result<(), BlockError> {
    meta.writable_l2(guest)?;
    meta.publish_l2_entry(guest, raw, bitmap)?;
    if meta.should_flush() {
        meta.flush_dirty()?;
    }
    Ok(())
}
