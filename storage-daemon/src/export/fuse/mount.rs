//! Mounting and unmounting the export: the mountpoint checks, opening
//! /dev/fuse, `mount(2)` of a `fuse` file system whose root is the
//! regular file itself (`rootmode=100000`), extra queue descriptors by
//! `FUSE_DEV_IOC_CLONE`, and the unmount (lazy when the file is busy,
//! then an abort of the connection so nothing waits on us any more).

use std::ffi::CString;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use thiserror::Error;

use super::abi::FUSE_DEV_IOC_CLONE;

/// `statfs.f_type` of a FUSE mount.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
/// Largest read the kernel sends in one request (qemu's choice).
pub const MAX_READ: u32 = 1 << 20;

#[derive(Debug, Error)]
pub enum MountError {
    #[error("cannot stat {0}")]
    Stat(PathBuf, #[source] std::io::Error),
    #[error("{0} is not a regular file")]
    NotRegularFile(PathBuf),
    #[error("{0} is already exported (a FUSE file system is mounted there)")]
    AlreadyExported(PathBuf),
    #[error("cannot open /dev/fuse")]
    OpenDevice(#[source] std::io::Error),
    #[error("cannot clone the /dev/fuse descriptor (FUSE_DEV_IOC_CLONE)")]
    CloneDevice(#[source] std::io::Error),
    #[error("mount(2) on {0} failed")]
    Mount(PathBuf, #[source] std::io::Error),
    #[error("umount2 of {0} failed")]
    Unmount(PathBuf, #[source] std::io::Error),
}

/// A mounted export; [`FuseMount::unmount`] takes it down.
pub struct FuseMount {
    mountpoint: PathBuf,
    /// The fuse connection's id (minor of the mount's st_dev), for
    /// /sys/fs/fuse/connections/ID/abort.
    connection: u64,
}

/// Checks `mountpoint` as qemu does: an existing regular file, not
/// already under a FUSE mount.
pub fn check_mountpoint(mountpoint: &Path) -> Result<(), MountError> {
    let meta =
        std::fs::metadata(mountpoint).map_err(|e| MountError::Stat(mountpoint.to_path_buf(), e))?;
    if !meta.is_file() {
        return Err(MountError::NotRegularFile(mountpoint.to_path_buf()));
    }
    if statfs_type(mountpoint) == Some(FUSE_SUPER_MAGIC) {
        return Err(MountError::AlreadyExported(mountpoint.to_path_buf()));
    }
    Ok(())
}

fn statfs_type(path: &Path) -> Option<i64> {
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statfs is valid storage for the kernel to fill.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` writable storage.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    #[allow(clippy::unnecessary_cast)] // f_type's type differs per libc target
    (rc == 0).then_some(st.f_type as i64)
}

/// Opens /dev/fuse (blocking; queues switch to non-blocking later).
pub fn open_device() -> Result<File, MountError> {
    File::options()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(MountError::OpenDevice)
}

/// A new /dev/fuse descriptor attached to `session`'s connection: a
/// queue of its own (requests are handed to whichever reader asks).
pub fn clone_device(session: &File) -> Result<File, MountError> {
    let fresh = open_device()?;
    let mut source_fd = session.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the session fd) from the
    // pointer, which points at a live local.
    let rc = unsafe { libc::ioctl(fresh.as_raw_fd(), FUSE_DEV_IOC_CLONE, &mut source_fd) };
    if rc != 0 {
        return Err(MountError::CloneDevice(std::io::Error::last_os_error()));
    }
    Ok(fresh)
}

/// What `mount(2)` gets, as qemu-storage-daemon mounts its export.
pub struct MountOptions {
    pub writable: bool,
    pub allow_other: bool,
}

/// The data string of the mount: the fd, the root's type (a regular
/// file), the owner, and qemu's options.
fn mount_data(fd: i32, options: &MountOptions) -> String {
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!(
        "fd={fd},rootmode=100000,user_id={uid},group_id={gid},max_read={MAX_READ},default_permissions"
    );
    if options.allow_other {
        data.push_str(",allow_other");
    }
    data
}

/// Mounts the connection of `device` on `mountpoint`.
pub fn mount(
    device: &File,
    mountpoint: &Path,
    options: &MountOptions,
) -> Result<FuseMount, MountError> {
    let err = |e| MountError::Mount(mountpoint.to_path_buf(), e);
    let target = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| err(std::io::Error::from_raw_os_error(libc::EINVAL)))?;
    let data = CString::new(mount_data(device.as_raw_fd(), options))
        .map_err(|_| err(std::io::Error::from_raw_os_error(libc::EINVAL)))?;
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME;
    if !options.writable {
        flags |= libc::MS_RDONLY;
    }
    // SAFETY: every pointer is a NUL-terminated string that outlives the
    // call; the kernel copies them.
    let rc = unsafe {
        libc::mount(
            c"ch-storage-daemon".as_ptr(),
            target.as_ptr(),
            c"fuse".as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    // Stat the mount itself now (its st_dev names the connection). Stat
    // would wait for INIT, so read the device number without it.
    let connection = mount_dev_minor(mountpoint).unwrap_or(0);
    Ok(FuseMount {
        mountpoint: mountpoint.to_path_buf(),
        connection,
    })
}

/// The minor device number of the newest mount on `mountpoint`, from
/// /proc/self/mountinfo (a `stat` would block until INIT is answered).
fn mount_dev_minor(mountpoint: &Path) -> Option<u64> {
    let canonical = std::fs::canonicalize(mountpoint).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = canonical.to_str()?;
    info.lines()
        .rev()
        .filter_map(|line| {
            let mut f = line.split(' ');
            let dev = f.nth(2)?;
            let _root = f.next()?;
            let point = f.next()?;
            (point == want).then_some(dev)
        })
        .next()
        .and_then(|dev| dev.split(':').nth(1)?.parse().ok())
}

impl FuseMount {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Unmounts: a plain unmount when nothing has the file open (the
    /// kernel then ends the connection), else a lazy detach.
    pub fn unmount(&self) -> Result<(), MountError> {
        let target = CString::new(self.mountpoint.as_os_str().as_bytes()).map_err(|_| {
            MountError::Unmount(
                self.mountpoint.clone(),
                std::io::Error::from_raw_os_error(libc::EINVAL),
            )
        })?;
        // SAFETY: `target` is a NUL-terminated path.
        if unsafe { libc::umount2(target.as_ptr(), 0) } == 0 {
            log::debug!("fuse: unmounted {}", self.mountpoint.display());
            return Ok(());
        }
        let first = std::io::Error::last_os_error();
        if first.raw_os_error() != Some(libc::EBUSY) {
            return Err(MountError::Unmount(self.mountpoint.clone(), first));
        }
        // SAFETY: as above.
        if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
            return Err(MountError::Unmount(
                self.mountpoint.clone(),
                std::io::Error::last_os_error(),
            ));
        }
        log::info!(
            "fuse: {} is busy: detached lazily, ending the connection",
            self.mountpoint.display()
        );
        Ok(())
    }

    /// Ends the connection (every request not yet taken fails with
    /// ECONNABORTED, ring entries complete with ENOTCONN); a no-op when
    /// the unmount already ended it. Needs the fusectl file system, which
    /// is mounted on /sys/fs/fuse/connections when it is not.
    pub fn abort_connection(&self) {
        if self.connection == 0 {
            log::warn!("fuse: unknown connection id; cannot abort it");
            return;
        }
        ensure_fusectl();
        let path = format!("{FUSECTL_DIR}/{}/abort", self.connection);
        if Path::new(&path).exists() {
            log::debug!("fuse: aborting connection {}", self.connection);
            if let Err(e) = std::fs::write(&path, "1") {
                log::warn!("fuse: {path}: {e}");
            }
        }
    }
}

const FUSECTL_DIR: &str = "/sys/fs/fuse/connections";

/// Mounts fusectl on /sys/fs/fuse/connections unless it is there (systemd
/// usually mounts it at boot; containers often lack it).
fn ensure_fusectl() {
    let mounted = std::fs::read_to_string("/proc/self/mounts")
        .map(|m| m.lines().any(|l| l.split(' ').nth(2) == Some("fusectl")))
        .unwrap_or(false);
    if mounted {
        return;
    }
    // SAFETY: NUL-terminated constant strings; no data argument.
    let rc = unsafe {
        libc::mount(
            c"fusectl".as_ptr(),
            c"/sys/fs/fuse/connections".as_ptr(),
            c"fusectl".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        log::warn!(
            "fuse: cannot mount fusectl on {FUSECTL_DIR}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// The daemon's uid and gid: the exported file's owner.
pub fn owner_ids() -> (u32, u32) {
    // SAFETY: getuid/getgid cannot fail.
    unsafe { (libc::getuid(), libc::getgid()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountpoint_must_be_an_existing_regular_file() {
        let dir = std::env::temp_dir();
        let missing = dir.join(format!("no-such-{}", std::process::id()));
        let e = check_mountpoint(&missing).unwrap_err().to_string();
        assert!(e.contains(&missing.display().to_string()), "{e}");
        let e = check_mountpoint(&dir).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn mount_data_has_qemus_options() {
        let d = mount_data(
            5,
            &MountOptions {
                writable: true,
                allow_other: true,
            },
        );
        assert!(d.starts_with("fd=5,rootmode=100000,user_id="), "{d}");
        assert!(
            d.contains("max_read=1048576,default_permissions,allow_other"),
            "{d}"
        );
    }
}
