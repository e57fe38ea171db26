//! A package's crate roots, found by Cargo's conventions: the library,
//! the binaries, the integration tests, benches, examples and the build
//! script. (The workspace names no target outside these places; a
//! `[[bin]] path` that did would need a line here.)

use std::path::{Path, PathBuf};

/// The root file of every target under `dir`, sorted.
pub fn roots(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for single in ["src/lib.rs", "src/main.rs", "build.rs"] {
        let p = dir.join(single);
        if p.is_file() {
            out.push(p);
        }
    }
    for folder in ["src/bin", "tests", "benches", "examples"] {
        out.extend(folder_roots(&dir.join(folder)));
    }
    out.sort();
    out
}

/// `folder/*.rs` and `folder/*/main.rs`: each a target of its own.
fn folder_roots(folder: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let p = entry.path();
        if p.is_file() && p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        } else if p.join("main.rs").is_file() {
            out.push(p.join("main.rs"));
        }
    }
    out
}
