//! Write plans into ops: data writes gather the request's memory, the
//! format's buffers and zeroes into one writev per host extent (bounce
//! buffers with read-modify-write under O_DIRECT when unaligned); punch
//! hole and zero range become fallocate ops. Also the probed-raw header
//! guard.
//!
//! A write plan's host ops enter [`OpBuilder::write_ops`] with the
//! request's bounce budget; the ops leave to the caller of
//! [`OpBuilder::build`], which pushes them.

use std::os::unix::fs::FileExt;

use super::build::{align_range, direct_ok, iovec_of, BounceBudget, OpBuilder, BOUNCE_CHUNK};
use super::table::{OpBuffer, OpKind, OpSlot};
use crate::aligned::AlignedBuf;
use crate::error::BlockError;
use crate::executor::memory::{HostSegments, IOV_MAX};
use crate::formats::probe::looks_like_image_header;
use crate::formats::{FileId, HostWrite, WriteData};
use crate::request::BlockRequest;
use crate::SECTOR_SIZE;
use block_engines::align::DioAlign;

impl OpBuilder {
    pub(super) fn write_ops(
        &mut self,
        hw: HostWrite,
        segs: &HostSegments,
        ops: &mut Vec<OpSlot>,
        budget: &mut BounceBudget,
    ) -> Result<(), BlockError> {
        match hw {
            HostWrite::PunchHole { file, offset, len } => {
                self.file_align(file)?;
                if len > 0 {
                    ops.push(OpSlot::new(OpKind::PunchHole, file, offset, len));
                }
            }
            HostWrite::ZeroRange { file, offset, len } => {
                let a = self.file_align(file)?;
                if len > 0 {
                    let mut op = OpSlot::new(OpKind::ZeroRange, file, offset, len);
                    op.align = a.offset;
                    ops.push(op);
                }
            }
            HostWrite::Data {
                file,
                offset,
                parts,
            } => self.data_write_ops((file, offset), &parts, segs, ops, budget)?,
        }
        Ok(())
    }

    fn data_write_ops(
        &mut self,
        (file, offset): (FileId, u64),
        parts: &[WriteData],
        segs: &HostSegments,
        ops: &mut Vec<OpSlot>,
        budget: &mut BounceBudget,
    ) -> Result<(), BlockError> {
        let a = self.file_align(file)?;
        let bad_plan = |what: &str| BlockError::Write {
            offset,
            source: std::io::Error::other(format!("bad write plan: {what}")),
        };
        let mut total = 0u64;
        let mut op = OpSlot::new(OpKind::Write, file, offset, 0);
        op.align = a.offset;
        for part in parts {
            match part {
                WriteData::Request { offset: o, len } => {
                    if o.checked_add(*len).is_none_or(|end| end > segs.len()) {
                        return Err(bad_plan("part beyond the request's data"));
                    }
                    segs.iovecs(*o, *len, &mut op.iov);
                }
                WriteData::Owned(data) => {
                    if !data.is_empty() {
                        op.iov.push(libc::iovec {
                            iov_base: data.as_ptr() as *mut libc::c_void,
                            iov_len: data.len(),
                        });
                        op.buffers.push(OpBuffer::Shared(data.clone()));
                    }
                }
                WriteData::Zeroes(len) => {
                    let mut left = *len;
                    while left > 0 {
                        let n = left.min(self.zero_page.len() as u64);
                        op.iov.push(libc::iovec {
                            iov_base: self.zero_page.as_ptr().cast(),
                            iov_len: n as usize,
                        });
                        left -= n;
                        if op.iov.len() > IOV_MAX {
                            break; // bounced below
                        }
                    }
                    op.buffers.push(OpBuffer::Zero(self.zero_page.clone()));
                }
            }
            total = total
                .checked_add(part.len())
                .ok_or_else(|| bad_plan("length overflows"))?;
        }
        if total == 0 {
            return Ok(());
        }
        op.remaining = total;
        if direct_ok(a, offset, total, &op.iov) {
            ops.push(op);
            return Ok(());
        }
        // Bounce: copy the parts into aligned chunks, reading the partial
        // first and last blocks first (read-modify-write).
        let mut done = 0u64;
        while done < total {
            let n = (total - done).min(BOUNCE_CHUNK);
            let host = offset
                .checked_add(done)
                .ok_or_else(|| bad_plan("range overflows"))?;
            let (start, end) =
                align_range(host, n, a.offset).ok_or_else(|| bad_plan("range overflows"))?;
            let mut buf = budget.take(end - start, a, host)?;
            self.read_partial_blocks(file, start, host, host + n, end, a, &mut buf)?;
            let dst = &mut buf.as_mut_slice()[(host - start) as usize..][..n as usize];
            // SAFETY: the request's memory is owned by the caller and no
            // op of it has been pushed yet.
            unsafe { copy_parts(parts, segs, done, dst) };
            let mut op = OpSlot::new(OpKind::Write, file, start, end - start);
            op.align = a.offset;
            op.iov.push(iovec_of(&buf));
            op.buffers.push(OpBuffer::Aligned(buf));
            ops.push(op);
            done += n;
        }
        Ok(())
    }

