//! The qcow2 check: count references, compare them with the stored
//! refcounts, verify COPIED flags, and repair what `-r` allows.
//!
//! The image path enters; a [`CheckReport`] leaves. Repairs are written
//! through the image's own descriptor (refcount blocks, L1/L2 entries,
//! header feature bits), synced, and then the image is checked again so
//! the report shows what is left, as qemu-img does.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use super::image_file::open_image;
use super::references::{Findings, References, Walker};
use crate::error::BlockError;
use crate::formats::check_report::{CheckReport, Repair};
use crate::formats::qcow2::bitmaps::bitmap_directory::bitmaps_of;
use crate::formats::qcow2::metadata::meta_io::{be64_at, read_at, sync, write_at, MetaKind};
use crate::formats::qcow2::on_disk::features::{INCOMPAT_CORRUPT, INCOMPAT_DIRTY};
use crate::formats::qcow2::on_disk::header::read_header_with;
use crate::formats::qcow2::on_disk::header::{Header, OFF_INCOMPAT};
use crate::formats::qcow2::on_disk::l2_entry::OFLAG_COPIED;
use crate::formats::qcow2::on_disk::refcount::{
    entries_per_block, max_refcount, read_refcount_entry, write_refcount_entry,
};

/// The in-memory reference table costs 4 bytes per host cluster; refuse
/// files that would need more than 1 GiB of it.
const MAX_CHECKED_CLUSTERS: u64 = 1 << 28;
/// Refcount table entries: bits 9..=63 hold the block offset.
const REFT_OFFSET_MASK: u64 = !511;

pub(crate) fn check(path: &Path, repair: Option<Repair>) -> Result<CheckReport, BlockError> {
    let first = check_once(path, repair)?;
    let mut messages = first.report.messages.clone();
    let mut fixes = first.fixes;
    let mut incomplete = first.incomplete_snapshots;
    if first.restructured && repair.is_some() {
        // New refcount structures (or a dropped snapshot table): the
        // refcounts and COPIED flags are repaired against them now.
        let second = check_once(path, repair)?;
        messages.extend(second.report.messages);
        fixes += second.fixes;
        incomplete = second.incomplete_snapshots;
    }
    if incomplete
        && repair == Some(Repair::All)
        && super::rebuild::rewrite_snapshot_table(path, &mut messages)?
    {
        fixes += 1;
    }
    let report = if fixes == 0 {
        first.report
    } else {
        let mut report = check_once(path, None)?.report;
        report.corruptions_fixed = first.report.corruptions.saturating_sub(report.corruptions);
        report.leaks_fixed = first.report.leaks.saturating_sub(report.leaks);
        messages.append(&mut report.messages);
        report.messages = messages;
        report
    };
    if let Some(mode) = repair {
        if report.corruptions == 0 && report.check_errors == 0 {
            clear_flags(path, mode)?;
        }
    }
    Ok(report)
}

struct Pass {
    report: CheckReport,
    /// Entries rewritten by this pass.
    fixes: u64,
    /// The refcount structures were rebuilt or the snapshot table
    /// dropped: another repair pass is due.
    restructured: bool,
    /// Snapshot table entries lack version 3's extra data.
    incomplete_snapshots: bool,
}

/// One refcount the check wants to store.
struct RefcountFix {
    cluster: u64,
    value: u64,
}

