//! Upstream Cloud Hypervisor's own binaries (`ch-remote`,
//! `cloud-hypervisor`), the peer some tests run beside ours.
//!
//! No package provides them: they are built from upstream's source, and a
//! machine that has them says where through `CH_UPSTREAM_DIR` (`.ci/run`
//! sets it when the folder is there). Without the variable a test that
//! needs them reports a skip naming it, even under `CH_REQUIRE_ALL=1`: a
//! user's fresh clone has no way to get them. With the variable set, a
//! missing binary fails the test.

use std::path::PathBuf;

/// The environment variable naming the folder of upstream's binaries.
pub const UPSTREAM_DIR: &str = "CH_UPSTREAM_DIR";

/// The path of upstream's binary `name` (`ch-remote`, `cloud-hypervisor`),
/// or `None` (with a skip line on stderr) when `CH_UPSTREAM_DIR` is unset.
/// Panics when the variable is set but the binary is not there.
#[track_caller]
pub fn upstream_binary(name: &str) -> Option<PathBuf> {
    let Some(dir) = std::env::var_os(UPSTREAM_DIR) else {
        eprintln!(
            "skipped: {UPSTREAM_DIR} is not set (the folder of upstream Cloud Hypervisor's \
             ch-remote and cloud-hypervisor; no package provides them)"
        );
        return None;
    };
    let path = PathBuf::from(dir).join(name);
    assert!(
        path.is_file(),
        "{UPSTREAM_DIR} is set but {} does not exist",
        path.display()
    );
    Some(path)
}
