//! The compressed-cluster write cache: compressed clusters are packed
//! into host clusters in memory and each host cluster reaches the file in
//! aligned writes of whole clusters, not as one small unaligned write per
//! compressed cluster (which O_DIRECT turns into a read-modify-write of
//! the sectors it touches, and buffered I/O into a syscall each).
//!
//! Data enters through [`CompressedCache::insert`]: compressed bytes at the
//! host offset the allocator gave them, with the L2 entry that will map
//! them. It leaves through [`CompressedCache::write_out`]:
//! - host clusters the allocator has moved past ("complete") are written
//!   once `capacity` of them are cached, contiguous ones in one write, and
//!   then dropped from memory;
//! - with `all`, the cluster the allocator is still filling is written
//!   too, its tail padded with zeroes to the file's O_DIRECT alignment;
//!   it stays cached (clean), so the bytes that later join it rewrite it
//!   whole instead of reading it back; clean clusters the allocator has
//!   left are dropped at the next insert.
//!
//! Where the clusters go: an image opened with O_DIRECT gets them on its
//! O_DIRECT data descriptor, in whole aligned clusters (the one place
//! compressed data bypasses the metadata-I/O seam: the seam is the
//! buffered descriptor, and page-cache writes beside direct ones are what
//! the cache avoids); any other image through the seam. Reads of a host
//! cluster the cache no longer holds go through the seam too. Without the
//! cache (capacity 0, `ch-img convert --compressed-cache 0`) the writer
//! writes each compressed cluster through the seam itself
//! (`compress_write`).
//!
//! An L2 entry is published only once every host cluster its bytes touch
//! is on the file, so the image never maps data that is not there. When a
//! write fails, the entries of the clusters not written are dropped and
//! the references they took are given back: the error is returned and the
//! image stays consistent (the guest clusters read as before, unallocated).
//! A reader of a guest cluster whose compressed data is still cached gets
//! the bytes from memory ([`CompressedCache::pending_bytes`]), so reads do
//! not write the cache out; a writer or a discard of such a range has it
//! written out first ([`CompressedCache::overlaps`]), since they change
//! the mapping.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::aligned::AlignedBuf;
use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::{read_at, write_at, MetaIo, MetaKind};
use block_engines::align::{file_alignment, DioAlign};

/// Host clusters cached before complete ones are written, by default.
pub const DEFAULT_CAPACITY: usize = 64;

/// One compressed cluster waiting for its host clusters to be written.
#[derive(Clone, Copy, Debug)]
struct Pending {
    guest: u64,
    raw: u64,
    host: u64,
    len: u64,
}

/// One host cluster being packed.
struct HostCluster {
    buf: AlignedBuf,
    /// Bytes in use from the cluster's start.
    filled: usize,
    /// Whether bytes were added since it was last written.
    dirty: bool,
    /// Entries whose last byte lies in this cluster.
    entries: Vec<Pending>,
}

/// See the module docs.
pub(crate) struct CompressedCache {
    capacity: usize,
    clusters: BTreeMap<u64, HostCluster>,
    /// Guest cluster -> (host offset, length) of its compressed bytes,
    /// for every entry not yet published.
    pending: BTreeMap<u64, (u64, u64)>,
    /// The data file's O_DIRECT alignment, learned on first use.
    align: Option<DioAlign>,
}

impl Default for CompressedCache {
    fn default() -> Self {
        CompressedCache {
            capacity: DEFAULT_CAPACITY,
            clusters: BTreeMap::new(),
            pending: BTreeMap::new(),
            align: None,
        }
    }
}

