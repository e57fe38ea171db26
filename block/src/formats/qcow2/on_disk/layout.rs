//! The arithmetic of a qcow2 file's layout, in one place: how many L2
//! tables a disk needs, how large its L1 table is and the limit on it,
//! how many refcount blocks and refcount-table clusters count a given
//! number of clusters (themselves included), how many bytes a fully
//! allocated image takes, and how many its persistent bitmaps take.
//!
//! Pure arithmetic: a [`LayoutParams`] (cluster size, refcount width, L2
//! entry size) and sizes enter; counts of clusters or bytes leave.
//! Nothing here reads or writes a file. Its users:
//! - `create`: where the header, refcount table, refcount blocks, L1 and
//!   (with preallocation) L2 tables and data go;
//! - `refcount_layout`: the new refcount structures `check -r all`
//!   writes when the old ones are lost and `amend -o refcount_bits=`
//!   writes in the new width;
//! - `header` and the metadata checks: the limits [`MAX_L1_BYTES`] and
//!   [`MAX_REFTABLE_BYTES`] (qemu's);
//! - `ch-img measure`: [`LayoutParams::fully_allocated`] and
//!   [`bitmaps_size`], counted as `qemu-img measure` counts them.

use super::refcount::entries_per_block;

/// The largest L1 table qemu opens (32 MiB); a larger disk needs bigger
/// clusters.
pub const MAX_L1_BYTES: u64 = 32 << 20;

/// The largest refcount table qemu opens (8 MiB).
pub const MAX_REFTABLE_BYTES: u64 = 8 << 20;

/// Bytes of one L1 entry, one refcount table entry and one bitmap table
/// entry.
const TABLE_ENTRY: u64 = 8;

/// The fields of a bitmap directory entry before its name (qcow2 spec).
const BITMAP_ENTRY_HEADER: u64 = 24;

/// What sizing a persistent bitmap needs from its directory entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BitmapShape {
    /// One bit covers `1 << granularity_bits` bytes of the disk.
    pub granularity_bits: u8,
    /// Bytes of the bitmap's name.
    pub name_len: u16,
}

/// The layout parameters of a qcow2 image, as its creation options set
/// them: all the layout arithmetic needs. (An open image's fuller fixed
/// facts, read from its header, are `geometry::ImageGeometry`.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutParams {
    /// 9 (512-byte clusters) to 21 (2 MiB).
    pub cluster_bits: u32,
    /// Refcounts are `1 << refcount_order` bits wide (0 to 6).
    pub refcount_order: u32,
    /// 16-byte L2 entries (with the subcluster bitmap) instead of 8.
    pub extended_l2: bool,
}

/// Refcount structures, in clusters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefcountClusters {
    /// Refcount blocks.
    pub blocks: u64,
    /// Clusters of the refcount table.
    pub table: u64,
}

impl RefcountClusters {
    pub fn total(&self) -> u64 {
        self.blocks + self.table
    }
}

impl LayoutParams {
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// Bytes of one L2 entry.
    pub fn l2_entry_size(&self) -> u64 {
        if self.extended_l2 {
            16
        } else {
            8
        }
    }

    /// Entries of one L2 table (one cluster).
    pub fn l2_entries(&self) -> u64 {
        self.cluster_size() / self.l2_entry_size()
    }

    /// `bytes` rounded up to whole clusters (`None` past `u64`).
    pub fn round_up(&self, bytes: u64) -> Option<u64> {
        bytes.checked_next_multiple_of(self.cluster_size())
    }

    /// Clusters that hold `bytes` bytes.
    pub fn clusters(&self, bytes: u64) -> u64 {
        bytes.div_ceil(self.cluster_size())
    }

    /// L2 tables needed to map every cluster of `virtual_size` bytes: the
    /// entries of the L1 table.
    pub fn l2_tables(&self, virtual_size: u64) -> u64 {
        self.clusters(virtual_size).div_ceil(self.l2_entries())
    }

    /// Bytes of the L1 table's entries for a disk of `virtual_size` bytes
    /// (what qemu compares with [`MAX_L1_BYTES`]).
    pub fn l1_bytes(&self, virtual_size: u64) -> u64 {
        self.l2_tables(virtual_size) * TABLE_ENTRY
    }

    /// Whether a disk of `virtual_size` bytes has an L1 table qemu opens.
    pub fn l1_fits(&self, virtual_size: u64) -> bool {
        self.l1_bytes(virtual_size) <= MAX_L1_BYTES
    }

    /// Clusters of the L1 table of a disk of `virtual_size` bytes (none
    /// for an empty disk).
    pub fn l1_clusters(&self, virtual_size: u64) -> u64 {
        self.clusters(self.l1_bytes(virtual_size))
    }

    /// [`refcount_structures`] for these parameters.
    pub fn refcount_structures(&self, clusters: u64) -> RefcountClusters {
        refcount_structures(self.cluster_bits, self.refcount_order, clusters)
    }

