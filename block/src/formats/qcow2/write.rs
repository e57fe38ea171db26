//! Write planning: in-place writes, allocating writes with copy-on-write
//! of the rest of the cluster, in-place filling of an extended-L2
//! cluster's unallocated subclusters, and the commit/abort that publishes
//! or drops their L2 entries.
//!
//! A guest range enters; a `WritePlan` leaves whose `HostWrite::Data` ops
//! cover each contiguous host extent once (head COW + data + tail COW in
//! one op). Copy-on-write sources are read by `cow` after the metadata
//! lock is released, once the plan's clusters are registered in flight. Ordering: new clusters get their refcount in `alloc` before
//! the plan is returned; `commit` (after the engine's data writes) puts
//! the new L2 entries in the cache, and `MetaState::flush_dirty` (guest
//! flush, close, or a full dirty set) writes them after a barrier that
//! makes the data and refcounts durable, then drops the references to the
//! clusters they replaced.

use std::sync::{Arc, MutexGuard};

use super::compressed::compressed_read_len;
use super::cow::{CowJob, CowRead};
use super::image::{Qcow2Image, State};
use super::inflight::PendingCommit;
use super::l2_entry::{normal_entry, subcluster_state, L2Entry, SubclusterState};
use super::meta_io::MetaIo;
use crate::error::BlockError;
use crate::formats::{FileId, Format, HostWrite, Waker, WriteData, WriteOutcome, WritePlan};

/// A plan under construction.
#[derive(Default)]
pub(crate) struct PlanBuilder {
    pub ops: Vec<HostWrite>,
    pub pending: PendingCommit,
    /// New clusters whose old contents are read after the lock is released.
    pub cow: Vec<CowJob>,
}

fn merge_part(parts: &mut Vec<WriteData>, part: WriteData) {
    if part.is_empty() {
        return;
    }
    match (parts.last_mut(), &part) {
        (
            Some(WriteData::Request { offset, len }),
            WriteData::Request {
                offset: o2,
                len: l2,
            },
        ) if *offset + *len == *o2 => {
            *len += l2;
        }
        (Some(WriteData::Zeroes(a)), WriteData::Zeroes(b)) => *a += b,
        _ => parts.push(part),
    }
}

impl PlanBuilder {
    /// Adds a data write, extending the previous one when contiguous.
    pub fn data(&mut self, file: FileId, offset: u64, parts: Vec<WriteData>) {
        if let Some(HostWrite::Data {
            file: f,
            offset: o,
            parts: p,
        }) = self.ops.last_mut()
        {
            let end = *o + p.iter().map(WriteData::len).sum::<u64>();
            if *f == file && end == offset {
                for part in parts {
                    merge_part(p, part);
                }
                return;
            }
        }
        let mut merged = Vec::with_capacity(parts.len());
        for part in parts {
            merge_part(&mut merged, part);
        }
        self.ops.push(HostWrite::Data {
            file,
            offset,
            parts: merged,
        });
    }

    pub fn punch(&mut self, file: FileId, offset: u64, len: u64) {
        if let Some(HostWrite::PunchHole {
            file: f,
            offset: o,
            len: l,
        }) = self.ops.last_mut()
        {
            if *f == file && *o + *l == offset {
                *l += len;
                return;
            }
        }
        self.ops.push(HostWrite::PunchHole { file, offset, len });
    }

    pub fn zero_range(&mut self, file: FileId, offset: u64, len: u64) {
        if let Some(HostWrite::ZeroRange {
            file: f,
            offset: o,
            len: l,
        }) = self.ops.last_mut()
        {
            if *f == file && *o + *l == offset {
                *l += len;
                return;
            }
        }
        self.ops.push(HostWrite::ZeroRange { file, offset, len });
    }
}

/// Where the bytes of a guest segment come from.
#[derive(Clone, Copy)]
pub(crate) enum Source {
    /// The request's data, at this offset into the request.
    Request(u64),
    Zeroes,
}

