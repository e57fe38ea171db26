//! ch-img's help, version and `-o help` against qemu-img 7.2: the same
//! shapes and words, the same exit statuses; every verb answers
//! `--help` (the options each lists are held against its parser by a
//! unit test in ch-img/src/help.rs).

mod ch_img_support;

use ch_img_support::{ch_run, qemu_run};
use integration_tests::{ch, TempDir};

#[test]
fn version_has_qemu_img_shape() {
    let q = qemu_run(&["--version"], &[]);
    for flag in ["--version", "-V"] {
        let c = ch_run(&[flag], &[]);
        assert_eq!(c.code, 0);
        let (q_lines, c_lines): (Vec<&str>, Vec<&str>) =
            (q.stdout.lines().collect(), c.stdout.lines().collect());
        assert_eq!(c_lines.len(), q_lines.len(), "{c:?}");
        let version = c_lines[0].strip_prefix("ch-img version ").unwrap();
        assert_eq!(version, env!("CARGO_PKG_VERSION"));
        assert!(q_lines[0].starts_with("qemu-img version "));
        assert!(
            c_lines[1].starts_with("Copyright (c) ") && q_lines[1].starts_with("Copyright (c) ")
        );
    }
}

/// Our `-o help` is qemu-img's with the lines of options ch-img does not
/// take left out: same header, same lines in the same order, same end.
fn assert_subset_of_qemu(args: &[&str]) {
    let (q, c) = (qemu_run(args, &[]), ch_run(args, &[]));
    assert_eq!((q.code, c.code), (0, 0), "{args:?}: {c:?}");
    let (ql, cl): (Vec<&str>, Vec<&str>) = (q.stdout.lines().collect(), c.stdout.lines().collect());
    assert_eq!(cl.first(), ql.first(), "{args:?}");
    let is_option = |l: &str| l.starts_with("  ");
    let other = |lines: &[&str]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| !is_option(l))
            .map(|l| l.to_string())
            .collect()
    };
    assert_eq!(other(&cl), other(&ql), "{args:?}");
    let mut rest = ql.iter().filter(|l| is_option(l));
    let ours: Vec<&&str> = cl.iter().filter(|l| is_option(l)).collect();
    for line in &ours {
        assert!(
            rest.any(|q| q == *line),
            "{args:?}: {line:?} is not qemu-img's, or out of order"
        );
    }
    assert!(!ours.is_empty());
}

#[test]
fn option_help_lists_qemu_img_lines() {
    for args in [
        &["create", "-f", "qcow2", "-o", "help"][..],
        &["create", "-f", "raw", "-o", "help"],
        &["create", "-o", "help"],
        &["create", "-f", "qcow2", "-o", "cluster_size=4k,help"],
        &["create", "-f", "qcow2", "-o", "help", "x.qcow2", "1M"],
        &["convert", "-O", "qcow2", "-o", "help"],
        &["convert", "-o", "help"],
        &["convert", "-O", "raw", "-o", "help", "x", "y"],
        &["amend", "-f", "qcow2", "-o", "help"],
    ] {
        assert_subset_of_qemu(args);
    }
    // The raw lists are complete: every option qemu-img names, we take.
    for args in [
        &["create", "-f", "raw", "-o", "help"][..],
        &["create", "-o", "help"],
    ] {
        assert_eq!(qemu_run(args, &[]), ch_run(args, &[]));
    }
    // raw images have nothing to amend.
    let args = ["amend", "-f", "raw", "-o", "help"];
    assert_eq!(qemu_run(&args, &[]), ch_run(&args, &[]));
}

#[test]
fn size_given_twice_is_refused_like_qemu_img() {
    let dir = TempDir::new("help");
    for (fmt, q, c) in [("qcow2", "q.qcow2", "c.qcow2"), ("raw", "q.raw", "c.raw")] {
        let (q, c) = (dir.file(q), dir.file(c));
        let run = |img: &str| {
            vec!["create", "-f", fmt, "-o", "size=1M", img, "2M"]
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>()
        };
        let (qa, ca) = (run(&q), run(&c));
        let qa: Vec<&str> = qa.iter().map(String::as_str).collect();
        let ca: Vec<&str> = ca.iter().map(String::as_str).collect();
        let (qr, cr) = (qemu_run(&qa, &[(&q, "IMG")]), ch_run(&ca, &[(&c, "IMG")]));
        assert_eq!(qr, cr);
        assert_eq!(cr.code, 1);
        assert!(
            cr.stderr
                .contains("The image size must be specified only once"),
            "{cr:?}"
        );
        assert!(!std::path::Path::new(&c).exists());
    }
}

#[test]
fn every_verb_answers_help_and_refuses_unknown_options_like_qemu_img() {
    let usage = ch(&["--help"]);
    let verbs = usage
        .lines()
        .find_map(|l| l.strip_prefix("commands: "))
        .unwrap();
    for verb in verbs.split(", ") {
        for words in [vec![verb, "--help"], vec!["help", verb], vec![verb, "-h"]] {
            let c = ch_run(&words, &[]);
            assert_eq!(c.code, 0, "{words:?}");
            assert!(
                c.stdout.starts_with(&format!("usage: ch-img {verb} ")),
                "{c:?}"
            );
        }
        // qemu-img 7.2's measure prints its usage and exits 0 for an
        // unknown option (docs/ch-img.md, "Differences from qemu-img").
        if verb == "measure" {
            continue;
        }
        for bad in ["-Z", "--bogus"] {
            let (q, c) = (
                qemu_run(&[verb, bad, "x"], &[]),
                ch_run(&[verb, bad, "x"], &[]),
            );
            assert_eq!(q, c, "{verb} {bad}");
        }
    }
    let (q, c) = (qemu_run(&["info", "-f"], &[]), ch_run(&["info", "-f"], &[]));
    assert_eq!(q, c);
}
