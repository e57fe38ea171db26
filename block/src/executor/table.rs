//! The in-flight table: each submitted request, owned here (with its
//! memory) until the last host operation of it has been reaped.
//!
//! Requests enter with [`RequestTable::insert`] and leave with
//! [`RequestTable::remove`]; an op's token is its request's slot and its
//! own index, so a completion finds both without a search.

use std::sync::Arc;

use super::barrier::Barrier;
use crate::aligned::AlignedBuf;
use crate::error::BlockError;
use crate::executor::memory::HostSegments;
use crate::formats::{CompressedExtent, FileId, WriteCommit};
use crate::request::{IoMemory, RequestOp};
use block_engines::OpToken;

/// What an op does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    Fdatasync,
    PunchHole,
    ZeroRange,
    /// No host I/O: waits for another op of this queue that reads and
    /// inflates the same compressed cluster (see `inflate_join`).
    AwaitInflate,
}

/// Memory an op owns (kept alive with the op's request).
#[derive(Debug)]
pub enum OpBuffer {
    Aligned(AlignedBuf),
    /// Held, never read: keeps a format-made buffer alive for the kernel.
    #[allow(dead_code)]
    Shared(Arc<Vec<u8>>),
    /// Held, never read: keeps the shared zero page alive for the kernel.
    #[allow(dead_code)]
    Zero(Arc<AlignedBuf>),
}

/// Work left for after an op's data has arrived.
#[derive(Debug)]
pub enum AfterRead {
    None,
    /// Copy `len` bytes at `skip` of the op's first buffer to the
    /// request's memory at `req_off` (a bounce-buffered read).
    Copy {
        skip: usize,
        req_off: u64,
        len: u64,
    },
    /// Inflate the compressed bytes at `skip` of the op's first buffer and
    /// copy the piece the request asked for to `req_off`.
    Inflate {
        ext: CompressedExtent,
        skip: usize,
        req_off: u64,
        len: u64,
    },
}

/// One host operation of a request.
#[derive(Debug)]
pub struct OpSlot {
    pub kind: OpKind,
    pub file: FileId,
    /// Host offset of the next byte (advances on short transfers).
    pub offset: u64,
    /// Bytes still to transfer (reads/writes) or the fallocate length.
    pub remaining: u64,
    pub iov: Vec<libc::iovec>,
    /// First iovec not yet fully transferred.
    pub iov_start: usize,
    pub buffers: Vec<OpBuffer>,
    pub after: AfterRead,
    /// The file needs O_DIRECT alignment of this many bytes (1: none).
    pub align: u32,
    /// Set when the op writes zeroes from this page (the fallback of a
    /// ZeroRange the file system refused); its iovec is rebuilt per push.
    pub zero_source: Option<Arc<AlignedBuf>>,
    pub done: bool,
}

// SAFETY: the iovecs point into memory owned by the same in-flight entry
// (the request's memory or `buffers`), which moves with it.
unsafe impl Send for OpSlot {}

impl OpSlot {
    pub fn new(kind: OpKind, file: FileId, offset: u64, remaining: u64) -> Self {
        OpSlot {
            kind,
            file,
            offset,
            remaining,
            iov: Vec::new(),
            iov_start: 0,
            buffers: Vec::new(),
            after: AfterRead::None,
            align: 1,
            zero_source: None,
            done: false,
        }
    }

    /// Records that `n` more bytes were transferred: drops finished iovecs
    /// and trims the first unfinished one.
    pub fn advance(&mut self, n: u64) {
        self.offset = self.offset.saturating_add(n);
        self.remaining = self.remaining.saturating_sub(n);
        let mut left = n;
        while left > 0 && self.iov_start < self.iov.len() {
            let v = &mut self.iov[self.iov_start];
            let len = v.iov_len as u64;
            if left >= len {
                left -= len;
                self.iov_start += 1;
            } else {
                v.iov_base = (v.iov_base as *mut u8).wrapping_add(left as usize).cast();
                v.iov_len -= left as usize;
                left = 0;
            }
        }
    }

    /// Zeroes the memory of every iovec not yet transferred (EOF).
    ///
    /// # Safety
    ///
    /// The op must not be in flight, and its iovecs must point to live
    /// memory owned by its request.
    pub unsafe fn zero_rest(&mut self) {
        for v in &self.iov[self.iov_start..] {
            // SAFETY: the caller guarantees the iovec memory is live and
            // that no host operation is using it.
            unsafe { std::ptr::write_bytes(v.iov_base as *mut u8, 0, v.iov_len) };
        }
        self.iov_start = self.iov.len();
        self.remaining = 0;
    }
}

