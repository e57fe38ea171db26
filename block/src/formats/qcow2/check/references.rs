//! Counting every reference a qcow2 image makes to its host clusters.
//!
//! The header fields and the file enter; a per-cluster reference count
//! leaves in [`References`], along with qemu-img's findings (unaligned or
//! out-of-file tables, COPIED flags to verify, allocation statistics) in
//! [`Findings`]. Nothing here writes to the image.
//!
//! Each L2 table is walked once, at its first reference, and its
//! references are counted as many times as L1 entries point at it
//! ([`super::l2_sharing`], counted before the walk): the walk reads each
//! table of the file at most once, whatever the L1 tables claim.

use std::collections::HashSet;
use std::fs::File;

use super::l2_sharing::{L2Sharing, L1_RESERVED};

use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta_io::{be64_at, read_at, MetaKind};
use crate::formats::qcow2::on_disk::header::Header;
use crate::formats::qcow2::on_disk::l2_entry::{
    decode_l1, decode_l2, L2Entry, OFLAG_COMPRESSED, OFLAG_COPIED, OFLAG_ZERO,
};
use crate::formats::qcow2::on_disk::layout::MAX_L1_BYTES;
use crate::formats::qcow2::on_disk::snapshot_table::{
    read_snapshot_table, SnapshotInfo, TableLocation, MAX_SNAPSHOTS,
};

/// Standard L2 entry bits that must be zero (1-8 and 56-61); with
/// extended L2 entries bit 0 too.
const L2_RESERVED: u64 = 0x3f00_0000_0000_01fe;
const L2_OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
/// Bytes of a snapshot table entry before its extra data and names.
const SNAPSHOT_ENTRY_FIXED: u64 = 40;

/// References per host cluster of the file (index = offset >> cluster_bits).
pub(super) struct References {
    pub refs: Vec<u32>,
    pub cluster_bits: u32,
    file_size: u64,
}

/// One table entry whose COPIED flag must match "refcount == 1".
pub(super) struct CopiedEntry {
    /// Host offset of the table (L1 or L2) and entry index in it.
    pub table: u64,
    pub index: u64,
    pub raw: u64,
    /// Host cluster the entry points at.
    pub host: u64,
    pub is_l1: bool,
    pub entry_size: u64,
}

/// What the walk found besides reference counts.
#[derive(Default)]
pub(super) struct Findings {
    pub corruptions: u64,
    pub check_errors: u64,
    pub allocated: u64,
    pub fragmented: u64,
    pub compressed: u64,
    pub messages: Vec<String>,
    pub copied: Vec<CopiedEntry>,
    /// The snapshot table could not be read (`-r all` drops it).
    pub bad_snapshot_table: bool,
    /// Entries of a version 3 image without the extra data version 3
    /// requires (`-r all` rewrites the table).
    pub incomplete_snapshots: bool,
}

impl Findings {
    fn corrupt(&mut self, msg: String) {
        self.corruptions += 1;
        self.messages.push(msg);
    }
}

impl References {
    /// One counter per cluster of a file of `file_size` bytes.
    pub fn new(file_size: u64, cluster_bits: u32) -> Self {
        let clusters = file_size.div_ceil(1 << cluster_bits) as usize;
        References {
            refs: vec![0; clusters],
            cluster_bits,
            file_size,
        }
    }

    /// Counts one reference to every cluster of `offset..offset+len`. A
    /// region that ends less than a cluster past the end of the file (the
    /// last compressed cluster's sector count may) is counted up to the
    /// end; one cluster or more past it is a corruption, as in qemu-img.
    pub fn add(&mut self, offset: u64, len: u64, f: &mut Findings) {
        self.add_times(offset, len, 1, f);
    }