    /// Bytes of an image whose every cluster of `virtual_size` bytes is
    /// allocated: header, L1 and L2 tables, refcounts and data. `None` if
    /// it does not fit in a `u64`.
    pub fn fully_allocated(&self, virtual_size: u64) -> Option<u64> {
        let cs = self.cluster_size();
        let data = self.round_up(virtual_size)?;
        let l2 = self.l2_tables(data).checked_mul(cs)?;
        let l1 = self.round_up(self.l1_bytes(data))?;
        let before_refcounts = cs.checked_add(l2)?.checked_add(l1)?;
        let clusters = before_refcounts.checked_add(data)? / cs;
        let refcounts = self.refcount_structures(clusters).total().checked_mul(cs)?;
        before_refcounts.checked_add(refcounts)?.checked_add(data)
    }
}

/// The refcount blocks and table clusters that count `clusters` other
/// clusters and themselves, with clusters of `1 << cluster_bits` bytes
/// and refcounts of `1 << refcount_order` bits: the smallest fixed point,
/// reached by adding what the last round's structures need until a round
/// adds nothing (none for no clusters).
pub fn refcount_structures(
    cluster_bits: u32,
    refcount_order: u32,
    clusters: u64,
) -> RefcountClusters {
    let per_block = entries_per_block(cluster_bits, refcount_order);
    let per_table_cluster = (1u64 << cluster_bits) / TABLE_ENTRY;
    let mut r = RefcountClusters {
        blocks: 0,
        table: 0,
    };
    loop {
        let blocks = (clusters + r.total()).div_ceil(per_block);
        let next = RefcountClusters {
            blocks,
            table: blocks.div_ceil(per_table_cluster),
        };
        if next == r {
            return r;
        }
        r = next;
    }
}

