//! A complete new set of refcount structures (table and blocks), placed
//! after everything in the file and counting themselves: what `check -r
//! all` writes when the old ones are lost, and what `amend -o
//! refcount_bits=` writes in the new width.
//!
//! The first free cluster, the cluster size and the refcount width enter
//! [`RefcountLayout::fit`] (how many blocks and table clusters: the fixed
//! point of [`crate::formats::qcow2::on_disk::layout`], since they count themselves); the refcount
//! of every cluster before them enters [`RefcountLayout::write`], which writes the
//! blocks, then the table, through the metadata-I/O seam. Nothing points
//! at the new structures until the caller switches the header to them
//! (after a barrier), so a failure before that leaves the old ones in use
//! and the new ones past the old end of the file.

use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta_io::{write_at, MetaIo, MetaKind};
use crate::formats::qcow2::on_disk::layout::{refcount_structures, MAX_REFTABLE_BYTES};
use crate::formats::qcow2::on_disk::refcount::{entries_per_block, write_refcount_entry};

/// Where new refcount structures go, in clusters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RefcountLayout {
    pub cluster_bits: u32,
    pub order: u32,
    /// First cluster of the new blocks; every cluster before it is
    /// counted by the caller.
    pub start: u64,
    pub blocks: u64,
    pub table_clusters: u64,
}

impl RefcountLayout {
    /// The blocks and table that count `start` clusters (at least the
    /// header's) and themselves ([`refcount_structures`]).
    pub fn fit(start: u64, cluster_bits: u32, order: u32) -> Result<Self, BlockError> {
        let cs = 1u64 << cluster_bits;
        let needed = refcount_structures(cluster_bits, order, start.max(1));
        let (blocks, table) = (needed.blocks, needed.table);
        if table * cs > MAX_REFTABLE_BYTES {
            return Err(BlockError::NoSpace(format!(
                "a refcount table of {table} clusters would exceed qcow2's limit"
            )));
        }
        Ok(RefcountLayout {
            cluster_bits,
            order,
            start,
            blocks,
            table_clusters: table,
        })
    }

    /// Clusters of the file once the structures are written.
    pub fn end(&self) -> u64 {
        self.start + self.blocks + self.table_clusters
    }

    /// Byte offset of the new table.
    pub fn table_offset(&self) -> u64 {
        (self.start + self.blocks) << self.cluster_bits
    }

    /// Writes every block (the refcount `count(c)` for each cluster `c`
    /// before `start`, 1 for the new structures) and then the table;
    /// `progress(done, total)` after each block. `count` returns values
    /// that fit the width (the caller checked).
    pub fn write(
        &self,
        io: &dyn MetaIo,
        count: &mut dyn FnMut(u64) -> Result<u64, BlockError>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), BlockError> {
        let cs = 1u64 << self.cluster_bits;
        let per_block = entries_per_block(self.cluster_bits, self.order);
        let end = self.end();
        let mut block = vec![0u8; cs as usize];
        for b in 0..self.blocks {
            block.fill(0);
            let first = b * per_block;
            for c in first..(first + per_block).min(end) {
                let value = if c >= self.start { 1 } else { count(c)? };
                if value != 0 {
                    write_refcount_entry(&mut block, (c - first) as usize, self.order, value);
                }
            }
            write_at(io, MetaKind::RefcountBlock, (self.start + b) * cs, &block)?;
            progress(b + 1, self.blocks);
        }
        let mut table = vec![0u8; (self.table_clusters * cs) as usize];
        for b in 0..self.blocks {
            let at = (b * 8) as usize;
            table[at..at + 8].copy_from_slice(&((self.start + b) * cs).to_be_bytes());
        }
        write_at(io, MetaKind::RefcountTable, self.table_offset(), &table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_count_themselves() {
        // 64 KiB clusters, 16-bit refcounts: one block counts 32768
        // clusters, so 10 clusters need one block and one table cluster.
        let l = RefcountLayout::fit(10, 16, 4).unwrap();
        assert_eq!((l.blocks, l.table_clusters, l.end()), (1, 1, 12));
        // 512-byte clusters, 64-bit refcounts: 64 entries per block; the
        // blocks themselves push the count over a block boundary.
        let l = RefcountLayout::fit(63, 9, 6).unwrap();
        assert_eq!((l.blocks, l.table_clusters), (2, 1));
        assert!(l.end() <= l.blocks * 64);
        // One-bit refcounts pack 4096 entries per 512-byte block.
        let l = RefcountLayout::fit(5000, 9, 0).unwrap();
        assert_eq!(l.blocks, 2);
    }
}
