//! Every `cargo test -p PACKAGE ... --test NAME` that the docs (docs/*.md
//! and README.md) tell a reader to run names a test target that exists:
//! `tests/NAME.rs` or `tests/NAME/main.rs` in one of the packages the
//! command names. A renamed or deleted test file fails here instead of in
//! a reader's shell.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Package name -> its directory, for every workspace member.
fn packages() -> HashMap<String, PathBuf> {
    let root = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let members = root
        .lines()
        .find_map(|l| l.trim().strip_prefix("members = ["))
        .expect("the workspace's members line");
    members
        .trim_end_matches(']')
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| {
            let dir = repo().join(m);
            let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
            let name = manifest
                .lines()
                .find_map(|l| l.trim().strip_prefix("name = "))
                .expect("a package name")
                .trim_matches('"')
                .to_string();
            (name, dir)
        })
        .collect()
}

/// The docs' `cargo test` commands, each with the file and line it is on.
fn test_commands() -> Vec<(String, String)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.push(repo().join("README.md"));
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            if let Some(at) = line.find("cargo test ") {
                let cmd = line[at..].split(['`', '#']).next().unwrap_or_default();
                out.push((format!("{}:{}", f.display(), i + 1), cmd.to_string()));
            }
        }
    }
    out
}

#[test]
fn every_test_the_docs_name_exists() {
    let packages = packages();
    let mut checked = 0;
    let mut missing = Vec::new();
    for (place, cmd) in test_commands() {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        let after = |flag: &str| -> Vec<&str> {
            words
                .windows(2)
                .filter(|w| w[0] == flag)
                .map(|w| w[1])
                .collect()
        };
        let dirs: Vec<&PathBuf> = after("-p")
            .iter()
            .map(|p| {
                packages
                    .get(*p)
                    .unwrap_or_else(|| panic!("{place}: no package '{p}' in: {cmd}"))
            })
            .collect();
        for name in after("--test") {
            checked += 1;
            let found = dirs.iter().any(|d| {
                d.join(format!("tests/{name}.rs")).is_file()
                    || d.join(format!("tests/{name}/main.rs")).is_file()
            });
            if !found {
                missing.push(format!("{place}: --test {name} in: {cmd}"));
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} --test names found in the docs"
    );
    assert!(
        missing.is_empty(),
        "tests the docs name that do not exist:\n{}",
        missing.join("\n")
    );
}