/// A request in flight.
#[derive(Debug)]
pub struct InFlight {
    pub user_data: u64,
    /// The request's op, offset and length, handed back in its completion.
    pub op: RequestOp,
    pub offset: u64,
    pub len: u64,
    pub memory: IoMemory,
    pub segs: HostSegments,
    pub ops: Vec<OpSlot>,
    /// Ops pushed and not yet finished.
    pub pending: usize,
    pub error: Option<BlockError>,
    pub commit: Option<WriteCommit>,
    /// Bytes reported on success.
    pub bytes: u64,
    /// Owner of the partial-block locks this write holds (see `rmw`).
    pub rmw_owner: Option<u64>,
    /// This write's number in the disk's write tracker (see `barrier`).
    pub write_seq: Option<u64>,
    /// The commit may free clusters: it waits until every write numbered
    /// below this has ended (see `barrier`).
    pub barrier: Option<Barrier>,
}

impl InFlight {
    /// Keeps the first error.
    pub fn fail(&mut self, e: BlockError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }
}

/// A slab of in-flight requests.
#[derive(Default)]
pub struct RequestTable {
    slots: Vec<Option<InFlight>>,
    free: Vec<u32>,
    len: usize,
}

// The per-request accessors are marked inline: they move an `InFlight`
// (several hundred bytes) in and out, and the executor's parts that call
// them may be compiled in another codegen unit, where an out-of-line call
// costs two copies of it (`memcpy`) per request.
impl RequestTable {
    #[inline]
    pub fn insert(&mut self, entry: InFlight) -> u32 {
        self.len += 1;
        if let Some(i) = self.free.pop() {
            self.slots[i as usize] = Some(entry);
            i
        } else {
            self.slots.push(Some(entry));
            (self.slots.len() - 1) as u32
        }
    }

    #[inline]
    pub fn get_mut(&mut self, slot: u32) -> Option<&mut InFlight> {
        self.slots.get_mut(slot as usize).and_then(Option::as_mut)
    }

    #[inline]
    pub fn remove(&mut self, slot: u32) -> Option<InFlight> {
        let e = self.slots.get_mut(slot as usize).and_then(Option::take);
        if e.is_some() {
            self.len -= 1;
            self.free.push(slot);
        }
        e
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Takes every entry's partial-block lock owner, pending commit and
    /// write number (for giving up on the entries without stranding other
    /// queues).
    pub fn take_locks_and_commits(&mut self) -> (Vec<u64>, Vec<WriteCommit>, Vec<u64>) {
        let mut owners = Vec::new();
        let mut commits = Vec::new();
        let mut seqs = Vec::new();
        for e in self.slots.iter_mut().flatten() {
            owners.extend(e.rmw_owner.take());
            commits.extend(e.commit.take());
            seqs.extend(e.write_seq.take());
        }
        (owners, commits, seqs)
    }

    /// Gives up every entry without freeing its memory: used only when the
    /// engine can no longer say whether the kernel still uses it.
    pub fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.slots));
        self.free.clear();
        self.len = 0;
    }
}

/// Token of op `op` of the request in `slot`.
pub fn token(slot: u32, op: u32) -> OpToken {
    (u64::from(slot) << 32) | u64::from(op)
}

/// The slot and op index of a token.
pub fn split_token(token: OpToken) -> (u32, u32) {
    ((token >> 32) as u32, token as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advance_trims_iovecs() {
        let mut buf = [0u8; 64];
        let base = buf.as_mut_ptr();
        let mut op = OpSlot::new(OpKind::Read, FileId(0), 1000, 48);
        for (off, len) in [(0usize, 16usize), (16, 16), (40, 16)] {
            op.iov.push(libc::iovec {
                iov_base: base.wrapping_add(off).cast(),
                iov_len: len,
            });
        }
        op.advance(20);
        assert_eq!((op.offset, op.remaining, op.iov_start), (1020, 28, 1));
        assert_eq!(op.iov[1].iov_len, 12);
        assert_eq!(op.iov[1].iov_base as usize, base as usize + 20);
        // SAFETY: the iovecs point into `buf`, which is alive and idle.
        unsafe { op.zero_rest() };
        assert_eq!(op.remaining, 0);
    }

    #[test]
    fn tokens_round_trip() {
        assert_eq!(split_token(token(7, 3)), (7, 3));
        assert_eq!(split_token(token(u32::MAX, u32::MAX)), (u32::MAX, u32::MAX));
    }
}
