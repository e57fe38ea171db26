//! Creating a qcow2 image the way qemu-img lays it out: header cluster,
//! refcount table, refcount block(s), L1 table; with preallocation
//! (`metadata`, `falloc`, `full`) also every L2 table and then every data
//! cluster, contiguous after the metadata, each L1/L2 entry pointing at
//! its table or cluster with the COPIED flag.
//!
//! Validated creation parameters enter; the file leaves written (every
//! cluster refcounted once; L1 empty without preallocation). With extended
//! L2 the preallocated clusters' subclusters stay unallocated, as in qemu,
//! so a backing file still shows through. The counts (L1 and L2 tables,
//! refcount blocks and table) come from [`crate::formats::qcow2::on_disk::layout`].

use std::path::Path;

use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta_io::{write_at, MetaKind};
use crate::formats::qcow2::on_disk::features::{
    COMPAT_LAZY_REFCOUNTS, INCOMPAT_COMPRESSION, INCOMPAT_EXTL2,
};
use crate::formats::qcow2::on_disk::header::{
    Header, EXT_BACKING_FORMAT, EXT_END, V2_HEADER_LEN, V3_HEADER_LEN,
};
use crate::formats::qcow2::on_disk::l2_entry::OFLAG_COPIED;
use crate::formats::qcow2::on_disk::layout::LayoutParams;
use crate::formats::qcow2::on_disk::refcount::{entries_per_block, write_refcount_entry};
use crate::formats::Compression;
use crate::new_file::{open_for_create, FileIdentity};
use crate::prealloc::{preallocate_range, Preallocation};

/// Parameters of a new qcow2 image, already checked by the caller.
pub struct Qcow2Params {
    pub size: u64,
    pub cluster_bits: u32,
    pub version: u32,
    pub refcount_order: u32,
    pub lazy_refcounts: bool,
    pub extended_l2: bool,
    /// zstd compression type (incompatible bit 3; version 3 only).
    pub zstd: bool,
    pub backing_file: Option<String>,
    pub backing_format: Option<String>,
    pub preallocation: Preallocation,
    /// Files the new image must not be (see [`FileIdentity`]).
    pub sources: Vec<FileIdentity>,
}

fn ext(buf: &mut Vec<u8>, ty: u32, data: &[u8]) {
    buf.extend_from_slice(&ty.to_be_bytes());
    buf.extend_from_slice(&(data.len() as u32).to_be_bytes());
    buf.extend_from_slice(data);
    buf.resize(buf.len().div_ceil(8) * 8, 0);
}

