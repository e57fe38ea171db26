//! Populating a qcow2 image from its backing chain (a stream job,
//! docs/block-jobs.md): the backing data of a range is written into the
//! clusters of this image that are still unallocated, and only those. A
//! cluster the guest allocated meanwhile (a write, a zero cluster, a
//! discard) is left as it is: the guest's data wins.
//!
//! That decision is made where allocation is already serialized: under
//! the image lock, with the range's allocations in flight checked first
//! (`Qcow2Image::begin_update`: a guest write still allocating one of
//! these clusters blocks the populate, which the caller retries), and
//! the clusters this plan allocates registered in flight before the lock
//! is dropped, so a guest write planned after it waits for its commit
//! and then writes over the populated cluster in place. A guest range
//! enters as `offset..offset + len` with the caller's data as the
//! request's memory; a `WriteOutcome` leaves whose ops cover only the
//! unallocated clusters (request-relative data), or nothing.

use crate::error::BlockError;
use crate::formats::qcow2::image::{Qcow2Image, UpdateStart};
use crate::formats::qcow2::on_disk::l2_entry::L2Entry;
use crate::formats::qcow2::planning::plan_builder::{PlanBuilder, Source};
use crate::formats::qcow2::planning::write::WritePlanner;
use crate::formats::{Waker, WriteOutcome};

impl Qcow2Image {
    /// See the module docs. `offset` must be cluster aligned, and `len`
    /// whole clusters (or reach the disk's end).
    pub(crate) fn plan_populate_range(
        &self,
        offset: u64,
        len: u64,
        waker: &Waker,
    ) -> Result<WriteOutcome, BlockError> {
        let cs = self.chain.cluster_size();
        let size = self.size.load(std::sync::atomic::Ordering::Acquire);
        if !offset.is_multiple_of(cs) || (!len.is_multiple_of(cs) && offset + len != size) {
            return Err(BlockError::Refused(format!(
                "populate of {len} bytes at {offset}: not whole clusters of {cs} bytes"
            )));
        }
        if self.chain.header.extended_l2() {
            return Err(BlockError::Unsupported {
                path: self.chain.path.clone(),
                feature: "populating an image with extended L2 entries from its backing file"
                    .into(),
            });
        }
        self.write_out_compressed_in(offset, len)?;
        let mut st = match self.begin_update(offset, len, waker)? {
            UpdateStart::Locked(st) => st,
            UpdateStart::Decided(outcome) => return Ok(outcome),
        };
        // Runs of clusters still unallocated, found under the lock.
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let n = cs.min(end - pos);
            if matches!(st.meta.l2_entry(pos)?.0, L2Entry::Unallocated) {
                match runs.last_mut() {
                    Some((o, l)) if *o + *l == pos => *l += n,
                    _ => runs.push((pos, n)),
                }
            }
            pos += n;
        }
        let mut b = PlanBuilder::default();
        let mut planner = WritePlanner {
            chain: &self.chain,
            meta: &mut st.meta,
        };
        for (o, l) in runs {
            planner.write_range(o, l, Source::Request(o - offset), &mut b)?;
        }
        self.finish_plan(st, b)
    }
}
