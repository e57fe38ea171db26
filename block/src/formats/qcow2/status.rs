//! What the image says about itself: allocation status of guest ranges
//! (`qemu-img map`), `info` facts, growing the virtual size, and closing.
//!
//! Guest ranges enter; `BlockStatus` runs leave, each as long as the
//! clusters keep the same kind (and contiguous host offsets).

use std::sync::atomic::Ordering;

use super::bitmap_directory::bitmaps_in;
use super::features::{COMPAT_LAZY_REFCOUNTS, INCOMPAT_DIRTY};
use super::header::OFF_SIZE;
use super::image::{Qcow2Image, State};
use super::l2_entry::{subcluster_state, L2Entry, SubclusterState};
use super::meta::MetaState;
use super::meta_io::MetaKind;
use super::prealloc_detect;
use super::snapshot_table::read_snapshot_table;
use crate::error::BlockError;
use crate::formats::{BlockStatus, Compression, FileId, ImageInfo};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Data(u64),
    /// Reads as zeroes; keeps its host cluster when it has one.
    Zero(Option<u64>),
    Compressed,
    Unallocated,
}

impl Qcow2Image {
    fn kind_at(&self, st: &mut State, guest: u64) -> Result<(Kind, u64), BlockError> {
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

    pub(crate) fn block_status_impl(
        &self,
        offset: u64,
        len: u64,
    ) -> Result<BlockStatus, BlockError> {
        self.check_range(offset, len)?;
        let end = offset + len;
        let (kind, run, prealloc) = {
            let mut st = self.lock();
            let prealloc = match st.metadata_prealloc {
                Some(p) => p,
                None => {
                    let p =
                        prealloc_detect::looks_metadata_preallocated(&mut st.meta, &self.files[0]);
                    st.metadata_prealloc = Some(p);
                    p
                }
            };
            let (kind, mut n) = self.kind_at(&mut st, offset)?;
            n = n.min(len);
            while offset + n < end {
                let (k, m) = self.kind_at(&mut st, offset + n)?;
                let same = match (kind, k) {
                    (Kind::Data(a), Kind::Data(b)) => a + n == b,
                    (Kind::Zero(Some(a)), Kind::Zero(Some(b))) => a + n == b,
                    (a, b) => a == b,
                };
                if !same {
                    break;
                }
                n = (n + m).min(len);
            }
            (kind, n, prealloc)
        };
        let file = Some(self.data_file);
        Ok(match kind {
            Kind::Data(host) => {
                // Metadata preallocation: a hole in the file reads as zero.
                let (run, zero) = if prealloc {
                    prealloc_detect::file_extent(
                        &self.files[usize::from(self.data_file.0)],
                        host,
                        run,
                    )
                } else {
                    (run, false)
                };
                BlockStatus {
                    len: run,
                    depth: 0,
                    present: true,
                    zero,
                    data: true,
                    compressed: false,
                    offset: Some(host),
                    file,
                }
            }
            Kind::Zero(host) => BlockStatus {
                len: run,
                depth: 0,
                present: true,
                zero: true,
                data: false,
                compressed: false,
                offset: host,
                file: host.and(file),
            },
            Kind::Compressed => BlockStatus {
                len: run,
                depth: 0,
                present: true,
                zero: false,
                data: true,
                compressed: true,
                offset: None,
                file: Some(FileId(0)),
            },
            Kind::Unallocated => self.backing_status(offset, run)?,
        })
    }

    fn backing_status(&self, offset: u64, len: u64) -> Result<BlockStatus, BlockError> {
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

    pub(crate) fn info_impl(&self) -> ImageInfo {
        let h = &self.header;
        let (incompatible, snapshots_at, marked_corrupt) = {
            let st = self.lock();
            (st.incompatible, st.meta.snapshots, st.meta.is_corrupt())
        };
        let v3 = h.version >= 3;
        ImageInfo {
            format: "qcow2",
            virtual_size: self.size.load(Ordering::Acquire),
            cluster_size: Some(h.cluster_size()),
            compat: Some(if v3 { "1.1" } else { "0.10" }.into()),
            refcount_bits: Some(1 << h.refcount_order),
            lazy_refcounts: Some(h.compatible & COMPAT_LAZY_REFCOUNTS != 0),
            corrupt: Some(h.corrupt() || marked_corrupt),
            extended_l2: Some(h.extended_l2()),
            compression_type: Some(match h.compression {
                Compression::Deflate => "zlib",
                Compression::Zstd => "zstd",
            }),
            backing_filename: h.backing_file.clone(),
            full_backing_filename: self.backing.as_ref().map(|b| b.path.display().to_string()),
            backing_filename_format: h.backing_format.clone(),
            data_file: h.data_file.clone(),
            dirty: Some(incompatible & INCOMPAT_DIRTY != 0),
            // An unreadable table lists nothing here; `check` reports it.
            snapshots: crate::formats::raw::file_size(&self.cow_files[0])
                .ok()
                .and_then(|len| read_snapshot_table(&self.cow_files[0], snapshots_at, len).ok())
                .map(|(entries, _)| entries)
                .unwrap_or_default(),
            // Likewise a bad bitmap directory lists nothing.
            bitmaps: bitmaps_in(&self.cow_files[0], &self.path).unwrap_or_default(),
        }
    }

    pub(crate) fn resize_impl(&self, new_size: u64) -> Result<(), BlockError> {
        if self.readonly {
            return Err(BlockError::ReadOnly);
        }
        let mut st = self.lock();
        let old = self.size.load(Ordering::Acquire);
        if !new_size.is_multiple_of(512) {
            return Err(BlockError::Resize(
                "size must be a multiple of 512 bytes".into(),
            ));
        }
        if self.header.has_data_file() {
            return Err(BlockError::Resize(
                "images with a data file cannot be resized".into(),
            ));
        }
        // Snapshots keep their own tables and sizes: growing only adds
        // unmapped L1 entries, and shrinking copies a table it shares
        // with them before changing it (see `shrink`). Version 2 snapshot
        // entries need not record their disk size, so a snapshot could
        // not bring its size back (qemu-img refuses too).
        if self.header.version < 3 && st.meta.snapshots.count > 0 {
            return Err(BlockError::Resize(
                "a version 2 image with snapshots cannot be resized".into(),
            ));
        }
        if new_size < old {
            self.unmap_past(&mut st.meta, new_size)?;
        }
        let l1_needed = new_size.div_ceil(st.meta.g.l2_coverage());
        let l1_needed =
            usize::try_from(l1_needed).map_err(|_| BlockError::Resize("size too large".into()))?;
        st.meta.grow_l1(l1_needed)?;
        self.write_size(&mut st.meta, new_size)
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

    pub(crate) fn close_impl(&self) -> Result<(), BlockError> {
        if self.readonly {
            return Ok(());
        }
        let mut st = self.lock();
        st.meta.flush_dirty()?;
        st.meta.trim_reserve()?;
        if st.inflight.pending_count() > 0 {
            log::warn!(
                "{}: closing with writes in flight; leaving the image dirty",
                self.path.display()
            );
            return Ok(());
        }
        self.mark_clean(&mut st)
    }
}
