//! Scratch folders for the block tests: testkit's [`TempDir`], made in
//! cargo's scratch folder on the build disk (`CARGO_TARGET_TMPDIR`), where
//! O_DIRECT works as on a real image store (a tmpfs `/tmp` has none).

use std::path::Path;

pub use testkit::TempDir;

/// An empty folder for one test, removed when the test ends.
pub fn temp_dir(name: &str) -> TempDir {
    TempDir::new_in(Path::new(env!("CARGO_TARGET_TMPDIR")), name)
}
