//! Refcounts of host clusters and cluster allocation, including new
//! refcount blocks and refcount table growth.
//!
//! Cluster counts enter; host offsets of clusters whose refcounts already
//! reached the file leave. New refcount blocks (and a grown refcount table)
//! are placed right after the allocated run and describe themselves, so
//! an allocation never recurses: the layout is computed to a fixed point,
//! then written in the order blocks, (barrier), table entries / header.
//! A crash in between leaks clusters, never references a cluster without a
//! refcount.

use std::collections::BTreeMap;

use super::MetaState;
use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta_io::MetaKind;
use crate::formats::qcow2::on_disk::header::{MAX_HOST_OFFSET, OFF_REFTABLE};
use crate::formats::qcow2::on_disk::layout::MAX_REFTABLE_BYTES;
use crate::formats::qcow2::on_disk::refcount::{
    max_refcount, read_refcount_entry, write_refcount_entry,
};

/// Bits of a refcount table entry that hold the block's offset.
const RT_OFFSET_MASK: u64 = !0x1ff;
/// Clusters scanned for a large enough hole before jumping to the end of
/// the file (bounds the cost of an allocation in a fragmented image).
const MAX_HOLE_SCAN: u64 = 16384;
/// Attempts at finding room for a run plus its new metadata.
const MAX_ALLOC_ROUNDS: usize = 64;

impl MetaState {
    /// Host bytes for `len` bytes of compressed data (`convert -c`, step
    /// 2 of `compress_write`'s module doc): packed behind the previous
    /// compressed cluster when they fit, else in new clusters; every
    /// cluster they touch is counted once more, and the tail moves to
    /// their end.
    pub fn alloc_compressed_bytes(&mut self, len: u64) -> Result<u64, BlockError> {
        let cs = self.g.cluster_size;
        let tail = self.compressed_tail;
        if !tail.is_multiple_of(cs) {
            let c = tail / cs;
            let r = self.refcount(c)?;
            // Shared only while the cluster is still ours and may count more.
            if r >= 1 && r < max_refcount(self.g.refcount_order) {
                let room = cs - tail % cs;
                if len <= room {
                    self.change_refcounts(c, 1, 1)?;
                    self.compressed_tail = tail + len;
                    return Ok(tail);
                }
                let extra = (len - room).div_ceil(cs);
                let new = self.alloc_clusters(extra)?;
                if new == (c + 1) * cs {
                    self.change_refcounts(c, 1, 1)?;
                    self.compressed_tail = tail + len;
                    return Ok(tail);
                }
                if extra * cs >= len {
                    self.compressed_tail = new + len;
                    return Ok(new);
                }
                self.free_clusters(new / cs, extra)?;
            }
        }
        let new = self.alloc_clusters(len.div_ceil(cs))?;
        self.compressed_tail = new + len;
        Ok(new)
    }

    /// Offset of refcount block `b`, if allocated.
    pub(crate) fn refblock(&self, b: u64) -> Result<Option<u64>, BlockError> {
        let Some(&raw) = usize::try_from(b).ok().and_then(|i| self.rt.get(i)) else {
            return Ok(None);
        };
        let off = raw & RT_OFFSET_MASK;
        if off == 0 {
            return Ok(None);
        }
        if !off.is_multiple_of(self.g.cluster_size) {
            return Err(self.invalid(format!(
                "refcount block offset {off:#x} is not cluster aligned"
            )));
        }
        self.check_table(off, "refcount block")?;
        Ok(Some(off))
    }

    fn load_rb(&mut self, off: u64) -> Result<(), BlockError> {
        if !self.rb_cache.contains(off) {
            let mut t = vec![0u8; self.g.cluster_size as usize];
            self.read(MetaKind::RefcountBlock, off, &mut t)?;
            self.rb_cache.insert(off, t);
        }
        Ok(())
    }

    /// Refcount of host cluster index `c` (0 where no block covers it).
    pub fn refcount(&mut self, c: u64) -> Result<u64, BlockError> {
        let Some(off) = self.refblock(c / self.g.rb_entries)? else {
            return Ok(0);
        };
        self.load_rb(off)?;
        let order = self.g.refcount_order;
        let i = (c % self.g.rb_entries) as usize;
        Ok(self
            .rb_cache
            .get(off)
            .map_or(0, |t| read_refcount_entry(t, i, order)))
    }

