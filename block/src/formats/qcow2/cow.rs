//! Copy-on-write sources of allocating writes, read outside the metadata
//! lock.
//!
//! While planning (under the lock) `write` records one [`CowJob`] per new
//! cluster whose old contents must be copied around the request's data:
//! where the new cluster lives, which part the request covers, and what
//! the old contents are made of (backing image, the old host cluster, a
//! compressed cluster, or extended-L2 subclusters), with every host offset
//! already checked. The plan's guest clusters are then busy (in flight), so
//! nothing can change their mappings or free their old clusters; the lock
//! is released and [`Qcow2Image::fill_cow`] reads the old contents and
//! adds the data writes (head COW + data + tail COW) to the plan.

use std::sync::Arc;

use super::compressed::inflate_cluster;
use super::image::Qcow2Image;
use super::l2_entry::{subcluster_state, CompressedDescriptor, SubclusterState};
use super::meta_io::{read_at, MetaIo, MetaKind};
use super::write::{PlanBuilder, Source};
use crate::error::BlockError;
use crate::formats::{Compression, WriteData};

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

impl Qcow2Image {
    /// Reads the old contents of every job (without the metadata lock)
    /// and adds the data writes to `b`.
    pub(crate) fn fill_cow(
        &self,
        jobs: Vec<CowJob>,
        b: &mut PlanBuilder,
    ) -> Result<(), BlockError> {
        for job in jobs {
            let old = self.read_old(&job)?;
            let piece = |from: u64, to: u64| {
                WriteData::Owned(Arc::new(old[from as usize..to as usize].to_vec()))
            };
            let (start, end) = job.span;
            let data_end = job.in_cluster + job.len;
            let mut parts = Vec::with_capacity(3);
            if job.in_cluster > start {
                parts.push(piece(start, job.in_cluster));
            }
            parts.push(job.src.part(job.len));
            if end > data_end {
                parts.push(piece(data_end, end));
            }
            b.data(self.data_file, job.host + start, parts);
        }
        Ok(())
    }

    fn invalid(&self, reason: impl Into<String>) -> BlockError {
        BlockError::InvalidImage {
            path: self.path.clone(),
            reason: reason.into(),
        }
    }

    /// The whole old cluster of `job`.
    fn read_old(&self, job: &CowJob) -> Result<Vec<u8>, BlockError> {
        let cs = self.cluster_size();
        // A compressed cluster inflates into a buffer of its own; the
        // other sources fill a zeroed one.
        if let CowRead::Compressed {
            file,
            desc,
            read_len,
            compression,
        } = &job.read
        {
            let mut input = vec![0u8; *read_len as usize];
            read_at(&**file, MetaKind::GuestData, desc.host_offset, &mut input)?;
            return inflate_cluster(*compression, &input, cs as usize).map_err(|reason| {
                BlockError::Decompress {
                    offset: desc.host_offset,
                    reason,
                }
            });
        }
        let mut buf = vec![0u8; cs as usize];
        match &job.read {
            CowRead::Backing => {
                if let Some(bk) = &self.backing {
                    bk.read(job.cluster, &mut buf)?;
                }
            }
            CowRead::Host(file, host) => read_at(&**file, MetaKind::GuestData, *host, &mut buf)?,
            CowRead::Compressed { .. } => {}
            CowRead::Subclusters { file, host, bitmap } => {
                let sub = cs / 32;
                for (i, chunk) in buf.chunks_mut(sub as usize).enumerate() {
                    let state = subcluster_state(*bitmap, i as u32).map_err(|r| self.invalid(r))?;
                    match (state, host) {
                        (SubclusterState::Allocated, Some(h)) => {
                            read_at(&**file, MetaKind::GuestData, h + i as u64 * sub, chunk)?
                        }
                        (SubclusterState::Allocated, None) => {
                            return Err(self.invalid("allocated subcluster without a cluster"))
                        }
                        (SubclusterState::Zero, _) => {}
                        (SubclusterState::Unallocated, _) => {
                            if let Some(bk) = &self.backing {
                                bk.read(job.cluster + i as u64 * sub, chunk)?;
                            }
                        }
                    }
                }
            }
        }
        Ok(buf)
    }
}
