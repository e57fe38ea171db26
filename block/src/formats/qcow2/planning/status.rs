//! Block status (`Format::block_status`, `qemu-img map`): [`StatusWalker`]
//! walks the clusters of a range under the image lock, merges those of the
//! same kind (and contiguous host offsets) into one run, and asks the
//! backing image about a run this image leaves unallocated.
//!
//! A guest range enters; one `BlockStatus` run leaves, as long as the
//! clusters from its start keep the same kind. A metadata-preallocated
//! image (`prealloc_detect`) reports a data run the file holds as a hole
//! as zeroes.

use std::sync::Mutex;

use super::prealloc_detect;
use crate::error::BlockError;
use crate::formats::qcow2::chain::Chain;
use crate::formats::qcow2::on_disk::l2_entry::{subcluster_state, L2Entry, SubclusterState};
use crate::formats::qcow2::state::{lock, State};
use crate::formats::{BlockStatus, FileId};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Data(u64),
    /// Reads as zeroes; keeps its host cluster when it has one.
    Zero(Option<u64>),
    Compressed,
    Unallocated,
}

/// See the module docs.
pub(crate) struct StatusWalker<'a> {
    chain: &'a Chain,
}

impl<'a> StatusWalker<'a> {
    pub fn new(chain: &'a Chain) -> Self {
        StatusWalker { chain }
    }

    /// The status of the run starting at `offset` (the range checked
    /// against the disk's size by the caller), at most `len` bytes.
    pub fn status(
        &self,
        state: &Mutex<State>,
        offset: u64,
        len: u64,
    ) -> Result<BlockStatus, BlockError> {
        let end = offset + len;
        let (kind, run, prealloc) = {
            let mut st = lock(state);
            let prealloc = match st.metadata_prealloc {
                Some(p) => p,
                None => {
                    let p = prealloc_detect::looks_metadata_preallocated(
                        &mut st.meta,
                        &self.chain.files.local()[0],
                    );
                    st.metadata_prealloc = Some(p);
                    p
                }
            };
            let (kind, mut n) = self.kind_at(&mut st, offset)?;
            n = n.min(len);
            while offset + n < end {
                let (k, m) = self.kind_at(&mut st, offset + n)?;
                let same = match (kind, k) {
                    (Kind::Data(a), Kind::Data(b)) => a + n == b,
                    (Kind::Zero(Some(a)), Kind::Zero(Some(b))) => a + n == b,
                    (a, b) => a == b,
                };
                if !same {
                    break;
                }
                n = (n + m).min(len);
            }
            (kind, n, prealloc)
        };
        let data_file = self.chain.data_file;
        let file = Some(data_file);
        Ok(match kind {
            Kind::Data(host) => {
                // Metadata preallocation: a hole in the file reads as zero.
                let (run, zero) = if prealloc {
                    prealloc_detect::file_extent(
                        &self.chain.files.local()[usize::from(data_file.0)],
                        host,
                        run,
                    )
                } else {
                    (run, false)
                };
                BlockStatus {
                    len: run,
                    depth: 0,
                    present: true,
                    zero,
                    data: true,
                    compressed: false,
                    offset: Some(host),
                    file,
                }
            }
            Kind::Zero(host) => BlockStatus {
                len: run,
                depth: 0,
                present: true,
                zero: true,
                data: false,
                compressed: false,
                offset: host,
                file: host.and(file),
            },
            Kind::Compressed => BlockStatus {
                len: run,
                depth: 0,
                present: true,
                zero: false,
                data: true,
                compressed: true,
                offset: None,
                file: Some(FileId(0)),
            },
            Kind::Unallocated => self.backing_status(offset, run)?,
        })
    }

    fn kind_at(&self, st: &mut State, guest: u64) -> Result<(Kind, u64), BlockError> {
        let meta = &mut st.meta;
        let cs = meta.geometry().cluster_size;
        let in_c = guest & (cs - 1);
        // Compressed data still in the write cache: what reads return.
        if st.compressed.is_pending(guest - in_c) {
            return Ok((Kind::Compressed, cs - in_c));
        }
        // A missing L2 table: the whole range it would map is unallocated.
        if let Some(n) = meta.unmapped_run(guest)? {
            return Ok((Kind::Unallocated, n));
        }
        let (e, bitmap) = meta.l2_entry(guest)?;
        if meta.geometry().extended_l2 && !matches!(e, L2Entry::Compressed(_)) {
            let sub = cs / 32;
            let n = sub - in_c % sub;
            let st = subcluster_state(bitmap, (in_c / sub) as u32).map_err(|r| meta.invalid(r))?;
            let host = match e {
                L2Entry::Normal { host, .. }
                | L2Entry::Zero {
                    host: Some(host), ..
                } => host,
                _ => 0,
            };
            return Ok(match st {
                SubclusterState::Allocated => (Kind::Data(host + in_c), n),
                SubclusterState::Zero => (Kind::Zero((host != 0).then_some(host + in_c)), n),
                SubclusterState::Unallocated => (Kind::Unallocated, n),
            });
        }
        let n = cs - in_c;
        Ok(match e {
            L2Entry::Normal { host, .. } => (Kind::Data(host + in_c), n),
            L2Entry::Zero { host, .. } => (Kind::Zero(host.map(|h| h + in_c)), n),
            L2Entry::Compressed(_) => (Kind::Compressed, n),
            L2Entry::Unallocated => (Kind::Unallocated, n),
        })
    }

    fn backing_status(&self, offset: u64, len: u64) -> Result<BlockStatus, BlockError> {
        let unallocated = |len, depth| BlockStatus {
            len,
            depth,
            present: false,
            zero: true,
            data: false,
            compressed: false,
            offset: None,
            file: None,
        };
        let Some(b) = &self.chain.backing else {
            return Ok(unallocated(len, 0));
        };
        let bsize = b.image.size();
        // Past the backing image's end this layer already knows the range
        // reads as zeroes: depth 0, as qemu-img map reports it.
        if offset >= bsize {
            return Ok(unallocated(len, 0));
        }
        let mut s = b.image.block_status(offset, len.min(bsize - offset))?;
        s.depth += 1;
        if let Some(f) = &mut s.file {
            f.0 += self.chain.backing_base;
        }
        Ok(s)
    }
}
