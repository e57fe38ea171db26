//! A scratch folder per test, removed with everything in it when the
//! test ends, passed or panicked, so a run leaves nothing behind in the
//! temp dir (a CI machine's disk is not emptied between runs).

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A self-cleaning temporary folder; derefs to its [`Path`].
pub struct TempDir(PathBuf);

impl TempDir {
    /// An empty folder under the system temp dir named after `name`, the
    /// process and a counter, so parallel tests and test binaries never
    /// share one.
    pub fn new(name: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("create temp dir {}: {e}", path.display()));
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::TempDir;

    #[test]
    fn the_folder_and_its_files_are_gone_after_drop() {
        let dir = TempDir::new("testkit-temp-dir");
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/file"), b"x").unwrap();
        let path = dir.path().to_path_buf();
        assert!(path.join("sub/file").exists());
        drop(dir);
        assert!(!path.exists());
    }
}
