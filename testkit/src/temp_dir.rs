//! A scratch folder per test, removed with everything in it when the
//! test ends, passed or panicked, so a run leaves nothing behind (a CI
//! machine's disk is not emptied between runs). The one scratch-folder
//! type of every test in the workspace.
//!
//! Where it is made is the test's choice: [`TempDir::new`] under the
//! system temp dir (`$TMPDIR`, often a tmpfs: fast, short paths for
//! sockets, but no O_DIRECT), [`TempDir::new_in`] under a folder the test
//! names, such as cargo's scratch folder on the build disk
//! (`env!("CARGO_TARGET_TMPDIR")` in an integration test), where O_DIRECT
//! works as it does on a real image store.

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
        TempDir::new_in(&std::env::temp_dir(), name)
    }

    /// [`TempDir::new`] under `base` (created if missing).
    pub fn new_in(base: &Path, name: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = base.join(format!(
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

    /// `name` inside the folder as text, for command lines and options
    /// that take a path as a string.
    pub fn file(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
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
        assert!(path.starts_with(std::env::temp_dir()));
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn a_folder_in_a_chosen_base_with_its_files_named_as_text() {
        let base = TempDir::new("testkit-base");
        let a = TempDir::new_in(&base.join("deeper"), "scratch");
        let b = TempDir::new_in(&base.join("deeper"), "scratch");
        assert!(a.starts_with(base.join("deeper")) && a.is_dir());
        assert_ne!(a.path(), b.path(), "two folders of one name never meet");
        assert_eq!(a.file("x.img"), a.join("x.img").to_string_lossy());
        let a_path = a.path().to_path_buf();
        drop(a);
        assert!(!a_path.exists() && b.is_dir());
    }
}
