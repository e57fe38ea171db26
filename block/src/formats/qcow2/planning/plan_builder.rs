//! A write plan under construction ([`PlanBuilder`]): the host ops the
//! engine will run (data writes merged per contiguous host extent, hole
//! punches, zero ranges), the commit the plan waits for (L2 entries to
//! publish, clusters to release), and the copy-on-write jobs whose old
//! contents are still to be read ([`CowJob`]).
//!
//! The write and write-zeroes planners fill it under the image lock; the
//! COW jobs are read after the lock is dropped (`cow`), which adds their
//! data writes; the finished ops leave as a `WritePlan`.

use std::sync::Arc;

use super::inflight::PendingCommit;
use crate::formats::qcow2::metadata::meta_io::MetaIo;
use crate::formats::qcow2::on_disk::l2_entry::CompressedDescriptor;
use crate::formats::{Compression, FileId, HostWrite, WriteData};

/// A plan under construction.
#[derive(Default)]
pub(crate) struct PlanBuilder {
    pub ops: Vec<HostWrite>,
    pub pending: PendingCommit,
    /// New clusters whose old contents are read after the lock is released.
    pub cow: Vec<CowJob>,
}

fn merge_part(parts: &mut Vec<WriteData>, part: WriteData) {
    if part.is_empty() {
        return;
    }
    match (parts.last_mut(), &part) {
        (
            Some(WriteData::Request { offset, len }),
            WriteData::Request {
                offset: o2,
                len: l2,
            },
        ) if *offset + *len == *o2 => {
            *len += l2;
        }
        (Some(WriteData::Zeroes(a)), WriteData::Zeroes(b)) => *a += b,
        _ => parts.push(part),
    }
}

impl PlanBuilder {
    /// Adds a data write, extending the previous one when contiguous.
    pub fn data(&mut self, file: FileId, offset: u64, parts: Vec<WriteData>) {
        if let Some(HostWrite::Data {
            file: f,
            offset: o,
            parts: p,
        }) = self.ops.last_mut()
        {
            let end = *o + p.iter().map(WriteData::len).sum::<u64>();
            if *f == file && end == offset {
                for part in parts {
                    merge_part(p, part);
                }
                return;
            }
        }
        let mut merged = Vec::with_capacity(parts.len());
        for part in parts {
            merge_part(&mut merged, part);
        }
        self.ops.push(HostWrite::Data {
            file,
            offset,
            parts: merged,
        });
    }

    pub fn punch(&mut self, file: FileId, offset: u64, len: u64) {
        self.push_range(HostWrite::PunchHole { file, offset, len });
    }

    pub fn zero_range(&mut self, file: FileId, offset: u64, len: u64) {
        self.push_range(HostWrite::ZeroRange { file, offset, len });
    }

    /// Pushes a punch or zero-range op, or extends the last op when it is
    /// the same kind on the same file and ends where this one begins.
    fn push_range(&mut self, op: HostWrite) {
        match (self.ops.last_mut(), &op) {
            (
                Some(HostWrite::PunchHole {
                    file: f,
                    offset: o,
                    len: l,
                }),
                HostWrite::PunchHole { file, offset, len },
            )
            | (
                Some(HostWrite::ZeroRange {
                    file: f,
                    offset: o,
                    len: l,
                }),
                HostWrite::ZeroRange { file, offset, len },
            ) if *f == *file && *o + *l == *offset => *l += *len,
            _ => self.ops.push(op),
        }
    }
}

/// Where the bytes of a guest segment come from.
#[derive(Clone, Copy)]
pub(crate) enum Source {
    /// The request's data, at this offset into the request.
    Request(u64),
    Zeroes,
}

impl Source {
    pub(crate) fn part(self, len: u64) -> WriteData {
        match self {
            Source::Request(offset) => WriteData::Request { offset, len },
            Source::Zeroes => WriteData::Zeroes(len),
        }
    }

    pub(crate) fn advance(self, by: u64) -> Source {
        match self {
            Source::Request(o) => Source::Request(o + by),
            Source::Zeroes => Source::Zeroes,
        }
    }
}

/// What the old contents of a cluster are made of.
pub(crate) enum CowRead {
    /// The backing image's data for the guest cluster.
    Backing,
    /// An uncompressed host cluster (file, offset).
    Host(Arc<dyn MetaIo>, u64),
    /// A compressed cluster and how many bytes of it to read.
    Compressed {
        file: Arc<dyn MetaIo>,
        desc: CompressedDescriptor,
        read_len: u64,
        compression: Compression,
    },
    /// Extended L2: subcluster by subcluster, from the old host cluster
    /// (if any), zeroes or the backing image.
    Subclusters {
        file: Arc<dyn MetaIo>,
        host: Option<u64>,
        bitmap: u64,
    },
}

/// One new cluster whose head and/or tail come from old contents.
pub(crate) struct CowJob {
    /// Guest offset of the cluster.
    pub cluster: u64,
    /// Host offset of the new cluster.
    pub host: u64,
    pub in_cluster: u64,
    pub len: u64,
    pub src: Source,
    pub read: CowRead,
    /// The part of the cluster to write (whole clusters for new ones;
    /// the touched subclusters when filling an allocated cluster's
    /// unallocated or zero subclusters in place).
    pub span: (u64, u64),
}