impl Source {
    pub(crate) fn part(self, len: u64) -> WriteData {
        match self {
            Source::Request(offset) => WriteData::Request { offset, len },
            Source::Zeroes => WriteData::Zeroes(len),
        }
    }

    fn advance(self, by: u64) -> Source {
        match self {
            Source::Request(o) => Source::Request(o + by),
            Source::Zeroes => Source::Zeroes,
        }
    }
}

struct Alloc {
    /// Guest offset of the cluster.
    cluster: u64,
    in_cluster: u64,
    len: u64,
    src: Source,
    old: L2Entry,
    /// Extended L2 subcluster bitmap of the old entry.
    bitmap: u64,
}

/// Whether every subcluster touched by `in_cluster..+len` is allocated.
fn all_allocated(bitmap: u64, in_cluster: u64, len: u64, cluster_size: u64) -> bool {
    let sub = cluster_size / 32;
    let (first, last) = (in_cluster / sub, (in_cluster + len - 1) / sub);
    (first..=last).all(|i| subcluster_state(bitmap, i as u32) == Ok(SubclusterState::Allocated))
}

/// How a metadata-changing plan starts (see [`Qcow2Image::begin_update`]).
pub(crate) enum UpdateStart<'a> {
    /// Plan under this lock.
    Locked(MutexGuard<'a, State>),
    /// Nothing to plan: the outcome is already known.
    Decided(WriteOutcome),
}

/// Subcluster bitmap with all 32 allocation bits set, no zero bits.
const ALL_ALLOCATED: u64 = 0xffff_ffff;

