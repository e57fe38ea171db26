//! References held by persistent dirty bitmaps (the qcow2 bitmaps header
//! extension): the bitmap directory, each bitmap table and each bitmap
//! data cluster.
//!
//! The directory's entries enter, already validated as qemu validates
//! them when it opens the image (`bitmap_directory::load_directory`: a
//! directory qemu refuses fails the check before this walk, as it fails
//! `qemu-img check`); references are added to the [`Walker`]'s counts.
//! Like qemu, the extension only counts while the "bitmaps" autoclear bit
//! says it is consistent; otherwise its clusters are leaks.

use super::references::Walker;
use crate::error::BlockError;
use crate::formats::qcow2::bitmaps::bitmap_directory::{BitmapEntry, TABLE_OFFSET_MASK};
use crate::formats::qcow2::metadata::meta_io::{be64_at, read_at, MetaKind};

/// Counts the references of every persistent bitmap in `entries`.
pub(super) fn walk_bitmaps(w: &mut Walker<'_>, entries: &[BitmapEntry]) -> Result<(), BlockError> {
    let Some(ext) = w.header.bitmaps else {
        return Ok(());
    };
    let cs = w.header.cluster_size();
    w.refs.add(ext.dir_offset, ext.dir_size, &mut w.findings);
    for e in entries {
        // Inside the file, and all tables together no larger than it
        // (checked when the directory was loaded).
        let bytes = u64::from(e.table_entries) * 8;
        w.refs.add(e.table_offset, bytes, &mut w.findings);
        let mut t = vec![0u8; bytes as usize];
        read_at(w.file, MetaKind::BitmapDirectory, e.table_offset, &mut t)?;
        for i in 0..e.table_entries as usize {
            let data = be64_at(&t, i) & TABLE_OFFSET_MASK;
            if data != 0 {
                w.refs.add(data, cs, &mut w.findings);
            }
        }
    }
    Ok(())
}
