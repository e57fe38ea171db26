//! Before a downgrade to version 2 (`amend -o compat=0.10`): every zero
//! cluster becomes something version 2 can say, as qemu-img 7.2 does it,
//! in the active tree and in every snapshot's.
//!
//! - A zero cluster without a host cluster becomes unallocated when the
//!   image has no backing file (it reads as zeroes either way); with a
//!   backing file it gets a new host cluster of zeroes, counted once for
//!   every tree that reaches its L2 table.
//! - A zero cluster with a host cluster gets zeroes written there and
//!   loses the zero flag.
//!
//! L2 tables enter by their offsets (each table once, however many trees
//! share it); per table, the new clusters are counted and their zeroes
//! written, then a barrier, then the table is written in one piece. The
//! disk reads the same at every step; a table whose write fails gets its
//! new clusters' references dropped again, so nothing leaks.

use std::collections::HashSet;

use super::tree::{load_table, read_l1};
use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::{be64_at, MetaKind};
use crate::formats::qcow2::on_disk::l2_entry::{decode_l1, L2Entry, OFLAG_COPIED, OFLAG_ZERO};
use crate::formats::qcow2::on_disk::snapshot_table::read_snapshot_table;

/// Expands the zero clusters of every tree; `progress(done, total)` after
/// each L1 entry (of all trees together).
pub(super) fn expand_zero_clusters(
    meta: &mut MetaState,
    has_backing: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), BlockError> {
    let (snapshots, _) = read_snapshot_table(meta.io(), meta.snapshot_table(), meta.file_size())
        .map_err(|r| meta.invalid(r))?;
    let mut trees = vec![meta.l1().to_vec()];
    for s in &snapshots {
        trees.push(read_l1(meta, s)?);
    }
    let total: u64 = trees.iter().map(|t| t.len() as u64).sum();
    let mut seen = HashSet::new();
    let mut done = 0;
    for tree in trees {
        for raw in tree {
            let table =
                decode_l1(raw, meta.geometry().cluster_size).map_err(|r| meta.invalid(r))?;
            if let Some((off, _)) = table.filter(|(off, _)| seen.insert(*off)) {
                expand_table(meta, off, has_backing)?;
            }
            done += 1;
            progress(done, total);
        }
    }
    Ok(())
}

/// One L2 table (see the module docs).
fn expand_table(meta: &mut MetaState, off: u64, has_backing: bool) -> Result<(), BlockError> {
    meta.check_table(off, "L2 table")?;
    let cb = meta.geometry().cluster_bits;
    let table = load_table(meta, off)?;
    let sharers = meta.refcount(off >> cb)?.max(1);
    let mut new = table.clone();
    let mut allocated = Vec::new();
    let result = rewrite_entries(meta, &table, &mut new, sharers, has_backing, &mut allocated)
        .and_then(|()| {
            if new == table {
                return Ok(());
            }
            meta.barrier()?;
            meta.write_l2_table(off, new)?;
            Ok(())
        });
    if result.is_err() {
        for host in allocated {
            if let Err(e) = meta.change_refcounts(host >> cb, 1, -(sharers as i64)) {
                log::warn!(
                    "{}: cluster {host:#x} stays leaked: {e}",
                    meta.path().display()
                );
            }
        }
        let _ = meta.write_refcounts();
    }
    result
}

/// Fills `new` with `table`'s entries, zero clusters expanded; the host
/// clusters it allocates go to `allocated`.
fn rewrite_entries(
    meta: &mut MetaState,
    table: &[u8],
    new: &mut [u8],
    sharers: u64,
    has_backing: bool,
    allocated: &mut Vec<u64>,
) -> Result<(), BlockError> {
    let cs = meta.geometry().cluster_size;
    let zeroes = vec![0u8; cs as usize];
    for j in 0..meta.geometry().l2_entries as usize {
        let raw = be64_at(table, j);
        let e = meta.decode_l2(raw)?;
        let entry = match e {
            L2Entry::Zero { host: None, .. } if !has_backing => 0,
            L2Entry::Zero { host: None, .. } => {
                let host = meta.alloc_clusters(1)?;
                allocated.push(host);
                if sharers > 1 {
                    meta.change_refcounts(
                        host >> meta.geometry().cluster_bits,
                        1,
                        sharers as i64 - 1,
                    )?;
                }
                meta.write(MetaKind::GuestData, host, &zeroes)?;
                host | if sharers == 1 { OFLAG_COPIED } else { 0 }
            }
            L2Entry::Zero {
                host: Some(host), ..
            } => {
                meta.write(MetaKind::GuestData, host, &zeroes)?;
                raw & !OFLAG_ZERO
            }
            _ => continue,
        };
        new[j * 8..j * 8 + 8].copy_from_slice(&entry.to_be_bytes());
    }
    Ok(())
}
