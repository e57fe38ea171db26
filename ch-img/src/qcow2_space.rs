//! How many bytes a qcow2 image takes in its file, counted the way
//! `qemu-img measure` counts them.
//!
//! Pure arithmetic: a [`Qcow2Layout`] (cluster size, refcount width, L2
//! entry size) and a virtual size enter; byte counts leave. A fully
//! allocated image holds one header cluster, the L2 tables for every
//! cluster of the disk, the L1 table pointing at them, the refcount
//! blocks and table covering every cluster (themselves included) and the
//! data clusters. Persistent bitmaps are counted apart ([`bitmaps_size`]).

use block::formats::qcow2::bitmap_directory::BitmapEntry;

/// The largest L1 table qemu opens (32 MiB); a larger disk needs bigger
/// clusters.
pub const MAX_L1_BYTES: u64 = 32 << 20;

/// Bytes of one L1 entry, one refcount table entry and one bitmap table
/// entry.
const TABLE_ENTRY: u64 = 8;

/// The fields of a bitmap directory entry before its name (qcow2 spec).
const BITMAP_ENTRY_HEADER: u64 = 24;

/// The geometry of a qcow2 image, as its creation options set it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Qcow2Layout {
    /// A power of two from 512 to 2 MiB.
    pub cluster_size: u64,
    /// A power of two from 1 to 64.
    pub refcount_bits: u64,
    /// 16-byte L2 entries (with the subcluster bitmap) instead of 8.
    pub extended_l2: bool,
}

impl Qcow2Layout {
    fn l2_entry_size(&self) -> u64 {
        if self.extended_l2 {
            16
        } else {
            8
        }
    }

    /// `bytes` rounded up to whole clusters (`None` past `u64`).
    pub fn round_up(&self, bytes: u64) -> Option<u64> {
        bytes.checked_next_multiple_of(self.cluster_size)
    }

    /// L2 tables needed to map every cluster of `virtual_size` bytes.
    pub fn l2_tables(&self, virtual_size: u64) -> u64 {
        let clusters = virtual_size.div_ceil(self.cluster_size);
        clusters.div_ceil(self.cluster_size / self.l2_entry_size())
    }

    /// Bytes of the L1 table's entries for a disk of `virtual_size` bytes
    /// (what qemu compares with [`MAX_L1_BYTES`]).
    pub fn l1_bytes(&self, virtual_size: u64) -> u64 {
        self.l2_tables(virtual_size) * TABLE_ENTRY
    }

    /// Bytes of an image whose every cluster of `virtual_size` bytes is
    /// allocated: metadata and data. `None` if it does not fit in a `u64`.
    pub fn fully_allocated(&self, virtual_size: u64) -> Option<u64> {
        let cs = self.cluster_size;
        let data = self.round_up(virtual_size)?;
        let l2 = self.l2_tables(data).checked_mul(cs)?;
        let l1 = self.round_up(self.l1_bytes(data))?;
        let before_refcounts = cs.checked_add(l2)?.checked_add(l1)?;
        let clusters = before_refcounts.checked_add(data)? / cs;
        let refcounts = self.refcount_clusters(clusters).checked_mul(cs)?;
        before_refcounts.checked_add(refcounts)?.checked_add(data)
    }

    /// Clusters of refcount blocks plus refcount table needed to count
    /// `clusters` other clusters and themselves: the smallest fixed point,
    /// reached by adding what the last round's structures need until a
    /// round adds nothing.
    pub fn refcount_clusters(&self, clusters: u64) -> u64 {
        let per_block = self.cluster_size * 8 / self.refcount_bits;
        let per_table_cluster = self.cluster_size / TABLE_ENTRY;
        let (mut blocks, mut table) = (0u64, 0u64);
        loop {
            let next_blocks = (clusters + blocks + table).div_ceil(per_block);
            let next_table = next_blocks.div_ceil(per_table_cluster);
            if (next_blocks, next_table) == (blocks, table) {
                return blocks + table;
            }
            (blocks, table) = (next_blocks, next_table);
        }
    }
}

