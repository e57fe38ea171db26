//! The qcow2 header and its extensions: reading, parsing, validation and
//! the few in-place field updates the driver makes.
//!
//! Bytes enter as the image's first cluster (untrusted); they leave as a
//! validated [`Header`] whose offsets and sizes are known to lie inside the
//! file, or as a reason string the caller wraps in
//! `BlockError::InvalidImage` / `BlockError::Unsupported`.
//! [`read_header`] reads the first cluster of an image file through the
//! metadata-I/O seam and does that wrapping: it is how the opener,
//! `check`, the bitmap directory and the undo of a failed tool operation
//! learn an image's header. The bitmaps extension has its own parser
//! (`bitmaps`).

use super::features::{AUTOCLEAR_BITMAPS, AUTOCLEAR_KNOWN};
use super::features::{
    COMPRESSION_DEFLATE, COMPRESSION_ZSTD, INCOMPAT_COMPRESSION, INCOMPAT_CORRUPT,
    INCOMPAT_DATA_FILE, INCOMPAT_DIRTY, INCOMPAT_EXTL2, INCOMPAT_KNOWN,
};
use std::fs::File;
use std::path::Path;

use super::layout::{MAX_L1_BYTES, MAX_REFTABLE_BYTES};
use crate::error::BlockError;
use crate::formats::holes::file_size;
use crate::formats::qcow2::metadata::meta_io::{read_at, write_at, MetaIo, MetaKind};
use crate::formats::Compression;

pub(crate) mod bitmaps;
use bitmaps::{parse_extension, BitmapsExtension, EXT_BITMAPS};

pub(crate) const MAGIC: u32 = 0x5146_49fb;
/// Size of the fixed part of a version 2 header.
pub(crate) const V2_HEADER_LEN: u32 = 72;
/// Minimum header_length of a version 3 header.
pub(crate) const V3_MIN_HEADER_LEN: u32 = 104;
/// Header length qemu writes for version 3 (with compression_type, padded).
pub(crate) const V3_HEADER_LEN: u32 = 112;
pub(crate) const MIN_CLUSTER_BITS: u32 = 9;
pub(crate) const MAX_CLUSTER_BITS: u32 = 21;
/// qemu refuses backing file names longer than this.
pub(crate) const MAX_BACKING_NAME: u32 = 1023;
/// Host offsets in L1/L2 entries have 56 bits.
pub(crate) const MAX_HOST_OFFSET: u64 = 1 << 56;

pub(crate) const EXT_END: u32 = 0;
pub(crate) const EXT_BACKING_FORMAT: u32 = 0xe279_2aca;
pub(crate) const EXT_DATA_FILE: u32 = 0x4441_5441;
pub(crate) const EXT_ENCRYPTION: u32 = 0x0537_be77;

/// Byte offsets of fields the driver rewrites in place.
pub(crate) const OFF_SIZE: u64 = 24;
pub(crate) const OFF_L1_SIZE: u64 = 36;
pub(crate) const OFF_REFTABLE: u64 = 48;
pub(crate) const OFF_INCOMPAT: u64 = 72;
pub(crate) const OFF_AUTOCLEAR: u64 = 88;

/// Why a header was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeaderError {
    /// Malformed or hostile; the string says what.
    Invalid(String),
    /// Well-formed but uses a feature we do not implement; names it.
    Unsupported(String),
}

fn invalid(s: impl Into<String>) -> HeaderError {
    HeaderError::Invalid(s.into())
}

/// A parsed, validated qcow2 header (both versions; v2 gets v3 defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub version: u32,
    pub backing_file_offset: u64,
    pub backing_file_size: u32,
    pub cluster_bits: u32,
    pub size: u64,
    pub crypt_method: u32,
    pub l1_size: u32,
    pub l1_table_offset: u64,
    pub refcount_table_offset: u64,
    pub refcount_table_clusters: u32,
    pub nb_snapshots: u32,
    pub snapshots_offset: u64,
    pub incompatible: u64,
    pub compatible: u64,
    pub autoclear: u64,
    pub refcount_order: u32,
    pub header_length: u32,
    pub compression: Compression,
    pub backing_file: Option<String>,
    pub backing_format: Option<String>,
    pub data_file: Option<String>,
    /// The bitmaps extension, while the autoclear bit says it is
    /// consistent (checked as qemu checks it; see `bitmap_directory`).
    pub bitmaps: Option<BitmapsExtension>,
}

