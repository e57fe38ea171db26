//! Shrinking a qcow2 image (`ch-img resize --shrink`).
//!
//! The new size enters; every cluster wholly past it is unmapped: L2
//! tables past it are dropped from the L1 table, and in the table that
//! straddles the new end the entries past it are cleared. The tables are
//! written and made durable first; only then are the references those
//! entries and tables held dropped (a crash in between leaks clusters,
//! nothing worse), and last the header's size is written. The L1 table
//! keeps its length, and the file is not truncated (its freed clusters
//! are reused by later allocations), as in qemu only for images without
//! snapshots.
//!
//! Unlike qemu-img 7.2, the bytes of the last kept cluster past the new
//! end are zeroed (when that cluster is a plain data cluster), so growing
//! the image again later cannot bring back data the shrink cut off.

use super::image::Qcow2Image;
use super::l2_entry::{decode_l2, L2Entry};
use super::meta::MetaState;
use super::meta_io::{be64_at, write_at};
use super::snapshot_ops::{load_table, write_l1, TreeOp};
use crate::error::BlockError;

impl Qcow2Image {
    /// Unmaps everything past `new_size` (see the module docs); the
    /// caller writes the header's size afterwards.
    pub(crate) fn unmap_past(&self, meta: &mut MetaState, new_size: u64) -> Result<(), BlockError> {
        meta.flush_dirty()?;
        meta.barrier()?;
        let cs = meta.g.cluster_size;
        let cov = meta.g.l2_coverage();
        let cb = meta.g.cluster_bits;
        let first_gone = new_size.div_ceil(cs) * cs;
        let first_table = first_gone.div_ceil(cov) as usize;
        let mut dropped_tables = Vec::new();
        for e in meta.l1.iter_mut().skip(first_table) {
            if *e != 0 {
                dropped_tables.push(*e);
                *e = 0;
            }
        }
        let mut dropped = Vec::new();
        let k = (first_gone / cov) as usize;
        if !first_gone.is_multiple_of(cov) && k < meta.l1.len() {
            if let Some((off, _)) = meta.l2_table(k)? {
                let table = load_table(meta, off)?;
                let mut new = table.clone();
                let words = meta.g.l2_entry_size as usize / 8;
                for j in ((first_gone % cov) / cs) as usize..meta.g.l2_entries as usize {
                    let raw = be64_at(&table, j * words);
                    let e = decode_l2(raw, cb, self.header.version, meta.g.extended_l2)
                        .map_err(|r| meta.invalid(r))?;
                    if let Some(refs) = self.references(e) {
                        dropped.push(refs);
                    }
                    new[j * words * 8..(j + 1) * words * 8].fill(0);
                }
                if new != table {
                    write_at(&meta.file, off, &new, "L2 table")?;
                    meta.l2_cache.insert(off, new);
                }
            }
        }
        if !new_size.is_multiple_of(cs) {
            let (e, _) = meta.l2_entry(new_size)?;
            if let L2Entry::Normal { host, .. } = e {
                let tail = new_size % cs;
                let zeros = vec![0u8; (cs - tail) as usize];
                write_at(&meta.file, host + tail, &zeros, "cut-off cluster tail")?;
            }
        }
        write_l1(meta)?;
        meta.barrier()?;
        for (first, n) in dropped {
            meta.change_refcounts(first, n, -1)?;
        }
        self.tree_references(meta, &dropped_tables, TreeOp::Drop)?;
        meta.barrier()
    }
}
