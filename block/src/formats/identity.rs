//! Planning for a disk that is one file byte for byte (a raw image, and a
//! raw disk over an NBD export): a guest range is the same range of that
//! file, so every plan is one op on it. [`IdentityMap`] holds which file
//! and whether writes are allowed; the format passes its current size.

use super::{
    FileId, HostWrite, ReadPiece, ReadPlan, ReadSource, WriteData, WriteOutcome, WritePlan,
};
use crate::error::BlockError;

/// Guest offset = offset in `file`.
pub(crate) struct IdentityMap {
    pub file: FileId,
    pub readonly: bool,
}

impl IdentityMap {
    /// `offset..offset + len` lies within a disk of `size` bytes.
    pub fn check_range(&self, size: u64, offset: u64, len: u64) -> Result<(), BlockError> {
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(BlockError::OutOfRange { offset, len, size }),
        }
    }

    fn check_writable(&self, size: u64, offset: u64, len: u64) -> Result<(), BlockError> {
        if self.readonly {
            return Err(BlockError::ReadOnly);
        }
        self.check_range(size, offset, len)
    }

    /// The files a flush must reach: the one file, unless read-only.
    pub fn flush_files(&self) -> Vec<FileId> {
        if self.readonly {
            Vec::new()
        } else {
            vec![self.file]
        }
    }

    pub fn plan_read(
        &self,
        size: u64,
        offset: u64,
        len: u64,
        plan: &mut ReadPlan,
    ) -> Result<(), BlockError> {
        self.check_range(size, offset, len)?;
        plan.push(ReadPiece {
            len,
            source: ReadSource::Host {
                file: self.file,
                offset,
            },
        });
        Ok(())
    }

    pub fn plan_write(&self, size: u64, offset: u64, len: u64) -> Result<WriteOutcome, BlockError> {
        self.check_writable(size, offset, len)?;
        Ok(one_op(HostWrite::Data {
            file: self.file,
            offset,
            parts: vec![WriteData::Request { offset: 0, len }],
        }))
    }

    pub fn plan_discard(
        &self,
        size: u64,
        offset: u64,
        len: u64,
    ) -> Result<WriteOutcome, BlockError> {
        self.check_writable(size, offset, len)?;
        Ok(one_op(HostWrite::PunchHole {
            file: self.file,
            offset,
            len,
        }))
    }

    /// Zeroes as a punched hole (`punch`: the range may be unmapped) or
    /// as a zeroed, still allocated range.
    pub fn plan_write_zeroes(
        &self,
        size: u64,
        offset: u64,
        len: u64,
        punch: bool,
    ) -> Result<WriteOutcome, BlockError> {
        self.check_writable(size, offset, len)?;
        let file = self.file;
        Ok(one_op(if punch {
            HostWrite::PunchHole { file, offset, len }
        } else {
            HostWrite::ZeroRange { file, offset, len }
        }))
    }
}

fn one_op(op: HostWrite) -> WriteOutcome {
    WriteOutcome::Ready(WritePlan {
        ops: vec![op],
        commit: None,
        frees_clusters: false,
    })
}