fn be32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_be_bytes(a)
}

/// `[offset, offset+len)` lies inside a file of `file_size` bytes.
pub(crate) fn within(offset: u64, len: u64, file_size: u64) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= file_size)
}

impl Header {
    pub fn cluster_size(&self) -> u64 {
        1u64 << self.cluster_bits
    }

    pub fn extended_l2(&self) -> bool {
        self.incompatible & INCOMPAT_EXTL2 != 0
    }

    pub fn dirty(&self) -> bool {
        self.incompatible & INCOMPAT_DIRTY != 0
    }

    pub fn corrupt(&self) -> bool {
        self.incompatible & INCOMPAT_CORRUPT != 0
    }

    pub fn has_data_file(&self) -> bool {
        self.incompatible & INCOMPAT_DATA_FILE != 0
    }

    /// Bytes per L2 entry (16 with extended L2).
    pub fn l2_entry_size(&self) -> u64 {
        if self.extended_l2() {
            16
        } else {
            8
        }
    }

    /// Guest bytes one L2 table maps.
    pub fn l2_coverage(&self) -> u64 {
        (self.cluster_size() / self.l2_entry_size()) << self.cluster_bits
    }

    /// Parses the first cluster of an image (or as much of it as the file
    /// has); `file_size` bounds every offset.
    #[cfg(test)]
    pub fn parse(buf: &[u8], file_size: u64) -> Result<Header, HeaderError> {
        Self::parse_with(buf, file_size, true)
    }

