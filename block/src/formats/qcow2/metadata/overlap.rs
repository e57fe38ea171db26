//! The metadata map: which host clusters hold qcow2 metadata, so that no
//! write lands on them by mistake (QEMU's overlap check, its default
//! "cached" set: the header, the active L1 table, the refcount table, the
//! refcount blocks, the active L2 tables, the snapshot table, the
//! snapshots' L1 tables and the bitmap directory).
//!
//! Structures enter as (kind, offset, length) when the image is opened or
//! a table is allocated, moved or freed; queries take a byte range and the
//! kind the writer means to write (that kind may overlap), and answer the
//! first other kind found there. A sorted map of metadata clusters keeps
//! a query at one range lookup however large the image.

use std::collections::BTreeMap;

use super::meta_io::MetaKind;

/// Kinds tracked (every `MetaKind` but `GuestData`).
const TRACKED: [MetaKind; 8] = [
    MetaKind::Header,
    MetaKind::L1Table,
    MetaKind::L2Table,
    MetaKind::RefcountTable,
    MetaKind::RefcountBlock,
    MetaKind::SnapshotTable,
    MetaKind::SnapshotL1,
    MetaKind::BitmapDirectory,
];

fn slot(kind: MetaKind) -> Option<usize> {
    TRACKED.iter().position(|k| *k == kind)
}

/// Host cluster index -> how many structures of each tracked kind use it
/// (a damaged image may give one cluster to several).
#[derive(Debug, Default)]
pub(crate) struct MetadataMap {
    cluster_bits: u32,
    clusters: BTreeMap<u64, [u16; TRACKED.len()]>,
}

/// A write that would overwrite metadata it does not own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Overlap {
    pub kind: MetaKind,
    pub cluster: u64,
}

impl MetadataMap {
    pub fn new(cluster_bits: u32) -> Self {
        MetadataMap {
            cluster_bits,
            clusters: BTreeMap::new(),
        }
    }

    /// Cluster indexes of `offset..offset+len` (none for an empty range).
    fn span(&self, offset: u64, len: u64) -> Option<(u64, u64)> {
        if len == 0 {
            return None;
        }
        let last = offset.saturating_add(len - 1);
        Some((offset >> self.cluster_bits, last >> self.cluster_bits))
    }

    /// Records a structure of `kind` at `offset..offset+len`.
    pub fn add(&mut self, kind: MetaKind, offset: u64, len: u64) {
        let (Some(s), Some((first, last))) = (slot(kind), self.span(offset, len)) else {
            return;
        };
        // A hostile header may claim a huge table; the open path bounds
        // every table size before it gets here.
        for c in first..=last {
            let e = self.clusters.entry(c).or_default();
            e[s] = e[s].saturating_add(1);
        }
    }

    /// Forgets one structure of `kind` at `offset..offset+len`.
    pub fn remove(&mut self, kind: MetaKind, offset: u64, len: u64) {
        let (Some(s), Some((first, last))) = (slot(kind), self.span(offset, len)) else {
            return;
        };
        for c in first..=last {
            if let Some(e) = self.clusters.get_mut(&c) {
                e[s] = e[s].saturating_sub(1);
                if e.iter().all(|n| *n == 0) {
                    self.clusters.remove(&c);
                }
            }
        }
    }

    /// Host cluster `c` was freed (refcount 0): it holds no metadata now.
    pub fn forget_cluster(&mut self, c: u64) {
        if !self.clusters.is_empty() {
            self.clusters.remove(&c);
        }
    }

    /// The first tracked structure other than `writing` in
    /// `offset..offset+len` (`writing` None: guest data, owns nothing).
    pub fn overlap(&self, offset: u64, len: u64, writing: Option<MetaKind>) -> Option<Overlap> {
        let (first, last) = self.span(offset, len)?;
        let own = writing.and_then(slot);
        self.clusters
            .range(first..=last)
            .find_map(|(&cluster, counts)| {
                counts
                    .iter()
                    .enumerate()
                    .find(|(i, n)| **n > 0 && Some(*i) != own)
                    .map(|(i, _)| Overlap {
                        kind: TRACKED[i],
                        cluster,
                    })
            })
    }

    /// Metadata clusters tracked (tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.clusters.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlaps_name_the_other_kind() {
        let mut m = MetadataMap::new(16);
        m.add(MetaKind::Header, 0, 65536);
        m.add(MetaKind::L1Table, 0x30000, 8 * 10);
        m.add(MetaKind::L2Table, 0x50000, 65536);
        assert_eq!(m.overlap(0x10000, 0x20000, None), None);
        assert_eq!(
            m.overlap(0x2ffff, 2, None),
            Some(Overlap {
                kind: MetaKind::L1Table,
                cluster: 3
            })
        );
        // A table may write itself, not its neighbours.
        assert_eq!(m.overlap(0x50008, 8, Some(MetaKind::L2Table)), None);
        assert_eq!(
            m.overlap(0x30000, 8, Some(MetaKind::L2Table))
                .map(|o| o.kind),
            Some(MetaKind::L1Table)
        );
        assert_eq!(
            m.overlap(100, 8, Some(MetaKind::L2Table)).map(|o| o.kind),
            Some(MetaKind::Header)
        );
        assert_eq!(m.overlap(0x40000, 0, None), None);
    }

    #[test]
    fn shared_clusters_are_counted_and_freed_clusters_forgotten() {
        let mut m = MetadataMap::new(16);
        m.add(MetaKind::L2Table, 0x50000, 65536);
        m.add(MetaKind::L2Table, 0x50000, 65536);
        m.remove(MetaKind::L2Table, 0x50000, 65536);
        assert!(m.overlap(0x50000, 1, None).is_some());
        m.remove(MetaKind::L2Table, 0x50000, 65536);
        assert_eq!(m.len(), 0);
        m.add(MetaKind::RefcountBlock, 0x60000, 65536);
        m.forget_cluster(6);
        assert_eq!(m.overlap(0x60000, 65536, None), None);
    }
}