    /// [`Self::add`], counted `times` times (a table shared by several
    /// L1 entries counts its references once per entry).
    pub fn add_times(&mut self, offset: u64, len: u64, times: u32, f: &mut Findings) {
        if len == 0 || times == 0 {
            return;
        }
        let end = offset.saturating_add(len);
        if end.saturating_sub(self.file_size) >= 1 << self.cluster_bits {
            f.corrupt(format!(
                "ERROR: counting reference for region exceeding the end of the file by one cluster or more: offset {offset:#x} size {len:#x}"
            ));
            return;
        }
        let first = offset >> self.cluster_bits;
        let last = ((end - 1) >> self.cluster_bits).min(self.refs.len() as u64);
        for i in first..=last {
            if let Some(r) = self.refs.get_mut(i as usize) {
                *r = r.saturating_add(times);
            }
        }
    }
}

/// The walk over one image's tables.
pub(super) struct Walker<'a> {
    pub file: &'a File,
    pub header: &'a Header,
    pub file_size: u64,
    pub refs: References,
    pub findings: Findings,
    /// How many L1 entries point at each L2 table ([`Self::count_sharing`]).
    pub sharing: L2Sharing,
    /// L2 tables already walked (each is walked once).
    pub walked: HashSet<u64>,
}

impl Walker<'_> {
    fn cs(&self) -> u64 {
        self.header.cluster_size()
    }

    /// Counts an L1 table, its L2 tables and their clusters. `active`: the
    /// image's own L1 (statistics and COPIED flags), not a snapshot's.
    pub fn walk_l1(
        &mut self,
        l1_offset: u64,
        l1_size: u32,
        active: bool,
    ) -> Result<(), BlockError> {
        let bytes = u64::from(l1_size) * 8;
        self.refs.add(l1_offset, bytes, &mut self.findings);
        if bytes == 0 {
            return Ok(());
        }
        let mut l1 = vec![0u8; bytes as usize];
        read_at(self.file, MetaKind::L1Table, l1_offset, &mut l1)?;
        for i in 0..l1_size as usize {
            let raw = be64_at(&l1, i);
            if raw & L1_RESERVED != 0 {
                self.findings.corrupt(format!(
                    "ERROR found L1 entry with reserved bits set: {raw:x}"
                ));
            }
            match decode_l1(raw & !L1_RESERVED, self.cs()) {
                Ok(None) => {}
                Err(_) => self.findings.corrupt(format!(
                    "ERROR l2_offset={:x}: Table is not cluster aligned; L1 entry corrupted",
                    raw & 0x00ff_ffff_ffff_fe00
                )),
                Ok(Some((l2, _))) => {
                    self.refs.add(l2, self.cs(), &mut self.findings);
                    if active {
                        self.findings.copied.push(CopiedEntry {
                            table: l1_offset,
                            index: i as u64,
                            raw,
                            host: l2,
                            is_l1: true,
                            entry_size: 8,
                        });
                    }
                    if l2
                        .checked_add(self.cs())
                        .is_some_and(|e| e <= self.file_size)
                        && self.walked.insert(l2)
                    {
                        if let Err(e) = self.walk_l2(l2, active) {
                            self.findings.check_errors += 1;
                            self.findings
                                .messages
                                .push(format!("ERROR: I/O error in check_refcounts_l2: {e}"));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Walks one L2 table; its references count once per L1 entry that
    /// points at it, its statistics once per entry of the active L1 table.
    fn walk_l2(&mut self, l2_offset: u64, active: bool) -> Result<(), BlockError> {
        let h = self.header;
        let cs = self.cs();
        let shared = self.sharing.of(l2_offset, active);
        let (times, active_times) = (shared.total, u64::from(shared.active));
        let entry_size = h.l2_entry_size();
        let mut l2 = vec![0u8; cs as usize];
        read_at(self.file, MetaKind::L2Table, l2_offset, &mut l2)?;
        let mut next_contiguous = 0u64;
        let words = entry_size as usize / 8;
        for i in 0..(cs / entry_size) as usize {
            let raw = be64_at(&l2, i * words);
            let bitmap = if words == 2 {
                be64_at(&l2, i * 2 + 1)
            } else {
                0
            };
            let compressed = raw & OFLAG_COMPRESSED != 0;
            // A compressed entry's bits 56-61 are its sector count.
            let reserved = if compressed {
                0
            } else {
                L2_RESERVED | u64::from(h.extended_l2())
            };
            if raw & reserved != 0 {
                self.findings.corrupt(format!(
                    "ERROR found l2 entry with reserved bits set: {raw:x}"
                ));
            }
            // The version 2 zero flag is refused by reads (qemu marks the
            // image corrupt there); qemu-img check counts such an entry
            // as allocated and says nothing, and so do we.
            let v2_zero = if h.version < 3 && !compressed {
                OFLAG_ZERO
            } else {
                0
            };
            let entry = match decode_l2(
                raw & !reserved & !v2_zero,
                h.cluster_bits,
                h.version,
                h.extended_l2(),
            ) {
                Ok(e) => e,
                Err(_) if raw & OFLAG_COMPRESSED != 0 => {
                    self.findings.corrupt(format!(
                        "ERROR: compressed cluster entry {raw:#x} is invalid"
                    ));
                    continue;
                }
                Err(_) => {
                    // Counted where it points, as qemu-img does: the
                    // clusters it overlaps show as refcount errors too.
                    let host = raw & L2_OFFSET_MASK;
                    self.findings.corrupt(format!(
                        "ERROR offset={host:x}: Cluster is not properly aligned; L2 entry corrupted."
                    ));
                    if !h.has_data_file() {
                        self.refs.add_times(host, cs, times, &mut self.findings);
                    }
                    continue;
                }
            };
            // With an external data file, offset 0 is a real cluster: qemu
            // tells it from "unallocated" by the COPIED flag (data-file
            // clusters always have refcount 1).
            let entry = match entry {
                L2Entry::Unallocated if h.has_data_file() && raw & OFLAG_COPIED != 0 => {
                    L2Entry::Normal {
                        host: 0,
                        copied: true,
                    }
                }
                e => e,
            };
            if !self.subcluster_bitmap_ok(i, raw, bitmap, &entry) {
                continue;
            }
            match entry {
                L2Entry::Unallocated | L2Entry::Zero { host: None, .. } => {}
                L2Entry::Zero {
                    host: Some(host), ..
                }
                | L2Entry::Normal { host, .. } => {
                    if active {
                        self.findings.allocated += active_times;
                        if next_contiguous != 0 && host != next_contiguous {
                            self.findings.fragmented += active_times;
                        }
                        next_contiguous = host + cs;
                    }
                    if !h.has_data_file() {
                        self.refs.add_times(host, cs, times, &mut self.findings);
                        if active {
                            self.findings.copied.push(CopiedEntry {
                                table: l2_offset,
                                index: i as u64,
                                raw,
                                host,
                                is_l1: false,
                                entry_size,
                            });
                        }
                    }
                }
                L2Entry::Compressed(d) => {
                    if raw & OFLAG_COPIED != 0 {
                        self.findings.corrupt(format!(
                            "ERROR: coffset={:#x}: copied flag must never be set for compressed clusters",
                            d.host_offset
                        ));
                    }
                    if h.has_data_file() {
                        self.findings.corrupt(format!(
                            "ERROR compressed cluster {i} with data file, entry=0x{raw:x}"
                        ));
                        continue;
                    }
                    if active {
                        self.findings.allocated += active_times;
                        self.findings.compressed += active_times;
                        self.findings.fragmented += active_times;
                    }
                    // qemu's range: from the data's first byte to the end
                    // of its last sector.
                    self.refs
                        .add_times(d.host_offset, d.max_len, times, &mut self.findings);
                }
            }
        }
        Ok(())
    }

    /// qemu-img check's findings about an extended entry's subcluster
    /// bitmap; `false` when the entry is not to be counted further.
    fn subcluster_bitmap_ok(&mut self, i: usize, raw: u64, bitmap: u64, entry: &L2Entry) -> bool {
        const ALL_ALLOC: u64 = 0xffff_ffff;
        if !self.header.extended_l2() {
            return true;
        }
        match entry {
            L2Entry::Compressed(_) if bitmap != 0 => {
                self.findings.corrupt(format!(
                    "ERROR compressed cluster {i} with non-zero subcluster allocation bitmap, entry=0x{raw:x}"
                ));
                false
            }
            L2Entry::Normal { host, .. }
            | L2Entry::Zero {
                host: Some(host), ..
            } if (bitmap >> 32) & bitmap != 0 => {
                self.findings.corrupt(format!(
                    "ERROR offset={host:x}: Allocated cluster has corrupted subcluster allocation bitmap"
                ));
                true
            }
            L2Entry::Unallocated | L2Entry::Zero { host: None, .. } if bitmap & ALL_ALLOC != 0 => {
                self.findings.corrupt(
                    "ERROR: Unallocated cluster has non-zero subcluster allocation map".into(),
                );
                true
            }
            _ => true,
        }
    }

    /// Counts the snapshot table and every snapshot's L1 tree.
    pub fn walk_snapshots(&mut self) -> Result<(), BlockError> {
        let h = self.header;
        if h.nb_snapshots > MAX_SNAPSHOTS {
            // qemu-img cannot open such an image either.
            return Err(BlockError::InvalidImage {
                path: Default::default(),
                reason: format!("{} snapshots is more than qcow2 allows", h.nb_snapshots),
            });
        }
        let (entries, table_len) =
            match read_snapshot_table(self.file, TableLocation::of(h), self.file_size) {
                Ok(t) => t,
                Err(reason) => {
                    self.findings.corrupt(format!("ERROR: {reason}"));
                    self.findings.bad_snapshot_table = true;
                    // As qemu-img: the first entry's fixed part is still
                    // counted (a corruption of its own past the file's end).
                    self.refs
                        .add(h.snapshots_offset, SNAPSHOT_ENTRY_FIXED, &mut self.findings);
                    return Ok(());
                }
            };
        if entries.is_empty() {
            return Ok(());
        }
        if h.version >= 3 {
            for (n, e) in entries.iter().enumerate() {
                if e.disk_size.is_none() {
                    self.findings
                        .corrupt(format!("ERROR snapshot table entry {n} is incomplete"));
                    self.findings.incomplete_snapshots = true;
                }
            }
        }
        self.refs
            .add(h.snapshots_offset, table_len, &mut self.findings);
        for (n, off, size, valid) in self.snapshot_l1s(&entries) {
            if !valid {
                self.findings.corrupt(format!(
                    "ERROR: snapshot {n} has an invalid L1 table (offset {off:#x}, {size} entries)"
                ));
                continue;
            }
            self.walk_l1(off, size, false)?;
        }
        Ok(())
    }

    /// Each snapshot's L1 table (index, offset, entries) and whether the
    /// walk follows it. Real snapshots' L1 tables never overlap, so
    /// together they fit in the file: a table claiming more than is left
    /// is not walked (the walk stays bounded by the file's size).
    fn snapshot_l1s(&self, entries: &[SnapshotInfo]) -> Vec<(usize, u64, u32, bool)> {
        let mut budget = self.file_size;
        entries
            .iter()
            .enumerate()
            .map(|(n, e)| {
                let (off, size) = (e.l1_offset, e.l1_size);
                let bytes = u64::from(size) * 8;
                let valid = off.is_multiple_of(self.cs())
                    && bytes <= MAX_L1_BYTES
                    && off
                        .checked_add(bytes)
                        .is_some_and(|end| end <= self.file_size)
                    && bytes <= budget;
                if valid {
                    budget -= bytes;
                }
                (n, off, size, valid)
            })
            .collect()
    }

    /// Counts, before the walk, how many L1 entries point at each L2
    /// table: the active table's (`l1_offset`, `l1_size`) and the valid
    /// snapshots' (nothing is reported here; the walk reports).
    pub fn count_sharing(&mut self, l1_offset: u64, l1_size: u32) {
        let mut tables = vec![(l1_offset, l1_size, true)];
        if self.header.nb_snapshots <= MAX_SNAPSHOTS {
            let location = TableLocation::of(self.header);
            if let Ok((entries, _)) = read_snapshot_table(self.file, location, self.file_size) {
                tables.extend(
                    self.snapshot_l1s(&entries)
                        .into_iter()
                        .filter(|t| t.3)
                        .map(|(_, off, size, _)| (off, size, false)),
                );
            }
        }
        self.sharing = L2Sharing::count(self.file, &tables, self.file_size, self.cs());
    }
}
