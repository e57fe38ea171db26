//! Creating an empty qcow2 image the way qemu-img lays it out: header
//! cluster, refcount table, refcount block(s), L1 table.
//!
//! Validated creation parameters enter; the file leaves written (every
//! metadata cluster refcounted once, L1 empty).

use std::path::Path;

use super::features::{COMPAT_LAZY_REFCOUNTS, INCOMPAT_COMPRESSION, INCOMPAT_EXTL2};
use super::header::{Header, EXT_BACKING_FORMAT, EXT_END, V2_HEADER_LEN, V3_HEADER_LEN};
use super::meta_io::{write_at, MetaKind};
use super::refcount::{entries_per_block, write_refcount_entry};
use crate::error::BlockError;
use crate::formats::Compression;

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
    let cs = 1u64 << p.cluster_bits;
    let l2_entries = cs / if p.extended_l2 { 16 } else { 8 };
    let l1_size = p.size.div_ceil(l2_entries * cs);
    if l1_size * 8 > super::header::MAX_L1_BYTES {
        return Err(invalid(format!(
            "size {} needs an L1 table larger than 32 MiB",
            p.size
        )));
    }
    let l1_clusters = (l1_size * 8).div_ceil(cs).max(1);
    let rbe = entries_per_block(p.cluster_bits, p.refcount_order);
    // header + refcount table + refcount blocks + L1, to a fixed point.
    let (mut rt_clusters, mut rb_count) = (1u64, 1u64);
    loop {
        let total = 1 + rt_clusters + rb_count + l1_clusters;
        let rb = total.div_ceil(rbe);
        let rt = (rb * 8).div_ceil(cs);
        if rb == rb_count && rt == rt_clusters {
            break;
        }
        rb_count = rb;
        rt_clusters = rt;
    }
    let total = 1 + rt_clusters + rb_count + l1_clusters;
    let rt_off = cs;
    let rb_off = rt_off + rt_clusters * cs;
    let l1_off = rb_off + rb_count * cs;

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
    };
    let mut exts = Vec::new();
    if let Some(f) = &p.backing_format {
        ext(&mut exts, EXT_BACKING_FORMAT, f.as_bytes());
    }
    ext(&mut exts, EXT_END, &[]);
    let fixed_len = h.header_length as u64;
    if let Some(name) = &p.backing_file {
        if name.is_empty() || name.len() > super::header::MAX_BACKING_NAME as usize {
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
    let mut rbs = vec![0u8; (rb_count * cs) as usize];
    for c in 0..total {
        let block = (c / rbe) as usize;
        let slice = &mut rbs[block * cs as usize..(block + 1) * cs as usize];
        write_refcount_entry(slice, (c % rbe) as usize, p.refcount_order, 1);
    }

    let file = crate::create::open_for_create(path)?;
    write_at(&file, MetaKind::Header, 0, &hdr)?;
    write_at(&file, MetaKind::RefcountTable, rt_off, &rt)?;
    write_at(&file, MetaKind::RefcountBlock, rb_off, &rbs)?;
    write_at(
        &file,
        MetaKind::L1Table,
        l1_off,
        &vec![0u8; (l1_clusters * cs) as usize],
    )?;
    file.sync_all().map_err(BlockError::Flush)
}
