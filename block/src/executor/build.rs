//! The op builder: turns one request into host operations. It plans the
//! request with the format, splits the request's memory into iovecs per
//! plan piece, routes unaligned O_DIRECT pieces through bounce buffers and
//! returns the ops; it pushes nothing and keeps no per-request state.
//!
//! A request enters [`OpBuilder::build`] with its host segments; the
//! per-request context (the [`BounceBudget`]) is a local value of that
//! call, handed down to [`read_ops`](super::read_ops) and
//! [`write_ops`](super::write_ops). What leaves is a [`Built`]: the ops
//! and the write's commit, or `Parked` for a write the format blocked.
//! The builder owns what every request's ops point at or reuse: the
//! format, the image's files and their alignment, the shared zero page
//! and the recycled vectors ([`Spares`]).

use std::fs::File;
use std::sync::{Arc, OnceLock};

use super::compressed::CompressedReads;
use super::spares::Spares;
use super::table::{OpKind, OpSlot};
use crate::aligned::AlignedBuf;
use crate::error::BlockError;
use crate::executor::memory::{iovecs_aligned, HostSegments, IOV_MAX};
use crate::formats::{FileId, Format, PlanCache, Waker, WriteCommit, WriteOutcome, WritePlan};
use crate::request::{BlockRequest, RequestOp};
use block_engines::align::DioAlign;

/// Size of the shared zero page.
const ZERO_PAGE: usize = 1 << 20;

/// Bounce buffers are used in chunks of at most this many bytes.
pub(super) const BOUNCE_CHUNK: u64 = 1 << 20;

/// The most bounce-buffer (and compressed-read buffer) bytes one request
/// may use. Guests that respect the reported block size never need bounce
/// buffers; a request over this fails instead of allocating without bound.
pub(super) const MAX_BOUNCE_PER_REQUEST: u64 = 64 << 20;

/// What a request turned into.
pub(super) enum Built {
    /// The ops, the commit, and whether the commit frees host clusters
    /// (`WritePlan::frees_clusters`).
    Ops(Vec<OpSlot>, Option<WriteCommit>, bool),
    Parked,
}

/// See the module docs.
pub(super) struct OpBuilder {
    pub format: Arc<dyn Format>,
    pub files: Vec<Arc<File>>,
    align: Vec<DioAlign>,
    /// Zeroes that write ops point at.
    pub zero_page: Arc<AlignedBuf>,
    /// Vectors recycled from finished requests.
    pub spares: Spares,
    /// What the format keeps for this queue's read plans (qcow2: its table
    /// snapshots, so reads of allocated clusters take no image lock).
    pub plan_cache: PlanCache,
    /// `cache=unsafe`: flushes complete at once without touching the disk.
    ignore_flushes: bool,
}

/// The per-request context of one build: bounce bytes the request may
/// still allocate, and whether it writes (which names bounce errors).
pub(super) struct BounceBudget {
    left: u64,
    write: bool,
}

impl BounceBudget {
    pub fn for_request(op: RequestOp) -> Self {
        BounceBudget {
            left: MAX_BOUNCE_PER_REQUEST,
            write: op != RequestOp::Read,
        }
    }

    /// An aligned buffer of `len` bytes for host `offset`, charged to the
    /// budget so one request cannot make the queue allocate without bound.
    pub fn take(&mut self, len: u64, a: DioAlign, offset: u64) -> Result<AlignedBuf, BlockError> {
        let write = self.write;
        let fail = |source: std::io::Error| match write {
            true => BlockError::Write { offset, source },
            false => BlockError::Read { offset, source },
        };
        self.left = self.left.checked_sub(len).ok_or_else(|| {
            fail(std::io::Error::other(format!(
                "request needs more than {MAX_BOUNCE_PER_REQUEST} bytes of bounce buffers"
            )))
        })?;
        usize::try_from(len)
            .ok()
            .and_then(|len| AlignedBuf::new(len, (a.mem as usize).max(64)))
            .ok_or_else(|| fail(std::io::Error::from(std::io::ErrorKind::OutOfMemory)))
    }
}

/// The process's one zero page: every queue writes zeroes from it and
/// nothing writes into it, so one copy serves them all (a page per queue
/// cost each queue 1 MiB of memory: the allocation zeroes it).
fn shared_zero_page() -> Arc<AlignedBuf> {
    static PAGE: OnceLock<Arc<AlignedBuf>> = OnceLock::new();
    let page = PAGE.get_or_init(|| {
        // Like a `Vec`, a fixed-size allocation failure is fatal.
        let page = AlignedBuf::new(ZERO_PAGE, 4096).unwrap_or_else(|| {
            std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u8; ZERO_PAGE]>())
        });
        Arc::new(page)
    });
    Arc::clone(page)
}

impl OpBuilder {
    pub fn new(format: Arc<dyn Format>, ignore_flushes: bool) -> Self {
        let files = format.files().local().to_vec();
        let align = format.files().alignments();
        OpBuilder {
            format,
            files,
            align,
            zero_page: shared_zero_page(),
            spares: Spares::default(),
            plan_cache: PlanCache::default(),
            ignore_flushes,
        }
    }