    /// Adds `delta` to the refcounts of clusters `first..first+count`,
    /// whose blocks exist, in the cache: the changed blocks stay pinned
    /// until [`MetaState::write_refcounts`] (at the next barrier, L1/L2
    /// write or flush, or when too many are pending).
    pub fn change_refcounts(
        &mut self,
        first: u64,
        count: u64,
        delta: i64,
    ) -> Result<(), BlockError> {
        let rbe = self.g.rb_entries;
        let mut c = first;
        let end = first + count;
        while c < end {
            let stop = end.min((c / rbe + 1) * rbe);
            self.change_block_refcounts(c, stop, delta)?;
            c = stop;
        }
        if self.dirty_rb.len() >= self.max_dirty_rb {
            self.write_refcounts()?;
        }
        Ok(())
    }

    /// Adds `delta` to the refcounts of clusters `c..stop`, all counted
    /// by one refcount block, in the cache: all of them or (on error)
    /// none, so a failed change can be retried as a whole.
    pub(crate) fn change_block_refcounts(
        &mut self,
        c: u64,
        stop: u64,
        delta: i64,
    ) -> Result<(), BlockError> {
        let rbe = self.g.rb_entries;
        let order = self.g.refcount_order;
        let max = max_refcount(order);
        let Some(off) = self.refblock(c / rbe)? else {
            return Err(self.invalid(format!("cluster {c} has no refcount block")));
        };
        self.load_rb(off)?;
        let path = &self.path;
        let t = self
            .rb_cache
            .get_mut(off)
            .ok_or_else(|| BlockError::InvalidImage {
                path: path.clone(),
                reason: "refcount cache lost a block".into(),
            })?;
        let new_value = |t: &[u8], cc: u64| {
            let old = read_refcount_entry(t, (cc % rbe) as usize, order);
            let new = if delta < 0 {
                old.checked_sub(delta.unsigned_abs())
            } else {
                old.checked_add(delta as u64).filter(|v| *v <= max)
            };
            new.ok_or_else(|| BlockError::InvalidImage {
                path: path.clone(),
                reason: format!("refcount of cluster {cc} would leave its range (was {old})"),
            })
        };
        // Every new value is checked before any is stored.
        for cc in c..stop {
            new_value(t, cc)?;
        }
        let (mut lo, mut hi) = (usize::MAX, 0usize);
        let mut freed_min = None;
        for cc in c..stop {
            let new = new_value(t, cc)?;
            if new == 0 {
                freed_min.get_or_insert(cc);
                self.metadata_map.forget_cluster(cc);
            }
            let r = write_refcount_entry(t, (cc % rbe) as usize, order, new);
            lo = lo.min(r.start);
            hi = hi.max(r.end);
        }
        if delta < 0 {
            self.compressed_tail = 0;
        }
        self.rb_cache.pin(off);
        let range = self.dirty_rb.entry(off).or_insert((lo, hi));
        *range = (range.0.min(lo), range.1.max(hi));
        if let Some(m) = freed_min {
            self.free_hint = self.free_hint.min(m);
        }
        Ok(())
    }

    /// Writes the changed parts of every refcount block changed since the
    /// last call (one pwrite per block) and unpins them. Callers run this
    /// before anything that may reference a newly counted cluster reaches
    /// the file; [`MetaState::barrier`] does it first.
    pub fn write_refcounts(&mut self) -> Result<(), BlockError> {
        // An entry leaves the set only once written, so a failed write is
        // retried by the next caller.
        while let Some((&off, &(lo, hi))) = self.dirty_rb.first_key_value() {
            let bytes = self
                .rb_cache
                .get(off)
                .and_then(|t| t.get(lo..hi))
                .map(<[u8]>::to_vec)
                .ok_or_else(|| self.invalid("a changed refcount block left the cache"))?;
            self.write(MetaKind::RefcountBlock, off + lo as u64, &bytes)?;
            self.dirty_rb.remove(&off);
            self.rb_cache.unpin(off);
        }
        Ok(())
    }

    pub fn free_clusters(&mut self, first: u64, count: u64) -> Result<(), BlockError> {
        self.change_refcounts(first, count, -1)
    }

    /// Whether block `b` of the refcount table is allocated.
    fn has_block(&self, b: u64) -> bool {
        usize::try_from(b)
            .ok()
            .and_then(|i| self.rt.get(i))
            .is_some_and(|e| e & RT_OFFSET_MASK != 0)
    }

