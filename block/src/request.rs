//! The request model: what a queue worker submits and what it gets back.
//!
//! A [`BlockRequest`] owns the memory its data moves through
//! ([`IoMemory`]): either a snapshot of guest memory (an `Arc` that keeps
//! every region mapped) plus the guest ranges, or an owned buffer. The
//! engine keeps the request, and so that memory, alive until the last host
//! operation of the request has been reaped; the [`Completion`] hands the
//! memory back. No raw pointer crosses this API.

use std::sync::Arc;

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::aligned::AlignedBuf;
use crate::error::BlockError;

/// The sector size of the block layer's request model (virtio-blk's unit).
pub const SECTOR_SIZE: u64 = 512;

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestOp {
    /// Read `memory.len()` bytes at `offset` into the memory.
    Read,
    /// Write the memory's bytes at `offset`.
    Write,
    /// Make every completed write durable.
    Flush,
    /// Deallocate `len` bytes at `offset`; they read back as zeroes or as
    /// the backing image, whichever the format guarantees (qcow2: zeroes).
    Discard { len: u64 },
    /// Make `len` bytes at `offset` read as zeroes; `may_unmap` lets the
    /// format deallocate instead of writing (virtio-blk's UNMAP flag).
    WriteZeroes { len: u64, may_unmap: bool },
}

/// One contiguous range of guest memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestSegment {
    pub addr: GuestAddress,
    pub len: u32,
}

/// The memory a request reads into or writes from, and what keeps it alive.
#[derive(Debug)]
pub enum IoMemory {
    /// No data (flush, discard, write-zeroes).
    None,
    /// Guest memory: the `Arc` keeps every region mapped for as long as the
    /// request lives. Each segment lies inside one region (checked by
    /// [`IoMemory::guest`]).
    Guest {
        mem: Arc<GuestMemoryMmap>,
        segments: Vec<GuestSegment>,
    },
    /// A buffer owned by the request (tools, tests, bounce buffers).
    Owned(Vec<u8>),
    /// An owned buffer aligned for O_DIRECT: it goes to the file without
    /// a bounce copy (tools that benchmark or copy with `-t none`).
    Aligned(AlignedBuf),
}

impl IoMemory {
    /// Guest memory ranges; fails unless every segment lies inside a single
    /// mapped region, so later host-address translation cannot fail.
    pub fn guest(
        mem: Arc<GuestMemoryMmap>,
        segments: Vec<GuestSegment>,
    ) -> Result<Self, BlockError> {
        for seg in &segments {
            if seg.len == 0 {
                continue;
            }
            mem.get_slice(seg.addr, seg.len as usize)
                .map_err(|_| BlockError::BadGuestMemory {
                    addr: seg.addr.0,
                    len: seg.len,
                })?;
        }
        Ok(IoMemory::Guest { mem, segments })
    }

    /// Total bytes of data.
    pub fn len(&self) -> u64 {
        match self {
            IoMemory::None => 0,
            IoMemory::Guest { segments, .. } => segments.iter().map(|s| u64::from(s.len)).sum(),
            IoMemory::Owned(v) => v.len() as u64,
            IoMemory::Aligned(b) => b.len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The owned buffer, if this memory is one (tools read their data here).
    pub fn into_owned(self) -> Option<Vec<u8>> {
        match self {
            IoMemory::Owned(v) => Some(v),
            _ => None,
        }
    }
}

/// A request as submitted to a [`crate::DiskQueue`].
#[derive(Debug)]
pub struct BlockRequest {
    /// Opaque to the block layer; returned in the completion (virtio-blk
    /// uses the descriptor head index).
    pub user_data: u64,
    pub op: RequestOp,
    /// Byte offset into the virtual disk (unused by flush).
    pub offset: u64,
    pub memory: IoMemory,
}

impl BlockRequest {
    /// Bytes the request covers on the virtual disk.
    pub fn len(&self) -> u64 {
        match self.op {
            RequestOp::Read | RequestOp::Write => self.memory.len(),
            RequestOp::Flush => 0,
            RequestOp::Discard { len } | RequestOp::WriteZeroes { len, .. } => len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Exactly one per submitted request, whatever happened to it.
#[derive(Debug)]
pub struct Completion {
    pub user_data: u64,
    /// The request's op, offset and length ([`BlockRequest::len`]), so
    /// the queue can act on what completed (dirty bitmaps mark the range
    /// of every write-like completion, failed ones too).
    pub op: RequestOp,
    pub offset: u64,
    pub len: u64,
    /// Bytes transferred (reads: bytes written into `memory`), or the first
    /// error any part of the request met.
    pub result: Result<u64, BlockError>,
    /// The request's memory, handed back.
    pub memory: IoMemory,
}

impl Completion {
    /// Whether the request may have changed the disk's data (a write,
    /// write-zeroes or discard), whatever its result.
    pub fn changes_data(&self) -> bool {
        self.op.changes_data()
    }
}

impl RequestOp {
    /// Write, write-zeroes and discard: the ops that change data.
    pub fn changes_data(self) -> bool {
        matches!(
            self,
            RequestOp::Write | RequestOp::WriteZeroes { .. } | RequestOp::Discard { .. }
        )
    }
}