    /// [`Header::parse`] for `check`: with `strict_tables` false, a
    /// refcount table or snapshot table in a bad place is left for the
    /// check to report (and `-r all` to rebuild or drop).
    pub fn parse_with(
        buf: &[u8],
        file_size: u64,
        strict_tables: bool,
    ) -> Result<Header, HeaderError> {
        if buf.len() < V2_HEADER_LEN as usize {
            return Err(invalid(format!("truncated header ({} bytes)", buf.len())));
        }
        if be32(buf, 0) != MAGIC {
            return Err(invalid("bad magic (not a qcow2 image)"));
        }
        let version = be32(buf, 4);
        if version != 2 && version != 3 {
            return Err(HeaderError::Unsupported(format!("qcow2 version {version}")));
        }
        let cluster_bits = be32(buf, 20);
        if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&cluster_bits) {
            return Err(invalid(format!(
                "cluster_bits {cluster_bits} out of range 9..=21"
            )));
        }
        let cluster_size = 1u64 << cluster_bits;
        let mut h = Header {
            version,
            backing_file_offset: be64(buf, 8),
            backing_file_size: be32(buf, 16),
            cluster_bits,
            size: be64(buf, 24),
            crypt_method: be32(buf, 32),
            l1_size: be32(buf, 36),
            l1_table_offset: be64(buf, 40),
            refcount_table_offset: be64(buf, 48),
            refcount_table_clusters: be32(buf, 56),
            nb_snapshots: be32(buf, 60),
            snapshots_offset: be64(buf, 64),
            incompatible: 0,
            compatible: 0,
            autoclear: 0,
            refcount_order: 4,
            header_length: V2_HEADER_LEN,
            compression: Compression::Deflate,
            backing_file: None,
            backing_format: None,
            data_file: None,
            bitmaps: None,
        };
        if version == 3 {
            if buf.len() < V3_MIN_HEADER_LEN as usize {
                return Err(invalid("truncated version 3 header"));
            }
            h.incompatible = be64(buf, 72);
            h.compatible = be64(buf, 80);
            h.autoclear = be64(buf, 88);
            h.refcount_order = be32(buf, 96);
            h.header_length = be32(buf, 100);
            if h.header_length < V3_MIN_HEADER_LEN {
                return Err(invalid(format!(
                    "header_length {} too small",
                    h.header_length
                )));
            }
            if u64::from(h.header_length) > cluster_size || h.header_length as usize > buf.len() {
                return Err(invalid(format!(
                    "header_length {} larger than the first cluster",
                    h.header_length
                )));
            }
        }
        if h.refcount_order > 6 {
            return Err(invalid(format!(
                "refcount_order {} out of range 0..=6",
                h.refcount_order
            )));
        }
        if h.crypt_method != 0 {
            return Err(HeaderError::Unsupported(format!(
                "encryption (crypt_method {})",
                h.crypt_method
            )));
        }
        let unknown = h.incompatible & !INCOMPAT_KNOWN;
        if unknown != 0 {
            return Err(HeaderError::Unsupported(format!(
                "unknown incompatible feature bit {}",
                unknown.trailing_zeros()
            )));
        }
        if h.incompatible & INCOMPAT_COMPRESSION != 0 {
            if h.header_length <= 104 {
                return Err(invalid(
                    "compression type bit set but header has no compression_type",
                ));
            }
            h.compression = match buf[104] {
                COMPRESSION_DEFLATE => Compression::Deflate,
                COMPRESSION_ZSTD => Compression::Zstd,
                t => return Err(HeaderError::Unsupported(format!("compression type {t}"))),
            };
        } else if h.header_length > 104 && buf[104] != COMPRESSION_DEFLATE {
            return Err(invalid("compression_type set without incompatible bit 3"));
        }
        if h.extended_l2() && cluster_bits < 14 {
            return Err(invalid(
                "extended L2 entries need clusters of at least 16 KiB",
            ));
        }
        h.validate_tables(file_size, strict_tables)?;
        h.parse_extensions(buf)?;
        h.parse_backing_name(buf)?;
        if h.has_data_file() && h.data_file.is_none() {
            return Err(HeaderError::Unsupported(
                "external data file without a data file name extension".into(),
            ));
        }
        Ok(h)
    }

    fn validate_tables(&self, file_size: u64, strict: bool) -> Result<(), HeaderError> {
        let cs = self.cluster_size();
        // L1: big enough for the virtual size, small enough to load.
        let needed = self.size.div_ceil(self.l2_coverage());
        if u64::from(self.l1_size) < needed {
            return Err(invalid(format!(
                "l1_size {} too small for virtual size {}",
                self.l1_size, self.size
            )));
        }
        let l1_bytes = u64::from(self.l1_size) * 8;
        if l1_bytes > MAX_L1_BYTES {
            return Err(invalid(format!("l1_size {} is absurd", self.l1_size)));
        }
        if self.l1_size > 0 {
            if !self.l1_table_offset.is_multiple_of(cs) || self.l1_table_offset < cs {
                return Err(invalid(format!(
                    "L1 table offset {:#x} invalid",
                    self.l1_table_offset
                )));
            }
            if !within(self.l1_table_offset, l1_bytes, file_size) {
                return Err(invalid("L1 table lies beyond the end of the file"));
            }
        }
        let rt_bytes = u64::from(self.refcount_table_clusters) * cs;
        if rt_bytes > MAX_REFTABLE_BYTES {
            return Err(invalid(format!(
                "refcount table of {} clusters is absurd",
                self.refcount_table_clusters
            )));
        }
        if !strict {
            return Ok(());
        }
        if self.refcount_table_clusters == 0 {
            return Err(invalid("refcount table has no clusters"));
        }
        if !self.refcount_table_offset.is_multiple_of(cs) || self.refcount_table_offset < cs {
            return Err(invalid(format!(
                "refcount table offset {:#x} invalid (unaligned or overlapping the header)",
                self.refcount_table_offset
            )));
        }
        if !within(self.refcount_table_offset, rt_bytes, file_size) {
            return Err(invalid("refcount table lies beyond the end of the file"));
        }
        if self.nb_snapshots > 0
            && (!self.snapshots_offset.is_multiple_of(cs) || self.snapshots_offset >= file_size)
        {
            return Err(invalid("snapshot table offset invalid"));
        }
        Ok(())
    }

    fn parse_extensions(&mut self, buf: &[u8]) -> Result<(), HeaderError> {
        let end = buf.len();
        let mut off = self.header_length as usize;
        loop {
            if off + 8 > end {
                // qemu accepts a header without an end marker if the cluster ends.
                return Ok(());
            }
            let ty = be32(buf, off);
            let len = be32(buf, off + 4) as usize;
            let data = off + 8;
            if ty == EXT_END {
                return Ok(());
            }
            let data_end = data.checked_add(len).filter(|e| *e <= end).ok_or_else(|| {
                invalid(format!(
                    "header extension {ty:#x} runs past the first cluster"
                ))
            })?;
            let bytes = &buf[data..data_end];
            match ty {
                EXT_BACKING_FORMAT => {
                    self.backing_format = Some(ext_string(bytes, "backing format")?)
                }
                EXT_DATA_FILE => self.data_file = Some(ext_string(bytes, "data file name")?),
                EXT_BITMAPS => {
                    let consistent = self.version >= 3 && self.autoclear & AUTOCLEAR_BITMAPS != 0;
                    self.bitmaps = parse_extension(bytes, consistent, self.cluster_size())
                        .map_err(HeaderError::Invalid)?;
                }
                EXT_ENCRYPTION => {
                    return Err(HeaderError::Unsupported(
                        "encryption header extension".into(),
                    ))
                }
                _ => {}
            }
            off = data + len.div_ceil(8) * 8;
        }
    }

    fn parse_backing_name(&mut self, buf: &[u8]) -> Result<(), HeaderError> {
        if self.backing_file_offset == 0 {
            return Ok(());
        }
        if self.backing_file_size == 0 || self.backing_file_size > MAX_BACKING_NAME {
            return Err(invalid(format!(
                "backing file name length {} invalid",
                self.backing_file_size
            )));
        }
        let start = self.backing_file_offset;
        let end = start + u64::from(self.backing_file_size);
        if end > buf.len() as u64 || start < u64::from(self.header_length) {
            return Err(invalid("backing file name lies outside the header cluster"));
        }
        self.backing_file = Some(ext_string(
            &buf[start as usize..end as usize],
            "backing file name",
        )?);
        Ok(())
    }

    /// The header as qemu-img would write it for a new image (no
    /// extensions; see `create`).
    pub fn encode_fixed(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(V3_HEADER_LEN as usize);
        b.extend_from_slice(&MAGIC.to_be_bytes());
        b.extend_from_slice(&self.version.to_be_bytes());
        b.extend_from_slice(&self.backing_file_offset.to_be_bytes());
        b.extend_from_slice(&self.backing_file_size.to_be_bytes());
        b.extend_from_slice(&self.cluster_bits.to_be_bytes());
        b.extend_from_slice(&self.size.to_be_bytes());
        b.extend_from_slice(&self.crypt_method.to_be_bytes());
        b.extend_from_slice(&self.l1_size.to_be_bytes());
        b.extend_from_slice(&self.l1_table_offset.to_be_bytes());
        b.extend_from_slice(&self.refcount_table_offset.to_be_bytes());
        b.extend_from_slice(&self.refcount_table_clusters.to_be_bytes());
        b.extend_from_slice(&self.nb_snapshots.to_be_bytes());
        b.extend_from_slice(&self.snapshots_offset.to_be_bytes());
        if self.version >= 3 {
            b.extend_from_slice(&self.incompatible.to_be_bytes());
            b.extend_from_slice(&self.compatible.to_be_bytes());
            b.extend_from_slice(&self.autoclear.to_be_bytes());
            b.extend_from_slice(&self.refcount_order.to_be_bytes());
            b.extend_from_slice(&self.header_length.to_be_bytes());
            let ct = match self.compression {
                Compression::Deflate => COMPRESSION_DEFLATE,
                Compression::Zstd => COMPRESSION_ZSTD,
            };
            b.push(ct);
            b.resize(self.header_length as usize, 0);
        }
        b
    }
}

