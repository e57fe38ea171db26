//! Finds module import cycles in a crate: a module that imports one that
//! imports it back, directly or through others. The workspace's test
//! (`tests/workspace.rs`) runs it over every member and fails naming the
//! files and lines of each cycle.
//!
//! Data enters as a package folder ([`check_package`]): its targets are
//! found by Cargo's conventions (`src/lib.rs`, `src/main.rs`,
//! `src/bin/*`, `tests/*`, `benches/*`, `examples/*`, `build.rs`;
//! [`targets`]), and each target's module tree is read from its root by
//! following `mod` declarations (`#[path]` included) and parsed with
//! `syn` ([`tree`]). It leaves as a [`Report`]: the files read, the edges
//! between them, and every cycle with the lines that close it.
//!
//! The graph: every file is a node (an inline `mod x { .. }` belongs to
//! its file). An edge A -> B is a path written in A that names an item
//! defined in B ([`scan`] collects them, [`resolve`] finds their targets):
//! - every leaf of a `use` tree, `pub use` included: a re-export makes
//!   the re-exporting file (a `lib.rs` or `mod.rs` that gathers its
//!   children's items, say) depend on the file that defines the item;
//! - every path written inline, in expressions, types, patterns, trait
//!   bounds and macro arguments (`crate::a::f()`, `super::b::T`,
//!   `Kind::Variant` where `Kind` was imported);
//! - a glob import (`use super::*`) is an edge to the globbed module, and
//!   a name it brings in is followed like any other.
//!
//! A path is followed to the module that defines what it names: through
//! `crate`, `self`, `super`, the names a module declares (`mod`, items)
//! and the names its `use`s bind (re-exports included), so
//! `crate::BlockError` from anywhere is an edge to `error.rs`, not to
//! `lib.rs`. A path that ends at an item of module m (a type, a function,
//! an enum's variant, an associated function) is an edge to m's file. A
//! path that names a module and nothing in it (`use super::engine;`)
//! makes no edge of its own: the paths that use the name do. A `mod`
//! declaration is not an edge (a parent owns its children; what it
//! imports from them is). Paths that leave the crate (`std::..`, another
//! crate, `::x`) make no edge.
//!
//! What it cannot see: items made by macros (a path into them stops at
//! the module that holds the macro call, which is where they live), names
//! bound in function bodies (uses inside a body count as the module's),
//! and `cfg`: every module and item is read whatever its `cfg`.
//!
//! Why a crate of its own: the workspace's production crates do not need
//! `syn`; this one is built only for the test run.

mod graph;
mod resolve;
mod scan;
pub mod targets;
mod tree;

use std::path::Path;

pub use graph::{Cycle, Edge, Report};

/// Reads every target of the package at `dir` and finds its cycles.
/// Errors name the file that could not be read or parsed.
pub fn check_package(dir: &Path) -> Result<Report, String> {
    let roots = targets::roots(dir);
    if roots.is_empty() {
        return Err(format!("{}: no crate root found", dir.display()));
    }
    let mut tree = tree::Tree::default();
    for root in &roots {
        tree.load_root(root)?;
    }
    for (id, file) in std::mem::take(&mut tree.parsed) {
        scan::scan_file(&mut tree, id, &file);
    }
    Ok(graph::report(dir, &tree))
}