    /// First cluster index of a run of `want` free clusters.
    fn find_free_run(&mut self, want: u64) -> Result<u64, BlockError> {
        let rbe = self.g.rb_entries;
        let covered = self.rt.len() as u64 * rbe;
        let mut c = self.free_hint.max(1);
        let (mut start, mut len) = (c, 0u64);
        let mut first_free = None;
        let eof = self.file_size.div_ceil(self.g.cluster_size);
        let mut scanned = 0u64;
        while len < want {
            scanned += 1;
            if scanned == MAX_HOLE_SCAN && c < eof {
                // Holes below are too small for this run: continue from the
                // end of the file rather than scanning the whole image.
                c = eof;
                len = 0;
                continue;
            }
            if c >= covered {
                // Nothing past the refcount table's reach is in use.
                if len == 0 {
                    start = c;
                }
                break;
            }
            if !self.has_block(c / rbe) {
                let skip = (c / rbe + 1) * rbe - c;
                if len == 0 {
                    start = c;
                }
                first_free.get_or_insert(c);
                len += skip;
                c += skip;
                continue;
            }
            if self.refcount(c)? == 0 {
                if len == 0 {
                    start = c;
                }
                first_free.get_or_insert(c);
                len += 1;
            } else {
                len = 0;
            }
            c += 1;
        }
        self.free_hint = match first_free {
            Some(f) if f < start => f,
            _ => start + want,
        };
        Ok(start)
    }

