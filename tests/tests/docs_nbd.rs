//! docs/nbd.md's runnable commands, as written: every ```sh block of the
//! page runs with `bash -e` in an empty folder, the project's binaries
//! first on `PATH`, under a deadline, and must succeed. (The page's other
//! blocks need a guest kernel or a remote server; the tests its table
//! names run those paths.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use integration_tests::{project_bin, TempDir};

/// The ```sh blocks of the markdown `text`, in order.
fn sh_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), l) => {
                block.push_str(l);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn the_try_it_block_runs_as_written() {
    for tool in ["qemu-img", "qemu-io"] {
        if !testkit::has_command(tool) {
            return;
        }
    }
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/nbd.md");
    let blocks = sh_blocks(&std::fs::read_to_string(&page).unwrap());
    assert!(!blocks.is_empty(), "no ```sh block in {}", page.display());
    let bins: PathBuf = project_bin("ch-img", "ch-img")
        .parent()
        .unwrap()
        .to_path_buf();
    // Both binaries the page runs come from the same folder.
    assert!(project_bin("storage-daemon", "ch-storage-daemon").starts_with(&bins));
    let path = format!(
        "{}:{}",
        bins.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (i, block) in blocks.iter().enumerate() {
        let dir = TempDir::new(&format!("docs-nbd-{i}"));
        let out = testkit::output_within(
            Command::new("bash")
                .args(["-e", "-c", block])
                .current_dir(dir.path())
                .env("PATH", &path),
            Duration::from_secs(120),
        );
        assert!(
            out.status.success(),
            "block {i} of docs/nbd.md failed ({}):\n{block}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