impl Qcow2Image {
    /// The common start of every metadata-changing plan (write,
    /// write-zeroes, discard): the range is checked, an empty range is
    /// done, a range overlapping an allocation in flight is blocked (the
    /// waker is kept), and otherwise the image is marked dirty and the
    /// locked state is handed to the planner.
    pub(crate) fn begin_update(
        &self,
        offset: u64,
        len: u64,
        waker: &Waker,
    ) -> Result<UpdateStart<'_>, BlockError> {
        self.check_writable(offset, len)?;
        if len == 0 {
            return Ok(UpdateStart::Decided(WriteOutcome::Ready(
                WritePlan::default(),
            )));
        }
        let mut st = self.lock();
        if self.blocked(&mut st, offset, len, waker) {
            return Ok(UpdateStart::Decided(WriteOutcome::Blocked));
        }
        self.mark_dirty(&mut st)?;
        Ok(UpdateStart::Locked(st))
    }

    /// Registers `waker` and says so when the range overlaps an allocation
    /// in flight.
    fn blocked(&self, st: &mut State, offset: u64, len: u64, waker: &Waker) -> bool {
        let cb = self.header.cluster_bits;
        let (first, last) = (offset >> cb, (offset + len - 1) >> cb);
        if st.inflight.overlaps(first, last) {
            st.inflight.wait(waker);
            return true;
        }
        false
    }

    /// Registers the plan's pending commit (its clusters become busy),
    /// then, without the metadata lock, reads the copy-on-write sources
    /// and adds their data writes; a failed read aborts the commit.
    pub(crate) fn finish_plan(
        &self,
        mut st: MutexGuard<'_, State>,
        mut b: PlanBuilder,
    ) -> Result<WriteOutcome, BlockError> {
        // Nothing overwrites metadata (a hostile L2 entry, wrong refcounts):
        // refused before anything is queued; the clusters allocated for
        // the plan leak (the image is now marked corrupt).
        st.meta.check_plan(&b.ops, &b.cow, self.data_file)?;
        let jobs = std::mem::take(&mut b.cow);
        let frees_clusters = !b.pending.release.is_empty();
        let commit = if b.pending.is_empty() {
            None
        } else {
            Some(st.inflight.start(std::mem::take(&mut b.pending)))
        };
        drop(st);
        if let Err(e) = self.fill_cow(jobs, &mut b) {
            if let Some(c) = commit {
                Format::abort(self, c);
            }
            return Err(e);
        }
        Ok(WriteOutcome::Ready(WritePlan {
            ops: b.ops,
            commit,
            frees_clusters,
        }))
    }

    /// Plans writing `src` over `offset..offset+len`.
    pub(crate) fn write_range(
        &self,
        st: &mut State,
        offset: u64,
        len: u64,
        src: Source,
        b: &mut PlanBuilder,
    ) -> Result<(), BlockError> {
        let cs = self.cluster_size();
        let end = offset + len;
        let mut pos = offset;
        let mut allocs = Vec::new();
        while pos < end {
            let in_cluster = pos & (cs - 1);
            let n = (cs - in_cluster).min(end - pos);
            let seg_src = src.advance(pos - offset);
            let (entry, bitmap) = st.meta.l2_entry(pos)?;
            let dfile = st.meta.g.data_file;
            match entry {
                // Data file clusters are never shared: always in place.
                L2Entry::Normal { host, copied }
                    if (copied || dfile)
                        && (!st.meta.g.extended_l2 || all_allocated(bitmap, in_cluster, n, cs)) =>
                {
                    b.data(self.data_file, host + in_cluster, vec![seg_src.part(n)])
                }
                L2Entry::Normal { host, copied } if copied || dfile => {
                    // Extended L2: fill the touched subclusters in place.
                    self.fill_subclusters(st, pos, host, bitmap, in_cluster, n, seg_src, b)?;
                }
                old => allocs.push(Alloc {
                    cluster: pos - in_cluster,
                    in_cluster,
                    len: n,
                    src: seg_src,
                    old,
                    bitmap,
                }),
            }
            pos += n;
        }
        if allocs.is_empty() {
            return Ok(());
        }
        // L2 tables first, so they do not land between the data clusters.
        for a in &allocs {
            st.meta.writable_l2(a.cluster)?;
        }
        let cb = self.header.cluster_bits;
        // A data file maps each guest cluster to the same offset, without
        // refcounts; otherwise allocate one run in the image.
        let start = if st.meta.g.data_file {
            None
        } else {
            let start = st.meta.alloc_clusters(allocs.len() as u64)?;
            b.pending.allocated.push((start >> cb, allocs.len() as u64));
            Some(start)
        };
        for (i, a) in allocs.into_iter().enumerate() {
            let host = start.map_or(a.cluster, |s| s + i as u64 * cs);
            let tail = cs - a.in_cluster - a.len;
            let read = if a.in_cluster > 0 || tail > 0 {
                self.cow_read(st, a.old, a.bitmap)
            } else {
                None
            };
            match read {
                Some(read) => b.cow.push(CowJob {
                    cluster: a.cluster,
                    host,
                    in_cluster: a.in_cluster,
                    len: a.len,
                    src: a.src,
                    read,
                    span: (0, cs),
                }),
                None => {
                    // Empty parts are dropped when merged.
                    let parts = vec![
                        WriteData::Zeroes(a.in_cluster),
                        a.src.part(a.len),
                        WriteData::Zeroes(tail),
                    ];
                    b.data(self.data_file, host, parts);
                }
            }
            // Extended L2: every subcluster of the new cluster is allocated.
            b.pending
                .publish
                .push((a.cluster, normal_entry(host), ALL_ALLOCATED));
            b.pending.busy.push(a.cluster >> cb);
            if let Some(r) = self.references(a.old) {
                b.pending.release_clusters(r);
            }
        }
        Ok(())
    }

    /// Plans a write into an allocated extended-L2 cluster some of whose
    /// touched subclusters are unallocated or zero: one in-place write of
    /// the touched subclusters (their uncovered parts copied from the
    /// backing image, or zeroes) and, at commit, their bits set to
    /// allocated. The other subclusters are left alone.
    #[allow(clippy::too_many_arguments)]
    fn fill_subclusters(
        &self,
        st: &mut State,
        guest: u64,
        host: u64,
        bitmap: u64,
        in_cluster: u64,
        len: u64,
        src: Source,
        b: &mut PlanBuilder,
    ) -> Result<(), BlockError> {
        let cs = self.cluster_size();
        let sub = cs / 32;
        let cluster = guest - in_cluster;
        let (first, last) = (in_cluster / sub, (in_cluster + len - 1) / sub);
        let mut new_bitmap = bitmap;
        for i in first..=last {
            new_bitmap |= 1 << i;
            new_bitmap &= !(1 << (i + 32));
        }
        // Allocated subclusters at either end are not rewritten around
        // the data: a concurrent in-place write may be updating them.
        let allocated =
            |i: u64| subcluster_state(bitmap, i as u32) == Ok(SubclusterState::Allocated);
        let start = if allocated(first) {
            in_cluster
        } else {
            first * sub
        };
        let end = if allocated(last) {
            in_cluster + len
        } else {
            (last + 1) * sub
        };
        let span = (start, end);
        b.cow.push(CowJob {
            cluster,
            host,
            in_cluster,
            len,
            src,
            read: CowRead::Subclusters {
                file: self.cow_source(st),
                host: Some(host),
                bitmap,
            },
            span,
        });
        let raw = st.meta.l2_raw(guest)?.0;
        b.pending.publish.push((cluster, raw, new_bitmap));
        b.pending.busy.push(cluster >> self.header.cluster_bits);
        Ok(())
    }

    /// Host clusters (first index, count) an entry holds a reference to.
    pub(crate) fn references(&self, e: L2Entry) -> Option<(u64, u64)> {
        let cb = self.header.cluster_bits;
        if self.header.has_data_file() {
            // Data file clusters are not refcounted.
            return None;
        }
        match e {
            L2Entry::Normal { host, .. }
            | L2Entry::Zero {
                host: Some(host), ..
            } => Some((host >> cb, 1)),
            L2Entry::Compressed(d) => {
                let r = d.clusters(cb);
                Some((*r.start(), r.end() - r.start() + 1))
            }
            L2Entry::Zero { host: None, .. } | L2Entry::Unallocated => None,
        }
    }

    /// The file holding guest clusters, for copy-on-write reads: the
    /// image's metadata seam, or the external data file.
    fn cow_source(&self, st: &State) -> Arc<dyn MetaIo> {
        match self.cow_files.get(usize::from(self.data_file.0)) {
            Some(f) if self.data_file != FileId(0) => Arc::clone(f) as Arc<dyn MetaIo>,
            _ => Arc::clone(&st.meta.io),
        }
    }

    /// Where the old contents of a cluster come from (None: zeroes).
    /// Offsets were checked by `l2_entry`; reading happens in `fill_cow`.
    fn cow_read(&self, st: &State, old: L2Entry, bitmap: u64) -> Option<CowRead> {
        let file = self.cow_source(st);
        if st.meta.g.extended_l2 && !matches!(old, L2Entry::Compressed(_)) {
            let host = match old {
                L2Entry::Normal { host, .. }
                | L2Entry::Zero {
                    host: Some(host), ..
                } => Some(host),
                _ => None,
            };
            return Some(CowRead::Subclusters { file, host, bitmap });
        }
        match old {
            L2Entry::Zero { .. } => None,
            L2Entry::Unallocated => self.backing.as_ref().map(|_| CowRead::Backing),
            L2Entry::Normal { host, .. } => Some(CowRead::Host(file, host)),
            L2Entry::Compressed(desc) => Some(CowRead::Compressed {
                file: Arc::clone(&st.meta.io),
                read_len: compressed_read_len(&desc, st.meta.file_size),
                desc,
                compression: st.meta.g.compression,
            }),
        }
    }
}