    /// The strictest O_DIRECT alignment of the image's files (1 if none).
    pub fn alignment(&self) -> DioAlign {
        self.align.iter().fold(DioAlign::NONE, |a, b| a.max(*b))
    }

    /// Builds the ops of `req`, whose memory `segs` describes. Blocked
    /// writes register `waker`; compressed pieces consult `compressed`
    /// (its cache, and the clusters this queue is reading now).
    pub fn build(
        &mut self,
        req: &BlockRequest,
        segs: &HostSegments,
        waker: &Waker,
        compressed: &CompressedReads,
    ) -> Result<Built, BlockError> {
        let mut budget = BounceBudget::for_request(req.op);
        match req.op {
            RequestOp::Read => self
                .build_read(req, segs, &mut budget, compressed)
                .map(|ops| Built::Ops(ops, None, false)),
            RequestOp::Write => {
                self.check_first_sector(req, segs)?;
                let outcome = self.format.plan_write(req.offset, segs.len(), waker)?;
                self.build_outcome(outcome, segs, &mut budget)
            }
            RequestOp::Discard { len } => {
                let outcome = self.format.plan_discard(req.offset, len, waker)?;
                self.build_outcome(outcome, segs, &mut budget)
            }
            RequestOp::WriteZeroes { len, may_unmap } => {
                let outcome = self
                    .format
                    .plan_write_zeroes(req.offset, len, may_unmap, waker)?;
                self.build_outcome(outcome, segs, &mut budget)
            }
            RequestOp::Flush => self.build_flush().map(|ops| Built::Ops(ops, None, false)),
        }
    }

    pub(super) fn file_align(&self, file: FileId) -> Result<DioAlign, BlockError> {
        self.align
            .get(usize::from(file.0))
            .copied()
            .ok_or_else(|| BlockError::Read {
                offset: 0,
                source: std::io::Error::other(format!(
                    "plan names file {} the image does not have",
                    file.0
                )),
            })
    }

    fn build_flush(&mut self) -> Result<Vec<OpSlot>, BlockError> {
        if self.ignore_flushes {
            return Ok(Vec::new());
        }
        self.format.flush_metadata()?;
        Ok(self
            .format
            .flush_files()
            .into_iter()
            .map(|file| OpSlot::new(OpKind::Fdatasync, file, 0, 0))
            .collect())
    }

    fn build_outcome(
        &mut self,
        outcome: WriteOutcome,
        segs: &HostSegments,
        budget: &mut BounceBudget,
    ) -> Result<Built, BlockError> {
        let plan = match outcome {
            WriteOutcome::Blocked => return Ok(Built::Parked),
            WriteOutcome::Ready(plan) => plan,
        };
        let WritePlan {
            ops: host_ops,
            commit,
            frees_clusters,
        } = plan;
        let mut ops = Vec::with_capacity(host_ops.len());
        let mut result = Ok(());
        for hw in host_ops {
            result = self.write_ops(hw, segs, &mut ops, budget);
            if result.is_err() {
                break;
            }
        }
        match result {
            Ok(()) => Ok(Built::Ops(ops, commit, frees_clusters)),
            Err(e) => {
                if let Some(c) = commit {
                    self.format.abort(c);
                }
                Err(e)
            }
        }
    }
}

/// Whether an op may go straight to its memory under alignment `a`.
pub(super) fn direct_ok(a: DioAlign, offset: u64, len: u64, iov: &[libc::iovec]) -> bool {
    if iov.len() > IOV_MAX {
        return false;
    }
    if a.is_none() {
        return true;
    }
    let block = u64::from(a.offset);
    offset.is_multiple_of(block)
        && len.is_multiple_of(block)
        && iovecs_aligned(iov, a.mem as usize, a.offset as usize)
}

/// `offset..offset+len` widened to multiples of `block`.
pub(super) fn align_range(offset: u64, len: u64, block: u32) -> Option<(u64, u64)> {
    let block = u64::from(block.max(1));
    let start = offset - offset % block;
    let end = offset.checked_add(len)?.checked_next_multiple_of(block)?;
    Some((start, end))
}

pub(super) fn iovec_of(buf: &AlignedBuf) -> libc::iovec {
    libc::iovec {
        iov_base: buf.as_ptr().cast(),
        iov_len: buf.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_range_widens() {
        assert_eq!(align_range(100, 10, 512), Some((0, 512)));
        assert_eq!(align_range(512, 512, 512), Some((512, 1024)));
        assert_eq!(align_range(511, 2, 512), Some((0, 1024)));
        assert_eq!(align_range(u64::MAX - 1, 10, 512), None);
    }

    #[test]
    fn a_bounce_budget_is_per_request() {
        let mut a = BounceBudget::for_request(RequestOp::Write);
        assert!(a.take(MAX_BOUNCE_PER_REQUEST, DioAlign::NONE, 0).is_ok());
        let over = a.take(1, DioAlign::NONE, 7).unwrap_err();
        assert!(
            matches!(over, BlockError::Write { offset: 7, .. }),
            "{over:?}"
        );
        // A new request starts with the whole budget, whatever the last used.
        let mut b = BounceBudget::for_request(RequestOp::Read);
        assert!(b.take(4096, DioAlign::NONE, 0).is_ok());
    }
}