fn ext_string(bytes: &[u8], what: &str) -> Result<String, HeaderError> {
    // Names may be NUL-padded.
    let trimmed = bytes.split(|b| *b == 0).next().unwrap_or(&[]);
    String::from_utf8(trimmed.to_vec()).map_err(|_| invalid(format!("{what} is not UTF-8")))
}

fn header_error(path: &Path, e: HeaderError) -> BlockError {
    match e {
        HeaderError::Invalid(reason) => BlockError::InvalidImage {
            path: path.to_owned(),
            reason,
        },
        HeaderError::Unsupported(feature) => BlockError::Unsupported {
            path: path.to_owned(),
            feature,
        },
    }
}

/// Reads and validates the header of the image behind `file`; also
/// returns the file's size (what the header was checked against).
pub(crate) fn read_header(file: &File, path: &Path) -> Result<(Header, u64), BlockError> {
    read_header_with(file, path, true)
}

/// [`read_header`]; `strict_tables` as in [`Header::parse_with`].
pub(crate) fn read_header_with(
    file: &File,
    path: &Path,
    strict_tables: bool,
) -> Result<(Header, u64), BlockError> {
    let file_size = file_size(file).map_err(|source| BlockError::Open {
        path: path.to_owned(),
        source,
    })?;
    read_header_in(file, file_size, path, strict_tables).map(|h| (h, file_size))
}