/// Bytes that copying `bitmaps` of a disk of `disk_size` bytes into an
/// image with `cluster_size` clusters takes, as qemu counts them: each
/// bitmap fully allocated plus its bitmap table in whole clusters, and
/// the bitmap directory in whole clusters.
/// A granularity past 2^63 bytes (a hostile directory) covers the disk
/// with one bit.
pub fn bitmaps_size(bitmaps: &[BitmapEntry], disk_size: u64, cluster_size: u64) -> u64 {
    let mut total = 0;
    let mut directory = 0;
    for b in bitmaps {
        let bits = match 1u64.checked_shl(u32::from(b.granularity_bits)) {
            Some(granularity) => disk_size.div_ceil(granularity),
            None => u64::from(disk_size > 0),
        };
        let clusters = bits.div_ceil(8).div_ceil(cluster_size);
        total += clusters * cluster_size;
        total += (clusters * TABLE_ENTRY).next_multiple_of(cluster_size);
        directory += (BITMAP_ENTRY_HEADER + u64::from(b.name_len)).next_multiple_of(8);
    }
    total + directory.next_multiple_of(cluster_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bitmap(name_len: u16, granularity_bits: u8) -> BitmapEntry {
        BitmapEntry {
            table_offset: 0,
            table_entries: 0,
            flags: 0,
            granularity_bits,
            name_len,
            bitmap_type: 1,
            extra_data_size: 0,
            name: String::new(),
        }
    }

    const K64: Qcow2Layout = Qcow2Layout {
        cluster_size: 65536,
        refcount_bits: 16,
        extended_l2: false,
    };

    #[test]
    fn empty_image_is_header_refblock_and_reftable() {
        assert_eq!(K64.fully_allocated(0), Some(3 * 65536));
    }

    #[test]
    fn one_gib_with_default_options() {
        // Header, two L2 tables, L1, one refcount block, refcount table.
        assert_eq!(K64.fully_allocated(1 << 30), Some((1 << 30) + 6 * 65536));
        // One byte more needs a third L2 table.
        assert_eq!(
            K64.fully_allocated((1 << 30) + 1),
            Some((1 << 30) + 65536 + 7 * 65536)
        );
    }

    #[test]
    fn extended_l2_doubles_the_l2_tables() {
        let ext = Qcow2Layout {
            extended_l2: true,
            ..K64
        };
        assert_eq!(K64.l2_tables(1 << 30), 2);
        assert_eq!(ext.l2_tables(1 << 30), 4);
        assert_eq!(ext.fully_allocated(1 << 30), Some((1 << 30) + 8 * 65536));
    }

    #[test]
    fn refcounts_count_themselves() {
        // 512-byte clusters, 64-bit refcounts: 64 refcounts a block, 64
        // table entries a table cluster. 4096 clusters need 66 blocks
        // (64 for the data, 2 for the blocks and table) and 2 table
        // clusters.
        let small = Qcow2Layout {
            cluster_size: 512,
            refcount_bits: 64,
            extended_l2: false,
        };
        assert_eq!(small.refcount_clusters(4096), 66 + 2);
        assert_eq!(small.refcount_clusters(0), 0);
        assert_eq!(small.refcount_clusters(1), 2);
        // 1-bit refcounts: one block counts 4096 clusters.
        let one_bit = Qcow2Layout {
            refcount_bits: 1,
            cluster_size: 512,
            ..small
        };
        assert_eq!(one_bit.refcount_clusters(4094), 2);
        assert_eq!(one_bit.refcount_clusters(4095), 3);
    }

    #[test]
    fn l1_limit_is_reached_at_128_gib_with_512_byte_clusters() {
        let small = Qcow2Layout {
            cluster_size: 512,
            ..K64
        };
        assert_eq!(small.l1_bytes(128 << 30), MAX_L1_BYTES);
        assert!(small.l1_bytes((128 << 30) + 512) > MAX_L1_BYTES);
    }

    #[test]
    fn sizes_past_u64_are_refused() {
        let big = Qcow2Layout {
            cluster_size: 2 << 20,
            ..K64
        };
        assert_eq!(big.fully_allocated(u64::MAX), None);
        assert_eq!(big.round_up(u64::MAX - 1), None);
    }

    #[test]
    fn bitmaps_take_data_table_and_directory_clusters() {
        let bitmaps = [bitmap(2, 16), bitmap(40, 9)];
        // 100 MiB: 200 and 25600 bytes of bits.
        assert_eq!(bitmaps_size(&bitmaps, 100 << 20, 65536), 5 * 65536);
        assert_eq!(
            bitmaps_size(&bitmaps, 100 << 20, 512),
            (512 + 512) + (50 * 512 + 512) + 512
        );
        assert_eq!(bitmaps_size(&[], 100 << 20, 65536), 0);
        // A granularity past the disk: one bit, one data cluster.
        assert_eq!(bitmaps_size(&[bitmap(2, 64)], 100 << 20, 65536), 3 * 65536);
    }
}
