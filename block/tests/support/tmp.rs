//! A self-cleaning temporary folder per test: created empty from a name,
//! removed with everything in it on drop.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A self-cleaning temporary directory.
pub struct TempDir(PathBuf);

impl TempDir {
    /// An empty folder named after `name`, the process and a counter, so
    /// parallel tests and test binaries never share one.
    pub fn new(name: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        // Cargo's per-target scratch dir (on the build disk, where O_DIRECT
        // behaves like on a real image store); else the system temp dir.
        let base = option_env!("CARGO_TARGET_TMPDIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let p = base.join(format!(
            "{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p)
            .unwrap_or_else(|e| panic!("create temp dir {}: {e}", p.display()));
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }

    /// [`TempDir::join`] as a `String`, for tests that pass paths as text.
    pub fn join_string(&self, name: &str) -> String {
        self.0.join(name).to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
