//! Write planning: in-place writes, allocating writes with copy-on-write
//! of the rest of the cluster, in-place filling of an extended-L2
//! cluster's unallocated subclusters, and the commit/abort that publishes
//! or drops their L2 entries.
//!
//! [`WritePlanner`] borrows the image's [`Chain`] and, under the lock, its
//! tables. A guest range enters; the plan's ops go into a `PlanBuilder`
//! whose `HostWrite::Data` ops cover each contiguous host extent once
//! (head COW + data + tail COW in one op; a new cluster with nothing to
//! copy is zeroed around the data, unless it lies past everything the
//! file ever held and is written through the page cache: then only the
//! data's 4 KiB blocks are written). Copy-on-write sources are read
//! by `cow` after the metadata lock is released, once the plan's clusters
//! are registered in flight (the image's `finish_plan`). Ordering: new
//! clusters get their refcount in `alloc` before
//! the plan is returned; `commit` (after the engine's data writes) puts
//! the new L2 entries in the cache, and `MetaState::flush_dirty` (guest
//! flush, close, or a full dirty set) writes them after a barrier that
//! makes the data and refcounts durable, then drops the references to the
//! clusters they replaced.

use std::sync::Arc;

use super::plan_builder::{CowJob, CowRead, PlanBuilder, Source};
use crate::error::BlockError;
use crate::formats::qcow2::chain::Chain;
use crate::formats::qcow2::compression::compressed::compressed_read_len;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::MetaIo;
use crate::formats::qcow2::on_disk::l2_entry::{
    normal_entry, subcluster_state, L2Entry, SubclusterState,
};
use crate::formats::{FileId, WriteData};

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

/// The part of a fresh cluster to write for `len` bytes at `in_cluster`:
/// the 4 KiB blocks they touch, within the cluster (whole pages: the
/// kernel would zero the rest of a partly written page of a hole anyway).
fn written_blocks(in_cluster: u64, len: u64, cluster_size: u64) -> (u64, u64) {
    const BLOCK: u64 = 4096;
    let from = in_cluster / BLOCK * BLOCK;
    let to = (in_cluster + len).div_ceil(BLOCK) * BLOCK;
    (from, to.min(cluster_size))
}

/// Subcluster bitmap with all 32 allocation bits set, no zero bits.
const ALL_ALLOCATED: u64 = 0xffff_ffff;

/// See the module docs.
pub(crate) struct WritePlanner<'a> {
    pub chain: &'a Chain,
    pub meta: &'a mut MetaState,
}

