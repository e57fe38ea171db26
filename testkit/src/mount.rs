//! A file system mounted for one test: a small tmpfs to fill up (ENOSPC
//! paths), or another kind whose behaviour a test needs (ramfs has no
//! fallocate). Mounting needs root, as the test run has.
//!
//! [`Mount::new`] mounts on a fresh folder of its own and says why when
//! it cannot; dropping the [`Mount`] unmounts it (lazily, so a file still
//! open cannot keep it) and removes the folder. Both `mount` and
//! `umount` run under a deadline.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::deadline::try_output_within;

/// The longest `mount` or `umount` may take.
const MOUNT_LIMIT: Duration = Duration::from_secs(60);

/// A mounted file system, unmounted on drop.
pub struct Mount {
    path: PathBuf,
}

impl Mount {
    /// `mount -t FSTYPE -o OPTIONS FSTYPE FOLDER` on a fresh folder under
    /// the system temp dir; `Err` says why not (mount's own words).
    pub fn new(fstype: &str, options: &str) -> Result<Mount, String> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("ch-mount-{fstype}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let out = try_output_within(
            Command::new("mount")
                .args(["-t", fstype, "-o", options, fstype])
                .arg(&path),
            MOUNT_LIMIT,
        );
        match out {
            Ok(o) if o.status.success() => Ok(Mount { path }),
            failed => {
                let _ = std::fs::remove_dir(&path);
                Err(match failed {
                    Ok(o) => format!(
                        "mount -t {fstype} failed (it needs root): {}",
                        String::from_utf8_lossy(&o.stderr).trim()
                    ),
                    Err(e) => e,
                })
            }
        }
    }

    /// A tmpfs of `size` bytes (mount's suffixes: `4M`, `4m`).
    pub fn tmpfs(size: &str) -> Result<Mount, String> {
        Mount::new("tmpfs", &format!("size={size}"))
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` on the file system, as a string (for command lines).
    pub fn file(&self, name: &str) -> String {
        self.path.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = try_output_within(
            Command::new("umount").arg("-l").arg(&self.path),
            MOUNT_LIMIT,
        );
        let _ = std::fs::remove_dir(&self.path);
    }
}
