//! Never make a damaged image worse: every metadata read, write and
//! barrier of an open image goes through here to the metadata-I/O seam,
//! and every write (metadata through [`MetaState::write`], guest data
//! through [`MetaState::check_plan`] while the plan is made, new clusters
//! in `alloc_clusters`) is first checked against the metadata map
//! (`overlap`). A write that would overwrite metadata it does not own is
//! refused: the image gets the corrupt bit (incompatible feature bit 1),
//! the request fails, and every later write is refused too while reads go
//! on, as QEMU does.
//!
//! Byte ranges and the kind being written enter; `Ok` or the refusal
//! leaves.

use std::path::Path;

use super::MetaState;
use crate::error::BlockError;
use crate::formats::qcow2::metadata::meta_io::{read_at, sync, write_at, MetaKind};
use crate::formats::qcow2::metadata::overlap::MetadataMap;
use crate::formats::qcow2::on_disk::features::INCOMPAT_CORRUPT;
use crate::formats::qcow2::on_disk::header::OFF_INCOMPAT;
use crate::formats::qcow2::on_disk::l2_entry::decode_l1;
use crate::formats::qcow2::on_disk::layout::MAX_L1_BYTES;
use crate::formats::qcow2::on_disk::snapshot_table::read_snapshot_table;
use crate::formats::qcow2::planning::plan_builder::CowJob;
use crate::formats::{FileId, HostWrite};

/// What a corrupt image's messages tell the user to run.
pub(crate) const REPAIR_HINT: &str =
    "the image is marked corrupt (qcow2 incompatible feature bit 1, \"corrupt\"); \
     it opens read-only until `ch-img check -r all` repairs it";

impl MetaState {
    /// Reads metadata of `kind` through the seam (zeroes past EOF).
    pub fn read(&self, kind: MetaKind, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        read_at(&*self.io, kind, offset, buf)
    }

    /// Writes metadata of `kind` through the seam, after the overlap check.
    pub fn write(&self, kind: MetaKind, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.check_overlap(kind, offset, buf.len() as u64)?;
        write_at(&*self.io, kind, offset, buf)
    }

    /// fdatasync through the seam.
    pub fn sync(&self) -> Result<(), BlockError> {
        sync(&*self.io)
    }

    /// Refuses (and marks the image corrupt) a write of `kind` to
    /// `offset..offset+len` that overlaps metadata of another kind.
    pub fn check_overlap(&self, kind: MetaKind, offset: u64, len: u64) -> Result<(), BlockError> {
        if self.corrupt.get() {
            return Err(BlockError::Corrupt);
        }
        if !self.overlap_checks {
            return Ok(());
        }
        let writing = (kind != MetaKind::GuestData).then_some(kind);
        match self.metadata_map.overlap(offset, len, writing) {
            None => Ok(()),
            Some(o) => Err(self.mark_corrupt(format!(
                "refusing a {kind} write at {offset:#x} (+{len}): it overlaps the {} in host cluster {}",
                o.kind, o.cluster
            ))),
        }
    }

    /// Checks every host extent a write plan will write or punch on the
    /// image file (data files hold no metadata).
    pub fn check_plan(
        &self,
        ops: &[HostWrite],
        cow: &[CowJob],
        data_file: FileId,
    ) -> Result<(), BlockError> {
        if self.g.data_file {
            return Ok(());
        }
        for op in ops {
            let (file, offset, len) = match op {
                HostWrite::Data {
                    file,
                    offset,
                    parts,
                } => (*file, *offset, parts.iter().map(|p| p.len()).sum()),
                HostWrite::PunchHole { file, offset, len }
                | HostWrite::ZeroRange { file, offset, len } => (*file, *offset, *len),
            };
            if file == data_file {
                self.check_overlap(MetaKind::GuestData, offset, len)?;
            }
        }
        for job in cow {
            let (start, end) = job.span;
            self.check_overlap(MetaKind::GuestData, job.host + start, end - start)?;
        }
        Ok(())
    }

    pub fn is_corrupt(&self) -> bool {
        self.corrupt.get()
    }

    /// Sets the corrupt bit (once; straight to the file, not through the
    /// check, which may itself be what refuses header writes) and returns
    /// the error for the refused request.
    pub fn mark_corrupt(&self, reason: String) -> BlockError {
        if !self.corrupt.replace(true) {
            log::error!("{}: {reason}; {REPAIR_HINT}", self.path.display());
            if let Err(e) = set_corrupt_bit(self) {
                log::error!(
                    "{}: could not set the corrupt bit: {e}",
                    self.path.display()
                );
            }
        }
        corrupt_error(&self.path, &reason)
    }

    /// Recomputes the metadata map from the tables in memory and the
    /// snapshot table on disk (after open and after operations that move
    /// many tables at once: snapshots, shrinking, emptying).
    pub fn rebuild_metadata_map(&mut self) {
        let cs = self.g.cluster_size;
        let mut m = MetadataMap::new(self.g.cluster_bits);
        m.add(MetaKind::Header, 0, cs);
        m.add(MetaKind::L1Table, self.l1_offset, self.l1.len() as u64 * 8);
        m.add(
            MetaKind::RefcountTable,
            self.rt_offset,
            self.rt.len() as u64 * 8,
        );
        for off in &self.refblocks {
            m.add(MetaKind::RefcountBlock, *off, cs);
        }
        for raw in self.l1.iter() {
            if let Ok(Some((l2, _))) = decode_l1(*raw, cs) {
                m.add(MetaKind::L2Table, l2, cs);
            }
        }
        // An unreadable snapshot table was refused or reported elsewhere;
        // here it only means there is less to protect.
        if let Ok((entries, len)) = read_snapshot_table(&*self.io, self.snapshots, self.file_size) {
            m.add(MetaKind::SnapshotTable, self.snapshots.offset, len);
            // Only L1 tables that can be real (inside the file, within
            // qemu's size), and no more of them than the file holds
            // (real ones never overlap): a hostile table costs at most
            // the file's size here, whatever it claims.
            let mut budget = self.file_size;
            for e in entries {
                let bytes = u64::from(e.l1_size) * 8;
                let inside = e
                    .l1_offset
                    .checked_add(bytes)
                    .is_some_and(|end| end <= self.file_size);
                if !inside || bytes > MAX_L1_BYTES || bytes > budget {
                    continue;
                }
                budget -= bytes;
                m.add(MetaKind::SnapshotL1, e.l1_offset, bytes);
            }
        }
        if let Some((offset, bytes)) = self.bitmap_directory {
            m.add(MetaKind::BitmapDirectory, offset, bytes);
        }
        self.metadata_map = m;
    }
}

/// Read-modify-write of the incompatible features field (v3 only: a v2
/// header has no feature fields, so a v2 image is only refused writes
/// for the rest of this run).
fn set_corrupt_bit(meta: &MetaState) -> Result<(), BlockError> {
    if meta.g.version < 3 {
        return Ok(());
    }
    let mut field = [0u8; 8];
    read_at(&*meta.io, MetaKind::Header, OFF_INCOMPAT, &mut field)?;
    let bits = u64::from_be_bytes(field) | INCOMPAT_CORRUPT;
    write_at(
        &*meta.io,
        MetaKind::Header,
        OFF_INCOMPAT,
        &bits.to_be_bytes(),
    )?;
    sync(&*meta.io)
}

pub(crate) fn corrupt_error(path: &Path, reason: &str) -> BlockError {
    BlockError::InvalidImage {
        path: path.to_owned(),
        reason: format!("{reason}; {REPAIR_HINT}"),
    }
}
