//! Metadata I/O on the image's buffered descriptor: positioned reads and
//! writes with errors that say what was being read or written.
//!
//! Byte buffers and host offsets enter; bytes leave (reads past the end of
//! the file yield zeroes). Data I/O never goes through here, only headers,
//! tables and copy-on-write sources.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::error::BlockError;

/// Reads `buf.len()` bytes at `offset`; the part past EOF reads as zeroes.
pub(crate) fn read_at(
    file: &File,
    offset: u64,
    buf: &mut [u8],
    what: &str,
) -> Result<(), BlockError> {
    let mut done = 0usize;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                break;
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(BlockError::MetadataRead {
                    what: format!("{what} at {offset:#x}"),
                    source,
                })
            }
        }
    }
    Ok(())
}

pub(crate) fn write_at(file: &File, offset: u64, buf: &[u8], what: &str) -> Result<(), BlockError> {
    file.write_all_at(buf, offset)
        .map_err(|source| BlockError::MetadataWrite {
            what: format!("{what} at {offset:#x}"),
            source,
        })
}

pub(crate) fn sync(file: &File) -> Result<(), BlockError> {
    file.sync_data().map_err(BlockError::Flush)
}

pub(crate) fn be64_at(b: &[u8], index: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[index * 8..index * 8 + 8]);
    u64::from_be_bytes(a)
}
