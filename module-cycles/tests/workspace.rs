//! No module of any workspace crate imports one that imports it back:
//! one test per member (so each can be run, and named, on its own), and
//! a test that the list below is the workspace's.
//! `cargo run -p module-cycles -- DIR..` prints the same report for any
//! package folder (another checkout's, say, to compare).

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace holds this crate")
        .to_path_buf()
}

/// Fails with the report when `member` has a cycle.
fn check(member: &str) {
    let report = module_cycles::check_package(&workspace_root().join(member))
        .unwrap_or_else(|e| panic!("{member}: {e}"));
    println!("{report}");
    assert!(report.files > 0, "{member}: no files read");
    assert!(report.cycles.is_empty(), "module cycles in {report}");
}

macro_rules! members {
    ($($(#[$attr:meta])* $test:ident => $dir:literal,)*) => {
        const MEMBERS: &[&str] = &[$($dir),*];
        $(
            $(#[$attr])*
            #[test]
            fn $test() {
                check($dir);
            }
        )*
    };
}

members! {
    block => "block",
    block_engines => "block-engines",
    ch_img => "ch-img",
    ch_log => "ch-log",
    ch_util => "ch-util",
    hypervisor => "hypervisor",
    module_cycles => "module-cycles",
    nbd => "nbd",
    nbd_server => "nbd-server",
    storage_daemon => "storage-daemon",
    testkit => "testkit",
    tests => "tests",
    virtio_devices => "virtio-devices",
    virtio_host_driver => "virtio-host-driver",
    vmm => "vmm",
}

/// The `members` list of the workspace's Cargo.toml.
fn workspace_members() -> Vec<String> {
    let text = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
    let start = text.find("members").expect("a members list");
    let open = start + text[start..].find('[').expect("[");
    let close = open + text[open..].find(']').expect("]");
    let mut members: Vec<String> = text[open + 1..close]
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect();
    members.sort();
    members
}

#[test]
fn every_workspace_member_has_a_test_here() {
    let mut listed: Vec<String> = MEMBERS.iter().map(|m| m.to_string()).collect();
    listed.sort();
    assert_eq!(
        listed,
        workspace_members(),
        "add the new member to members! above"
    );
}
