//! The checker on small packages written for each rule: what makes an
//! edge (use, pub use, inline paths, macro arguments, globs), what does
//! not (comments, strings, other crates' paths, `mod` declarations), and
//! that a failure names files and lines.

use module_cycles::{check_package, Report};
use testkit::TempDir;

/// A package of `files` (path under the package, text): its report.
fn report(files: &[(&str, &str)]) -> Report {
    let dir = TempDir::new("module-cycles");
    for (path, text) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    check_package(&dir).unwrap()
}

/// The sorted file sets of the report's cycles.
fn cycles(r: &Report) -> Vec<Vec<String>> {
    r.cycles.iter().map(|c| c.files.clone()).collect()
}

fn set(files: &[&str]) -> Vec<Vec<String>> {
    vec![files.iter().map(|f| f.to_string()).collect()]
}

#[test]
fn a_reexport_is_an_edge_from_the_file_that_makes_it() {
    let r = report(&[
        (
            "src/lib.rs",
            "pub mod a;\npub use a::Thing;\npub const K: u32 = 1;\n",
        ),
        (
            "src/a.rs",
            "pub struct Thing;\nfn f() -> u32 { crate::K }\n",
        ),
    ]);
    assert_eq!(cycles(&r), set(&["src/a.rs", "src/lib.rs"]), "{r}");
    let text = r.to_string();
    assert!(
        text.contains("src/lib.rs:2 -> src/a.rs (a::Thing)"),
        "{text}"
    );
    assert!(
        text.contains("src/a.rs:2 -> src/lib.rs (crate::K)"),
        "{text}"
    );
}

#[test]
fn a_path_through_a_reexport_reaches_the_file_that_defines_the_item() {
    // a -> b through lib.rs's re-export; lib.rs itself defines nothing,
    // so it is not part of the cycle.
    let r = report(&[
        ("src/lib.rs", "pub mod a;\npub mod b;\npub use b::Thing;\n"),
        ("src/a.rs", "use crate::Thing;\npub fn x() {}\n"),
        ("src/b.rs", "pub struct Thing;\nfn g() { crate::a::x(); }\n"),
    ]);
    assert_eq!(cycles(&r), set(&["src/a.rs", "src/b.rs"]), "{r}");
}

#[test]
fn inline_paths_in_types_expressions_patterns_and_macros_are_edges() {
    for user in [
        "fn f(_: super::b::T) {}",
        "fn f() { let _ = super::b::T::new(); }",
        "fn f(k: super::b::Kind) { if let super::b::Kind::One = k {} }",
        "fn f() { assert_eq!(crate::b::N, 1); }",
        "fn f() { use super::b::T; let _ = T::new(); }",
        "use super::b as other;\nfn f() { other::g(); }",
        "fn f() { let v: Vec<crate::b::T> = Vec::new(); drop(v); }",
    ] {
        let r = report(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", &format!("pub fn h() {{}}\n{user}\n")),
            (
                "src/b.rs",
                "pub struct T;\npub enum Kind { One }\npub const N: u32 = 1;\n\
                 pub fn g() { super::a::h() }\n",
            ),
        ]);
        assert_eq!(cycles(&r), set(&["src/a.rs", "src/b.rs"]), "{user}: {r}");
    }
}

#[test]
fn a_glob_import_is_an_edge_and_its_names_are_followed() {
    let r = report(&[
        ("src/lib.rs", "mod m;\n"),
        (
            "src/m/mod.rs",
            "mod child;\npub struct Shared;\nfn f() { child::run() }\n",
        ),
        (
            "src/m/child.rs",
            "use super::*;\npub fn run() { let _ = Shared; }\n",
        ),
    ]);
    assert_eq!(cycles(&r), set(&["src/m/child.rs", "src/m/mod.rs"]), "{r}");
}

#[test]
fn comments_strings_other_crates_and_mod_declarations_make_no_edge() {
    let r = report(&[
        ("src/lib.rs", "pub mod io;\npub mod a;\n"),
        // `io` here is std's: the binding shadows nothing of the crate's
        // because a.rs has no child named io.
        (
            "src/a.rs",
            "use std::io;\n/// crate::io::x in a doc comment\n\
             pub fn f() -> io::Result<()> { let _ = \"crate::io::x\"; Ok(()) }\n",
        ),
        ("src/io.rs", "pub fn x() { crate::a::f().unwrap(); }\n"),
    ]);
    assert!(r.cycles.is_empty(), "{r}");
    assert_eq!(r.edges, 1, "only io -> a: {r}");
}

#[test]
fn naming_a_module_is_not_an_edge_but_using_its_items_is() {
    let files = |b_uses: &str| {
        report(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", "pub fn h() {}\nfn f() { crate::b::g() }\n"),
            ("src/b.rs", &format!("pub fn g() {{}}\n{b_uses}\n")),
        ])
    };
    assert!(files("use super::a;").cycles.is_empty());
    let r = files("use super::a;\nfn k() { a::h() }");
    assert_eq!(cycles(&r), set(&["src/a.rs", "src/b.rs"]), "{r}");
}

#[test]
fn path_attributes_inline_modules_and_every_target_are_read() {
    let r = report(&[
        ("src/lib.rs", "pub mod p;\n"),
        (
            "src/p.rs",
            "pub fn x() {}\n#[cfg(test)]\n#[path = \"p_tests.rs\"]\nmod tests;\n",
        ),
        ("src/p_tests.rs", "fn t() { super::x() }\n"),
        (
            "src/main.rs",
            "mod cli;\nfn main() { cli::run() }\nfn helper() {}\n",
        ),
        ("src/cli.rs", "pub fn run() { crate::helper() }\n"),
        (
            "tests/it.rs",
            "mod outer { pub mod inner { pub fn f() { crate::g() } } }\nfn g() {}\n",
        ),
    ]);
    // p_tests.rs -> p.rs; main.rs -> cli.rs -> main.rs; the inline
    // modules of tests/it.rs share their file.
    assert_eq!(r.files, 6, "{r}");
    assert_eq!(cycles(&r), set(&["src/cli.rs", "src/main.rs"]), "{r}");
    assert_eq!(r.edges, 3, "{r}");
}

#[test]
fn a_file_that_does_not_parse_is_an_error_naming_it() {
    let dir = TempDir::new("module-cycles");
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("src/lib.rs"), "fn (\n").unwrap();
    let e = check_package(&dir).unwrap_err();
    assert!(e.contains("src/lib.rs:1"), "{e}");
}
