//! docs/nbd.md's runnable commands, as written: every ```sh block of the
//! page runs with `bash -e` in an empty folder, the project's binaries
//! first on `PATH`, under a deadline, and must succeed; a ```text block
//! right after one (before the next heading) is what it must print. (The page's other
//! blocks need a guest kernel or a remote server; the tests its table
//! names run those paths.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use integration_tests::{project_bin, TempDir};

/// A ```sh block of the page and, when a ```text block follows it
/// before the next heading or ```sh block, that block: lines its output
/// must show.
struct Block {
    script: String,
    shows: Option<String>,
}

/// The ```sh blocks of the markdown `text`, in order.
fn sh_blocks(text: &str) -> Vec<Block> {
    let mut blocks: Vec<Block> = Vec::new();
    // (is a text block, its lines) while inside a block.
    let mut current: Option<(bool, String)> = None;
    // The last sh block may still take a text block.
    let mut open = false;
    for line in text.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some((false, String::new())),
            (None, "```text") if open => current = Some((true, String::new())),
            (Some((is_text, body)), "```") => {
                match is_text {
                    false => blocks.push(Block {
                        script: std::mem::take(body),
                        shows: None,
                    }),
                    true => blocks.last_mut().unwrap().shows = Some(std::mem::take(body)),
                }
                open = !*is_text;
                current = None;
            }
            (Some((_, body)), l) => {
                body.push_str(l);
                body.push('\n');
            }
            (None, l) if l.starts_with('#') || l.starts_with("```") => open = false,
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn the_try_it_block_runs_as_written() {
    for tool in ["qemu-img", "qemu-io", "nbdinfo"] {
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
    for (i, Block { script, shows }) in blocks.iter().enumerate() {
        let dir = TempDir::new(&format!("docs-nbd-{i}"));
        let out = testkit::output_within(
            Command::new("bash")
                .args(["-e", "-c", script])
                .current_dir(dir.path())
                .env("PATH", &path),
            Duration::from_secs(120),
        );
        assert!(
            out.status.success(),
            "block {i} of docs/nbd.md failed ({}):\n{script}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(shows) = shows {
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                stdout.contains(shows.as_str()),
                "block {i} of docs/nbd.md does not print what the page shows:\n{shows}\nit printed:\n{stdout}"
            );
        }
    }
    // The page shows what the bitmap block prints.
    assert!(blocks.iter().any(|b| b.shows.is_some()));
}