impl CompressedCache {
    /// Sets how many complete host clusters may wait in memory; 0 turns
    /// the cache off (the caller then writes every cluster itself).
    pub fn set_capacity(&mut self, clusters: usize) {
        self.capacity = clusters;
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether guest cluster `guest` has compressed data not yet mapped.
    pub fn is_pending(&self, guest: u64) -> bool {
        self.pending.contains_key(&guest)
    }

    /// Whether any not yet mapped guest cluster lies in `offset..offset+len`.
    pub fn overlaps(&self, offset: u64, len: u64, cluster_size: u64) -> bool {
        let first = offset - offset % cluster_size;
        self.pending
            .range(first..offset.saturating_add(len))
            .next()
            .is_some()
    }

    /// Copies `data` (at host offset `host`, as the allocator placed it)
    /// into the cached host clusters; the entry `raw` for guest cluster
    /// `guest` waits for them. A cluster not cached that the data does not
    /// start at the beginning of is read through `reader` (the image's
    /// metadata-I/O seam) first.
    pub fn insert(
        &mut self,
        reader: &dyn MetaIo,
        cluster_size: u64,
        guest: u64,
        raw: u64,
        host: u64,
        data: &[u8],
    ) -> Result<(), BlockError> {
        let align = self.buffer_alignment(cluster_size);
        // Clean clusters match the file: only the one this data joins is
        // worth keeping (the allocator has moved past the others).
        let joined = host - host % cluster_size;
        self.clusters.retain(|&c, h| h.dirty || c == joined);
        let mut pos = host;
        let mut rest = data;
        while !rest.is_empty() {
            let c_off = pos - pos % cluster_size;
            let within = (pos - c_off) as usize;
            let n = rest.len().min(cluster_size as usize - within);
            let cluster = match self.clusters.entry(c_off) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => {
                    let mut buf = AlignedBuf::new(cluster_size as usize, align)
                        .ok_or_else(|| out_of_memory(c_off))?;
                    if within > 0 {
                        read_at(
                            reader,
                            MetaKind::GuestData,
                            c_off,
                            &mut buf.as_mut_slice()[..within],
                        )?;
                    }
                    v.insert(HostCluster {
                        buf,
                        filled: within,
                        dirty: false,
                        entries: Vec::new(),
                    })
                }
            };
            cluster.buf.as_mut_slice()[within..within + n].copy_from_slice(&rest[..n]);
            cluster.filled = cluster.filled.max(within + n);
            cluster.dirty = true;
            rest = &rest[n..];
            pos += n as u64;
            if rest.is_empty() {
                cluster.entries.push(Pending {
                    guest,
                    raw,
                    host,
                    len: data.len() as u64,
                });
            }
        }
        self.pending.insert(guest, (host, data.len() as u64));
        Ok(())
    }

    /// Whether no compressed cluster waits to be published (then no read
    /// needs the cache).
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The compressed bytes of guest cluster `guest` while its entry is
    /// not yet published, `None` when it has none pending. They come from
    /// the cached host clusters; a host cluster already written (the first
    /// of two that one compressed cluster spans leaves the cache once it
    /// is complete and written) is read back through `reader` (the
    /// image's metadata-I/O seam).
    pub fn pending_bytes(
        &self,
        reader: &dyn MetaIo,
        guest: u64,
        cluster_size: u64,
    ) -> Result<Option<Vec<u8>>, BlockError> {
        let Some(&(host, len)) = self.pending.get(&guest) else {
            return Ok(None);
        };
        let mut out = vec![0u8; len as usize];
        let mut pos = host;
        let mut done = 0usize;
        while done < out.len() {
            let c_off = pos - pos % cluster_size;
            let within = (pos - c_off) as usize;
            let n = (out.len() - done).min(cluster_size as usize - within);
            let dst = &mut out[done..done + n];
            match self.clusters.get(&c_off) {
                Some(h) => dst.copy_from_slice(&h.buf.as_slice()[within..within + n]),
                None => read_at(reader, MetaKind::GuestData, pos, dst)?,
            }
            done += n;
            pos += n as u64;
        }
        Ok(Some(out))
    }

    /// Whether complete clusters fill the cache (the caller then writes
    /// them out). `tail` is the allocator's next compressed byte.
    pub fn is_full(&self, tail: u64, cluster_size: u64) -> bool {
        self.clusters
            .keys()
            .filter(|&&c| !is_tail(c, tail, cluster_size))
            .count()
            >= self.capacity.max(1)
    }

    /// Writes dirty clusters (see the module docs) and publishes the
    /// entries they complete in `meta`; `all` includes the cluster the
    /// allocator is still filling. `file` is the image's data descriptor:
    /// when it is O_DIRECT (with an alignment no larger than a cluster)
    /// the clusters go to it, in whole aligned clusters; otherwise through
    /// the metadata-I/O seam (`meta.io()`, the buffered descriptor).
    pub fn write_out(
        &mut self,
        meta: &mut MetaState,
        file: &File,
        all: bool,
    ) -> Result<(), BlockError> {
        let cs = meta.geometry().cluster_size;
        let tail = meta.compressed_tail();
        let seam = Arc::clone(meta.io());
        let mut align = self.file_alignment(file);
        let mut sink = Sink::Direct(file);
        if align.is_none() || u64::from(align.offset) > cs {
            (sink, align) = (Sink::Seam(&*seam), DioAlign::NONE);
        }
        let chosen: Vec<u64> = self
            .clusters
            .iter()
            .filter(|(&c, h)| h.dirty && (all || !is_tail(c, tail, cs)))
            .map(|(&c, _)| c)
            .collect();
        let mut i = 0;
        while i < chosen.len() {
            // A run of contiguous clusters: every one but the last is
            // complete, so it is written whole.
            let mut j = i + 1;
            while j < chosen.len() && chosen[j] == chosen[j - 1] + cs {
                j += 1;
            }
            // Checked against the metadata like every write to the file
            // (an O_DIRECT write bypasses the seam, whose check this is).
            let checked = meta.check_overlap(MetaKind::GuestData, chosen[i], (j - i) as u64 * cs);
            if let Err(e) =
                checked.and_then(|()| self.write_run(&sink, &chosen[i..j], tail, cs, align))
            {
                self.abandon(meta)?;
                return Err(e);
            }
            for &c in &chosen[i..j] {
                self.written(meta, c, tail)?;
            }
            i = j;
        }
        if meta.should_flush() {
            meta.flush_dirty()?;
        }
        Ok(())
    }

