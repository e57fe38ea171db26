//! Read planning: guest ranges to host extents, zeroes, compressed
//! clusters, or ranges of the backing image. [`ReadPlanner`] borrows the
//! image's [`Chain`] (which file holds guest data, the backing image) and,
//! under the lock, its tables; the queues' lock-free path (`queue_view`)
//! uses the same [`ReadPlanner::piece_of`] on its table snapshots.
//!
//! A guest range enters; `ReadPiece`s leave, in order. The L2 lookups run
//! under the image lock; backing ranges are planned by the backing image
//! after the lock is dropped and their file ids shifted into this image's
//! `files()` numbering. A guest cluster whose compressed data is still in
//! the compressed-cluster write cache (its L2 entry not yet published) is
//! copied out of the cache under the lock, inflated after it, and leaves
//! as a `ReadSource::Memory` piece: reads never write the cache out.

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::error::BlockError;
use crate::formats::qcow2::chain::Chain;
use crate::formats::qcow2::compression::compressed::{compressed_read_len, inflate_cluster};
use crate::formats::qcow2::compression::compressed_cache::CompressedCache;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::on_disk::geometry::ImageGeometry;
use crate::formats::qcow2::on_disk::l2_entry::{subcluster_state, L2Entry, SubclusterState};
use crate::formats::qcow2::state::{lock, State};
use crate::formats::{
    CompressedExtent, FileId, MemoryExtent, PlanCache, ReadPiece, ReadPlan, ReadSource,
};

/// One step of a read, before backing ranges and cached compressed
/// clusters are resolved.
enum Step {
    Piece(ReadPiece),
    Backing {
        offset: u64,
        len: u64,
    },
    /// `len` bytes from `offset_in_cluster` of guest cluster `guest`,
    /// whose compressed bytes (`packed`) are still in the write cache.
    Cached {
        guest: u64,
        len: u64,
        offset_in_cluster: usize,
        packed: Vec<u8>,
    },
}

/// Appends a piece, merging it with the last one when contiguous.
#[inline]
pub(crate) fn push_piece(plan: &mut ReadPlan, piece: ReadPiece) {
    if piece.len == 0 {
        return;
    }
    if let Some(last) = plan.last_mut() {
        if merge_into(last, &piece) {
            return;
        }
    }
    plan.push(piece);
}

/// Extends `last` by `piece` when it continues it (zeroes after zeroes,
/// or the next bytes of the same file); says whether it did.
fn merge_into(last: &mut ReadPiece, piece: &ReadPiece) -> bool {
    let continues = match (&last.source, &piece.source) {
        (ReadSource::Zero, ReadSource::Zero) => true,
        (
            ReadSource::Host { file, offset },
            ReadSource::Host {
                file: f2,
                offset: o2,
            },
        ) => file == f2 && *offset + last.len == *o2,
        _ => false,
    };
    if continues {
        last.len += piece.len;
    }
    continues
}

/// See the module docs.
pub(crate) struct ReadPlanner<'a> {
    chain: &'a Chain,
}

impl<'a> ReadPlanner<'a> {
    pub fn new(chain: &'a Chain) -> Self {
        ReadPlanner { chain }
    }