fn check_once(path: &Path, repair: Option<Repair>) -> Result<Pass, BlockError> {
    let file = open_image(path, repair.is_some())?;
    let (header, file_size) = read_header_with(&file, path, false)?;
    // A bitmap directory qemu refuses to load fails the check, as it
    // fails `qemu-img check` (the image does not open).
    let bitmaps =
        bitmaps_of(&file, &header, file_size).map_err(|reason| BlockError::InvalidImage {
            path: path.to_owned(),
            reason,
        })?;
    let cs = header.cluster_size();
    let nb_clusters = file_size.div_ceil(cs);
    if nb_clusters > MAX_CHECKED_CLUSTERS {
        return Err(BlockError::Unsupported {
            path: path.to_owned(),
            feature: format!(
                "checking a file of {nb_clusters} clusters (more than {MAX_CHECKED_CLUSTERS})"
            ),
        });
    }
    let mut walker = Walker {
        file: &file,
        header: &header,
        file_size,
        refs: References::new(file_size, header.cluster_bits),
        findings: Findings::default(),
        sharing: Default::default(),
        walked: Default::default(),
    };
    walker.refs.add(0, cs, &mut walker.findings);
    walker.count_sharing(header.l1_table_offset, header.l1_size);
    walker.walk_l1(header.l1_table_offset, header.l1_size, true)?;
    walker.walk_snapshots()?;
    super::bitmaps::walk_bitmaps(&mut walker, &bitmaps)?;
    // What the image references apart from its refcount structures: the
    // refcounts a rebuild stores.
    let references = walker.refs.refs.clone();
    let (table, mut rebuild) = read_refcount_table(&mut walker)?;
    let Walker {
        refs, mut findings, ..
    } = walker;

    let stored = StoredRefcounts {
        file: &file,
        header: &header,
        table: &table,
        file_size,
    };
    let mut leaks = 0u64;
    let mut highest = None;
    let mut fixes = Vec::new();
    let mut current = CachedBlock::default();
    for (i, &reference) in refs.refs.iter().enumerate() {
        let i = i as u64;
        let refcount = match stored.get(i, &mut current) {
            Ok(v) => v,
            Err(e) => {
                findings.check_errors += 1;
                findings.messages.push(format!(
                    "ERROR: could not read the refcount of cluster {i}: {e}"
                ));
                continue;
            }
        };
        let reference = u64::from(reference);
        // qemu-img's image end: the last cluster in use by either count.
        if refcount > 0 || reference > 0 {
            highest = Some(i);
        }
        if refcount == reference {
            continue;
        }
        let leak = refcount > reference;
        if reference > 0 && stored.block_of(i).is_none() {
            // No refcount block to store it in.
            rebuild = true;
        }
        let fix = match repair {
            Some(Repair::All) => true,
            Some(Repair::Leaks) => leak,
            None => false,
        };
        if fix && reference <= max_refcount(header.refcount_order) && stored.block_of(i).is_some() {
            findings.messages.push(format!(
                "Repairing cluster {i} refcount={refcount} reference={reference}"
            ));
            fixes.push(RefcountFix {
                cluster: i,
                value: reference,
            });
        } else if leak {
            findings.messages.push(format!(
                "Leaked cluster {i} refcount={refcount} reference={reference}"
            ));
        } else {
            findings.messages.push(format!(
                "ERROR cluster {i} refcount={refcount} reference={reference}"
            ));
        }
        if leak {
            leaks += 1;
        } else {
            findings.corruptions += 1;
        }
    }
    let mut fixed = fixes.len() as u64;
    let new_refcount = |cluster: u64, stored_value: u64| {
        fixes
            .iter()
            .find(|f| f.cluster == cluster)
            .map_or(stored_value, |f| f.value)
    };
    // COPIED must be set exactly when the refcount (after repairs) is 1.
    let mut copied_fixes = Vec::new();
    let mut copied_l1 = std::collections::BTreeSet::new();
    let mut current = CachedBlock::default();
    for e in &findings.copied {
        let cluster = e.host >> header.cluster_bits;
        let Ok(stored_value) = stored.get(cluster, &mut current) else {
            continue;
        };
        let refcount = new_refcount(cluster, stored_value);
        if (refcount == 1) == (e.raw & OFLAG_COPIED != 0) {
            continue;
        }
        let msg = if e.is_l1 {
            format!(
                "ERROR OFLAG_COPIED L2 cluster: l1_index={} l1_entry={:x} refcount={refcount}",
                e.index, e.raw
            )
        } else {
            format!(
                "ERROR OFLAG_COPIED data cluster: l2_entry={:x} refcount={refcount}",
                e.raw
            )
        };
        findings.messages.push(msg);
        findings.corruptions += 1;
        if repair == Some(Repair::All) {
            let raw = if refcount == 1 {
                e.raw | OFLAG_COPIED
            } else {
                e.raw & !OFLAG_COPIED
            };
            copied_fixes.push((e.table + e.index * e.entry_size, raw));
            if e.is_l1 {
                copied_l1.insert(e.table + e.index * e.entry_size);
            }
        }
    }
    if repair == Some(Repair::All) && (rebuild || findings.bad_snapshot_table) {
        if findings.bad_snapshot_table {
            super::rebuild::drop_snapshot_table(&file, &mut findings.messages)?;
        }
        if rebuild {
            super::rebuild::rebuild_refcounts(
                &file,
                &header,
                &references,
                file_size,
                &mut findings.messages,
            )?;
        }
        let report = report_of(path, &header, findings, leaks, highest);
        return Ok(Pass {
            report,
            fixes: 1,
            restructured: true,
            incomplete_snapshots: false,
        });
    }
    if repair.is_some() && (!fixes.is_empty() || !copied_fixes.is_empty()) {
        write_refcount_fixes(&stored, &fixes)?;
        for (offset, raw) in &copied_fixes {
            let kind = if copied_l1.contains(offset) {
                MetaKind::L1Table
            } else {
                MetaKind::L2Table
            };
            write_at(&file, kind, *offset, &raw.to_be_bytes())?;
        }
        fixed += copied_fixes.len() as u64;
        sync(&file)?;
    }

    let incomplete_snapshots = findings.incomplete_snapshots;
    Ok(Pass {
        report: report_of(path, &header, findings, leaks, highest),
        fixes: fixed,
        restructured: false,
        incomplete_snapshots,
    })
}

