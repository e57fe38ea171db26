//! The metadata-I/O seam: every qcow2 metadata read, write and barrier
//! (headers, L1/L2 tables, refcount tables and blocks, snapshot tables,
//! copy-on-write sources, compressed clusters written inline) and every
//! change of the image file's length goes through one small trait,
//! [`MetaIo`], owned by the open image. README.md and docs/io-engines.md
//! list what does not, and why.
//!
//! The default implementation is the image's buffered descriptor
//! (`impl MetaIo for File`); tests install a fault-injecting one
//! (`meta_faults::FaultyMetaIo`) on an opened image. Byte buffers, host
//! offsets and a [`MetaKind`] saying what is being transferred enter; bytes
//! or [`BlockError`]s naming the kind and offset leave. Reads past the end
//! of the file yield zeroes; short writes are finished here, so an
//! implementation may return any prefix length. Data I/O of guest requests
//! never comes through here: it goes through the engine.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::error::BlockError;

/// What a metadata transfer carries (fault filters, error messages, and
/// the overlap check's "which metadata may this write touch").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetaKind {
    /// The header cluster (fields, extensions, feature bits).
    Header,
    /// The active L1 table.
    L1Table,
    /// An active L2 table (whole table or some of its entries).
    L2Table,
    RefcountTable,
    RefcountBlock,
    SnapshotTable,
    /// An internal snapshot's L1 table.
    SnapshotL1,
    BitmapDirectory,
    /// Guest data moved inline by the format: compressed clusters,
    /// copy-on-write sources, clusters copied by a shrink.
    GuestData,
}

impl fmt::Display for MetaKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MetaKind::Header => "header",
            MetaKind::L1Table => "L1 table",
            MetaKind::L2Table => "L2 table",
            MetaKind::RefcountTable => "refcount table",
            MetaKind::RefcountBlock => "refcount block",
            MetaKind::SnapshotTable => "snapshot table",
            MetaKind::SnapshotL1 => "snapshot L1 table",
            MetaKind::BitmapDirectory => "bitmap directory",
            MetaKind::GuestData => "guest data (inline)",
        })
    }
}

/// Positioned metadata I/O on one image file. Each call may transfer
/// fewer bytes than asked (the helpers below loop); errors are plain
/// `io::Error`s (EIO, ENOSPC, ...).
pub trait MetaIo: Send + Sync {
    /// Reads into `buf` at `offset`; `Ok(0)` at the end of the file.
    fn read_at(&self, kind: MetaKind, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes a prefix of `buf` at `offset`, returning its length.
    fn write_at(&self, kind: MetaKind, buf: &[u8], offset: u64) -> io::Result<usize>;
    /// Makes every write so far durable (fdatasync).
    fn sync(&self) -> io::Result<()>;
    /// Sets the file's length (ftruncate): the headroom kept ahead of
    /// allocation (`reserve`), and cutting the file back (undo).
    fn set_len(&self, len: u64) -> io::Result<()>;
}

impl MetaIo for File {
    fn read_at(&self, _kind: MetaKind, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }

    fn write_at(&self, _kind: MetaKind, buf: &[u8], offset: u64) -> io::Result<usize> {
        FileExt::write_at(self, buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.sync_data()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
}

impl<T: MetaIo + ?Sized> MetaIo for Arc<T> {
    fn read_at(&self, kind: MetaKind, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        (**self).read_at(kind, buf, offset)
    }

    fn write_at(&self, kind: MetaKind, buf: &[u8], offset: u64) -> io::Result<usize> {
        (**self).write_at(kind, buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        (**self).sync()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        (**self).set_len(len)
    }
}

/// Reads `buf.len()` bytes at `offset`; the part past EOF reads as zeroes.
pub(crate) fn read_at(
    io: &dyn MetaIo,
    kind: MetaKind,
    offset: u64,
    buf: &mut [u8],
) -> Result<(), BlockError> {
    let mut done = 0usize;
    while done < buf.len() {
        match io.read_at(kind, &mut buf[done..], offset + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                break;
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(BlockError::MetadataRead {
                    what: format!("{kind} at {offset:#x}"),
                    source,
                })
            }
        }
    }
    Ok(())
}

/// Writes all of `buf` at `offset` (short writes are continued).
pub(crate) fn write_at(
    io: &dyn MetaIo,
    kind: MetaKind,
    offset: u64,
    buf: &[u8],
) -> Result<(), BlockError> {
    let mut done = 0usize;
    while done < buf.len() {
        let failed = match io.write_at(kind, &buf[done..], offset + done as u64) {
            Ok(0) => io::Error::new(io::ErrorKind::WriteZero, "wrote no bytes"),
            Ok(n) => {
                done += n;
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => e,
        };
        return Err(BlockError::MetadataWrite {
            what: format!("{kind} at {offset:#x}"),
            source: failed,
        });
    }
    Ok(())
}

pub(crate) fn sync(io: &dyn MetaIo) -> Result<(), BlockError> {
    io.sync().map_err(BlockError::Flush)
}

/// Sets the file's length to `len`; `why` names the change in the error
/// (a failure is a metadata write that failed).
pub(crate) fn set_len(io: &dyn MetaIo, len: u64, why: &str) -> Result<(), BlockError> {
    io.set_len(len).map_err(|source| BlockError::MetadataWrite {
        what: format!("image size ({why})"),
        source,
    })
}

pub(crate) fn be64_at(b: &[u8], index: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[index * 8..index * 8 + 8]);
    u64::from_be_bytes(a)
}
