//! Image locking that qemu understands: open file description (OFD) locks
//! on the byte offsets qemu's file-posix driver uses.
//!
//! qemu takes a shared (read) lock on byte `100 + N` for each permission N
//! it holds and on byte `200 + N` for each permission it does not let
//! others have (N: 0 consistent read, 1 write, 2 write-unchanged,
//! 3 resize). Before locking it tests the opposite bytes for conflicts. We
//! do the same, so a writer here makes `qemu-img info` (without -U) and
//! qemu-io writes fail, and a qemu process holding the image makes our
//! open fail with [`BlockError::Locked`].
//!
//! A descriptor enters; on success it leaves locked, and an [`ImageLock`]
//! comes back. Dropping that guard (the image closing) unlocks the bytes
//! at once, even where the open file description lives on: in a child
//! process forked before its exec (which holds every descriptor for a
//! moment, close-on-exec or not) or in an io_uring ring the kernel tears
//! down later. Without that, `qemu-img` run right after a close could
//! still find the image locked.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::error::BlockError;

const PERM_BASE: i64 = 100;
const SHARED_BASE: i64 = 200;
const PERM_CONSISTENT_READ: u32 = 0;
const PERM_WRITE: u32 = 1;
// Permission 2, write-unchanged, is shared by everyone: never locked.
const PERM_RESIZE: u32 = 3;
const PERM_COUNT: u32 = 4;

/// Permissions held and permissions not shared, as bit sets.
fn perms(writable: bool) -> (u32, u32) {
    let bit = |n: u32| 1u32 << n;
    if writable {
        // What a qemu-io or qemu-system writer holds (seen in /proc/locks:
        // bytes 100, 101, 103, 201, 203).
        (
            bit(PERM_CONSISTENT_READ) | bit(PERM_WRITE) | bit(PERM_RESIZE),
            bit(PERM_WRITE) | bit(PERM_RESIZE),
        )
    } else {
        // A reader wants a consistent view: no one else may write or resize.
        (
            bit(PERM_CONSISTENT_READ),
            bit(PERM_WRITE) | bit(PERM_RESIZE),
        )
    }
}

fn flock(ty: libc::c_short, start: i64) -> libc::flock {
    // SAFETY: flock is a plain C struct for which all-zero bytes are valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start;
    fl.l_len = 1;
    fl
}

/// Whether another open file description holds a lock on byte `start`.
fn byte_locked(file: &File, start: i64) -> std::io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK as libc::c_short, start);
    // SAFETY: F_OFD_GETLK reads and writes the flock struct we own; the fd
    // is open for the duration of the call.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

fn lock_byte(file: &File, start: i64) -> std::io::Result<()> {
    let fl = flock(libc::F_RDLCK as libc::c_short, start);
    // SAFETY: F_OFD_SETLK only reads the flock struct we own.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The locks [`lock_image`] took on one open file description, released
/// when this is dropped.
#[derive(Debug)]
pub struct ImageLock {
    /// A descriptor of the locked open file description.
    file: File,
}

impl Drop for ImageLock {
    fn drop(&mut self) {
        let mut fl = flock(libc::F_UNLCK as libc::c_short, PERM_BASE);
        fl.l_len = SHARED_BASE + i64::from(PERM_COUNT) - PERM_BASE;
        // SAFETY: F_OFD_SETLK only reads the flock struct we own.
        let r = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
        if r < 0 {
            // The locks then go with the open file description.
            log::warn!(
                "cannot release the image's locks: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Takes qemu-compatible locks on `file`: a writer's when `writable`, else
/// a reader's (which still refuses concurrent writers, as qemu does).
pub fn lock_image(file: &File, path: &Path, writable: bool) -> Result<ImageLock, BlockError> {
    let (held, unshared) = perms(writable);
    let lock_err = |source| BlockError::Lock {
        path: path.to_owned(),
        source,
    };
    for n in 0..PERM_COUNT {
        let conflict = (held >> n & 1 != 0
            && byte_locked(file, SHARED_BASE + i64::from(n)).map_err(lock_err)?)
            || (unshared >> n & 1 != 0
                && byte_locked(file, PERM_BASE + i64::from(n)).map_err(lock_err)?);
        if conflict {
            return Err(BlockError::Locked {
                path: path.to_owned(),
            });
        }
    }
    for n in 0..PERM_COUNT {
        for (set, base) in [(held, PERM_BASE), (unshared, SHARED_BASE)] {
            if set >> n & 1 != 0 {
                lock_byte(file, base + i64::from(n)).map_err(|e| {
                    if e.raw_os_error() == Some(libc::EAGAIN)
                        || e.raw_os_error() == Some(libc::EACCES)
                    {
                        BlockError::Locked {
                            path: path.to_owned(),
                        }
                    } else {
                        lock_err(e)
                    }
                })?;
            }
        }
    }
    // A descriptor of the same open file description, to unlock it later.
    let guard = file.try_clone().map_err(lock_err)?;
    Ok(ImageLock { file: guard })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("lock-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("img");
        std::fs::write(&p, [0u8; 512]).unwrap();
        (dir, p)
    }

    fn open_rw(p: &Path) -> File {
        File::options().read(true).write(true).open(p).unwrap()
    }

    /// Whether `lock_image` on `file` is refused as `Locked`.
    fn refused(file: &File, p: &Path, writable: bool) -> bool {
        matches!(
            lock_image(file, p, writable),
            Err(BlockError::Locked { .. })
        )
    }

    #[test]
    fn writer_excludes_reader_and_writer() {
        let (dir, p) = scratch("excl");
        let a = open_rw(&p);
        let guard_a = lock_image(&a, &p, true).unwrap();
        let b = File::open(&p).unwrap();
        assert!(refused(&b, &p, false));
        assert!(refused(&open_rw(&p), &p, true));
        drop(guard_a);
        let _guard_b = lock_image(&b, &p, false).unwrap();
        let _guard_d = lock_image(&File::open(&p).unwrap(), &p, false).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The guard unlocks the open file description even while another
    /// descriptor of it stays open (a forked child's, a ring's).
    #[test]
    fn dropping_the_guard_unlocks_while_the_description_lives_on() {
        let (dir, p) = scratch("guard");
        let a = open_rw(&p);
        let still_open = a.try_clone().unwrap();
        let guard = lock_image(&a, &p, true).unwrap();
        drop(a);
        let b = open_rw(&p);
        assert!(refused(&b, &p, true));
        drop(guard);
        drop(lock_image(&b, &p, true).unwrap());
        drop(still_open);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
