//! The exported file's attributes: what GETATTR reports and what SETATTR
//! may change, as qemu-storage-daemon's export does it (size = the
//! disk's size, mode 0400 or 0600 changeable with SETATTR, owner = the
//! daemon, st_blocks = the image file's allocated bytes / 512, times =
//! now). SETATTR of the size resizes the image through the format.

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use block::aligned::AlignedBuf;
use block::{Disk, ExclusiveImage, IoMemory, Resizer};

use super::abi::{fattr, Attr, AttrOut, Pod, SetattrIn, ROOT_ID};
use super::reply::Reply;

/// How long the kernel may cache the attributes (qemu: one second).
const ATTR_VALID_SECS: u64 = 1;

/// Alignment of data buffers with O_DIRECT (a page: enough for every
/// logical block size the block layer accepts).
const DIRECT_BUFFER_ALIGN: usize = 4096;

/// What every queue thread of one export shares.
pub struct ExportState {
    pub disk: Disk,
    pub writable: bool,
    pub growable: bool,
    pub allow_other: bool,
    /// O_DIRECT on the image: data buffers are page aligned so the block
    /// layer needs no bounce copy.
    pub direct: bool,
    /// Permission bits of the file (S_IFREG is added on the way out).
    mode: AtomicU32,
    uid: u32,
    gid: u32,
    /// Serialises "is it big enough? then grow" decisions.
    resize_lock: Mutex<()>,
    /// Lent by the daemon, which owns the image ([`block::Resizer`] says
    /// why resizing beside the queues is safe).
    resizer: Resizer,
}

impl ExportState {
    /// The state of an export of `image`, which the caller owns; the
    /// export's threads get its disk's queues and a [`Resizer`].
    pub fn new(image: &ExclusiveImage, writable: bool, growable: bool, allow_other: bool) -> Self {
        let (uid, gid) = super::mount::owner_ids();
        let disk = image.disk().clone();
        ExportState {
            resizer: image.resizer(),
            direct: disk.options().direct,
            disk,
            writable,
            growable,
            allow_other,
            mode: AtomicU32::new(if writable { 0o600 } else { 0o400 }),
            uid,
            gid,
            resize_lock: Mutex::new(()),
        }
    }

    /// A data buffer of `len` bytes holding `data` (zeroes when empty).
    pub fn buffer(&self, len: usize, data: &[u8]) -> IoMemory {
        if self.direct {
            if let Some(mut buf) = AlignedBuf::new(len, DIRECT_BUFFER_ALIGN) {
                buf.as_mut_slice()[..data.len()].copy_from_slice(data);
                return IoMemory::Aligned(buf);
            }
        }
        let mut v = vec![0; len];
        v[..data.len()].copy_from_slice(data);
        IoMemory::Owned(v)
    }

    pub fn size(&self) -> u64 {
        self.disk.size()
    }

    /// Grows the disk to at least `new_size` (a no-op when it already is).
    pub fn grow_to(&self, new_size: u64) -> Result<(), i32> {
        let _guard = self.resize_lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.disk.size() >= new_size {
            return Ok(());
        }
        self.resize(new_size)
    }

    /// Sets the disk's size (the new area reads as zeroes).
    fn resize(&self, new_size: u64) -> Result<(), i32> {
        // The grown area reads as zeroes, also over a longer backing
        // file, as qemu's export does.
        self.resizer.resize(new_size).map_err(|e| {
            block::error_log::log_failed_request(format_args!("fuse resize to {new_size}"), &e);
            e.errno()
        })
    }

    fn attr(&self) -> Attr {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let allocated = self
            .disk
            .format()
            .files()
            .first()
            .and_then(|f| f.metadata().ok())
            .map(|m| m.blocks())
            .unwrap_or(0);
        Attr {
            ino: ROOT_ID,
            size: self.size(),
            blocks: allocated,
            atime: now.as_secs(),
            mtime: now.as_secs(),
            ctime: now.as_secs(),
            atimensec: now.subsec_nanos(),
            mtimensec: now.subsec_nanos(),
            ctimensec: now.subsec_nanos(),
            mode: libc::S_IFREG | self.mode.load(Ordering::Relaxed),
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.disk.logical_block_size(),
            flags: 0,
        }
    }

    /// The GETATTR (and SETATTR) reply.
    pub fn getattr(&self) -> Reply {
        let out = AttrOut {
            attr_valid: ATTR_VALID_SECS,
            attr_valid_nsec: 0,
            dummy: 0,
            attr: self.attr(),
        };
        Reply::Body(out.as_bytes().to_vec())
    }

    /// SETATTR: only the size and the mode (and the owner with
    /// allow_other, accepted as a no-op, as qemu does); times are
    /// ignored because they are always "now".
    pub fn setattr(&self, arg: &[u8]) -> Reply {
        let Some(set) = SetattrIn::read_from(arg) else {
            return Reply::Error(libc::EINVAL);
        };
        let ignored = fattr::FH
            | fattr::LOCKOWNER
            | fattr::ATIME
            | fattr::MTIME
            | fattr::CTIME
            | fattr::ATIME_NOW
            | fattr::MTIME_NOW
            | fattr::KILL_SUIDGID;
        let mut supported = fattr::SIZE | fattr::MODE;
        if self.allow_other {
            supported |= fattr::UID | fattr::GID;
        }
        if set.valid & !(supported | ignored) != 0 {
            return Reply::Error(libc::ENOTSUP);
        }
        if set.valid & fattr::SIZE != 0 {
            if !self.writable {
                return Reply::Error(libc::EACCES);
            }
            let _guard = self.resize_lock.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(errno) = self.resize(set.size) {
                return Reply::Error(errno);
            }
        }
        if set.valid & fattr::MODE != 0 {
            let perms = set.mode & 0o777;
            if !self.allow_other && perms & 0o077 != 0 {
                return Reply::Error(libc::EPERM);
            }
            if !self.writable && perms & 0o222 != 0 {
                return Reply::Error(libc::EROFS);
            }
            self.mode.store(perms, Ordering::Relaxed);
        }
        self.getattr()
    }
}
