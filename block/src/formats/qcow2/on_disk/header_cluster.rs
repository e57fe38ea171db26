//! The whole header cluster as a value: the fixed fields (a [`Header`]),
//! the header extensions in their order, and the backing file name; read
//! from an image and written back as one cluster, for the tools that
//! change several of these at once (`amend`, persistent bitmaps).
//!
//! The first cluster's bytes enter [`HeaderCluster::read`] (after
//! [`Header::parse_with`] accepted them); [`HeaderCluster::encode`]
//! returns the bytes of a new first cluster: the fixed part of the
//! header's version (72 bytes for version 2, `header_length` for version
//! 3), every extension padded to 8 bytes, the end marker, the backing
//! file name after it (its offset and length in the fixed part), zeroes
//! to the end of the cluster. The caller writes it in one `pwrite`, so a
//! reader sees the old header or the new one.

use super::header::{Header, HeaderError, EXT_END, V2_HEADER_LEN, V3_HEADER_LEN};
use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::{read_at, MetaIo, MetaKind};

/// The feature name table extension (names of feature bits for humans).
pub(crate) const EXT_FEATURE_TABLE: u32 = 0x6803_f857;

/// The header as it is on disk now (an open image's `header` is the one
/// it was opened with; the open itself may have changed some bits).
pub(crate) fn current_header(meta: &MetaState) -> Result<Header, BlockError> {
    let mut first = vec![0u8; meta.geometry().cluster_size as usize];
    read_at(meta.io(), MetaKind::Header, 0, &mut first)?;
    Header::parse_with(&first, meta.file_size(), true).map_err(|e| {
        meta.invalid(match e {
            HeaderError::Invalid(r) | HeaderError::Unsupported(r) => r,
        })
    })
}

