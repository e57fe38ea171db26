//! The FUSE kernel ABI this export speaks (protocol 7.42 of
//! `include/uapi/linux/fuse.h`, the first with FUSE-over-io_uring): the
//! opcodes, flags and `#[repr(C)]` structs it reads and writes, with tests
//! that pin every size to the kernel's.
//!
//! Bytes enter as `&[u8]` from /dev/fuse or a ring entry's buffers and are
//! read with [`Pod::read_from`] (unaligned, length checked); replies leave
//! as [`Pod::as_bytes`]. Only structs without padding implement [`Pod`].

/// The protocol version we speak.
pub const KERNEL_VERSION: u32 = 7;
pub const KERNEL_MINOR_VERSION: u32 = 42;
/// The root inode: the exported file itself.
pub const ROOT_ID: u64 = 1;

pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const LSEEK: u32 = 46;
}

/// `fuse_init_in.flags` / `fuse_init_out.flags` (bits 32.. live in `flags2`).
pub mod init_flags {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_setattr_in.valid`.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_open_out.open_flags`.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub const FOPEN_PARALLEL_DIRECT_WRITES: u32 = 1 << 6;

/// `ioctl(FUSE_DEV_IOC_CLONE)`: `_IOR(229, 0, uint32_t)`.
pub const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// FUSE-over-io_uring sub-commands (`sqe->cmd_op`).
pub const URING_CMD_REGISTER: u32 = 1;
pub const URING_CMD_COMMIT_AND_FETCH: u32 = 2;

/// Plain old data: `#[repr(C)]`, no padding, every bit pattern valid.
///
/// # Safety
/// Implementors must be `#[repr(C)]` structs of integer fields (or
/// arrays of them) without any padding bytes.
pub unsafe trait Pod: Copy + Default {
    /// Reads `Self` from the front of `bytes`; `None` when too short.
    fn read_from(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < std::mem::size_of::<Self>() {
            return None;
        }
        // SAFETY: the length was checked, `read_unaligned` has no alignment
        // requirement and every bit pattern is a valid `Self` (trait
        // contract).
        Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) })
    }

    fn as_bytes(&self) -> &[u8] {
        // SAFETY: `Self` has no padding (trait contract), so all its
        // `size_of` bytes are initialised; the slice borrows `self`.
        unsafe {
            std::slice::from_raw_parts(
                (self as *const Self).cast::<u8>(),
                std::mem::size_of::<Self>(),
            )
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub total_extlen: u16,
    pub padding: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OutHeader {
    pub len: u32,
    pub error: i32,
    pub unique: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub flags2: u32,
    pub unused: [u32; 11],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InitOut {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    pub map_alignment: u16,
    pub flags2: u32,
    pub max_stack_depth: u32,
    pub request_timeout: u16,
    pub unused: [u16; 11],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AttrOut {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: Attr,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SetattrIn {
    pub valid: u32,
    pub padding: u32,
    pub fh: u64,
    pub size: u64,
    pub lock_owner: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub unused4: u32,
    pub uid: u32,
    pub gid: u32,
    pub unused5: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenOut {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

/// `fuse_read_in` and `fuse_write_in` share this layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadWriteIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub flags_rw: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteOut {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FallocateIn {
    pub fh: u64,
    pub offset: u64,
    pub length: u64,
    pub mode: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LseekIn {
    pub fh: u64,
    pub offset: u64,
    pub whence: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LseekOut {
    pub offset: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StatfsOut {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

/// `fuse_uring_ent_in_out`: the tail of a ring entry's header buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UringEntInOut {
    pub flags: u64,
    /// The request's `unique`, echoed in COMMIT_AND_FETCH.
    pub commit_id: u64,
    /// Bytes in the payload buffer (kernel → us on fetch, us → kernel on commit).
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// `fuse_uring_req_header`: iov[0] of a ring entry.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UringReqHeader {
    /// `fuse_in_header` on fetch, `fuse_out_header` on commit.
    pub in_out: [u8; 128],
    /// The opcode's first argument (`fuse_write_in`, ...).
    pub op_in: [u8; 128],
    pub ring_ent_in_out: UringEntInOut,
}

impl Default for UringReqHeader {
    fn default() -> Self {
        UringReqHeader {
            in_out: [0; 128],
            op_in: [0; 128],
            ring_ent_in_out: UringEntInOut::default(),
        }
    }
}

/// `fuse_uring_cmd_req`: the start of the SQE128 command area.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UringCmdReq {
    pub flags: u64,
    pub commit_id: u64,
    pub qid: u16,
    pub padding: [u8; 6],
}

// The impls below: each is a #[repr(C)] struct of integers laid out without
// padding; the layout tests check every size.
// SAFETY: see above.
unsafe impl Pod for InHeader {}
// SAFETY: see above.
unsafe impl Pod for OutHeader {}
// SAFETY: see above.
unsafe impl Pod for InitIn {}
// SAFETY: see above.
unsafe impl Pod for InitOut {}
// SAFETY: see above.
unsafe impl Pod for Attr {}
// SAFETY: see above.
unsafe impl Pod for AttrOut {}
// SAFETY: see above.
unsafe impl Pod for SetattrIn {}
// SAFETY: see above.
unsafe impl Pod for OpenOut {}
// SAFETY: see above.
unsafe impl Pod for ReadWriteIn {}
// SAFETY: see above.
unsafe impl Pod for WriteOut {}
// SAFETY: see above.
unsafe impl Pod for FallocateIn {}
// SAFETY: see above.
unsafe impl Pod for LseekIn {}
// SAFETY: see above.
unsafe impl Pod for LseekOut {}
// SAFETY: see above.
unsafe impl Pod for StatfsOut {}
// SAFETY: see above.
unsafe impl Pod for UringEntInOut {}
// SAFETY: see above.
unsafe impl Pod for UringReqHeader {}
// SAFETY: see above.
unsafe impl Pod for UringCmdReq {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn sizes_match_the_kernel_uapi() {
        assert_eq!(size_of::<InHeader>(), 40);
        assert_eq!(size_of::<OutHeader>(), 16);
        assert_eq!(size_of::<InitIn>(), 64);
        assert_eq!(size_of::<InitOut>(), 64);
        assert_eq!(size_of::<Attr>(), 88);
        assert_eq!(size_of::<AttrOut>(), 104);
        assert_eq!(size_of::<SetattrIn>(), 88);
        assert_eq!(size_of::<OpenOut>(), 16);
        assert_eq!(size_of::<ReadWriteIn>(), 40);
        assert_eq!(size_of::<WriteOut>(), 8);
        assert_eq!(size_of::<FallocateIn>(), 32);
        assert_eq!(size_of::<LseekIn>(), 24);
        assert_eq!(size_of::<LseekOut>(), 8);
        assert_eq!(size_of::<StatfsOut>(), 80);
        assert_eq!(size_of::<UringEntInOut>(), 32);
        assert_eq!(size_of::<UringReqHeader>(), 288);
        assert_eq!(size_of::<UringCmdReq>(), 24);
    }

    #[test]
    fn field_offsets_match_the_kernel_uapi() {
        let h = UringReqHeader::default();
        let base = &h as *const _ as usize;
        assert_eq!(&h.op_in as *const _ as usize - base, 128);
        assert_eq!(&h.ring_ent_in_out as *const _ as usize - base, 256);
        let i = InitOut::default();
        let base = &i as *const _ as usize;
        assert_eq!(&i.max_write as *const _ as usize - base, 20);
        assert_eq!(&i.max_pages as *const _ as usize - base, 28);
        assert_eq!(&i.flags2 as *const _ as usize - base, 32);
    }

    #[test]
    fn read_from_checks_length_and_round_trips() {
        assert!(InHeader::read_from(&[0u8; 39]).is_none());
        let h = InHeader {
            len: 80,
            opcode: opcode::WRITE,
            unique: 7,
            ..Default::default()
        };
        let mut bytes = h.as_bytes().to_vec();
        bytes.push(0xff); // trailing bytes are ignored
        let back = InHeader::read_from(&bytes[..]).unwrap();
        assert_eq!((back.len, back.opcode, back.unique), (80, 16, 7));
    }
}
