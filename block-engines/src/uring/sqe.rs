//! Translating a [`HostOp`] into an SQE on the ring's fixed files.

use io_uring::{opcode, squeue, types};

use crate::HostOp;

/// The SQE for `op` (without user data).
pub fn to_sqe(op: &HostOp) -> squeue::Entry {
    let fixed = |file: crate::FileId| types::Fixed(u32::from(file.0));
    match *op {
        HostOp::Readv {
            file,
            offset,
            ref iov,
        } => opcode::Readv::new(fixed(file), iov.ptr, iov.count)
            .offset(offset)
            .build(),
        HostOp::Writev {
            file,
            offset,
            ref iov,
        } => opcode::Writev::new(fixed(file), iov.ptr, iov.count)
            .offset(offset)
            .build(),
        HostOp::Fdatasync { file } => opcode::Fsync::new(fixed(file))
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
        HostOp::PunchHole { file, offset, len } => opcode::Fallocate::new(fixed(file), len)
            .offset(offset)
            .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
            .build(),
        HostOp::ZeroRange { file, offset, len } => opcode::Fallocate::new(fixed(file), len)
            .offset(offset)
            .mode(libc::FALLOC_FL_ZERO_RANGE)
            .build(),
    }
}
