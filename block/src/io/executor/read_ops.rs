//! Read plans into ops: each host piece becomes one readv straight into the
//! request's memory (or bounce-buffered chunks under O_DIRECT when
//! unaligned), zero pieces are filled at once, and compressed pieces are
//! served from the inflate cache or read into a buffer that is inflated
//! when the read completes.
//!
//! A planned read enters [`Executor::build_read`]; the ops leave to
//! [`Executor::start`], which pushes them.

use super::build::{align_range, direct_ok, iovec_of, BOUNCE_CHUNK};
use super::table::{AfterRead, OpBuffer, OpKind, OpSlot};
use super::Executor;
use crate::error::BlockError;
use crate::formats::{CompressedExtent, FileId, ReadSource};
use crate::io::inflate::MAX_CLUSTER_SIZE;
use crate::io::memory::HostSegments;
use crate::request::BlockRequest;

impl Executor {
    pub(super) fn build_read(
        &mut self,
        req: &BlockRequest,
        segs: &HostSegments,
    ) -> Result<Vec<OpSlot>, BlockError> {
        let len = segs.len();
        let mut plan = Vec::new();
        self.format.plan_read(req.offset, len, &mut plan)?;
        let planned: u64 = plan.iter().map(|p| p.len).fold(0, u64::saturating_add);
        if planned != len {
            return Err(BlockError::Read {
                offset: req.offset,
                source: std::io::Error::other(format!(
                    "format planned {planned} bytes of a {len}-byte read"
                )),
            });
        }
        let mut ops = Vec::new();
        let mut req_off = 0u64;
        for piece in plan {
            match piece.source {
                ReadSource::Zero => {
                    // SAFETY: the request's memory is owned by `req` and no
                    // op of it has been pushed yet.
                    unsafe { segs.fill_zero(req_off, piece.len) };
                }
                ReadSource::Host { file, offset } => {
                    self.host_read_ops(segs, req_off, piece.len, file, offset, &mut ops)?;
                }
                ReadSource::Compressed(ext) => {
                    if let Some(op) = self.compressed_read(segs, req_off, piece.len, ext)? {
                        ops.push(op);
                    }
                }
            }
            req_off += piece.len;
        }
        Ok(ops)
    }

    /// One op straight into the request's memory when alignment allows,
    /// else bounce-buffered chunks.
    fn host_read_ops(
        &mut self,
        segs: &HostSegments,
        req_off: u64,
        len: u64,
        file: FileId,
        offset: u64,
        ops: &mut Vec<OpSlot>,
    ) -> Result<(), BlockError> {
        if len == 0 {
            return Ok(());
        }
        let a = self.file_align(file)?;
        let mut op = OpSlot::new(OpKind::Read, file, offset, len);
        op.align = a.offset;
        segs.iovecs(req_off, len, &mut op.iov);
        if direct_ok(a, offset, len, &op.iov) {
            ops.push(op);
            return Ok(());
        }
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(BOUNCE_CHUNK);
            let range = offset
                .checked_add(done)
                .and_then(|host| Some((host, align_range(host, n, a.offset)?)));
            let Some((host, (start, end))) = range else {
                return Err(BlockError::OutOfRange {
                    offset,
                    len,
                    size: u64::MAX,
                });
            };
            let buf = self.bounce(end - start, a, host)?;
            let mut op = OpSlot::new(OpKind::Read, file, start, end - start);
            op.align = a.offset;
            op.iov.push(iovec_of(&buf));
            op.buffers.push(OpBuffer::Aligned(buf));
            op.after = AfterRead::Copy {
                skip: (host - start) as usize,
                req_off: req_off + done,
                len: n,
            };
            ops.push(op);
            done += n;
        }
        Ok(())
    }

    /// Serves the piece from the inflate cache, or returns the op that
    /// reads the compressed bytes (inflated when it completes).
    fn compressed_read(
        &mut self,
        segs: &HostSegments,
        req_off: u64,
        len: u64,
        ext: CompressedExtent,
    ) -> Result<Option<OpSlot>, BlockError> {
        let bad = |reason: String| BlockError::Decompress {
            offset: ext.host_offset,
            reason,
        };
        if ext.cluster_size == 0 || ext.cluster_size > MAX_CLUSTER_SIZE {
            return Err(bad(format!(
                "cluster size {} out of range",
                ext.cluster_size
            )));
        }
        if u64::from(ext.offset_in_cluster) + len > u64::from(ext.cluster_size) {
            return Err(bad("piece extends past its cluster".into()));
        }
        if ext.compressed_len == 0 || ext.compressed_len > 2 * u64::from(ext.cluster_size) + 4096 {
            return Err(bad(format!(
                "compressed length {} out of range",
                ext.compressed_len
            )));
        }
        if let Some(data) = self.cache.get(&ext) {
            let from = ext.offset_in_cluster as usize;
            // SAFETY: the request's memory is owned by the caller's request
            // and none of its ops has been pushed yet.
            unsafe { segs.copy_in(req_off, &data[from..from + len as usize]) };
            return Ok(None);
        }
        let a = self.file_align(ext.file)?;
        let (start, end) = align_range(ext.host_offset, ext.compressed_len, a.offset)
            .ok_or_else(|| bad("compressed range overflows".into()))?;
        let buf = self.bounce(end - start, a, ext.host_offset)?;
        let mut op = OpSlot::new(OpKind::Read, ext.file, start, end - start);
        op.align = a.offset;
        op.iov.push(iovec_of(&buf));
        op.buffers.push(OpBuffer::Aligned(buf));
        op.after = AfterRead::Inflate {
            ext,
            skip: (ext.host_offset - start) as usize,
            req_off,
            len,
        };
        Ok(Some(op))
    }
}
