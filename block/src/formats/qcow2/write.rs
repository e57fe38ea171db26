//! Write planning: in-place writes, allocating writes with copy-on-write
//! of the rest of the cluster, and the commit/abort that publishes or
//! drops their L2 entries.
//!
//! A guest range enters; a `WritePlan` leaves whose `HostWrite::Data` ops
//! cover each contiguous host extent once (head COW + data + tail COW in
//! one op). Ordering: new clusters get their refcount in `alloc` before
//! the plan is returned; `commit` (after the engine's data writes) puts
//! the new L2 entries in the cache, and `MetaState::flush_dirty` (guest
//! flush, close, or a full dirty set) writes them after a barrier that
//! makes the data and refcounts durable, then drops the references to the
//! clusters they replaced.

use std::sync::Arc;

use super::compressed::{compressed_read_len, inflate_cluster};
use super::image::{Qcow2Image, State};
use super::inflight::PendingCommit;
use super::l2_entry::{normal_entry, subcluster_state, L2Entry, SubclusterState};
use super::meta_io::read_at;
use crate::error::BlockError;
use crate::formats::{FileId, HostWrite, Waker, WriteCommit, WriteData, WriteOutcome, WritePlan};

/// A plan under construction.
#[derive(Default)]
pub(crate) struct PlanBuilder {
    pub ops: Vec<HostWrite>,
    pub pending: PendingCommit,
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
    fn part(self, len: u64) -> WriteData {
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

/// Subcluster bitmap with all 32 allocation bits set, no zero bits.
const ALL_ALLOCATED: u64 = 0xffff_ffff;

impl Qcow2Image {
    pub(crate) fn plan_write_impl(
        &self,
        offset: u64,
        len: u64,
        waker: &Waker,
    ) -> Result<WriteOutcome, BlockError> {
        self.check_writable(offset, len)?;
        if len == 0 {
            return Ok(WriteOutcome::Ready(WritePlan::default()));
        }
        let mut st = self.lock();
        if self.blocked(&mut st, offset, len, waker) {
            return Ok(WriteOutcome::Blocked);
        }
        self.mark_dirty(&mut st)?;
        let mut b = PlanBuilder::default();
        self.write_range(&mut st, offset, len, Source::Request(0), &mut b)?;
        Ok(Self::finish_plan(&mut st, b))
    }

    /// Registers `waker` and says so when the range overlaps an allocation
    /// in flight.
    pub(crate) fn blocked(&self, st: &mut State, offset: u64, len: u64, waker: &Waker) -> bool {
        let cb = self.header.cluster_bits;
        let (first, last) = (offset >> cb, (offset + len - 1) >> cb);
        if st.inflight.overlaps(first, last) {
            st.inflight.wait(waker);
            return true;
        }
        false
    }

    pub(crate) fn finish_plan(st: &mut State, b: PlanBuilder) -> WriteOutcome {
        let commit = if b.pending.is_empty() {
            None
        } else {
            Some(st.inflight.start(b.pending))
        };
        WriteOutcome::Ready(WritePlan { ops: b.ops, commit })
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
                    if !dfile {
                        st.meta.check_not_metadata(host)?;
                    }
                    b.data(self.data_file, host + in_cluster, vec![seg_src.part(n)])
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
            let cow = if a.in_cluster > 0 || tail > 0 {
                if st.meta.g.extended_l2 && !matches!(a.old, L2Entry::Compressed(_)) {
                    Some(self.cow_source_extended(st, a.cluster, a.old, a.bitmap)?)
                } else {
                    self.cow_source(st, a.cluster, a.old)?
                }
            } else {
                None
            };
            let piece = |from: u64, n: u64| match &cow {
                Some(buf) => {
                    WriteData::Owned(Arc::new(buf[from as usize..(from + n) as usize].to_vec()))
                }
                None => WriteData::Zeroes(n),
            };
            let mut parts = Vec::with_capacity(3);
            if a.in_cluster > 0 {
                parts.push(piece(0, a.in_cluster));
            }
            parts.push(a.src.part(a.len));
            if tail > 0 {
                parts.push(piece(a.in_cluster + a.len, tail));
            }
            b.data(self.data_file, host, parts);
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

    /// The old contents of an extended-L2 cluster, subcluster by
    /// subcluster (allocated, zero, or from the backing image).
    fn cow_source_extended(
        &self,
        st: &mut State,
        cluster: u64,
        old: L2Entry,
        bitmap: u64,
    ) -> Result<Vec<u8>, BlockError> {
        let cs = self.cluster_size();
        let sub = cs / 32;
        let host = match old {
            L2Entry::Normal { host, .. }
            | L2Entry::Zero {
                host: Some(host), ..
            } => Some(host),
            _ => None,
        };
        let mut buf = vec![0u8; cs as usize];
        for (i, chunk) in buf.chunks_mut(sub as usize).enumerate() {
            let state = subcluster_state(bitmap, i as u32).map_err(|r| st.meta.invalid(r))?;
            match (state, host) {
                (SubclusterState::Allocated, Some(h)) => read_at(
                    &self.cow_files[usize::from(self.data_file.0)],
                    h + i as u64 * sub,
                    chunk,
                    "copy-on-write subcluster",
                )?,
                (SubclusterState::Allocated, None) => {
                    return Err(st.meta.invalid("allocated subcluster without a cluster"))
                }
                (SubclusterState::Zero, _) => {}
                (SubclusterState::Unallocated, _) => {
                    if let Some(bk) = &self.backing {
                        bk.read(cluster + i as u64 * sub, chunk)?;
                    }
                }
            }
        }
        Ok(buf)
    }

    /// The old contents of the guest cluster at `cluster` (None: zeroes).
    fn cow_source(
        &self,
        st: &mut State,
        cluster: u64,
        old: L2Entry,
    ) -> Result<Option<Vec<u8>>, BlockError> {
        let cs = self.cluster_size() as usize;
        match old {
            L2Entry::Zero { .. } => Ok(None),
            L2Entry::Unallocated => match &self.backing {
                Some(bk) => {
                    let mut buf = vec![0u8; cs];
                    bk.read(cluster, &mut buf)?;
                    Ok(Some(buf))
                }
                None => Ok(None),
            },
            L2Entry::Normal { host, .. } => {
                let mut buf = vec![0u8; cs];
                read_at(&st.meta.file, host, &mut buf, "copy-on-write cluster")?;
                Ok(Some(buf))
            }
            L2Entry::Compressed(d) => {
                let mut input = vec![0u8; compressed_read_len(&d, st.meta.file_size) as usize];
                read_at(
                    &st.meta.file,
                    d.host_offset,
                    &mut input,
                    "compressed cluster",
                )?;
                let mut buf = vec![0u8; cs];
                inflate_cluster(st.meta.g.compression, &input, &mut buf).map_err(|reason| {
                    BlockError::Decompress {
                        offset: d.host_offset,
                        reason,
                    }
                })?;
                Ok(Some(buf))
            }
        }
    }

    pub(crate) fn commit_impl(&self, c: WriteCommit) -> Result<(), BlockError> {
        let mut st = self.lock();
        let Some(p) = st.inflight.take(&c) else {
            return Err(st.meta.invalid(format!("commit {} is not pending", c.0)));
        };
        // The data writes completed. The new entries are visible at once
        // (cache) and reach the disk at the next flush, after a barrier;
        // the clusters they replace are released after that.
        let res = (|| {
            for (guest, raw, bitmap) in &p.publish {
                st.meta.publish_l2_entry(*guest, *raw, *bitmap)?;
            }
            st.meta.deferred_release.extend(p.release.iter().copied());
            if st.meta.l2_write_through || st.meta.should_flush() {
                st.meta.flush_dirty()?;
            }
            Ok(())
        })();
        st.inflight.finish(&p);
        res
    }

    pub(crate) fn abort_impl(&self, c: WriteCommit) {
        let mut st = self.lock();
        let Some(p) = st.inflight.take(&c) else {
            return;
        };
        // Nothing points at the new clusters yet: give them back. A failure
        // here only leaks them.
        for (first, count) in &p.allocated {
            if let Err(e) = st.meta.free_clusters(*first, *count) {
                log::warn!(
                    "{}: leaking clusters after a failed write: {e}",
                    self.path.display()
                );
            }
        }
        st.inflight.finish(&p);
    }
}