    fn all_free(&mut self, first: u64, count: u64) -> Result<bool, BlockError> {
        for c in first..first + count {
            if self.refcount(c)? != 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Allocates `n` contiguous clusters (refcount 1, written to the file)
    /// and returns the host offset of the first.
    pub fn alloc_clusters(&mut self, n: u64) -> Result<u64, BlockError> {
        let rbe = self.g.rb_entries;
        let cs = self.g.cluster_size;
        let mut want = n;
        for _ in 0..MAX_ALLOC_ROUNDS {
            let start = self.find_free_run(want)?;
            // Fixed point: the run, its missing refcount blocks, a new table.
            let mut extra = 0u64;
            let mut layout = None;
            for _ in 0..MAX_ALLOC_ROUNDS {
                let end = start + n + extra;
                let (fb, lb) = (start / rbe, (end - 1) / rbe);
                let missing: Vec<u64> = (fb..=lb).filter(|b| !self.has_block(*b)).collect();
                let rt_clusters = if lb >= self.rt.len() as u64 {
                    // Grow by half again, so growth is rare.
                    ((lb + 1) * 3 / 2 * 8)
                        .div_ceil(cs)
                        .max(self.rt.len() as u64 * 8 / cs + 1)
                } else {
                    0
                };
                let e = missing.len() as u64 + rt_clusters;
                if e <= extra {
                    layout = Some((missing, rt_clusters));
                    break;
                }
                extra = e;
            }
            let Some((missing, rt_clusters)) = layout else {
                return Err(BlockError::NoSpace(
                    "refcount layout did not converge".into(),
                ));
            };
            let extra = missing.len() as u64 + rt_clusters;
            let total = n + extra;
            if (start + total)
                .checked_mul(cs)
                .is_none_or(|e| e >= MAX_HOST_OFFSET)
            {
                return Err(BlockError::NoSpace("host offsets would exceed 2^56".into()));
            }
            if rt_clusters * cs > MAX_REFTABLE_BYTES {
                return Err(BlockError::NoSpace(
                    "refcount table would exceed 8 MiB".into(),
                ));
            }
            if extra > want - n && !self.all_free(start + want, n + extra - want)? {
                want = n + extra;
                continue;
            }
            // Free clusters that the metadata map still holds: the
            // refcounts are wrong, and using them would overwrite metadata.
            self.check_overlap(MetaKind::GuestData, start * cs, total * cs)?;
            self.commit_layout(start, n, &missing, rt_clusters)?;
            return Ok(start * cs);
        }
        Err(BlockError::NoSpace(format!("no room for {n} clusters")))
    }

    /// Puts new refcount blocks (written and durable) in the table. A
    /// block is linked only once the block counting its own cluster is:
    /// those blocks' entries first, a barrier, then the blocks they count
    /// (else a crash could keep an entry whose block's refcount lies in a
    /// block no entry names yet).
    fn link_new_blocks(
        &mut self,
        mut pending: BTreeMap<u64, (u64, Vec<u8>)>,
    ) -> Result<(), BlockError> {
        let cs = self.g.cluster_size;
        let rbe = self.g.rb_entries;
        while !pending.is_empty() {
            let counter = |off: u64| off / cs / rbe;
            let mut ready: Vec<u64> = pending
                .iter()
                .filter(|(b, (off, _))| {
                    counter(*off) == **b || !pending.contains_key(&counter(*off))
                })
                .map(|(b, _)| *b)
                .collect();
            if ready.is_empty() {
                // A cycle cannot happen (blocks lie in index order); link
                // the rest rather than loop.
                ready = pending.keys().copied().collect();
            }
            for b in ready {
                let Some((off, t)) = pending.remove(&b) else {
                    continue;
                };
                self.write(
                    MetaKind::RefcountTable,
                    self.rt_offset + b * 8,
                    &off.to_be_bytes(),
                )?;
                self.rt[b as usize] = off;
                self.refblocks.insert(off);
                self.metadata_map.add(MetaKind::RefcountBlock, off, cs);
                self.rb_cache.insert(off, t);
            }
            if !pending.is_empty() {
                self.barrier()?;
            }
        }
        Ok(())
    }

    /// Writes refcounts for `start..start+n+missing+rt_clusters`, the new
    /// refcount blocks, and then the table entries (or a new table).
    fn commit_layout(
        &mut self,
        start: u64,
        n: u64,
        missing: &[u64],
        rt_clusters: u64,
    ) -> Result<(), BlockError> {
        let rbe = self.g.rb_entries;
        let cs = self.g.cluster_size;
        let order = self.g.refcount_order;
        let total = n + missing.len() as u64 + rt_clusters;
        // New blocks, in memory first: block index -> (host offset, bytes).
        let mut new_blocks: BTreeMap<u64, (u64, Vec<u8>)> = BTreeMap::new();
        for (k, b) in missing.iter().enumerate() {
            new_blocks.insert(*b, ((start + n + k as u64) * cs, vec![0u8; cs as usize]));
        }
        // Refcounts covered by new blocks are set in memory; the others
        // go through change_refcounts (existing blocks, written at the
        // next barrier, before anything can reference the new clusters).
        let mut c = start;
        let end = start + total;
        while c < end {
            let b = c / rbe;
            let stop = end.min((b + 1) * rbe);
            if let Some((_, t)) = new_blocks.get_mut(&b) {
                for cc in c..stop {
                    write_refcount_entry(t, (cc % rbe) as usize, order, 1);
                }
            } else {
                self.change_refcounts(c, stop - c, 1)?;
            }
            c = stop;
        }
        for (off, t) in new_blocks.values() {
            self.write(MetaKind::RefcountBlock, *off, t)?;
        }
        self.file_size = self.file_size.max(end * cs);
        self.reserve_to(self.file_size)?;
        if new_blocks.is_empty() {
            return Ok(());
        }
        self.barrier()?;
        if rt_clusters == 0 {
            return self.link_new_blocks(new_blocks);
        }
        // A new, larger table after the new blocks; the header switches to
        // it in one write, and the old table's clusters are freed once that
        // write is durable (the next flush).
        let new_rt_off = (start + n + missing.len() as u64) * cs;
        let mut rt = self.rt.clone();
        rt.resize((rt_clusters * cs / 8) as usize, 0);
        for (b, (off, _)) in &new_blocks {
            rt[*b as usize] = *off;
        }
        let bytes: Vec<u8> = rt.iter().flat_map(|e| e.to_be_bytes()).collect();
        self.write(MetaKind::RefcountTable, new_rt_off, &bytes)?;
        self.barrier()?;
        let mut hdr = [0u8; 12];
        hdr[..8].copy_from_slice(&new_rt_off.to_be_bytes());
        hdr[8..].copy_from_slice(&(rt_clusters as u32).to_be_bytes());
        self.write(MetaKind::Header, OFF_REFTABLE, &hdr)?;
        let old_off = self.rt_offset;
        let old_clusters = self.rt.len() as u64 * 8 / cs;
        self.rt = rt;
        self.refblocks
            .extend(new_blocks.values().map(|(off, _)| *off));
        for (off, _) in new_blocks.values() {
            self.metadata_map.add(MetaKind::RefcountBlock, *off, cs);
        }
        self.metadata_map
            .remove(MetaKind::RefcountTable, old_off, old_clusters * cs);
        self.metadata_map
            .add(MetaKind::RefcountTable, new_rt_off, rt_clusters * cs);
        self.rt_offset = new_rt_off;
        for (_, (off, t)) in new_blocks {
            self.rb_cache.insert(off, t);
        }
        // Freed once the header naming the new table is durable.
        self.deferred_release.push((old_off / cs, old_clusters));
        Ok(())
    }
}