    /// The image's path (errors about its entries name it).
    pub fn path(&self) -> &'a Path {
        &self.chain.path
    }

    /// Whether unallocated ranges read from a backing image.
    pub fn has_backing(&self) -> bool {
        self.chain.backing.is_some()
    }

    /// Plans a guest range (checked against the disk's size by the
    /// caller): the L2 lookups under the lock, then backing ranges and
    /// cached compressed clusters after it (`Format::plan_read`).
    pub fn plan(
        &self,
        state: &Mutex<State>,
        offset: u64,
        len: u64,
        plan: &mut ReadPlan,
    ) -> Result<(), BlockError> {
        let steps = {
            let mut st = lock(state);
            let st = &mut *st;
            if self.chain.backing.is_none() && st.compressed.is_empty() {
                // Every step is a piece: straight into the plan, with no
                // step list to allocate (the path of every read of an
                // image without a backing file or compressed writes).
                return self.map_pieces(&mut st.meta, offset, len, plan);
            }
            self.map_range(&mut st.meta, &st.compressed, offset, len)?
        };
        for step in steps {
            match step {
                Step::Piece(p) => push_piece(plan, p),
                Step::Backing { offset, len } => self.plan_backing(None, offset, len, plan)?,
                Step::Cached {
                    guest,
                    len,
                    offset_in_cluster,
                    packed,
                } => {
                    let h = &self.chain.header;
                    let cluster =
                        inflate_cluster(h.compression, &packed, h.cluster_size() as usize)
                            .map_err(|reason| BlockError::Decompress {
                                offset: guest,
                                reason: format!("the cached compressed cluster: {reason}"),
                            })?;
                    push_piece(
                        plan,
                        ReadPiece {
                            len,
                            source: ReadSource::Memory(MemoryExtent {
                                bytes: Arc::new(cluster),
                                offset: offset_in_cluster,
                            }),
                        },
                    );
                }
            }
        }
        Ok(())
    }

    /// `map_range` for an image with no backing file and nothing in the
    /// compressed write cache: each cluster's piece goes into `plan`.
    fn map_pieces(
        &self,
        meta: &mut MetaState,
        offset: u64,
        len: u64,
        plan: &mut ReadPlan,
    ) -> Result<(), BlockError> {
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let (piece, n) = self.map_cluster(meta, pos, end)?;
            // Unallocated reads as zeroes: there is no backing file.
            push_piece(
                plan,
                piece.unwrap_or(ReadPiece {
                    len: n,
                    source: ReadSource::Zero,
                }),
            );
            pos += n;
        }
        Ok(())
    }

    fn map_range(
        &self,
        meta: &mut MetaState,
        compressed: &CompressedCache,
        offset: u64,
        len: u64,
    ) -> Result<Vec<Step>, BlockError> {
        let cs = meta.geometry().cluster_size;
        let end = offset + len;
        let mut pos = offset;
        let mut steps: Vec<Step> = Vec::new();
        let push = |steps: &mut Vec<Step>, s: Step| {
            // Merge neighbouring backing ranges so the backing plans once.
            if let (Some(Step::Backing { len: l, .. }), Step::Backing { len: n, .. }) =
                (steps.last_mut(), &s)
            {
                *l += *n;
                return;
            }
            if let (Some(Step::Piece(last)), Step::Piece(p)) = (steps.last_mut(), &s) {
                if p.len == 0 || merge_into(last, p) {
                    return;
                }
            }
            steps.push(s);
        };
        while pos < end {
            let in_c = pos & (cs - 1);
            let n = (cs - in_c).min(end - pos);
            if let Some(packed) = compressed.pending_bytes(meta.io(), pos - in_c, cs)? {
                push(
                    &mut steps,
                    Step::Cached {
                        guest: pos - in_c,
                        len: n,
                        offset_in_cluster: in_c as usize,
                        packed,
                    },
                );
                pos += n;
                continue;
            }
            let (piece, n) = self.map_cluster(meta, pos, end)?;
            let step = match piece {
                Some(p) => Step::Piece(p),
                None => self.unallocated_step(pos, n),
            };
            push(&mut steps, step);
            pos += n;
        }
        Ok(steps)
    }

    /// The piece of the cluster (or subcluster) at guest `pos`, ending no
    /// later than `end` (`None`: unallocated, for the caller to take from
    /// the backing file or read as zeroes), and its length.
    fn map_cluster(
        &self,
        meta: &mut MetaState,
        pos: u64,
        end: u64,
    ) -> Result<(Option<ReadPiece>, u64), BlockError> {
        let (entry, bitmap) = meta.l2_entry(pos)?;
        self.piece_of(meta.geometry(), meta.file_size(), (entry, bitmap), pos, end)
    }

    /// The piece of the cluster (or subcluster) at guest `pos` whose
    /// checked L2 entry and bitmap are `entry`, in a file of `file_size`
    /// bytes (see `map_cluster`); shared by the locked lookups and the
    /// queues' table snapshots (`queue_view`).
    pub fn piece_of(
        &self,
        g: &ImageGeometry,
        file_size: u64,
        (entry, bitmap): (L2Entry, u64),
        pos: u64,
        end: u64,
    ) -> Result<(Option<ReadPiece>, u64), BlockError> {
        let cs = g.cluster_size;
        let in_c = pos & (cs - 1);
        let mut n = (cs - in_c).min(end - pos);
        let invalid = |reason: String| self.chain.invalid(reason);
        let zero = |len| ReadPiece {
            len,
            source: ReadSource::Zero,
        };
        let piece = if g.extended_l2 && !matches!(entry, L2Entry::Compressed(_)) {
            let sub = cs / 32;
            n = n.min(sub - (in_c % sub));
            let state = subcluster_state(bitmap, (in_c / sub) as u32)
                .map_err(|r| invalid(format!("guest offset {pos:#x}: {r}")))?;
            let host = match entry {
                L2Entry::Normal { host, .. }
                | L2Entry::Zero {
                    host: Some(host), ..
                } => Some(host),
                _ => None,
            };
            match (state, host) {
                (SubclusterState::Allocated, Some(h)) => Some(self.host_piece(h + in_c, n)),
                (SubclusterState::Allocated, None) => {
                    return Err(invalid(format!(
                        "guest offset {pos:#x}: allocated subcluster without a cluster"
                    )))
                }
                (SubclusterState::Zero, _) => Some(zero(n)),
                (SubclusterState::Unallocated, _) => None,
            }
        } else {
            match entry {
                L2Entry::Normal { host, .. } => Some(self.host_piece(host + in_c, n)),
                L2Entry::Zero { .. } => Some(zero(n)),
                L2Entry::Unallocated => None,
                L2Entry::Compressed(d) => {
                    if g.data_file {
                        return Err(invalid(
                            "compressed cluster in an image with an external data file".into(),
                        ));
                    }
                    Some(ReadPiece {
                        len: n,
                        source: ReadSource::Compressed(CompressedExtent {
                            file: FileId(0),
                            host_offset: d.host_offset,
                            compressed_len: compressed_read_len(&d, file_size),
                            algorithm: g.compression,
                            cluster_size: cs as u32,
                            offset_in_cluster: in_c as u32,
                        }),
                    })
                }
            }
        };
        Ok((piece, n))
    }

    fn host_piece(&self, offset: u64, len: u64) -> ReadPiece {
        ReadPiece {
            len,
            source: ReadSource::Host {
                file: self.chain.data_file,
                offset,
            },
        }
    }

    fn unallocated_step(&self, offset: u64, len: u64) -> Step {
        if self.chain.backing.is_some() {
            Step::Backing { offset, len }
        } else {
            Step::Piece(ReadPiece {
                len,
                source: ReadSource::Zero,
            })
        }
    }

    /// Plans `offset..offset+len` of the backing image (zeroes past its
    /// end), through the backing image's `plan_read_cached` when the
    /// queue lends a `cache` for it.
    pub fn plan_backing(
        &self,
        cache: Option<&mut PlanCache>,
        offset: u64,
        len: u64,
        plan: &mut ReadPlan,
    ) -> Result<(), BlockError> {
        let Some(b) = &self.chain.backing else {
            push_piece(
                plan,
                ReadPiece {
                    len,
                    source: ReadSource::Zero,
                },
            );
            return Ok(());
        };
        let bsize = b.image.size();
        let avail = bsize.saturating_sub(offset).min(len);
        if avail > 0 {
            let mut sub = ReadPlan::new();
            match cache {
                Some(c) => b.image.plan_read_cached(c, offset, avail, &mut sub)?,
                None => b.image.plan_read(offset, avail, &mut sub)?,
            }
            for mut p in sub {
                match &mut p.source {
                    ReadSource::Host { file, .. } => file.0 += self.chain.backing_base,
                    ReadSource::Compressed(c) => c.file.0 += self.chain.backing_base,
                    ReadSource::Zero | ReadSource::Memory(_) => {}
                }
                push_piece(plan, p);
            }
        }
        push_piece(
            plan,
            ReadPiece {
                len: len - avail,
                source: ReadSource::Zero,
            },
        );
        Ok(())
    }
}