fn report_of(
    path: &Path,
    header: &Header,
    findings: Findings,
    leaks: u64,
    highest: Option<u64>,
) -> CheckReport {
    let cs = header.cluster_size();
    CheckReport {
        filename: path.display().to_string(),
        format: "qcow2".into(),
        check_errors: findings.check_errors,
        corruptions: findings.corruptions,
        leaks,
        corruptions_fixed: 0,
        leaks_fixed: 0,
        image_end_offset: Some(highest.map_or(0, |h| (h + 1) * cs)),
        total_clusters: Some(header.size.div_ceil(cs)),
        allocated_clusters: Some(findings.allocated),
        fragmented_clusters: Some(findings.fragmented),
        compressed_clusters: Some(findings.compressed),
        messages: findings.messages,
    }
}

/// Clears the dirty bit after a repair left no corruption, and the
/// corrupt bit too after `-r all` (version 3 only; v2 has no such bits).
fn clear_flags(path: &Path, repair: Repair) -> Result<(), BlockError> {
    let file = open_image(path, true)?;
    let mut version = [0u8; 4];
    read_at(&file, MetaKind::Header, 4, &mut version)?;
    if u32::from_be_bytes(version) < 3 {
        return Ok(());
    }
    let mut mask = INCOMPAT_DIRTY;
    if repair == Repair::All {
        mask |= INCOMPAT_CORRUPT;
    }
    let mut buf = [0u8; 8];
    read_at(&file, MetaKind::Header, OFF_INCOMPAT, &mut buf)?;
    let bits = u64::from_be_bytes(buf);
    if bits & mask != 0 {
        write_at(
            &file,
            MetaKind::Header,
            OFF_INCOMPAT,
            &(bits & !mask).to_be_bytes(),
        )?;
        sync(&file)?;
    }
    Ok(())
}