pub fn create_qcow2(path: &Path, p: &Qcow2Params) -> Result<(), BlockError> {
    let invalid = |reason: String| BlockError::InvalidImage {
        path: path.to_owned(),
        reason,
    };
    let layout = LayoutParams {
        cluster_bits: p.cluster_bits,
        refcount_order: p.refcount_order,
        extended_l2: p.extended_l2,
    };
    let cs = layout.cluster_size();
    let l2_entries = layout.l2_entries();
    if !layout.l1_fits(p.size) {
        return Err(invalid(format!(
            "size {} needs an L1 table larger than 32 MiB",
            p.size
        )));
    }
    let l1_size = layout.l2_tables(p.size);
    // A zero-size disk has an empty L1 table and, as with qemu-img, no
    // cluster for it (its offset is where it would start).
    let l1_clusters = layout.l1_clusters(p.size);
    let prealloc = p.preallocation != Preallocation::Off;
    // Preallocation: one L2 table per L1 entry, one data cluster per
    // guest cluster.
    let l2_tables = if prealloc { l1_size } else { 0 };
    let data_clusters = if prealloc { layout.clusters(p.size) } else { 0 };
    // Every cluster counts itself, the refcount blocks included.
    let before_refcounts = 1 + l1_clusters + l2_tables + data_clusters;
    let refcounts = layout.refcount_structures(before_refcounts);
    let (rt_clusters, rb_count) = (refcounts.table, refcounts.blocks);
    let total = before_refcounts + refcounts.total();
    let rt_off = cs;
    let rb_off = rt_off + rt_clusters * cs;
    let l1_off = rb_off + rb_count * cs;
    let l2_off = l1_off + l1_clusters * cs;
    let data_off = l2_off + l2_tables * cs;

    let mut h = Header {
        version: p.version,
        backing_file_offset: 0,
        backing_file_size: 0,
        cluster_bits: p.cluster_bits,
        size: p.size,
        crypt_method: 0,
        l1_size: l1_size as u32,
        l1_table_offset: l1_off,
        refcount_table_offset: rt_off,
        refcount_table_clusters: rt_clusters as u32,
        nb_snapshots: 0,
        snapshots_offset: 0,
        incompatible: if p.extended_l2 { INCOMPAT_EXTL2 } else { 0 }
            | if p.zstd { INCOMPAT_COMPRESSION } else { 0 },
        compatible: if p.lazy_refcounts {
            COMPAT_LAZY_REFCOUNTS
        } else {
            0
        },
        autoclear: 0,
        refcount_order: p.refcount_order,
        header_length: if p.version >= 3 {
            V3_HEADER_LEN
        } else {
            V2_HEADER_LEN
        },
        compression: if p.zstd {
            Compression::Zstd
        } else {
            Compression::Deflate
        },
        backing_file: None,
        backing_format: None,
        data_file: None,
        bitmaps: None,
    };
    let mut exts = Vec::new();
    if let Some(f) = &p.backing_format {
        ext(&mut exts, EXT_BACKING_FORMAT, f.as_bytes());
    }
    ext(&mut exts, EXT_END, &[]);
    let fixed_len = h.header_length as u64;
    if let Some(name) = &p.backing_file {
        if name.is_empty()
            || name.len() > crate::formats::qcow2::on_disk::header::MAX_BACKING_NAME as usize
        {
            return Err(invalid(format!(
                "backing file name of {} bytes",
                name.len()
            )));
        }
        h.backing_file_offset = fixed_len + exts.len() as u64;
        h.backing_file_size = name.len() as u32;
        if h.backing_file_offset + name.len() as u64 > cs {
            return Err(invalid(
                "backing file name does not fit in the header cluster".into(),
            ));
        }
    }
    let mut hdr = h.encode_fixed();
    hdr.extend_from_slice(&exts);
    if let Some(name) = &p.backing_file {
        hdr.extend_from_slice(name.as_bytes());
    }
    hdr.resize(cs as usize, 0);

    let mut rt = vec![0u8; (rt_clusters * cs) as usize];
    for i in 0..rb_count {
        let off = rb_off + i * cs;
        rt[(i * 8) as usize..(i * 8 + 8) as usize].copy_from_slice(&off.to_be_bytes());
    }
    let (file, _lock) = open_for_create(path, &p.sources)?;
    write_at(&file, MetaKind::Header, 0, &hdr)?;
    write_at(&file, MetaKind::RefcountTable, rt_off, &rt)?;
    // Refcount blocks one at a time (a large preallocated image has many).
    let rbe = entries_per_block(p.cluster_bits, p.refcount_order);
    let mut block = vec![0u8; cs as usize];
    for i in 0..rb_count {
        block.fill(0);
        let first = i * rbe;
        for c in first..total.min(first + rbe) {
            write_refcount_entry(&mut block, (c - first) as usize, p.refcount_order, 1);
        }
        write_at(&file, MetaKind::RefcountBlock, rb_off + i * cs, &block)?;
    }
    let mut l1 = vec![0u8; (l1_clusters * cs) as usize];
    for t in 0..l2_tables {
        let e = (l2_off + t * cs) | OFLAG_COPIED;
        l1[(t * 8) as usize..(t * 8 + 8) as usize].copy_from_slice(&e.to_be_bytes());
    }
    write_at(&file, MetaKind::L1Table, l1_off, &l1)?;
    let entry_len = layout.l2_entry_size();
    for t in 0..l2_tables {
        block.fill(0);
        for j in 0..l2_entries {
            let c = t * l2_entries + j;
            if c >= data_clusters {
                break;
            }
            let e = (data_off + c * cs) | OFLAG_COPIED;
            let at = (j * entry_len) as usize;
            block[at..at + 8].copy_from_slice(&e.to_be_bytes());
        }
        write_at(&file, MetaKind::L2Table, l2_off + t * cs, &block)?;
    }
    let data_len = data_clusters * cs;
    preallocate_range(&file, path, p.preallocation, data_off, data_len)?;
    file.sync_all().map_err(BlockError::Flush)
}
