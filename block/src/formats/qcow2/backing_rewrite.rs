//! Rewriting the backing file reference in the header (`ch-img rebase`).
//!
//! The header cluster enters; it leaves with the same fixed part (only
//! `backing_file_offset` and `backing_file_size` changed), every header
//! extension kept in its order except the backing format one, the new
//! backing format extension (when a format is given), the end marker,
//! and the new backing file name after it. The cluster is written in one
//! `pwrite` between barriers, as qemu rewrites it. Copying data so that
//! the disk reads the same over the new backing (safe mode) is the
//! caller's job; this only changes the reference.

use super::header::{EXT_BACKING_FORMAT, EXT_END, MAX_BACKING_NAME};
use super::image::Qcow2Image;
use super::meta_io::MetaKind;
use super::snapshot_ops::{write_l1, TreeOp};
use crate::error::BlockError;
use crate::formats::BackingEdits;

impl Qcow2Image {}

impl BackingEdits for Qcow2Image {
    /// Points the image at backing file `name` (format `format`, when
    /// given), or at none.
    fn set_backing_file(&self, name: Option<&str>, format: Option<&str>) -> Result<(), BlockError> {
        if self.readonly {
            return Err(BlockError::ReadOnly);
        }
        let mut st = self.lock();
        let meta = &mut st.meta;
        let too_long =
            |what: &str, len: usize| meta.invalid(format!("{what} of {len} bytes is too long"));
        if let Some(n) = name.filter(|n| n.len() > MAX_BACKING_NAME as usize) {
            return Err(too_long("backing file name", n.len()));
        }
        if let Some(f) = format.filter(|f| f.len() > 1023) {
            return Err(too_long("backing format", f.len()));
        }
        meta.flush_dirty()?;
        meta.barrier()?;
        let cs = meta.g.cluster_size as usize;
        let file_len =
            crate::formats::raw::file_size(&meta.file).map_err(|source| BlockError::Open {
                path: meta.path.clone(),
                source,
            })?;
        let mut old = vec![0u8; cs.min(file_len as usize)];
        meta.read(MetaKind::Header, 0, &mut old)?;
        let fixed = (self.header.header_length as usize).min(old.len());
        let mut new = old[..fixed].to_vec();
        // Keep every extension but the backing format.
        let mut off = fixed;
        while off + 8 <= old.len() {
            let ty = u32::from_be_bytes([old[off], old[off + 1], old[off + 2], old[off + 3]]);
            let len = u32::from_be_bytes([old[off + 4], old[off + 5], old[off + 6], old[off + 7]]);
            if ty == EXT_END {
                break;
            }
            let end = off + 8 + (len as usize).div_ceil(8) * 8;
            if end > old.len() {
                return Err(meta.invalid(format!(
                    "header extension {ty:#x} runs past the first cluster"
                )));
            }
            if ty != EXT_BACKING_FORMAT {
                new.extend_from_slice(&old[off..end]);
            }
            off = end;
        }
        if let (Some(f), Some(_)) = (format, name) {
            new.extend_from_slice(&EXT_BACKING_FORMAT.to_be_bytes());
            new.extend_from_slice(&(f.len() as u32).to_be_bytes());
            new.extend_from_slice(f.as_bytes());
            new.resize(new.len().div_ceil(8) * 8, 0);
        }
        new.extend_from_slice(&[0u8; 8]);
        let (name_off, name_len) = match name {
            Some(n) => {
                let at = new.len() as u64;
                new.extend_from_slice(n.as_bytes());
                (at, n.len() as u32)
            }
            None => (0, 0),
        };
        if new.len() > old.len() {
            return Err(meta.invalid(
                "the header, its extensions and the backing file name do not fit in the first cluster",
            ));
        }
        new[8..16].copy_from_slice(&name_off.to_be_bytes());
        new[16..20].copy_from_slice(&name_len.to_be_bytes());
        new.resize(old.len(), 0);
        meta.write(MetaKind::Header, 0, &new)?;
        meta.barrier()
    }

    /// Unmaps every cluster of the active disk, so it reads through to the
    /// backing file (`commit` without `-d`): the L1 table is zeroed first,
    /// then the references the old tree held are dropped.
    fn make_empty(&self) -> Result<(), BlockError> {
        let mut st = self.begin_snapshot_op()?;
        let meta = &mut st.meta;
        let entries = meta.l1.len();
        let old = std::mem::replace(&mut *meta.l1, vec![0; entries]);
        write_l1(meta)?;
        meta.barrier()?;
        self.tree_references(meta, &old, TreeOp::Drop)?;
        meta.barrier()?;
        meta.rebuild_metadata_map();
        Ok(())
    }
}