/// Reads the refcount table, counting its clusters and its blocks, in
/// qemu-img's order and with its findings; also says whether the
/// refcount structures are unusable (`-r all` then rebuilds them).
fn read_refcount_table(w: &mut Walker<'_>) -> Result<(Vec<u64>, bool), BlockError> {
    let h = w.header;
    let cs = h.cluster_size();
    if !h.refcount_table_offset.is_multiple_of(cs) {
        return Err(BlockError::InvalidImage {
            path: Default::default(),
            reason: format!(
                "refcount table offset {:#x} is not cluster aligned",
                h.refcount_table_offset
            ),
        });
    }
    let bytes = u64::from(h.refcount_table_clusters) * cs;
    w.refs.add(h.refcount_table_offset, bytes, &mut w.findings);
    let mut raw = vec![0u8; bytes as usize];
    read_at(
        w.file,
        MetaKind::RefcountTable,
        h.refcount_table_offset,
        &mut raw,
    )?;
    let nb_clusters = w.file_size.div_ceil(cs);
    let mut rebuild = false;
    let mut table = Vec::with_capacity(raw.len() / 8);
    for i in 0..raw.len() / 8 {
        let entry = be64_at(&raw, i);
        let off = entry & REFT_OFFSET_MASK;
        let problem = if entry & !REFT_OFFSET_MASK != 0 {
            Some(format!(
                "ERROR refcount table entry {i} has reserved bits set"
            ))
        } else if off == 0 {
            table.push(0);
            continue;
        } else if !off.is_multiple_of(cs) {
            Some(format!(
                "ERROR refcount block {i} is not cluster aligned; refcount table entry corrupted"
            ))
        } else if off / cs >= nb_clusters {
            Some(format!("ERROR refcount block {i} is outside image"))
        } else {
            None
        };
        if let Some(msg) = problem {
            w.findings.corruptions += 1;
            w.findings.messages.push(msg);
            rebuild = true;
            table.push(0);
            continue;
        }
        w.refs.add(off, cs, &mut w.findings);
        // A block shared with anything else (counted so far) is unusable.
        let count = w.refs.refs.get((off / cs) as usize).copied().unwrap_or(0);
        if count != 1 {
            w.findings.corruptions += 1;
            w.findings
                .messages
                .push(format!("ERROR refcount block {i} refcount={count}"));
            rebuild = true;
        }
        table.push(off);
    }
    Ok((table, rebuild))
}

/// The refcounts stored in the image.
struct StoredRefcounts<'a> {
    file: &'a File,
    header: &'a Header,
    /// Valid refcount block offsets (0: none) by table index.
    table: &'a [u64],
    file_size: u64,
}

/// The last refcount block read.
#[derive(Default)]
struct CachedBlock {
    offset: u64,
    bytes: Vec<u8>,
}

impl StoredRefcounts<'_> {
    fn per_block(&self) -> u64 {
        entries_per_block(self.header.cluster_bits, self.header.refcount_order)
    }

    /// Offset of the block holding `cluster`'s refcount, if it has one.
    fn block_of(&self, cluster: u64) -> Option<u64> {
        let idx = usize::try_from(cluster / self.per_block()).ok()?;
        self.table
            .get(idx)
            .copied()
            .filter(|&o| o != 0 && o < self.file_size)
    }

    fn get(&self, cluster: u64, cache: &mut CachedBlock) -> Result<u64, BlockError> {
        let Some(block) = self.block_of(cluster) else {
            return Ok(0);
        };
        if cache.offset != block || cache.bytes.is_empty() {
            cache.bytes = vec![0u8; self.header.cluster_size() as usize];
            read_at(self.file, MetaKind::RefcountBlock, block, &mut cache.bytes)?;
            cache.offset = block;
        }
        let index = (cluster % self.per_block()) as usize;
        Ok(read_refcount_entry(
            &cache.bytes,
            index,
            self.header.refcount_order,
        ))
    }
}

/// Writes the new refcounts, one read-modify-write per refcount block.
fn write_refcount_fixes(
    stored: &StoredRefcounts<'_>,
    fixes: &[RefcountFix],
) -> Result<(), BlockError> {
    let mut by_block: BTreeMap<u64, Vec<&RefcountFix>> = BTreeMap::new();
    for f in fixes {
        if let Some(block) = stored.block_of(f.cluster) {
            by_block.entry(block).or_default().push(f);
        }
    }
    let cs = stored.header.cluster_size() as usize;
    for (block, list) in by_block {
        let mut bytes = vec![0u8; cs];
        read_at(stored.file, MetaKind::RefcountBlock, block, &mut bytes)?;
        for f in list {
            let index = (f.cluster % stored.per_block()) as usize;
            write_refcount_entry(&mut bytes, index, stored.header.refcount_order, f.value);
        }
        write_at(stored.file, MetaKind::RefcountBlock, block, &bytes)?;
    }
    Ok(())
}
