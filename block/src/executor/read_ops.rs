//! Read plans into ops: each host piece becomes one readv straight into the
//! request's memory (or bounce-buffered chunks under O_DIRECT when
//! unaligned), zero pieces are filled and memory pieces (bytes the format
//! holds, see `formats::MemoryExtent`) copied in at once, and compressed
//! pieces are served from the inflate cache or read into a buffer that is
//! inflated when the read completes.
//!
//! A read enters [`OpBuilder::build_read`] with the request's bounce
//! budget; the ops leave to the caller of [`OpBuilder::build`], which
//! pushes them. Compressed pieces ask the compressed-read pipeline
//! ([`CompressedReads`]) whether the cluster is cached or already being
//! read by this queue.

use super::build::{align_range, direct_ok, iovec_of, BounceBudget, OpBuilder, BOUNCE_CHUNK};
use super::compressed::CompressedReads;
use super::table::{AfterRead, OpBuffer, OpKind, OpSlot};
use crate::error::BlockError;
use crate::executor::inflate::MAX_CLUSTER_SIZE;
use crate::executor::memory::HostSegments;
use crate::formats::{CompressedExtent, FileId, ReadPlan, ReadSource};
use crate::request::BlockRequest;

impl OpBuilder {
    pub(super) fn build_read(
        &mut self,
        req: &BlockRequest,
        segs: &HostSegments,
        budget: &mut BounceBudget,
        compressed: &CompressedReads,
    ) -> Result<Vec<OpSlot>, BlockError> {
        // The plan vector is reused from request to request.
        let mut plan = std::mem::take(&mut self.spares.plan);
        plan.clear();
        let r = self.build_read_with(req, segs, &mut plan, budget, compressed);
        plan.clear();
        self.spares.plan = plan;
        r
    }

    fn build_read_with(
        &mut self,
        req: &BlockRequest,
        segs: &HostSegments,
        plan: &mut ReadPlan,
        budget: &mut BounceBudget,
        compressed: &CompressedReads,
    ) -> Result<Vec<OpSlot>, BlockError> {
        let len = segs.len();
        self.format
            .plan_read_cached(&mut self.plan_cache, req.offset, len, plan)?;
        let planned: u64 = plan.iter().map(|p| p.len).fold(0, u64::saturating_add);
        if planned != len {
            return Err(BlockError::Read {
                offset: req.offset,
                source: std::io::Error::other(format!(
                    "format planned {planned} bytes of a {len}-byte read"
                )),
            });
        }
        merge_adjacent(plan);
        let mut ops = self.spares.ops();
        let mut req_off = 0u64;
        for piece in plan.iter() {
            match piece.source {
                ReadSource::Zero => {
                    // SAFETY: the request's memory is owned by `req` and no
                    // op of it has been pushed yet.
                    unsafe { segs.fill_zero(req_off, piece.len) };
                }
                ReadSource::Host { file, offset } => {
                    self.host_read_ops(segs, req_off, piece.len, (file, offset), &mut ops, budget)?;
                }
                ReadSource::Compressed(ext) => {
                    let op =
                        self.compressed_read(segs, req_off, piece.len, ext, budget, compressed)?;
                    if let Some(op) = op {
                        ops.push(op);
                    }
                }
                ReadSource::Memory(ref m) => {
                    let bytes = m.slice(piece.len).ok_or_else(|| BlockError::OutOfRange {
                        offset: req.offset + req_off,
                        len: piece.len,
                        size: m.bytes.len() as u64,
                    })?;
                    // SAFETY: as for zero pieces, the request's memory is
                    // owned by `req` and no op of it has been pushed yet.
                    unsafe { segs.copy_in(req_off, bytes) };
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
        (file, offset): (FileId, u64),
        ops: &mut Vec<OpSlot>,
        budget: &mut BounceBudget,
    ) -> Result<(), BlockError> {
        if len == 0 {
            return Ok(());
        }
        let a = self.file_align(file)?;
        let mut op = OpSlot::new(OpKind::Read, file, offset, len);
        op.align = a.offset;
        op.iov = self.spares.iov();
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
            let buf = budget.take(end - start, a, host)?;
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
        budget: &mut BounceBudget,
        compressed: &CompressedReads,
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
        let cached = compressed.cached(&ext);
        if let Some(data) = cached {
            let from = ext.offset_in_cluster as usize;
            // SAFETY: the request's memory is owned by the caller's request
            // and none of its ops has been pushed yet.
            unsafe { segs.copy_in(req_off, &data[from..from + len as usize]) };
            return Ok(None);
        }
        if compressed.leading(&ext) {
            // Another read of this queue is fetching the cluster: wait for
            // its inflation (see `inflate_join`).
            let mut op = OpSlot::new(OpKind::AwaitInflate, ext.file, ext.host_offset, 0);
            op.after = AfterRead::Inflate {
                ext,
                skip: 0,
                req_off,
                len,
            };
            return Ok(Some(op));
        }
        let a = self.file_align(ext.file)?;
        let (start, end) = align_range(ext.host_offset, ext.compressed_len, a.offset)
            .ok_or_else(|| bad("compressed range overflows".into()))?;
        let buf = budget.take(end - start, a, ext.host_offset)?;
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

/// Joins consecutive pieces that continue each other in the same file
/// (adjacent clusters), so each contiguous host range is one op.
fn merge_adjacent(plan: &mut ReadPlan) {
    if plan.len() < 2 {
        return;
    }
    plan.dedup_by(|next, prev| match (&prev.source, &next.source) {
        (
            ReadSource::Host { file: f, offset: o },
            ReadSource::Host {
                file: nf,
                offset: no,
            },
        ) if f == nf && o.checked_add(prev.len) == Some(*no) => {
            prev.len += next.len;
            true
        }
        (ReadSource::Zero, ReadSource::Zero) => {
            prev.len += next.len;
            true
        }
        _ => false,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::ReadPiece;

    #[test]
    fn adjacent_host_pieces_merge_and_others_do_not() {
        let host = |file, offset, len| ReadPiece {
            len,
            source: ReadSource::Host {
                file: FileId(file),
                offset,
            },
        };
        let zero = |len| ReadPiece {
            len,
            source: ReadSource::Zero,
        };
        let mut plan = vec![
            host(0, 0, 10),
            host(0, 10, 5),
            host(0, 20, 5),
            host(1, 25, 5),
            zero(3),
            zero(4),
            host(1, 30, 1),
        ];
        merge_adjacent(&mut plan);
        assert_eq!(
            plan,
            vec![
                host(0, 0, 15),
                host(0, 20, 5),
                host(1, 25, 5),
                zero(7),
                host(1, 30, 1),
            ]
        );
    }
}
