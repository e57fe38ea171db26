//! Edits of the image's place in its backing chain (`BackingEdits`):
//! [`BackingRewrite`], over the image's locked tables. Rewriting the
//! backing file reference in the header (`ch-img rebase`), and emptying
//! the active disk so it reads through to its backing file (`commit`).
//!
//! The header cluster enters (`header_cluster`); it leaves with the same
//! fixed part (only `backing_file_offset` and `backing_file_size`
//! changed), every header extension kept in its order except the backing
//! format one, the new backing format extension last (when a format is
//! given), the end marker, and the new backing file name after it. The
//! cluster is written in one `pwrite` between barriers, as qemu rewrites
//! it. Copying data so that
//! the disk reads the same over the new backing (safe mode) is the
//! caller's job; this only changes the reference.

use super::tree::{begin_tree_op, tree_references, TreeOp};
use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta::MetaState;
use crate::formats::qcow2::metadata::meta_io::MetaKind;
use crate::formats::qcow2::on_disk::header::{EXT_BACKING_FORMAT, MAX_BACKING_NAME};
use crate::formats::qcow2::on_disk::header_cluster::{current_header, HeaderCluster};

/// See the module docs.
pub(crate) struct BackingRewrite<'a> {
    pub meta: &'a mut MetaState,
}

impl BackingRewrite<'_> {
    /// Points the image at backing file `name` (format `format`, when
    /// given), or at none.
    pub fn set_backing_file(
        &mut self,
        name: Option<&str>,
        format: Option<&str>,
    ) -> Result<(), BlockError> {
        let meta = &mut *self.meta;
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
        let header = current_header(meta)?;
        let mut hc = HeaderCluster::read(meta.io(), &header, meta.path())?;
        hc.header.backing_file = name.map(String::from);
        let format = format.filter(|_| name.is_some());
        hc.set_extension(EXT_BACKING_FORMAT, None);
        if let Some(f) = format {
            hc.set_extension(EXT_BACKING_FORMAT, Some(f.as_bytes().to_vec()));
        }
        let new = hc.encode(meta.path())?;
        meta.write(MetaKind::Header, 0, &new)?;
        meta.barrier()
    }

    /// Unmaps every cluster of the active disk, so it reads through to the
    /// backing file (`commit` without `-d`): the L1 table is zeroed first,
    /// then the references the old tree held are dropped.
    pub fn make_empty(&mut self) -> Result<(), BlockError> {
        let meta = &mut *self.meta;
        begin_tree_op(meta)?;
        let entries = meta.l1().len();
        let old = meta.replace_l1(vec![0; entries]);
        meta.write_l1_table()?;
        meta.barrier()?;
        tree_references(meta, &old, TreeOp::Drop)?;
        meta.barrier()?;
        meta.rebuild_metadata_map();
        Ok(())
    }
}
