//! Plans: a format's answer to "where does guest range X live?". A read
//! plan is the pieces covering the range ([`ReadPiece`]: bytes of a file,
//! zeroes, a compressed cluster, bytes in memory); a write plan is host
//! operations ([`HostWrite`]) the engine runs, and the metadata work
//! ([`WriteCommit`]) the format publishes once they all succeeded.
//! Files are named by [`FileId`], an index into the image's files.

use std::sync::Arc;

use block_engines::FileId;
use vmm_sys_util::eventfd::EventFd;

/// Compression algorithm of a compressed cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Raw deflate (no zlib header), qcow2's compression_type 0.
    Deflate,
    Zstd,
}

/// A compressed cluster; the engine reads `compressed_len` bytes at
/// `host_offset` (the tail may lie past EOF: read as zeroes), inflates them
/// to `cluster_size` bytes and copies out `offset_in_cluster..+len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompressedExtent {
    pub file: FileId,
    pub host_offset: u64,
    pub compressed_len: u64,
    pub algorithm: Compression,
    pub cluster_size: u32,
    pub offset_in_cluster: u32,
}

/// Bytes the format holds in memory, not (yet) in a file: a compressed
/// cluster still in qcow2's compressed-cluster write cache, inflated. The
/// engine copies `bytes[offset..offset + piece len]` into the request.
#[derive(Clone, PartialEq, Eq)]
pub struct MemoryExtent {
    pub bytes: Arc<Vec<u8>>,
    pub offset: usize,
}

impl std::fmt::Debug for MemoryExtent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryExtent")
            .field("bytes", &format_args!("[{} bytes]", self.bytes.len()))
            .field("offset", &self.offset)
            .finish()
    }
}

impl MemoryExtent {
    /// The `len` bytes the piece reads, `None` when they run past `bytes`.
    pub fn slice(&self, len: u64) -> Option<&[u8]> {
        let len = usize::try_from(len).ok()?;
        self.bytes.get(self.offset..self.offset.checked_add(len)?)
    }
}

/// Where one piece of a guest range lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadSource {
    /// Bytes at `offset` in `file`; reading past its end yields zeroes.
    Host {
        file: FileId,
        offset: u64,
    },
    /// Reads as zeroes, no I/O.
    Zero,
    Compressed(CompressedExtent),
    /// Bytes already in memory, no I/O.
    Memory(MemoryExtent),
}

/// Consecutive pieces covering the guest range, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadPiece {
    pub len: u64,
    pub source: ReadSource,
}

pub type ReadPlan = Vec<ReadPiece>;

/// Where the bytes of one part of a host write come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteData {
    /// `len` bytes of the request's memory starting at `offset` (relative
    /// to the request's first byte).
    Request { offset: u64, len: u64 },
    /// Bytes the format produced (copy-on-write from a backing image or an
    /// old cluster).
    Owned(Arc<Vec<u8>>),
    /// `len` zero bytes.
    Zeroes(u64),
}

impl WriteData {
    pub fn len(&self) -> u64 {
        match self {
            WriteData::Request { len, .. } | WriteData::Zeroes(len) => *len,
            WriteData::Owned(v) => v.len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One host operation of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostWrite {
    /// Write the parts, back to back, at `offset` (one pwritev / SQE).
    Data {
        file: FileId,
        offset: u64,
        parts: Vec<WriteData>,
    },
    /// Deallocate (fallocate PUNCH_HOLE|KEEP_SIZE); a hint that may fail
    /// with EOPNOTSUPP, which the engine ignores.
    PunchHole { file: FileId, offset: u64, len: u64 },
    /// Make the range read as zeroes (fallocate ZERO_RANGE, or a written
    /// zero buffer where the file system lacks it).
    ZeroRange { file: FileId, offset: u64, len: u64 },
}

/// Opaque handle of metadata work that waits for a plan's data writes.
#[derive(Debug, PartialEq, Eq)]
pub struct WriteCommit(pub u64);

#[derive(Debug, Default, PartialEq, Eq)]
pub struct WritePlan {
    /// Independent host operations; they may run in any order.
    pub ops: Vec<HostWrite>,
    /// Set when metadata must be published after every op succeeded.
    pub commit: Option<WriteCommit>,
    /// The commit drops references to host clusters (a cluster replaced by
    /// a new allocation, unmapped by a discard, ...). A write planned
    /// earlier may still be landing in such a cluster, so the engine runs
    /// the commit only once every write begun before this plan has ended;
    /// otherwise the freed cluster could be handed to another guest
    /// cluster and overwritten by the late write.
    pub frees_clusters: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    Ready(WritePlan),
    /// Overlaps an allocation in flight; plan again once the waker fires.
    Blocked,
}

/// Wakes a queue whose write was [`WriteOutcome::Blocked`] (the queue's
/// completion eventfd).
pub type Waker = Arc<EventFd>;