    /// Fills the blocks of `buf` (covering `start..end` of the file) that
    /// the write `from..to` only partly covers with the file's bytes.
    #[allow(clippy::too_many_arguments)]
    fn read_partial_blocks(
        &self,
        file: FileId,
        start: u64,
        from: u64,
        to: u64,
        end: u64,
        a: DioAlign,
        buf: &mut AlignedBuf,
    ) -> Result<(), BlockError> {
        let block = u64::from(a.offset.max(1));
        let f = self
            .files
            .get(usize::from(file.0))
            .ok_or(BlockError::NoSuchFile(file.0))?;
        let mut read_block = |at: u64| -> Result<(), BlockError> {
            let slice = &mut buf.as_mut_slice()[(at - start) as usize..][..block as usize];
            let mut got = 0usize;
            while got < slice.len() {
                match f.read_at(&mut slice[got..], at + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(source) => return Err(BlockError::Read { offset: at, source }),
                }
                if block > 1 && !got.is_multiple_of(block as usize) {
                    break; // EOF inside the block
                }
            }
            slice[got..].fill(0);
            Ok(())
        };
        if from > start {
            read_block(start)?;
        }
        if to < end {
            let tail = end - block;
            if !(tail == start && from > start) {
                read_block(tail)?;
            }
        }
        Ok(())
    }

    /// Refuses a write that would give a probed raw image another format's
    /// header (the next open would trust it).
    pub(super) fn check_first_sector(
        &self,
        req: &BlockRequest,
        segs: &HostSegments,
    ) -> Result<(), BlockError> {
        if req.offset >= SECTOR_SIZE || segs.is_empty() || !self.format.guards_first_sector() {
            return Ok(());
        }
        let mut buf = AlignedBuf::new(4096, 4096).ok_or(BlockError::BufferAlloc(4096))?;
        if let Some(f) = self.files.first() {
            // A short or failed read leaves zeroes: the check then only
            // looks at the new bytes, which is what matters most.
            let _ = f.read_at(buf.as_mut_slice(), 0);
        }
        let off = req.offset as usize;
        let n = (SECTOR_SIZE - req.offset).min(segs.len()) as usize;
        // SAFETY: the request's memory is owned by `req`; no op of it has
        // been pushed yet.
        unsafe { segs.copy_out(0, &mut buf.as_mut_slice()[off..off + n]) };
        match looks_like_image_header(&buf.as_slice()[..SECTOR_SIZE as usize]) {
            Some(format) => Err(BlockError::ProbedRawHeaderWrite { format }),
            None => Ok(()),
        }
    }
}

/// Copies bytes `from..from+dst.len()` of the concatenated `parts` to `dst`.
///
/// # Safety
///
/// `segs` must describe live request memory that no op is using.
unsafe fn copy_parts(parts: &[WriteData], segs: &HostSegments, from: u64, dst: &mut [u8]) {
    let mut pos = 0u64; // start of the current part in the concatenation
    let mut out = 0usize;
    for part in parts {
        let plen = part.len();
        let want_start = from + out as u64;
        if out == dst.len() {
            break;
        }
        if want_start >= pos + plen {
            pos += plen;
            continue;
        }
        let skip = want_start - pos;
        let n = (plen - skip).min((dst.len() - out) as u64) as usize;
        let d = &mut dst[out..out + n];
        match part {
            // SAFETY: forwarded from this function's contract.
            WriteData::Request { offset, .. } => unsafe { segs.copy_out(offset + skip, d) },
            WriteData::Owned(data) => d.copy_from_slice(&data[skip as usize..skip as usize + n]),
            WriteData::Zeroes(_) => d.fill(0),
        }
        out += n;
        pos += plen;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn copy_parts_spans_kinds() {
        let mut mem = crate::request::IoMemory::Owned(vec![1, 2, 3, 4]);
        let segs = HostSegments::of(&mut mem).unwrap();
        let parts = vec![
            WriteData::Owned(Arc::new(vec![9, 9])),
            WriteData::Request { offset: 1, len: 3 },
            WriteData::Zeroes(2),
        ];
        let mut dst = [0xffu8; 5];
        // SAFETY: `mem` is alive and no op uses it.
        unsafe { copy_parts(&parts, &segs, 1, &mut dst) };
        assert_eq!(dst, [9, 2, 3, 4, 0]);
    }
}
