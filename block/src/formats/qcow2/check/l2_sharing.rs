//! How many L1 entries point at each L2 table, counted before the check
//! walks the tables, so that every L2 table is walked once however many
//! L1 entries (of the active table and the snapshots' tables) share it.
//!
//! Without it a check re-reads and re-decodes a shared L2 table for each
//! reference: a snapshot shares most of its tables with the active disk,
//! and a hostile image can point every entry of a large L1 table at one
//! L2 table (a 1.3 MiB file with 131,072 L1 entries on one 64 KiB table
//! took a minute; qemu-img check took 21 s). With the counts the walk
//! adds each table's references once, multiplied, so it reads at most
//! the distinct tables, which lie in the file: the work is bounded by
//! the file's size, not by what the tables claim.
//!
//! The L1 tables enter (offset, entries, whether the table is the active
//! one); an [`L2Sharing`] leaves. This pass is silent: the walk itself
//! reports what is wrong with the tables, in qemu-img's order.

use std::collections::HashMap;
use std::fs::File;

use crate::formats::qcow2::metadata::meta_io::{be64_at, read_at, MetaKind};
use crate::formats::qcow2::on_disk::l2_entry::decode_l1;

/// L1 entry bits that must be zero (qcow2 spec: 1-8 and 56-62).
pub(super) const L1_RESERVED: u64 = 0x7f00_0000_0000_01fe;

/// References to one L2 table: from the active L1 table, and in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Sharing {
    pub active: u32,
    pub total: u32,
}

/// References per L2 table offset.
#[derive(Debug, Default)]
pub(super) struct L2Sharing(HashMap<u64, Sharing>);

impl L2Sharing {
    /// Counts the L2 references of `tables` (offset, entries, active) of a
    /// file of `file_size` bytes with `cluster_size` clusters: the L2
    /// offsets the walk would follow (decodable, inside the file). A table
    /// that cannot be read counts nothing (the walk reports it).
    pub fn count(
        file: &File,
        tables: &[(u64, u32, bool)],
        file_size: u64,
        cluster_size: u64,
    ) -> Self {
        let mut map: HashMap<u64, Sharing> = HashMap::new();
        for &(offset, entries, active) in tables {
            let mut l1 = vec![0u8; entries as usize * 8];
            if read_at(file, MetaKind::L1Table, offset, &mut l1).is_err() {
                continue;
            }
            for i in 0..entries as usize {
                let raw = be64_at(&l1, i) & !L1_RESERVED;
                let Ok(Some((l2, _))) = decode_l1(raw, cluster_size) else {
                    continue;
                };
                if l2.checked_add(cluster_size).is_none_or(|e| e > file_size) {
                    continue;
                }
                let s = map.entry(l2).or_default();
                s.total = s.total.saturating_add(1);
                if active {
                    s.active = s.active.saturating_add(1);
                }
            }
        }
        L2Sharing(map)
    }

    /// The references to the L2 table at `offset` (at least one, from
    /// the table being walked, if the count missed it).
    pub fn of(&self, offset: u64, active: bool) -> Sharing {
        self.0.get(&offset).copied().unwrap_or(Sharing {
            active: u32::from(active),
            total: 1,
        })
    }
}