/// Bytes that copying `bitmaps` of a disk of `disk_size` bytes into an
/// image with `cluster_size` clusters takes, as qemu counts them: each
/// bitmap fully allocated plus its bitmap table in whole clusters, and
/// the bitmap directory in whole clusters.
/// A granularity past 2^63 bytes (a hostile directory) covers the disk
/// with one bit.
pub fn bitmaps_size(
    bitmaps: impl IntoIterator<Item = BitmapShape>,
    disk_size: u64,
    cluster_size: u64,
) -> u64 {
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

    const K64: LayoutParams = LayoutParams {
        cluster_bits: 16,
        refcount_order: 4,
        extended_l2: false,
    };

    fn params(cluster_size: u64, refcount_bits: u64, extended_l2: bool) -> LayoutParams {
        LayoutParams {
            cluster_bits: cluster_size.trailing_zeros(),
            refcount_order: refcount_bits.trailing_zeros(),
            extended_l2,
        }
    }

    fn bitmap(name_len: u16, granularity_bits: u8) -> BitmapShape {
        BitmapShape {
            granularity_bits,
            name_len,
        }
    }

    /// `qemu-img measure -O qcow2 -o cluster_size=C,refcount_bits=R[,extended_l2=on]
    /// --size S --output=json` (qemu-img 7.2): C, R, extended L2, S,
    /// "required", "fully-allocated".
    const QEMU_MEASURE: [(u64, u64, bool, u64, u64, u64); 30] = [
        (65536, 16, false, 0, 196608, 196608),
        (65536, 16, false, 1, 327680, 393216),
        (65536, 16, false, 1 << 30, 393216, 1074135040),
        (65536, 16, false, (1 << 30) + 1, 458752, 1074266112),
        (65536, 16, false, 100 << 30, 16646144, 107390828544),
        (512, 16, false, 0, 1536, 1536),
        (512, 16, false, 1, 2560, 3072),
        (512, 16, false, 1 << 30, 21385216, 1095127040),
        (512, 16, false, (1 << 30) + 1, 21386240, 1095128576),
        (512, 16, false, 100 << 30, 2138404352, 109512586752),
        (512, 64, false, 0, 1536, 1536),
        (512, 64, false, 1, 2560, 3072),
        (512, 64, false, 1 << 30, 34629120, 1108370944),
        (512, 64, false, (1 << 30) + 1, 34630144, 1108372480),
        (512, 64, false, 100 << 30, 3462825472, 110837007872),
        (2 << 20, 1, false, 0, 6291456, 6291456),
        (2 << 20, 1, false, 1, 10485760, 12582912),
        (2 << 20, 1, false, 1 << 30, 10485760, 1084227584),
        (2 << 20, 1, false, (1 << 30) + 1, 10485760, 1086324736),
        (2 << 20, 1, false, 100 << 30, 10485760, 107384668160),
        (65536, 16, true, 0, 196608, 196608),
        (65536, 16, true, 1, 327680, 393216),
        (65536, 16, true, 1 << 30, 524288, 1074266112),
        (65536, 16, true, (1 << 30) + 1, 589824, 1074397184),
        (65536, 16, true, 100 << 30, 29753344, 107403935744),
        (4096, 8, false, 0, 12288, 12288),
        (4096, 8, false, 1, 20480, 24576),
        (4096, 8, false, 1 << 30, 2375680, 1076117504),
        (4096, 8, false, (1 << 30) + 1, 2383872, 1076129792),
        (4096, 8, false, 100 << 30, 236457984, 107610640384),
    ];

    #[test]
    fn fully_allocated_and_metadata_match_qemu_img_measure() {
        for (cs, bits, ext, size, required, fully) in QEMU_MEASURE {
            let g = params(cs, bits, ext);
            let what = format!("cluster_size={cs},refcount_bits={bits},extended_l2={ext} {size}");
            assert_eq!(g.fully_allocated(size), Some(fully), "{what}");
            // With no data, what --size requires is the metadata alone.
            assert_eq!(fully - g.round_up(size).unwrap(), required, "{what}");
        }
    }

    #[test]
    fn empty_image_is_header_refblock_and_reftable() {
        assert_eq!(K64.fully_allocated(0), Some(3 * 65536));
        assert_eq!(K64.l1_clusters(0), 0);
    }

    #[test]
    fn one_gib_with_default_options() {
        // Header, two L2 tables, L1, one refcount block, refcount table.
        assert_eq!(K64.l2_tables(1 << 30), 2);
        assert_eq!(K64.l1_clusters(1 << 30), 1);
        assert_eq!(K64.fully_allocated(1 << 30), Some((1 << 30) + 6 * 65536));
        // One byte more needs a third L2 table.
        assert_eq!(
            K64.fully_allocated((1 << 30) + 1),
            Some((1 << 30) + 65536 + 7 * 65536)
        );
    }

    #[test]
    fn extended_l2_doubles_the_l2_tables() {
        let ext = LayoutParams {
            extended_l2: true,
            ..K64
        };
        assert_eq!(ext.l2_entries(), K64.l2_entries() / 2);
        assert_eq!(ext.l2_tables(1 << 30), 4);
        assert_eq!(ext.fully_allocated(1 << 30), Some((1 << 30) + 8 * 65536));
    }

    #[test]
    fn refcounts_count_themselves() {
        // 512-byte clusters, 64-bit refcounts: 64 refcounts a block, 64
        // table entries a table cluster. 4096 clusters need 66 blocks
        // (64 for the data, 2 for the blocks and table) and 2 table
        // clusters.
        let small = params(512, 64, false);
        let r = small.refcount_structures(4096);
        assert_eq!((r.blocks, r.table), (66, 2));
        assert_eq!(small.refcount_structures(0).total(), 0);
        assert_eq!(small.refcount_structures(1).total(), 2);
        // 1-bit refcounts: one block counts 4096 clusters.
        let one_bit = params(512, 1, false);
        assert_eq!(one_bit.refcount_structures(4094).total(), 2);
        assert_eq!(one_bit.refcount_structures(4095).total(), 3);
        // 64 KiB clusters, 16-bit refcounts: 10 clusters need one block
        // and one table cluster.
        assert_eq!(K64.refcount_structures(10).total(), 2);
    }

    #[test]
    fn every_count_is_a_fixed_point() {
        for (cs, bits) in [(512, 1), (512, 64), (4096, 8), (65536, 16), (2 << 20, 64)] {
            let g = params(cs, bits, false);
            for clusters in [1, 63, 64, 65, 4095, 4096, 1 << 20, 1 << 30] {
                let r = g.refcount_structures(clusters);
                let per_block = entries_per_block(g.cluster_bits, g.refcount_order);
                // Enough: the blocks count everything, the table holds
                // every block's entry.
                assert!(r.blocks * per_block >= clusters + r.total());
                assert!(r.table * (cs / TABLE_ENTRY) >= r.blocks);
                // Smallest: one block fewer would not do.
                assert!((r.blocks - 1) * per_block < clusters + r.total() - 1);
            }
        }
    }

    #[test]
    fn l1_limit_is_reached_at_128_gib_with_512_byte_clusters() {
        let small = params(512, 16, false);
        assert_eq!(small.l1_bytes(128 << 30), MAX_L1_BYTES);
        assert!(small.l1_fits(128 << 30));
        assert!(small.l1_bytes((128 << 30) + 512) > MAX_L1_BYTES);
        assert!(!small.l1_fits((128 << 30) + 512));
    }

    #[test]
    fn sizes_past_u64_are_refused() {
        let big = params(2 << 20, 16, false);
        assert_eq!(big.fully_allocated(u64::MAX), None);
        assert_eq!(big.round_up(u64::MAX - 1), None);
    }

    #[test]
    fn bitmaps_take_data_table_and_directory_clusters() {
        let bitmaps = [bitmap(2, 16), bitmap(40, 9)];
        // 100 MiB: 200 and 25600 bytes of bits.
        assert_eq!(bitmaps_size(bitmaps, 100 << 20, 65536), 5 * 65536);
        assert_eq!(
            bitmaps_size(bitmaps, 100 << 20, 512),
            (512 + 512) + (50 * 512 + 512) + 512
        );
        assert_eq!(bitmaps_size([], 100 << 20, 65536), 0);
        // A granularity past the disk: one bit, one data cluster.
        assert_eq!(bitmaps_size([bitmap(2, 64)], 100 << 20, 65536), 3 * 65536);
    }
}