impl WritePlanner<'_> {
    /// Plans writing `src` over `offset..offset+len`.
    pub fn write_range(
        &mut self,
        offset: u64,
        len: u64,
        src: Source,
        b: &mut PlanBuilder,
    ) -> Result<(), BlockError> {
        let cs = self.chain.cluster_size();
        let end = offset + len;
        let mut pos = offset;
        let mut allocs = Vec::new();
        while pos < end {
            let in_cluster = pos & (cs - 1);
            let n = (cs - in_cluster).min(end - pos);
            let seg_src = src.advance(pos - offset);
            let (entry, bitmap) = self.meta.l2_entry(pos)?;
            let dfile = self.meta.geometry().data_file;
            match entry {
                // Data file clusters are never shared: always in place.
                L2Entry::Normal { host, copied }
                    if (copied || dfile)
                        && (!self.meta.geometry().extended_l2
                            || all_allocated(bitmap, in_cluster, n, cs)) =>
                {
                    b.data(
                        self.chain.data_file,
                        host + in_cluster,
                        vec![seg_src.part(n)],
                    )
                }
                L2Entry::Normal { host, copied } if copied || dfile => {
                    // Extended L2: fill the touched subclusters in place.
                    self.fill_subclusters(pos, host, bitmap, in_cluster, n, seg_src, b)?;
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
            self.meta.writable_l2(a.cluster)?;
        }
        let cb = self.meta.geometry().cluster_bits;
        // Nothing at or past the file's size was ever written (it only
        // grows, and the headroom past it is a hole): new clusters there
        // read as zeroes already.
        let fresh_from = self.meta.file_size();
        // A data file maps each guest cluster to the same offset, without
        // refcounts; otherwise allocate one run in the image.
        let start = if self.meta.geometry().data_file {
            None
        } else {
            let start = self.meta.alloc_clusters(allocs.len() as u64)?;
            b.pending.allocated.push((start >> cb, allocs.len() as u64));
            Some(start)
        };
        for (i, a) in allocs.into_iter().enumerate() {
            let host = start.map_or(a.cluster, |s| s + i as u64 * cs);
            let tail = cs - a.in_cluster - a.len;
            let read = if a.in_cluster > 0 || tail > 0 {
                self.cow_read(a.old, a.bitmap)
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
                    // Through the page cache, a fresh cluster gets the
                    // data's 4 KiB blocks only (as upstream Cloud
                    // Hypervisor writes it); a reused one, or any with
                    // O_DIRECT, is written whole, zeroes around the data
                    // (a direct write into a hole allocates and converts
                    // blocks one write at a time: 0.77 x the IOPS at
                    // 3.4 x the CPU, docs/qcow2.md). Empty parts are
                    // dropped when merged.
                    let fresh = start.is_some() && host >= fresh_from;
                    let (from, to) = if fresh && self.chain.buffered_data {
                        written_blocks(a.in_cluster, a.len, cs)
                    } else {
                        (0, cs)
                    };
                    let parts = vec![
                        WriteData::Zeroes(a.in_cluster - from),
                        a.src.part(a.len),
                        WriteData::Zeroes(to - a.in_cluster - a.len),
                    ];
                    b.data(self.chain.data_file, host + from, parts);
                }
            }
            // Extended L2: every subcluster of the new cluster is allocated.
            b.pending
                .publish
                .push((a.cluster, normal_entry(host), ALL_ALLOCATED));
            b.pending.busy.push(a.cluster >> cb);
            if let Some(r) = self.meta.geometry().references(a.old) {
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
        &mut self,
        guest: u64,
        host: u64,
        bitmap: u64,
        in_cluster: u64,
        len: u64,
        src: Source,
        b: &mut PlanBuilder,
    ) -> Result<(), BlockError> {
        let cs = self.chain.cluster_size();
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
                file: self.cow_source(),
                host: Some(host),
                bitmap,
            },
            span,
        });
        let raw = self.meta.l2_raw(guest)?.0;
        b.pending.publish.push((cluster, raw, new_bitmap));
        b.pending
            .busy
            .push(cluster >> self.meta.geometry().cluster_bits);
        Ok(())
    }

    /// The file holding guest clusters, for copy-on-write reads: the
    /// image's metadata seam, or the external data file.
    fn cow_source(&self) -> Arc<dyn MetaIo> {
        match self
            .chain
            .cow_files
            .get(usize::from(self.chain.data_file.0))
        {
            Some(f) if self.chain.data_file != FileId(0) => Arc::clone(f) as Arc<dyn MetaIo>,
            _ => Arc::clone(self.meta.io()),
        }
    }

    /// Where the old contents of a cluster come from (None: zeroes).
    /// Offsets were checked by `l2_entry`; reading happens in `cow`.
    fn cow_read(&self, old: L2Entry, bitmap: u64) -> Option<CowRead> {
        let file = self.cow_source();
        if self.meta.geometry().extended_l2 && !matches!(old, L2Entry::Compressed(_)) {
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
            L2Entry::Unallocated => self.chain.backing.as_ref().map(|_| CowRead::Backing),
            L2Entry::Normal { host, .. } => Some(CowRead::Host(file, host)),
            L2Entry::Compressed(desc) => Some(CowRead::Compressed {
                file: Arc::clone(self.meta.io()),
                read_len: compressed_read_len(&desc, self.meta.file_size()),
                desc,
                compression: self.meta.geometry().compression,
            }),
        }
    }
}