/// A header cluster taken apart.
#[derive(Clone, Debug)]
pub(crate) struct HeaderCluster {
    pub header: Header,
    /// (type, data) of every extension but the end marker, in order.
    pub extensions: Vec<(u32, Vec<u8>)>,
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl HeaderCluster {
    /// Reads the first cluster of the image behind `io` (whose header
    /// `header` already is) and its extensions.
    pub fn read(
        io: &dyn MetaIo,
        header: &Header,
        path_for_errors: &std::path::Path,
    ) -> Result<Self, BlockError> {
        let mut first = vec![0u8; header.cluster_size() as usize];
        read_at(io, MetaKind::Header, 0, &mut first)?;
        let invalid = |reason: String| BlockError::InvalidImage {
            path: path_for_errors.to_owned(),
            reason,
        };
        let mut extensions = Vec::new();
        let mut at = header.header_length as usize;
        while let (Some(kind), Some(len)) = (be32(&first, at), be32(&first, at + 4)) {
            if kind == EXT_END {
                break;
            }
            let data = at + 8;
            let end = data
                .checked_add(len as usize)
                .filter(|e| *e <= first.len())
                .ok_or_else(|| {
                    invalid(format!(
                        "header extension {kind:#x} runs past the first cluster"
                    ))
                })?;
            extensions.push((kind, first[data..end].to_vec()));
            at = data + (len as usize).next_multiple_of(8);
        }
        Ok(HeaderCluster {
            header: header.clone(),
            extensions,
        })
    }

    /// The data of extension `kind`, if present.
    #[cfg(test)]
    pub fn extension(&self, kind: u32) -> Option<&[u8]> {
        self.extensions
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, d)| d.as_slice())
    }

    /// Replaces extension `kind` (keeping its place) or appends it;
    /// `None` removes it.
    pub fn set_extension(&mut self, kind: u32, data: Option<Vec<u8>>) {
        match (self.extensions.iter().position(|(k, _)| *k == kind), data) {
            (Some(i), Some(d)) => self.extensions[i].1 = d,
            (Some(i), None) => {
                self.extensions.remove(i);
            }
            (None, Some(d)) => self.extensions.push((kind, d)),
            (None, None) => {}
        }
    }

    /// The new first cluster, `cluster_size` bytes; an error when the
    /// extensions and the backing file name do not fit.
    pub fn encode(&self, path_for_errors: &std::path::Path) -> Result<Vec<u8>, BlockError> {
        let mut h = self.header.clone();
        if h.version < 3 {
            h.header_length = V2_HEADER_LEN;
        } else if h.header_length < V3_HEADER_LEN {
            h.header_length = V3_HEADER_LEN;
        }
        let mut buf = h.encode_fixed();
        buf.resize(h.header_length as usize, 0);
        for (kind, data) in &self.extensions {
            buf.extend_from_slice(&kind.to_be_bytes());
            buf.extend_from_slice(&(data.len() as u32).to_be_bytes());
            buf.extend_from_slice(data);
            buf.resize(buf.len().next_multiple_of(8), 0);
        }
        buf.extend_from_slice(&[0u8; 8]);
        let (name_at, name_len) = match &h.backing_file {
            Some(name) => {
                let at = buf.len() as u64;
                buf.extend_from_slice(name.as_bytes());
                (at, name.len() as u32)
            }
            None => (0, 0),
        };
        let cs = h.cluster_size() as usize;
        if buf.len() > cs {
            return Err(BlockError::InvalidImage {
                path: path_for_errors.to_owned(),
                reason: "the header, its extensions and the backing file name do not fit in the first cluster".into(),
            });
        }
        buf[8..16].copy_from_slice(&name_at.to_be_bytes());
        buf[16..20].copy_from_slice(&name_len.to_be_bytes());
        buf.resize(cs, 0);
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::qcow2::on_disk::header::EXT_BACKING_FORMAT;
    use std::path::Path;

    fn sample(version: u32) -> HeaderCluster {
        let (bytes, size) = crate::formats::qcow2::on_disk::header::tests::sample();
        let mut header = Header::parse_with(&bytes, size, true).unwrap();
        header.version = version;
        header.backing_file = Some("base.qcow2".into());
        HeaderCluster {
            header,
            extensions: vec![
                (EXT_BACKING_FORMAT, b"qcow2".to_vec()),
                (0x1234_5678, vec![7; 3]),
            ],
        }
    }

    #[test]
    fn round_trips_through_the_parser_in_both_versions() {
        for version in [2, 3] {
            let hc = sample(version);
            let bytes = hc.encode(Path::new("x")).unwrap();
            let back = Header::parse_with(&bytes, 4 << 16, true).unwrap();
            assert_eq!(back.version, version);
            assert_eq!(back.backing_file.as_deref(), Some("base.qcow2"));
            assert_eq!(back.backing_format.as_deref(), Some("qcow2"));
            let want_len = if version == 2 { 72 } else { 112 };
            assert_eq!(back.header_length, want_len);
            let io = std::sync::Arc::new(Cursorless(bytes));
            let again = HeaderCluster::read(&*io, &back, Path::new("x")).unwrap();
            assert_eq!(again.extensions, hc.extensions);
        }
    }

    #[test]
    fn extensions_are_replaced_in_place_and_removed() {
        let mut hc = sample(3);
        hc.set_extension(EXT_BACKING_FORMAT, Some(b"raw".to_vec()));
        assert_eq!(hc.extensions[0], (EXT_BACKING_FORMAT, b"raw".to_vec()));
        hc.set_extension(EXT_BACKING_FORMAT, None);
        assert_eq!(hc.extensions.len(), 1);
        hc.set_extension(EXT_FEATURE_TABLE, Some(vec![1; 48]));
        assert_eq!(hc.extension(EXT_FEATURE_TABLE), Some(&[1u8; 48][..]));
    }

    #[test]
    fn too_much_for_the_cluster_is_refused() {
        let mut hc = sample(3);
        hc.set_extension(0x4242, Some(vec![0; 1 << 16]));
        assert!(hc.encode(Path::new("x")).is_err());
    }

    /// An in-memory image file for the reader.
    struct Cursorless(Vec<u8>);

    impl MetaIo for Cursorless {
        fn read_at(&self, _: MetaKind, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
            let start = (offset as usize).min(self.0.len());
            let n = buf.len().min(self.0.len() - start);
            buf[..n].copy_from_slice(&self.0[start..start + n]);
            Ok(n)
        }
        fn write_at(&self, _: MetaKind, _: &[u8], _: u64) -> std::io::Result<usize> {
            Err(std::io::Error::from_raw_os_error(libc::EROFS))
        }
        fn sync(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn set_len(&self, _: u64) -> std::io::Result<()> {
            Err(std::io::Error::from_raw_os_error(libc::EROFS))
        }
    }
}
