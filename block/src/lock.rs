//! Image locking that qemu understands: open file description (OFD) locks
//! on the byte offsets qemu's file-posix driver uses.
//!
//! qemu takes a shared (read) lock on byte `100 + N` for each permission N
//! it holds and on byte `200 + N` for each permission it does not let
//! others have (N: 0 consistent read, 1 write, 2 write-unchanged,
//! 3 resize). Before locking it tests the opposite bytes for conflicts. We
//! do the same, so a writer here makes `qemu-img info` (without -U) and
//! qemu-io writes fail, and a qemu process holding the image makes our
//! open fail with [`BlockError::Locked`], which names the permission as
//! qemu does.
//!
//! Three [`LockMode`]s, as qemu takes them: a writer's, a reader's (which
//! still refuses concurrent writers, as `qemu-img info` does), and a
//! reader with qemu's `force-share` (`-U`), which lets others write.
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

/// qemu's names of the permissions, as its lock errors print them.
const PERM_NAMES: [&str; PERM_COUNT as usize] =
    ["consistent read", "write", "write unchanged", "resize"];

/// How an image is locked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// Reads, and lets no one else write or resize (qemu-img's readers).
    Reader,
    /// Reads, writes and resizes, and lets no one else write or resize.
    Writer,
    /// Reads and lets others do anything (qemu's `force-share`, `-U`).
    ForceShare,
}

impl LockMode {
    /// A writer's mode when `writable`, else a reader's.
    pub fn of(writable: bool) -> LockMode {
        if writable {
            LockMode::Writer
        } else {
            LockMode::Reader
        }
    }

    /// Permissions held and permissions not shared, as bit sets.
    fn perms(self) -> (u32, u32) {
        let bit = |n: u32| 1u32 << n;
        match self {
            // What a qemu-io or qemu-system writer holds (seen in
            // /proc/locks: bytes 100, 101, 103, 201, 203).
            LockMode::Writer => (
                bit(PERM_CONSISTENT_READ) | bit(PERM_WRITE) | bit(PERM_RESIZE),
                bit(PERM_WRITE) | bit(PERM_RESIZE),
            ),
            // A reader wants a consistent view: no one else may write or
            // resize.
            LockMode::Reader => (
                bit(PERM_CONSISTENT_READ),
                bit(PERM_WRITE) | bit(PERM_RESIZE),
            ),
            LockMode::ForceShare => (bit(PERM_CONSISTENT_READ), 0),
        }
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

/// Takes qemu-compatible locks on `file` in `mode`. As qemu does, it first
/// tests each permission it would hold against the bytes others hold
/// unshared, then each permission it would not share against the bytes
/// others hold; the first conflict is the error.
pub fn lock_image(file: &File, path: &Path, mode: LockMode) -> Result<ImageLock, BlockError> {
    let (held, unshared) = mode.perms();
    let lock_err = |source| BlockError::Lock {
        path: path.to_owned(),
        source,
    };
    let locked = |n: u32, shared: bool| BlockError::Locked {
        path: path.to_owned(),
        perm: PERM_NAMES[n as usize],
        shared,
    };
    let bits = |set: u32| (0..PERM_COUNT).filter(move |n| set >> n & 1 != 0);
    for (set, others, shared) in [(held, SHARED_BASE, false), (unshared, PERM_BASE, true)] {
        for n in bits(set) {
            if byte_locked(file, others + i64::from(n)).map_err(lock_err)? {
                return Err(locked(n, shared));
            }
        }
    }
    for (set, base, shared) in [(held, PERM_BASE, false), (unshared, SHARED_BASE, true)] {
        for n in bits(set) {
            lock_byte(file, base + i64::from(n)).map_err(|e| match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EACCES) => locked(n, shared),
                _ => lock_err(e),
            })?;
        }
    }
    // A descriptor of the same open file description, to unlock it later.
    let guard = file.try_clone().map_err(lock_err)?;
    Ok(ImageLock { file: guard })
}

