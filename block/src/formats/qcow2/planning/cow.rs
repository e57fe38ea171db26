//! Copy-on-write sources of allocating writes, read outside the metadata
//! lock.
//!
//! While planning (under the lock) the write planner records one
//! [`CowJob`] per new cluster whose old contents must be copied around
//! the request's data: where the new cluster lives, which part the
//! request covers, and what the old contents are made of (backing image,
//! the old host cluster, a compressed cluster, or extended-L2
//! subclusters), with every host offset already checked. The plan's guest
//! clusters are then busy (in flight), so nothing can change their
//! mappings or free their old clusters; the lock is released and
//! [`CowReader::fill`] reads the old contents and adds the data writes
//! (head COW + data + tail COW) to the plan.

use std::sync::Arc;

use super::plan_builder::{CowJob, CowRead, PlanBuilder};
use crate::error::BlockError;
use crate::formats::qcow2::chain::Chain;
use crate::formats::qcow2::compression::compressed::inflate_cluster;
use crate::formats::qcow2::metadata::meta_io::{read_at, MetaKind};
use crate::formats::qcow2::on_disk::l2_entry::{subcluster_state, SubclusterState};
use crate::formats::WriteData;

/// Reads the old contents of new clusters; borrows the image's files and
/// backing image.
pub(crate) struct CowReader<'a> {
    chain: &'a Chain,
}

impl<'a> CowReader<'a> {
    pub fn new(chain: &'a Chain) -> Self {
        CowReader { chain }
    }

    /// Reads the old contents of every job (without the metadata lock)
    /// and adds the data writes to `b`.
    pub fn fill(&self, jobs: Vec<CowJob>, b: &mut PlanBuilder) -> Result<(), BlockError> {
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
            b.data(self.chain.data_file, job.host + start, parts);
        }
        Ok(())
    }

    /// The whole old cluster of `job`.
    fn read_old(&self, job: &CowJob) -> Result<Vec<u8>, BlockError> {
        let cs = self.chain.cluster_size();
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
                if let Some(bk) = &self.chain.backing {
                    bk.read(job.cluster, &mut buf)?;
                }
            }
            CowRead::Host(file, host) => read_at(&**file, MetaKind::GuestData, *host, &mut buf)?,
            CowRead::Compressed { .. } => {}
            CowRead::Subclusters { file, host, bitmap } => {
                let sub = cs / 32;
                for (i, chunk) in buf.chunks_mut(sub as usize).enumerate() {
                    let state =
                        subcluster_state(*bitmap, i as u32).map_err(|r| self.chain.invalid(r))?;
                    match (state, host) {
                        (SubclusterState::Allocated, Some(h)) => {
                            read_at(&**file, MetaKind::GuestData, h + i as u64 * sub, chunk)?
                        }
                        (SubclusterState::Allocated, None) => {
                            return Err(self
                                .chain
                                .invalid("allocated subcluster without a cluster"))
                        }
                        (SubclusterState::Zero, _) => {}
                        (SubclusterState::Unallocated, _) => {
                            if let Some(bk) = &self.chain.backing {
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