    /// One write of the clusters `run` (contiguous, ascending).
    fn write_run(
        &self,
        sink: &Sink<'_>,
        run: &[u64],
        tail: u64,
        cs: u64,
        align: DioAlign,
    ) -> Result<(), BlockError> {
        let step = u64::from(align.offset).max(1);
        let len_of = |c: u64, h: &HostCluster| -> usize {
            if is_tail(c, tail, cs) {
                (h.filled as u64)
                    .div_ceil(step)
                    .saturating_mul(step)
                    .min(cs) as usize
            } else {
                cs as usize
            }
        };
        let first = run[0];
        let lost = || BlockError::Write {
            offset: first,
            source: std::io::Error::other("compressed cache lost a cluster"),
        };
        if let [c] = run {
            let h = self.clusters.get(c).ok_or_else(lost)?;
            return sink.write(*c, &h.buf.as_slice()[..len_of(*c, h)]);
        }
        let mut out = AlignedBuf::new(run.len() * cs as usize, self.buffer_alignment(cs))
            .ok_or_else(|| out_of_memory(first))?;
        let mut used = 0usize;
        for &c in run {
            let h = self.clusters.get(&c).ok_or_else(lost)?;
            let n = len_of(c, h);
            let at = (c - first) as usize;
            out.as_mut_slice()[at..at + n].copy_from_slice(&h.buf.as_slice()[..n]);
            used = at + n;
        }
        sink.write(first, &out.as_slice()[..used])
    }

    /// Cluster `c` is on the file: its entries are published, and a
    /// complete cluster leaves the cache.
    fn written(&mut self, meta: &mut MetaState, c: u64, tail: u64) -> Result<(), BlockError> {
        let cs = meta.geometry().cluster_size;
        let Some(h) = self.clusters.get_mut(&c) else {
            return Ok(());
        };
        h.dirty = false;
        let entries = std::mem::take(&mut h.entries);
        if !is_tail(c, tail, cs) {
            self.clusters.remove(&c);
        }
        for e in entries {
            self.pending.remove(&e.guest);
            meta.writable_l2(e.guest)?;
            meta.publish_l2_entry(e.guest, e.raw, 0)?;
        }
        Ok(())
    }

    /// A write failed: every cluster still cached is dropped with the
    /// entries waiting for it, and the references those entries took are
    /// given back, so the image maps nothing that is not on the file.
    fn abandon(&mut self, meta: &mut MetaState) -> Result<(), BlockError> {
        let cs = meta.geometry().cluster_size;
        let entries: Vec<Pending> = std::mem::take(&mut self.clusters)
            .into_values()
            .flat_map(|h| h.entries)
            .collect();
        for e in entries {
            self.pending.remove(&e.guest);
            let first = e.host / cs;
            let last = (e.host + e.len - 1) / cs;
            meta.change_refcounts(first, last - first + 1, -1)?;
        }
        meta.write_refcounts()
    }

    fn file_alignment(&mut self, file: &File) -> DioAlign {
        *self.align.get_or_insert_with(|| file_alignment(file))
    }

    /// Memory alignment of the cluster buffers: enough for any O_DIRECT
    /// file (4 KiB), never more than a cluster.
    fn buffer_alignment(&self, cluster_size: u64) -> usize {
        let want = self.align.map_or(4096, |a| a.mem.max(a.offset).max(4096));
        (want as u64).min(cluster_size.max(512)) as usize
    }
}

/// Whether host cluster `c` is the one the allocator is still filling.
fn is_tail(c: u64, tail: u64, cluster_size: u64) -> bool {
    !tail.is_multiple_of(cluster_size) && tail - tail % cluster_size == c
}

/// Where the cached clusters are written.
enum Sink<'a> {
    /// The image's O_DIRECT data descriptor.
    Direct(&'a File),
    /// The image's metadata-I/O seam.
    Seam(&'a dyn MetaIo),
}

impl Sink<'_> {
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BlockError> {
        match self {
            Sink::Direct(file) => file
                .write_all_at(data, offset)
                .map_err(|source| BlockError::Write { offset, source }),
            Sink::Seam(io) => write_at(*io, MetaKind::GuestData, offset, data),
        }
    }
}

fn out_of_memory(offset: u64) -> BlockError {
    BlockError::Write {
        offset,
        source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
    }
}