/// Gives up the writer's permissions (write, resize) that [`lock_image`]
/// took on `file`'s open file description, keeping a reader's: others
/// may then read the image (`qemu-img info`, `convert` without `-U`),
/// still not write it. A description that held a reader's locks only is
/// left as it was. The image's [`ImageLock`] still releases the rest.
pub fn give_up_writing(file: &File) -> std::io::Result<()> {
    for n in [PERM_WRITE, PERM_RESIZE] {
        let fl = flock(libc::F_UNLCK as libc::c_short, PERM_BASE + i64::from(n));
        // SAFETY: F_OFD_SETLK only reads the flock struct we own.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Takes the locks of `mode` on `file` without first testing for
/// conflicts, for a second open of an image this process holds already
/// (a block job writes a backing file of its running disk, or reopens
/// the running image over a new chain): the test would find this
/// process's own locks. qemu's lock bytes are all shared (read) locks,
/// so two descriptions of one process hold them side by side; whoever
/// else holds the image is kept out by the first open's locks, and the
/// new open keeps them out once the first one is gone.
pub fn lock_image_beside(
    file: &File,
    path: &Path,
    mode: LockMode,
) -> Result<ImageLock, BlockError> {
    let (held, unshared) = mode.perms();
    let lock_err = |source| BlockError::Lock {
        path: path.to_owned(),
        source,
    };
    for (set, base) in [(held, PERM_BASE), (unshared, SHARED_BASE)] {
        for n in (0..PERM_COUNT).filter(|n| set >> n & 1 != 0) {
            lock_byte(file, base + i64::from(n)).map_err(lock_err)?;
        }
    }
    let guard = file.try_clone().map_err(lock_err)?;
    Ok(ImageLock { file: guard })
}

/// Opens `path` and locks it in `mode`, for a tool that reads or writes
/// the file through descriptors of its own (`ch-img check`): the locks
/// last as long as the returned guard.
pub fn lock_path(path: &Path, mode: LockMode) -> Result<ImageLock, BlockError> {
    let file = File::open(path).map_err(|source| BlockError::Open {
        path: path.to_owned(),
        source,
    })?;
    lock_image(&file, path, mode)
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

    /// The error `lock_image` gives in `mode`, as text; "" when it locks.
    fn refusal(file: &File, p: &Path, mode: LockMode) -> String {
        match lock_image(file, p, mode) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    fn refused(file: &File, p: &Path, mode: LockMode) -> bool {
        !refusal(file, p, mode).is_empty()
    }

    #[test]
    fn writer_excludes_reader_and_writer() {
        let (dir, p) = scratch("excl");
        let a = open_rw(&p);
        let guard_a = lock_image(&a, &p, LockMode::Writer).unwrap();
        let b = File::open(&p).unwrap();
        assert!(refused(&b, &p, LockMode::Reader));
        assert!(refused(&open_rw(&p), &p, LockMode::Writer));
        drop(guard_a);
        let _guard_b = lock_image(&b, &p, LockMode::Reader).unwrap();
        let _guard_d = lock_image(&File::open(&p).unwrap(), &p, LockMode::Reader).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// qemu-img's words: a reader finds the writer's "write" permission
    /// (one it will not share), a writer the reader's refusal to share
    /// "write"; a force-share reader passes a writer and is passed by one.
    #[test]
    fn conflicts_are_named_as_qemu_names_them() {
        let (dir, p) = scratch("words");
        let writer = open_rw(&p);
        let guard = lock_image(&writer, &p, LockMode::Writer).unwrap();
        let text = refusal(&File::open(&p).unwrap(), &p, LockMode::Reader);
        assert!(
            text.starts_with("Failed to get shared \"write\" lock"),
            "{text}"
        );
        assert!(text.contains(&format!("[{}]", p.display())), "{text}");
        let text = refusal(&open_rw(&p), &p, LockMode::Writer);
        assert!(text.starts_with("Failed to get \"write\" lock"), "{text}");
        let shared = lock_image(&File::open(&p).unwrap(), &p, LockMode::ForceShare).unwrap();
        drop(guard);
        drop(shared);
        let reader = lock_image(&File::open(&p).unwrap(), &p, LockMode::Reader).unwrap();
        let text = refusal(&open_rw(&p), &p, LockMode::Writer);
        assert!(text.starts_with("Failed to get \"write\" lock"), "{text}");
        drop(reader);
        let _shared = lock_image(&File::open(&p).unwrap(), &p, LockMode::ForceShare).unwrap();
        assert!(!refused(&open_rw(&p), &p, LockMode::Writer));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A writer that gives up writing lets readers in, and still keeps
    /// writers out.
    #[test]
    fn a_writer_that_gives_up_writing_is_a_reader() {
        let (dir, p) = scratch("downgrade");
        let writer = open_rw(&p);
        let guard = lock_image(&writer, &p, LockMode::Writer).unwrap();
        assert!(refused(&File::open(&p).unwrap(), &p, LockMode::Reader));
        give_up_writing(&writer).unwrap();
        drop(lock_image(&File::open(&p).unwrap(), &p, LockMode::Reader).unwrap());
        assert!(refused(&open_rw(&p), &p, LockMode::Writer));
        drop(guard);
        drop(lock_image(&open_rw(&p), &p, LockMode::Writer).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The guard unlocks the open file description even while another
    /// descriptor of it stays open (a forked child's, a ring's).
    #[test]
    fn dropping_the_guard_unlocks_while_the_description_lives_on() {
        let (dir, p) = scratch("guard");
        let a = open_rw(&p);
        let still_open = a.try_clone().unwrap();
        let guard = lock_image(&a, &p, LockMode::Writer).unwrap();
        drop(a);
        let b = open_rw(&p);
        assert!(refused(&b, &p, LockMode::Writer));
        drop(guard);
        drop(lock_image(&b, &p, LockMode::Writer).unwrap());
        drop(still_open);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
