//! The fixed facts of an open image's layout ([`ImageGeometry`]: cluster and
//! entry sizes, version, refcount width, compression, data file) and
//! what they decide about one table entry: its decoded, checked form
//! ([`checked_entry`], [`raw_entry`]) and the host clusters it holds a
//! reference to ([`ImageGeometry::references`]).
//!
//! The header enters once, at open; raw entries enter from the locked
//! tables or a queue's table snapshots, and leave decoded, with their host
//! offsets checked against the file, so both paths trust the same checks.

use std::path::Path;

use super::header::Header;
use super::l2_entry::{decode_l2_in, L2Entry};
use super::refcount::entries_per_block;
use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta_io::be64_at;
use crate::formats::Compression;

/// Fixed facts of an open image's layout, read from its header at open
/// (a new image's layout arithmetic takes the smaller
/// `layout::LayoutParams`).
#[derive(Clone, Debug)]
pub(crate) struct ImageGeometry {
    pub cluster_bits: u32,
    pub cluster_size: u64,
    pub version: u32,
    pub extended_l2: bool,
    /// Bytes per L2 entry (8, or 16 with extended L2).
    pub l2_entry_size: u64,
    pub l2_entries: u64,
    pub refcount_order: u32,
    pub rb_entries: u64,
    pub compression: Compression,
    /// Guest data lives in an external data file, at host offset = guest
    /// offset, not refcounted.
    pub data_file: bool,
}

impl ImageGeometry {
    pub fn from_header(h: &Header) -> Self {
        ImageGeometry {
            cluster_bits: h.cluster_bits,
            cluster_size: h.cluster_size(),
            version: h.version,
            extended_l2: h.extended_l2(),
            l2_entry_size: h.l2_entry_size(),
            l2_entries: h.cluster_size() / h.l2_entry_size(),
            refcount_order: h.refcount_order,
            rb_entries: entries_per_block(h.cluster_bits, h.refcount_order),
            compression: h.compression,
            data_file: h.has_data_file(),
        }
    }

    /// Guest bytes mapped by one L2 table.
    pub fn l2_coverage(&self) -> u64 {
        self.l2_entries << self.cluster_bits
    }

    /// Host clusters (first index, count) an entry holds a reference to
    /// (none in an external data file: its clusters are not refcounted).
    pub fn references(&self, e: L2Entry) -> Option<(u64, u64)> {
        let cb = self.cluster_bits;
        if self.data_file {
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
}

/// Decodes the raw L2 entry (and subcluster bitmap) of the cluster holding
/// `guest` and checks its host offsets against a file of `file_size`
/// bytes (or, with an external data file, against the guest offset).
pub(crate) fn checked_entry(
    g: &ImageGeometry,
    path: &Path,
    file_size: u64,
    guest: u64,
    raw: u64,
    bitmap: u64,
) -> Result<(L2Entry, u64), BlockError> {
    let invalid = |reason: String| BlockError::InvalidImage {
        path: path.to_owned(),
        reason,
    };
    let e = decode_l2_in(raw, g.cluster_bits, g.version, g.extended_l2, g.data_file)
        .map_err(|r| invalid(format!("guest offset {guest:#x}: {r}")))?;
    if g.data_file {
        return match e {
            L2Entry::Compressed(_) => Err(invalid(
                "compressed cluster in an image with a data file".into(),
            )),
            L2Entry::Normal { host, .. }
            | L2Entry::Zero {
                host: Some(host), ..
            } if host != guest & !(g.cluster_size - 1) => Err(invalid(format!(
                "guest offset {guest:#x} maps to data file offset {host:#x}"
            ))),
            _ => Ok((e, bitmap)),
        };
    }
    // A data cluster past the file's last cluster is damage (qemu
    // writes a cluster's data before publishing it): a truncated file or
    // a bad entry, refused with the guest range it costs.
    let limit = file_size.div_ceil(g.cluster_size) * g.cluster_size;
    match e {
        L2Entry::Normal { host, .. }
        | L2Entry::Zero {
            host: Some(host), ..
        } if host >= limit => Err(BlockError::BeyondEndOfFile {
            path: path.to_owned(),
            what: "data cluster",
            host,
            guest: guest & !(g.cluster_size - 1),
            len: g.cluster_size,
        }),
        L2Entry::Compressed(d) if d.host_offset >= limit => Err(invalid(format!(
            "guest offset {guest:#x} maps to compressed data at {:#x}, beyond the end of the file",
            d.host_offset
        ))),
        _ => Ok((e, bitmap)),
    }
}

/// The raw entry and subcluster bitmap (0 unless extended L2) at index
/// `i2` of an L2 table's bytes.
pub(crate) fn raw_entry(g: &ImageGeometry, table: &[u8], i2: usize) -> (u64, u64) {
    let words = (g.l2_entry_size / 8) as usize;
    let raw = be64_at(table, i2 * words);
    let bitmap = if words == 2 {
        be64_at(table, i2 * 2 + 1)
    } else {
        0
    };
    (raw, bitmap)
}