/// The header of the image behind the metadata-I/O seam `io` (an open
/// image's), in a file of `file_size` bytes.
pub(crate) fn read_header_in(
    io: &dyn MetaIo,
    file_size: u64,
    path: &Path,
    strict_tables: bool,
) -> Result<Header, BlockError> {
    let mut probe = vec![0u8; 512.min(file_size) as usize];
    read_at(io, MetaKind::Header, 0, &mut probe)?;
    let cluster_bits = probe
        .get(20..24)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&cluster_bits) {
        // Let the parser name what is wrong with the short buffer.
        return Header::parse_with(&probe, file_size, strict_tables)
            .map_err(|e| header_error(path, e));
    }
    let mut buf = vec![0u8; (1u64 << cluster_bits).min(file_size) as usize];
    read_at(io, MetaKind::Header, 0, &mut buf)?;
    Header::parse_with(&buf, file_size, strict_tables).map_err(|e| header_error(path, e))
}

/// Clears the autoclear bits a read-write open does not know (as the
/// spec asks), the bitmaps bit among them unless the open keeps the
/// persistent bitmaps (`keep_bitmaps`), in the file and in `header`.
pub(crate) fn clear_unknown_autoclear(
    file: &File,
    path: &Path,
    header: &mut Header,
    keep_bitmaps: bool,
) -> Result<(), BlockError> {
    let known = match keep_bitmaps {
        true => AUTOCLEAR_KNOWN | AUTOCLEAR_BITMAPS,
        false => AUTOCLEAR_KNOWN,
    };
    let autoclear = header.autoclear & known;
    if header.version >= 3 && autoclear != header.autoclear {
        if header.autoclear & AUTOCLEAR_BITMAPS != 0 {
            // Say so: backup tools that rely on the bitmaps will
            // find them gone (qemu drops them on its next open).
            log::warn!(
                "{}: its persistent dirty bitmaps become invalid: they are not updated by this program",
                path.display()
            );
        }
        write_at(
            file,
            MetaKind::Header,
            OFF_AUTOCLEAR,
            &autoclear.to_be_bytes(),
        )?;
        header.autoclear = autoclear;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
