//! Write-zeroes and discard planning, cluster by cluster (the walk over
//! the range is `Format::plan_write_zeroes` in `queue.rs`).
//!
//! A guest range enters; a plan leaves. Whole clusters change metadata
//! only: on v3 images the L2 entry becomes a zero cluster (when a backing
//! image would otherwise show through, or the guest did not allow
//! unmapping) or unallocated; the L2 entry is written now, the engine then
//! punches the old host cluster, and `commit` drops its refcount, so a
//! crash leaks, never corrupts, and a reused cluster is never punched.
//! A cluster flagged zero while keeping its host cluster (no unmapping
//! allowed) gets its entry published like an allocating write's.
//! Partial clusters, and v2 images over a backing file (v2 has no zero
//! flag), get zeroes written. Discard is write-zeroes with unmapping
//! allowed: a discarded range of a qcow2 image reads as zeroes.

use super::image::{Qcow2Image, State};
use super::l2_entry::{L2Entry, OFLAG_COPIED, OFLAG_ZERO};
use super::write::{PlanBuilder, Source};
use crate::error::BlockError;

/// Extended L2 bitmap: all 32 subclusters read as zeroes.
const ALL_ZERO: u64 = 0xffff_ffff << 32;

impl Qcow2Image {
    /// Whether the cluster holding `guest` already reads as zeroes.
    pub(super) fn reads_zero(&self, st: &mut State, guest: u64) -> Result<bool, BlockError> {
        let (e, bitmap) = st.meta.l2_entry(guest)?;
        if st.meta.g.extended_l2 {
            let no_backing = self
                .backing
                .as_ref()
                .is_none_or(|bk| guest >= bk.image.size());
            return Ok(
                e == L2Entry::Unallocated && (bitmap == ALL_ZERO || (bitmap == 0 && no_backing))
            );
        }
        Ok(match e {
            L2Entry::Zero { .. } => true,
            L2Entry::Unallocated => self
                .backing
                .as_ref()
                .is_none_or(|bk| guest >= bk.image.size()),
            _ => false,
        })
    }

    /// Makes one whole cluster read as zeroes.
    pub(super) fn zero_cluster(
        &self,
        st: &mut State,
        guest: u64,
        may_unmap: bool,
        b: &mut PlanBuilder,
    ) -> Result<(), BlockError> {
        let cs = self.cluster_size();
        let has_backing = self
            .backing
            .as_ref()
            .is_some_and(|bk| guest < bk.image.size());
        if st.meta.g.extended_l2 {
            return self.zero_cluster_extended(st, guest, may_unmap, has_backing, b);
        }
        let (entry, _) = st.meta.l2_entry(guest)?;
        if st.meta.g.version < 3 {
            return match entry {
                L2Entry::Normal { host, copied: true } if !may_unmap || has_backing => {
                    b.zero_range(self.data_file, host, cs);
                    Ok(())
                }
                L2Entry::Unallocated if !has_backing => Ok(()),
                _ if has_backing => self.write_range(st, guest, cs, Source::Zeroes, b),
                _ => self.unmap(st, guest, entry, (0, 0), b),
            };
        }
        match entry {
            // A raw data file must read as zeroes too: zero the data.
            L2Entry::Normal { host, copied: true } if !may_unmap && st.meta.g.data_file => {
                b.zero_range(self.data_file, host, cs);
                Ok(())
            }
            // Keep the allocation, flag it zero.
            L2Entry::Normal { host, copied: true } if !may_unmap => {
                keep_allocation_zeroed(st, guest, host | OFLAG_COPIED | OFLAG_ZERO, 0)
            }
            L2Entry::Zero { host: None, .. } => Ok(()),
            L2Entry::Zero { host: Some(_), .. } if !may_unmap => Ok(()),
            L2Entry::Unallocated if !has_backing => Ok(()),
            _ => {
                let target = if has_backing || !may_unmap {
                    OFLAG_ZERO
                } else {
                    0
                };
                self.unmap(st, guest, entry, (target, 0), b)
            }
        }
    }

    /// Extended L2: the subcluster bitmap says zero (all 32 zero bits) or
    /// unallocated; a kept host cluster becomes preallocated zeroes.
    fn zero_cluster_extended(
        &self,
        st: &mut State,
        guest: u64,
        may_unmap: bool,
        has_backing: bool,
        b: &mut PlanBuilder,
    ) -> Result<(), BlockError> {
        let (entry, bitmap) = st.meta.l2_entry(guest)?;
        match entry {
            L2Entry::Normal { host, copied: true } if !may_unmap && st.meta.g.data_file => {
                b.zero_range(self.data_file, host, self.cluster_size());
                Ok(())
            }
            L2Entry::Normal { host, copied: true } if !may_unmap => {
                keep_allocation_zeroed(st, guest, host | OFLAG_COPIED, ALL_ZERO)
            }
            L2Entry::Unallocated if bitmap == ALL_ZERO || (bitmap == 0 && !has_backing) => Ok(()),
            _ => {
                let target = if has_backing || !may_unmap {
                    ALL_ZERO
                } else {
                    0
                };
                self.unmap(st, guest, entry, (0, target), b)
            }
        }
    }

    /// Writes `target` as the cluster's L2 entry now; the engine punches
    /// the old host cluster if we held its only reference; commit drops
    /// the reference.
    fn unmap(
        &self,
        st: &mut State,
        guest: u64,
        old: L2Entry,
        (target, bitmap): (u64, u64),
        b: &mut PlanBuilder,
    ) -> Result<(), BlockError> {
        st.meta.writable_l2(guest)?;
        st.meta.set_l2_entry(guest, target, bitmap)?;
        match old {
            L2Entry::Normal { host, copied: true }
            | L2Entry::Zero {
                host: Some(host),
                copied: true,
            } => {
                b.punch(self.data_file, host, self.cluster_size());
            }
            _ => {}
        }
        if let Some(r) = self.references(old) {
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
    st: &mut State,
    guest: u64,
    raw: u64,
    bitmap: u64,
) -> Result<(), BlockError> {
    st.meta.writable_l2(guest)?;
    st.meta.publish_l2_entry(guest, raw, bitmap)?;
    if st.meta.should_flush() {
        st.meta.flush_dirty()?;
    }
    Ok(())
}
