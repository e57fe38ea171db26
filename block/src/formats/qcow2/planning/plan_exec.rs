//! Executing a read plan synchronously into a buffer, on buffered
//! descriptors: the copy-on-write source of partial-cluster writes (data
//! from a backing image or an old compressed cluster) and tests.
//!
//! A plan, the chain's buffered descriptors of its local files (indexed
//! like `Format::files`) and its files (for the remote ones, NBD exports
//! read through their connections) enter; the bytes leave in the
//! caller's buffer. Not a data path engine.

use std::fs::File;
use std::sync::Arc;

use crate::error::BlockError;
use crate::formats::qcow2::compression::compressed::inflate_cluster;
use crate::formats::qcow2::metadata::meta_io::{read_at, MetaKind};
use crate::formats::{ImageFiles, ReadPiece, ReadSource};

pub(crate) fn execute_read(
    files: &[Arc<File>],
    chain: &ImageFiles,
    plan: &[ReadPiece],
    buf: &mut [u8],
) -> Result<(), BlockError> {
    let mut pos = 0usize;
    for piece in plan {
        let len = usize::try_from(piece.len).map_err(|_| BlockError::OutOfRange {
            offset: 0,
            len: piece.len,
            size: buf.len() as u64,
        })?;
        let Some(out) = buf.get_mut(pos..pos + len) else {
            return Err(BlockError::OutOfRange {
                offset: pos as u64,
                len: piece.len,
                size: buf.len() as u64,
            });
        };
        match &piece.source {
            ReadSource::Zero => out.fill(0),
            ReadSource::Memory(m) => {
                let src = m.slice(piece.len).ok_or_else(|| BlockError::OutOfRange {
                    offset: m.offset as u64,
                    len: piece.len,
                    size: m.bytes.len() as u64,
                })?;
                out.copy_from_slice(src);
            }
            ReadSource::Host { file, offset } => match chain.remote(*file) {
                Some(r) => r.read_at(*offset, out)?,
                None => read_at(file_of(files, file.0)?, MetaKind::GuestData, *offset, out)?,
            },
            ReadSource::Compressed(c) => {
                let f = file_of(files, c.file.0)?;
                let mut input = vec![0u8; c.compressed_len as usize];
                read_at(f, MetaKind::GuestData, c.host_offset, &mut input)?;
                let cluster = inflate_cluster(c.algorithm, &input, c.cluster_size as usize)
                    .map_err(|reason| BlockError::Decompress {
                        offset: c.host_offset,
                        reason,
                    })?;
                let start = c.offset_in_cluster as usize;
                let src =
                    cluster
                        .get(start..start + len)
                        .ok_or_else(|| BlockError::Decompress {
                            offset: c.host_offset,
                            reason: "piece runs past the cluster".into(),
                        })?;
                out.copy_from_slice(src);
            }
        }
        pos += len;
    }
    Ok(())
}

fn file_of(files: &[Arc<File>], i: u16) -> Result<&File, BlockError> {
    files
        .get(usize::from(i))
        .map(|f| &**f)
        .ok_or_else(|| BlockError::InvalidImage {
            path: Default::default(),
            reason: format!("plan names file {i} of {}", files.len()),
        })
}
